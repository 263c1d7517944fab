"""Algorithms by name, and wrappers that compose them.

`config.algorithm` names an algorithm (`fedavg`) or a composition of wrappers
around one (`momentum(fedavg)`, `dea(grouped(fedprox))`); each piece reads
its hyper-parameters from the config block of its name (`config.fedprox.mu`,
`config.dea.rho`, ...), declared next to its code (`CONFIG`, a `fields.Block`:
default, meaning, range), falling back to the declared defaults where the config
has no such block.

`config.unified` picks FedDEA's unified-model setting for task-level clients
(spec feddea §1.6, §6 A1): 'literal' (one global θ = encoder + every task's
decoder and head; rules see each client's row of the whole θ, `rules.unified`),
'owner' (decoders and heads updated by their owner only: personal), or 'none'
(the hetero-client engine: heads personal, decoders per the algorithm).

Adding an algorithm = one module with `build(info, config) -> Algorithm` (and its
`CONFIG` block when it has knobs), and its line in `ALGORITHMS` (README, "Adding an
algorithm").
"""

from __future__ import annotations

import dataclasses
import re
import types
from typing import Callable

import ml_collections

from fedjax_mtl import fields
from fedjax_mtl.algorithms import (compress, ditto, dp, enhance, fedacg, fedamp, fedavg,
                                   fedbabu, fedbn, feddyn, fedga, fednova, fedper, fedprox, fedsta,
                                   hca2, local, matfl, matu, moon, ntkfedavg, plugin_math, rules)
from fedjax_mtl.algorithms.base import (UNIFIED_MODES, Algorithm, Client, ClientCtx, FedInfo,
                                        Server, ServerInputs, ServerState, unified_mode)
from fedjax_mtl.errors import ConfigError, check_choice

# name -> module with `build(info, config) -> Algorithm` and, if it has knobs, `CONFIG`.
ALGORITHMS: dict[str, types.ModuleType] = {
    'local': local,
    'fedavg': fedavg,
    'fedprox': fedprox,
    'fedper': fedper,
    'ditto': ditto,
    'fedamp': fedamp,
    'fedbabu': fedbabu,
    'fedsta': fedsta,
    'matfl': matfl,
    'matu': matu,  # the many-task setting only
    'ntkfedavg': ntkfedavg,  # the many-task setting for now
    'hca2': hca2,
    # FedDEA's plug-in bases (spec feddea §2.4).
    'fednova': fednova,
    'feddyn': feddyn,
    'fedbn': fedbn,
    'moon': moon,
    'fedacg': fedacg,
    'fedga': fedga,
}

# Bases that train one model for everyone with a server that treats every row
# alike: the ones `config.unified` can run (FedDEA's plug-in bases).
UNIFIED_BASES = ('fedavg', 'fedprox', 'fednova', 'feddyn', 'fedbn', 'moon', 'fedacg', 'fedga')


# The wrappers' blocks (each used when `algorithm` names its wrapper).
MOMENTUM = fields.Block('momentum', {
    'momentum': fields.Field(0.9, 'momentum(...): server momentum of the aggregated update',
                             fields.unit()),
    'lr': fields.Field(1.0, 'momentum(...): server learning rate', fields.above(0)),
})

# FedDEA: ρ (spec §6 A2: 1/K provisionally), the mask variant (ablations a/c), the 1/ρ
# rescale (ablation b) and the server step η_g (A5's control).
DEA = fields.Block('dea', {
    'rho': fields.Field(0.25, 'dea(...): FedDEA ratio ρ, the fraction of each client update '
                        'kept (top-ρ by magnitude over the whole update)', fields.fraction()),
    'variant': fields.Field('top', 'dea(...): which entries are kept: top (FedDEA), small '
                            '(ablation a), random (ablation c)', choices=rules.topk.VARIANTS),
    'rescale': fields.Field(True, 'dea(...): scale the kept entries by 1/ρ (False: ablation b)'),
    'server_lr': fields.Field(1.0, 'dea(...): server step η_g on the aggregated update (ρ = 1 '
                              'with η_g > 1: the step-size control)', fields.above(0)),
})

# FedHEAL's consistency threshold τ and weight momentum β (its repository's defaults).
HEAL = fields.Block('heal', {
    'tau': fields.Field(plugin_math.HEAL_TAU, 'heal(...): FedHEAL keeps a coordinate whose '
                        'update sign was this consistent over past rounds (> tau)', fields.unit()),
    'beta': fields.Field(plugin_math.HEAL_BETA, 'heal(...): FedHEAL momentum of the client '
                         'weights', fields.unit(True)),
}, reads=('fedavg',))

GROUPED = fields.Block('grouped', {
    'by': fields.Field('dataset', "grouped(...): aggregate within groups of the same 'dataset' "
                       "or 'task'", choices=('dataset', 'task')),
})


def momentum_config() -> ml_collections.ConfigDict:
  return MOMENTUM.config()


def dea_config() -> ml_collections.ConfigDict:
  return DEA.config()


def heal_config() -> ml_collections.ConfigDict:
  return HEAL.config()


def grouped_config() -> ml_collections.ConfigDict:
  return GROUPED.config()


