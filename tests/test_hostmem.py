"""fedjax_mtl.hostmem: glibc keeps XLA's freed scratch buffers mapped for the next call."""

import json
import os
import subprocess
import sys

import pytest

from fedjax_mtl import hostmem

# A program with a 64 MiB intermediate that XLA cannot fuse away (a product of two dots):
# after 5 warm-up calls, prints the fewest minor page faults of 5 more calls. (A call can
# start before the last one's scratch buffer is freed, so one call may still see fresh
# memory; the fewest is the steady state.)
_PROBE = r'''
import json, resource, sys
from fedjax_mtl import hostmem
applied = hostmem.reuse_freed_memory() if sys.argv[1] == 'reuse' else False
import jax, jax.numpy as jnp
f = jax.jit(lambda a, b, c: (a @ b) @ c)
a = jnp.ones((4096, 8)); b = jnp.ones((8, 4096)); c = jnp.ones((4096, 8))
for _ in range(5):
  f(a, b, c).block_until_ready()
faults = []
for _ in range(5):
  r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  out = f(a, b, c).block_until_ready()
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
print(json.dumps({'applied': applied, 'faults': min(faults), 'value': float(out[0, 0]),
                  'async_dispatch': jax.config.values['jax_cpu_enable_async_dispatch']}))
'''


def _probe(mode):
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  out = subprocess.run([sys.executable, '-c', _PROBE, mode], capture_output=True, text=True,
                       env=env, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_reuse_freed_memory_removes_the_scratch_buffer_page_faults():
  reuse, default = _probe('reuse'), _probe('default')
  assert reuse['value'] == default['value'] == 8.0 * 4096  # (a @ b) is all 8s
  if hostmem._mallopt() is None:  # not glibc: nothing to set, and it says so
    assert reuse['applied'] is False
    return
  assert reuse['applied'] is True
  # The scratch buffer is allocated on the calling thread, from the main heap.
  assert reuse['async_dispatch'] is False and default['async_dispatch'] is True
  # 64 MiB of 4 KiB pages is 16,384 faults when the buffer is mapped afresh.
  assert default['faults'] > 8000, default
  assert reuse['faults'] < 1000, reuse


def test_reuse_freed_memory_after_backend_start_warns_and_declines():
  import jax
  jax.numpy.zeros(1).block_until_ready()
  if hostmem._mallopt() is None:
    assert hostmem.reuse_freed_memory() is False
    return
  with pytest.warns(UserWarning, match='before the first JAX computation'):
    assert hostmem.reuse_freed_memory() is False


@pytest.mark.parametrize('platforms,expected', [('cpu', True), ('cpu,cuda', True),
                                                ('cuda', False), ('tpu,cpu', False)])
def test_cpu_only_follows_jax_platforms(platforms, expected):
  assert hostmem.cpu_only(platforms) is expected


def test_cpu_only_without_platforms_looks_for_accelerator_plugins(monkeypatch):
  monkeypatch.setattr(hostmem.importlib.util, 'find_spec', lambda name: None)
  monkeypatch.setattr(hostmem.importlib.metadata, 'entry_points', lambda group: [])
  assert hostmem.cpu_only('') is True
  monkeypatch.setattr(hostmem.importlib.metadata, 'entry_points', lambda group: ['xla_cuda12'])
  assert hostmem.cpu_only('') is False
  monkeypatch.setattr(hostmem.importlib.metadata, 'entry_points', lambda group: [])
  monkeypatch.setattr(hostmem.importlib.util, 'find_spec',
                      lambda name: object() if name == 'libtpu' else None)
  assert hostmem.cpu_only('') is False


def test_reuse_freed_memory_does_nothing_off_cpu(monkeypatch):
  monkeypatch.setattr(hostmem, 'cpu_only', lambda: False)
  monkeypatch.setattr(hostmem, '_applied', False)
  monkeypatch.setattr(hostmem, '_mallopt', lambda: pytest.fail('mallopt called off CPU'))
  assert hostmem.reuse_freed_memory() is False


# A heap block above 2 GiB (FedHCA2's aggregation at Swin-T scale has a 2.65 GB scratch
# buffer): with a trim threshold of 2^31 - 1, the largest positive value mallopt takes,
# glibc hands the block back on free and faults it in again on the next malloc.
_BIG_PROBE = r'''
import ctypes, json, resource
from fedjax_mtl import hostmem
applied = hostmem.reuse_freed_memory()
libc = ctypes.CDLL('libc.so.6')
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
n = (2**31) + (2**28)
faults = []
for _ in range(2):
  r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  p = libc.malloc(n)
  libc.memset(p, 1, n)
  libc.free(p)
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
print(json.dumps({'applied': applied, 'faults': faults}))
'''


def test_blocks_above_two_gib_stay_mapped():
  if hostmem._mallopt() is None:
    return  # not glibc: nothing to set (checked in the test above)
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  out = subprocess.run([sys.executable, '-c', _BIG_PROBE], capture_output=True, text=True,
                       env=env, check=True)
  res = json.loads(out.stdout.strip().splitlines()[-1])
  assert res['applied'] is True
  pages = ((2**31) + (2**28)) // 4096
  assert res['faults'][0] > pages // 2, res  # first use: mapped afresh
  assert res['faults'][1] < pages // 100, res  # reused: no trim in between


def test_release_freed_memory_runs_on_glibc():
  assert hostmem.release_freed_memory() == (hostmem._mallopt() is not None)
  assert hostmem.host_memory_bytes() > 2**28
