"""Input pipeline: the training chunk source at 512x512 (`--only=pipeline`), and host
augmentation against a raw feed plus device augmentation (`--only=augment`).
"""

from __future__ import annotations

import os
import time

import jax

from benchmarks.common import PEAK_BF16_FLOPS, timeit
from benchmarks.models import model_flops


def bench_pipeline(num_chunks: int = 4, batch: int = 8, size: int = 512,
                   workers: int = 2) -> dict:
  """Training input pipeline alone: the engine's chunk source at `size`², all PASCAL tasks.

  One client of in-memory PASCAL-sized samples (375×500, 5 tasks) through
  `data.real.TrainChunks` (scale, crop with cat_max_ratio, flip, photometric
  distortion, normalise, pad, ignore regions, stacking): images per CPU second
  in this process (workers=0), and images per wall second with `workers`
  grain processes.
  """
  from fedjax_mtl.data import pipeline, real
  from fedjax_mtl.data import transforms as T
  source = pipeline.synthetic_pascal_source(16, (375, 500), 0)
  n = num_chunks * 2 * batch
  spec = real.GroupFeedSpec(dataset='pascal', client_ids=(0,), num_total=1, counts=(n,),
                            epochs=1, batch_size=batch, chunk_steps=2,
                            keys=('semseg', 'human_parts', 'sal', 'normals', 'edge'))
  client = [source[i % len(source)] for i in range(n)]
  chunks = real.TrainChunks([spec], [[client]], 2,
                            {'pascal': (size, size)}, 0,
                            {'pascal': T.train_transforms((size, size))})
  chunks[0]  # warm-up (first allocations)
  c0 = time.process_time()
  for i in range(num_chunks):
    chunks[num_chunks + i]
  per_cpu = n / (time.process_time() - c0)
  t0 = time.perf_counter()
  count = sum(int(el['mask'].sum()) * batch
              for el in real.iterate(chunks, 0, workers=workers))
  return {'size': size, 'batch': batch, 'images_per_cpu_s': per_cpu,
          f'images_per_s_{workers}_workers': count / (time.perf_counter() - t0),
          'cpu_count': os.cpu_count()}


class _SyntheticReader:
  """In-memory samples with the reader interface `data.cache.build_cache` reads."""
  dataset_name, split = 'pascal', 'train'

  def __init__(self, samples, tasks):
    self.samples, self.tasks = samples, tuple(tasks)
    self.ids = [f'{i:06d}' for i in range(len(samples))]

  def __len__(self):
    return len(self.samples)

  def image_size(self, i):
    return self.samples[i]['image'].shape[:2]

  def __getitem__(self, i):
    return self.samples[i]


class Cycle:
  """`source` repeated to `n` samples (also `scripts/rehearse.py`'s: a small split
  still fills the chunks)."""

  def __init__(self, source, n):
    self.source, self.n = source, n

  def __len__(self):
    return self.n

  def __getitem__(self, i):
    if not 0 <= int(i) < self.n:  # iteration stops at n
      raise IndexError(i)
    return self.source[int(i) % len(self.source)]

  def image_sizes(self):  # `real.max_image_size` reads the source's sizes
    return self.source.image_sizes()


def bench_augment(num_chunks: int = 3, batch: int = 8, size: int = 512,
                  raw_size: tuple[int, int] = (500, 500), repeats: int = 3,
                  target_mfu: float = 0.4, peak_flops: float = PEAK_BF16_FLOPS['H100']) -> dict:
  """Host augmentation against host decode+batch plus device augmentation (data.augment).

  One client of PASCAL-sized samples (375x500, all five tasks) through
  `data.real.TrainChunks` at `size`², batch `batch`, 2 steps per chunk, read from a
  memory-mapped cache of them (`data.cache`, as a run reads; normals decoded) and, for
  reference, from memory:
  * host: the transforms in the chunk source (today's path), images per CPU second;
  * raw: the same chunks with augment='device' (samples placed un-augmented in a
    `raw_size` canvas, PASCAL's largest image), images per CPU second;
  * device: the jitted `device_augment` function on such a raw chunk, images per wall
    second on this backend (all its cores).
  Host cores to feed one H100 at `target_mfu`: H100 images/s from the Swin-T train step's
  model FLOPs at `size` (`model_flops`, dense bf16 peak) over each path's per-core rate
  (from the cache).
  """
  import tempfile
  from fedjax_mtl.data import cache as cache_lib
  from fedjax_mtl.data import device_augment as DA
  from fedjax_mtl.data import pipeline, real
  from fedjax_mtl.data import transforms as T
  keys = ('semseg', 'human_parts', 'sal', 'normals', 'edge')
  samples = pipeline.synthetic_pascal_source(16, (375, 500), 0)
  n = (num_chunks + 1) * 2 * batch
  spec = real.GroupFeedSpec(dataset='pascal', client_ids=(0,), num_total=1, counts=(n,),
                            epochs=1, batch_size=batch, chunk_steps=2, keys=keys)
  ts = {'pascal': T.train_transforms((size, size))}
  out = {'size': size, 'batch': batch, 'raw_canvas': 'x'.join(map(str, raw_size))}

  def per_cpu_s(chunks):
    chunks[0]  # warm-up (first allocations, page cache)
    c0 = time.process_time()
    for i in range(1, num_chunks + 1):
      chunks[i]
    return num_chunks * 2 * batch / (time.process_time() - c0)

  with tempfile.TemporaryDirectory() as tmp:
    cached = cache_lib.CachedDataset(cache_lib.build_cache(
        _SyntheticReader(samples, keys), os.path.join(tmp, 'pascal_train')))
    for name, source in (('', cached), ('in_memory_', samples)):
      client = [Cycle(source, n)]
      out[f'{name}host_augment_images_per_cpu_s'] = per_cpu_s(
          real.TrainChunks([spec], [client], 1, {'pascal': (size, size)}, 0, ts))
      raw = real.TrainChunks([spec], [client], 1, {'pascal': (size, size)}, 0, ts,
                             augment='device', raw_size_of={'pascal': raw_size})
      out[f'{name}raw_feed_images_per_cpu_s'] = per_cpu_s(raw)
  out['raw_feed_ms_per_image'] = 1e3 / out['raw_feed_images_per_cpu_s']
  x = jax.device_put({k[2:]: v for k, v in raw[0].items() if k.startswith('x/')})
  augment = DA.make_chunk_augmenter(DA.config_from_transforms(ts['pascal']), 0)
  t0 = time.perf_counter()
  jax.block_until_ready(augment(x))
  out['device_augment_compile_s'] = time.perf_counter() - t0
  dt = timeit(lambda: jax.block_until_ready(augment(x)), repeats)
  out['device_augment_images_per_s'] = 2 * batch / dt
  out['device_augment_backend'] = jax.devices()[0].device_kind
  with jax.enable_x64(True):  # XLA's estimate (the crop-retry loop body counted once)
    cost = augment.jitted.lower(x).cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  out['device_augment_mflop_per_image'] = cost['flops'] / (2 * batch) / 1e6
  flops = model_flops(size, batch)  # one Swin-T train step (forward + backward + AdamW)
  gpu = target_mfu * peak_flops / (flops / batch)
  out['swin_t_gflop_per_train_image'] = flops / batch / 1e9
  out[f'h100_images_per_s_at_{target_mfu:.0%}_mfu'] = gpu
  out['host_cores_per_h100_host_augment'] = gpu / out['host_augment_images_per_cpu_s']
  out['host_cores_per_h100_device_augment'] = gpu / out['raw_feed_images_per_cpu_s']
  out['cpu_count'] = os.cpu_count()
  return out
