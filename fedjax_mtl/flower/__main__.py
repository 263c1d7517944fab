"""`python -m fedjax_mtl.flower --config=configs/hca2.py:smoke --workdir=runs/flower`:
the run in Flower's simulation engine (one virtual SuperNode per client, the
ClientApps in Ray workers; either setting, e.g. `--config=configs/matu.py:smoke`), with `python -m fedjax_mtl.main`'s flags: `--config`
and its `--config.<field>=<value>` overrides, `--workdir` (metrics.jsonl and the
results tables; a Flower run does not resume, so the workdir must be new),
`--xla_cache_dir`, `--cpu_isa`. `--num_workers`: Ray workers (default: every core).
Bad input stops with one `error: ...` line before Ray starts.
"""

from __future__ import annotations

import os

from absl import app, flags, logging

from fedjax_mtl import main as engine_main
from fedjax_mtl.errors import ConfigError

FLAGS = flags.FLAGS
flags.DEFINE_integer('num_workers', None, 'Ray workers running ClientApps (default: all cores).')


def main(argv):
  if len(argv) > 1:
    engine_main.fail(f'unexpected argument {argv[1]!r}; flags are written --name=value')
  logging.set_verbosity(logging.WARNING)
  from fedjax_mtl import cpu_isa
  cpu_isa.pin(FLAGS.cpu_isa)  # through XLA_FLAGS: the workers inherit it
  import jax
  if FLAGS.xla_cache_dir != 'none' and not os.environ.get('JAX_COMPILATION_CACHE_DIR'):
    jax.config.update('jax_compilation_cache_dir', os.path.expanduser(FLAGS.xla_cache_dir))
  if FLAGS.num_workers is not None and FLAGS.num_workers < 1:
    engine_main.fail(f'--num_workers={FLAGS.num_workers}: expected at least 1')
  import logging as pylogging
  pylogging.getLogger('flwr').propagate = False  # Flower prints its own log lines
  try:
    from fedjax_mtl.flower import simulate
    strategy = simulate.simulate(FLAGS.config, FLAGS.workdir, FLAGS.num_workers)
  except ConfigError as e:
    engine_main.fail(str(e))
  for t in strategy.timing:
    print(f"round {t['round']}: {t['messages'] + t['clients'] + t['aggregate']:.2f}s "
          f"(clients {t['clients']:.2f}s, aggregation {t['aggregate']:.2f}s)")
  print(f'results in {FLAGS.workdir}')


if __name__ == '__main__':
  app.run(main, flags_parser=engine_main.parse_flags)
