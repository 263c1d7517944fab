"""Entry point: `python -m fedjax_mtl.main --config=configs/hca2.py --workdir=DIR`.

Any config field can be overridden: `--config.num_rounds=20`, nested fields
`--config.optim.lr=1e-3`, per-dataset entries `--config.local_epochs.nyud=2`,
tuples `--config.data.resolution.pascal=48,48`, whole dicts
`--config.model.kwargs="{'embed_dim': 8}"`. Bad input stops the run with one
`error: ...` line (exit code 2) before anything is written.
`python -m fedjax_mtl.config_doc configs/hca2.py[:arg]` lists a config's fields.

Exit codes: 0 the run finished; 2 bad input, a diverged round, or a workdir in use
by another run (one `error:` line); 75 stopped by SIGTERM or SIGINT after saving
the round in progress (re-run the same command to resume; `fedjax_mtl.preempt`).
A second SIGINT aborts at once (130).
"""

from __future__ import annotations

import os
import re
import sys

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from fedjax_mtl import preempt
from fedjax_mtl.errors import ConfigError

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file('config', None, 'Experiment config file (configs/*.py[:arg]); '
                                '--config=FILE --help lists its fields.', lock_config=True)
flags.DEFINE_string('workdir', None, 'Where metrics, results and checkpoints go; '
                    're-running with the same workdir resumes.')
flags.DEFINE_string('xla_cache_dir', '~/.cache/fedjax_mtl/xla',
                    'Persistent XLA compilation cache (re-runs skip compilation); '
                    "'none' disables it. JAX_COMPILATION_CACHE_DIR takes precedence.")
flags.DEFINE_bool('reuse_host_memory', True,
                  'CPU-only runs: keep XLA\'s freed scratch memory mapped for the next call '
                  '(fedjax_mtl.hostmem: no mmap/trim in glibc\'s main heap, synchronous CPU '
                  'dispatch). Removes the page faults of large programs (Swin-T step at '
                  '224x224: 1.3x faster); --noreuse_host_memory turns it off.')
flags.DEFINE_enum('cpu_isa', 'AVX2', ['native', 'SSE4_2', 'AVX', 'AVX2', 'AVX512'],
                  "Cap XLA:CPU's code generation at these vector instructions, so that x86 "
                  'hosts compute alike (fedjax_mtl.cpu_isa; ignored when XLA_FLAGS sets '
                  "--xla_cpu_max_isa); 'native': the host's widest.")
flags.mark_flags_as_required(['config', 'workdir'])

HELP_FLAGS = ('help', 'helpshort', 'helpfull', '?')


class ConfigFileParser(flags.ArgumentParser):
  """`--config`'s parser: ml_collections' (`file.py[:arg]` -> the locked ConfigDict of
  its `get_config`), then the plug-in blocks that the `--config.<block>.<field>`
  overrides name and the config lacks, added at their declared defaults before the
  overrides apply (`config_doc.add_blocks`): a config carries only the blocks of what
  it uses."""

  def __init__(self, inner: flags.ArgumentParser):
    self.inner = inner

  def parse(self, argument):
    config = self.inner.parse(argument)
    if isinstance(config, ml_collections.ConfigDict):
      from fedjax_mtl import config_doc
      argv = FLAGS.read_flags_from_files(sys.argv, force_gnu=False)
      config_doc.add_blocks(config, override_fields(argv))
    return config

  def flag_type(self):
    return self.inner.flag_type()


FLAGS['config'].parser = ConfigFileParser(FLAGS['config'].parser)


def fail(message: str) -> None:
  """Print `error: <message>` as one line and exit with status 2."""
  print('error: ' + ' '.join(message.split()), file=sys.stderr)
  sys.exit(2)


def _flag_name(arg: str) -> str:
  return arg.lstrip('-').split('=', 1)[0] if arg.startswith('-') else ''


def config_spec(argv: list[str]) -> str | None:
  """The value of --config (`path[:arg]`) in argv, or None."""
  for i, arg in enumerate(argv[1:], 1):
    if _flag_name(arg) == 'config':
      if '=' in arg:
        return arg.split('=', 1)[1]
      return argv[i + 1] if i + 1 < len(argv) else None
  return None


def override_fields(argv: list[str]) -> dict[str, str]:
  """{field: value as written} of every `--config.<field>[=value]` (`--noconfig.<field>`)."""
  out = {}
  for arg in argv[1:]:
    name = _flag_name(arg)
    for prefix, bare in (('config.', 'true'), ('noconfig.', 'false')):
      if name.startswith(prefix):
        value = arg.split('=', 1)[1] if '=' in arg else bare
        out[name[len(prefix):]] = value
  return out


