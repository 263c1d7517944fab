"""Client specs from config: the paper's hetero-client layouts on any dataset pair.

A layout is a list of "blocks" `(dataset, kind, tasks, copies)`: `st` blocks give
`copies` single-task clients per listed task, `mt` blocks give `copies` clients
with all listed tasks. As in the released code, each (dataset, kind) splits the
dataset's train set into disjoint random equal chunks with one
`numpy.random.RandomState(seed)`, ST blocks drawn before MT blocks.

`config.split='dirichlet'` draws a label-skewed partition instead (Hsu et al. 2019,
as FL-bench and flwr-datasets' DirichletPartitioner): the images of each value of a
scene attribute (the image's dominant semseg class, `dominant_class`) are divided
among the clients of a (dataset, kind) by proportions drawn from Dir(split_alpha·1),
from the same RandomState, redrawn until every client has `batch_size` images.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from fedjax_mtl.errors import ConfigError, check_choice
from fedjax_mtl.tasks import DATASETS, IGNORE

# How the train images of a (dataset, kind) are divided among its clients (`config.split`).
SPLITS = ('equal', 'dirichlet')
# Dirichlet draws per (dataset, kind) before the split is refused: the usual rule
# (NIID-Bench, FL-bench) redraws until every client holds `batch_size` images.
MAX_SPLIT_DRAWS = 100
# Semseg classes that cover most of nearly every scene, so that the dominant class
# is that of the objects: PASCAL's background; NYUD's wall and floor (NYU40 1, 2
# after the -1 shift), which would otherwise dominate almost every room (the
# synthetic NYUD train set: floor in 117 of 120 images).
SCENE_BACKGROUND = {'pascal': (0,), 'nyud': (0, 1)}
NO_OBJECT = -1  # the attribute of an image with only background or ignore pixels

P_TASKS = ('semseg', 'human_parts', 'normals', 'edge', 'sal')  # released config order
N_TASKS = ('semseg', 'normals', 'edge', 'depth')


def _st(dataset, tasks, copies=1):
  return (dataset, 'st', tuple(tasks), copies)


def _mt(dataset, tasks, copies=1):
  return (dataset, 'mt', tuple(tasks), copies)


LAYOUTS: dict[str, list[tuple]] = {
    # Tab. 1 / Fig. 5: 5 PASCAL ST clients + 1 NYUD MT client, scaled by 2x / 4x.
    'pascal_st_nyud_mt_1c': [_st('pascal', P_TASKS), _mt('nyud', N_TASKS)],
    'pascal_st_nyud_mt_2c': [_st('pascal', P_TASKS, 2), _mt('nyud', N_TASKS, 2)],
    'pascal_st_nyud_mt_4c': [_st('pascal', P_TASKS, 4), _mt('nyud', N_TASKS, 4)],
    # Tab. 2: 4 NYUD ST clients + 1 PASCAL MT client.
    'nyud_st_pascal_mt_1c': [_st('nyud', N_TASKS), _mt('pascal', P_TASKS)],
    # Tab. 5: MT-only clients.
    'mt_only': [_mt('pascal', ('semseg', 'human_parts', 'normals')),
                _mt('nyud', ('semseg', 'normals'))],
    # Tab. 4 / supp. Tab. 2: ST-only clients of one dataset.
    'nyud_st': [_st('nyud', N_TASKS)],
    'pascal_st': [_st('pascal', P_TASKS)],
    # NTKFedAvg's benchmark A (MaT-FL's setting) with 2 clients per task.
    'pascal_st_2c': [_st('pascal', P_TASKS, 2)],
    # One multi-task client holding all of a dataset's training data and tasks: the
    # centrally trained model (scripts/task_band.py's ceiling).
    'pascal_mt': [_mt('pascal', P_TASKS)],
    'nyud_mt': [_mt('nyud', N_TASKS)],
}


@dataclasses.dataclass(frozen=True)
class ClientSpec:
  """One client: its dataset, tasks (in decoder order), data and local epochs."""
  name: str
  dataset: str
  kind: str  # 'st' or 'mt'
  tasks: tuple[str, ...]
  train_indices: np.ndarray = dataclasses.field(repr=False, compare=False)
  local_epochs: int
  # The client's share of the split in the order it was drawn (before the
  # human-parts filter): real-data clients open their images in this order.
  draw_indices: np.ndarray | None = dataclasses.field(default=None, repr=False, compare=False)

  @property
  def num_train(self) -> int:
    return len(self.train_indices)


def layout(name: str) -> list[tuple]:
  """Blocks of a named layout, with a clear error for unknown names."""
  check_choice('scenario', name, LAYOUTS)
  return LAYOUTS[name]


def select_tasks(blocks: list[tuple], tasks: str) -> list[tuple]:
  """Restrict a layout to the comma-separated `tasks` ('' keeps all).

  Single-task clients of dropped tasks disappear; multi-task clients keep the
  selected subset of their tasks (and disappear if none is left).
  """
  if not tasks:
    return blocks
  wanted = [t.strip() for t in tasks.split(',') if t.strip()]
  valid = sorted({t for d in {b[0] for b in blocks} for t in DATASETS[d].tasks})
  for t in wanted:
    check_choice('task', t, valid, ' in config.tasks')
  out = []
  for dataset, kind, block_tasks, copies in blocks:
    kept = tuple(t for t in block_tasks if t in wanted)
    if kept:
      out.append((dataset, kind, kept, copies))
  if not out:
    raise ConfigError(f'config.tasks={tasks!r} leaves no client in this scenario')
  return out


PartsFilter = Callable[[str, np.ndarray], np.ndarray]


def label_parts_filter(train_labels: dict[str, dict[str, np.ndarray]]) -> PartsFilter:
  """`filter(dataset, indices) -> kept`: the images whose human_parts labels are not all ignore."""
  def keep(dataset: str, idx: np.ndarray) -> np.ndarray:
    parts = train_labels[dataset].get('human_parts')
    if parts is None:
      return idx
    return idx[np.any(parts[idx] != IGNORE, axis=(1, 2))]
  return keep


# `attribute(dataset, indices) -> values`: one int per image (`config.split='dirichlet'`).
Attribute = Callable[[str, np.ndarray], np.ndarray]


def dominant_class(counts: np.ndarray, dataset: str) -> np.ndarray:
  """Per image, the most frequent semseg class of `counts` ([n, 256] label histograms)
  other than ignore and the dataset's `SCENE_BACKGROUND` (`NO_OBJECT` where none)."""
  counts = np.array(counts, np.int64)
  counts[:, [IGNORE, *SCENE_BACKGROUND[dataset]]] = 0
  return np.where(counts.any(axis=1), counts.argmax(axis=1), NO_OBJECT)


