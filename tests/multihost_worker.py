"""One process of a smoke run (SGD, `config(ALGORITHM)`); process 0 saves its final model
rows (`agreement.model_rows`).

Used by test_multihost.py (also as one process over 4 devices). The distributed runtime comes from the environment
(JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID); without it the
run is one process over every visible device.
A run stopped by SIGTERM exits as `fedjax_mtl.main` does (75, one line from process 0).
Usage: multihost_worker.py OUT.npz WORKDIR [ALGORITHM]
"""

import json
import os
import sys

import numpy as np

import agreement
from conftest import tiny_config
from fedjax_mtl import distributed, experiment, preempt, train


def config(algorithm: str = 'hca2'):
  """hca2: 2 rounds (the 4-device run); fedavg: 4 rounds, checkpoints at the end only (the
  two-process run that a SIGTERM stops); many_fedavg: the many-task setting's FedAvg
  (`test_manytask.tiny`), 3 rounds. SGD: runs on other meshes agree to rounding
  (agreement.py)."""
  if algorithm == 'many_fedavg':
    from test_manytask import tiny
    return tiny('fedavg', num_rounds=3, **agreement.SGD)
  rounds = {'hca2': 2, 'fedavg': 4}[algorithm]
  return tiny_config(algorithm, num_rounds=rounds, checkpoint_every=rounds, **agreement.SGD)


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


def main(out_path, workdir, algorithm='hca2'):
  cfg = config(algorithm)
  import jax
  try:
    result = train.train_and_evaluate(cfg, workdir)
  except preempt.Stopped as e:
    if jax.process_index() == 0:
      print(e, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(preempt.EXIT_CODE)
  state = distributed.host_get(result['state'])  # collective: every process
  if algorithm == 'many_fedavg':
    if jax.process_index() == 0:
      from fedjax_mtl.manytask import run as run_lib
      mesh = distributed.client_mesh(cfg)
      np.savez(out_path, num_devices=len(jax.devices()), num_processes=jax.process_count(),
               mesh_processes=len({d.process_index for d in mesh.devices.flat}),
               num_slots=run_lib.build_run(cfg).setting.num_slots,
               eval=json.dumps(result['eval']), **agreement.many_task_rows(state))
    return
  exp = experiment.build(cfg)
  if jax.process_index() != 0:
    return
  arrays = agreement.model_rows(exp, [gs.params for gs in state.groups])
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
