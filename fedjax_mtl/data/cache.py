"""Preprocessed, memory-mapped cache of a dataset split, and its reader.

Format (``FORMAT_VERSION`` 1): variable-size samples stored flat with offsets, so
nothing is padded (PASCAL images vary up to 500x500) and a sample is two slices::

  <cache_dir>/
    meta.json        dataset, split, tasks, ids, per-field dtype/channels,
                     human flags (PASCAL, full split, correctly indexed), version
    shapes.npy       int64 [N, 2]   (H, W) per sample
    offsets.npy      int64 [N + 1]  pixel offsets: sample i = pixels [o[i], o[i+1])
    <field>.npy      flat 1-D array of pixels * channels, memory-mapped on read
    COMPLETE         written last; a cache without it is never read

Fields: image (uint8, 3), semseg / human_parts / sal / edge (uint8, 1), depth
(float32, 1, 255 = ignore), normals stored compactly as normals_raw (uint8, 3, the
PNG values) + normals_valid (uint8, 1); they decode to exactly the reader's
float32 values (2 * raw / 255 - 1, 255 where invalid). Edges, human parts and
the PASCAL normals mask are therefore computed once, at build time.

Atomicity: a cache is built in a sibling temp directory, COMPLETE is written and
fsynced last, then the directory is renamed into place (atomic on POSIX), so a
crashed or concurrent build never leaves a readable partial cache.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from multiprocessing import get_context
from typing import Any, Sequence

import numpy as np

from fedjax_mtl.data.pascal_context import IGNORE, PascalContext, select_subset, default_drop

FORMAT_VERSION = 1
COMPLETE = 'COMPLETE'
_CHANNELS = {'image': 3, 'semseg': 1, 'human_parts': 1, 'sal': 1, 'edge': 1, 'depth': 1,
             'normals_raw': 3, 'normals_valid': 1}
_DTYPES = {'depth': 'float32'}  # everything else is uint8


class CacheError(RuntimeError):
  """A cache directory is missing, incomplete or of an unknown format."""


def _fields_for(tasks: Sequence[str]) -> list[str]:
  fields = ['image']
  for t in tasks:
    fields += ['normals_raw', 'normals_valid'] if t == 'normals' else [t]
  return fields


def encode_sample(sample: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Reader sample -> storage fields (normals split into raw uint8 + valid mask)."""
  out = {}
  for k, v in sample.items():
    if k == 'normals':
      valid = ~np.all(v == IGNORE, axis=-1)
      # Exact inverse of 2 * x / 255 - 1 for x in 0..255 (error << 0.5).
      raw = np.rint((np.where(valid[..., None], v, -1.).astype(np.float64) + 1.) * 127.5)
      out['normals_raw'] = raw.astype(np.uint8)
      out['normals_valid'] = valid.astype(np.uint8)
    else:
      out[k] = v
  return out


def decode_normals(raw: np.ndarray, valid: np.ndarray) -> np.ndarray:
  """Storage normals -> float32 [H,W,3] exactly as the reader computes them."""
  n = 2.0 * raw.astype(np.float32) / 255.0 - 1.0
  n[valid == 0] = IGNORE
  return n


_WORKER_READER: Any = None


def _init_worker(reader: Any) -> None:
  # The reader is sent once per worker process, not once per sample.
  global _WORKER_READER
  _WORKER_READER = reader


def _load_one(i: int) -> tuple[int, dict[str, np.ndarray]]:
  return i, encode_sample(_WORKER_READER[i])


def build_cache(reader: Any, cache_dir: str, *, workers: int = 0, overwrite: bool = False,
                verbose: bool = False) -> str:
  """Convert every sample of `reader` (PascalContext / NYUDv2) into `cache_dir`.

  Returns cache_dir. An existing complete cache is kept unless `overwrite`.
  `workers` > 0 decodes samples in that many processes.
  """
  cache_dir = os.path.abspath(os.fspath(cache_dir))
  if os.path.exists(cache_dir):
    if not overwrite:
      if os.path.isfile(os.path.join(cache_dir, COMPLETE)):
        return cache_dir
      raise CacheError(f'{cache_dir} exists but is not a complete cache (no {COMPLETE} marker); '
                       'remove it or pass overwrite=True')
  parent = os.path.dirname(cache_dir)
  os.makedirs(parent, exist_ok=True)
  tmp = os.path.join(parent, f'.{os.path.basename(cache_dir)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}')
  os.makedirs(tmp)
  try:
    _write_cache(reader, tmp, workers, verbose)
    if os.path.exists(cache_dir):  # overwrite: swap the old one out, then delete it
      old = tmp + '.old'
      os.rename(cache_dir, old)
      os.rename(tmp, cache_dir)
      shutil.rmtree(old, ignore_errors=True)
    else:
      os.rename(tmp, cache_dir)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return cache_dir


