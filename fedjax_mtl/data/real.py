"""Real PASCAL-Context / NYUD-v2 data for the engine: caches, client sources, batch feeds.

Where the data is (`config.data`):
  data_dir   the folder holding `PASCALContext/` and `NYUDv2/` (or the
             environment variable FEDJAX_MTL_DATA_DIR);
  cache_dir  the preprocessed caches (default `<data_dir>/cache`), one per split:
             `pascal_train`, `pascal_val`, `nyud_train`, `nyud_val`, each built
             once by `scripts/prepare_data.py`. Training and evaluation read
             only the caches.

Training batches of a whole run are one grain `MapDataset` over (round, group,
chunk) in execution order. An element is one chunk of `data.chunk_steps` local
steps of every client of a group, stacked `[clients, steps, B, ...]`, with the
mask of real steps (clients with fewer batches and padding clients get masked
steps, as in the in-memory engine). A client's epoch order is drawn from
(data.seed, client, local epoch) and each sample's augmentation from
(data.seed, client, local epoch, position), so a round's data is a function of
the config and the round alone: worker processes, prefetching and resuming
change nothing.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterator, Sequence

import grain
import numpy as np

from fedjax_mtl import scenarios
from fedjax_mtl import tasks as tasks_lib
from fedjax_mtl.data import pipeline
from fedjax_mtl.data import transforms as T
from fedjax_mtl.data.cache import CacheError, CachedDataset
from fedjax_mtl.errors import ConfigError, check_choice

ENV_DATA_DIR = 'FEDJAX_MTL_DATA_DIR'
# Where training samples are augmented (`data.augment`): 'host' runs the
# transforms in the grain pipeline; 'device' ships raw samples in a fixed
# canvas and `data.device_augment` augments them on the accelerator.
AUGMENT_MODES = ('host', 'device')
DATASET_DIRS = {'pascal': 'PASCALContext', 'nyud': 'NYUDv2'}
TEST_SPLIT = 'val'


def resolve_data_dir(config) -> str:
  """`config.data.data_dir`, else $FEDJAX_MTL_DATA_DIR; ConfigError when absent."""
  d = config.data.get('data_dir', '') or os.environ.get(ENV_DATA_DIR, '')
  hint = (f'set --config.data.data_dir or {ENV_DATA_DIR} to the folder holding '
          'PASCALContext/ and NYUDv2/')
  if not d:
    raise ConfigError(f'data.source=real needs a data dir; {hint}')
  if not os.path.isdir(d):
    raise ConfigError(f'data dir {d!r} does not exist; {hint}')
  return d


def cache_path(config, dataset: str, split: str) -> str:
  """The cache directory of one split."""
  root = config.data.get('cache_dir', '') or os.path.join(resolve_data_dir(config), 'cache')
  return os.path.join(root, f'{dataset}_{split}')


def open_split(config, dataset: str, split: str, **kwargs: Any) -> CachedDataset:
  """The cached split, or a ConfigError naming the command that builds it."""
  path = cache_path(config, dataset, split)
  try:
    return CachedDataset(path, **kwargs)
  except CacheError as e:
    raw = os.path.join(config.data.get('data_dir', '') or os.environ.get(ENV_DATA_DIR, ''),
                       DATASET_DIRS[dataset])
    raise ConfigError(f'{e}; build it once with: python scripts/prepare_data.py '
                      f'--dataset {dataset} --root {raw} --split {split} --out {path}') from None


def parts_filter(config):
  """`filter(dataset, indices) -> kept` for human_parts-only clients (cache flags).

  Keeps the images whose human flag is set, with the released code's
  misaligned flags when `data.reproduce_parts_index_bug` (spec §1.11 bug 1).
  """
  bug = bool(config.data.get('reproduce_parts_index_bug', False))

  def keep(dataset: str, indices: np.ndarray) -> np.ndarray:
    ds = open_split(config, dataset, 'train', tasks=('human_parts',), indices=indices,
                    reproduce_parts_index_bug=bug, drop_images_without_humans=True)
    return ds.source_indices

  return keep


def semseg_attribute(config):
  """`attribute(dataset, indices) -> values` for `split='dirichlet'`: each train
  image's dominant semseg class (`scenarios.dominant_class`), from the cache's
  semseg labels in one pass per dataset (seconds for PASCAL's 4,998 images)."""
  values: dict[str, np.ndarray] = {}

  def attribute(dataset: str, indices: np.ndarray) -> np.ndarray:
    if dataset not in values:
      ds = open_split(config, dataset, 'train', tasks=('semseg',))
      values[dataset] = scenarios.dominant_class(ds.label_histograms('semseg'), dataset)
    return values[dataset][np.asarray(indices, np.int64)]

  return attribute


def client_source(config, client) -> CachedDataset:
  """A client's training images (its draw order) with its own tasks' labels."""
  drop = client.tasks == ('human_parts',) and config.get('parts_clients_humans_only', True)
  ds = open_split(config, client.dataset, 'train', tasks=client.tasks,
                  indices=client.draw_indices,
                  reproduce_parts_index_bug=bool(config.data.get('reproduce_parts_index_bug', False)),
                  drop_images_without_humans=drop)
  if len(ds) != client.num_train:
    raise ConfigError(f'client {client.name}: cache holds {len(ds)} images for its split, '
                      f'the partition expects {client.num_train}; rebuild the cache')
  return ds


def _fields(tasks: Sequence[str], size: tuple[int, int]) -> dict[str, tuple]:
  """(shape, dtype, fill) of one padded sample's arrays.

  The image stays uint8 (normalised on device, `local.normalize_image`) with
  'box' = (top, left, height, width) of the image inside the canvas; labels
  are padded with 255 (normals and depth padding would become 255 in
  AddIgnoreRegions anyway).
  """
  h, w = size
  out = {'image': ((h, w, 3), np.uint8, 0), 'box': ((4,), np.int32, 0)}
  for t in tasks:
    shape = (h, w, 3) if t == 'normals' else (h, w)
    dtype = np.float32 if t in ('normals', 'depth') else np.uint8
    out[t] = (shape, dtype, tasks_lib.IGNORE)
  return out


def _raw_fields(tasks: Sequence[str], size: tuple[int, int]) -> dict[str, tuple]:
  """(shape, dtype, fill) of one un-augmented sample in a raw canvas of `size`
  (data.augment='device'): the cache's arrays at the top-left, 'size' = its
  (height, width) (0 for padding), 'aug_id' = (client, epoch, position)."""
  out = _fields(tasks, size)
  del out['box']
  out['size'] = ((2,), np.int32, 0)
  out['aug_id'] = ((3,), np.int32, 0)
  return out


def max_image_size(sources: Sequence[Any]) -> tuple[int, int]:
  """The largest (height, width) over the samples of `sources` (the raw canvas size)."""
  h = w = 1
  for src in sources:
    if hasattr(src, 'image_sizes'):
      sizes = np.asarray(src.image_sizes()).reshape(-1, 2)
    else:
      sizes = np.array([s['image'].shape[:2] for s in src], np.int64).reshape(-1, 2)
    if len(sizes):
      h, w = max(h, int(sizes[:, 0].max())), max(w, int(sizes[:, 1].max()))
  return h, w


def place_raw(out: dict[str, np.ndarray], at: tuple, sample: dict[str, np.ndarray]) -> None:
  """Write `sample` un-augmented at the top-left of the raw canvases `out[key][at]`
  and its (height, width) into `out['size'][at]`."""
  h, w = sample['image'].shape[:2]
  th, tw = out['image'][at].shape[:2]
  if h > th or w > tw:
    raise ValueError(f'sample of size {h}x{w} is larger than the raw canvas {th}x{tw}')
  for k, v in sample.items():
    if k in out:
      out[k][at][:h, :w] = v
  out['size'][at] = (h, w)


def engine_transforms(transforms: Sequence[Any]) -> list:
  """A transform list without Normalize / PadToSize (done by `place` and on device)."""
  return [t for t in transforms if not isinstance(t, (T.Normalize, T.PadToSize))]


def place(out: dict[str, np.ndarray], at: tuple, sample: dict[str, np.ndarray]) -> None:
  """Write `sample` centred into the canvases `out[key][at]` (as `pad_to_size` pads)
  and its box into `out['box'][at]`."""
  out['box'][at] = T.place_centred(out, at, sample)


@dataclasses.dataclass(frozen=True)
class GroupFeedSpec:
  """Static plan of one client group's local steps in a round."""
  dataset: str
  client_ids: tuple[int, ...]  # global ids of the group's real clients
  num_total: int  # real + padding clients
  counts: tuple[int, ...]  # images per real client
  epochs: int
  batch_size: int
  chunk_steps: int
  keys: tuple[str, ...]  # label keys of the group's batches
  max_steps: int = 0  # > 0: the round stops after this many steps (`max_steps_per_round`)

  @property
  def steps_per_epoch(self) -> int:
    """Steps of the longest client's epoch (shorter clients are masked after theirs)."""
    return max(self.counts) // self.batch_size

  @property
  def num_steps(self) -> int:
    steps = self.epochs * self.steps_per_epoch
    return min(steps, self.max_steps) if self.max_steps else steps

  @property
  def num_chunks(self) -> int:
    return -(-self.num_steps // self.chunk_steps)


class TrainChunks:
  """grain random-access source of a run's training chunks, in execution order.

  Element = {'group', 'round', 'mask' [n, T], 'epoch' [T], 'step' [T],
  'x/<key>' [n, T, B, ...]}; `epoch` is the absolute local epoch (for the lr
  schedule) and `step` the step's position in the round (for dropout keys).

  augment='device': the samples are not augmented here; 'x/<key>' hold them
  raw in canvases of `raw_size_of[dataset]` (default: the largest image of
  the dataset's sources) with 'x/size' and 'x/aug_id' [n, T, B, 2 | 3] for
  `device_augment.augment_chunk`.

  `rows` (one slice per group, default all): the rows of each group's client axis
  (padding included) that this process feeds; a multi-process run reads only its own
  devices' clients (`distributed.local_rows`), and 'n' above is the slice's length.

  `step_shares(round) -> [group][row]` (1-based round; default every client all its
  steps): the share of its real steps each client takes in that round, 0 for a
  client that sits it out (`participation.Sampler.step_shares`: nothing of its is
  read, its steps are masked), in (0, 1) for a straggler (its first ⌈share·steps⌉
  real steps, the rest masked), as the in-memory trainers do.
  """

  def __init__(self, specs: Sequence[GroupFeedSpec], sources: Sequence[Sequence[Any]],
               num_rounds: int, size_of: dict[str, tuple[int, int]], seed: int,
               transforms_of: dict[str, list], augment: str = 'host',
               raw_size_of: dict[str, tuple[int, int]] | None = None,
               rows: Sequence[slice] | None = None, step_shares=None):
    check_choice('data.augment', augment, AUGMENT_MODES)
    self.specs, self.sources = tuple(specs), [list(s) for s in sources]
    self.rows = (tuple(rows) if rows is not None
                 else tuple(slice(0, s.num_total) for s in self.specs))
    self.size_of, self.seed, self.transforms_of = dict(size_of), int(seed), transforms_of
    self.num_rounds, self.augment = int(num_rounds), augment
    self.step_shares = step_shares
    self._engine_ts = {d: engine_transforms(ts) for d, ts in transforms_of.items()}
    if augment == 'device' and raw_size_of is None:
      raw_size_of = {d: max_image_size([src for group, spec in zip(self.sources, self.specs)
                                        if spec.dataset == d for src in group])
                     for d in {spec.dataset for spec in self.specs}}
    self.raw_size_of = dict(raw_size_of or {})
    per_round = [(g, c) for g, s in enumerate(self.specs) for c in range(s.num_chunks)]
    self.per_round = len(per_round)
    self.table = [(r, g, c) for r in range(num_rounds) for g, c in per_round]

  def __len__(self) -> int:
    return len(self.table)

  def element_bytes(self) -> int:
    """Bytes of the largest element (its groups' canvases): what one prefetched chunk
    holds in shared memory."""
    out = 0
    for spec, rows in zip(self.specs, self.rows):
      lead = (rows.stop - rows.start) * spec.chunk_steps * spec.batch_size
      fields = (_raw_fields(spec.keys, self.raw_size_of[spec.dataset])
                if self.augment == 'device' else _fields(spec.keys, self.size_of[spec.dataset]))
      out = max(out, sum(lead * int(np.prod(shape)) * np.dtype(dtype).itemsize
                         for shape, dtype, _ in fields.values()))
    return out

  def offset(self, rnd: int) -> int:
    """Index of the first element of 0-based round `rnd`."""
    return rnd * self.per_round

  def _order(self, cid: int, count: int, epoch: int) -> np.ndarray:
    return pipeline.epoch_order(np.arange(count), pipeline.seed32(self.seed, cid), epoch)

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    rnd, g, c = self.table[int(i)]
    spec = self.specs[g]
    rows = self.rows[g]
    n, t_len, b = rows.stop - rows.start, spec.chunk_steps, spec.batch_size
    raw = self.augment == 'device'
    fields = (_raw_fields(spec.keys, self.raw_size_of[spec.dataset]) if raw else
              _fields(spec.keys, self.size_of[spec.dataset]))
    canvas = {k: np.full((n, t_len, b) + shape, fill, dtype)
              for k, (shape, dtype, fill) in fields.items()}
    mask = np.zeros((n, t_len), bool)
    steps = c * t_len + np.arange(t_len)
    s_per = spec.steps_per_epoch
    epoch = rnd * spec.epochs + np.minimum(steps // s_per, spec.epochs - 1)
    ts = self._engine_ts[spec.dataset]
    shares = None if self.step_shares is None else self.step_shares(rnd + 1)[g]
    for j, (cid, count) in enumerate(zip(spec.client_ids, spec.counts)):
      if not rows.start <= j < rows.stop:
        continue  # another process's client
      r = j - rows.start  # its row in this process's chunk
      per_epoch = count // b  # its real steps in an epoch
      budget = None
      if shares is not None:
        real_steps = sum(min(per_epoch, max(0, spec.num_steps - e * s_per))
                         for e in range(spec.epochs))
        budget = int(np.ceil(shares[j] * real_steps - 1e-9))
      orders = {}  # local epoch -> this client's order, drawn once per element
      for k, t in enumerate(steps):
        e, s = divmod(int(t), s_per)
        if t >= spec.num_steps or s >= per_epoch:
          continue
        if budget is not None and e * per_epoch + s >= budget:
          continue  # past a straggler's share; all of a client that sits out
        ep = rnd * spec.epochs + e
        if ep not in orders:
          orders[ep] = self._order(cid, count, ep)
        order = orders[ep]
        for p in range(s * b, (s + 1) * b):
          if raw:  # augmented on device, keyed by the same (seed, client, epoch, position)
            place_raw(canvas, (r, k, p - s * b), self.sources[g][j][int(order[p])])
            canvas['aug_id'][r, k, p - s * b] = (cid, ep, p)
            continue
          rng = np.random.default_rng([self.seed, cid, ep, p])
          sample = T.apply_transforms(self.sources[g][j][int(order[p])], ts, rng)
          place(canvas, (r, k, p - s * b), sample)
        mask[r, k] = True
    return {'group': np.int32(g), 'round': np.int32(rnd), 'mask': mask,
            'epoch': epoch.astype(np.int32), 'step': steps.astype(np.int32),
            **{f'x/{k}': v for k, v in canvas.items()}}


class EvalBatches:
  """grain random-access source of one test split's padded evaluation batches.

  The last batch is filled up with all-ignore samples (empty box, labels 255),
  which add nothing to any metric.
  """

  def __init__(self, source: Any, batch_size: int, size: tuple[int, int], keys: Sequence[str]):
    self.source, self.batch_size, self.size = source, int(batch_size), tuple(size)
    self.fields = _fields(keys, self.size)
    self.transforms = engine_transforms(T.eval_transforms(self.size))

  def __len__(self) -> int:
    return -(-len(self.source) // self.batch_size)

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    out = {k: np.full((self.batch_size,) + shape, fill, dtype)
           for k, (shape, dtype, fill) in self.fields.items()}
    lo = int(i) * self.batch_size
    for b, p in enumerate(range(lo, min(lo + self.batch_size, len(self.source)))):
      place(out, (b,), T.apply_transforms(self.source[p], self.transforms))
    return out


# Elements a worker buffers (`iterate`'s default prefetch, grain's per-worker buffer).
PREFETCH = 2
# Elements a grain worker holds at once: its output buffer and the one it is writing.
ELEMENTS_PER_WORKER = PREFETCH + 1


def feed_workers(workers: int, element_bytes: int, budget_bytes: int) -> int:
  """Grain worker processes for a feed whose elements take `element_bytes`: `workers`,
  or fewer (at least 1) so that the elements they hold at once
  (`ELEMENTS_PER_WORKER` each) stay within `budget_bytes`; 0 stays 0 (threads)."""
  if workers <= 0:
    return 0
  fit = budget_bytes // max(1, ELEMENTS_PER_WORKER * element_bytes)
  return int(max(1, min(workers, fit)))


def iterate(source: Any, start: int = 0, workers: int = 0, threads: int = 2,
            prefetch: int = PREFETCH) -> Iterator[dict[str, np.ndarray]]:
  """Elements of `source` from `start` on, in order (grain threads or processes)."""
  ds = grain.MapDataset.source(source)[start:]
  return pipeline.iterate_dataset(ds, workers, threads, prefetch)


def check_eval_sizes(config, dataset: str, ds: CachedDataset) -> None:
  """ConfigError if a test image exceeds the evaluation size (no resize at test time)."""
  h, w = (int(v) for v in config.data.resolution[dataset])
  sizes = ds.image_sizes()
  if len(sizes) and (sizes[:, 0].max() > h or sizes[:, 1].max() > w):
    raise ConfigError(
        f'{dataset} test images up to {sizes[:, 0].max()}x{sizes[:, 1].max()} exceed '
        f'data.resolution {h}x{w}; evaluation pads without resizing, so the resolution '
        'must cover every test image (paper: pascal 512x512, nyud 448x576)')
