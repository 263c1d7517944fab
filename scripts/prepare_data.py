#!/usr/bin/env python
"""Convert a PASCAL-Context or NYUD-v2 split once into a memory-mapped cache.

Example:
  python scripts/prepare_data.py --dataset pascal --root /data/PASCALContext \\
      --split train --out /data/cache/pascal_train --workers 8

The cache (format in fedjax_mtl/data/cache.py) is written to a temp directory
and renamed into place with a COMPLETE marker, so an interrupted run leaves
nothing that a reader would accept. Read it with
``fedjax_mtl.data.cache.CachedDataset(out)``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

# Allow running from a checkout without installing the package.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fedjax_mtl.data.cache import CacheError, prepare  # noqa: E402
from fedjax_mtl.data.nyud import NYUD_TASKS  # noqa: E402
from fedjax_mtl.data.pascal_context import PASCAL_TASKS, DatasetFileError  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
  """CLI entry point; returns the process exit code."""
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--dataset', required=True, choices=('pascal', 'nyud'),
                 help='what --root holds: pascal (PASCAL-Context) or nyud (NYUD-v2)')
  p.add_argument('--root', required=True, help='dataset folder (PASCALContext/ or NYUDv2/)')
  p.add_argument('--split', default='train', choices=('train', 'val'),
                 help='which split to convert (default: %(default)s)')
  p.add_argument('--out', required=True, help='cache directory to create')
  p.add_argument('--tasks', nargs='*', default=None,
                 help=f'subset of tasks (default: all; pascal: {" ".join(PASCAL_TASKS)}; '
                      f'nyud: {" ".join(NYUD_TASKS)})')
  p.add_argument('--workers', type=int, default=0, help='decoding processes (0 = in process)')
  p.add_argument('--overwrite', action='store_true', help='replace an existing cache')
  p.add_argument('--quiet', action='store_true',
                 help='print only errors (no progress lines, no final "cache ready" line)')
  a = p.parse_args(argv)
  t0 = time.time()
  try:
    out = prepare(a.dataset, a.root, a.split, a.out, tasks=a.tasks, workers=a.workers,
                  overwrite=a.overwrite, verbose=not a.quiet)
  except (FileNotFoundError, DatasetFileError, CacheError, ValueError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  if not a.quiet:
    print(f'cache ready: {out} ({time.time() - t0:.1f}s)')
  return 0


if __name__ == '__main__':
  sys.exit(main())