def _check_field(config, field: str, spec: str) -> None:
  """ConfigError unless `field` (dotted) names a field of `config`."""
  from fedjax_mtl import validate
  node, parts = config, field.split('.')
  for i, key in enumerate(parts):
    if not hasattr(node, 'keys') or key not in node:
      parent = '.'.join(parts[:i])
      if parent in validate.fields_table():  # a dict field: a locked config takes no new key
        raise ConfigError(f'{parent} has no entry {key!r}; set the whole dict instead, e.g. '
                          f'--config.{parent}="{{\'{key}\': ...}}"')
      # Every declared field (an override of a block the config lacks adds the block).
      names = list(validate.fields_table())
      for name, value in validate.leaves(config).items():
        names += [name] + ([f'{name}.{k}' for k in value] if hasattr(value, 'keys') else [])
      raise validate.unknown_field(field, dict.fromkeys(names),
                                   f'python -m fedjax_mtl.config_doc {spec}')
    node = node[key]


def explain(argv: list[str], error: Exception) -> str:
  """One line for a failure to parse argv: a config file that does not load, an
  override of an unknown field, a value of the wrong type, or absl's message."""
  message = ' '.join(str(error).split())
  spec = config_spec(argv)
  if spec:
    from fedjax_mtl import config_doc, validate
    try:
      config = config_doc.load_config(spec)
      overrides = override_fields(argv)
      config_doc.add_blocks(config, overrides)
      for field in overrides:
        _check_field(config, field, spec)
    except ConfigError as e:
      return str(e)
    m = re.match(r'flag --config\.([\w.]+)=', message)
    if m and m.group(1) in overrides:
      field = m.group(1)
      node = config
      for key in field.split('.'):
        node = node[key]
      return (f'--config.{field}={overrides[field]}: expected {validate.type_name(node)} '
              f'like the default {validate.show(node)} ({message.split(": ", 1)[-1]})')
  m = re.match(r'flag --(\w+)=None: Flag --\w+ must have a value other than None', message)
  if m:
    return f'--{m.group(1)} is required, e.g. --config=configs/hca2.py --workdir=runs/hca2'
  return message


def _add_fields_to_help(argv: list[str]) -> None:
  """absl's --help prints __main__'s docstring: add the config fields to it."""
  from fedjax_mtl import config_doc
  spec = config_spec(argv)
  try:
    if spec:
      config = config_doc.load_config(spec)
      from fedjax_mtl import validate
      others = sorted(b for b, block in validate.blocks().items()
                      if block.fields and b not in config)
      text = (f'\nFields of {spec} (override with --config.<name>=<value>):\n'
              + config_doc.describe(config)
              + '(blocks of the algorithms, wrappers and settings it does not use, added by '
              'their overrides: ' + ', '.join(others) + '; python -m fedjax_mtl.config_doc '
              'lists their fields)\n')
    else:
      text = ('\nConfig fields of every algorithm (--config=FILE --help lists one config\'s; '
              'override with --config.<name>=<value>):\n' + config_doc.describe_all())
  except ConfigError as e:
    text = f'\nerror: {e}\n'
  main_module = sys.modules['__main__']
  main_module.__doc__ = (main_module.__doc__ or '') + text.replace('%', '%%')


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing; bad flags or config input end the process with one line."""
  if any(_flag_name(a) in HELP_FLAGS for a in argv[1:]):
    _add_fields_to_help(argv)
  try:
    rest = FLAGS(argv)
    # A config file that does not load is only reported when the config is first
    # read (ml_collections keeps the error); read it now.
    FLAGS.config.keys()
    return rest
  except Exception as e:  # noqa: BLE001 - flag and config-file errors alike
    fail(explain(argv, e))


def main(argv):
  if len(argv) > 1:
    fail(f'unexpected argument {argv[1]!r}; flags are written --name=value')
  logging.set_verbosity(logging.WARNING)
  from fedjax_mtl import hostmem
  if FLAGS.reuse_host_memory:
    hostmem.reuse_freed_memory()  # CPU-only runs; before JAX creates its backends
  from fedjax_mtl import cpu_isa
  cpu_isa.pin(FLAGS.cpu_isa)  # also before the backends
  import jax
  if FLAGS.xla_cache_dir != 'none' and not os.environ.get('JAX_COMPILATION_CACHE_DIR'):
    jax.config.update('jax_compilation_cache_dir', os.path.expanduser(FLAGS.xla_cache_dir))
  from fedjax_mtl import validate
  try:
    # Also the first step of train_and_evaluate; here it fails before train's imports.
    validate.check_run(FLAGS.config, FLAGS.workdir)
    from fedjax_mtl import train  # import after flags so --help stays fast
    train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except ConfigError as e:
    fail(str(e))
  except preempt.Stopped as e:
    if jax.process_index() == 0:
      print(e, file=sys.stderr, flush=True)
    sys.exit(preempt.EXIT_CODE)


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
