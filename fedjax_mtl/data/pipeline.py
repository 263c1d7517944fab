"""grain input pipelines: per-client shuffled, augmented, batched numpy batches.

A client's epoch is: permute its indices with a generator seeded by (seed, epoch),
apply the transforms (each grain RandomMap gets its own stream, seeded from
(seed, epoch, transform position) and the element position), stack into batches
of `batch_size` dropping the remainder. Everything is deterministic in
(seed, epoch) and independent of `worker_count` (grain workers process whole
batches and grain restores their order). Clients sharing a source should use
distinct seeds (e.g. base_seed * 1000 + client_id) so their augmentation
streams differ.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from typing import Any, Iterator, Mapping, Sequence

import grain
import numpy as np

from fedjax_mtl.data.transforms import train_transforms

Batch = dict[str, np.ndarray]


def seed32(*parts: int) -> int:
  """A 32-bit seed derived from integer parts (grain wants ints below 2**32)."""
  return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def epoch_order(indices: Sequence[int], seed: int, epoch: int) -> np.ndarray:
  """The client's indices permuted deterministically for (seed, epoch)."""
  idx = np.asarray(indices, np.int64).reshape(-1)
  rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch), 0x5EED]))
  return idx[rng.permutation(len(idx))]


class _Reindexed:
  """Picklable view of `source` at the positions `order` (a grain data source)."""

  def __init__(self, source: Any, order: np.ndarray):
    self.source, self.order = source, np.asarray(order, np.int64)

  def __len__(self) -> int:
    return len(self.order)

  def __getitem__(self, i: int) -> Any:
    return self.source[int(self.order[i])]


def _apply(ds: grain.MapDataset, transforms: Sequence[Any], seed: int) -> grain.MapDataset:
  for k, t in enumerate(transforms):
    if isinstance(t, grain.transforms.RandomMap):
      ds = ds.random_map(t, seed=seed32(seed, k))
    elif isinstance(t, grain.transforms.Map):
      ds = ds.map(t)
    elif callable(t):
      ds = ds.map(t)
    else:
      raise TypeError(f'transform {t!r} is not a grain Map/RandomMap or callable')
  return ds


def _ensure_absl_flags_parsed() -> None:
  # grain 0.2.18 reads an absl flag in mp_prefetch when JAX is installed and
  # raises UnparsedFlagAccessError in scripts not run via absl.app
  # (google/grain#1355, fixed upstream later). Marking flags parsed keeps their
  # defaults; programs that already parsed flags are unaffected.
  from absl import flags
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def exit_with_parent(worker_index: int = 0, worker_count: int = 0, *, parent: int,
                     poll_seconds: float = 1.0) -> None:
  """In a grain worker: exit when `parent` (the pid of the process that started
  it, passed from there) is no longer its parent.

  A run killed with SIGKILL (e.g. by the OOM killer) cannot stop its workers, and
  they would keep their memory and shared-memory buffers until killed by hand. A
  daemon thread polls the parent pid and ends the worker once it has changed (also
  when the run died before this worker started)."""
  del worker_index, worker_count

  def watch():
    while os.getppid() == parent:
      time.sleep(poll_seconds)
    os._exit(0)  # the parent is gone: nobody reads this worker's batches

  threading.Thread(target=watch, name='exit_with_parent', daemon=True).start()


def iterate_dataset(ds: grain.MapDataset, worker_count: int, read_threads: int,
             prefetch_batches: int) -> Iterator[Batch]:
  threads = read_threads if worker_count == 0 else min(read_threads, 1)
  it_ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=threads,
                                               prefetch_buffer_size=prefetch_batches if threads else 0))
  if worker_count > 0:
    _ensure_absl_flags_parsed()
    it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(
        num_workers=worker_count, per_worker_buffer_size=max(prefetch_batches, 1)),
        worker_init_fn=functools.partial(exit_with_parent, parent=os.getpid()))
  it = iter(it_ds)
  try:
    if worker_count > 0:
      for batch in it:
        # Worker batches arrive in shared memory (grain SharedMemoryArray); copy to
        # plain arrays so the segments are released now, not at interpreter exit
        # (where grain's finaliser fails and leaks them).
        yield {k: np.array(v) for k, v in batch.items()}
    else:
      yield from it
  finally:
    close = getattr(it, 'close', None)
    if close is not None:
      close()  # stops grain worker processes promptly


def train_loader(source: Any, indices: Sequence[int] | None, batch_size: int, seed: int, epoch: int,
                 transforms: Sequence[Any], worker_count: int = 0, *, read_threads: int = 1,
                 prefetch_batches: int = 2) -> Iterator[Batch]:
  """One epoch of a client's training batches (dict of [B, ...] arrays), drop_last.

  source: random-access dataset (PascalContext, NYUDv2, CachedDataset, list).
  indices: the client's positions in `source` (None = all).
  transforms: grain Map/RandomMap objects (e.g. transforms.train_transforms(size)).
  worker_count: grain worker processes (0 = in this process).
  read_threads: prefetch threads in this process when worker_count == 0
    (0 = fully synchronous, which is what a per-core benchmark wants).
  """
  if batch_size < 1:
    raise ValueError(f'batch_size must be >= 1, got {batch_size}')
  idx = np.arange(len(source)) if indices is None else indices
  order = epoch_order(idx, seed, epoch)
  ds = grain.MapDataset.source(_Reindexed(source, order))
  ds = _apply(ds, transforms, seed32(seed, epoch, 1))
  ds = ds.batch(batch_size, drop_remainder=True)
  return iterate_dataset(ds, worker_count, read_threads, prefetch_batches)


