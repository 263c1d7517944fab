#!/usr/bin/env python
"""Write format-true, full-size fake datasets that the project's real readers take unchanged.

For rehearsing paper-scale runs (disk, decode and cache times, memory, the
whole pipeline) without the real data. Nothing is downloaded. Every label is
rendered from a procedural scene or a class-dependent pattern, so each task is
learnable (not noise); the numbers a run reaches on them mean nothing.

What it writes under ``--out`` (one folder per dataset):

``PASCALContext/`` (``--datasets=pascal``), as ``data/pascal_context.py`` reads it:
  4,998 train / 5,105 val JPEGs of 500 px on the longer side (the other
  333-500 px, landscape or portrait, like VOC), with every task's files:
  ``pascal-context/trainval/<id>.mat`` (``LabelMap`` of PASCAL-Context class
  ids; edges and the normals mask come from it), ``semseg/{VOC12,
  pascal-context}/<id>.png`` (21 classes; VOC12 ones with 255 borders),
  ``human_parts/<id>.mat`` (PASCAL-Part ``anno`` structs: every visible object
  with its mask, persons with named part masks), ``sal_distill/<id>.png``
  (0/255), ``normals_distill/<id>.png``, ``ImageSets/{Context,Parts}/*.txt``
  and ``json/*.json`` (subsets of the real class maps, with their real ids).
  Scenes come from ``fedjax_mtl.data.synthetic`` (domain 'pascal'), one image
  at a time at its own size.
``NYUDv2/`` (``nyud``), as ``data/nyud.py`` reads it: 795 train / 654 val images
  at 425 x 560 (the ATRC / InvPT release's size, inside the paper's 448 x 576
  evaluation canvas): ``images/*.png``, ``segmentation/*.png`` (1..40, 0 =
  unlabelled on instance borders), ``depth/*.npy`` (float32 metres, a few
  0 = missing holes), ``normals/*.png``, ``edge/*.png`` (0/255),
  ``gt_sets/{train,val}.txt``. Scenes: ``synthetic`` domain 'nyud'.
``tfds/`` (``tasks8``), the 8 tasks of ``data/tfds_tasks.py``: the real TFDS
  builders (their features, configs, versions and file names) prepared as
  array_record with generated examples (needs ``tensorflow_datasets`` and
  ``array_record``: ``pip install "fedjax_mtl[tfds]"``): mnist 60,000 / 10,000
  (28 x 28 gray PNG), svhn_cropped 73,257 / 26,032 (32 x 32 PNG), eurosat/rgb
  27,000 (64 x 64 JPEG), resisc45 31,500 (256 x 256 JPEG), dtd 1,880 each of
  train / validation / test (300-640 px JPEG), cars196 8,144 / 8,041
  (400-1000 px JPEG), sun397/standard-part1-120k 19,850 / 19,850 (120,000-pixel
  JPEGs at quality 72, as TFDS stores them), and GTSRB, which TFDS lacks, as
  the ImageFolder ``tfds/gtsrb/{train,test}/000NN/*.ppm`` (26,640 / 12,630,
  25-90 px). Splits that the reader never reads (svhn ``extra``, sun397
  ``validation``) are not written.
``folder30/`` (``tasks30``), the ImageFolder trees of ``data/folder30.py``:
  ``<task>/{train,test}/<class>/<image>`` for the 30 EMR-Merging tasks at
  their real image sizes, class counts and split sizes (``TASKS30`` below;
  datasets without an official split use 80 / 20).

Classification images are class-dependent procedural patterns: a grating
whose orientation, frequency and (RGB) hue encode the class through a
per-task code, under random phase, colour and illumination jitter, noise and a
class-independent distractor blob.

``--fraction`` writes a smaller copy: every split's count scaled, with floors
so that every reader still works: at least 2 images per PASCAL / NYUD split,
10 per TFDS split, one image per class in a folder task's train split (its
class folders are the classes; so GTSRB and every tasks30 task keep all their
classes) and min(classes, 10) in its test split. A PASCAL / NYUD copy is a
subset of the full one at the same seed (same ids, same images).
``--test_fraction`` scales the evaluation splits on their own (default: as
``--fraction``): the PASCAL / NYUD val split, the tasks8 TFDS ``test`` splits (and
GTSRB's test folder; RESISC45's and EuroSAT's test is carved from their train
split, so it follows ``--fraction``) and the tasks30 test folders: e.g. a copy large
enough for 20 clients' training with a val split of 16 images, or an 8-task copy
large enough for a Dirichlet(0.1) split over 10 clients per task with 1 % of the
test images, for rehearsals (`scripts/rehearse.py`) that evaluate them whole.
Every call writes ``<out>/fake_datasets.json`` (each dataset's fractions, examples
per split and the real ones), from which `scripts/rehearse.py` scales its figures.
``--tasks`` limits tasks8 / tasks30 to some tasks. An existing non-empty dataset
folder (or an existing cache of a dense dataset) is refused with one
``error:`` line unless ``--overwrite``, which replaces it.

Usage::

  python scripts/make_fake_datasets.py --out=/data/fake [--datasets=pascal,nyud,tasks8,tasks30]
      [--fraction=1.0] [--test_fraction=F] [--workers=N] [--seed=0] [--tasks=mnist,dtd]
      [--cache] [--overwrite]

At the end it prints the config overrides that point a run at the data, e.g.
``--config.data.data_dir=/data/fake`` (PASCAL / NYUD, after building the
caches with ``scripts/prepare_data.py`` or ``--cache``),
``--config.many.data_dir=/data/fake/tfds`` (tfds8) and
``--config.many.data_dir=/data/fake/folder30`` (folder30).
"""

from __future__ import annotations

import argparse
import colorsys
import dataclasses
import importlib.util
import io
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import zlib
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

# Allow running from a checkout without installing the package.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DATASETS = ('pascal', 'nyud', 'tasks8', 'tasks30')
DATASET_DIRS = {'pascal': 'PASCALContext', 'nyud': 'NYUDv2', 'tasks8': 'tfds',
                'tasks30': 'folder30'}
DENSE_SPLITS = ('train', 'val')
CACHE_DIR = 'cache'  # <out>/cache/<dataset>_<split>, real.cache_path's default
TFDS_HINT = 'pip install "fedjax_mtl[tfds]"'


class UsageError(ValueError):
  """Bad command-line input; printed as one `error:` line, nothing written."""


# ============================================================================ file writers
# The on-disk formats of the real datasets (shared by every dataset writer below).

def _makedirs_for(path: str) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)


def save_png(path: str, array: np.ndarray, mode: str | None = None) -> int:
  """Write a PNG (mode 'L' / 'RGB' / None = from the array); returns its size in bytes."""
  from PIL import Image
  _makedirs_for(path)
  im = Image.fromarray(np.ascontiguousarray(array, np.uint8))
  if mode is not None and im.mode != mode:
    im = im.convert(mode)
  im.save(path, format='PNG')
  return os.path.getsize(path)


