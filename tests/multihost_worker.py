"""One process of a run of the tiny hca2 config (2 rounds); process 0 saves its final views.

Used by test_multihost.py (also as one process over 4 devices). The distributed runtime comes from the environment
(JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID); without it the
run is one process over every visible device.
Usage: multihost_worker.py OUT.npz WORKDIR [STOP_AFTER]
"""

import json
import os
import sys

import numpy as np

from conftest import tiny_config
from fedjax_mtl import distributed, train


def config():
  return tiny_config('hca2', num_rounds=2)


def _every_process_writes_the_compilation_cache():
  """Test harness only: let processes other than 0 write the persistent compilation
  cache too. On XLA:CPU each process's programs have their own cache keys and JAX
  writes entries from process 0 only, so process 1 would compile every program again
  on each launch (the killed run and its resumption). A no-op where JAX's internals
  differ."""
  try:
    from jax._src import compiler
    from jax._src import distributed as jax_distributed
    write = compiler._cache_write
  except (ImportError, AttributeError):
    return

  def write_from_any_process(*args, **kwargs):
    state = jax_distributed.global_state
    own, state.process_id = state.process_id, 0
    try:
      return write(*args, **kwargs)
    finally:
      state.process_id = own

  compiler._cache_write = write_from_any_process


def main(out_path, workdir, stop_after=None):
  from test_engine import _real_views
  cfg = config()
  result = train.train_and_evaluate(cfg, workdir,
                                    stop_after=int(stop_after) if stop_after else None)
  import jax
  exp = train.build(cfg)
  state = distributed.host_get(result['state'])  # collective: every process
  if jax.process_index() != 0:
    return
  enc, dec, heads = _real_views(exp, state)
  arrays = {f'{name}{jax.tree_util.keystr(path)}': x
            for name, tree in (('enc', enc), ('dec', dec), ('heads', heads))
            for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
  devices = set().union(*(jax.tree.leaves(gs.params)[0].sharding.device_set
                          for gs in result['state'].groups))
  np.savez(out_path, num_devices=len(jax.devices()), num_processes=jax.process_count(),
           devices_holding_clients=len(devices),
           processes_holding_clients=len({d.process_index for d in devices}),
           num_padded_clients=sum(g.num_total for g in exp.fed.groups),
           interrupted=result['interrupted'],
           eval=json.dumps(result['eval']), **arrays)


if __name__ == '__main__':
  _every_process_writes_the_compilation_cache()
  main(*sys.argv[1:])
  sys.stdout.flush()
  os._exit(0)  # skip interpreter teardown of the distributed client (the test waits on both)
