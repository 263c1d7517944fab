"""Sweeps: R replicas of the whole federation in one compiled program.

`config.sweep` names the replicas: axes separated by ';', each `name=v1,v2,...`,
the replicas being their product (the first axis varies slowest):

    --config.sweep='seed=0,1,2'                          3 replicas
    --config.sweep='optim.lr=1e-3,3e-3;seed=0,1,2'       6 replicas

Fields joined by '+' take the same values together (a zip, one axis):

    --config.sweep='seed+split_seed=0,1,2'               3 replicas

(the many-task setting's seeds as `scripts/compare.py` runs them, each with its own
client split).

A replica is a complete federation with its own values: `seed` (its
initialisation, training randomness and data order), `split_seed` (the many-task
setting's client split, `engines/many_replicas.py`; a dense run's split is
structural) and any *traced* field (a
field declared with `traced=True`: a value the round programs read while they are
traced, so one program serves every value). Everything else (model, scenario,
algorithm, data) is structural: one program cannot hold two of them, and a sweep
over it is refused with one line naming it.

A traced field is read through `fields.traced_value(name, default)` inside the
programs: in a replica program it is that replica's value (a traced scalar, the
program's input), anywhere else the config's value (`default`). The replica
programs enter `fields.tracing` with their values (`engines.replicas`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Any

from fedjax_mtl import fields
from fedjax_mtl.errors import ConfigError

SEEDS = ('seed', 'split_seed')  # the untraced fields a sweep may vary (`check` says where)


def traced_fields(table: dict[str, fields.Field]) -> dict[str, fields.Field]:
  """{dotted name: Field} of the fields of `table` a sweep may vary besides `seed`."""
  return {n: f for n, f in table.items() if f.traced}


@dataclasses.dataclass(frozen=True)
class Sweep:
  """The replicas of a run: `axes` = ((name, values), ...) in the config's order, a
  name 'a+b' zipping fields; `points` = one {field: value} per replica (the axes'
  product, first axis slowest)."""
  axes: tuple[tuple[str, tuple], ...]

  @property
  def names(self) -> tuple[str, ...]:
    """Every swept field (a zipped axis' each)."""
    return tuple(f for n, _ in self.axes for f in n.split('+'))

  @functools.cached_property
  def points(self) -> list[dict[str, Any]]:
    return [{f: v for (n, _), v in zip(self.axes, vs) for f in n.split('+')}
            for vs in itertools.product(*(v for _, v in self.axes))]

  @property
  def size(self) -> int:
    return math.prod(len(v) for _, v in self.axes)

  @property
  def traced_names(self) -> tuple[str, ...]:
    """The swept traced fields (every field but the seeds)."""
    return tuple(n for n in self.names if n not in SEEDS)

  def split_seed(self, config, r: int) -> int:
    """Replica `r`'s split_seed (`config.split_seed` when the sweep has none)."""
    return int(self.points[r].get('split_seed', config.split_seed))

  def seed(self, config, r: int) -> int:
    """Replica `r`'s seed (`config.seed` when the sweep has no seed axis)."""
    point = self.points[r]
    return int(point['seed'] if 'seed' in point else config.seed)

  def traced(self, r: int) -> dict[str, Any]:
    """Replica `r`'s values of the traced fields."""
    return {k: self.points[r][k] for k in self.traced_names}

  def label(self, r: int, seed: bool = True) -> str:
    """'seed=1,optim.lr=0.003': what replica `r` is (its sub-workdir's name); without
    the seed with `seed=False` ('' for a sweep of seeds only)."""
    return ','.join(f'{k}={_show(v)}' for k, v in self.points[r].items()
                    if seed or k not in SEEDS)

  def config_of(self, config, r: int):
    """The config of a separate run equal to replica `r` (no sweep)."""
    c = config.copy_and_resolve_references()
    with c.unlocked():
      for k, v in self.points[r].items():
        *parents, last = k.split('.')
        node = c
        for p in parents:
          node = node[p]
        node[last] = v
      c.sweep = ''
    return c


def _show(v) -> str:
  return repr(v) if isinstance(v, str) else f'{v:g}' if isinstance(v, float) else str(v)


def _parse_value(name: str, text: str, field: fields.Field):
  """One value of axis `name` as the field's type, in its range."""
  integer = isinstance(field.default, int) and not isinstance(field.default, bool)
  try:
    v = int(text) if integer else float(text)
  except ValueError:
    raise ConfigError(f'sweep value {text!r} of {name} is not '
                      + ('an integer' if integer else 'a number')) from None
  if field.rule is not None and not field.rule.ok(v):
    raise ConfigError(f'sweep value {text} of {name} is out of range; valid range: '
                      + field.rule.text.format(name=name.rsplit('.', 1)[-1]))
  return v


def parse(text: str, table: dict[str, fields.Field]) -> Sweep | None:
  """The `config.sweep` string as a Sweep (None for ''), its fields looked up in `table`
  (every declared field: `validate.fields_table()`; `validate.sweep_of(config)` is
  this for a config); ConfigError (one line) for a malformed axis, a field that is
  unknown or structural, a value out of range, or a field named twice."""
  text = (text or '').strip()
  if not text:
    return None
  sweepable = list(SEEDS) + sorted(traced_fields(table))
  axes, seen = [], set()
  for part in text.split(';'):
    name, eq, values = part.partition('=')
    names = [n.strip() for n in name.split('+')]
    if not eq or not all(names) or not values.strip():
      raise ConfigError(f"sweep axis {part.strip()!r} is not name=v1,v2,...; e.g. "
                        "--config.sweep='seed=0,1,2' or 'optim.lr=1e-3,3e-3;seed=0,1'")
    for name in names:
      if name not in table:
        raise ConfigError(f'sweep field {name!r} is not a config field; sweepable fields: '
                          + ', '.join(sweepable))
      if name not in sweepable:
        raise ConfigError(f'sweep field {name!r} is structural (its programs differ per '
                          'value) and cannot vary across replicas; sweepable fields: '
                          + ', '.join(sweepable))
      if name in seen:
        raise ConfigError(f'sweep names {name!r} twice')
      seen.add(name)
    vals = [tuple(_parse_value(n, v.strip(), table[n]) for v in values.split(','))
            for n in names]
    if len(set(vals[0])) < len(vals[0]):
      raise ConfigError(f'sweep repeats a value of {"+".join(names)!r}: {values.strip()}')
    axes.append(('+'.join(names), vals[0]))
  return Sweep(tuple(axes))


def check(config, sweep: Sweep | None) -> None:
  """ConfigError (one line) when the run's setting cannot hold `sweep` (`config`'s,
  parsed): replicas run on in-memory data in one process; the many-task setting's
  own conditions are `check_many_task`'s."""
  if sweep is None:
    return
  if int(config.get('distributed', {}).get('num_processes', 0) or 0) > 1:
    raise ConfigError('config.sweep runs in one process; distributed.num_processes must be '
                      '0 or 1')
  if config.get('setting', 'dense') == 'many_task':
    check_many_task(config, sweep)
    return
  if 'split_seed' in sweep.names:
    raise ConfigError('sweep field split_seed is structural in the dense setting (the '
                      "replicas share their clients' data); sweep it in the many-task "
                      'setting, or run one process per split')
  if config.data.source != 'synthetic':
    raise ConfigError("config.sweep needs the in-memory synthetic data (data.source="
                      "'synthetic'); a streamed data.source='real' run holds one federation")


def check_many_task(config, sweep: Sweep) -> None:
  """ConfigError (one line) for a many-task run a sweep cannot hold (before anything
  is built; `engines/many_replicas.py`)."""
  import jax
  cfg = config.many
  if cfg.get('feed', 'device') != 'device':
    raise ConfigError(f"config.sweep: a many-task sweep's replicas read the training set "
                      f"from the device (many.feed='device'), got many.feed={cfg.feed!r}")
  if int(config.get('max_steps_per_round', 0)):
    raise ConfigError('config.sweep: max_steps_per_round (a rehearsal cap) does not run '
                      'in a many-task sweep; set it to 0')
  if int(config.get('num_devices', 0)) > 1 or (
      not int(config.get('num_devices', 0)) and jax.device_count() > 1):
    raise ConfigError(f'config.sweep: a many-task sweep runs on one device; set '
                      f'num_devices=1 (this host has {jax.device_count()})')
  splits = {sweep.split_seed(config, r) for r in range(sweep.size)}
  if len(splits) > 1 and not (cfg.tasks_per_client or cfg.client_tasks.strip()
                              or float(cfg.zeta_t) == 0):
    raise ConfigError(f'config.sweep: replicas with their own client splits (split_seed) '
                      f'need a fixed number of tasks per client (many.tasks_per_client, '
                      f'many.client_tasks or many.zeta_t=0); many.zeta_t={cfg.zeta_t:g} '
                      'draws it per split')
  if config.algorithm == 'ntkfedavg' and config.get('ntkfedavg', {}).get('tune_alpha', False):
    raise ConfigError('config.sweep: ntkfedavg.tune_alpha chooses α per replica on the host '
                      'between programs; run one process per seed')
