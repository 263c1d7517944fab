"""Same-machine, interleaved timing of fedjax_mtl against the PyTorch reference.

Starts `scripts/bench.py --serve=W` (this interpreter, JAX) and
`scripts/bench_torch.py --serve=W` (an interpreter with torch), lets both build and
warm up, then asks them for one call at a time, alternating which goes first, so that
both see the same machine state. Reports best and median seconds per call for each and
the speed ratio (PyTorch time / JAX time; above 1 means fedjax_mtl is faster):

    python scripts/compare_torch.py --torch_python=/path/to/torch-env/bin/python \\
        --workloads swin_t_128 swin_t_224 hca2 --rounds 8

`--check_swin` instead checks correctness: the torch side writes a randomised mmseg-named
Swin-T state dict with its four stage outputs at 512x512 and 448x576 (window padding at
both), the state dict goes through `fedjax_mtl.models.convert`, and the relative error
||ours - ref|| / ||ref|| of each stage output is reported (and must be under `--tol`):

    python scripts/compare_torch.py --torch_python=/path/to/torch-env/bin/python --check_swin

Workloads: `swin_t_128`, `swin_t_224` (Swin-T + decoder + head local step, batch 8),
`hca2` (FedHCA2 aggregation at the paper's scale) and `vit_lora` (ViT-B/32 at 224, LoRA
rank 16 on q/v + head, batch 32, backbone frozen); see the two scripts' docstrings.
Extra arguments for the JAX side go after `--jax_args` (e.g. `--no-reuse_host_memory`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

# Worker and alternate: for scripts/compare_versions.py, which imports them from here.
from benchmarks.torch_compare import (WORKLOADS, Worker, alternate,  # noqa: E402,F401
                                      check_swin, compare)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--torch_python', required=True, help='a Python interpreter with torch')
  p.add_argument('--workloads', nargs='+', default=list(WORKLOADS), choices=WORKLOADS,
                 help=f'workloads to time, one after the other (default: {" ".join(WORKLOADS)})')
  p.add_argument('--rounds', type=int, default=8,
                 help='timed calls per side and workload, the order alternating every round '
                      '(default: %(default)s)')
  p.add_argument('--check_swin', action='store_true',
                 help='check Swin-T stage outputs with converted weights instead of timing')
  p.add_argument('--tol', type=float, default=1e-4, help='relative error bound of --check_swin (default: %(default)s)')
  p.add_argument('--json', default='', help='also write the results to this file')
  p.add_argument('--jax_args', nargs=argparse.REMAINDER, default=[],
                 help='passed on to bench.py --serve; put it last, as it takes everything '
                      'after it')
  a = p.parse_args(argv)
  results = (check_swin(a.torch_python, a.tol) if a.check_swin else
             [compare(w, a.torch_python, a.rounds, a.jax_args) for w in a.workloads])
  if a.json:
    with open(a.json, 'w') as f:
      json.dump(results, f, indent=2)
  return results


if __name__ == '__main__':
  main()
