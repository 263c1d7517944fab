"""Run validation: every config field's type and range, from the declarations.

`check_run(config, workdir)` finds a bad value before anything is written and
raises `ConfigError` with one line naming the field, the value and the valid
range or choices. The fields are declared where they belong (`fedjax_mtl.fields`):
the engine's in `defaults.ENGINE`, each plug-in's block next to its code (the
algorithms' and wrappers' in `algorithms.blocks()`, the many-task setting's in
`manytask.setting.CONFIG`); a field's type is its default's type. This module
keeps the generic machinery and iterates those registries.

A block the run does not use (its algorithm, wrapper or setting not named) is
refused when it differs from its defaults (an override that would do nothing),
unless the config lists it in `spare_blocks`. Checks that depend on the data
(impossible client splits, missing caches, more clusters than clients) are left to
`experiment.build`, which runs before the first write too.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import numbers
import os
from typing import Any, Mapping

from fedjax_mtl import sweep
from fedjax_mtl.errors import ConfigError, check_choice
from fedjax_mtl.fields import Block, Field


def blocks() -> dict[str, Block]:
  """Every plug-in block a config may carry, by name: the algorithms' and wrappers'
  (`algorithms.blocks()`) and the many-task setting's."""
  from fedjax_mtl import algorithms
  from fedjax_mtl.manytask import setting
  return {**algorithms.blocks(), setting.CONFIG.name: setting.CONFIG}


@functools.cache
def fields_table() -> dict[str, Field]:
  """Every declared field by dotted name: the engine's, then every block's."""
  from fedjax_mtl import defaults
  out = dict(defaults.ENGINE)
  for block in blocks().values():
    out.update(block.dotted())
  return out


def __getattr__(name: str):
  if name == 'FIELDS':  # every declared field (built on first use: it imports the plug-ins)
    return fields_table()
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


# Fields a Δm reference run must share with this run for its columns
# (`client/task metric`, report.column_name) to hold comparable numbers: the
# clients and tasks, their test data, the client partition and the edge metric
# (of the final evaluation: `_final_value`).
DELTA_M_FIELDS = ('scenario', 'tasks', 'split_seed', 'split', 'split_alpha',
                  'parts_clients_humans_only',
                  'eval_edge_ods', 'data.source', 'data.resolution',
                  'data.reproduce_parts_index_bug')
# Synthetic data is generated from these; real data comes from the caches.
DELTA_M_SYNTHETIC_FIELDS = ('data.seed', 'data.num_train', 'data.num_test')


# ----------------------------------------------------------------------------
# Reading configs.
# ----------------------------------------------------------------------------

def _is_mapping(v) -> bool:
  return isinstance(v, Mapping) or (hasattr(v, 'items') and hasattr(v, 'keys'))


def leaves(config, prefix: str = '') -> dict[str, Any]:
  """{dotted name: value} of a config's fields (a documented dict field is one leaf)."""
  table = fields_table()
  out = {}
  for k, v in config.items():
    name = f'{prefix}{k}'
    if _is_mapping(v) and name not in table:
      out.update(leaves(v, f'{name}.'))
    else:
      out[name] = v
  return out


def block_defaults() -> dict[str, Any]:
  """The plug-in blocks with fields, by name, at their defaults (ConfigDicts)."""
  return {name: b.config() for name, b in blocks().items() if b.fields}


def defaults() -> dict[str, Any]:
  """Every declared field's default."""
  return {name: f.default for name, f in fields_table().items()}


def _plain(v):
  """ConfigDicts as dicts, for messages and comparisons."""
  return v.to_dict() if hasattr(v, 'to_dict') else v


def show(v) -> str:
  """A value as messages show it (ConfigDicts as dicts)."""
  return repr(_plain(v))


def unknown_field(name: str, known, listing: str = '') -> ConfigError:
  """'unknown config field' with the closest known names (else the command `listing`)."""
  close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
  if close:
    hint = '; did you mean ' + ' or '.join(map(repr, close)) + '?'
  else:
    hint = f'; {listing or "python -m fedjax_mtl.config_doc CONFIG_FILE"} lists the fields'
  return ConfigError(f'unknown config field {name!r}{hint}')


# ----------------------------------------------------------------------------
# Types.
# ----------------------------------------------------------------------------

