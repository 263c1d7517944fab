"""Is every task of a dense benchmark learnable but unsolved? Trivial, ceiling, Local
and FedHCA2 per task, and where Local lies between the first two."""
# The command line of fedjax_mtl/task_band.py, which holds the logic and the whole
# --help text (also `python -m fedjax_mtl.task_band`).

import sys

from fedjax_mtl.task_band import main

if __name__ == '__main__':
  from fedjax_mtl import cpu_isa, hostmem
  hostmem.reuse_freed_memory()  # as fedjax_mtl.main does on CPU-only runs
  cpu_isa.pin('AVX2')  # the same kernels on every AVX2 host (fedjax_mtl.cpu_isa)
  main(sys.argv[1:])
