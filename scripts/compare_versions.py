"""Same-machine, interleaved timing of two checkouts of fedjax_mtl (old vs this one).

Starts `scripts/bench.py --serve=W` of each checkout (its own package first on
PYTHONPATH, this interpreter), lets both build and warm up, then alternates single
timed calls, flipping the order every round. Prints best and median seconds and
the ratio new / old (below 1 means this checkout is faster):

    git worktree add /tmp/old <commit>
    python scripts/compare_versions.py --old=/tmp/old --workloads hca2 swin_t_224 --rounds 8

A workload must exist in both checkouts' `bench.py` `SERVE` table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from compare_torch import Worker, alternate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _worker(checkout: str, workload: str) -> Worker:
  env = dict(os.environ, PYTHONPATH=checkout + os.pathsep + os.environ.get('PYTHONPATH', ''))
  return Worker([sys.executable, os.path.join(checkout, 'scripts', 'bench.py'),
                 f'--serve={workload}'], env=env)


def compare(workload: str, old: str, rounds: int) -> dict:
  """Alternating timed calls of `workload` in the old checkout and in this one."""
  workers = {}
  try:
    for name, root in (('old', old), ('new', ROOT)):  # one build at a time
      workers[name] = _worker(root, workload)
    times = alternate(workers, rounds)
  finally:
    for w in workers.values():
      w.close()
  out = {'workload': workload, 'rounds': rounds, 'times': times}
  for name, ts in times.items():
    out[f'{name}_best_s'] = min(ts)
    out[f'{name}_median_s'] = statistics.median(ts)
  out['new_over_old_best'] = out['new_best_s'] / out['old_best_s']
  out['new_over_old_median'] = out['new_median_s'] / out['old_median_s']
  print(f"{workload:13s} old best {out['old_best_s']:.3f} s median {out['old_median_s']:.3f} s"
        f" | new best {out['new_best_s']:.3f} s median {out['new_median_s']:.3f} s"
        f" | new/old best {out['new_over_old_best']:.3f} median {out['new_over_old_median']:.3f}",
        flush=True)
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--old', required=True, help='root of the other checkout')
  p.add_argument('--workloads', nargs='+', default=['hca2', 'swin_t_224'],
                 help='bench.py SERVE workloads to time, each present in both checkouts '
                      '(default: hca2 swin_t_224)')
  p.add_argument('--rounds', type=int, default=8,
                 help='timed calls per checkout and workload, the order flipped every round '
                      '(default: %(default)s)')
  p.add_argument('--json', default='', help='also write the results to this file')
  a = p.parse_args(argv)
  results = [compare(w, os.path.abspath(a.old), a.rounds) for w in a.workloads]
  if a.json:
    with open(a.json, 'w') as f:
      json.dump(results, f, indent=2)
  return results


if __name__ == '__main__':
  main()
