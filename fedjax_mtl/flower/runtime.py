"""What a Flower party (server or client) builds from the run's config, in either
setting, and what the adapter refuses, each with one line saying why."""

from __future__ import annotations

import copy

from fedjax_mtl import experiment, participation
from fedjax_mtl.errors import ConfigError


def party_config(config):
  """`config` for one Flower party: one device (a client trains its own rows; the
  server's rule runs on one device), no progress bar."""
  c = copy.deepcopy(config)
  with c.unlocked():
    c.num_devices = 1
    c.progress = False
  return c


def is_many_task(config) -> bool:
  """Whether `config` runs the many-task setting (`flower/many_task.py`)."""
  return config.get('setting', 'dense') == 'many_task'


def check(config) -> None:
  """ConfigError (one line) for what the adapter cannot run, before Ray starts: the
  dense experiment is built (cached), the many-task run only checked (no data read)."""
  if is_many_task(config):
    check_many_task(config)
  else:
    build(config)


def num_clients(config) -> int:
  """Flower nodes of the run: one per client (`many.num_clients` in the many-task
  setting)."""
  if is_many_task(config):
    return int(config.many.num_clients)
  return build(config).fed.num_clients


def build(config) -> experiment.Experiment:
  """The dense party's experiment (validated, cached per config), or ConfigError when
  the adapter cannot run it (`check_supported`)."""
  from fedjax_mtl import validate
  if is_many_task(config):
    raise ConfigError("runtime.build builds the dense setting's experiment; the many-task "
                      'setting builds its run with runtime.build_many_task')
  validate.check_config(config)
  exp = experiment.build(party_config(config))
  check_supported(exp)
  return exp


def check_many_task(config) -> None:
  """ConfigError naming what the adapter cannot run in the many-task setting:
  NTKFedAvg's in-run α tuning and frozen zero-shot heads; then the run's own checks
  (`manytask.run.check`)."""
  from fedjax_mtl import algorithms, validate
  from fedjax_mtl.algorithms.base import config_block
  from fedjax_mtl.manytask import run as run_lib
  validate.check_config(config)
  if config.many.heads:
    raise ConfigError(f'many.heads={config.many.heads!r}: the Flower adapter trains linear '
                      "heads; frozen zero-shot heads are not supported (set many.heads='')")
  if algorithms.parse(config.algorithm)[-1] == 'ntkfedavg':
    from fedjax_mtl.algorithms import ntkfedavg
    if config_block(config, 'ntkfedavg', ntkfedavg.default_config()).tune_alpha:
      raise ConfigError('ntkfedavg.tune_alpha is not supported by the Flower adapter: the '
                        "server would tune α on a split held out of the clients' training "
                        'data; set ntkfedavg.tune_alpha=False')
  run_lib.check(config)


def build_many_task(config):
  """The many-task party's `manytask.run.Run` (checked by `check_many_task`)."""
  from fedjax_mtl.manytask import run as run_lib
  check_many_task(config)
  return run_lib.build_run(party_config(config))


def check_supported(exp: experiment.Experiment) -> None:
  """ConfigError naming what the adapter cannot run in the dense setting (partial
  participation and stragglers run as in the engine, `participation.check_supported`):
  device augmentation of real data, a client part
  that starts from a server-defined
  lookahead (`Client.begin`), and server-side averaging of batch-norm running
  statistics (`Algorithm.average_stats`).

  Per-row server state (`ServerState.rows`, e.g. FedDyn's, SCAFFOLD-like terms) is
  supported: the server keeps it and sends each client its rows with its params."""
  alg, cfg = exp.algorithm, exp.config
  participation.check_supported(cfg, exp.fed.num_clients)  # the engine's rules apply
  if exp.streamed and cfg.data.get('augment', 'host') != 'host':
    raise ConfigError("the Flower adapter takes data.augment='host': device augmentation "
                      "sizes its canvases by every client's images, which a client does "
                      "not hold")
  if alg.client.begin is not None:
    raise ConfigError(f'algorithm {cfg.algorithm!r} is not supported by the Flower adapter: '
                      'its clients start each round from a lookahead point (Client.begin) that '
                      'the server would have to send as well')
  if alg.average_stats:
    raise ConfigError(f'algorithm {cfg.algorithm!r} is not supported by the Flower adapter: '
                      'its server averages batch-norm running statistics, which clients do '
                      'not upload')