def _momentum(alg: Algorithm, info: FedInfo, config) -> Server:
  cfg = MOMENTUM.of(config)
  return rules.with_server_momentum(alg.server, cfg.momentum, cfg.lr)


def _dea(alg: Algorithm, info: FedInfo, config) -> Server:
  cfg = DEA.of(config)
  seed = int(config.get('seed', 0)) if config is not None else 0
  return rules.dea(alg.server, info, cfg.rho, cfg.variant, cfg.rescale, cfg.server_lr, seed)


def _pcgrad(alg: Algorithm, info: FedInfo, config) -> Server:
  enhance.check_one_row_per_client('pcgrad', alg.shared_roles, info)
  return enhance.pcgrad(alg.server, info, int(config.get('seed', 0)) if config else 0)


def _heal(alg: Algorithm, info: FedInfo, config) -> Server:
  cfg = HEAL.of(config)
  enhance.check_one_row_per_client('heal', alg.shared_roles, info)
  return enhance.heal(alg.server, info, fedavg.weighting(config), cfg.tau, cfg.beta)


def _grouped(alg: Algorithm, info: FedInfo, config,
             build: Callable[[FedInfo], Server]) -> Server:
  """`build(group_info)`: the wrapped composition built again on one group's
  federation (`_compose` passes it)."""
  cfg = GROUPED.of(config)
  keys = {'encoder': [info.client_keys[c][cfg.by == 'task'] for c in range(info.num_clients)],
          'decoder': [info.decoder_keys[k][cfg.by == 'task'] for k in range(info.num_decoders)]}
  ids = {r: [sorted(set(v)).index(x) for x in v] for r, v in keys.items()}
  return rules.grouped(build, info, ids)


# Wrappers: (algorithm, info, config) -> the wrapped server. The client part is kept.
# `grouped` also takes the builder of what it wraps (`_compose` calls it so).
WRAPPERS: dict[str, Callable[[Algorithm, FedInfo, object], Server]] = {
    'momentum': _momentum,
    'dea': _dea,
    'pcgrad': _pcgrad,
    'heal': _heal,
    'grouped': _grouped,
    'quantize': compress.wrap_quantize,
    'sparsify': compress.wrap_sparsify,
    'dp': dp.wrap_dp,
}
WRAPPER_BLOCKS: dict[str, fields.Block] = {'momentum': MOMENTUM, 'dea': DEA, 'heal': HEAL,
                                           'grouped': GROUPED, 'quantize': compress.QUANTIZE,
                                           'sparsify': compress.SPARSIFY, 'dp': dp.DP}


def blocks() -> dict[str, fields.Block]:
  """Every algorithm's and wrapper's declared block, by name (empty ones included:
  they declare only what they read)."""
  out = {name: m.CONFIG for name, m in ALGORITHMS.items() if hasattr(m, 'CONFIG')}
  out.update(WRAPPER_BLOCKS)
  return out


def used_blocks(spec: str) -> tuple[str, ...]:
  """Names of the blocks the composition `spec` reads (each piece's own, then what it
  reads), outermost first; unknown or unreadable names are left out (`check` reports
  them)."""
  try:
    names = parse(spec)
  except ConfigError:
    return ()
  declared, out = blocks(), []
  for name in names:
    block = declared.get(name)
    for b in ((name,) + block.reads) if block else ():
      if b not in out:
        out.append(b)
  return tuple(out)


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


def _compose(spec: str, names: list[str], info: FedInfo, config) -> Algorithm:
  """The base `names[-1]` built on `info`, then its wrappers, innermost first;
  `grouped` builds what it wraps again on each group's federation."""
  *wrappers, base = names
  alg = ALGORITHMS[base].build(info, config)
  for i in reversed(range(len(wrappers))):
    w = wrappers[i]
    if not alg.shared_roles:
      raise ConfigError(f'algorithm {spec!r}: {w}() wraps a server rule, but {alg.name!r} '
                        'shares no parameters; wrap an algorithm that aggregates, e.g. '
                        f'{w}(fedavg)')
    if w == 'grouped':
      inner = names[i + 1:]
      server = _grouped(alg, info, config,
                        lambda sub, inner=inner: _compose(spec, inner, sub, config).server)
    else:
      server = WRAPPERS[w](alg, info, config)
    alg = dataclasses.replace(alg, name=f'{w}({alg.name})', server=server)
  return alg


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
  alg = _compose(spec, [*wrappers, base], inner, config)
  if mode == 'literal':
    alg = dataclasses.replace(alg, server=rules.unified(alg.server, info))
  if alg.outermost is not None:  # on the engine's rows (after `unified`)
    alg = dataclasses.replace(alg, server=alg.outermost(alg.server), outermost=None)
  return alg


__all__ = ['ALGORITHMS', 'UNIFIED_BASES', 'WRAPPERS', 'WRAPPER_BLOCKS', 'Algorithm', 'Client',
           'ClientCtx', 'FedInfo', 'Server', 'ServerInputs', 'ServerState', 'blocks',
           'get_algorithm', 'parse', 'rules', 'used_blocks']
