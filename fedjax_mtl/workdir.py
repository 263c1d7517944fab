"""A run's workdir has one writer: an exclusive OS lock held for the run's whole life.

`lock(workdir)` takes `fcntl.flock` on `<workdir>/.lock`. The kernel releases the
lock when the process ends, however it ends (a killed run leaves no stale lock,
only a file that the next run locks again). A second run on a locked workdir gets
`WorkdirLocked` (a ConfigError: `error:` line, exit 2) naming the holder's PID and
host, before it reads or writes anything there.

Who locks: `fedjax_mtl.main` (both settings), `scripts/compare.py` (every run it
plans, for its whole life) and the Flower server; in multi-process runs process 0
holds the lock for all (`train.train_and_evaluate`). The lock is re-entrant within
a process, so a script that holds a workdir can call `train_and_evaluate` on it.

A run that fails before writing anything leaves no trace: folders the lock created
are removed again when nothing else was written into them. `flock` works on local
filesystems and on NFS (Linux emulates it with byte-range locks there).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
import threading
from typing import Iterator

from fedjax_mtl.errors import ConfigError

LOCK_FILE = '.lock'


class WorkdirLocked(ConfigError):
  """Another process holds the workdir's lock."""


_held: dict[str, list] = {}  # real path -> [fd, depth]: the locks this process holds
_guard = threading.Lock()


def holder(workdir: str) -> dict | None:
  """{'pid', 'host', 'since'} of the process holding `workdir`'s lock, or None if
  nobody holds it (reads the lock file; writes nothing)."""
  path = os.path.join(workdir, LOCK_FILE)
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return None
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
      return _read_holder(fd)
    fcntl.flock(fd, fcntl.LOCK_UN)
    return None
  finally:
    os.close(fd)


def check_free(workdir: str) -> None:
  """WorkdirLocked if another process holds `workdir` (the holder named); else nothing."""
  key = os.path.realpath(workdir)
  with _guard:
    if key in _held:
      return
  who = holder(workdir)
  if who is not None:
    raise _locked(workdir, who)


@contextlib.contextmanager
def lock(workdir: str) -> Iterator[None]:
  """Hold `workdir`'s exclusive lock (creating the folder if needed) until the block ends.

  WorkdirLocked (one line, naming the holder) if another process holds it. A nested
  `lock` of the same folder in this process just enters. On exit the lock file goes
  and, if the block wrote nothing, so do the folders this call created.
  """
  created = _make_dirs(workdir)
  key = os.path.realpath(workdir)
  with _guard:
    entry = _held.get(key)
    if entry is not None:
      entry[1] += 1
  if entry is not None:
    try:
      yield
    finally:
      with _guard:
        entry[1] -= 1
    return
  try:
    fd = _acquire(workdir)
  except BaseException:
    _remove_empty(created)
    raise
  with _guard:
    _held[key] = [fd, 1]
  try:
    yield
  finally:
    with _guard:
      del _held[key]
    # Unlink before unlocking: a process that opened the old file and locks it after
    # us sees that the path no longer names it and starts over (`_acquire`).
    with contextlib.suppress(OSError):
      os.unlink(os.path.join(workdir, LOCK_FILE))
    os.close(fd)
    _remove_empty(created)


@contextlib.contextmanager
def primary_lock(workdir: str) -> Iterator[None]:
  """`lock(workdir)` held by process 0 of a multi-process run (by the process itself
  otherwise); every process raises the same WorkdirLocked if process 0 cannot take it."""
  from fedjax_mtl import distributed
  with contextlib.ExitStack() as stack:
    error = None
    if distributed.is_primary():
      try:
        stack.enter_context(lock(workdir))
      except WorkdirLocked as e:
        error = str(e)
    error = distributed.from_primary('workdir lock', error)
    if error:
      raise WorkdirLocked(error)
    yield


def _acquire(workdir: str) -> int:
  """An fd holding the exclusive lock of `<workdir>/.lock`, its holder line written."""
  path = os.path.join(workdir, LOCK_FILE)
  while True:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      who = _read_holder(fd)
      os.close(fd)
      raise _locked(workdir, who) from None
    except BaseException:
      os.close(fd)
      raise
    try:
      same = os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
      same = False
    if same:
      break
    os.close(fd)  # the holder before us removed this file after we opened it
  info = {'pid': os.getpid(), 'host': socket.gethostname(),
          'since': datetime.datetime.now().isoformat(timespec='seconds')}
  os.ftruncate(fd, 0)
  os.pwrite(fd, (json.dumps(info) + '\n').encode(), 0)
  return fd


def _read_holder(fd: int) -> dict:
  try:
    return json.loads(os.pread(fd, 4096, 0).decode() or '{}')
  except (OSError, ValueError):
    return {}


def _locked(workdir: str, who: dict) -> WorkdirLocked:
  if who.get('pid'):
    by = f'PID {who["pid"]} on host {who.get("host", "?")}'
    by += f', since {who["since"]}' if who.get('since') else ''
  else:
    by = 'a process that is just starting'
  return WorkdirLocked(f'workdir {workdir!r} is in use by another run ({by}); wait for it '
                       'to end or use another --workdir')


def _make_dirs(workdir: str) -> list[str]:
  """Create `workdir` and missing parents; returns the folders created, deepest first."""
  created, path = [], os.path.abspath(workdir)
  while not os.path.isdir(path):
    created.append(path)
    path = os.path.dirname(path)
  for d in reversed(created):
    try:
      os.mkdir(d)
    except FileExistsError:  # another process made it meanwhile: not ours to remove
      created.remove(d)
  return created


def _remove_empty(created: list[str]) -> None:
  for d in created:  # deepest first
    try:
      os.rmdir(d)
    except OSError:  # something was written there: keep it
      return
