"""Client specs from config: the paper's hetero-client layouts on any dataset pair.

A layout is a list of "blocks" `(dataset, kind, tasks, copies)`: `st` blocks give
`copies` single-task clients per listed task, `mt` blocks give `copies` clients
with all listed tasks. As in the released code, each (dataset, kind) splits the
dataset's train set into disjoint random equal chunks with one
`numpy.random.RandomState(seed)`, ST blocks drawn before MT blocks.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from fedjax_mtl.errors import ConfigError, check_choice
from fedjax_mtl.tasks import DATASETS, IGNORE

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


def build_clients(config, num_train: dict[str, int], *,
                  parts_filter: PartsFilter | None = None) -> list[ClientSpec]:
  """Client specs for `config.scenario` with disjoint random equal train splits.

  `num_train` maps dataset -> train set size. Human_parts-only clients keep
  only the images `parts_filter(dataset, indices)` returns
  (`config.parts_clients_humans_only`; e.g. `label_parts_filter`, or the
  real-data cache's human flags).
  """
  blocks = select_tasks(layout(config.scenario), config.get('tasks', ''))
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
      chunks = np.array_split(rs.permutation(n), len(owners))
      epochs = int(epochs_cfg.get(dataset, DATASETS[dataset].default_local_epochs))
      for i, (tasks, drawn) in enumerate(zip(owners, chunks)):
        idx = drawn
        if (tasks == ('human_parts',) and parts_filter is not None
            and config.get('parts_clients_humans_only', True)):
          idx = parts_filter(dataset, drawn)
        idx = np.sort(idx)
        if len(idx) < config.batch_size:
          raise ConfigError(
              f'impossible split: client {dataset}/{kind}/{"+".join(tasks)} gets '
              f'{len(idx)} images, fewer than batch_size={config.batch_size}')
        name = f'{dataset}_{kind}_{"+".join(tasks) if kind == "st" else "mt"}'
        clients.append(ClientSpec(name=f'{name}_{i}', dataset=dataset, kind=kind,
                                  tasks=tuple(tasks), train_indices=idx,
                                  local_epochs=epochs, draw_indices=drawn))
  return clients
