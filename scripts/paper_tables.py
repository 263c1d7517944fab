"""The papers' tables with ours beside them (`scripts/paper_tables.py`)."""
# The command line of fedjax_mtl/paper_tables.py, which holds the logic and the whole
# --help text (also `python -m fedjax_mtl.paper_tables`).

import sys

from fedjax_mtl.paper_tables import main

if __name__ == '__main__':
  from fedjax_mtl import cpu_isa, hostmem
  hostmem.reuse_freed_memory()  # as fedjax_mtl.main does on CPU-only runs
  cpu_isa.pin('AVX2')  # the same kernels on every AVX2 host (fedjax_mtl.cpu_isa)
  main(sys.argv[1:])