def _write_cache(reader: Any, out: str, workers: int, verbose: bool) -> None:
  n = len(reader)
  tasks = tuple(reader.tasks)
  shapes = np.array([reader.image_size(i) for i in range(n)], np.int64).reshape(n, 2)
  offsets = np.zeros(n + 1, np.int64)
  np.cumsum(shapes[:, 0] * shapes[:, 1], out=offsets[1:])
  fields = _fields_for(tasks)
  arrays = {
      f: np.lib.format.open_memmap(os.path.join(out, f + '.npy'), mode='w+',
                                   dtype=_DTYPES.get(f, 'uint8'),
                                   shape=(int(offsets[-1]) * _CHANNELS[f],))
      for f in fields}
  t0 = time.time()
  pool = None
  if workers > 0:
    pool = get_context('spawn').Pool(workers, initializer=_init_worker, initargs=(reader,))
  else:
    _init_worker(reader)
  try:
    results = pool.imap(_load_one, range(n), chunksize=4) if pool else map(_load_one, range(n))
    for i, enc in results:
      h, w = shapes[i]
      if enc['image'].shape[:2] != (h, w):
        raise CacheError(f'sample {i} ({reader.ids[i]}): decoded size {enc["image"].shape[:2]} '
                         f'!= header size {(h, w)}')
      for f in fields:
        c = _CHANNELS[f]
        arrays[f][offsets[i] * c:offsets[i + 1] * c] = np.asarray(enc[f]).reshape(-1)
      if verbose and (i + 1) % 200 == 0:
        print(f'  {i + 1}/{n} samples, {time.time() - t0:.0f}s', flush=True)
  finally:
    if pool:
      pool.close()
      pool.join()
    _init_worker(None)
  for a in arrays.values():
    a.flush()
  del arrays
  np.save(os.path.join(out, 'shapes.npy'), shapes)
  np.save(os.path.join(out, 'offsets.npy'), offsets)
  flags = None
  if isinstance(reader, PascalContext) and 'human_parts' in tasks:
    if len(reader) != len(reader.all_ids):
      raise CacheError('build PASCAL caches from the full split (no indices, no filtering) '
                       'so the human flags stay indexable')
    flags = [bool(x) for x in reader.human_flags()]
  meta = {
      'format_version': FORMAT_VERSION, 'dataset': reader.dataset_name, 'split': reader.split,
      'tasks': list(tasks), 'num_samples': n, 'ids': list(reader.ids),
      'fields': {f: {'dtype': _DTYPES.get(f, 'uint8'), 'channels': _CHANNELS[f]} for f in fields},
      'has_human_parts': flags, 'source_root': getattr(reader, 'root', None),
      'created': time.strftime('%Y-%m-%dT%H:%M:%S')}
  with open(os.path.join(out, 'meta.json'), 'w') as f:
    json.dump(meta, f)
  # Make the data durable before the marker, and the marker before the rename.
  for name in os.listdir(out):
    with open(os.path.join(out, name), 'rb+') as fh:
      os.fsync(fh.fileno())
  with open(os.path.join(out, COMPLETE), 'w') as f:
    f.write(f'{n} samples\n')
    f.flush()
    os.fsync(f.fileno())


def read_meta(cache_dir: str) -> dict[str, Any]:
  """meta.json of a complete cache; CacheError if missing or incomplete."""
  cache_dir = os.fspath(cache_dir)
  if not os.path.isdir(cache_dir):
    raise CacheError(f'cache not found: {cache_dir} (build it with scripts/prepare_data.py)')
  if not os.path.isfile(os.path.join(cache_dir, COMPLETE)):
    raise CacheError(f'incomplete cache: {cache_dir} has no {COMPLETE} marker '
                     '(a build was interrupted); delete it and rebuild with scripts/prepare_data.py')
  with open(os.path.join(cache_dir, 'meta.json')) as f:
    meta = json.load(f)
  if meta.get('format_version') != FORMAT_VERSION:
    raise CacheError(f'{cache_dir}: cache format {meta.get("format_version")} != {FORMAT_VERSION}; rebuild it')
  return meta


