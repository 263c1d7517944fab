"""Multi-process runs on the JAX distributed runtime (one process per host).

Every host runs the same command with its own process id; `initialize` joins
them into one runtime before JAX creates its backends. From then on
`jax.devices()` lists every process's devices, the engine's mesh spans them
all and the client axis is sharded across processes: each process trains
the clients on its own devices, and only the aggregation's collectives cross
processes. Each process feeds only its own clients' batches (`local_rows`,
`put_local`); orbax saves and restores the sharded state from every process
(one shared workdir); only process 0 writes metrics, tables and plots and
shows progress (`is_primary`).

Where the runtime comes from, first match wins:

- the config's `distributed` block (`coordinator`, `num_processes`, `process_id`);
- the environment: `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`.

Without either, the run is one process and nothing here does anything.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import re
import socket
import sys
import threading
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from fedjax_mtl import fields
from fedjax_mtl.errors import ConfigError

PyTree = Any

ENV_COORDINATOR = 'JAX_COORDINATOR_ADDRESS'
ENV_NUM_PROCESSES = 'JAX_NUM_PROCESSES'
ENV_PROCESS_ID = 'JAX_PROCESS_ID'


@dataclasses.dataclass(frozen=True)
class Settings:
  coordinator: str  # host:port of process 0's coordination service
  num_processes: int
  process_id: int
  timeout_s: float  # how long to wait for the coordinator and every process to join


# The `distributed` block of every config (empty: one process, or the environment).
CONFIG = fields.Block('distributed', {
    'coordinator': fields.Field('', "multi-process runs: host:port of process 0's coordinator "
                                "('' = JAX_COORDINATOR_ADDRESS, or one process)"),
    'num_processes': fields.Field(0, 'multi-process runs: the process count (0 = '
                                  'JAX_NUM_PROCESSES, or one process)', fields.at_least(0)),
    'process_id': fields.Field(-1, 'multi-process runs: this process, 0..num_processes-1 '
                               '(-1 = JAX_PROCESS_ID)', fields.at_least(-1)),
    'timeout_s': fields.Field(300., 'multi-process runs: seconds to wait for the coordinator '
                              'and every process to join', fields.above(0)),
})


def config_block():
  """The `distributed` block at its defaults."""
  return CONFIG.config()


def settings(config, environ=None) -> Settings | None:
  """The run's multi-process settings (config first, then the environment), or None
  for a one-process run. ConfigError (one line) for incomplete or invalid settings."""
  env = os.environ if environ is None else environ
  block = config.get('distributed') or {}
  coordinator = str(block.get('coordinator', '') or env.get(ENV_COORDINATOR, ''))
  n_raw = block.get('num_processes', 0) or env.get(ENV_NUM_PROCESSES, '') or 0
  pid_raw = block.get('process_id', -1)
  if pid_raw is None or int(pid_raw) < 0:
    pid_raw = env.get(ENV_PROCESS_ID, '')
  try:
    n = int(n_raw)
    pid = int(pid_raw) if str(pid_raw) != '' else -1
  except ValueError:
    raise ConfigError(f'{ENV_NUM_PROCESSES}={n_raw!r} and {ENV_PROCESS_ID}={pid_raw!r} must be '
                      'integers') from None
  timeout = float(block.get('timeout_s', 300.))
  if not coordinator and n <= 1:
    return None
  where = ('distributed.coordinator / distributed.num_processes / distributed.process_id '
           f'or {ENV_COORDINATOR} / {ENV_NUM_PROCESSES} / {ENV_PROCESS_ID}')
  if not coordinator:
    raise ConfigError(f'a {n}-process run needs the coordinator address host:port of process 0 '
                      f'(set {where})')
  host, _, port = coordinator.rpartition(':')
  if not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ConfigError(f'coordinator address {coordinator!r} is not host:port '
                      "(e.g. '10.0.0.1:1234')")
  if n < 1:
    raise ConfigError(f'coordinator {coordinator!r} is set but the process count is not '
                      f'(set {where})')
  if not 0 <= pid < n:
    raise ConfigError(f'process id {pid} is not one of 0..{n - 1} for {n} processes '
                      f'(set {where})')
  if timeout <= 0:
    raise ConfigError(f'distributed.timeout_s must be > 0, got {timeout:g}')
  return Settings(coordinator, n, pid, timeout)


def initialize(config) -> Settings | None:
  """Join the run's processes into one JAX runtime (a no-op for one process, or when
  this process already joined). Must run before JAX creates its backends.

  A coordinator that cannot be reached, or processes that do not all join within
  `distributed.timeout_s`, end the process with one `error:` line (exit 2); JAX's
  own runtime would abort or wait.
  """
  s = settings(config)
  if s is None or _initialized():
    return s
  from jax._src import xla_bridge
  if xla_bridge.backends_are_initialized():
    raise ConfigError(f'the {s.num_processes}-process settings (distributed.*, JAX_* variables) '
                      'came after JAX started its devices in this process; call '
                      'fedjax_mtl.distributed.initialize(config) before any JAX computation')
  _TIMEOUT_S[0] = s.timeout_s
  host, _, port = s.coordinator.rpartition(':')
  deadline = time.monotonic() + s.timeout_s
  if s.process_id == 0:
    _check_can_listen(int(port), s.coordinator)
  else:
    _wait_for_coordinator(host, int(port), s.coordinator, s.timeout_s)
  watchdog = threading.Timer(max(deadline - time.monotonic(), 1.), _give_up, args=(s,))
  watchdog.daemon = True
  watchdog.start()
  try:
    # JAX's own timeout is the fallback; the watchdog ends a wait first, with one line.
    jax.distributed.initialize(s.coordinator, s.num_processes, s.process_id,
                               initialization_timeout=int(s.timeout_s) + 60)
  finally:
    watchdog.cancel()
  return s


def _initialized() -> bool:
  from jax._src import distributed as _d  # the runtime's state (no public accessor)
  return _d.global_state.client is not None


def _check_can_listen(port: int, coordinator: str) -> None:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      sock.bind(('', port))
    except OSError as e:
      raise ConfigError(f'process 0 cannot serve the coordinator {coordinator}: port {port} '
                        f'({e.strerror or e}); choose a free port') from None


def _wait_for_coordinator(host: str, port: int, coordinator: str, timeout_s: float) -> None:
  """Until process 0's coordinator accepts connections; ConfigError after `timeout_s`."""
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      with socket.create_connection((host, port), timeout=min(2., timeout_s)):
        return
    except OSError as e:
      why = e.strerror or type(e).__name__
    if time.monotonic() >= deadline:
      raise ConfigError(f'coordinator {coordinator} cannot be reached after {timeout_s:g} s '
                        f'({why}); start process 0 there, or fix distributed.coordinator / '
                        f'{ENV_COORDINATOR}')
    time.sleep(0.25)