def type_name(default) -> str:
  """'an int', 'a tuple of 2 ints', ...: the type a field with this default takes."""
  if isinstance(default, bool):
    return 'a bool (true/false)'
  if isinstance(default, numbers.Integral):
    return 'an int'
  if isinstance(default, numbers.Real):
    return 'a number'
  if isinstance(default, str):
    return 'a string'
  if isinstance(default, (tuple, list)):
    return f'a tuple of {len(default)} ' + type_name(default[0]).split(' ', 1)[1] + 's'
  if _is_mapping(default):
    return 'a dict'
  return type(default).__name__


def type_ok(value, default) -> bool:
  """Whether `value` has the type of `default`: ints are not bools, numbers accept ints,
  tuples (or lists) match element-wise, mappings are mappings."""
  if isinstance(default, bool):
    return isinstance(value, bool)
  if isinstance(default, numbers.Integral):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
  if isinstance(default, numbers.Real):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
  if isinstance(default, str):
    return isinstance(value, str)
  if isinstance(default, (tuple, list)):
    return (isinstance(value, (tuple, list)) and len(value) == len(default)
            and all(type_ok(v, d) for v, d in zip(value, default)))
  if _is_mapping(default):
    return _is_mapping(value)
  return isinstance(value, type(default))


def _check_type(name: str, value, default) -> None:
  if not type_ok(value, default):
    raise ConfigError(f'{name}={show(value)} has the wrong type; expected {type_name(default)} '
                      f'like the default {show(default)}')
  for x in (value if isinstance(value, (tuple, list)) else (value,)):
    if isinstance(x, numbers.Real) and not isinstance(x, bool) and not math.isfinite(x):
      raise ConfigError(f'{name}={show(value)} is not a finite number')


def _check_value(name: str, value, default, field: Field, short: str = '') -> None:
  """Type, then range or choices, of one value (`short`: its name in the range text)."""
  _check_type(name, value, default)
  if field.choices is not None:
    check_choice(name, value, field.valid_choices())
  if field.rule is not None and not field.rule.ok(value):
    raise ConfigError(f'{name}={show(value)} is out of range; valid range: '
                      + field.rule.text.format(name=short or name.rsplit('.', 1)[-1]))


# ----------------------------------------------------------------------------
# The checks.
# ----------------------------------------------------------------------------

def check_fields(config) -> None:
  """Every field known, present where required, of its default's type and in range;
  the algorithm's names; a block the run does not use at its defaults; the blocks it
  uses checked together (`Block.check`)."""
  table = fields_table()
  values = leaves(config)
  for name in values:
    if name not in table:
      raise unknown_field(name, table)
  plugins = blocks()
  for name in table:
    if name not in values and name.split('.')[0] not in plugins:
      raise ConfigError(f'the config has no field {name!r}; start it from '
                        'fedjax_mtl.defaults.base_config()')
  engine = {n: v for n, v in values.items() if n.split('.')[0] not in plugins}
  for name, value in engine.items():
    _check_field(name, value, table[name])
  from fedjax_mtl import algorithms
  algorithms.check(config.algorithm)
  used = check_unused_blocks(config)
  for name, value in values.items():
    if name not in engine:
      _check_field(name, value, table[name])
  for name in used:
    if name in config and plugins[name].check is not None:
      plugins[name].check(plugins[name].of(config), config)


def _check_field(name: str, value, field: Field) -> None:
  if field.per_dataset:
    from fedjax_mtl.tasks import DATASETS
    _check_type(name, value, field.default)
    sample = next(iter(field.default.values()))
    for d, v in value.items():
      check_choice('dataset', d, DATASETS, f' in {name}')
      _check_value(f'{name}.{d}', v, sample, field, short=name.rsplit('.', 1)[-1])
  elif field.mapping:
    _check_type(name, value, field.default)
  else:
    _check_value(name, value, field.default, field)


def used_blocks(config) -> tuple[str, ...]:
  """The plug-in blocks the run reads: its algorithm's pieces' (and what they read),
  and the setting's (`many` when `setting='many_task'`)."""
  from fedjax_mtl import algorithms
  used = algorithms.used_blocks(config.algorithm)
  if config.get('setting', 'dense') == 'many_task':
    used += ('many',)
  return used


def _users(name: str) -> tuple[str, str]:
  """(who reads block `name`, the override that makes a run use it; `{alg}` stands for
  the run's algorithm)."""
  from fedjax_mtl import algorithms
  if name in algorithms.WRAPPER_BLOCKS:
    return f'the {name}(...) wrapper', f"--config.algorithm='{name}({{alg}})'"
  block = blocks()[name]
  if block.applies_to:
    return block.applies_to, f'--config.{block.applies_to}'
  readers = [n for n, b in blocks().items() if n == name or name in b.reads]
  algs = [repr(n) for n in readers if n in algorithms.ALGORITHMS]
  wraps = [f'{n}(...)' for n in readers if n in algorithms.WRAPPER_BLOCKS]
  what = ('algorithm ' if len(algs) == 1 else 'algorithms ') + ', '.join(algs)
  return what + (' and ' + ', '.join(wraps) if wraps else ''), f'--config.algorithm={name}'


