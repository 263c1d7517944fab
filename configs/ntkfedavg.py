"""NTKFedAvg: clients train the NTK-linearised backbone; the server averages task vectors.

The many-task setting only for now (NTKFedAvg spec §1.3's benchmark B). Variants:
- `configs/ntkfedavg.py` (= `:mini8`): benchmark B offline on mini8: 8 clients, one
  task each (client n holds task n: digits, digits_clutter, digits_perm, shapes,
  colors, count_dots, gratings, texture_freq), every client every round, each
  with all of its task's training data, evaluated every round.
  `--config.ntkfedavg.negate=0` unlearns `digits` (the MNIST analogue, spec
  §3.1); `--config.ntkfedavg.linearize=false` is FedAvg with the same server
  (task negation included); `--config.ntkfedavg.server_lr` is α;
  `--config.ntkfedavg.point=pretrained` linearises around the initial model every
  round (the linearisation-point ablation; clients still start from the server model).
- `configs/ntkfedavg.py:smoke`: seconds (3 tasks, 2 rounds, small data).
- `configs/ntkfedavg.py:paper` (= `:paper,benchmark=clip`): the same allocation
  (client n holds the n-th of the real 8 tasks in `tfds_tasks.TASKS` order: sun397,
  cars, resisc45, eurosat, svhn, gtsrb, mnist, dtd, so MNIST is client 6) on TFDS data
  with ViT-B/32 + LoRA r = 16 at 224² (the many-task paper setting's model and
  optimiser), 8 clients, 100 rounds. The spec's CLIP ViT-B/32-256 tower with
  frozen zero-shot heads is `--config.many.model=clip_vit_b32_256
  --config.many.resolution=256 --config.many.heads=<npz of scripts/zeroshot_heads.py>`.

Not yet: benchmark A (`paper,benchmark=pascal`, the dense MaT-FL setting) and the
in-run server-α tuning.
"""

from fedjax_mtl.algorithms.ntkfedavg import default_config
from fedjax_mtl.defaults import many_task_config, many_task_paper

BENCHMARKS = ('clip', 'pascal')


def _setup(c, variant: str, benchmark: str, items: dict) -> None:
  if benchmark not in BENCHMARKS:
    raise ValueError(f'unknown benchmark {benchmark!r} of configs/ntkfedavg.py; valid '
                     'choices: ' + ', '.join(map(repr, BENCHMARKS)))
  if benchmark == 'pascal':
    raise ValueError('benchmark=pascal (NTKFedAvg benchmark A, the dense MaT-FL setting) is '
                     'not built yet; benchmark=clip runs the many-task benchmark B')
  m = c.many
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


def get_config(arg=None):
  return many_task_config(arg, 'ntkfedavg', default_config(), _setup, 'benchmark', 'clip')
