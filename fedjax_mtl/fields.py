"""Config declarations: a field's default, one-line meaning and valid range, in one place.

A plug-in (algorithm, wrapper, setting, runtime) declares its config block next to
its code, and the run's defaults, its validation (`fedjax_mtl.validate`) and its
documentation (`python -m fedjax_mtl.config_doc`, `--help`) all read that one
declaration:

    CONFIG = fields.Block('fedprox', {
        'mu': fields.Field(0.01, 'FedProx proximal coefficient μ', fields.at_least(0)),
    }, reads=('fedavg',))

    def build(info, config=None):
      cfg = CONFIG.of(config)  # the config's block, defaults where it has none
      ...

`build` does not re-check what the declaration states: validation has refused
every value outside a field's type, range or choices before anything is built.
This module depends on nothing of the package.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
from typing import Any, Callable, Iterator, Mapping

import ml_collections


@dataclasses.dataclass(frozen=True)
class Rule:
  """A valid range: `ok(value)`, and `text` with `{name}` for the field's name."""
  ok: Callable[[Any], bool]
  text: str


def at_least(lo) -> Rule:
  """value >= lo."""
  return Rule(lambda v: v >= lo, f'{{name}} >= {lo}')


def above(lo) -> Rule:
  """value > lo."""
  return Rule(lambda v: v > lo, f'{{name}} > {lo}')


def unit(closed_hi: bool = False) -> Rule:
  """[0, 1) (or [0, 1])."""
  if closed_hi:
    return Rule(lambda v: 0 <= v <= 1, '0 <= {name} <= 1')
  return Rule(lambda v: 0 <= v < 1, '0 <= {name} < 1')


def fraction() -> Rule:
  """(0, 1]."""
  return Rule(lambda v: 0 < v <= 1, '0 < {name} <= 1')


SEED = Rule(lambda v: 0 <= v < 2**32, '0 <= {name} < 2**32')
SIZE = Rule(lambda v: all(x >= 1 for x in v), '{name} = (height, width), both >= 1')


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field: its default (whose type is the field's type), its one-line
  meaning, and what is valid beyond the type.

  `choices`: the valid values, or a callable returning them (for a registry that
  lives in a module the declaration does not import). `per_dataset`: a dict
  {dataset: value}, `rule` applying to each value. `mapping`: a free dict.
  `traced`: the round programs read it while they are traced (`traced_value`), so
  replicas of one program may hold different values of it (`config.sweep`).
  """
  default: Any
  meaning: str
  rule: Rule | None = None
  choices: tuple | Callable[[], tuple] | None = None
  per_dataset: bool = False
  mapping: bool = False
  traced: bool = False

  def valid_choices(self) -> tuple | None:
    """The valid values (None: any value of the type)."""
    if self.choices is None:
      return None
    return tuple(self.choices() if callable(self.choices) else self.choices)

  def range_text(self, name: str) -> str:
    """'(mu >= 0)' or "(one of 'a', 'b')" for the field called `name`; '' without either."""
    if self.rule is not None:
      return '(' + self.rule.text.format(name=name) + ')'
    if self.choices is not None:
      return '(one of ' + ', '.join(map(repr, self.valid_choices())) + ')'
    return ''


@dataclasses.dataclass(frozen=True)
class Block:
  """A plug-in's config block `config.<name>`: its ordered fields.

  `reads`: other plug-ins' blocks its code reads too (e.g. FedProx builds FedAvg's
  server, which reads `fedavg.weighting`): a run that uses this block uses those.
  `check(block, config)`: what a field's range cannot say (a bound set by another
  field, e.g. fewer fine-tuning rounds than `num_rounds`); it raises ConfigError with
  one line and runs at validation when the run uses the block.
  `applies_to`: how the error for a block the run does not use names its users.
  """
  name: str
  fields: Mapping[str, Field]
  reads: tuple[str, ...] = ()
  check: Callable[[Any, Any], None] | None = None
  applies_to: str = ''

  def defaults(self) -> dict[str, Any]:
    """{field: default} (fresh copies)."""
    return {k: copy.deepcopy(f.default) for k, f in self.fields.items()}

  def config(self) -> ml_collections.ConfigDict:
    """The block at its defaults."""
    return ml_collections.ConfigDict(self.defaults())

  def of(self, config) -> ml_collections.ConfigDict:
    """The block as the run uses it: the defaults, updated with `config.<name>` where
    the config has that block (a config carries only the blocks it sets)."""
    cfg = self.config()
    if config is not None and self.name in config:
      cfg.update(config[self.name])
    return cfg

  def dotted(self) -> dict[str, Field]:
    """{'<name>.<field>': Field}."""
    return {f'{self.name}.{k}': f for k, f in self.fields.items()}


def nested(table: Mapping[str, Field]) -> ml_collections.ConfigDict:
  """The ConfigDict of a table of dotted names, at the defaults, in the table's order."""
  root: dict = {}
  for name, field in table.items():
    *parents, last = name.split('.')
    node = root
    for p in parents:
      node = node.setdefault(p, {})
    node[last] = copy.deepcopy(field.default)
  return ml_collections.ConfigDict(root)


# ---------------------------------------------------------------- traced fields

_TRACED: contextvars.ContextVar = contextvars.ContextVar('fedjax_mtl_traced', default={})


def traced_value(name: str, default):
  """The value of the traced field `name` (`Field.traced`) in the program being traced:
  a sweep replica's (a traced scalar, the program's input; `fedjax_mtl.sweep`) inside
  `tracing`, else `default` (the config's value). Read it where the program is
  traced, not when it is built."""
  return _TRACED.get().get(name, default)


@contextlib.contextmanager
def tracing(values: dict) -> Iterator[None]:
  """Trace with `values` ({dotted field name: traced scalar}) as the traced fields'
  values (`traced_value`)."""
  token = _TRACED.set({**_TRACED.get(), **values})
  try:
    yield
  finally:
    _TRACED.reset(token)
