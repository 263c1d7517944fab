"""Every field of a config with its default and meaning.

    python -m fedjax_mtl.config_doc configs/hca2.py[:arg]   # that config's fields
    python -m fedjax_mtl.config_doc                         # all fields, every block

Prints `name = default  # meaning (valid range)` per field, `[sweepable]` after the
fields a `config.sweep` may vary (`fields.Field.traced`, and the seeds); the meanings and
ranges are the declarations the run is validated with (`validate.fields_table()`:
the engine's `defaults.ENGINE` and every plug-in's block).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import sys

from fedjax_mtl import sweep, validate
from fedjax_mtl.errors import ConfigError


def load_config(spec: str):
  """The config of `path[:arg]` as `--config` loads it (`get_config(arg)`, or
  `get_config()` without an arg), unlocked; ConfigError (one line) when the file is
  missing or its get_config fails."""
  path, *arg = spec.split(':', 1)
  if not os.path.isfile(path):
    raise ConfigError(f'config file {path!r} does not exist; e.g. --config=configs/hca2.py')
  one_line = lambda e: ' '.join(f'{type(e).__name__}: {e}'.split())
  try:
    module_spec = importlib.util.spec_from_file_location('fedjax_mtl_config', path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
  except Exception as e:  # noqa: BLE001 - any failure of the user's config file
    raise ConfigError(f'cannot load config file {path!r}: {one_line(e)}') from None
  if not callable(getattr(module, 'get_config', None)):
    raise ConfigError(f'config file {path!r} defines no get_config(arg)')
  try:
    config = module.get_config(*arg)
  except Exception as e:  # noqa: BLE001 - e.g. an unknown variant name
    raise ConfigError(f'cannot load config {spec!r}: {one_line(e)}') from None
  if not hasattr(config, 'items'):
    raise ConfigError(f'config {spec!r}: get_config() returned {config!r}, not a ConfigDict')
  return config


def field_names(node, prefix: str = '') -> list[str]:
  """Dotted names of every field (nested dicts included) of a config."""
  names = []
  for k, v in node.items():
    names.append(prefix + k)
    if hasattr(v, 'items'):
      names += field_names(v, f'{prefix}{k}.')
  return names


def unknown_field(cfg, key: str) -> ConfigError:
  """The error for an override of a field `cfg` lacks: near names, else the valid ones."""
  parent, _, last = key.rpartition('.')
  node = cfg
  for p in parent.split('.') if parent else []:
    node = node[p] if hasattr(node, 'items') and p in node else None
  if hasattr(node, 'items'):  # the parent exists: suggest among its fields
    prefix = parent + '.' if parent else ''
    near = [prefix + n for n in difflib.get_close_matches(last, list(node), n=3)]
    valid = f'fields of {parent}: ' if parent else 'top-level fields: '
    valid += ', '.join(sorted(node))
  else:
    near = difflib.get_close_matches(key, field_names(cfg), n=3)
    valid = 'top-level fields: ' + ', '.join(sorted(cfg))
  hint = f'did you mean {" or ".join(near)}?' if near else valid
  return ConfigError(f'unknown config field {key!r}; {hint}')


def add_blocks(cfg, keys) -> None:
  """Add to `cfg` (at their declared defaults) the plug-in blocks that the dotted
  `keys` (overrides) name and `cfg` lacks: a config carries only the blocks of what it
  uses, and an override of another one's field starts from its defaults (validation
  then refuses it if the run does not use that block)."""
  plugins = validate.blocks()
  for key in keys:
    name = key.split('.')[0]
    if '.' in key and name in plugins and name not in cfg and plugins[name].fields:
      if hasattr(cfg, 'unlocked'):
        with cfg.unlocked():
          cfg[name] = plugins[name].config()
      else:
        cfg[name] = plugins[name].config()


def field_parent(cfg, key: str):
  """(block, name) of the dotted field `key` of `cfg`, to read or set `block[name]`
  (a declared plug-in block `cfg` lacks is added at its defaults first, `add_blocks`);
  the ConfigError of `unknown_field` when a part of `key` is missing."""
  add_blocks(cfg, [key])
  node = cfg
  *parents, last = key.split('.')
  for p in parents:
    if not hasattr(node, 'items') or p not in node:
      raise unknown_field(cfg, key)
    node = node[p]
  if not hasattr(node, 'items') or last not in node:
    raise unknown_field(cfg, key)
  return node, last


def _line(name: str, value) -> str:
  field = validate.fields_table().get(name)
  if field is None:
    return f'{name} = {validate.show(value)}  # (undocumented)'
  extra = field.range_text(name.rsplit('.', 1)[-1])
  if field.traced or name in sweep.SEEDS:
    extra = (extra + ' ' if extra else '') + ('[sweepable, many-task only]'
                                              if name == 'split_seed' else '[sweepable]')
  return f'{name} = {validate.show(value)}  # {field.meaning}' + (f' {extra}' if extra else '')


def describe(config) -> str:
  """`name = default  # meaning (range)` for every field of `config`."""
  return '\n'.join(_line(n, v) for n, v in sorted(validate.leaves(config).items())) + '\n'


def describe_all() -> str:
  """Every declared field with its default: the engine's and every plug-in block's."""
  return '\n'.join(_line(n, v) for n, v in sorted(validate.defaults().items())) + '\n'


def main(argv: list[str]) -> int:
  if len(argv) > 2 or any(a.startswith('-') for a in argv[1:]):
    print(__doc__, file=sys.stderr)
    return 2
  try:
    text = describe(load_config(argv[1])) if len(argv) == 2 else describe_all()
  except ConfigError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  sys.stdout.write(text)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