def encode_image(array: np.ndarray, fmt: str, quality: int = 90) -> bytes:
  """uint8 [H, W] or [H, W, 3] -> encoded bytes ('png', 'jpeg' or 'ppm')."""
  from PIL import Image
  im = Image.fromarray(np.ascontiguousarray(array, np.uint8))
  buf = io.BytesIO()
  if fmt == 'jpeg':
    im.save(buf, format='JPEG', quality=int(quality))
  elif fmt == 'png':
    im.save(buf, format='PNG')
  elif fmt == 'ppm':
    im.convert('RGB').save(buf, format='PPM')
  else:
    raise ValueError(f'unknown image format {fmt!r}')
  return buf.getvalue()


def save_bytes(path: str, data: bytes) -> int:
  _makedirs_for(path)
  with open(path, 'wb') as f:
    f.write(data)
  return len(data)


def save_label_map(path: str, label_map: np.ndarray) -> int:
  """PASCAL-Context ``trainval/<id>.mat``: variable 'LabelMap' (uint16 class ids)."""
  import scipy.io
  _makedirs_for(path)
  scipy.io.savemat(path, {'LabelMap': np.asarray(label_map, np.uint16)}, do_compression=True)
  return os.path.getsize(path)


def save_parts_mat(path: str, imname: str,
                   objects: Sequence[tuple[str, int, np.ndarray, Sequence[tuple[str, np.ndarray]]]]
                   ) -> int:
  """PASCAL-Part file: anno(imname, objects(class, class_ind, mask, parts(part_name, mask))).

  `objects`: (class name, VOC class index 1..20, uint8/bool mask, [(part name,
  mask), ...]); an object without parts gets an empty 0x0 parts array, as in
  the real files.
  """
  import scipy.io
  objs = np.zeros((1, len(objects)), dtype=[('class', 'O'), ('class_ind', 'O'), ('mask', 'O'),
                                            ('parts', 'O')])
  for j, (cname, cind, mask, parts) in enumerate(objects):
    if parts:
      pa = np.zeros((1, len(parts)), dtype=[('part_name', 'O'), ('mask', 'O')])
      for k, (name, pm) in enumerate(parts):
        pa[0, k] = (name, np.asarray(pm, np.uint8))
    else:
      pa = np.zeros((0, 0))
    objs[0, j] = (cname, np.array([[int(cind)]], np.uint8), np.asarray(mask, np.uint8), pa)
  anno = np.zeros((1, 1), dtype=[('imname', 'O'), ('objects', 'O')])
  anno[0, 0] = (imname, objs)
  _makedirs_for(path)
  scipy.io.savemat(path, {'anno': anno}, do_compression=True)
  return os.path.getsize(path)


def encode_normals(normals: np.ndarray) -> np.ndarray:
  """float unit normals [H, W, 3] in [-1, 1] -> the PNG values the readers decode
  with 2 * x / 255 - 1 (the exact inverse, rounded)."""
  return np.clip(np.rint((np.asarray(normals, np.float64) + 1.) * 127.5), 0, 255).astype(np.uint8)


def save_lines(path: str, lines: Iterable[str]) -> None:
  _makedirs_for(path)
  with open(path, 'w') as f:
    f.write(''.join(f'{line}\n' for line in lines))


def save_json(path: str, obj: Any) -> None:
  _makedirs_for(path)
  with open(path, 'w') as f:
    json.dump(obj, f)


# ============================================================================ helpers

def _rng(*key) -> np.random.Generator:
  """A generator keyed by ints and strings (strings through crc32)."""
  return np.random.default_rng([zlib.crc32(k.encode()) if isinstance(k, str) else int(k)
                                for k in key])


def scaled(n: int, fraction: float, minimum: int) -> int:
  """round(n * fraction), at least `minimum`, at most n."""
  return int(min(n, max(minimum, int(round(n * fraction)))))


def _boundaries(labels: np.ndarray) -> np.ndarray:
  """bool: pixels whose right or lower neighbour has another label."""
  b = np.zeros(labels.shape, bool)
  b[:, :-1] |= labels[:, :-1] != labels[:, 1:]
  b[:-1, :] |= labels[:-1, :] != labels[1:, :]
  return b


# ============================================================================ PASCAL-Context

PASCAL_SPLITS = {'train': 4998, 'val': 5105}
PASCAL_MIN = 2
PASCAL_LONG_SIDE = 500
VOC_CLASSES = ('background', 'aeroplane', 'bicycle', 'bird', 'boat', 'bottle', 'bus', 'car', 'cat',
               'chair', 'cow', 'diningtable', 'dog', 'horse', 'motorbike', 'person',
               'pottedplant', 'sheep', 'sofa', 'train', 'tvmonitor')
# Subsets of the release's json/context_classes.json and json/nyu_classes.json
# (name -> id, the real ids): the names the fake scenes use, and enough NYU
# names that the normals-valid classes are the real ones for those scenes
# (wall, floor, bicycle, bottle, car, cat, chair, table, dog, person, sofa and
# the reference's manual tvmonitor).
CONTEXT_CLASSES = {
    'aeroplane': 2, 'bicycle': 23, 'bird': 25, 'boat': 31, 'bottle': 34, 'bus': 45, 'car': 59,
    'cat': 65, 'chair': 72, 'cow': 98, 'dog': 113, 'floor': 158, 'grass': 187, 'ground': 189,
    'horse': 207, 'motorbike': 258, 'person': 284, 'pottedplant': 308, 'road': 324,
    'sand': 334, 'sheep': 347, 'sky': 360, 'sofa': 368, 'table': 397, 'train': 416,
    'tvmonitor': 427, 'unknown': 431, 'wall': 440}
NYU_CLASSES = {
    'bed': 157, 'bicycle': 189, 'book': 1, 'bottle': 2, 'box': 26, 'cabinet': 3, 'car': 530,
    'cat': 594, 'ceiling': 4, 'chair': 5, 'counter': 7, 'dog': 701, 'door': 28, 'floor': 11,
    'person': 331, 'pig': 811, 'plant': 82, 'sofa': 83, 'table': 19, 'television': 172,
    'unknown': 20, 'wall': 21}
# VOC class -> PASCAL-Context class name (diningtable is 'table' in Context).
VOC_TO_CONTEXT = {c: ('table' if c == 'diningtable' else c) for c in VOC_CLASSES[1:]}
SKY_LIKE = ('sky', 'wall')  # upper background: 75 % sky, 25 % wall
GROUND_LIKE = ('floor', 'grass', 'ground', 'road', 'sand')  # lower background, with
GROUND_P = (0.4, 0.15, 0.2, 0.15, 0.1)  # these odds (floor's normals are valid)
# The person entry of json/pascal_part.json (part name -> PASCAL-Part part id).
PERSON_PARTS_JSON = {
    'hair': 10, 'head': 1, 'lear': 4, 'lebrow': 6, 'leye': 2, 'lfoot': 21, 'lhand': 15,
    'llarm': 13, 'llleg': 19, 'luarm': 14, 'luleg': 20, 'mouth': 9, 'neck': 12, 'nose': 8,
    'rear': 5, 'rebrow': 7, 'reye': 3, 'rfoot': 24, 'rhand': 18, 'rlarm': 16, 'rlleg': 22,
    'ruarm': 17, 'ruleg': 23, 'torso': 11}