def eval_loader(source: Any, batch_size: int, transforms: Sequence[Any], indices: Sequence[int] | None = None,
                worker_count: int = 0, *, read_threads: int = 1, prefetch_batches: int = 2) -> Iterator[Batch]:
  """Evaluation batches in source order, keeping the last partial batch."""
  idx = np.arange(len(source)) if indices is None else np.asarray(indices, np.int64)
  ds = grain.MapDataset.source(_Reindexed(source, idx))
  ds = _apply(ds, transforms, 0).batch(batch_size, drop_remainder=False)
  return iterate_dataset(ds, worker_count, read_threads, prefetch_batches)


def stack_clients(batches_per_client: Sequence[Mapping[str, np.ndarray]]) -> Batch:
  """Stack per-client batches (same keys/shapes) into [num_clients, B, ...] arrays."""
  if not batches_per_client:
    raise ValueError('stack_clients needs at least one client batch')
  keys = set(batches_per_client[0])
  for c, b in enumerate(batches_per_client):
    if set(b) != keys:
      raise ValueError(f'client {c} batch has fields {sorted(b)}, client 0 has {sorted(keys)}')
  out = {}
  for k in batches_per_client[0]:
    shapes = {np.shape(b[k]) for b in batches_per_client}
    if len(shapes) != 1:
      raise ValueError(f'field {k!r} has different shapes across clients: {sorted(shapes)}')
    out[k] = np.stack([np.asarray(b[k]) for b in batches_per_client])
  return out


# --------------------------------------------------------------------------- benchmark

def synthetic_pascal_source(num_images: int = 16, hw: tuple[int, int] = (375, 500), seed: int = 0) -> list[dict]:
  """In-memory PASCAL-like samples (random image, blocky labels, all 5 tasks)."""
  rng = np.random.default_rng(seed)
  h, w = hw
  out = []
  for _ in range(num_images):
    # Labels from a coarse random grid (nearest-upsampled) so crops contain a few
    # classes, like real segmentation maps, and cat_max_ratio retries are realistic.
    coarse = rng.integers(0, 21, size=(h // 50 + 1, w // 50 + 1)).astype(np.uint8)
    seg = np.kron(coarse, np.ones((50, 50), np.uint8))[:h, :w]
    n = rng.normal(size=(h, w, 3)).astype(np.float32)
    n /= np.linalg.norm(n, axis=-1, keepdims=True)
    parts = np.where(seg == 15, rng.integers(0, 7, size=(h, w)), 255).astype(np.uint8)
    out.append({'image': rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8), 'semseg': seg,
                'human_parts': parts, 'sal': (seg > 10).astype(np.uint8), 'normals': n,
                'edge': (rng.random((h, w)) < 0.05).astype(np.uint8)})
  return out


def benchmark_pipeline(num_batches: int = 8, batch_size: int = 8, size: tuple[int, int] = (512, 512),
                       image_hw: tuple[int, int] = (375, 500), worker_count: int = 0,
                       seed: int = 0) -> dict[str, float]:
  """Training images/s of the input pipeline alone (scale, crop, flip, jitter, normalise, pad).

  Runs synchronously in this process with worker_count=0 (one core), and reports
  images per wall second and per CPU second of this process (robust to other load).
  """
  source = synthetic_pascal_source(16, image_hw, seed)
  n_img = num_batches * batch_size
  indices = np.arange(n_img) % len(source)
  ts = train_transforms(size)
  # Warm-up batch (imports, first allocations) is not timed.
  next(iter(train_loader(source, indices[:batch_size], batch_size, seed, 99, ts, worker_count, read_threads=0)))
  w0, c0 = time.perf_counter(), time.process_time()
  count = 0
  for b in train_loader(source, indices, batch_size, seed, 0, ts, worker_count, read_threads=0):
    count += b['image'].shape[0]
  wall, cpu = time.perf_counter() - w0, time.process_time() - c0
  return {'images': count, 'wall_s': wall, 'cpu_s': cpu, 'images_per_s': count / wall,
          'images_per_cpu_s': count / max(cpu, 1e-9), 'worker_count': worker_count,
          'size': tuple(size), 'source_hw': tuple(image_hw), 'cpu_count': os.cpu_count()}


if __name__ == '__main__':
  # python -m fedjax_mtl.data.pipeline  -> one-core throughput of the train pipeline.
  r = benchmark_pipeline(num_batches=16)
  print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()})
