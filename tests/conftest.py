"""Shared test setup: a persistent XLA cache, the CLI's XLA flags and the tiny engine config.

Engine tests compile the same round functions in several processes (the CLI
and multi-device subprocesses); the persistent compilation cache makes every
compile after the first a cache hit.
"""

import os
import subprocess
import sys
import tempfile

import pytest

os.environ.setdefault('JAX_COMPILATION_CACHE_DIR',
                      os.path.join(tempfile.gettempdir(), 'fedjax_mtl_test_xla_cache'))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.3')


def _add_xla_flag(flag: str) -> None:
  """Append `flag` to XLA_FLAGS unless it is there (this file is imported again by the
  xdist workers and by subprocesses that inherit XLA_FLAGS, whose value is part of the
  persistent cache's keys)."""
  flags = os.environ.get('XLA_FLAGS', '')
  if flag.split('=')[0] not in flags:
    os.environ['XLA_FLAGS'] = f'{flags} {flag}'.strip()


def _xla_knows(flag: str) -> bool:
  """Whether this jaxlib's XLA accepts `flag` (XLA aborts on an unknown one): asked of a
  fresh interpreter once; processes started from this one inherit the answer in
  XLA_FLAGS."""
  env = dict(os.environ, XLA_FLAGS=f'{os.environ.get("XLA_FLAGS", "")} {flag}',
             JAX_PLATFORMS='cpu')
  r = subprocess.run([sys.executable, '-c', 'import jax; jax.devices()'], env=env,
                     capture_output=True, timeout=120)
  return r.returncode == 0


# Tests run tiny programs whose time is mostly compilation: skip LLVM's optimisation
# passes (about half the compile time), and emit fusions with XLA:CPU's elemental IR
# emitters rather than its MLIR fusion emitters (2-3x faster to compile here: the smoke
# trainer 3.4 -> 1.3 s, the FedHCA2 aggregation 4.6 -> 2.8 s). Both change how programs
# are compiled, not what they compute; the library's own runs keep XLA's defaults.
_add_xla_flag('--xla_backend_optimization_level=0')
_EMITTERS = '--xla_cpu_use_fusion_emitters=false'
if _EMITTERS.split('=')[0] not in os.environ.get('XLA_FLAGS', '') and _xla_knows(_EMITTERS):
  _add_xla_flag(_EMITTERS)
# The vector-instruction cap `python -m fedjax_mtl.main` sets (fedjax_mtl.cpu_isa), here
# too: the runs tests start in subprocesses (the CLI, notebooks, multi-process and Flower
# workers, which inherit XLA_FLAGS) compute as the tests' own runs do and load the
# programs those compiled from the persistent cache (its keys include XLA_FLAGS).
from fedjax_mtl import cpu_isa  # noqa: E402  (imports nothing of JAX)

cpu_isa.pin('AVX2')


def tiny_config(algorithm: str = 'fedavg', **overrides):
  """The `smoke` variant (seconds per round), shared by engine and CLI tests."""
  from fedjax_mtl.defaults import base_config
  c = base_config('smoke', algorithm)
  c.progress = False
  return override(c, **overrides)


def override(c, **overrides):
  """`c` with dotted fields set (`override(c, **{'model.remat': True})`)."""
  for k, v in overrides.items():
    node = c
    *path, last = k.split('.')
    for p in path:
      node = node[p]
    node[last] = v
  return c


def fed_info(num_clients: int, decoder_client: tuple[int, ...]):
  """A `FedInfo` for rule tests on tiny pytrees: clients c0.. of one dataset 'p', one
  task each, decoder row k owned by client `decoder_client[k]`, 3 rounds."""
  from fedjax_mtl.algorithms import FedInfo
  k = len(decoder_client)
  return FedInfo(num_clients=num_clients, num_decoders=k, decoder_client=tuple(decoder_client),
                 decoder_names=tuple(f'd{i}' for i in range(k)),
                 client_names=tuple(f'c{i}' for i in range(num_clients)),
                 homo_groups=tuple(range(num_clients)), decoder_layers=('lin',), num_rounds=3,
                 client_keys=tuple(('p', f't{i}') for i in range(num_clients)),
                 decoder_keys=tuple(('p', f't{i}') for i in range(k)))


def assert_resumes_bitwise(config, tmp_path) -> tuple[dict, str]:
  """Runs `config` whole and, in another workdir, stopped after round 1 and resumed:
  asserts the two final states are equal to the bit; returns (the whole run's result,
  the resumed workdir)."""
  import jax
  import numpy as np
  from fedjax_mtl import train
  full = train.train_and_evaluate(config, str(tmp_path / 'full'))
  part = tmp_path / 'part'
  assert train.train_and_evaluate(config, str(part), stop_after=1)['interrupted']
  resumed = train.train_and_evaluate(config, str(part))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(full['state']),
               jax.device_get(resumed['state']))
  return full, part


def snapshot(d):
  """{relative path: bytes} of every file under d."""
  out = {}
  for root, _, files in os.walk(d):
    for f in files:
      p = os.path.join(root, f)
      out[os.path.relpath(p, d)] = open(p, 'rb').read()
  return out


# Files whose tests take longest, longest first (seconds of a cold-cache run on a 2-core
# CPU beside another 2-core job, 2026-12-07: test_algorithms_engine 267, test_flower 233,
# test_flower_deploy 230, test_sweep 195, test_real_engine 175, test_multihost 172, ...).
# The two xdist workers take whole files in collection order (`--dist loadfile`):
# longest first keeps one worker from running a long file alone at the end.
_LONG_FILES = ('test_algorithms_engine.py', 'test_flower.py', 'test_flower_deploy.py',
               'test_sweep.py', 'test_real_engine.py', 'test_multihost.py', 'test_engine.py',
               'test_tooling.py', 'test_participation.py', 'test_hca2.py', 'test_manytask.py',
               'test_feddea.py', 'test_cli.py', 'test_notebooks.py', 'test_preempt.py',
               'test_ntkfedavg.py', 'test_comm.py', 'test_many_sweep.py', 'test_ntk_dense.py',
               'test_hca2_math.py', 'test_rehearse.py', 'test_topk.py', 'test_device_augment.py')


def pytest_collection_modifyitems(config, items):
  rank = {f: i for i, f in enumerate(_LONG_FILES)}
  items.sort(key=lambda it: rank.get(it.path.name, len(rank)))  # stable: others keep their order


@pytest.fixture(scope='session')
def reference_run(tmp_path_factory):
  """`get(config) -> agreement.Reference`: the one-device run of a config, run once per
  test process and shared by the files comparing other programs with it
  (test_multihost, test_flower)."""
  import agreement
  runs = {}

  def get(config):
    key = config.to_json_best_effort(sort_keys=True)
    if key not in runs:
      wd = tmp_path_factory.mktemp('reference') / 'wd'
      runs[key] = agreement.run_reference(config, str(wd))
    return runs[key]

  return get
