"""Federation structure and state: client groups of stacked pytrees.

A client group holds clients that share dataset (input shape), number of task
slots and local epochs. Its params, batch-norm stats and optimizer states carry
a leading client axis (padded to a multiple of the device count; padding
clients never train and are never aggregated). Aggregation sees two views
gathered across groups: encoders stacked `[N, ...]` over all clients and
decoders stacked `[K, ...]` over all task decoders of all clients (client-major,
tasks in each client's decoder order). Batch-norm statistics stay local; heads are
one row per client (all its slots), shared only by the unified-model setting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl import tasks as tasks_lib
from fedjax_mtl.algorithms.base import Blocks, stack, unstack
from fedjax_mtl.algorithms.base import merge_view, role_view  # noqa: F401 (re-exported)
from fedjax_mtl.scenarios import ClientSpec

PyTree = Any


@dataclasses.dataclass(frozen=True, eq=False)
class GroupSpec:
  """Static description of one client group (closed over by jitted code)."""
  dataset: str
  client_ids: tuple[int, ...]  # global client ids of the real clients
  num_pad: int  # padding clients appended for even sharding
  task_ids: np.ndarray  # [n_total, slots] index into the dataset's task tuple
  head_channels: tuple[int, ...]  # per slot: max channels of the tasks it holds
  slot_tasks: tuple[tuple[str, ...], ...]  # per slot: the tasks some client puts there
  local_epochs: int
  index_table: np.ndarray  # [n_total, max_n] train indices, padded with 0
  counts: np.ndarray  # [n_total] number of train images per client (0 for padding)

  @property
  def num_real(self) -> int:
    return len(self.client_ids)

  @property
  def num_total(self) -> int:
    return self.num_real + self.num_pad

  @property
  def num_slots(self) -> int:
    return len(self.head_channels)

  @property
  def tasks_used(self) -> tuple[str, ...]:
    info = tasks_lib.DATASETS[self.dataset]
    used = {t for ts in self.slot_tasks for t in ts}
    return tuple(t for t in info.tasks if t in used)


@dataclasses.dataclass(frozen=True, eq=False)
class Federation:
  """All clients (in group-major order) and their groups."""
  clients: tuple[ClientSpec, ...]
  groups: tuple[GroupSpec, ...]

  @property
  def num_clients(self) -> int:
    return len(self.clients)

  @property
  def decoder_client(self) -> tuple[int, ...]:
    """Owner client of each of the K decoders, in stacked-decoder order."""
    return tuple(i for i, c in enumerate(self.clients) for _ in c.tasks)

  @property
  def decoder_names(self) -> tuple[str, ...]:
    return tuple(f'{c.name}/{t}' for c in self.clients for t in c.tasks)

  @property
  def num_decoders(self) -> int:
    return len(self.decoder_client)

  @property
  def homo_groups(self) -> tuple[int, ...]:
    """Ids of runs of consecutive clients with the same dataset and task list."""
    return consecutive_group_ids([(c.dataset, c.tasks) for c in self.clients])

  @property
  def num_examples(self) -> np.ndarray:
    """[N] local training examples per client."""
    return np.asarray([c.num_train for c in self.clients], np.float32)



def consecutive_group_ids(keys: Sequence[Hashable]) -> tuple[int, ...]:
  """Group ids for runs of consecutive equal keys, e.g. (dataset, tuple(tasks)) per client."""
  ids: list[int] = []
  for i, key in enumerate(keys):
    ids.append(0 if i == 0 else ids[-1] + (key != keys[i - 1]))
  return tuple(ids)


def build_federation(clients: Sequence[ClientSpec], num_devices: int = 1) -> Federation:
  """Group clients by (dataset, #task slots, local epochs); pad groups to the devices."""
  keys: dict[tuple, list[int]] = {}
  for i, c in enumerate(clients):
    keys.setdefault((c.dataset, len(c.tasks), c.local_epochs), []).append(i)
  ordered: list[ClientSpec] = []
  groups = []
  for (dataset, slots, epochs), members in keys.items():
    info = tasks_lib.DATASETS[dataset]
    members_specs = [clients[i] for i in members]
    n_real = len(members)
    n_pad = (-n_real) % num_devices
    task_ids = np.zeros((n_real + n_pad, slots), np.int32)
    for j, c in enumerate(members_specs):
      task_ids[j] = [info.task_id(t) for t in c.tasks]
    task_ids[n_real:] = task_ids[0]
    slot_tasks = tuple(tuple(dict.fromkeys(c.tasks[s] for c in members_specs))
                       for s in range(slots))
    head_channels = tuple(max(info.channels(t) for t in ts) for ts in slot_tasks)
    max_n = max(c.num_train for c in members_specs)
    table = np.zeros((n_real + n_pad, max_n), np.int32)
    counts = np.zeros((n_real + n_pad,), np.int32)
    for j, c in enumerate(members_specs):
      table[j, :c.num_train] = c.train_indices
      counts[j] = c.num_train
    start = len(ordered)
    ordered += members_specs
    groups.append(GroupSpec(
        dataset=dataset, client_ids=tuple(range(start, start + n_real)), num_pad=n_pad,
        task_ids=task_ids, head_channels=head_channels, slot_tasks=slot_tasks,
        local_epochs=epochs, index_table=table, counts=counts))
  return Federation(clients=tuple(ordered), groups=tuple(groups))


# Per-client axes of a role's leaves inside a group: encoders are [n, ...];
# decoders are [n, slots, ...] (one per task slot), stacked as K rows; a client's
# heads (one module per slot, channels may differ) are one row [n, ...].
_SLOT_AXIS = {'encoder': False, 'decoder': True, 'head': False}


def block_sizes(fed: Federation, role: str) -> tuple[int, ...]:
  """Rows of `role` each group contributes (real clients times task slots for decoders)."""
  return tuple(g.num_real * (g.num_slots if _SLOT_AXIS[role] else 1) for g in fed.groups)


def gather_blocks(group_trees: Sequence[PyTree], fed: Federation, role: str) -> Blocks:
  """The real clients' rows of `role` of every group, left in the groups' arrays.

  A group without padding contributes its own arrays (decoders reshaped to
  `[n * slots, ...]`, free in XLA); nothing is concatenated across groups.
  """
  def rows(x, g):
    x = x[:g.num_real] if g.num_pad else x
    return x.reshape((-1,) + x.shape[2:]) if _SLOT_AXIS[role] else x
  return Blocks(tuple(jax.tree.map(lambda x, g=g: rows(x, g), t)
                      for t, g in zip(group_trees, fed.groups)))


def scatter_blocks(blocks: Blocks, fed: Federation, role: str,
                   group_trees: Sequence[PyTree] | None = None) -> list[PyTree]:
  """Write `gather_blocks`' rows back into per-group trees (padding clients keep
  their rows of `group_trees`, zeros without them)."""
  out = []
  for i, (g, part) in enumerate(zip(fed.groups, blocks.parts)):
    def put(x, old=None, g=g):
      new = x.reshape((g.num_real, g.num_slots) + x.shape[1:]) if _SLOT_AXIS[role] else x
      if not g.num_pad:
        return new if old is None else new.astype(old.dtype)
      pad = old[g.num_real:] if old is not None else jnp.zeros((g.num_pad,) + new.shape[1:],
                                                               new.dtype)
      return jnp.concatenate([new.astype(pad.dtype), pad], 0)
    if group_trees is None:
      out.append(jax.tree.map(put, part))
    else:
      out.append(jax.tree.map(lambda old, x: put(x, old), group_trees[i], part))
  return out


def gather_rows(group_trees: Sequence[PyTree], fed: Federation, role: str) -> PyTree:
  """Stack the real clients' rows of `role` of all groups: `[N, ...]` encoders, `[K, ...]` decoders."""
  return stack(gather_blocks(group_trees, fed, role))


def scatter_rows(stacked: PyTree, fed: Federation, role: str,
                 group_trees: Sequence[PyTree] | None = None) -> list[PyTree]:
  """Write `gather_rows`' stacked rows back into per-group trees.

  Padding clients keep their rows of `group_trees` (zeros without them).
  """
  return scatter_blocks(unstack(stacked, block_sizes(fed, role)), fed, role, group_trees)
