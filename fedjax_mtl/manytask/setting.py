"""Static tables of a many-task run: tasks and their data, who holds what, and
which (client, task) pairs train in each round.

A *pair* is one (client, task) of the allocation, numbered client-major (pair
ids sort by client, then task). Per round, the participating clients
(`allocation.sample_participants`, a pure function of seed and round) bring all
their pairs; `schedule[r]` lists them, padded with the dummy pair id M (no data,
weight 0) to S = the most pairs any round has, so one compiled round serves
every round (the participants are gathered, nothing recompiles).
"""

from __future__ import annotations

import dataclasses

import ml_collections
import numpy as np

from fedjax_mtl import fields
from fedjax_mtl import tasks as tasks_lib
from fedjax_mtl.data import mini8
from fedjax_mtl.manytask import allocation
from fedjax_mtl.errors import ConfigError, check_choice

BENCHMARKS = tasks_lib.CLASSIFICATION_BENCHMARKS
CLASS_SPLITS = ('dirichlet', 'iid')


# The `many` block (used when `setting='many_task'`).
CONFIG = fields.Block('many', {
    'benchmark': fields.Field('mini8', 'many_task: mini8 (offline), tfds8 (the real 8 tasks) or '
                              "folder30 (MaTU's 30 tasks as ImageFolder trees, "
                              'data/folder30.py)', choices=BENCHMARKS),
    'tasks': fields.Field('', "many_task: comma-separated subset of the benchmark's tasks "
                          "('' = all)"),
    'num_clients': fields.Field(10, 'many_task: clients N', fields.at_least(1)),
    'zeta_t': fields.Field(0.0, 'many_task: Dirichlet task concentration ζ_t (0: one task per '
                           'client)', fields.at_least(0)),
    'zeta_c': fields.Field(0.1, 'many_task: Dirichlet class concentration ζ_c',
                           fields.above(0)),
    'min_size': fields.Field(10, "many_task: fewest training examples of a task a client may "
                             "get in the Dirichlet class split (redrawn until it holds; "
                             "NIID-Bench's 10)", fields.at_least(0)),
    'class_split': fields.Field('dirichlet', "many_task: split of each task's classes over its "
                                "clients: dirichlet (ζ_c) or iid (NIID-Bench's \"homo\": equal "
                                'random parts)', choices=CLASS_SPLITS),
    # Instead of the Dirichlet task allocation: exactly this many tasks per client
    # (MaTU's Fig. 5), or explicit groups (Fig. 6a).
    'tasks_per_client': fields.Field(0, 'many_task: exactly this many tasks per client instead '
                                     'of the Dirichlet allocation (0 = off)',
                                     fields.at_least(0)),
    'client_tasks': fields.Field('', 'many_task: explicit task groups, client n holds group n '
                                 "mod G ('a+b+c;d+e', '' = off)"),
    # manytask/feed.py FEEDS (which imports this module; a test keeps them equal)
    'feed': fields.Field('device', "many_task: 'device' (every training image on the device) "
                         "or 'round' (the round's samples, gathered each round; the real 8 "
                         'tasks at 224)', choices=('device', 'round')),
    'participation': fields.Field(1.0, 'many_task: participation ξ, the fraction of clients per '
                                  'round', fields.fraction()),
    'parallel_replicas': fields.Field(0, "many_task: a sweep's replicas run this many at once "
                                      '(engines/many_replicas.py; 0 = all at once on an '
                                      'accelerator, one at a time on a CPU)',
                                      fields.at_least(0)),
    'local_epochs': fields.Field(1, 'many_task: local epochs per pair and round (0 with '
                                 'local_steps)', fields.at_least(0)),
    'local_steps': fields.Field(0, 'many_task: local steps per pair and round instead of '
                                'epochs (0 = use local_epochs)', fields.at_least(0)),
    # NTKFedAvg's "local work": per-dataset epochs (spec ntkfedavg §4)
    'task_epochs': fields.Field('', "many_task: 'task=E,...' local epochs of these tasks' pairs "
                                "in place of local_epochs ('' = none), e.g. 'mnist=5,dtd=76'"),
    'model': fields.Field('vit_micro', 'many_task: ViT (fedjax_mtl/models/vit.py MODELS)',
                          choices=lambda: tuple(_vit().MODELS)),
    'resolution': fields.Field(32, 'many_task: input resolution', fields.at_least(8)),
    'lora_rank': fields.Field(8, 'many_task: LoRA rank r', fields.at_least(1)),
    'lora_alpha': fields.Field(0.0, 'many_task: LoRA alpha (0: alpha = r)', fields.at_least(0)),
    'lora_seed': fields.Field(0, 'many_task: seed of the shared LoRA A', fields.SEED),
    'num_train': fields.Field(0, 'many_task: train examples per task (0 = all)',
                              fields.at_least(0)),
    'num_test': fields.Field(0, 'many_task: test examples per task (0 = all)',
                             fields.at_least(0)),
    'data_dir': fields.Field('', "many_task tfds8: TFDS data dir ('' = $TFDS_DATA_DIR or "
                             "~/tensorflow_datasets); folder30: the folder of <task>/train and "
                             "<task>/test ('' = $FEDJAX_MTL_FOLDER30_DIR)"),
    'heads': fields.Field('', "many_task: '' (a trained linear head per task) or the .npz of "
                          'scripts/zeroshot_heads.py (frozen zero-shot heads, CLIP towers)'),
    'pretrained': fields.Field('warmup', "many_task: backbone: 'warmup' (mini8's cached "
                               "warm-up), a .npz from scripts/convert_vit.py, or '' (random)"),
    'warmup_steps': fields.Field(1000, 'many_task: steps of the warm-up', fields.at_least(1)),
    'warmup_seed': fields.Field(0, 'many_task: seed of the warm-up', fields.SEED),
    'cache_dir': fields.Field('', "many_task: warm-up cache ('' = $FEDJAX_MTL_CACHE or "
                              '~/.cache/fedjax_mtl)'),
    'individual_reference': fields.Field('', 'many_task: workdir of a finished Individual run '
                                         'of the same tasks and data: results get accuracy '
                                         "normalised by it ('' = none)"),
}, applies_to="setting='many_task'")


