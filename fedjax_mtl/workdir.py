"""A run's workdir: its config check on resume, and one writer at a time.

**Resume check** (`check_config`): a workdir holding a run of another config is
refused, comparing `config.json` field by field without the fields a run may
change when resumed (`RESUMABLE_FIELDS`).

**One writer**: an exclusive OS lock held for the run's whole life.

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

from fedjax_mtl import report
from fedjax_mtl.errors import ConfigError

LOCK_FILE = '.lock'


# Config fields that do not change what a run computes: they may change
# between a run and its resumption (dotted names are nested fields).
RESUMABLE_FIELDS = ('eval_every', 'checkpoint_every', 'progress', 'tensorboard', 'eval_edge_ods',
                    'eval_ods_workers', 'delta_m_reference', 'data.workers', 'data.threads',
                    'data.feed_memory_gib', 'data.data_dir', 'data.cache_dir', 'distributed',
                    'spare_blocks')


def run_fields(config, keep: tuple[str, ...] = ()) -> dict:
  """The config (or its JSON dict) without the fields a run may change when resumed,
  and without the plug-in block fields at their declared defaults: a block field left
  out means its default (a config carries only the blocks of what it uses; versions
  before that wrote every wrapper's block and the many-task block into every config)."""
  d = json.loads(config if isinstance(config, str) else config.to_json_best_effort())
  for f in RESUMABLE_FIELDS:
    if f in keep:
      continue
    *parents, last = f.split('.')
    node = d
    for p in parents:
      node = node.get(p, {})
    node.pop(last, None)
  from fedjax_mtl import validate
  for name, block in validate.blocks().items():
    values = d.get(name)
    if not isinstance(values, dict):
      continue
    for k, field in block.fields.items():
      if k in values and values[k] == json.loads(json.dumps(field.default)):
        del values[k]
    if not values:
      del d[name]
  return d


def flat_fields(d: dict, prefix: str = '') -> dict:
  """Nested dicts (a config's JSON) as {'a.b': leaf}."""
  out = {}
  for k, v in d.items():
    if isinstance(v, dict) and v:
      out.update(flat_fields(v, f'{prefix}{k}.'))
    else:
      out[f'{prefix}{k}'] = v
  return out


# Wrapper blocks that older versions wrote into every config ('masked' is now 'dea').
RETIRED_BLOCKS = ('masked',)


def config_diffs(config, workdir: str) -> list[str]:
  """Top-level config fields in which `workdir`'s run (its config.json) differs from
  `config`, ignoring the fields a resumed run may change ([] when none or no run)."""
  from fedjax_mtl import validate
  from fedjax_mtl.defaults import base_config
  path = os.path.join(workdir, 'config.json')
  if not os.path.exists(path):
    return []
  with open(path) as f:
    old = flat_fields(run_fields(f.read()))
  new = flat_fields(run_fields(config))
  # A field this version added (absent from the old run's config) matches when the
  # run uses its default (an algorithm block's too): the old run behaved as the
  # default does.
  default = flat_fields(run_fields(base_config()))
  default.update(flat_fields({name: block.to_dict()
                        for name, block in validate.block_defaults().items()}))
  for k in set(new) - set(old):
    if k in default and new[k] == default[k]:
      old[k] = new[k]
  # A retired wrapper block matters only to a run whose algorithm named it.
  for k in set(old) - set(new):
    block = k.split('.')[0]
    if block in RETIRED_BLOCKS and f'{block}(' not in str(old.get('algorithm', '')):
      del old[k]
  return sorted({k.split('.')[0] for k in set(old) | set(new) if old.get(k) != new.get(k)})


def check_config(config, workdir: str) -> None:
  """Refuse a workdir holding a run with another config (before writing anything)."""
  diffs = config_diffs(config, workdir)
  if diffs:
    raise ConfigError(
        f'workdir {workdir!r} holds a run with a different config (fields: '
        f'{", ".join(diffs)}); use a new --workdir or the same config to resume')


def saved_config(workdir: str):
  """The config of the run in `workdir`, rebuilt from its config.json (the engine's
  fields and the plug-in blocks it names, at the saved values); ConfigError (one line)
  when there is no run there or the file does not rebuild to the same fields."""
  from fedjax_mtl import validate
  from fedjax_mtl.defaults import base_config
  path = os.path.join(workdir, 'config.json')
  if not os.path.isfile(path):
    raise ConfigError(f'{workdir!r} holds no run (no config.json); give the workdir of a '
                      'training run')
  try:
    with open(path) as f:
      saved = json.load(f)
    config = base_config(None, algorithm=str(saved.get('algorithm', 'fedavg')))
  except (ValueError, ConfigError) as e:
    raise ConfigError(f'cannot rebuild the config of {path}: {" ".join(str(e).split())}') from None
  blocks = validate.blocks()
  for name in saved:
    if name not in config and name in blocks:
      config[name] = blocks[name].config()
  try:
    _assign(config, saved, '')
  except (KeyError, TypeError, ValueError) as e:
    raise ConfigError(f'cannot rebuild the config of {path} with this version: '
                      f'{" ".join(str(e).split())}') from None
  if config_diffs(config, workdir):
    raise ConfigError(f'cannot rebuild the config of {path} with this version (fields: '
                      f'{", ".join(config_diffs(config, workdir))})')
  try:
    validate.check_config(config)
  except ConfigError as e:
    raise ConfigError(f'cannot rebuild the config of {path} with this version: {e}') from None
  return config


# Values older versions wrote for a field whose type changed since: {field: {old: new}}.
LEGACY_VALUES = {'eval_edge_ods': {True: 'every', False: 'off'}}


def _assign(node, values: dict, prefix: str) -> None:
  """Set a ConfigDict's fields from their JSON values (tuples back from lists)."""
  for k, v in values.items():
    old = node[k] if k in node else None
    legacy = LEGACY_VALUES.get(prefix + k, {})
    if isinstance(v, bool) and v in legacy and not isinstance(old, bool):
      v = legacy[v]
    if k not in node and not hasattr(node, 'keys'):
      raise KeyError(f'unknown field {prefix}{k}')
    if hasattr(old, 'keys') and isinstance(v, dict):
      if not v:
        node[k] = v
      else:
        _assign(old, v, f'{prefix}{k}.')
      continue
    if isinstance(v, list) and (isinstance(old, tuple) or old is None or hasattr(old, 'keys')):
      v = tuple(tuple(x) if isinstance(x, list) else x for x in v)
    if isinstance(old, float) and isinstance(v, int) and not isinstance(v, bool):
      v = float(v)
    node[k] = v


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


class Workdir:
  """A run's files, written by process 0 only (`primary`):

  - `config.json`: the config (the resume check reads it);
  - `metrics.jsonl`: one row per (round, client, task, ...) record; a resumed run first
    drops the rows after its checkpoint, a fresh start the rows of an attempt that
    never reached one, so the file stays identical across resumes;
  - `timing.jsonl`: wall and compile seconds (apart: they differ between runs);
  - `checkpoints/`: the rounds' states (`checkpoint.Checkpointer`);
  - `tensorboard/`: event files of the same rows (`config.tensorboard`).

  Nothing is written before `begin`: a run that fails while it builds or compiles
  leaves the workdir as it was.
  """

  def __init__(self, path: str, primary: bool = True):
    self.path, self.primary = path, primary
    self.metrics_path = os.path.join(path, 'metrics.jsonl')
    self.timing_path = os.path.join(path, 'timing.jsonl')
    self.checkpoint_dir = os.path.join(path, 'checkpoints')
    self.sink = None

  def begin(self, config, start: int, compile_s: dict, meta_rows: list[dict]) -> None:
    """The run's first writes: metrics and timing cut back to round `start` (or
    emptied, with `meta_rows`, at a fresh start), the compile times, config.json,
    and the TensorBoard writer (hiding a resumed run's old steps)."""
    os.makedirs(self.path, exist_ok=True)
    if not self.primary:
      return
    if start:
      report.truncate_jsonl(self.metrics_path, start)
      if os.path.exists(self.timing_path):
        report.truncate_jsonl(self.timing_path, start)
    else:
      report.atomic_write(self.metrics_path, '')
      report.atomic_write(self.timing_path, '')
      report.append_jsonl(self.metrics_path, meta_rows)
    report.append_jsonl(self.timing_path, [{'round': start, 'compile_s': compile_s}])
    report.atomic_write(os.path.join(self.path, 'config.json'),
                        config.to_json_best_effort(indent=2))
    if config.get('tensorboard', False):
      from fedjax_mtl import sinks  # optional extra
      self.sink = sinks.TensorBoardSink(os.path.join(self.path, 'tensorboard'),
                                        purge_step=start + 1 if start else None)
      self.sink.write([r for r in report.read_jsonl(self.metrics_path)
                       if r.get('type') == 'meta'])

  def log(self, rows: list[dict]) -> None:
    """Append rows to metrics.jsonl (and TensorBoard)."""
    if self.primary:
      report.append_jsonl(self.metrics_path, rows)
    if self.sink is not None:
      self.sink.write(rows)

  def log_time(self, rnd: int, seconds: float, evaluated: bool, eval_s: float = 0.,
               checkpoint_s: float = 0., background_compile_s: dict | None = None) -> None:
    """Round `rnd`'s wall seconds to timing.jsonl, with the evaluation's seconds and
    the seconds the loop waited on the checkpoint save (both within `seconds`), and the
    compile seconds of programs compiled in the background while the rounds ran
    (the evaluation's, logged at its first round)."""
    if self.primary:
      row = {'round': rnd, 'seconds': seconds, 'eval': evaluated, 'eval_s': eval_s,
             'checkpoint_s': checkpoint_s}
      if background_compile_s:
        row['background_compile_s'] = background_compile_s
      report.append_jsonl(self.timing_path, [row])

  def rows(self) -> list[dict]:
    """Every row of metrics.jsonl."""
    return report.read_jsonl(self.metrics_path)

  def close(self) -> None:
    """Flush and close the TensorBoard writer."""
    if self.sink is not None:
      self.sink.close()
      self.sink = None
