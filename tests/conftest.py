"""Shared test setup: a persistent XLA cache and the tiny engine config.

Engine tests compile the same round functions in several processes (the CLI
and multi-device subprocesses); the persistent compilation cache makes every
compile after the first a cache hit.
"""

import os
import tempfile

os.environ.setdefault('JAX_COMPILATION_CACHE_DIR',
                      os.path.join(tempfile.gettempdir(), 'fedjax_mtl_test_xla_cache'))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.3')


def tiny_config(algorithm: str = 'fedavg', **overrides):
  """The synthetic 1c scenario shrunk to seconds per round (shared by engine tests)."""
  from fedjax_mtl.defaults import base_config
  c = base_config(None, algorithm)
  c.data.resolution = {'pascal': (32, 32), 'nyud': (32, 32)}
  c.data.num_train = {'pascal': 80, 'nyud': 16}
  c.data.num_test = {'pascal': 8, 'nyud': 8}
  c.batch_size = 4
  c.eval_batch_size = 8
  c.local_epochs = {'pascal': 1, 'nyud': 2}
  c.num_rounds = 3
  c.eval_every = 2
  c.progress = False
  # Normals are left out: their loss normalises near-zero initial predictions,
  # which turns float rounding differences between device layouts (a different
  # XLA blocking per vmap width) into visible parameter differences within a
  # few Adam steps. Their loss and metric have their own tests.
  c.tasks = 'semseg,human_parts,sal,edge,depth'
  for k, v in overrides.items():
    node = c
    *path, last = k.split('.')
    for p in path:
      node = node[p]
    node[last] = v
  return c
