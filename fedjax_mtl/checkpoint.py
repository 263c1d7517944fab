"""Orbax CheckpointManager around the whole federation state."""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from fedjax_mtl.errors import ConfigError

PyTree = Any


class Checkpointer:
  """Saves the federation state every few rounds; restores the latest one."""

  def __init__(self, directory: str, max_to_keep: int = 2):
    self.directory = os.path.abspath(directory)
    self._mngr = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))

  def latest_round(self) -> int | None:
    """Number of completed rounds in the newest checkpoint, or None."""
    return self._mngr.latest_step()

  def save(self, rounds_done: int, state: PyTree) -> None:
    """Asynchronously save `state` (host copies are made before this returns)."""
    self._mngr.save(rounds_done, args=ocp.args.StandardSave(state))

  def restore(self, abstract_state: PyTree) -> PyTree:
    """Restore the newest checkpoint into the structure/shardings of `abstract_state`."""
    step = self._mngr.latest_step()
    try:
      return self._mngr.restore(step, args=ocp.args.StandardRestore(abstract_state))
    except (ValueError, KeyError, TypeError) as e:
      msg = str(e).splitlines()[0] if str(e) else type(e).__name__
      raise ConfigError(
          f'checkpoint {self.directory}/{step} does not match the config '
          f'(model, scenario or algorithm changed?): {msg[:300]}') from None

  def close(self) -> None:
    self._mngr.wait_until_finished()
    self._mngr.close()