def check_unused_blocks(config) -> tuple[str, ...]:
  """The blocks the run uses (`used_blocks`); a block it does not use is refused where
  it differs from its defaults (an override that would do nothing), unless the config
  lists it in `spare_blocks`."""
  plugins = blocks()
  spare = [b.strip() for b in config.get('spare_blocks', '').split(',') if b.strip()]
  for b in spare:
    check_choice('spare_blocks entry', b, [n for n, x in plugins.items() if x.fields])
  used = used_blocks(config)
  if 'many' in used and 'many' not in config:
    raise ConfigError("setting='many_task' reads the many block, which this config lacks; "
                      'start from a :mini8 variant, e.g. --config=configs/fedavg.py:mini8')
  for name, block in plugins.items():
    if name not in config or name in used or name in spare:
      continue
    changed = [(k, v) for k, v in config[name].items()
               if k in block.fields and _json_value(v) != _json_value(block.fields[k].default)]
    if changed:
      k, v = changed[0]
      users, fix = _users(name)
      run = (f"setting={config.get('setting', 'dense')!r}" if name == 'many'
             else f'algorithm {config.algorithm!r}')
      raise ConfigError(
          f'config block {name!r} is not used by {run} (it applies to {users}) but sets '
          f'{name}.{k}={show(v)} (default {show(block.fields[k].default)}); remove the '
          f'override, or use the block: ' + fix.format(alg=config.algorithm))
  return used


def check_names(config) -> None:
  """Algorithm, scenario, tasks and encoder names; the scenario's datasets in the
  per-dataset fields; the encoder's keyword arguments."""
  from fedjax_mtl import algorithms, scenarios
  algorithms.check(config.algorithm)
  layout = scenarios.select_tasks(scenarios.layout(config.scenario), config.tasks)
  used = sorted({b[0] for b in layout})
  required = ['data.resolution']
  if config.data.source == 'synthetic':
    required += ['data.num_train', 'data.num_test']
  for name in required:
    node, _, key = name.partition('.')
    missing = [d for d in used if d not in config[node][key]]
    if missing:
      raise ConfigError(f'{name}={show(config[node][key])} has no entry for {missing[0]!r}; '
                        f'scenario {config.scenario!r} uses ' + ', '.join(map(repr, used)))
  _check_encoder(config.model.encoder, _plain(config.model.kwargs))


def check_split(config) -> None:
  """`split` other than 'equal' only where it applies (the dense setting's clients)."""
  if config.get('setting', 'dense') == 'many_task' and config.get('split', 'equal') != 'equal':
    raise ConfigError(f"split={config.split!r} partitions the dense setting's clients; the "
                      'many-task setting splits with many.class_split and many.zeta_c')


def _check_encoder(name: str, kwargs: dict) -> None:
  from fedjax_mtl.models import ENCODERS
  check_choice('model', name, ENCODERS)  # the message of models.get_encoder
  if 'dtype' in kwargs:
    raise ConfigError("model.kwargs sets 'dtype'; use model.dtype instead")
  module = ENCODERS[name]()
  valid = sorted(f.name for f in dataclasses.fields(module)
                 if f.init and f.name not in ('parent', 'name', 'dtype'))
  for k in kwargs:
    check_choice('model.kwargs argument', k, valid, f' of encoder {name!r}')


def _resuming(workdir: str) -> bool:
  """Whether `workdir` holds a checkpoint (a resumed run loads no pretrained weights).
  Orbax names a step's folder by its bare number (checkpoint.Checkpointer)."""
  d = os.path.join(workdir, 'checkpoints')
  return os.path.isdir(d) and any(n.isdigit() for n in os.listdir(d))


def check_paths(config, workdir: str) -> None:
  """Files the run reads: the pretrained weights (unless resuming) and the real-data dir."""
  path = config.model.pretrained_path
  if path and not os.path.isfile(path) and not _resuming(workdir):
    raise ConfigError(f'model.pretrained_path {path!r} is not a file; convert the weights '
                      'with scripts/convert_swin.py, or set it to \'\' for a random init')
  if config.data.source == 'real':
    from fedjax_mtl.data import real
    real.resolve_data_dir(config)
  if config.get('tensorboard', False):
    import importlib.util
    if importlib.util.find_spec('tensorboardX') is None:
      raise ConfigError('tensorboard=True needs tensorboardX: pip install ".[tensorboard]" '
                        '(or set --config.tensorboard=false)')