def _vit():
  from fedjax_mtl.models import vit  # the ViTs (flax) only when their names are asked for
  return vit


def default_config() -> ml_collections.ConfigDict:
  """The `many` block at its defaults."""
  return CONFIG.config()


def benchmark_tasks(benchmark: str) -> tuple[str, ...]:
  """The tasks of a benchmark, in its order (`tasks.classification_tasks`)."""
  return tuple(t.name for t in tasks_lib.classification_tasks(benchmark))


def selected_tasks(cfg) -> tuple[str, ...]:
  """`many.tasks` (comma-separated subset, '' = all) in benchmark order, checked."""
  tasks = benchmark_tasks(cfg.benchmark)
  chosen = [t.strip() for t in cfg.tasks.split(',') if t.strip()]
  for t in chosen:
    check_choice('many.tasks entry', t, tasks, f' of benchmark {cfg.benchmark!r}')
  if len(set(chosen)) != len(chosen):
    raise ConfigError(f'many.tasks={cfg.tasks!r} names a task twice')
  return tuple(t for t in tasks if t in chosen) if chosen else tasks


def num_classes(benchmark: str, task: str, data_dir: str = '') -> int:
  """Classes of `task` (folder30: counted in `data_dir`'s train folders)."""
  if benchmark == 'folder30':
    from fedjax_mtl.data import folder30
    return folder30.num_classes(task, data_dir or None)
  return {t.name: t.num_classes for t in tasks_lib.classification_tasks(benchmark)}[task]


@dataclasses.dataclass(frozen=True, eq=False)
class TaskData:
  """Every task's images (uint8 [n, R, R, 3]) and int32 labels, per split."""
  train: tuple[tuple[np.ndarray, np.ndarray], ...]
  test: tuple[tuple[np.ndarray, np.ndarray], ...]


