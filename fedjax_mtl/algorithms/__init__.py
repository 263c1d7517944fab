"""Algorithms by name, and wrappers that compose them.

`config.algorithm` names an algorithm (`fedavg`) or a composition of wrappers
around one (`momentum(fedavg)`, `dea(grouped(fedprox))`); each piece reads
its hyper-parameters from the config block of its name (`config.fedprox.mu`,
`config.dea.rho`, ...), falling back to its `default_config()`.

`config.unified` picks FedDEA's unified-model setting for task-level clients
(spec feddea §1.6, §6 A1): 'literal' (one global θ = encoder + every task's
decoder and head; rules see each client's row of the whole θ, `rules.unified`),
'owner' (decoders and heads updated by their owner only: personal), or 'none'
(the hetero-client engine: heads personal, decoders per the algorithm).

Adding an algorithm = one module with `build(info, config) -> Algorithm` (and
optionally `default_config()`), one line in `ALGORITHMS`, and a
`configs/<name>.py`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

import ml_collections

from fedjax_mtl.algorithms import (ditto, enhance, fedacg, fedamp, fedavg, fedbabu, fedbn,
                                   feddyn, fedga, fednova, fedper, fedprox, fedsta, hca2, local,
                                   matfl, matu, moon, ntkfedavg, plugin_math, rules)
from fedjax_mtl.algorithms.base import (UNIFIED_MODES, Algorithm, Client, ClientCtx, FedInfo,
                                        Server, ServerInputs, ServerState, config_block,
                                        unified_mode)
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
    'matu': matu.build,  # the many-task setting only
    'ntkfedavg': ntkfedavg.build,  # the many-task setting for now
    'hca2': hca2.build,
    # FedDEA's plug-in bases (spec feddea §2.4).
    'fednova': fednova.build,
    'feddyn': feddyn.build,
    'fedbn': fedbn.build,
    'moon': moon.build,
    'fedacg': fedacg.build,
    'fedga': fedga.build,
}


def momentum_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({'momentum': 0.9, 'lr': 1.0})


# Bases that train one model for everyone with a server that treats every row
# alike: the ones `config.unified` can run (FedDEA's plug-in bases).
UNIFIED_BASES = ('fedavg', 'fedprox', 'fednova', 'feddyn', 'fedbn', 'moon', 'fedacg', 'fedga')


def dea_config() -> ml_collections.ConfigDict:
  """FedDEA: ρ (spec §6 A2: 1/K provisionally), the mask variant (ablations a/c),
  the 1/ρ rescale (ablation b) and the server step η_g (A5's control)."""
  return ml_collections.ConfigDict({'rho': 0.25, 'variant': 'top', 'rescale': True,
                                    'server_lr': 1.0})


def heal_config() -> ml_collections.ConfigDict:
  """FedHEAL's consistency threshold τ and weight momentum β (its repository's defaults)."""
  return ml_collections.ConfigDict({'tau': plugin_math.HEAL_TAU, 'beta': plugin_math.HEAL_BETA})


def grouped_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({'by': 'dataset'})


def _momentum(alg: Algorithm, info: FedInfo, config) -> Server:
  cfg = config_block(config, 'momentum', momentum_config())
  if not 0 <= cfg.momentum < 1 or cfg.lr <= 0:
    raise ConfigError(f'momentum.momentum={cfg.momentum}, momentum.lr={cfg.lr} are out of '
                      'range; valid ranges: 0 <= momentum < 1, lr > 0')
  return rules.with_server_momentum(alg.server, cfg.momentum, cfg.lr)


def _dea(alg: Algorithm, info: FedInfo, config) -> Server:
  cfg = config_block(config, 'dea', dea_config())
  if not 0 < cfg.rho <= 1:
    raise ConfigError(f'dea.rho={cfg.rho} is out of range; valid range: 0 < rho <= 1')
  check_choice('dea.variant', cfg.variant, rules.topk.VARIANTS)
  if not cfg.server_lr > 0:
    raise ConfigError(f'dea.server_lr={cfg.server_lr} is out of range; valid range: '
                      'server_lr > 0')
  seed = int(config.get('seed', 0)) if config is not None else 0
  return rules.dea(alg.server, info, cfg.rho, cfg.variant, cfg.rescale, cfg.server_lr, seed)


def _pcgrad(alg: Algorithm, info: FedInfo, config) -> Server:
  enhance.check_one_row_per_client('pcgrad', alg.shared_roles, info)
  return enhance.pcgrad(alg.server, info, int(config.get('seed', 0)) if config else 0)


def _heal(alg: Algorithm, info: FedInfo, config) -> Server:
  cfg = config_block(config, 'heal', heal_config())
  if not (0 <= cfg.tau < 1 and 0 <= cfg.beta <= 1):
    raise ConfigError(f'heal.tau={cfg.tau}, heal.beta={cfg.beta} are out of range; valid '
                      'ranges: 0 <= tau < 1, 0 <= beta <= 1')
  enhance.check_one_row_per_client('heal', alg.shared_roles, info)
  return enhance.heal(alg.server, info, fedavg.weighting(config), cfg.tau, cfg.beta)


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
    'dea': _dea,
    'pcgrad': _pcgrad,
    'heal': _heal,
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


def check_unified(spec: str, base: str, info: FedInfo, mode: str) -> None:
  """The unified-model setting needs task-level clients of one dataset and a base
  that trains one model for everyone."""
  check_choice('unified', mode, UNIFIED_MODES)
  if mode == 'none':
    return
  if base not in UNIFIED_BASES:
    raise ConfigError(f'unified={mode!r} trains one global model; algorithm {spec!r} has base '
                      f'{base!r}; valid bases: ' + ', '.join(map(repr, UNIFIED_BASES)))
  multi = [n for n, (_, t) in zip(info.client_names, info.client_keys) if '+' in t]
  datasets = sorted({d for d, _ in info.client_keys})
  if multi or len(datasets) > 1:
    what = (f'client {multi[0]!r} holds several tasks' if multi
            else f'the clients span datasets {", ".join(datasets)}')
    raise ConfigError(f'unified={mode!r} needs task-level clients of one dataset (one task '
                      f'each, e.g. scenario nyud_st or pascal_st), but {what}')


def get_algorithm(spec: str, info: FedInfo, config=None) -> Algorithm:
  """The algorithm `spec` (a name or a composition), with clear errors.

  Under `config.unified='literal'` the base and its wrappers are built on
  `rules.unified_info(info)` (one row of the whole model per client) and the
  composed server goes inside `rules.unified`.
  """
  *wrappers, base = check(spec)
  mode = unified_mode(config)
  check_unified(spec, base, info, mode)
  inner = rules.unified_info(info) if mode == 'literal' else info
  alg = ALGORITHMS[base](inner, config)
  for w in reversed(wrappers):
    if not alg.shared_roles:
      raise ConfigError(f'algorithm {spec!r}: {w}() wraps a server rule, but {alg.name!r} '
                        'shares no parameters; wrap an algorithm that aggregates, e.g. '
                        f'{w}(fedavg)')
    alg = dataclasses.replace(alg, name=f'{w}({alg.name})',
                              server=WRAPPERS[w](alg, inner, config))
  if mode == 'literal':
    alg = dataclasses.replace(alg, server=rules.unified(alg.server, info))
  if alg.outermost is not None:  # on the engine's rows (after `unified`)
    alg = dataclasses.replace(alg, server=alg.outermost(alg.server), outermost=None)
  return alg


__all__ = ['ALGORITHMS', 'UNIFIED_BASES', 'WRAPPERS', 'Algorithm', 'Client', 'ClientCtx',
           'FedInfo', 'Server', 'ServerInputs', 'ServerState', 'get_algorithm', 'parse', 'rules']
