"""NTKFedAvg: clients train the NTK-linearised backbone; the server averages task vectors.

Two benchmarks (NTKFedAvg spec §1):

**A, the MaT-FL dense setting** (`benchmark=pascal`, the default): single-task
clients on PASCAL-Context's 5 tasks (semseg, human_parts, normals, edge, sal),
`clients_per_task=1|2` of them per task on even disjoint random splits
(`scenario='pascal_st'` / `'pascal_st_2c'`); a dilated ResNet-18 (output stride 8)
with a DeepLab-v3 ASPP head per client (`model.decoder='deeplab'`), heads never
aggregated and frozen under linearisation (`ntkfedavg.freeze_heads`); batch norm
in inference mode with the server's statistics inside the linearised forward;
MaT-FL's optimiser (Adam, amsgrad, L2 weight decay 1e-4, a new optimiser every
round, lr × 0.99 per round), batch 16, all clients every round, 10 rounds;
MaT-FL's metrics (saliency: max over 15 thresholds of the per-image Jaccard,
`sal_metric='mIoU'`; human-parts mIoU over the images with parts). Work per round
`work=standard|local`: 10 / 50 local epochs in `:paper`, 1 / 5 on the synthetic
benchmark.
- `configs/ntkfedavg.py`: on the built-in synthetic PASCAL-Context (32², an
  8-wide ResNet-18-OS8 and 32-channel heads, lr 1e-3: about a minute on 2 CPU
  cores, standard work);
- `configs/ntkfedavg.py:smoke`: the same in seconds (3 tasks, 32², 2 rounds);
- `configs/ntkfedavg.py:paper` (= `:paper,benchmark=pascal`): real PASCAL-Context at
  512², the full ResNet-18 and 256-channel heads, lr 1e-4 (MaT-FL's). ImageNet
  weights: `--config.model.pretrained_path=<converted torchvision .pth>`.
- The baselines on the same clients, data and optimiser: FedAvg
  (`--config.ntkfedavg.linearize=false`: the plain forward with train-mode batch
  norm, the encoder's running statistics averaged with the weights as MaT-FL
  does), DGAgg (`--config.algorithm=matfl`: MaT-FL's soft grouping, th = 0, spec
  A13), FedProx (`--config.ntkfedavg.linearize=false --config.ntkfedavg.mu=1`).

**B, the CLIP 8-task setting** (`configs/ntkfedavg.py:mini8`, or `benchmark=clip`),
in the many-task setting: 8 clients, one task each (client n holds task n:
digits, digits_clutter, digits_perm, shapes, colors, count_dots, gratings,
texture_freq), every client every round, each with all of its task's training
data, evaluated every round. `--config.ntkfedavg.negate=0` unlearns `digits`
(the MNIST analogue, spec §3.1); `--config.ntkfedavg.point=pretrained`
linearises around the initial model every round (the linearisation-point
ablation; clients still start from the server model).
- `--config.ntkfedavg.tune_alpha=true` chooses α every round on a server-held
  validation split (spec A.3, A10: `ntkfedavg.val_fraction` 0.1 of each task's
  training set, at most `ntkfedavg.val_max` 5,000; grid `ntkfedavg.alpha_grid`,
  by default 0.25, 0.5, ..., K).
- `work=standard|local`: one epoch per round, or "local work": the per-dataset
  epochs of spec §4 with `:paper` (Cars 35, DTD 76, EuroSAT 12, GTSRB 11,
  MNIST 5, RESISC45 15, SUN397 14, SVHN 4, through `many.task_epochs`) and 5 on mini8.
- `configs/ntkfedavg.py:smoke,benchmark=clip`: seconds (3 tasks, 2 rounds).
- `configs/ntkfedavg.py:paper,benchmark=clip`: client n holds the n-th of the real 8
  tasks in `tfds_tasks.TASKS` order (sun397, cars, resisc45, eurosat, svhn, gtsrb,
  mnist, dtd, so MNIST is client 6) on TFDS data with ViT-B/32 + LoRA r = 16 at 224²,
  8 clients, 100 rounds. The spec's CLIP ViT-B/32-256 tower with frozen zero-shot
  heads is `--config.many.model=ViT-B-32-256 --config.many.resolution=256
  --config.many.heads=<npz of scripts/zeroshot_heads.py>`.

Overrides common to both: `ntkfedavg.server_lr` (α), `ntkfedavg.negate` (client ids),
`ntkfedavg.linearize`, `ntkfedavg.point` (many-task only), `ntkfedavg.mu` (the
proximal term: `ntkfedavg.mu=1` is NTKFedProx, and with `ntkfedavg.linearize=false`
FedProx with this server, spec §4's μ = 1).
"""

from fedjax_mtl.algorithms import fedprox, matfl
from fedjax_mtl.algorithms.ntkfedavg import default_config
from fedjax_mtl.defaults import base_config, many_task_config, many_task_paper, parse_arg, spare
from fedjax_mtl.scenarios import P_TASKS

BENCHMARKS = ('pascal', 'clip')
CLIENTS_PER_TASK = {'1': 'pascal_st', '2': 'pascal_st_2c'}
# Local epochs per round of the two work settings (spec §4): paper, synthetic.
WORK = {'standard': (10, 1), 'local': (50, 5)}
# Benchmark B's local work: per-dataset epochs on the real tasks (spec §4; GTSRB 11 as
# the reference code has it, A5), and a uniform 5 on mini8, whose tasks have no
# published values.
CLIP_LOCAL_EPOCHS = {'cars': 35, 'dtd': 76, 'eurosat': 12, 'gtsrb': 11, 'mnist': 5,
                     'resisc45': 15, 'sun397': 14, 'svhn': 4}