def load_data(cfg, tasks: tuple[str, ...], seed: int) -> TaskData:
  """The train and test splits of `tasks` (`many.num_train` / `num_test` per task, 0 = all)."""
  def one(task, split, num):
    num = int(num) or None
    if cfg.benchmark == 'mini8':
      return mini8.load(task, split, num, seed, resolution=int(cfg.resolution))
    if cfg.benchmark == 'folder30':
      from fedjax_mtl.data import folder30
      return folder30.load(task, split, data_dir=cfg.data_dir or None,
                           resolution=int(cfg.resolution), num=num, seed=seed)
    from fedjax_mtl.data import tfds_tasks
    return tfds_tasks.load(task, split, data_dir=cfg.data_dir or None,
                           resolution=int(cfg.resolution), num=num, seed=seed)
  return TaskData(train=tuple(one(t, 'train', cfg.num_train) for t in tasks),
                  test=tuple(one(t, 'test', cfg.num_test) for t in tasks))


def client_groups(cfg, tasks: tuple[str, ...]) -> list[list[int]]:
  """`many.client_tasks` as lists of task indices ([] when unset), checked."""
  groups = []
  for item in filter(None, (g.strip() for g in cfg.client_tasks.split(';'))):
    names = [t.strip() for t in item.split('+') if t.strip()]
    for t in names:
      check_choice('many.client_tasks entry', t, tasks, ' of the selected tasks')
    if len(set(names)) != len(names):
      raise ConfigError(f'many.client_tasks group {item!r} names a task twice')
    groups.append([tasks.index(t) for t in names])
  return groups


def task_assignment(cfg, tasks: tuple[str, ...], seed: int) -> np.ndarray | None:
  """A [N, T] of `many.tasks_per_client` / `many.client_tasks`, or None (Dirichlet)."""
  n = int(cfg.num_clients)
  if cfg.tasks_per_client and cfg.client_tasks:
    raise ConfigError('many.tasks_per_client and many.client_tasks both set; give one')
  if cfg.tasks_per_client:
    return allocation.fixed_tasks(n, len(tasks), int(cfg.tasks_per_client), seed)
  groups = client_groups(cfg, tasks)
  if not groups:
    return None
  a = allocation.grouped_tasks(n, groups, len(tasks))
  if not a.any(0).all():
    missing = [tasks[t] for t in np.flatnonzero(~a.any(0))]
    raise ConfigError(f'many.client_tasks leaves tasks {", ".join(missing)} to no client '
                      f'(with {n} clients); add them to a group or drop them in many.tasks')
  return a


@dataclasses.dataclass(frozen=True, eq=False)
class Setting:
  """Who holds what and who trains when (all NumPy, closed over by jitted code)."""
  tasks: tuple[str, ...]
  num_classes: tuple[int, ...]
  allocation: allocation.Allocation
  pairs: np.ndarray  # [M, 2] (client, task) of every allocated pair, client-major
  counts: np.ndarray  # [M] training examples of each pair
  index_table: np.ndarray  # [M + 1, max_n] indices into the concatenated train set
  train_offsets: np.ndarray  # [T + 1] first index of each task in the concatenated train set
  participants: np.ndarray  # [R, P] client ids per round
  schedule: np.ndarray  # [R, S] pair ids per round, padded with M

  @property
  def num_tasks(self) -> int:
    return len(self.tasks)

  @property
  def num_pairs(self) -> int:
    return len(self.pairs)

  @property
  def num_slots(self) -> int:
    return self.schedule.shape[1]

  @property
  def max_classes(self) -> int:
    return max(self.num_classes)

  @property
  def pair_task(self) -> np.ndarray:
    """[M + 1] task of each pair (the dummy: task 0)."""
    return np.append(self.pairs[:, 1], 0).astype(np.int32)

  @property
  def pair_counts(self) -> np.ndarray:
    """[M + 1] examples of each pair (the dummy: 0)."""
    return np.append(self.counts, 0).astype(np.int32)

  def pair_name(self, pair: int) -> str:
    c, t = self.pairs[pair]
    return f'client{c}/{self.tasks[t]}'