def label_histograms(labels: np.ndarray) -> np.ndarray:
  """[n, 256] counts of each uint8 label value per image of `labels` [n, ...]."""
  out = np.zeros((len(labels), 256), np.int64)
  # One bincount per slice of images (offset by 256 per image): a bounded int64 copy.
  for a in range(0, len(labels), 256):
    block = np.asarray(labels[a:a + 256], np.int64).reshape(min(256, len(labels) - a), -1)
    flat = block + 256 * np.arange(len(block))[:, None]
    out[a:a + len(block)] = np.bincount(flat.ravel(), minlength=256 * len(block)).reshape(-1, 256)
  return out


def label_attribute(train_labels: dict[str, dict[str, np.ndarray]]) -> Attribute:
  """`attribute(dataset, indices)`: each image's `dominant_class` from in-memory semseg labels."""
  def attribute(dataset: str, idx: np.ndarray) -> np.ndarray:
    return dominant_class(label_histograms(train_labels[dataset]['semseg'][idx]), dataset)
  return attribute


def split_summary(clients: list[ClientSpec], attribute: Attribute) -> str:
  """One line: per client, its image count and the share of its most common attribute value."""
  parts = []
  for c in clients:
    values, counts = np.unique(attribute(c.dataset, c.train_indices), return_counts=True)
    top = int(values[counts.argmax()]) if len(counts) else NO_OBJECT
    share = counts.max() / c.num_train if len(counts) else 0.
    parts.append(f'{c.name} {c.num_train} (class {top}: {share:.0%})')
  return '; '.join(parts)


def dirichlet_split(rs: np.random.RandomState, values: np.ndarray, num_clients: int,
                    alpha: float) -> list[np.ndarray]:
  """Positions 0..len(values)-1 divided among `num_clients`: the positions of each
  attribute value (ascending), shuffled, cut by proportions drawn from Dir(alpha·1)."""
  parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
  for v in np.unique(values):
    idx = np.flatnonzero(values == v)
    rs.shuffle(idx)
    p = rs.dirichlet(np.full(num_clients, float(alpha)))
    if not np.all(np.isfinite(p)):
      # For alpha below ~1e-3 every gamma draw can underflow to 0 (0/0): the
      # alpha -> 0 limit, all of the value's images on one client.
      p = np.eye(num_clients)[rs.randint(num_clients)]
    cuts = (np.cumsum(p)[:-1] * len(idx)).astype(int)
    for j, chunk in enumerate(np.split(idx, cuts)):
      parts[j].append(chunk)
  return [np.concatenate(p) for p in parts]