def _give_up(s: Settings) -> None:
  print(f'error: the {s.num_processes} processes did not all join coordinator {s.coordinator} '
        f'within {s.timeout_s:g} s (this is process {s.process_id}); start every process with '
        'the same coordinator and process count', file=sys.stderr, flush=True)
  os._exit(2)


def is_primary() -> bool:
  """Whether this process writes the run's files and shows progress (process 0)."""
  return jax.process_index() == 0


_BARRIERS = itertools.count()
_TIMEOUT_S = [300.]


def barrier(name: str) -> None:
  """Every process waits here until all arrive (a no-op for one process): a barrier of
  the coordination service, with `distributed.timeout_s`. Before a process runs a
  program with collectives that it compiled itself, so that no process waits for a
  slower one's compilation inside a collective (XLA:CPU's gloo collectives give up
  after 30 s)."""
  if jax.process_count() == 1:
    return
  from jax._src import distributed as _d
  _d.global_state.client.wait_at_barrier(f'fedjax_mtl/{next(_BARRIERS)}/{name}',
                                         int(_TIMEOUT_S[0] * 1000))


def from_primary(name: str, value: str | None) -> str | None:
  """Process 0's `value` (a short string or None) on every process: the outcome of a
  step that only process 0 performs (e.g. taking the workdir's lock). Collective;
  returns `value` itself in a one-process run."""
  if jax.process_count() == 1:
    return value
  from jax._src import distributed as _d
  key = f'fedjax_mtl/{next(_BARRIERS)}/{name}'
  client = _d.global_state.client
  if jax.process_index() == 0:
    client.key_value_set(key, 'v' + value if value is not None else '-')
    return value
  got = client.blocking_key_value_get(key, int(_TIMEOUT_S[0] * 1000))
  return got[1:] if got.startswith('v') else None


def host_get(tree: PyTree) -> PyTree:
  """Host copies of a tree's arrays, also of arrays spread over several processes
  (`jax.device_get` reads only this process's shards): one jitted all-gather of every
  spread array. Collective: every process must call it with the same tree."""
  leaves, treedef = jax.tree.flatten(tree)
  spread = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)
            and not x.is_fully_addressable and not x.is_fully_replicated]
  if spread:
    xs = [leaves[i] for i in spread]
    gathered = jax.jit(_identity, out_shardings=[_replicated(x.sharding) for x in xs])(xs)
    for i, x in zip(spread, gathered):
      leaves[i] = x
  leaves = [np.asarray(x.addressable_data(0)) if isinstance(x, jax.Array)
            and not x.is_fully_addressable else x for x in leaves]
  return jax.device_get(jax.tree.unflatten(treedef, leaves))