def build_setting(tasks: tuple[str, ...], data: TaskData, cfg, num_rounds: int,
                  seed: int, benchmark: str) -> Setting:
  """Allocation (Dirichlet tasks and classes), pairs and the padded round schedule."""
  zeta_t = float(cfg.zeta_t)
  check_choice('many.class_split', cfg.class_split, CLASS_SPLITS)
  zeta_c = None if cfg.class_split == 'iid' else float(cfg.zeta_c)
  alloc = allocation.allocate([lab for _, lab in data.train], int(cfg.num_clients), zeta_t,
                             zeta_c, seed, min_size=int(cfg.min_size),
                             assignment=task_assignment(cfg, tasks, seed), names=tasks,
                             fields='many.')
  pairs = np.array([(c, t) for c in range(alloc.num_clients) for t in alloc.tasks_of(c)],
                   np.int32).reshape(-1, 2)
  offsets = np.concatenate([[0], np.cumsum([len(lab) for _, lab in data.train])])
  rows = [alloc.indices[c][t] + offsets[t] for c, t in pairs]
  counts = np.array([len(r) for r in rows], np.int32)
  table = np.zeros((len(rows) + 1, max(counts)), np.int32)
  for i, r in enumerate(rows):
    table[i, :len(r)] = r
  pair_id = {(int(c), int(t)): i for i, (c, t) in enumerate(pairs)}
  participants = np.stack([allocation.sample_participants(alloc.num_clients,
                                                         float(cfg.participation), r, seed)
                           for r in range(num_rounds)])
  per_round = [[pair_id[(int(c), int(t))] for c in p for t in alloc.tasks_of(c)]
               for p in participants]
  slots = max(len(p) for p in per_round)
  schedule = np.full((num_rounds, slots), len(pairs), np.int32)
  for r, p in enumerate(per_round):
    schedule[r, :len(p)] = p
  return Setting(tasks=tasks,
                 num_classes=tuple(num_classes(benchmark, t, cfg.data_dir) for t in tasks),
                 allocation=alloc, pairs=pairs, counts=counts, index_table=table,
                 train_offsets=offsets.astype(np.int64), participants=participants,
                 schedule=schedule)


def task_epochs(cfg, tasks) -> np.ndarray | None:
  """`many.task_epochs` ('mnist=5,dtd=76') as the local epochs of every task in `tasks`
  order (the others at `many.local_epochs`), or None when empty; ConfigError (one
  line) for an entry that is not `task=E` with a selected task and E >= 1."""
  text = str(cfg.get('task_epochs', '') or '').strip()
  if not text:
    return None
  out = {t: int(cfg.local_epochs) for t in tasks}
  for item in filter(None, (x.strip() for x in text.split(','))):
    name, eq, value = item.partition('=')
    name = name.strip()
    if not eq or not value.strip().isdigit() or int(value) < 1:
      raise ConfigError(f'many.task_epochs entry {item!r} is not task=EPOCHS with EPOCHS >= 1, '
                        "e.g. 'mnist=5,dtd=76'")
    if name not in out:
      raise ConfigError(f'many.task_epochs names task {name!r}, which this run does not hold; '
                        'valid choices: ' + ', '.join(map(repr, tasks)))
    out[name] = int(value)
  return np.asarray([out[t] for t in tasks], np.int32)


def hold_out(data: TaskData, fraction: float, cap: int, seed: int) -> tuple[TaskData, tuple]:
  """A server-held validation split of every task's training set (NTKFedAvg's α
  tuning, spec A.3 / A10): min(cap, floor(fraction · n_t)) examples of task t, at
  least 1, drawn with `seed`; returns (the data without them, the validation split in
  `TaskData.test`'s layout). The clients never see these examples."""
  train, val = [], []
  rs = np.random.RandomState(seed)
  for images, labels in data.train:
    n = len(labels)
    k = max(1, min(int(cap), int(fraction * n)))
    if k >= n:
      raise ConfigError(f'a validation split of {k} of a task\'s {n} training examples leaves '
                        'its clients nothing; lower ntkfedavg.val_fraction or val_max')
    perm = rs.permutation(n)
    keep, hold = np.sort(perm[k:]), np.sort(perm[:k])
    train.append((images[keep], labels[keep]))
    val.append((images[hold], labels[hold]))
  return TaskData(train=tuple(train), test=data.test), tuple(val)
