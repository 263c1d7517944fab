"""Host-memory reuse for runs on the CPU backend.

XLA:CPU allocates a compiled program's scratch buffer with `malloc` on every call and
frees it when the call returns. glibc serves blocks above its mmap threshold (32 MiB at
most) with a fresh `mmap` and returns them with `munmap`, so every call of a large program
faults its whole scratch buffer in again, 4 KiB at a time. A Swin-T training step at
224×224, batch 8, takes about 320,000 page faults (1.27 GB) and spends 0.7–0.9 s of its
2.5 s in the kernel that way (BENCHMARKS.md).

`reuse_freed_memory()` makes that memory stay mapped:
- glibc never uses `mmap` for large blocks of the main heap and never trims it (whatever
  the block size: the threshold is set to SIZE_MAX), so a freed scratch buffer stays in
  the heap for the next call;
- JAX's CPU client runs programs on the calling thread (`jax_cpu_enable_async_dispatch`
  off), so the scratch buffer is allocated by the main thread, from the main heap. (Other
  threads' arenas map any block larger than their 64 MiB heaps with `mmap` whatever
  `M_MMAP_MAX` says; forcing every thread onto one arena instead makes them wait on one
  malloc lock, which slowed small programs by 1.4×.)
From the second call on, the scratch buffer comes from memory that is already mapped. The
price: the process keeps its peak heap until it exits, and Python waits for each CPU
computation instead of queueing the next (the engine's round is one computation).

It must run before JAX creates its backends. It is a process-wide setting, so the library
never applies it by itself; `fedjax_mtl.main` and `scripts/bench.py` apply it
(`--reuse_host_memory`, on by default; it does nothing unless JAX runs on the CPU only),
and a notebook or script can call it first thing.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import sys
import warnings

# mallopt parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_NEVER_TRIM = -1  # becomes SIZE_MAX in glibc (see reuse_freed_memory)

_applied = False

# Accelerator plugins that do not register a `jax_plugins` entry point.
_ACCELERATOR_MODULES = ('jax_cuda12_plugin', 'jax_cuda13_plugin', 'jax_rocm7_plugin',
                        'jax_rocm60_plugin', 'libtpu')


def _glibc():
  """The C library when it is glibc, else None (macOS, musl, Windows)."""
  if not sys.platform.startswith('linux'):
    return None
  try:
    libc = ctypes.CDLL('libc.so.6')
    libc.gnu_get_libc_version  # glibc only
    return libc
  except (OSError, AttributeError):
    return None


def _mallopt():
  """glibc's `mallopt`, or None where the C library is not glibc."""
  libc = _glibc()
  return None if libc is None else libc.mallopt


def backends_initialised() -> bool:
  """Whether JAX has already created its backends (and with them XLA's threads)."""
  if 'jax' not in sys.modules:
    return False
  from jax._src import xla_bridge
  return xla_bridge.backends_are_initialized()


def cpu_only(platforms: str | None = None) -> bool:
  """Whether this process will run JAX on the CPU backend only.

  `platforms` defaults to `jax.config.jax_platforms` (from `JAX_PLATFORMS`). True when it
  names `cpu` first or, when it is empty, when no accelerator plugin (CUDA, ROCm, TPU) is
  installed. Initialises nothing.
  """
  if platforms is None:
    platforms = (sys.modules['jax'].config.jax_platforms if 'jax' in sys.modules
                 else os.environ.get('JAX_PLATFORMS'))
  if platforms:
    return platforms.split(',')[0].strip() == 'cpu'
  if importlib.metadata.entry_points(group='jax_plugins'):
    return False
  return not any(importlib.util.find_spec(name) is not None for name in _ACCELERATOR_MODULES)


def reuse_freed_memory() -> bool:
  """Keep freed host memory in glibc's heap for reuse (see the module docstring).

  Returns True when the setting is in force (also on a repeated call), False where JAX
  will not run on the CPU backend only (`cpu_only()`), where the C library is not glibc,
  or when JAX's backends already exist (then with a warning: the CPU client's dispatch
  mode is fixed when it is created).
  """
  global _applied
  if _applied:
    return True
  if not cpu_only():
    return False
  mallopt = _mallopt()
  if mallopt is None:
    return False
  if backends_initialised():
    warnings.warn('fedjax_mtl.hostmem.reuse_freed_memory() called after JAX created its '
                  'backends; call it before the first JAX computation', stacklevel=2)
    return False
  # The trim threshold is a size_t inside glibc; mallopt takes an int, and -1
  # converts to SIZE_MAX ("never trim"). The largest positive int, 2^31 - 1,
  # is not enough: a program whose scratch buffer exceeds 2 GiB (FedHCA2's
  # aggregation at Swin-T scale needs 2.65 GB) had its heap trimmed after
  # every call and faulted back in on the next (~500,000 faults per round).
  if not (mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM) == 1):
    return False
  import jax
  jax.config.update('jax_cpu_enable_async_dispatch', False)
  _applied = True
  return True


def host_memory_bytes() -> int:
  """This host's physical memory."""
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def host_cores() -> int:
  """The cores this process may run on (its CPU affinity where the OS has one)."""
  try:
    return len(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    return os.cpu_count() or 1


def release_freed_memory() -> bool:
  """Return the free pages of glibc's heaps to the system now (`malloc_trim(0)`),
  whatever `reuse_freed_memory` set; True where it ran (glibc only).

  For a process that ends one large computation and starts another (a rehearsal's
  fresh run, then its resumed run): the first one's freed buffers would otherwise
  stay resident, and the second's allocations need not fit in their holes."""
  libc = _glibc()
  if libc is None:
    return False
  libc.malloc_trim(0)
  return True