# synthetic part group (1..6, the reader's HUMAN_PART_GROUPS values) -> PASCAL-Part
# names: (upper name, fraction of the group's rows it takes, lower name) or one name.
PART_NAMES = {1: ('hair', 0.3, 'head'), 2: ('neck', 0.15, 'torso'), 3: ('luarm',),
              4: ('llarm', 0.7, 'lhand'), 5: ('luleg',), 6: ('llleg', 0.8, 'lfoot')}
VOC12_SHARE = 0.35  # ids whose semseg lives in semseg/VOC12 (with 255 borders)


def split_ids(dataset: str, splits: dict[str, int], seed: int) -> dict[str, list[int]]:
  """Global image indices of each full split of `dataset` ({'train', 'val'} sizes), in
  the order a --fraction copy takes them."""
  perm = _rng(f'{dataset}/split', seed).permutation(sum(splits.values()))
  n_train = splits['train']
  return {'train': [int(k) for k in perm[:n_train]], 'val': [int(k) for k in perm[n_train:]]}


def pascal_ids(seed: int) -> dict[str, list[int]]:
  """Global image indices of each full PASCAL split (`split_ids`)."""
  return split_ids('pascal', PASCAL_SPLITS, seed)


def pascal_id(k: int) -> str:
  """VOC-style id of global image k (2008_000001 ... 2010_006735)."""
  per_year = 3368
  return f'{2008 + k // per_year}_{2 * (k % per_year) + 1:06d}'


def pascal_size(k: int, seed: int) -> tuple[int, int]:
  """(H, W): 500 px on the longer side, 333-500 on the other, landscape 75 %."""
  rng = _rng('pascal/size', seed, k)
  short = int(rng.choice([375, 333, 500, int(rng.integers(330, 500))], p=[0.5, 0.2, 0.1, 0.2]))
  return (short, PASCAL_LONG_SIDE) if rng.uniform() < 0.75 else (PASCAL_LONG_SIDE, short)


def _synthetic(domain: str, split: str, hw: tuple[int, int], k: int, seed: int):
  from fedjax_mtl.data import synthetic
  out = synthetic.generate(domain, 'train' if split == 'train' else 'test', 1, hw,
                           seed=int(seed) * 1_000_003 + int(k))
  return {key: v[0] for key, v in out.items()}


def _person_parts(mask: np.ndarray, parts: np.ndarray) -> list[tuple[str, np.ndarray]]:
  """Named PASCAL-Part masks of one person object whose pixels carry synthetic groups."""
  out = []
  for g, names in PART_NAMES.items():
    pm = mask & (parts == g)
    if not pm.any():
      continue
    if len(names) == 1:
      out.append((names[0], pm))
      continue
    upper, frac, lower = names
    rows = np.nonzero(pm.any(axis=1))[0]
    cut = rows[0] + max(1, int(round((rows[-1] - rows[0] + 1) * frac)))
    top = pm.copy()
    top[cut:] = False
    for name, m in ((upper, top), (lower, pm & ~top)):
      if m.any():
        out.append((name, m))
  return out


def pascal_sample(k: int, split: str, seed: int = 0) -> dict[str, Any]:
  """Everything written for PASCAL image k: the synthetic scene ('image', 'semseg',
  'human_parts', 'sal', 'normals', 'edge' as `synthetic.generate` returns them),
  'label_map' (Context ids), 'objects' (PASCAL-Part objects), 'voc12' (semseg dir)."""
  import scipy.ndimage as ndi
  hw = pascal_size(k, seed)
  s = _synthetic('pascal', split, hw, k, seed)
  rng = _rng('pascal/labels', seed, k)
  sem, normals, parts = s['semseg'], s['normals'], s['human_parts']
  background = sem == 0
  ground = background & (normals[..., 1] < -0.5)  # the ground plane faces up (0, -1, 0)
  label_map = np.empty(sem.shape, np.uint16)
  label_map[background & ~ground] = CONTEXT_CLASSES[SKY_LIKE[int(rng.uniform() < 0.25)]]
  label_map[ground] = CONTEXT_CLASSES[GROUND_LIKE[int(rng.choice(len(GROUND_LIKE), p=GROUND_P))]]
  objects = []
  for c in range(1, len(VOC_CLASSES)):
    cmask = sem == c
    if not cmask.any():
      continue
    label_map[cmask] = CONTEXT_CLASSES[VOC_TO_CONTEXT[VOC_CLASSES[c]]]
    comps, n = ndi.label(cmask)  # one PASCAL-Part object per connected region
    for j in range(1, n + 1):
      m = comps == j
      pl = _person_parts(m, parts) if c == 15 else []
      objects.append((VOC_CLASSES[c], c, m, pl))
  s.update(label_map=label_map, objects=objects, voc12=bool(rng.uniform() < VOC12_SHARE))
  return s


def write_pascal_image(root: str, k: int, split: str, seed: int) -> tuple[str, list[int], int]:
  """Write every file of PASCAL image k; returns (id, object categories, bytes written)."""
  import scipy.ndimage as ndi
  s = pascal_sample(k, split, seed)
  im_id = pascal_id(k)
  n = save_bytes(os.path.join(root, 'JPEGImages', im_id + '.jpg'),
                 encode_image(s['image'], 'jpeg', 90))
  n += save_label_map(os.path.join(root, 'pascal-context', 'trainval', im_id + '.mat'),
                      s['label_map'])
  seg = s['semseg'].copy()
  if s['voc12']:  # VOC annotations have a void (255) band along object borders
    seg[ndi.binary_dilation(_boundaries(seg))] = 255
  sub = 'VOC12' if s['voc12'] else 'pascal-context'
  n += save_png(os.path.join(root, 'semseg', sub, im_id + '.png'), seg, 'L')
  n += save_parts_mat(os.path.join(root, 'human_parts', im_id + '.mat'), im_id, s['objects'])
  n += save_png(os.path.join(root, 'sal_distill', im_id + '.png'), s['sal'] * np.uint8(255), 'L')
  n += save_png(os.path.join(root, 'normals_distill', im_id + '.png'),
                encode_normals(s['normals']), 'RGB')
  return im_id, [int(o[1]) for o in s['objects']], n


def _pascal_job(args):
  root, k, split, seed = args
  return write_pascal_image(root, k, split, seed)


def split_fraction(fraction: float | dict, split: str) -> float:
  """A dense split's fraction: `fraction`, or its entry for `split` ({'train', 'val'})."""
  return float(fraction[split] if isinstance(fraction, dict) else fraction)


def write_pascal(root: str, fraction: float | dict = 1.0, seed: int = 0, pool=None,
                 log: Callable[[str], None] = print) -> dict[str, int]:
  """The PASCALContext/ tree; returns the number of images per split."""
  all_ids = pascal_ids(seed)
  counts = {}
  save_json(os.path.join(root, 'json', 'context_classes.json'), CONTEXT_CLASSES)
  save_json(os.path.join(root, 'json', 'nyu_classes.json'), NYU_CLASSES)
  save_json(os.path.join(root, 'json', 'pascal_part.json'),
            {str(c): (PERSON_PARTS_JSON if c == 15 else {}) for c in range(1, len(VOC_CLASSES))})
  for split, full in PASCAL_SPLITS.items():
    n = scaled(full, split_fraction(fraction, split), PASCAL_MIN)
    ks = sorted(all_ids[split][:n])
    t0 = time.time()
    cats = {}
    for im_id, c, _ in _map(pool, _pascal_job, [(root, k, split, seed) for k in ks],
                            log, f'pascal {split}'):
      cats[im_id] = c
    ids = [pascal_id(k) for k in ks]
    save_lines(os.path.join(root, 'ImageSets', 'Context', f'{split}.txt'), ids)
    save_json(os.path.join(root, 'ImageSets', 'Parts', f'{split}.txt'), {i: cats[i] for i in ids})
    counts[split] = n
    log(f'pascal {split}: {n} images in {time.time() - t0:.1f}s')
  return counts


