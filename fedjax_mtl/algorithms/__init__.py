"""Algorithms by name, and wrappers that compose them.

`config.algorithm` names an algorithm (`fedavg`) or a composition of wrappers
around one (`momentum(fedavg)`, `masked(grouped(fedprox))`); each piece reads
its hyper-parameters from the config block of its name (`config.fedprox.mu`,
`config.masked.rho`, ...), falling back to its `default_config()`.

Adding an algorithm = one module with `build(info, config) -> Algorithm` (and
optionally `default_config()`), one line in `ALGORITHMS`, and a
`configs/<name>.py`.
"""

from __future__ import annotations

import re
from typing import Callable

import ml_collections

from fedjax_mtl.algorithms import (ditto, fedamp, fedavg, fedbabu, fedper, fedprox, fedsta,
                                   hca2, local, matfl, rules)
from fedjax_mtl.algorithms.base import (Algorithm, Client, ClientCtx, FedInfo, Server,
                                        ServerInputs, ServerState, config_block)
from fedjax_mtl.errors import ConfigError, check_choice

ALGORITHMS: dict[str, Callable[..., Algorithm]] = {
    'local': local.build,
    'fedavg': fedavg.build,
    'fedprox': fedprox.build,
    'fedper': fedper.build,
    'ditto': ditto.build,
    'fedamp': fedamp.build,
    'fedbabu': fedbabu.build,
    'fedsta': fedsta.build,
    'matfl': matfl.build,
    'hca2': hca2.build,
}


def momentum_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({'momentum': 0.9, 'lr': 1.0})


def masked_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({'rho': 0.3, 'rescale': True})


def grouped_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({'by': 'dataset'})


def _momentum(alg: Algorithm, info: FedInfo, config) -> Server:
  cfg = config_block(config, 'momentum', momentum_config())
  if not 0 <= cfg.momentum < 1 or cfg.lr <= 0:
    raise ConfigError(f'momentum.momentum={cfg.momentum}, momentum.lr={cfg.lr} are out of '
                      'range; valid ranges: 0 <= momentum < 1, lr > 0')
  return rules.with_server_momentum(alg.server, cfg.momentum, cfg.lr)


def _masked(alg: Algorithm, info: FedInfo, config) -> Server:
  cfg = config_block(config, 'masked', masked_config())
  if not 0 < cfg.rho <= 1:
    raise ConfigError(f'masked.rho={cfg.rho} is out of range; valid range: 0 < rho <= 1')
  return rules.masked(alg.server, info, cfg.rho, cfg.rescale)


def _grouped(alg: Algorithm, info: FedInfo, config) -> Server:
  cfg = config_block(config, 'grouped', grouped_config())
  check_choice('grouped.by', cfg.by, ('dataset', 'task'))
  keys = {'encoder': [info.client_keys[c][cfg.by == 'task'] for c in range(info.num_clients)],
          'decoder': [info.decoder_keys[k][cfg.by == 'task'] for k in range(info.num_decoders)]}
  ids = {r: [sorted(set(v)).index(x) for x in v] for r, v in keys.items()}
  return rules.grouped(alg.server, ids)


# Wrappers: (algorithm, info, config) -> the wrapped server. The client part is kept.
WRAPPERS: dict[str, Callable[[Algorithm, FedInfo, object], Server]] = {
    'momentum': _momentum,
    'masked': _masked,
    'grouped': _grouped,
}

_SPEC = re.compile(r'^\s*([A-Za-z0-9_]+)\s*(?:\((.*)\))?\s*$')


def parse(spec: str) -> list[str]:
  """'masked(momentum(fedavg))' -> ['masked', 'momentum', 'fedavg'] (outermost first)."""
  names = []
  rest = spec
  while True:
    m = _SPEC.match(rest)
    if not m:
      raise ConfigError(f'cannot read algorithm {spec!r}; write a name or wrapper(name), '
                        'e.g. momentum(fedavg)')
    names.append(m.group(1))
    if m.group(2) is None:
      return names
    rest = m.group(2)


def check(spec: str) -> list[str]:
  """Validate the names of a composition (before anything is built)."""
  names = parse(spec)
  *wrappers, base = names
  for w in wrappers:
    if w in ALGORITHMS:
      raise ConfigError(f'algorithm {spec!r}: {w!r} is an algorithm, not a wrapper; valid '
                        'wrappers: ' + ', '.join(repr(k) for k in WRAPPERS))
    check_choice('algorithm wrapper', w, WRAPPERS, f' in {spec!r}')
  if base in WRAPPERS:
    raise ConfigError(f'algorithm {spec!r}: wrapper {base!r} needs an algorithm inside, '
                      f'e.g. {base}(fedavg); valid algorithms: '
                      + ', '.join(repr(k) for k in ALGORITHMS))
  check_choice('algorithm', base, ALGORITHMS)
  return names


def get_algorithm(spec: str, info: FedInfo, config=None) -> Algorithm:
  """The algorithm `spec` (a name or a composition), with clear errors."""
  *wrappers, base = check(spec)
  alg = ALGORITHMS[base](info, config)
  for w in reversed(wrappers):
    if not alg.shared_roles:
      raise ConfigError(f'algorithm {spec!r}: {w}() wraps a server rule, but {alg.name!r} '
                        'shares no parameters; wrap an algorithm that aggregates, e.g. '
                        f'{w}(fedavg)')
    alg = Algorithm(name=f'{w}({alg.name})', client=alg.client,
                    server=WRAPPERS[w](alg, info, config), roles=alg.roles)
  return alg


__all__ = ['ALGORITHMS', 'WRAPPERS', 'Algorithm', 'Client', 'ClientCtx', 'FedInfo', 'Server',
           'ServerInputs', 'ServerState', 'get_algorithm', 'parse', 'rules']
