"""Run several methods on one scenario with the same seeds; write a comparison table."""
# The command line of fedjax_mtl/compare.py, which holds the logic and the whole
# --help text (also `python -m fedjax_mtl.compare`).

import sys

from fedjax_mtl.compare import main

if __name__ == '__main__':
  from fedjax_mtl import cpu_isa, hostmem
  hostmem.reuse_freed_memory()  # as fedjax_mtl.main does on CPU-only runs
  cpu_isa.pin('AVX2')  # the same kernels on every AVX2 host (fedjax_mtl.cpu_isa)
  main(sys.argv[1:])
