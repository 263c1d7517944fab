"""The vector instructions XLA:CPU generates code for, pinned across x86 hosts.

XLA compiles elementwise and reduction kernels for the host CPU's widest vector
instructions. A different width sums in a different order, so the same run gives
other numbers on an AVX-512 host than on an AVX2 host, and federated training
amplifies such rounding differences within a few rounds (measured on one AVX2
host: capping code generation at AVX instead of AVX2 moves the smoke run's
metrics; capping at AVX2 changes nothing; README "Reproducibility").

`pin('AVX2')` caps code generation with XLA's `--xla_cpu_max_isa`, so that every
x86 host with AVX2 (nearly all since 2013) generates the same kernels. What it
does not cover: Eigen's matrix-product blocking follows the host's cache sizes,
and thread counts change how work is split, so hosts with other caches or core
counts may still differ in the last bits. Like `hostmem`, it is a process-wide
setting read when JAX creates its backends: `fedjax_mtl.main` and the scripts
apply it first thing; the library never does by itself.
"""

from __future__ import annotations

import os
import platform

ISAS = ('native', 'SSE4_2', 'AVX', 'AVX2', 'AVX512')
_FLAG = '--xla_cpu_max_isa'


def _has_avx2() -> bool:
  try:
    with open('/proc/cpuinfo') as f:
      return any(line.startswith('flags') and ' avx2' in line for line in f)
  except OSError:
    return False


def pin(isa: str = 'AVX2') -> bool:
  """Cap XLA:CPU's code generation at `isa` (through XLA_FLAGS) before JAX starts.

  Does nothing for 'native', on non-x86 machines, on CPUs without AVX2 when
  `isa` is AVX2 or wider, or when XLA_FLAGS already sets the cap. Returns
  whether it set the cap.
  """
  if isa not in ISAS:
    raise ValueError(f'unknown cpu isa {isa!r}; valid choices: {", ".join(ISAS)}')
  flags = os.environ.get('XLA_FLAGS', '')
  if (isa == 'native' or _FLAG in flags
      or platform.machine().lower() not in ('x86_64', 'amd64')
      or (isa in ('AVX2', 'AVX512') and not _has_avx2())):
    return False
  os.environ['XLA_FLAGS'] = f'{flags} {_FLAG}={isa}'.strip()
  return True
