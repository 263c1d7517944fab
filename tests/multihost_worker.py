"""One process of a run of the tiny hca2 config (2 rounds); process 0 saves its final views.

Used by test_multihost.py. The distributed runtime comes from the environment
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
  shards = {str(d.process_index) for d in jax.tree.leaves(
      result['state'].groups[0].params)[0].sharding.device_set}
  np.savez(out_path, num_devices=len(jax.devices()), num_processes=jax.process_count(),
           processes_holding_clients=len(shards), interrupted=result['interrupted'],
           eval=json.dumps(result['eval']), **arrays)


if __name__ == '__main__':
  main(*sys.argv[1:])
  sys.stdout.flush()
  os._exit(0)  # skip interpreter teardown of the distributed client (the test waits on both)
