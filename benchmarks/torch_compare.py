"""Same-machine, interleaved timing of fedjax_mtl against the PyTorch reference: the
library side of `scripts/compare_torch.py` (its CLI and docstring).

`serve` is the worker side (`scripts/bench.py --serve=W`, `scripts/bench_torch.py
--serve=W`): build a workload, print 'ready', then time one call per stdin line.
`Worker` drives such a process, `alternate` interleaves timed calls of several,
`compare` times one workload on both sides, `check_swin` compares Swin-T stage
outputs with converted weights against the torch model's.

Imports neither jax nor torch at module level: `scripts/bench_torch.py` runs it in an
interpreter that may have torch only.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

# scripts/ of this checkout: the two --serve workers.
SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'scripts')
WORKLOADS = ('swin_t_128', 'swin_t_224', 'hca2', 'vit_lora')


def serve(make_run):
  """The worker side (`bench.py --serve`, `bench_torch.py --serve`): build the workload,
  print 'ready', then answer each stdin line with the seconds of one call."""
  run = make_run()
  print('ready', flush=True)
  for _ in sys.stdin:
    t0 = time.perf_counter()
    run()
    print(time.perf_counter() - t0, flush=True)


class Worker:
  """A `--serve` process: one line in, one duration out."""

  def __init__(self, cmd, env=None):
    self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, bufsize=1, env=env)
    line = self.proc.stdout.readline().strip()
    while line and line != 'ready':  # skip anything a library prints while building
      line = self.proc.stdout.readline().strip()
    if line != 'ready':
      raise RuntimeError(f'{cmd[1]} --serve exited before it was ready')

  def call(self) -> float:
    self.proc.stdin.write('run\n')
    return float(self.proc.stdout.readline())

  def close(self):
    self.proc.stdin.close()
    self.proc.wait()


def alternate(workers: dict, rounds: int) -> dict:
  """One timed call per worker per round, the order flipped every round: name -> times."""
  times = {name: [] for name in workers}
  items = list(workers.items())
  for r in range(rounds):
    for name, w in (items if r % 2 == 0 else items[::-1]):
      times[name].append(w.call())
  return times


def compare(workload, torch_python, rounds, jax_args=()):
  # Build one side at a time so that compilation does not overlap the other's warm-up.
  jax_w = Worker([sys.executable, os.path.join(SCRIPTS, 'bench.py'), f'--serve={workload}',
                  *jax_args])
  torch_w = Worker([torch_python, os.path.join(SCRIPTS, 'bench_torch.py'), f'--serve={workload}'])
  try:
    times = alternate({'jax': jax_w, 'torch': torch_w}, rounds)
  finally:
    jax_w.close()
    torch_w.close()
  out = {'workload': workload, 'rounds': rounds}
  for name, ts in times.items():
    out[f'{name}_best_s'] = min(ts)
    out[f'{name}_median_s'] = statistics.median(ts)
  out['speedup_best'] = out['torch_best_s'] / out['jax_best_s']
  out['speedup_median'] = out['torch_median_s'] / out['jax_median_s']
  out['speedup_per_round'] = [t / j for j, t in zip(times['jax'], times['torch'])]
  print(f"{workload:11s} jax best {out['jax_best_s']:.3f} s median {out['jax_median_s']:.3f} s"
        f" | torch best {out['torch_best_s']:.3f} s median {out['torch_median_s']:.3f} s"
        f" | speed-up best {out['speedup_best']:.2f}x median {out['speedup_median']:.2f}x",
        flush=True)
  return out


def check_swin(torch_python, tol=1e-4):
  """Stage outputs of our Swin-T with converted weights vs the torch model's."""
  import tempfile

  import jax
  import numpy as np

  from fedjax_mtl.models import convert, swin
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'ref.npz')
    subprocess.run([torch_python, os.path.join(SCRIPTS, 'bench_torch.py'), f'--dump_swin={path}'],
                   check=True)
    ref = dict(np.load(path))
  sd = {k[3:]: v for k, v in ref.items() if k.startswith('sd/')}
  model = swin.swin_t()
  params = convert.convert_state_dict(sd, model, source='mmseg')
  apply = jax.jit(lambda x: model.apply({'params': params}, x, train=False))
  rows = []
  for key in sorted(k for k in ref if k.startswith('x/')):
    size = key[2:]
    outs = apply(ref[key].transpose(0, 2, 3, 1))  # NCHW -> NHWC
    for i, out in enumerate(outs):
      want = ref[f'out{i}/{size}'].transpose(0, 2, 3, 1)
      got = np.asarray(out, np.float64)
      rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
      rows.append({'size': size, 'stage': i, 'shape': list(want.shape), 'rel_err': rel,
                   'max_abs_err': float(np.abs(got - want).max()), 'ok': rel < tol})
      print(f"{size:8s} stage {i} {str(want.shape):20s} rel err {rel:.2e} "
            f"max abs err {rows[-1]['max_abs_err']:.2e}", flush=True)
  if not all(r['ok'] for r in rows):
    raise SystemExit(f'error: a stage output differs from the torch reference by >= {tol} relative')
  return rows
