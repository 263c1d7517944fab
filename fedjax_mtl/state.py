"""Typed federation state: everything that changes during a run, in one pytree.

Each client group's arrays carry a leading client axis (sharded over the mesh's
`clients` axis); the round, the RNG and the server's shared state are
replicated. Checkpoints store `to_dict(state)` (plain nested dicts), so the
on-disk layout does not depend on these classes.
"""

from __future__ import annotations

from typing import Any

import flax.struct
from flax import serialization

PyTree = Any


@flax.struct.dataclass
class GroupState:
  """One client group, every leaf with a leading client axis."""
  params: PyTree
  batch_stats: PyTree
  opt_state: PyTree
  client: PyTree = ()  # the algorithm's client state
  server_rows: PyTree = ()  # role -> this group's rows of the server's per-row state
  personal: PyTree = ()  # (params, batch_stats, opt_state) of a personal model, or ()


@flax.struct.dataclass
class FedState:
  """The whole federation: client groups plus replicated round, RNG and server state."""
  round: Any
  rng: Any
  groups: list
  server: PyTree = ()  # the server's shared (replicated) state


def to_dict(state: FedState) -> dict:
  """Plain nested dicts (what checkpoints store)."""
  return serialization.to_state_dict(state)


def from_dict(like: FedState, d: dict) -> FedState:
  """`to_dict`'s inverse, with the structure of `like`."""
  return serialization.from_state_dict(like, d)