class CachedDataset:
  """Random-access reader of a cache; same interface and samples as the readers.

  A grain random-access data source (``__len__`` + ``__getitem__``); it pickles
  without its memory maps, which each worker process reopens lazily.
  `indices`, `reproduce_parts_index_bug` and `drop_images_without_humans` act as
  in `PascalContext`.
  """

  def __init__(self, cache_dir: str, tasks: Sequence[str] | None = None, *,
               indices: Sequence[int] | None = None, reproduce_parts_index_bug: bool = False,
               drop_images_without_humans: bool | None = None):
    """Open `cache_dir` (must hold the COMPLETE marker); `tasks` defaults to all cached."""
    self.cache_dir = os.path.abspath(os.fspath(cache_dir))
    self.meta = read_meta(self.cache_dir)
    cached = tuple(self.meta['tasks'])
    self.tasks = cached if tasks is None else tuple(tasks)
    missing = [t for t in self.tasks if t not in cached]
    if missing:
      raise CacheError(f'{self.cache_dir} does not hold tasks {missing}; cached: {list(cached)}')
    self.dataset_name = self.meta['dataset']
    self.split = self.meta['split']
    self.all_ids = list(self.meta['ids'])
    self.reproduce_parts_index_bug = bool(reproduce_parts_index_bug)
    full_flags = self.meta.get('has_human_parts')
    parts = 'human_parts' in self.tasks
    drop = parts and default_drop(self.tasks, drop_images_without_humans)
    self.source_indices, flags = select_subset(
        len(self.all_ids), indices, np.asarray(full_flags, bool) if parts and full_flags is not None else None,
        self.reproduce_parts_index_bug, drop)
    # Parts labels are stored correctly parsed; a (possibly misaligned) flag of 0
    # means the reference loader would not have parsed them, i.e. all 255.
    self._parts_flags = flags
    self.ids = [self.all_ids[i] for i in self.source_indices]
    self._shapes = np.load(os.path.join(self.cache_dir, 'shapes.npy'))
    self._offsets = np.load(os.path.join(self.cache_dir, 'offsets.npy'))
    self._fields = _fields_for(self.tasks)
    self._maps: dict[str, np.ndarray] | None = None

  def _arrays(self) -> dict[str, np.ndarray]:
    if self._maps is None:
      self._maps = {f: np.load(os.path.join(self.cache_dir, f + '.npy'), mmap_mode='r') for f in self._fields}
    return self._maps

  def __getstate__(self) -> dict[str, Any]:
    state = dict(self.__dict__)
    state['_maps'] = None  # memory maps are reopened per process
    return state

  def __len__(self) -> int:
    return len(self.ids)

  @property
  def has_human_parts(self) -> np.ndarray | None:
    """Per-position human flags used for 'human_parts' (None if not loaded)."""
    if self._parts_flags is not None:
      return self._parts_flags
    flags = self.meta.get('has_human_parts')
    return None if flags is None else np.asarray(flags, bool)[self.source_indices]

  def label_histograms(self, task: str = 'semseg') -> np.ndarray:
    """[len, 256] counts of each label value per sample of a one-channel uint8 label
    field (one pass over its memory map; human_parts as stored, flags not applied)."""
    if task not in self.tasks or _CHANNELS.get(task) != 1 or task in _DTYPES:
      raise CacheError(f'{self.cache_dir}: no uint8 label field {task!r} opened; '
                       f'opened: {list(self.tasks)}')
    flat = self._arrays()[task]
    out = np.zeros((len(self), 256), np.int64)
    for i, j in enumerate(self.source_indices):
      out[i] = np.bincount(flat[self._offsets[j]:self._offsets[j + 1]], minlength=256)
    return out

  def image_sizes(self) -> np.ndarray:
    """(H, W) of every sample, [len, 2]."""
    return self._shapes[self.source_indices]

  def image_size(self, i: int) -> tuple[int, int]:
    """(H, W) of sample i."""
    h, w = self._shapes[self.source_indices[i]]
    return int(h), int(w)

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    """Sample dict identical to the reader's for the same image and tasks."""
    if not -len(self) <= i < len(self):
      raise IndexError(f'index {i} out of range for {len(self)} samples')
    i = int(i) % len(self)
    j = int(self.source_indices[i])
    h, w = (int(x) for x in self._shapes[j])
    o0, o1 = int(self._offsets[j]), int(self._offsets[j + 1])
    arrs = self._arrays()

    def get(f: str) -> np.ndarray:
      c = _CHANNELS[f]
      a = np.array(arrs[f][o0 * c:o1 * c])  # copy: detach from the file
      return a.reshape((h, w, c) if c > 1 else (h, w))

    sample = {'image': get('image')}
    for t in self.tasks:
      if t == 'normals':
        sample[t] = decode_normals(get('normals_raw'), get('normals_valid'))
      elif t == 'human_parts' and self._parts_flags is not None and not self._parts_flags[i]:
        sample[t] = np.full((h, w), IGNORE, np.uint8)
      else:
        sample[t] = get(t)
    return sample

  def __repr__(self) -> str:
    return f'CachedDataset({self.cache_dir!r}, tasks={self.tasks}, n={len(self)})'


def prepare(dataset: str, root: str, split: str, out: str, *, tasks: Sequence[str] | None = None,
            workers: int = 0, overwrite: bool = False, verbose: bool = True) -> str:
  """Build the cache of one split of 'pascal' or 'nyud' at `out`; returns `out`."""
  if dataset == 'pascal':
    from fedjax_mtl.data.pascal_context import PASCAL_TASKS
    reader = PascalContext(root, split, tasks or PASCAL_TASKS, drop_images_without_humans=False)
  elif dataset == 'nyud':
    from fedjax_mtl.data.nyud import NYUD_TASKS, NYUDv2
    reader = NYUDv2(root, split, tasks or NYUD_TASKS)
  else:
    raise ValueError(f'unknown dataset {dataset!r}; valid: pascal, nyud')
  return build_cache(reader, out, workers=workers, overwrite=overwrite, verbose=verbose)
