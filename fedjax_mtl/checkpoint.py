"""Orbax CheckpointManager around the whole federation state."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import traceback
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from fedjax_mtl.errors import ConfigError
from fedjax_mtl.state import FedState, from_dict, to_dict

PyTree = Any

# Suffix of a step folder whose data could not be read: orbax only lists folders
# named by a bare step number, so the folder stays on disk, out of the manager's way.
UNREADABLE = '.unreadable'
# orbax 0.12's coroutine that reads one array (see `_silence_abandoned_reads`).
_ORBAX_READ = '_read_array_index_and_device_put'


# A state above this share of the host's memory is saved synchronously through bounded
# host buffers: orbax's default copies the whole state to the host before `save`
# returns and writes it in the background into the next round (8 GB for the 4c paper
# layout's 24 Swin-T clients and their AdamW moments), past what a 24 GB host holds
# beside the round's own buffers.
SYNC_SAVE_SHARE = 1 / 8


def _nbytes(x) -> int:
  return int(x.size) * x.dtype.itemsize if hasattr(x, 'dtype') else 0


def waits_for_write(state) -> bool:
  """Whether `Checkpointer.save` waits for the write: when the state's bytes exceed
  `SYNC_SAVE_SHARE` of the host's memory (on any backend: a device state is copied to
  the host to be written)."""
  from fedjax_mtl import hostmem
  nbytes = sum(_nbytes(x) for x in jax.tree.leaves(state))
  return nbytes > SYNC_SAVE_SHARE * hostmem.host_memory_bytes()


def host_buffer_gb(state) -> int | None:
  """The GB of host buffers a save or restore of `state` holds at once (orbax's
  `save_concurrent_gb` / `restore_concurrent_gb`): orbax's default (None: every array
  at once) unless the state is saved synchronously (`waits_for_write`); then
  `SYNC_SAVE_SHARE` of the host's memory, and more than twice the largest array (orbax
  reserves an array's bytes whole)."""
  if state is None or not waits_for_write(state):
    return None
  from fedjax_mtl import hostmem
  largest = max((_nbytes(x) for x in jax.tree.leaves(state)), default=0)
  bound = max(SYNC_SAVE_SHARE * hostmem.host_memory_bytes(), 2 * largest + 1)
  return max(1, -(-int(bound) // 10**9))  # orbax counts 10**9 bytes a GB


# Arrays under this many bytes are saved packed, one host array per dtype: orbax's
# work per array, not the bytes, is what a small state's save costs (the default
# config's 311 arrays, 24 MB: 0.5-0.75 CPU-seconds per save; the same bytes as one
# array 0.05 s; BENCHMARKS.md). The step's custom metadata records which leaves a
# pack holds, in order (`pack_layout`); a step without it (written before packing, or
# by a multi-process run, whose arrays no process holds whole) is read leaf by leaf.
PACK_MAX_BYTES = 1 << 20
PACKED = '__packed__'  # the packs' key in the saved tree
_LAYOUT_KEY = 'fedjax_mtl_packed'  # in the step's custom metadata
_STEP_METADATA = '_CHECKPOINT_METADATA'  # orbax's file of it in the step folder


def _path_name(path) -> str:
  def name(k):
    return str(getattr(k, 'key', getattr(k, 'idx', getattr(k, 'name', k))))
  return '/'.join(name(k) for k in path)


def _packable(x) -> bool:
  dtype = getattr(x, 'dtype', None)
  if dtype is None or jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
    return False
  sharding = getattr(x, 'sharding', None)
  return _nbytes(x) < PACK_MAX_BYTES and (sharding is None or sharding.is_fully_addressable)


def pack_layout(tree: PyTree) -> dict[str, list]:
  """{dtype: [[path, shape], ...]}: the leaves of `tree` (arrays or their shapes) that
  a save packs, in their order in the pack: arrays under `PACK_MAX_BYTES` that this
  process holds whole."""
  out: dict[str, list] = {}
  for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if _packable(x):
      out.setdefault(np.dtype(x.dtype).name, []).append([_path_name(path), list(x.shape)])
  return out


def _packed_paths(layout: dict) -> set[str]:
  return {p for entries in layout.values() for p, _ in entries}


def _pack(tree: dict, layout: dict) -> dict:
  """`tree` with the leaves `layout` names set to None and their values concatenated
  per dtype (host copies) under `PACKED`."""
  names = _packed_paths(layout)
  taken = {}

  def take(path, x):
    name = _path_name(path)
    if name in names:
      taken[name] = x
      return None
    return x

  rest = jax.tree_util.tree_map_with_path(take, tree)
  packs = {dt: np.concatenate([np.asarray(taken[p]).reshape(-1) for p, _ in entries])
           for dt, entries in layout.items()}
  return {**rest, PACKED: packs} if packs else rest


def _restore_target(like: dict, layout: dict) -> dict:
  """What orbax restores for a step packed by `layout`: `like` with the packed leaves
  set to None, and one host array per pack."""
  names = _packed_paths(layout)
  rest = jax.tree_util.tree_map_with_path(
      lambda path, x: None if _path_name(path) in names else x, like)
  packs = {dt: np.empty(sum(math.prod(shape) for _, shape in entries), np.dtype(dt))
           for dt, entries in layout.items()}
  return {**rest, PACKED: packs} if packs else rest


def _unpack(restored: dict, like: dict, layout: dict) -> dict:
  """The restored tree with the packed leaves cut out of their packs and placed as
  `like`'s leaves are (their shardings, when `like` has them)."""
  if not layout:
    return restored
  restored = dict(restored)
  packs = restored.pop(PACKED)
  pieces = {}
  for dt, entries in layout.items():
    flat, offset = packs[dt], 0
    for p, shape in entries:
      n = math.prod(shape)
      pieces[p] = flat[offset:offset + n].reshape(shape)
      offset += n
  values = {_path_name(path): x for path, x in
            jax.tree_util.tree_flatten_with_path(restored, is_leaf=lambda x: x is None)[0]}

  def place(path, l):
    name = _path_name(path)
    if name not in pieces:
      return values[name]
    return jax.device_put(pieces[name], getattr(l, 'sharding', None))

  return jax.tree_util.tree_map_with_path(place, like)


class Checkpointer:
  """Saves the federation state every few rounds; restores the newest readable one."""

  # Two steps: orbax deletes the older one only after the newer one is committed, so
  # whenever the newest step turns out unreadable an older step is still on disk.
  def __init__(self, directory: str, max_to_keep: int = 2, like: PyTree = None):
    """`like`: the state (or its abstract shapes) this checkpointer saves and restores;
    a state that is a large share of the host's memory is then written and read
    through bounded host buffers (`host_buffer_gb`)."""
    if max_to_keep < 2:
      raise ConfigError(f'max_to_keep must be >= 2 (an older step to fall back to), '
                        f'got {max_to_keep}')
    self.directory = os.path.abspath(directory)
    self.buffer_gb = host_buffer_gb(like)
    handler = (ocp.StandardCheckpointHandler(save_concurrent_gb=self.buffer_gb,
                                             restore_concurrent_gb=self.buffer_gb)
               if self.buffer_gb else None)
    self._mngr = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
        item_handlers=handler)

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

  @staticmethod
  def saved_in(directory: str) -> list[int]:
    """Every checkpointed round under `directory`, oldest first; creates nothing."""
    if not os.path.isdir(directory):
      return []
    mngr = ocp.CheckpointManager(os.path.abspath(directory),
                                 options=ocp.CheckpointManagerOptions(create=False))
    try:
      return sorted(mngr.all_steps())
    finally:
      mngr.close()

  def restore(self, step: int, abstract_state: FedState) -> FedState:
    """The state saved at round `step`; ConfigError when it is another config's or
    its data cannot be read."""
    try:
      return self._restore_step(step, abstract_state)
    except _Unreadable as e:
      raise ConfigError(f'checkpoint {self._step_dir(step)} is unreadable: {e}') from None

  def latest_round(self) -> int | None:
    """Number of completed rounds in the newest checkpoint, or None."""
    return self._mngr.latest_step()

  def save(self, rounds_done: int, state: FedState) -> None:
    """Save `state`: host copies are made before this returns and written in the
    background, unless the state is a large share of the host's memory
    (`waits_for_write`): then the write finishes first, so that its buffers are gone
    before the next round allocates (and a bounded save, `like`, never reads arrays a
    later step has donated)."""
    tree = to_dict(state)
    layout = pack_layout(tree)
    self._mngr.save(rounds_done, args=ocp.args.StandardSave(_pack(tree, layout)),
                    custom_metadata={_LAYOUT_KEY: layout})
    if self.buffer_gb or waits_for_write(state):
      self._mngr.wait_until_finished()

  def restore_latest(self, abstract_state: FedState) -> tuple[int, FedState]:
    """(step, state) of the newest readable checkpoint.

    Steps whose data cannot be read (truncated, corrupt or missing files) are
    skipped; once an older step was read, each skipped step folder is renamed
    `<step>.unreadable` (kept on disk, no longer listed by orbax) with one line
    on stderr. A checkpoint of another model or scenario raises ConfigError,
    as does a directory without a readable step (then nothing is moved).
    """
    self._mngr.wait_until_finished()
    self._mngr.reload()
    steps = sorted(self._mngr.all_steps(), reverse=True)
    if not steps:
      raise ConfigError(f'no checkpoint in {self.directory}')
    skipped = []
    for step in steps:
      try:
        state = self._restore_step(step, abstract_state)
      except _Unreadable as e:
        skipped.append((step, str(e)))
        continue
      if skipped:
        if jax.process_index() == 0:  # one process renames; all wait, then re-list
          for s, why in skipped:
            dest = _set_aside(self._step_dir(s))
            print(f'checkpoint {self._step_dir(s)} is unreadable ({why}); moved to {dest}, '
                  f'resuming from step {step}', file=sys.stderr, flush=True)
        ocp.multihost.sync_global_processes('fedjax_mtl_set_aside_unreadable')
        self._mngr.reload()
      return step, state
    raise ConfigError(f'no readable checkpoint in {self.directory}: '
                      + '; '.join(f'step {s}: {why}' for s, why in skipped))

  def close(self) -> None:
    self._mngr.wait_until_finished()
    self._mngr.close()

  def _step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def _restore_step(self, step: int, abstract_state: FedState) -> FedState:
    """One step's state; ConfigError if it is another model's, _Unreadable if its data is bad."""
    like = to_dict(abstract_state)
    layout = self._layout(step)
    if diff := _layout_diff(layout, like):  # packed leaves the config does not have
      raise self._mismatch(step, _structure_diff(self._step_dir(step), like, layout) or diff)
    _silence_abandoned_reads()  # before reading: a failed read's echoes arrive at once
    try:
      d = self._mngr.restore(step, args=ocp.args.StandardRestore(_restore_target(like, layout)))
    except Exception as e:  # tensorstore raises bare Exceptions
      if any(isinstance(c, MemoryError) or 'RESOURCE_EXHAUSTED' in str(c) for c in _chain(e)):
        raise  # the machine, not the checkpoint
      # Only a structure positively read from the step's metadata decides that the
      # checkpoint belongs to another config; anything else is unreadable data.
      diff = _structure_diff(self._step_dir(step), like, layout)
      if diff:
        raise self._mismatch(step, diff) from None
      raise _Unreadable(_reason(e)) from None
    try:
      return from_dict(abstract_state, _unpack(d, like, layout))
    except (ValueError, KeyError, TypeError) as e:
      raise self._mismatch(step, _reason(e)) from None

  def _layout(self, step: int) -> dict:
    """The step's packs (`pack_layout`; {} for a step saved leaf by leaf), read from
    the step's metadata file (orbax's `metadata(step)` also probes the items, and
    logs a warning for each)."""
    path = os.path.join(self._step_dir(step), _STEP_METADATA)
    if not os.path.exists(path):
      return {}
    try:
      with open(path) as f:
        meta = json.load(f)
    except (OSError, ValueError) as e:
      raise _Unreadable(_reason(e)) from None
    layout = ((meta.get('custom_metadata') if isinstance(meta, dict) else None) or {}).get(
        _LAYOUT_KEY) or {}
    if not isinstance(layout, dict):
      raise _Unreadable(f'its pack layout is not a mapping: {type(layout).__name__}')
    return layout

  def _mismatch(self, step: int, why: str) -> ConfigError:
    return ConfigError(
        f'checkpoint {self._step_dir(step)} does not match the config '
        f'(model, scenario or algorithm changed?): {why}')


class _Unreadable(Exception):
  """A step whose files cannot be read (message: the reason, one short line)."""


def _chain(e: BaseException) -> list[BaseException]:
  """`e` and the exceptions it was raised from, outermost first."""
  out = [e]
  while (inner := e.__cause__ or e.__context__) is not None and inner not in out:
    out.append(inner)
    e = inner
  return out


def _reason(e: BaseException, limit: int = 200) -> str:
  """The first line of the innermost cause of `e`, without tensorstore's spec dump."""
  e = _chain(e)[-1]
  lines = str(e).strip().splitlines()
  msg = lines[0].split(' [tensorstore_spec')[0] if lines else ''
  msg = re.sub(r' (in OCDBT database )?at local file "[^"]*"', '', msg)  # the step names it
  msg = f'{type(e).__name__}: {msg}' if msg else type(e).__name__
  return msg if len(msg) <= limit else msg[:limit - 3] + '...'


def _silence_abandoned_reads() -> None:
  """Drop the tracebacks of orbax's abandoned array reads (once per process).

  When one read of a step fails, orbax abandons the others; each re-raises the
  GeneratorExit that closes it as a new Exception when garbage-collected, which
  Python prints as 'Exception ignored in: <coroutine ...>' plus a TensorStore
  spec dump, after the one-line message that already names the step; and
  TensorStore's callbacks of reads still in flight report 'Event loop is closed'
  when they complete after orbax closed its event loop.
  """
  previous = sys.unraisablehook
  if getattr(previous, '_drops_abandoned_reads', False):
    return

  def hook(u):
    code = getattr(u.object, 'cr_code', None)
    abandoned = (code is not None and code.co_name == _ORBAX_READ
                 and isinstance(getattr(u.exc_value, '__cause__', None), GeneratorExit))
    # TensorStore's completion callbacks of those reads, posting to orbax's closed loop.
    late = (u.object is None and isinstance(u.exc_value, RuntimeError)
            and str(u.exc_value) == 'Event loop is closed')
    if not (abandoned or late):
      previous(u)

  hook._drops_abandoned_reads = True
  sys.unraisablehook = hook
  logging.getLogger('asyncio').addFilter(_drop_unretrieved_reads)


def _drop_unretrieved_reads(record: logging.LogRecord) -> bool:
  """asyncio's 'exception was never retrieved' report of an abandoned checkpoint read
  (orbax's reading coroutine, or the TensorStore read future under it)."""
  if 'exception was never retrieved' not in record.getMessage() or not record.exc_info:
    return True
  e, tb = record.exc_info[1], record.exc_info[2]
  frames = {f.name for f in traceback.extract_tb(tb)} if tb else set()
  return not (_ORBAX_READ in frames or 'Error reading' in str(e))


def _leaf_shapes(tree: PyTree) -> dict[str, tuple]:
  """{'a/b/0': shape} of a tree's array leaves (lists and dicts spelled alike)."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {_path_name(path): tuple(getattr(x, 'shape', ())) for path, x in flat}


def _layout_diff(layout: dict, like: PyTree) -> str:
  """How the packed leaves of a step (`layout`) differ from `like` ('' if they are
  all `like`'s leaves with the same shapes and dtypes)."""
  want = {_path_name(path): x for path, x in jax.tree_util.tree_flatten_with_path(like)[0]}
  for dt, entries in layout.items():
    for p, shape in entries:
      if p not in want:
        return f'{p} is in the checkpoint, not in the config'
      x = want[p]
      if tuple(shape) != tuple(x.shape) or np.dtype(dt) != np.dtype(x.dtype):
        return (f'{p} is {dt}{tuple(shape)} in the checkpoint, '
                f'{np.dtype(x.dtype).name}{tuple(x.shape)} in the config')
  return ''


def _structure_diff(step_dir: str, like: PyTree, layout: dict | None = None) -> str:
  """How the step's stored tree (its packed leaves `layout` included) differs from
  `like` ('' if it matches or is unreadable)."""
  handler = ocp.StandardCheckpointHandler()
  try:
    disk = _leaf_shapes(handler.metadata(epath.Path(step_dir) / 'default').tree)
  except Exception:  # unreadable metadata: the step is corrupt, not another config's
    return ''
  finally:
    handler.close()
  disk = {k: v for k, v in disk.items() if not k.startswith(PACKED + '/')}
  disk.update({p: tuple(shape) for entries in (layout or {}).values() for p, shape in entries})
  want = _leaf_shapes(like)
  if missing := sorted(set(want) - set(disk)):
    return f'{len(missing)} arrays missing from the checkpoint, e.g. {missing[0]}'
  if extra := sorted(set(disk) - set(want)):
    return f'{len(extra)} arrays not in the config, e.g. {extra[0]}'
  for k in sorted(want):
    if want[k] != disk[k]:
      return f'{k} has shape {disk[k]} in the checkpoint, {want[k]} in the config'
  return ''


def _set_aside(step_dir: str) -> str:
  """Rename `step_dir` to a free `<step>.unreadable[-n]` next to it; returns the new path."""
  dest, n = step_dir + UNREADABLE, 1
  while os.path.exists(dest):
    n += 1
    dest = f'{step_dir}{UNREADABLE}-{n}'
  os.rename(step_dir, dest)
  return dest
