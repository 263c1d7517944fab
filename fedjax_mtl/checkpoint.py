"""Orbax CheckpointManager around the whole federation state."""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from fedjax_mtl.errors import ConfigError
from fedjax_mtl.state import FedState, from_dict, to_dict

PyTree = Any


class Checkpointer:
  """Saves the federation state every few rounds; restores the latest one."""

  def __init__(self, directory: str, max_to_keep: int = 2):
    self.directory = os.path.abspath(directory)
    self._mngr = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))

  @staticmethod
  def latest_in(directory: str) -> int | None:
    """Newest checkpointed round under `directory` (None if none); creates nothing."""
    if not os.path.isdir(directory):
      return None
    mngr = ocp.CheckpointManager(os.path.abspath(directory),
                                 options=ocp.CheckpointManagerOptions(create=False))
    try:
      return mngr.latest_step()
    finally:
      mngr.close()

  def latest_round(self) -> int | None:
    """Number of completed rounds in the newest checkpoint, or None."""
    return self._mngr.latest_step()

  def save(self, rounds_done: int, state: FedState) -> None:
    """Asynchronously save `state` (host copies are made before this returns)."""
    self._mngr.save(rounds_done, args=ocp.args.StandardSave(to_dict(state)))

  def restore(self, abstract_state: FedState) -> FedState:
    """Restore the newest checkpoint into the structure/shardings of `abstract_state`."""
    step = self._mngr.latest_step()
    try:
      d = self._mngr.restore(step, args=ocp.args.StandardRestore(to_dict(abstract_state)))
      return from_dict(abstract_state, d)
    except (ValueError, KeyError, TypeError) as e:
      msg = str(e).splitlines()[0] if str(e) else type(e).__name__
      raise ConfigError(
          f'checkpoint {self.directory}/{step} does not match the config '
          f'(model, scenario or algorithm changed?): {msg[:300]}') from None

  def close(self) -> None:
    self._mngr.wait_until_finished()
    self._mngr.close()

