"""The experiment a Flower party (server or client) builds from the run's config, and
the algorithms and settings the adapter refuses, each with one line saying why."""

from __future__ import annotations

import copy

from fedjax_mtl import experiment
from fedjax_mtl.errors import ConfigError


def party_config(config):
  """`config` for one Flower party: one device (a client trains its own rows; the
  server's rule runs on one device), no progress bar."""
  c = copy.deepcopy(config)
  with c.unlocked():
    c.num_devices = 1
    c.progress = False
  return c


def build(config) -> experiment.Experiment:
  """The party's experiment (validated, cached per config), or ConfigError when the
  adapter cannot run it (`check_supported`)."""
  from fedjax_mtl import validate
  if config.get('setting', 'dense') != 'dense':
    raise ConfigError("the Flower adapter runs setting='dense' (client groups of the dense "
                      "engine); run the many-task setting with python -m fedjax_mtl.main")
  validate.check_config(config)
  exp = experiment.build(party_config(config))
  check_supported(exp)
  return exp


def check_supported(exp: experiment.Experiment) -> None:
  """ConfigError naming what the adapter cannot run: device augmentation of real data,
  a client part that starts from a server-defined lookahead (`Client.begin`), and
  server-side averaging of batch-norm running statistics (`Algorithm.average_stats`).

  Per-row server state (`ServerState.rows`, e.g. FedDyn's, SCAFFOLD-like terms) is
  supported: the server keeps it and sends each client its rows with its params."""
  alg, cfg = exp.algorithm, exp.config
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
