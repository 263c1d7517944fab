"""FedDEA (spec feddea): top-ρ update decoupling with 1/ρ recalibration, in the
HTA-FMTL setting: task-level clients (one task each, equal random disjoint
splits) train ONE unified model, the encoder plus every task's decoder and head.

- default: FedAvg base on the synthetic task-level NYUD-v2 benchmark (4 clients),
  `unified='literal'` (spec §6 A1), ρ = 1/K, weights by local examples (Eq. 6);
- `configs/feddea.py:smoke`: the same in seconds per round (tests, CI);
- `configs/feddea.py:paper,dataset=nyud|pascal`: real NYUD-v2 (4 clients, 5 local
  epochs) or PASCAL-Context (5 clients, 2 local epochs), Swin-T, 100 rounds,
  batch 8, AdamW 1e-4 (weight decay 1e-4), 5 warm-up epochs then cosine by
  global epoch, per-client AdamW state kept across rounds (A7).
`dataset=pascal` works in every variant. Overrides: the base
(`--config.algorithm='dea(fedprox)'`; fedavg, fedprox, fednova, feddyn, fedbn, moon, fedacg, fedga),
the enhancement modules FedDEA is compared with (`pcgrad(fedavg)`, `heal(fedavg)`), ρ (`--config.dea.rho=0.5`), the ablations
(`--config.dea.variant=small|random`, `--config.dea.rescale=False`), the step
control (`--config.algorithm=dea(fedavg) --config.dea.rho=1 --config.dea.server_lr=2`),
A1 (`--config.unified=owner`), and no DEA at all (`--config.algorithm=fedavg`).
"""

from fedjax_mtl.defaults import base_config, spare
from fedjax_mtl.tasks import DATASETS as TASKS

DATASETS = {'nyud': 4, 'pascal': 5}  # dataset -> task-level clients (= K)
PAPER_EPOCHS = {'nyud': 5, 'pascal': 2}  # local epochs per round (spec §3)


def _setup(c, variant, items):
  dataset = items.pop('dataset', 'nyud')
  if dataset not in DATASETS:
    raise ValueError(f'unknown dataset {dataset!r} in config arg; valid choices: '
                     + ', '.join(map(repr, DATASETS)))
  c.scenario = f'{dataset}_st'
  if c.tasks:  # the smoke variant's task subset, restricted to this dataset's tasks
    c.tasks = ','.join(t for t in c.tasks.split(',') if t in TASKS[dataset].tasks)
  c.unified = 'literal'
  # The blocks of dea(fedavg) (base_config added them); another base's block comes
  # with its override (--config.fedprox.mu=...).
  c.dea.rho = 1.0 / DATASETS[dataset]  # spec §6 A2: 1/K until a sweep fixes it
  spare(c, 'dea')  # kept, unchecked, under --config.algorithm=fedavg (no DEA)
  c.fedavg.weighting = 'examples'  # w_k = |D_k| / Σ|D_j| (Eq. 6)
  if variant == 'paper':
    c.local_epochs = dict(PAPER_EPOCHS)


def get_config(arg=None):
  return base_config(arg, algorithm='dea(fedavg)', setup=_setup)
