"""Multi-process and Flower: the smoke round as 2 processes x 2 CPU devices against
1 x 4 (`--only=multihost`), and in Flower's simulation engine against the engine's
(`--only=flower`).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from benchmarks.common import ROOT, algorithm_config
from fedjax_mtl import train


def bench_multihost(rounds: int = 5, algorithm: str = 'hca2') -> dict:
  """The smoke config for `rounds` rounds as two processes with 2 CPU devices each
  (127.0.0.1, one shared workdir) and as one process with 4: the median round time
  without evaluation (rounds 2..rounds-1; round 1 and the last are left out), and the
  collectives in the round's programs (`round_collectives`, 4 devices)."""
  import socket
  import subprocess
  import tempfile
  flags = os.environ.get('XLA_FLAGS', '')
  cmd = [sys.executable, '-m', 'fedjax_mtl.main', f'--config=configs/{algorithm}.py:smoke',
         f'--config.num_rounds={rounds}', f'--config.eval_every={rounds}',
         '--config.progress=false']

  def run(n_proc, devices, wd):
    with socket.socket() as sock:
      sock.bind(('127.0.0.1', 0))
      port = sock.getsockname()[1]
    procs = []
    for i in range(n_proc):
      env = dict(os.environ, XLA_FLAGS=f'{flags} --xla_force_host_platform_device_count='
                 f'{devices}')
      if n_proc > 1:
        env.update(JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', JAX_NUM_PROCESSES=str(n_proc),
                   JAX_PROCESS_ID=str(i))
      procs.append(subprocess.Popen(cmd + [f'--workdir={wd}'], cwd=ROOT, env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for p in procs:
      _, err = p.communicate()
      if p.returncode:
        raise RuntimeError(f'{n_proc}-process run failed: {err[-2000:]}')
    with open(os.path.join(wd, 'timing.jsonl')) as f:
      rows = [json.loads(line) for line in f]
    steady = [r['seconds'] for r in rows if 1 < r.get('round', 0) < rounds and 'seconds' in r]
    return float(np.median(steady))

  out = {}
  with tempfile.TemporaryDirectory() as tmp:
    run(1, 4, os.path.join(tmp, 'warm'))  # fills the compilation cache for process 0
    out['one_process_4dev_round_s'] = run(1, 4, os.path.join(tmp, 'one'))
    out['two_processes_2dev_round_s'] = run(2, 2, os.path.join(tmp, 'two'))
    out['round_time_ratio'] = out['two_processes_2dev_round_s'] / out['one_process_4dev_round_s']
    probe = subprocess.run(
        [sys.executable, '-c', 'import json; from benchmarks import engine; '
         f'print(json.dumps(engine.round_collectives({algorithm!r})))'],
        cwd=ROOT, capture_output=True, text=True,
        env=dict(os.environ, XLA_FLAGS=f'{flags} --xla_force_host_platform_device_count=4'))
    if probe.returncode:
      raise RuntimeError(probe.stderr[-2000:])
    out.update(json.loads(probe.stdout.strip().splitlines()[-1]))
  return out


def bench_flower(rounds: int = 7, algorithm: str = 'hca2', workers: int | None = None) -> dict:
  """The smoke config for `rounds` rounds in the engine (one process, every client
  group one jitted call) and in Flower's simulation engine (`fedjax_mtl.flower`: one
  ClientApp call per client in `workers` Ray workers, the server rule jitted in this
  process): median round time of rounds 2..rounds-1 (no evaluation), and where the
  Flower round's time goes: building the messages, waiting for the clients (their
  decode + local round, and Flower's transport), aggregating (decoding the uploads and
  the rule); the clients' own seconds; the array bytes each way."""
  import tempfile
  from fedjax_mtl.flower import simulate
  workers = workers or os.cpu_count() or 1
  cfg = algorithm_config(algorithm, 'smoke')
  # Neither run evaluates or checkpoints in the timed rounds (a Flower run keeps no
  # checkpoints; its evaluation is a separate message round).
  cfg.num_rounds, cfg.eval_every, cfg.checkpoint_every, cfg.progress = rounds, rounds, rounds, False
  steady = lambda rows: [r for r in rows if 1 < r['round'] < rounds]
  out = {}
  with tempfile.TemporaryDirectory() as tmp:
    train.train_and_evaluate(cfg, os.path.join(tmp, 'engine'))
    with open(os.path.join(tmp, 'engine', 'timing.jsonl')) as f:
      rows = [json.loads(line) for line in f]
    out['engine_round_s'] = float(np.median([r['seconds'] for r in steady(
        [r for r in rows if 'seconds' in r])]))
    strategy = simulate.simulate(cfg, os.path.join(tmp, 'flower'), num_workers=workers)
  t = steady(strategy.timing)
  med = lambda k: float(np.median([r[k] for r in t]))
  out['flower_round_s'] = med('messages') + med('clients') + med('aggregate')
  out['round_time_ratio'] = out['flower_round_s'] / out['engine_round_s']
  out['flower_messages_s'] = med('messages')
  out['flower_wait_for_clients_s'] = med('clients')
  out['flower_aggregate_s'] = med('aggregate')
  out['client_local_round_s'] = float(np.median([x for r in t for x in r['client_train']]))
  out['client_seconds_per_worker'] = float(np.median([sum(r['client_train']) for r in t])) / \
      min(workers, strategy.exp.fed.num_clients)
  out['transport_and_scheduling_s'] = med('clients') - out['client_seconds_per_worker']
  out['mb_down'] = med('bytes_down') / 1e6
  out['mb_up'] = med('bytes_up') / 1e6
  out['workers'] = workers
  out['clients'] = strategy.exp.fed.num_clients
  return out