# ============================================================================ NYUD-v2

NYUD_SPLITS = {'train': 795, 'val': 654}
NYUD_MIN = 2
NYUD_SIZE = (425, 560)  # (H, W) of the ATRC / InvPT release (the Kinect 480x640 crop)


def nyud_ids(seed: int) -> dict[str, list[int]]:
  """Global image indices of each full NYUD split (`split_ids`)."""
  return split_ids('nyud', NYUD_SPLITS, seed)


def nyud_id(k: int) -> str:
  return f'{k + 1:04d}'


def nyud_sample(k: int, split: str, seed: int = 0) -> dict[str, np.ndarray]:
  """The synthetic scene of NYUD image k plus the written forms: 'segmentation'
  (1..40, 0 unlabelled), 'depth_file' (metres, 0 missing), 'normals_png', 'edge_png'."""
  s = _synthetic('nyud', split, NYUD_SIZE, k, seed)
  rng = _rng('nyud/labels', seed, k)
  seg = s['semseg'].astype(np.uint8) + 1
  seg[s['edge'] > 0] = 0  # unlabelled along instance borders, like NYU's labelling
  depth = s['depth'].astype(np.float32).copy()
  h, w = depth.shape
  yy, xx = np.mgrid[0:h, 0:w]
  for _ in range(int(rng.integers(0, 3))):  # missing-depth holes (0)
    cy, cx = rng.uniform(0, h), rng.uniform(0, w)
    ry, rx = rng.uniform(4, 16, size=2)
    depth[((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 < 1] = 0
  s.update(segmentation=seg, depth_file=depth, normals_png=encode_normals(s['normals']),
           edge_png=(s['edge'] > 0).astype(np.uint8) * np.uint8(255))
  return s


def write_nyud_image(root: str, k: int, split: str, seed: int) -> tuple[str, int]:
  s = nyud_sample(k, split, seed)
  im_id = nyud_id(k)
  n = save_png(os.path.join(root, 'images', im_id + '.png'), s['image'], 'RGB')
  n += save_png(os.path.join(root, 'segmentation', im_id + '.png'), s['segmentation'], 'L')
  path = os.path.join(root, 'depth', im_id + '.npy')
  _makedirs_for(path)
  np.save(path, s['depth_file'])
  n += os.path.getsize(path)
  n += save_png(os.path.join(root, 'normals', im_id + '.png'), s['normals_png'], 'RGB')
  n += save_png(os.path.join(root, 'edge', im_id + '.png'), s['edge_png'], 'L')
  return im_id, n


def _nyud_job(args):
  root, k, split, seed = args
  return write_nyud_image(root, k, split, seed)


def write_nyud(root: str, fraction: float | dict = 1.0, seed: int = 0, pool=None,
               log: Callable[[str], None] = print) -> dict[str, int]:
  """The NYUDv2/ tree; returns the number of images per split."""
  all_ids = nyud_ids(seed)
  counts = {}
  for split, full in NYUD_SPLITS.items():
    n = scaled(full, split_fraction(fraction, split), NYUD_MIN)
    ks = sorted(all_ids[split][:n])
    t0 = time.time()
    for _ in _map(pool, _nyud_job, [(root, k, split, seed) for k in ks], log, f'nyud {split}'):
      pass
    save_lines(os.path.join(root, 'gt_sets', f'{split}.txt'), [nyud_id(k) for k in ks])
    counts[split] = n
    log(f'nyud {split}: {n} images in {time.time() - t0:.1f}s')
  return counts


# ============================================================================ classification images

@dataclasses.dataclass(frozen=True)
class ImageSpec:
  """Image sizes and file format of a classification dataset.

  kind 'fixed': a x b (H x W); 'photo': longer side in [a, b], the other
  0.6-1.0 of it, landscape 70 %; 'square': side in [a, b], aspect 0.85-1;
  'maxpix': a pixels (SUN397 at TFDS's 120k cap), aspect 0.6-1.
  """
  kind: str
  a: int
  b: int = 0
  gray: bool = False
  fmt: str = 'jpeg'  # 'jpeg', 'png' or 'ppm'
  quality: int = 90

  @property
  def ext(self) -> str:
    return {'jpeg': '.jpg', 'png': '.png', 'ppm': '.ppm'}[self.fmt]

  def size(self, rng: np.random.Generator) -> tuple[int, int]:
    if self.kind == 'fixed':
      return self.a, self.b
    if self.kind == 'square':
      side = int(rng.integers(self.a, self.b + 1))
      other = max(1, int(round(side * rng.uniform(0.85, 1.0))))
      return (side, other) if rng.uniform() < 0.5 else (other, side)
    if self.kind == 'photo':
      long = int(rng.integers(self.a, max(self.a, self.b) + 1))
      short = max(1, int(round(long * rng.uniform(0.6, 1.0))))
      return (short, long) if rng.uniform() < 0.7 else (long, short)
    if self.kind == 'maxpix':
      r = rng.uniform(0.6, 1.0)
      w = int(np.sqrt(self.a / r))
      h = int(self.a // w)
      return (h, w) if rng.uniform() < 0.8 else (w, h)
    raise ValueError(f'unknown image size kind {self.kind!r}')


GRAY_FREQS = (1.5, 2.5, 3.5, 5.0, 6.5, 8.0)  # grating cycles per shorter side
N_ORIENT, N_HUE = 8, 9


def class_code(task: str, label: int, num_classes: int, gray: bool) -> tuple[int, int, int]:
  """(orientation, hue, frequency) indices of a class: a per-task permutation of the
  8 x 9 x 6 (gray: 8 x 6) codes, so every class of a task looks different."""
  radices = (N_ORIENT, 1 if gray else N_HUE, len(GRAY_FREQS))
  total = int(np.prod(radices))
  if num_classes > total:
    raise ValueError(f'{task}: {num_classes} classes exceed the {total} pattern codes')
  code = int(_rng('codes', task, int(gray)).permutation(total)[int(label)])
  o, rest = code % radices[0], code // radices[0]
  return o, rest % radices[1], rest // radices[1]


def class_image(task: str, label: int, num_classes: int, hw: tuple[int, int], gray: bool,
                rng: np.random.Generator) -> np.ndarray:
  """A uint8 image ([H, W] if gray else [H, W, 3]) whose pattern encodes the class."""
  o, hue, f = class_code(task, label, num_classes, gray)
  h, w = int(hw[0]), int(hw[1])
  s = float(min(h, w))
  f32 = np.float32
  yy = (np.arange(h, dtype=f32)[:, None] + f32(0.5)) / f32(s)
  xx = (np.arange(w, dtype=f32)[None, :] + f32(0.5)) / f32(s)
  theta = np.pi * (o + rng.uniform(-0.15, 0.15)) / N_ORIENT
  k = 2 * np.pi * GRAY_FREQS[f] * rng.uniform(0.93, 1.07)
  phase = f32(rng.uniform(0, 2 * np.pi))
  g = np.sin(xx * f32(k * np.cos(theta)) + (yy * f32(k * np.sin(theta)) + phase))
  g = g * f32(0.5) + f32(0.5)  # grating in [0, 1], [H, W]
  # Illumination gradient (per pixel gain 0.8-1.2).
  ang = rng.uniform(0, 2 * np.pi)
  gain = np.tanh((xx - f32(0.5)) * f32(np.cos(ang)) + (yy - f32(0.5)) * f32(np.sin(ang)))
  gain = gain * f32(0.2) + f32(1.0)
  if gray:
    lo, hi = rng.uniform(10, 90), rng.uniform(160, 245)
    img = ((g * f32(hi - lo) + f32(lo)) * gain)[..., None]
  else:
    hbase = hue / N_HUE + rng.uniform(-0.02, 0.02)
    fg = np.array(colorsys.hsv_to_rgb(hbase % 1, rng.uniform(0.55, 0.9), rng.uniform(0.7, 1.0)))
    bg = np.array(colorsys.hsv_to_rgb((hbase + 0.5) % 1, rng.uniform(0.3, 0.6),
                                      rng.uniform(0.15, 0.45)))
    img = ((g * gain)[..., None] * (255. * (fg - bg)).astype(f32)
           + gain[..., None] * (255. * bg).astype(f32))
  # A class-independent distractor blob, then sensor noise.
  cy, cx = rng.uniform(0, h / s), rng.uniform(0, w / s)
  r = rng.uniform(0.08, 0.25)
  y0, y1 = max(0, int((cy - r) * s)), min(h, int((cy + r) * s) + 1)
  x0, x1 = max(0, int((cx - r) * s)), min(w, int((cx + r) * s) + 1)
  colour = rng.uniform(0, 255, size=img.shape[-1]).astype(f32)
  if y1 > y0 and x1 > x0:
    blob = (yy[y0:y1] - f32(cy)) ** 2 + (xx[:, x0:x1] - f32(cx)) ** 2 < f32(r * r)
    patch = img[y0:y1, x0:x1]
    patch[blob] = patch[blob] * f32(0.4) + colour * f32(0.6)
  img += rng.standard_normal(img.shape, dtype=f32) * f32(6.)
  img = np.clip(img, 0, 255, out=img).astype(np.uint8)
  return img[..., 0] if gray else img


def render_encoded(task: str, label: int, num_classes: int, spec: ImageSpec, key: tuple,
                   max_side: int | None = None) -> bytes:
  """Encoded bytes of one class image; `key` seeds its size and pattern jitter.
  `max_side` caps the size (tests only: the real sizes are the point otherwise)."""
  rng = _rng('image', task, *key)
  h, w = spec.size(rng)
  if max_side:
    h, w = min(h, max_side), min(w, max_side)
  return encode_image(class_image(task, label, num_classes, (h, w), spec.gray, rng),
                      spec.fmt, spec.quality)


def class_counts(n: int, num_classes: int, key: str) -> np.ndarray:
  """n images over the classes: n // C each, the remainder to a per-key random set."""
  counts = np.full(num_classes, n // num_classes, np.int64)
  extra = _rng('counts', key).permutation(num_classes)[:n % num_classes]
  counts[extra] += 1
  return counts


def _folder_job(args):
  path, task, label, num_classes, spec, key, max_side = args
  return save_bytes(path, render_encoded(task, label, num_classes, spec, key, max_side))


def write_image_folder(root: str, task: str, split: str, n: int, num_classes: int,
                       spec: ImageSpec, seed: int, pool=None, log=print,
                       class_name: Callable[[int], str] = lambda c: f'class_{c:03d}',
                       file_name: Callable[[int, int], str] = lambda c, j: f'{j:06d}',
                       max_side: int | None = None) -> np.ndarray:
  """`root/<split>/<class>/<file>` with `n` images over `num_classes`; returns the counts."""
  counts = class_counts(n, num_classes, f'{task}/{split}/{seed}')

  def jobs():
    for c in range(num_classes):
      for j in range(int(counts[c])):
        path = os.path.join(root, split, class_name(c), file_name(c, j) + spec.ext)
        yield (path, task, c, num_classes, spec, (split, seed, c, j), max_side)

  for _ in _map(pool, _folder_job, jobs(), log, f'{task} {split}', total=n):
    pass
  return counts


# ============================================================================ the 8 tasks (TFDS)

@dataclasses.dataclass(frozen=True)
class TfdsTask:
  splits: dict  # TFDS split -> real number of examples
  image: ImageSpec
  minimum: int = 10  # per split, at any --fraction


TASKS8 = {
    'sun397': TfdsTask({'train': 19850, 'test': 19850}, ImageSpec('maxpix', 120000, quality=72)),
    'cars': TfdsTask({'train': 8144, 'test': 8041}, ImageSpec('photo', 400, 1000)),
    'resisc45': TfdsTask({'train': 31500}, ImageSpec('fixed', 256, 256)),
    'eurosat': TfdsTask({'train': 27000}, ImageSpec('fixed', 64, 64)),
    'svhn': TfdsTask({'train': 73257, 'test': 26032}, ImageSpec('fixed', 32, 32, fmt='png')),
    # Not in TFDS: the ImageFolder <data_dir>/gtsrb/{train,test}/000NN/*.ppm (43 folders).
    'gtsrb': TfdsTask({'train': 26640, 'test': 12630}, ImageSpec('square', 25, 90, fmt='ppm')),
    'mnist': TfdsTask({'train': 60000, 'test': 10000},
                      ImageSpec('fixed', 28, 28, gray=True, fmt='png')),
    'dtd': TfdsTask({'train': 1880, 'validation': 1880, 'test': 1880},
                    ImageSpec('photo', 300, 640)),
}


def _import_tfds():
  try:
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
    if importlib.util.find_spec('array_record') is None:
      raise ImportError('No module named array_record')
  except ImportError as e:
    raise UsageError(f'tasks8 needs tensorflow_datasets and array_record ({e}); install them '
                     f'with: {TFDS_HINT}') from None
  return tfds


def _tfds_job(args):
  task, label, num_classes, spec, key, max_side = args
  return label, render_encoded(task, label, num_classes, spec, key, max_side)


def tfds_labels(task: str, n: int, num_classes: int) -> np.ndarray:
  """Labels of a split's first n examples: each class once per C examples, in a
  per-task order (so a small split still holds many classes)."""
  order = _rng('labels', task).permutation(num_classes)
  return order[np.arange(n) % num_classes]


def write_tfds_task(data_dir: str, task: str, fraction: float = 1.0, seed: int = 0, pool=None,
                    log=print, max_side: int | None = None,
                    test_fraction: float | None = None) -> dict[str, int]:
  """Prepare the real TFDS builder of `task` in `data_dir` with generated examples
  (array_record); GTSRB as its ImageFolder. Returns the examples per split. The
  `test` split is scaled by `test_fraction` (default: `fraction`)."""
  from fedjax_mtl.data import tfds_tasks
  spec = tfds_tasks.TASK_SPECS[task]
  info = TASKS8[task]
  test_fraction = fraction if test_fraction is None else test_fraction
  counts = {s: scaled(n, test_fraction if s == 'test' else fraction, info.minimum)
            for s, n in info.splits.items()}
  if spec.tfds_name is None:  # GTSRB: ImageFolder with the training archive's folder names
    root = os.path.join(data_dir, task)
    counts['train'] = max(counts['train'], spec.num_classes)  # every class folder non-empty
    for split, n in counts.items():
      t0 = time.time()
      write_image_folder(
          root, task, split, n, spec.num_classes, info.image, seed, pool, log,
          class_name=lambda c: f'{c:05d}',
          file_name=(lambda c, j: f'{j // 30:05d}_{j % 30:05d}') if split == 'train'
          else (lambda c, j: f'{j:05d}'), max_side=max_side)
      log(f'tasks8 {task} {split}: {n} images in {time.time() - t0:.1f}s')
    return counts

  tfds = _import_tfds()
  tfds.disable_progress_bar()
  if info.image.kind == 'fixed':
    max_side = None  # the feature's shape is fixed (mnist 28 x 28 x 1, ...)
  name, _, config = spec.tfds_name.partition('/')
  real = tfds.builder_cls(name)
  image_spec = info.image

  def split_generators(self, dl_manager):
    del dl_manager
    return {s: self._generate_examples(s, n) for s, n in counts.items()}

  def generate_examples(self, split, n):
    features = self.info.features
    c = features['label'].num_classes
    labels = tfds_labels(f'{task}/{split}', n, c)
    jobs = ((task, int(labels[i]), c, image_spec, (split, seed, i), max_side) for i in range(n))
    t0 = time.time()
    for i, (label, data) in enumerate(_map(pool, _tfds_job, jobs, log, f'{task} {split}', total=n)):
      ex = {}
      for key, f in features.items():
        if key == 'image':
          ex[key] = data
        elif key == 'label':
          ex[key] = label
        elif isinstance(f, tfds.features.BBoxFeature):
          r = _rng('bbox', task, split, i).uniform(size=4) * 0.2
          ex[key] = tfds.features.BBox(r[0], r[1], 1 - r[2], 1 - r[3])
        else:  # Text ids / file names
          ex[key] = f'{split}_{i:06d}{image_spec.ext}'
      yield i, ex
    log(f'tasks8 {task} {split}: {n} examples rendered in {time.time() - t0:.1f}s')

  body = {'name': real.name,
          'pkg_dir_path': real._get_pkg_dir_path(),  # pylint: disable=protected-access
          '_split_generators': split_generators, '_generate_examples': generate_examples,
          '_log_download_bytes': lambda self: None, '_log_download_done': lambda self: None}
  fake = type(f'Fake{real.__name__}', (real,), body, skip_registration=True)
  kwargs = {'config': config} if config else {}
  builder = fake(data_dir=os.fspath(data_dir), file_format='array_record', **kwargs)
  with tempfile.TemporaryDirectory() as downloads:  # TFDS makes one; nothing is downloaded
    builder.download_and_prepare(download_dir=downloads)
  return counts


def write_tasks8(data_dir: str, tasks: Sequence[str] | None = None, fraction: float = 1.0,
                 seed: int = 0, pool=None, log=print, max_side: int | None = None,
                 test_fraction: float | None = None) -> dict[str, dict[str, int]]:
  return {t: write_tfds_task(data_dir, t, fraction, seed, pool, log, max_side, test_fraction)
          for t in (tasks or TASKS8)}


# ============================================================================ the 30 tasks

@dataclasses.dataclass(frozen=True)
class FolderTask:
  num_classes: int
  train: int
  test: int
  image: ImageSpec


_PNG28 = ImageSpec('fixed', 28, 28, gray=True, fmt='png')
_PNG32 = ImageSpec('fixed', 32, 32, fmt='png')
# The EMR-Merging datasets (spec matu §1.2) as torchvision / the Kaggle and
# Mendeley releases ship them; "80/20" marks datasets without an official test
# split (EMNIST: its 'balanced' split).
TASKS30 = {
    'mnist': FolderTask(10, 60000, 10000, _PNG28),
    'cifar10': FolderTask(10, 50000, 10000, _PNG32),
    'vegetables': FolderTask(15, 15000, 3000, ImageSpec('fixed', 224, 224)),
    'food101': FolderTask(101, 75750, 25250, ImageSpec('photo', 512, 512)),
    'kvasir': FolderTask(8, 6400, 1600, ImageSpec('photo', 720, 1280)),  # 8,000, 80/20
    'intel_images': FolderTask(6, 14034, 3000, ImageSpec('fixed', 150, 150)),
    'cars': FolderTask(196, 8144, 8041, ImageSpec('photo', 400, 1000)),
    'eurosat': FolderTask(10, 21600, 2700, ImageSpec('fixed', 64, 64)),
    'weather': FolderTask(4, 900, 225, ImageSpec('photo', 250, 800)),  # 1,125, 80/20
    'cats_dogs': FolderTask(2, 20000, 5000, ImageSpec('photo', 300, 500)),  # 25,000, 80/20
    'mango_leaf': FolderTask(8, 3200, 800, ImageSpec('fixed', 240, 320)),  # 4,000, 80/20
    'beans': FolderTask(3, 1034, 128, ImageSpec('fixed', 500, 500)),
    'cifar100': FolderTask(100, 50000, 10000, _PNG32),
    'gtsrb': FolderTask(43, 26640, 12630, ImageSpec('square', 25, 90, fmt='ppm')),
    'svhn': FolderTask(10, 73257, 26032, _PNG32),
    'dogs': FolderTask(120, 12000, 8580, ImageSpec('photo', 300, 500)),
    'fashion_mnist': FolderTask(10, 60000, 10000, _PNG28),
    'pets': FolderTask(37, 3680, 3669, ImageSpec('photo', 300, 500)),
    'landscape': FolderTask(5, 10000, 500, ImageSpec('photo', 300, 600)),
    'flowers': FolderTask(5, 3454, 863, ImageSpec('photo', 240, 500)),  # 4,317, 80/20
    'stl10': FolderTask(10, 5000, 8000, ImageSpec('fixed', 96, 96, fmt='png')),
    'cub200': FolderTask(200, 5994, 5794, ImageSpec('photo', 300, 500)),
    'emnist': FolderTask(47, 112800, 18800, _PNG28),
    'dtd': FolderTask(47, 3760, 1880, ImageSpec('photo', 300, 640)),
    'resisc45': FolderTask(45, 18900, 6300, ImageSpec('fixed', 256, 256)),
    'sun397': FolderTask(397, 19850, 19850, ImageSpec('photo', 300, 800)),
    'kenyan_food13': FolderTask(13, 5228, 1308, ImageSpec('photo', 300, 800)),  # 6,536, 80/20
    'animal10n': FolderTask(10, 50000, 5000, ImageSpec('fixed', 64, 64)),
    'garbage': FolderTask(6, 2096, 431, ImageSpec('fixed', 384, 512)),
    'fruits360': FolderTask(131, 67692, 22688, ImageSpec('fixed', 100, 100)),
}


def folder30_counts(task: str, fraction: float, test_fraction: float | None = None
                    ) -> dict[str, int]:
  """Images per split: train at least one per class (its folders are the classes),
  test (scaled by `test_fraction`, default `fraction`) at least min(C, 10)."""
  t = TASKS30[task]
  return {'train': scaled(t.train, fraction, t.num_classes),
          'test': scaled(t.test, fraction if test_fraction is None else test_fraction,
                         min(t.num_classes, 10))}


def write_tasks30(data_dir: str, tasks: Sequence[str] | None = None, fraction: float = 1.0,
                  seed: int = 0, pool=None, log=print, max_side: int | None = None,
                  test_fraction: float | None = None) -> dict[str, dict[str, int]]:
  out = {}
  for task in (tasks or TASKS30):
    t = TASKS30[task]
    counts = folder30_counts(task, fraction, test_fraction)
    for split, n in counts.items():
      t0 = time.time()
      write_image_folder(os.path.join(data_dir, task), task, split, n, t.num_classes, t.image,
                         seed, pool, log, max_side=max_side)
      log(f'tasks30 {task} {split}: {n} images in {time.time() - t0:.1f}s')
    out[task] = counts
  return out


# ============================================================================ running

def _map(pool, fn, jobs: Iterable, log=print, what: str = '', total: int | None = None) -> Iterator:
  """fn over jobs, in order, in the pool (or here), logging progress every ~10 %."""
  jobs = list(jobs) if total is None else jobs
  total = len(jobs) if total is None else total
  if pool is not None:
    procs = getattr(pool, '_processes', 1) or 1
    it = pool.imap(fn, jobs, chunksize=max(1, min(16, total // (8 * procs))))
  else:
    it = map(fn, jobs)
  step = max(1, total // 10)
  t0 = time.time()
  for i, r in enumerate(it):
    if total >= 200 and (i + 1) % step == 0 and i + 1 < total:
      log(f'  {what}: {i + 1}/{total} ({time.time() - t0:.0f}s)')
    yield r


def disk_usage(path: str) -> tuple[int, int]:
  """(files, bytes) under path."""
  files = size = 0
  for dirpath, _, names in os.walk(path):
    for name in names:
      files += 1
      size += os.path.getsize(os.path.join(dirpath, name))
  return files, size


def default_workers() -> int:
  try:
    return max(1, len(os.sched_getaffinity(0)))
  except AttributeError:
    return max(1, os.cpu_count() or 1)


def make_pool(workers: int):
  """A process pool of `workers` (None for 1: work in this process)."""
  if workers <= 1:
    return None
  methods = multiprocessing.get_all_start_methods()
  ctx = multiprocessing.get_context('fork' if 'fork' in methods else 'spawn')
  return ctx.Pool(workers)


def _outputs(out: str, dataset: str) -> list[str]:
  """The paths a dataset writes (its folder, and the caches of the dense datasets)."""
  paths = [os.path.join(out, DATASET_DIRS[dataset])]
  if dataset in ('pascal', 'nyud'):
    paths += [os.path.join(out, CACHE_DIR, f'{dataset}_{s}') for s in DENSE_SPLITS]
  return paths


def check_outputs(out: str, datasets: Sequence[str], overwrite: bool) -> None:
  if os.path.exists(out) and not os.path.isdir(out):
    raise UsageError(f'--out {out!r} exists and is not a folder')
  if overwrite:
    return
  for d in datasets:
    for p in _outputs(out, d):
      if os.path.exists(p) and (not os.path.isdir(p) or os.listdir(p)):
        raise UsageError(f'{p} exists and is not empty; pass --overwrite to replace it or '
                         'choose another --out')


def parse_list(value: str, valid: Sequence[str], what: str) -> tuple[str, ...]:
  items = [v.strip() for v in value.split(',') if v.strip()]
  if not items:
    raise UsageError(f'{what} is empty; valid choices: {", ".join(valid)}')
  for v in items:
    if v not in valid:
      raise UsageError(f'unknown {what} entry {v!r}; valid choices: {", ".join(valid)}')
  if len(set(items)) != len(items):
    raise UsageError(f'{what} names an entry twice: {value!r}')
  return tuple(v for v in valid if v in items)


def parse_fraction(value: str, flag: str = '--fraction') -> float:
  try:
    f = float(value)
  except ValueError:
    f = float('nan')
  if not 0. < f <= 1.:
    raise UsageError(f'{flag} must be a number in (0, 1], got {value!r}')
  return f


def overrides(out: str, written: Sequence[str], cached: bool) -> list[str]:
  """Lines telling how to point a run at the written data."""
  out = os.path.abspath(out)
  lines = []
  if 'pascal' in written or 'nyud' in written:
    lines.append(f'PASCAL-Context / NYUD-v2: --config.data.data_dir={out} (the :paper configs set '
                 'data.source=real and the 512x512 / 448x576 resolutions; with any other config '
                 'add --config.data.source=real --config.data.resolution.pascal=512,512 '
                 '--config.data.resolution.nyud=448,576)')
    if not cached:
      lines.append('  build the caches first (or rerun with --cache):')
      for d in ('pascal', 'nyud'):
        if d in written:
          for s in DENSE_SPLITS:
            lines.append(f'  python scripts/prepare_data.py --dataset {d} --root '
                         f'{os.path.join(out, DATASET_DIRS[d])} --split {s} --out '
                         f'{os.path.join(out, CACHE_DIR, f"{d}_{s}")} --workers 8')
  if 'tasks8' in written:
    lines.append(f'8 tasks (tfds8): --config.many.benchmark=tfds8 '
                 f'--config.many.data_dir={os.path.join(out, DATASET_DIRS["tasks8"])} '
                 '(e.g. configs/matu.py:paper,table=1)')
  if 'tasks30' in written:
    lines.append(f'30 tasks (folder30): --config.many.benchmark=folder30 '
                 f'--config.many.data_dir={os.path.join(out, DATASET_DIRS["tasks30"])} '
                 '(e.g. configs/matu.py:paper,table=fig4)')
  return lines


def run(out: str, datasets: Sequence[str] = DATASETS, fraction: float = 1.0,
        workers: int | None = None, seed: int = 0, tasks: Sequence[str] | None = None,
        overwrite: bool = False, cache: bool = False, log: Callable[[str], None] = print,
        max_side: int | None = None, test_fraction: float | None = None) -> dict[str, Any]:
  """Write `datasets` under `out` (see the module docstring); returns a summary
  {dataset: {'counts', 'files', 'bytes', 'seconds', 'dir'}}. Raises UsageError on
  bad input before writing anything."""
  datasets = tuple(datasets)
  for d in datasets:
    if d not in DATASETS:
      raise UsageError(f'unknown dataset {d!r}; valid choices: {", ".join(DATASETS)}')
  if not 0. < float(fraction) <= 1.:
    raise UsageError(f'--fraction must be a number in (0, 1], got {fraction!r}')
  if test_fraction is not None and not 0. < float(test_fraction) <= 1.:
    raise UsageError(f'--test_fraction must be a number in (0, 1], got {test_fraction!r}')
  dense_fraction = {'train': float(fraction), 'val': float(
      fraction if test_fraction is None else test_fraction)}
  if seed < 0:
    raise UsageError(f'--seed must be >= 0, got {seed}')
  workers = default_workers() if not workers else int(workers)
  if workers < 1:
    raise UsageError(f'--workers must be >= 1 (0 = all cores), got {workers}')
  many = {'tasks8': tuple(TASKS8), 'tasks30': tuple(TASKS30)}
  chosen = {}
  if tasks:
    valid = sorted({t for d in datasets if d in many for t in many[d]})
    if not valid:
      raise UsageError('--tasks applies to tasks8 / tasks30, and neither is in --datasets')
    for t in tasks:
      if t not in valid:
        raise UsageError(f'unknown --tasks entry {t!r}; valid choices: {", ".join(valid)}')
    for d in datasets:
      if d in many:
        chosen[d] = tuple(t for t in many[d] if t in tasks)
        if not chosen[d]:
          raise UsageError(f'--tasks names no task of {d}; its tasks: {", ".join(many[d])}')
  if 'tasks8' in datasets:
    _import_tfds()
  check_outputs(out, datasets, overwrite)

  if overwrite:
    for d in datasets:
      for p in _outputs(out, d):
        if os.path.isdir(p):
          shutil.rmtree(p)
        elif os.path.exists(p):
          os.remove(p)
  os.makedirs(out, exist_ok=True)
  pool = make_pool(workers)
  summary = {}
  try:
    for d in datasets:
      root = os.path.join(out, DATASET_DIRS[d])
      os.makedirs(root, exist_ok=True)
      t0 = time.time()
      if d == 'pascal':
        counts = write_pascal(root, dense_fraction, seed, pool, log)
      elif d == 'nyud':
        counts = write_nyud(root, dense_fraction, seed, pool, log)
      elif d == 'tasks8':
        counts = write_tasks8(root, chosen.get(d), fraction, seed, pool, log, max_side,
                              test_fraction)
      else:
        counts = write_tasks30(root, chosen.get(d), fraction, seed, pool, log, max_side,
                               test_fraction)
      seconds = time.time() - t0
      files, size = disk_usage(root)
      summary[d] = {'dir': root, 'counts': counts, 'files': files, 'bytes': size,
                    'seconds': seconds}
      log(f'{d}: {files} files, {size / 2**20:.1f} MiB in {root} ({seconds:.1f}s)')
  finally:
    if pool is not None:
      pool.close()
      pool.join()
  if cache:
    from fedjax_mtl.data import cache as cache_lib
    for d in datasets:
      if d in ('pascal', 'nyud'):
        for s in DENSE_SPLITS:
          t0 = time.time()
          path = os.path.join(out, CACHE_DIR, f'{d}_{s}')
          cache_lib.prepare(d, os.path.join(out, DATASET_DIRS[d]), s, path,
                            workers=workers if workers > 1 else 0, verbose=False)
          log(f'cache {path} built in {time.time() - t0:.1f}s')
          summary[d].setdefault('cache_seconds', {})[s] = time.time() - t0
  write_manifest(out, fraction, summary, test_fraction)
  return summary


MANIFEST = 'fake_datasets.json'


def full_counts(dataset: str) -> dict:
  """The real datasets' examples per split (per task for tasks8 / tasks30)."""
  if dataset == 'pascal':
    return dict(PASCAL_SPLITS)
  if dataset == 'nyud':
    return dict(NYUD_SPLITS)
  if dataset == 'tasks8':
    return {t: dict(info.splits) for t, info in TASKS8.items()}
  return {t: {'train': info.train, 'test': info.test} for t, info in TASKS30.items()}


def write_manifest(out: str, fraction: float, summary: dict,
                   test_fraction: float | None = None) -> None:
  """`<out>/fake_datasets.json`: each written dataset's --fraction (and
  --test_fraction when given), its examples per split and the real ones (merged with
  the datasets an earlier call wrote), so that `scripts/rehearse.py` can scale a
  copy's figures to the full datasets."""
  path = os.path.join(out, MANIFEST)
  manifest = json.load(open(path)) if os.path.isfile(path) else {}
  for d, v in summary.items():
    manifest[d] = {'fraction': float(fraction), 'counts': v['counts'], 'full': full_counts(d)}
    if test_fraction is not None:
      manifest[d]['test_fraction'] = float(test_fraction)
  with open(path + '.tmp', 'w') as f:
    json.dump(manifest, f, indent=1, sort_keys=True)
  os.replace(path + '.tmp', path)


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # one `error:` line, exit 2 (argparse prints usage too)
    print(f'error: {message}', file=sys.stderr)
    sys.exit(2)


def main(argv: Sequence[str] | None = None) -> int:
  """CLI entry point; returns the process exit code."""
  p = _Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--out', required=True, help='folder to write the datasets into')
  p.add_argument('--datasets', default=','.join(DATASETS),
                 help=f'comma-separated subset of {", ".join(DATASETS)} (default: all)')
  p.add_argument('--fraction', default='1.0',
                 help='scale of every split in (0, 1] (default: 1.0, the real sizes)')
  p.add_argument('--test_fraction', default='',
                 help='scale of the evaluation splits in (0, 1]: PASCAL / NYUD val, the '
                 'tasks8 / tasks30 test splits (default: --fraction)')
  p.add_argument('--workers', type=int, default=0, help='writer processes (default 0: all cores)')
  p.add_argument('--seed', type=int, default=0, help='seed of the scenes and patterns')
  p.add_argument('--tasks', default='', help='comma-separated subset of the tasks8 / tasks30 '
                 "tasks ('' = all)")
  p.add_argument('--overwrite', action='store_true',
                 help='replace existing dataset folders (and the dense datasets\' caches)')
  p.add_argument('--cache', action='store_true', help='also build the PASCAL / NYUD caches '
                 '(<out>/cache, as scripts/prepare_data.py does)')
  p.add_argument('--quiet', action='store_true', help='print only errors and the overrides')
  a = p.parse_args(argv)
  try:
    datasets = parse_list(a.datasets, DATASETS, '--datasets')
    fraction = parse_fraction(a.fraction)
    test_fraction = (parse_fraction(a.test_fraction, '--test_fraction') if a.test_fraction
                     else None)
    tasks = [t.strip() for t in a.tasks.split(',') if t.strip()] or None
    if a.workers < 0:
      raise UsageError(f'--workers must be >= 0 (0 = all cores), got {a.workers}')
    summary = run(a.out, datasets, fraction, a.workers, a.seed, tasks, a.overwrite, a.cache,
                  log=(lambda s: None) if a.quiet else (lambda s: print(s, flush=True)),
                  test_fraction=test_fraction)
  except UsageError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  if not a.quiet:
    total_b = sum(v['bytes'] for v in summary.values())
    total_s = sum(v['seconds'] for v in summary.values())
    print(f'done: {total_b / 2**30:.2f} GiB in {total_s:.0f}s')
  print('\n'.join(overrides(a.out, list(summary), a.cache)))
  return 0


if __name__ == '__main__':
  sys.exit(main())