MINI8_LOCAL_EPOCHS = 5


def _clip_setup(c, variant: str, benchmark: str, items: dict) -> None:
  m = c.many
  work = items.pop('work', 'standard')
  if work not in WORK:
    raise ValueError(f'unknown work={work!r} of configs/ntkfedavg.py; valid choices: '
                     + ', '.join(map(repr, WORK)))
  if variant == 'paper':
    many_task_paper(c, 'ntkfedavg', '1')
  from fedjax_mtl.manytask.setting import benchmark_tasks
  tasks = list(benchmark_tasks(m.benchmark))
  if variant == 'smoke':
    tasks = tasks[:3]
    m.tasks, m.num_train, m.num_test, m.pretrained = ','.join(tasks), 96, 50, ''
    c.num_rounds = 2
  # One client per task, holding all of it, every client every round (spec §1.3).
  m.num_clients, m.participation, m.zeta_t = len(tasks), 1.0, 0.0
  m.client_tasks, m.class_split = ';'.join(tasks), 'iid'
  if variant != 'paper':
    c.eval_every, c.checkpoint_every = 1, 5
  if work == 'local':  # "to near convergence": per-dataset epochs (spec §4, A5: GTSRB 11)
    if variant == 'paper':
      m.task_epochs = ','.join(f'{t}={e}' for t, e in CLIP_LOCAL_EPOCHS.items())
    else:
      m.local_epochs = MINI8_LOCAL_EPOCHS


def _pascal_setup(c, variant: str, items: dict) -> None:
  per_task = items.pop('clients_per_task', '1')
  if per_task not in CLIENTS_PER_TASK:
    raise ValueError(f'unknown clients_per_task={per_task!r} of configs/ntkfedavg.py; valid '
                     'choices: ' + ', '.join(map(repr, CLIENTS_PER_TASK)))
  work = items.pop('work', 'standard')
  if work not in WORK:
    raise ValueError(f'unknown work={work!r} of configs/ntkfedavg.py; valid choices: '
                     + ', '.join(map(repr, WORK)))
  # The blocks of the baselines an override names instead of ntkfedavg (spare_blocks).
  c.matfl = matfl.default_config()  # DGAgg: --config.algorithm=matfl (spec A13)
  c.matfl.mode, c.matfl.th = 'soft', 0.0
  c.fedprox = fedprox.default_config()  # --config.algorithm=fedprox: FedAvg's server
  c.fedprox.mu = 1.0  # spec §4
  spare(c, 'matfl', 'fedprox')
  c.scenario = CLIENTS_PER_TASK[per_task]
  c.tasks = ','.join(P_TASKS)
  c.model.encoder, c.model.decoder = 'resnet18_os8', 'deeplab'
  c.model.kwargs, c.model.head_width = {'width': 8}, 32
  c.model.pretrained_path = ''
  o = c.optim  # MaT-FL's local optimiser (spec §1.2)
  o.name, o.schedule, o.round_decay, o.reset_each_round = 'adam_amsgrad', 'round_decay', 0.99, True
  o.lr, o.weight_decay, o.warmup_epochs = 1e-3, 1e-4, 0
  c.batch_size, c.num_rounds, c.eval_every, c.checkpoint_every = 16, 10, 1, 5
  c.sal_metric, c.eval_edge_ods = 'mIoU', 'off'  # MaT-FL does not score edges
  epochs = WORK[work][0 if variant == 'paper' else 1]
  c.local_epochs = {'pascal': epochs}
  c.data.resolution = {'pascal': (32, 32)}
  c.data.synthetic_version = 1  # the scenes its documented tables ran on (docs/ntkfedavg)
  c.data.num_train = {'pascal': 480}  # one split: 2 clients per task hold half as much
  c.data.num_test = {'pascal': 100}
  if variant == 'smoke':
    c.tasks = 'semseg,human_parts,sal'
    c.model.kwargs, c.model.head_width = {'width': 8}, 16
    c.data.num_train = {'pascal': 96}
    c.data.num_test, c.batch_size, c.eval_batch_size = {'pascal': 16}, 8, 8
    c.num_rounds, c.checkpoint_every = 2, 1
  if variant == 'paper':
    c.data.resolution = {'pascal': (512, 512)}
    c.model.kwargs, c.model.head_width = {}, 256
    o.lr = 1e-4
    c.num_rounds, c.eval_every, c.checkpoint_every = 10, 1, 1
    c.eval_batch_size = 16


def get_config(arg=None):
  variant, kv = parse_arg(arg)
  benchmark = kv.get('benchmark', 'clip' if variant == 'mini8' else 'pascal')
  if benchmark not in BENCHMARKS:
    raise ValueError(f'unknown benchmark {benchmark!r} of configs/ntkfedavg.py; valid '
                     'choices: ' + ', '.join(map(repr, BENCHMARKS)))
  if benchmark == 'clip':
    kv['benchmark'] = 'clip'
    return many_task_config(','.join([variant] + [f'{k}={v}' for k, v in kv.items()]),
                            'ntkfedavg', default_config(), _clip_setup, 'benchmark', 'clip')
  if variant == 'mini8':
    raise ValueError('configs/ntkfedavg.py:mini8 is benchmark B (benchmark=clip); the dense '
                     'benchmark A is configs/ntkfedavg.py or :smoke / :paper')
  if 'table' in kv:
    raise ValueError('configs/ntkfedavg.py takes benchmark=, not table= (e.g. '
                     'configs/ntkfedavg.py:paper,benchmark=pascal)')
  kv.pop('benchmark', None)
  return base_config(','.join([variant] + [f'{k}={v}' for k, v in kv.items()]),
                     algorithm='ntkfedavg', setup=_pascal_setup)