def _kept(config, tasks: tuple, dataset: str, drawn: np.ndarray,
          parts_filter: PartsFilter | None) -> np.ndarray:
  """A client's training images of its drawn share (the human filter), sorted."""
  idx = drawn
  if (tasks == ('human_parts',) and parts_filter is not None
      and config.get('parts_clients_humans_only', True)):
    idx = parts_filter(dataset, drawn)
  return np.sort(idx)


def _dirichlet_shares(config, rs: np.random.RandomState, dataset: str, kind: str,
                      owners: list, values: np.ndarray,
                      parts_filter: PartsFilter | None) -> list[np.ndarray]:
  """`dirichlet_split` redrawn until every client keeps `batch_size` images (after the
  human filter), at most `MAX_SPLIT_DRAWS` times; ConfigError after that."""
  alpha, best = float(config.split_alpha), None
  for _ in range(MAX_SPLIT_DRAWS):
    shares = dirichlet_split(rs, values, len(owners), alpha)
    sizes = [len(_kept(config, tasks, dataset, s, parts_filter))
             for tasks, s in zip(owners, shares)]
    if min(sizes) >= config.batch_size:
      return shares
    j = int(np.argmin(sizes))
    if best is None or sizes[j] > best[0]:
      best = (sizes[j], owners[j])
  size, tasks = best
  raise ConfigError(
      f"split='dirichlet' with split_alpha={alpha:g} leaves client "
      f'{dataset}/{kind}/{"+".join(tasks)} at best {size} images (< batch_size='
      f'{config.batch_size}) in {MAX_SPLIT_DRAWS} draws of {len(owners)} {kind.upper()} '
      f'clients on {dataset!r}; use a larger split_alpha or fewer clients')


def build_clients(config, num_train: dict[str, int], *,
                  parts_filter: PartsFilter | None = None,
                  attribute: Attribute | None = None) -> list[ClientSpec]:
  """Client specs for `config.scenario` with disjoint random train splits.

  `num_train` maps dataset -> train set size. `config.split` 'equal': equal
  chunks; 'dirichlet': the label skew of `dirichlet_split` on
  `attribute(dataset, indices)` (e.g. `label_attribute`; required then). Human_parts-only
  clients keep only the images `parts_filter(dataset, indices)` returns
  (`config.parts_clients_humans_only`; e.g. `label_parts_filter`, or the
  real-data cache's human flags).
  """
  blocks = select_tasks(layout(config.scenario), config.get('tasks', ''))
  split = config.get('split', 'equal')
  if split == 'dirichlet' and attribute is None:
    raise ValueError("split='dirichlet' needs the images' attribute (build_clients(attribute=))")
  rs = np.random.RandomState(config.split_seed)
  epochs_cfg = dict(config.local_epochs)
  by_key: dict[tuple, list] = {}
  for dataset, kind, tasks, copies in blocks:
    info = DATASETS[dataset]
    for t in tasks:
      info.task_id(t)
    by_key.setdefault((dataset, kind), []).append((tasks, copies))
  clients = []
  # ST splits are drawn before MT splits, as in the released code.
  for kind in ('st', 'mt'):
    for (dataset, k), entries in by_key.items():
      if k != kind:
        continue
      n = int(num_train[dataset])
      owners = []
      for tasks, copies in entries:
        if kind == 'st':
          # Client order follows the task order, repeated per copy (released code).
          owners += [(t,) for t in tasks for _ in range(copies)]
        else:
          # MT decoders in sorted task order, as the released code orders them.
          owners += [tuple(sorted(tasks))] * copies
      if len(owners) > n:
        raise ConfigError(
            f'impossible split: {len(owners)} {kind.upper()} clients on {dataset!r} '
            f'but only {n} train images; use fewer clients or more data')
      if split == 'dirichlet' and len(owners) > 1:
        values = np.asarray(attribute(dataset, np.arange(n)))
        chunks = _dirichlet_shares(config, rs, dataset, kind, owners, values, parts_filter)
      else:
        # One client gets everything either way (from the same draw, as the released code).
        chunks = np.array_split(rs.permutation(n), len(owners))
      epochs = int(epochs_cfg.get(dataset, DATASETS[dataset].default_local_epochs))
      for i, (tasks, drawn) in enumerate(zip(owners, chunks)):
        idx = _kept(config, tasks, dataset, drawn, parts_filter)
        if len(idx) < config.batch_size:
          raise ConfigError(
              f'impossible split: client {dataset}/{kind}/{"+".join(tasks)} gets '
              f'{len(idx)} images, fewer than batch_size={config.batch_size}')
        name = f'{dataset}_{kind}_{"+".join(tasks) if kind == "st" else "mt"}'
        clients.append(ClientSpec(name=f'{name}_{i}', dataset=dataset, kind=kind,
                                  tasks=tuple(tasks), train_indices=idx,
                                  local_epochs=epochs, draw_indices=drawn))
  return clients