def _identity(x):
  return x


def _replicated(sharding):
  from jax.sharding import NamedSharding, PartitionSpec
  if isinstance(sharding, NamedSharding):
    return NamedSharding(sharding.mesh, PartitionSpec())
  raise TypeError(f'cannot gather an array sharded by {sharding!r}')


def put_replicated(tree: PyTree, sharding) -> PyTree:
  """Host arrays (the same on every process) as global arrays replicated by `sharding`;
  unlike `jax.device_put` onto other processes' devices, without an all-gather that
  checks the processes' values agree."""
  if sharding.is_fully_addressable:
    return jax.device_put(tree, sharding)

  def put(x):
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])
  return jax.tree.map(put, tree)


def local_rows(sharding, n: int) -> slice:
  """The rows of a leading axis of length `n`, sharded by `sharding`, that this
  process's devices hold (contiguous: the mesh lists each process's devices together)."""
  if sharding.is_fully_addressable:
    return slice(0, n)
  rows = sorted({i for idx in sharding.addressable_devices_indices_map((n,)).values()
                 for i in range(*idx[0].indices(n))})
  if not rows:
    return slice(0, 0)
  if rows != list(range(rows[0], rows[-1] + 1)):
    raise ValueError(f'process {jax.process_index()} holds rows {rows} of the client axis, '
                     'not one contiguous block')
  return slice(rows[0], rows[-1] + 1)


def put_local(tree: PyTree, sharding, n: int) -> PyTree:
  """Global arrays of leading axis `n` sharded by `sharding`, from this process's rows
  (`local_rows`) only."""
  if sharding.is_fully_addressable:
    return jax.device_put(tree, sharding)
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(
      sharding, np.asarray(x), (n,) + tuple(np.shape(x)[1:])), tree)


_COLLECTIVE = re.compile(r'=\s*(.+?)\s+(all-gather|all-reduce|reduce-scatter|collective-permute|'
                         r'all-to-all)(?:-start)?\(')
_SHAPE = re.compile(r'\b(pred|[sufb]f?\d+)\[([\d,]*)\]')
_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 's16': 2, 'u16': 2, 'f16': 2, 'bf16': 2, 's32': 4,
          'u32': 4, 'f32': 4, 's64': 8, 'u64': 8, 'f64': 8}


def collective_bytes(hlo_text: str) -> list[tuple[str, int]]:
  """(op, result bytes) of every cross-device collective in a compiled program's HLO
  text (`jitted.lower(...).compile().as_text()`); an async pair counts once."""
  out = []
  for line in hlo_text.splitlines():
    m = _COLLECTIVE.search(line)
    if not m:
      continue
    size = 0
    for dtype, dims in _SHAPE.findall(m.group(1)):
      n = int(np.prod([int(d) for d in dims.split(',') if d])) if dims else 1
      size += n * _BYTES.get(dtype, 4)
    out.append((m.group(2), size))
  return out


def client_mesh(config, replica_shards: int = 1) -> Mesh:
  """The run's devices (`num_devices`, 0: every visible one, of every process) along
  one axis, `clients`, that client rows (the many-task setting: the round's slots)
  are sharded over; ConfigError (one line) for more devices than are visible and, in
  a multi-process run, for a split the processes cannot share (`check_processes`).
  `replica_shards` > 1 (a sweep, `engines.replicas`): a 2-D mesh, `replicas` x
  `clients`, the devices split into that many groups along `replicas`."""
  devices = jax.devices()
  n = int(config.get('num_devices', 0)) or len(devices)
  if n > len(devices):
    raise ConfigError(f'num_devices={n} but only {len(devices)} devices are visible')
  check_processes(n, devices)
  if replica_shards > 1:
    return Mesh(np.asarray(devices[:n]).reshape(replica_shards, n // replica_shards),
                ('replicas', 'clients'))
  return Mesh(np.asarray(devices[:n]), ('clients',))


def check_processes(n_dev: int, devices) -> None:
  """ConfigError unless the client axis splits evenly over the run's processes: every
  process has the same number of devices and the mesh uses all of them (each group's
  clients are padded to a multiple of the mesh size, so each process trains the same
  number of client slots)."""
  n_proc = jax.process_count()
  if n_proc == 1:
    return
  per = collections.Counter(d.process_index for d in devices)
  if len(set(per.values())) > 1:
    raise ConfigError(f'the {n_proc} processes have unequal device counts '
                      f'({", ".join(f"process {p}: {k}" for p, k in sorted(per.items()))}); '
                      'the clients cannot be split evenly over them')
  if n_dev != len(devices):
    raise ConfigError(f'num_devices={n_dev} does not split the clients over the {n_proc} '
                      f"processes' {len(devices)} devices; valid choices: 0 or {len(devices)}")
