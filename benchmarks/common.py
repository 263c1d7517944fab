"""Helpers the benchmark subjects share: timing, peak memory, peak FLOP/s, configs, logs."""

from __future__ import annotations

import json
import os
import resource
import time

import jax

# The repository root (configs/, scripts/): benchmarks/ sits beside fedjax_mtl/.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Dense bf16 matmul peak (FLOP/s) by device kind, for MFU.
PEAK_BF16_FLOPS = {'H100': 989e12, 'H200': 989e12, 'A100': 312e12}


def timeit(fn, repeats):
  """Best-of-`repeats` wall time of `fn()` (which must block on its result)."""
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times)


def peak_memory_mb() -> float:
  """Peak device memory where the backend reports it, else the process's max RSS."""
  stats = jax.devices()[0].memory_stats() or {}
  if 'peak_bytes_in_use' in stats:
    return stats['peak_bytes_in_use'] / 2**20
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_flops(override_tflops: float = 0.0) -> float:
  """The first device's dense bf16 peak FLOP/s (`PEAK_BF16_FLOPS` by device kind; 0 when
  unknown, e.g. on CPU), or `override_tflops` TFLOP/s when given."""
  kind = jax.devices()[0].device_kind
  return override_tflops * 1e12 or next(
      (v for k, v in PEAK_BF16_FLOPS.items() if k in kind), 0.0)


def algorithm_config(algorithm: str, variant: str = 'default'):
  """The config of `configs/<algorithm>.py:<variant>` (progress off)."""
  import importlib.util
  spec = importlib.util.spec_from_file_location(
      f'cfg_{algorithm}', os.path.join(ROOT, 'configs', f'{algorithm}.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  cfg = mod.get_config(None if variant == 'default' else variant)
  cfg.progress = False
  return cfg


def jsonl_log(path: str):
  """A logger that prints each workload's result as it comes and, with --json, also
  appends it to `<json>.jsonl` (partial results survive a run cut short)."""
  def log(line: str):
    print(line, flush=True)
    if path:
      with open(path + '.jsonl', 'a') as f:
        f.write(json.dumps({'line': line, 'time': time.time()}) + '\n')
  return log