def check_workdir(workdir: str) -> None:
  """`workdir` is a writable directory, or can be created."""
  if not workdir:
    raise ConfigError('workdir is empty; give --workdir=DIR')
  if os.path.exists(workdir):
    if not os.path.isdir(workdir):
      raise ConfigError(f'workdir {workdir!r} is a file, not a directory; give another '
                        '--workdir')
    if not os.access(workdir, os.W_OK | os.X_OK):
      raise ConfigError(f'workdir {workdir!r} is not writable; give another --workdir')
    return
  parent = os.path.dirname(os.path.abspath(workdir))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise ConfigError(f'cannot create workdir {workdir!r}: {parent!r} is a file')
  if not os.access(parent, os.W_OK | os.X_OK):
    raise ConfigError(f'cannot create workdir {workdir!r}: {parent!r} is not writable')


def _lookup(d: dict, name: str, default):
  for k in name.split('.'):
    if not isinstance(d, dict) or k not in d:
      return default
    d = d[k]
  return d


def _json_value(v):
  """A value as it reads back from config.json (tuples become lists)."""
  return json.loads(json.dumps(_plain(v)))


def _final_value(name: str, value):
  """A DELTA_M_FIELDS value as the final evaluation sees it: `eval_edge_ods` as the
  final round's edge metric ('every' and 'final' both give odsF; the config.json of a
  run before the field had three values holds true = 'every' or false = 'off')."""
  if name == 'eval_edge_ods':
    return 'loss' if value in (False, 'off') else 'odsF'
  return value


def check_delta_m_reference(config) -> None:
  """`delta_m_reference` is a finished run of a comparable setting with usable values."""
  ref = config.get('delta_m_reference', '')
  if not ref:
    return
  what = f'delta_m_reference {ref!r}'
  hint = 'give the workdir of a finished run (usually configs/local.py) of the same scenario'
  if not os.path.isdir(ref):
    raise ConfigError(f'{what} is not a directory; {hint}')
  path = os.path.join(ref, 'config.json')
  try:
    with open(path) as f:
      old = json.load(f)
  except (OSError, ValueError):
    raise ConfigError(f'{what} holds no readable config.json; {hint}') from None
  names = DELTA_M_FIELDS + (DELTA_M_SYNTHETIC_FIELDS if config.data.source == 'synthetic'
                            else ())
  known, mine = defaults(), leaves(config)
  diffs = [n for n in names if _final_value(n, _lookup(old, n, _json_value(known[n])))
           != _final_value(n, _json_value(mine[n]))]
  if _lookup(old, 'split', known['split']) == mine['split'] == 'equal':
    diffs = [n for n in diffs if n != 'split_alpha']  # equal chunks do not read it
  if diffs:
    raise ConfigError(f'{what} is a run of another setting (fields: {", ".join(diffs)}); '
                      'its Δm columns would not compare the same clients and data')
  from fedjax_mtl import report
  rounds = old.get('num_rounds')
  try:
    rows = [r for r in report.read_jsonl(os.path.join(ref, 'metrics.jsonl'))
            if r.get('type') == 'eval' and r.get('round') == rounds]
  except (OSError, ValueError):
    rows = []
  if not rows:
    raise ConfigError(f'{what} has no final evaluation (round {rounds}) in metrics.jsonl; '
                      'let that run finish first')
  zero = [report.column_name(r) for r in rows if r['value'] == 0]
  if zero:
    raise ConfigError(f'{what} has final value 0 for {zero[0]!r}; Δm (relative to it) is '
                      'undefined, use a longer reference run')


def check_config(config) -> None:
  """Everything about `config` that can be known without data: ConfigError on the first
  bad field."""
  check_fields(config)
  check_names(config)
  check_split(config)
  check_delta_m_reference(config)
  sweep.check(config, sweep_of(config))


def sweep_of(config) -> sweep.Sweep | None:
  """`config.sweep` parsed against the declarations (None for one run); ConfigError
  (one line) for a bad one (`sweep.parse`)."""
  return sweep.parse(config.get('sweep', ''), fields_table())


def check_run(config, workdir: str) -> None:
  """ConfigError (one line) for the first bad config value, path or workdir; writes nothing."""
  check_config(config)
  check_workdir(workdir)
  check_paths(config, workdir)
