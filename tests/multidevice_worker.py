"""Runs the tiny fedavg config on every visible device; saves its final views.

Used by test_engine.py under XLA_FLAGS=--xla_force_host_platform_device_count=4.
Usage: multidevice_worker.py OUT.npz WORKDIR
"""

import json
import sys

import jax
import numpy as np

from conftest import tiny_config
from fedjax_mtl import train
from test_engine import _real_views


def main(out_path, workdir):
  cfg = tiny_config('fedavg')
  result = train.train_and_evaluate(cfg, workdir)
  exp = train.build(cfg)
  for gs in result['state'].groups:
    assert len(jax.tree.leaves(gs.params)[0].sharding.device_set) == len(jax.devices())
  enc, dec, heads = _real_views(exp, result['state'])
  arrays = {f'{name}{jax.tree_util.keystr(path)}': x
            for name, tree in (('enc', enc), ('dec', dec), ('heads', heads))
            for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
  np.savez(out_path, num_devices=len(jax.devices()),
           num_padded_clients=sum(g.num_total for g in exp.fed.groups),
           eval=json.dumps(result['eval']), **arrays)


if __name__ == '__main__':
  main(*sys.argv[1:])
