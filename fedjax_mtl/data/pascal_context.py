"""PASCAL-Context multi-task reader (the ATRC / MTI-Net / FedHCA2 layout).

Expected layout under ``root`` (the "PASCALContext" folder of the standard tarball)::

  JPEGImages/<id>.jpg
  ImageSets/Context/{train,val}.txt            one id per line (4998 / 5105)
  ImageSets/Parts/{train,val}.txt              optional: JSON {id: [object cat ids]}
  pascal-context/trainval/<id>.mat             'LabelMap' (edges, normals mask)
  semseg/VOC12/<id>.png | semseg/pascal-context/<id>.png   21 classes, 255 ignore
  human_parts/<id>.mat                         PASCAL-Part 'anno' struct
  sal_distill/<id>.png                         saliency, binarised at 0.5
  normals_distill/<id>.png                     normals, 2 * x / 255 - 1
  json/{pascal_part.json, nyu_classes.json, context_classes.json}

Samples follow the library conventions (see ``__getitem__``). Differences from the
reference loader, all deliberate:
- Human-part flags are re-indexed after subsetting (the reference does not; pass
  ``reproduce_parts_index_bug=True`` to get its behaviour, spec §1.11 bug 1). The
  bug depends on the client's subset, so to reproduce it give the client indices
  to the reader (``indices=``, also accepted by ``CachedDataset``), not to the
  loader; a full permutation (an MT client with client_num 1) is affected too.
- A missing ``ImageSets/Parts/<split>.txt`` is computed in memory, never written
  into the dataset folder (the reference writes it on first use).
- Images without human parts return all-255 parts maps (the reference returns
  zeros and turns them into 255 later in ``AddIgnoreRegions``; same end result).
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Sequence

import numpy as np
import scipy.io
import scipy.ndimage as ndi
from PIL import Image

IGNORE = 255
PASCAL_TASKS = ('semseg', 'human_parts', 'sal', 'normals', 'edge')
SPLITS = ('train', 'val')
HUMAN_CATEGORY = 15  # PASCAL VOC "person"
# PASCAL-Part person part names -> 6 part groups (1 head, 2 torso, 3 upper arms,
# 4 lower arms + hands, 5 upper legs, 6 lower legs + feet); background is 0.
HUMAN_PART_GROUPS = {
    'hair': 1, 'head': 1, 'lear': 1, 'lebrow': 1, 'leye': 1, 'mouth': 1,
    'nose': 1, 'rear': 1, 'rebrow': 1, 'reye': 1,
    'neck': 2, 'torso': 2,
    'luarm': 3, 'ruarm': 3,
    'lhand': 4, 'llarm': 4, 'rhand': 4, 'rlarm': 4,
    'luleg': 5, 'ruleg': 5,
    'lfoot': 6, 'llleg': 6, 'rfoot': 6, 'rlleg': 6,
}
NUM_PART_CLASSES = 7
_LAYOUT = ('JPEGImages/, ImageSets/Context/{train,val}.txt, pascal-context/trainval/*.mat, '
           'semseg/{VOC12,pascal-context}/*.png, human_parts/*.mat, sal_distill/*.png, '
           'normals_distill/*.png, json/*.json')


class DatasetFileError(OSError):
  """A per-sample file is missing, unreadable or inconsistent; names the file."""


# --------------------------------------------------------------------------- I/O helpers
# Shared with nyud.py and cache.py: every failure names the offending path.

def require_file(path: str) -> str:
  """Return `path` if it is a file, else raise DatasetFileError naming it."""
  if not os.path.isfile(path):
    raise DatasetFileError(f'missing dataset file: {path}')
  return path


def read_image(path: str, mode: str | None = None) -> np.ndarray:
  """Decode an image file to a numpy array (optionally converted to `mode`)."""
  require_file(path)
  try:
    with Image.open(path) as im:
      if mode is not None and im.mode != mode:
        im = im.convert(mode)
      return np.asarray(im).copy()
  except Exception as e:  # PIL raises many types for truncated/corrupt files.
    raise DatasetFileError(f'cannot decode {path}: {type(e).__name__}: {e}') from e


def image_size(path: str) -> tuple[int, int]:
  """(H, W) of an image file from its header only (no pixel decode)."""
  require_file(path)
  try:
    with Image.open(path) as im:
      w, h = im.size
  except Exception as e:
    raise DatasetFileError(f'cannot read image header {path}: {type(e).__name__}: {e}') from e
  return int(h), int(w)


def load_mat(path: str) -> dict[str, Any]:
  """Load a MATLAB .mat file, naming the path on failure."""
  require_file(path)
  try:
    return scipy.io.loadmat(path)
  except Exception as e:
    raise DatasetFileError(f'cannot read .mat file {path}: {type(e).__name__}: {e}') from e


def check_shape(path: str, arr: np.ndarray, hw: tuple[int, int]) -> None:
  """Raise DatasetFileError if the label `arr` is not at the image size `hw`."""
  if tuple(arr.shape[:2]) != tuple(hw):
    raise DatasetFileError(
        f'{path}: label size {tuple(arr.shape[:2])} != image size {tuple(hw)}')


def read_split(path: str) -> list[str]:
  """Ids of a split file, one per line, blank lines skipped."""
  require_file(path)
  with open(path) as f:
    return [line.strip() for line in f if line.strip()]


def check_tasks(tasks: Iterable[str], valid: Sequence[str], dataset: str) -> tuple[str, ...]:
  """Validate task names; returns them as a tuple in the given order."""
  tasks = tuple(tasks)
  bad = [t for t in tasks if t not in valid]
  if bad or len(set(tasks)) != len(tasks):
    raise ValueError(f'bad {dataset} tasks {tasks!r}; valid tasks: {", ".join(valid)}')
  return tasks


# --------------------------------------------------------------------------- edges

def _guo_hall_luts() -> tuple[np.ndarray, np.ndarray]:
  """Deletion look-up tables of the two Guo-Hall (1989) thinning sub-iterations.

  Index = 8-neighbourhood code with bit k set for neighbour x_{k+1}, counted
  anticlockwise from East (E=1, NE=2, N=4, NW=8, W=16, SW=32, S=64, SE=128), the
  same encoding as skimage.morphology.thin, so the result matches it exactly.
  """
  codes = np.arange(256)
  b = [(codes >> k) & 1 for k in range(8)]  # b[0] = x1 (E), ..., b[7] = x8 (SE)
  # C(P): number of distinct 8-connected foreground components around P.
  c = sum(((1 - b[i]) & (b[i + 1] | b[(i + 2) % 8])) for i in (0, 2, 4, 6))
  # N(P) = min(N1, N2) with N1/N2 counting pairs (x_{2k-1} | x_{2k}) / (x_{2k} | x_{2k+1}).
  n1 = sum((b[k] | b[k - 1]) for k in (1, 3, 5, 7))
  n2 = sum((b[k] | b[(k + 1) % 8]) for k in (1, 3, 5, 7))
  n = np.minimum(n1, n2)
  g12 = (c == 1) & ((n == 2) | (n == 3))
  g3 = ~(((b[1] | b[2] | (1 - b[7])) & b[0]).astype(bool))
  g3p = ~(((b[5] | b[6] | (1 - b[3])) & b[4]).astype(bool))
  return g12 & g3, g12 & g3p


_THIN_LUTS = _guo_hall_luts()
_NEIGHBOUR_WEIGHTS = np.array([[8, 4, 2], [16, 0, 1], [32, 64, 128]], np.uint8)


def thin(mask: np.ndarray, max_iter: int | None = None) -> np.ndarray:
  """Guo-Hall morphological thinning of a binary image (skimage `thin` equivalent)."""
  skel = np.asarray(mask, bool).astype(np.uint8)
  count = int(skel.sum())
  it = 0
  while max_iter is None or it < max_iter:
    for lut in _THIN_LUTS:
      code = ndi.correlate(skel, _NEIGHBOUR_WEIGHTS, mode='constant', cval=0)
      skel[lut[code]] = 0
    it += 1
    new = int(skel.sum())
    if new == count:
      break
    count = new
  return skel.astype(bool)


# 4-neighbour Laplacian (OpenCV's ksize=1 kernel).
_LAPLACIAN = np.array([[0, 1, 0], [1, -4, 1], [0, 1, 0]], np.float64)


def edges_from_label_map(label_map: np.ndarray) -> np.ndarray:
  """uint8 {0,1} edge map: thin(|Laplacian(LabelMap)| > 0), as the reference.

  OpenCV's default border (BORDER_REFLECT_101) equals scipy's 'mirror' mode; the
  test is on the Laplacian value, so a pixel between labels that cancel out is
  (as in the reference) not an edge.
  """
  lap = ndi.correlate(np.asarray(label_map, np.float64), _LAPLACIAN, mode='mirror')
  return thin(np.abs(lap) > 0).astype(np.uint8)


# --------------------------------------------------------------------------- human parts

def _mat_objects(anno_mat: dict[str, Any], path: str) -> np.ndarray:
  # PASCAL-Part: anno = struct(imname, objects); objects(j) = struct(class,
  # class_ind, mask, parts); parts(k) = struct(part_name, mask). Field positions
  # are used (like the reference) so files with renamed fields still work.
  try:
    return anno_mat['anno'][0][0][1][0]
  except Exception as e:
    raise DatasetFileError(f'{path}: no PASCAL-Part "anno" struct ({e})') from e


def parts_object_categories(path: str, area_thresh: int = 0) -> list[int]:
  """Object category ids of a PASCAL-Part file (-1 where area <= thresh)."""
  objects = _mat_objects(load_mat(path), path)
  cats = []
  for obj in objects:
    area = int(np.sum(obj[2]))
    cats.append(int(obj[1][0][0]) if area > area_thresh else -1)
  return cats


def human_parts_from_mat(path: str, hw: tuple[int, int], flag: bool | None = None) -> tuple[np.ndarray, bool]:
  """Parts label map (uint8, 0 bg, 1..6 parts, all-255 if no part pixels) and the flag.

  `flag` is the image's "has a human" flag as the loader sees it; None computes
  it from this file (the correct behaviour). With flag False nothing is parsed
  (the reference's behaviour, which drops labels when the flag is misaligned).
  """
  objects = None
  if flag is None:
    objects = _mat_objects(load_mat(path), path)
    flag = any(int(o[1][0][0]) == HUMAN_CATEGORY and np.sum(o[2]) > 0 for o in objects)
  if not flag:
    return np.full(hw, IGNORE, np.uint8), False
  if objects is None:
    objects = _mat_objects(load_mat(path), path)
  target = np.zeros(hw, np.uint8)
  for obj in objects:
    parts = obj[3]
    if int(obj[1][0][0]) != HUMAN_CATEGORY or len(parts) == 0:
      continue
    for part in parts[0]:
      name = str(part[0][0])
      if name not in HUMAN_PART_GROUPS:
        raise DatasetFileError(f'{path}: unknown person part name {name!r}')
      pmask = np.asarray(part[1]).astype(bool)
      check_shape(path, pmask, hw)
      target[pmask] = HUMAN_PART_GROUPS[name]
  if not target.any():
    target[:] = IGNORE  # no part pixels: the whole map is ignored (AddIgnoreRegions).
  return target, True


def subset_parts_flags(full_flags: np.ndarray, indices: np.ndarray, reproduce_bug: bool) -> np.ndarray:
  """Human flags of the subset positions: correct, or the reference's misaligned ones.

  The reference subsets images by `dataidxs` but keeps the full-split flag list,
  so position i of the subset reads the flag of image i of the full split.
  """
  full_flags = np.asarray(full_flags, bool)
  if reproduce_bug:
    if len(indices) > len(full_flags):
      raise ValueError('reproduce_parts_index_bug needs a subset no longer than the split')
    return full_flags[:len(indices)].copy()
  return full_flags[indices]


def select_subset(n_full: int, indices: Sequence[int] | None, full_flags: np.ndarray | None,
                  reproduce_bug: bool, drop_without_humans: bool) -> tuple[np.ndarray, np.ndarray | None]:
  """(positions into the full split, per-position human flags or None) after subsetting.

  With `drop_without_humans` the positions whose (possibly misaligned) flag is 0
  are removed, as the reference does for a parts-only client.
  """
  pos = np.arange(n_full) if indices is None else np.asarray(indices, np.int64).reshape(-1)
  if pos.size and (pos.min() < 0 or pos.max() >= n_full):
    raise IndexError(f'subset indices out of range for a split of {n_full} images')
  if full_flags is None:
    return pos, None
  flags = subset_parts_flags(full_flags, pos, reproduce_bug)
  if drop_without_humans:
    pos, flags = pos[flags], flags[flags]
  return pos, flags


def default_drop(tasks: Sequence[str], drop: bool | None) -> bool:
  # Reference: a parts-only dataset keeps only images with humans.
  return (tuple(tasks) == ('human_parts',)) if drop is None else bool(drop)


# --------------------------------------------------------------------------- reader

def _normals_valid_classes(root: str) -> np.ndarray:
  """Context class ids whose normals are valid (classes shared with NYUD + tvmonitor)."""
  paths = [os.path.join(root, 'json', n) for n in ('nyu_classes.json', 'context_classes.json')]
  loaded = []
  for p in paths:
    require_file(p)
    try:
      with open(p) as f:
        loaded.append(json.load(f))
    except ValueError as e:
      raise DatasetFileError(f'cannot parse JSON {p}: {e}') from e
  cls_nyu, cls_context = loaded
  valid = [cls_context[name] for name in cls_nyu if name in cls_context and name != 'unknown']
  valid.append(cls_context['tvmonitor'])  # the reference's manual addition
  return np.asarray(sorted(set(int(v) for v in valid)), np.int64)


class PascalContext:
  """Random-access PASCAL-Context reader returning library-convention samples."""

  dataset_name = 'pascal'

  def __init__(self, root: str, split: str = 'train', tasks: Sequence[str] = PASCAL_TASKS, *,
               indices: Sequence[int] | None = None, reproduce_parts_index_bug: bool = False,
               drop_images_without_humans: bool | None = None, check_files: bool = True):
    """Index the split; `indices` subsets it (a client chunk), in that order.

    reproduce_parts_index_bug: use the reference's misaligned human flags after
      subsetting (spec §1.11 bug 1); only for reproducing the paper's numbers.
    drop_images_without_humans: keep only images flagged as containing humans;
      None = the reference rule (only when 'human_parts' is the only task).
    check_files: verify at construction that every needed per-sample file exists.
    """
    self.root = os.fspath(root)
    if not os.path.isdir(self.root):
      raise FileNotFoundError(
          f'PASCAL-Context root not found: {self.root!r} (expected a folder with {_LAYOUT})')
    if split not in SPLITS:
      raise ValueError(f'unknown PASCAL-Context split {split!r}; valid: {", ".join(SPLITS)}')
    self.split = split
    self.tasks = check_tasks(tasks, PASCAL_TASKS, 'PASCAL-Context')
    self.reproduce_parts_index_bug = bool(reproduce_parts_index_bug)
    split_file = os.path.join(self.root, 'ImageSets', 'Context', f'{split}.txt')
    if not os.path.isfile(split_file):
      raise FileNotFoundError(
          f'PASCAL-Context split file not found: {split_file!r} (expected layout: {_LAYOUT})')
    self.all_ids = read_split(split_file)
    self._semseg_paths: dict[str, str] = {}
    self.normals_valid_classes = (
        _normals_valid_classes(self.root) if 'normals' in self.tasks else None)
    if 'human_parts' in self.tasks:
      require_file(os.path.join(self.root, 'json', 'pascal_part.json'))

    drop = 'human_parts' in self.tasks and default_drop(self.tasks, drop_images_without_humans)
    needs_flags = 'human_parts' in self.tasks and (
        drop or (self.reproduce_parts_index_bug and indices is not None))
    full_flags = self.human_flags() if needs_flags else None
    self.source_indices, self._flags = select_subset(
        len(self.all_ids), indices, full_flags, self.reproduce_parts_index_bug, drop)
    self.ids = [self.all_ids[i] for i in self.source_indices]
    if check_files:
      for i in range(len(self.ids)):
        for p in self._paths(i).values():
          require_file(p)

  # -- paths
  def _semseg_path(self, im_id: str) -> str:
    if im_id not in self._semseg_paths:
      cands = [os.path.join(self.root, 'semseg', d, im_id + '.png') for d in ('VOC12', 'pascal-context')]
      found = [c for c in cands if os.path.isfile(c)]
      if not found:
        raise DatasetFileError(f'missing dataset file: semseg for {im_id!r} (looked for {cands[0]} and {cands[1]})')
      self._semseg_paths[im_id] = found[0]
    return self._semseg_paths[im_id]

  def _paths(self, i: int) -> dict[str, str]:
    im_id = self.ids[i]
    r = self.root
    p = {'image': os.path.join(r, 'JPEGImages', im_id + '.jpg')}
    if 'edge' in self.tasks or 'normals' in self.tasks:
      p['label_map'] = os.path.join(r, 'pascal-context', 'trainval', im_id + '.mat')
    if 'semseg' in self.tasks:
      p['semseg'] = self._semseg_path(im_id)
    if 'human_parts' in self.tasks:
      p['human_parts'] = os.path.join(r, 'human_parts', im_id + '.mat')
    if 'sal' in self.tasks:
      p['sal'] = os.path.join(r, 'sal_distill', im_id + '.png')
    if 'normals' in self.tasks:
      p['normals'] = os.path.join(r, 'normals_distill', im_id + '.png')
    return p

  # -- human flags
  def human_flags(self) -> np.ndarray:
    """bool [len(all_ids)]: image of the full split contains a human (area > 0).

    Read from ImageSets/Parts/<split>.txt when it covers exactly this split,
    else computed from human_parts/*.mat (slow: one .mat per image).
    """
    if getattr(self, '_full_flags', None) is not None:
      return self._full_flags
    parts_file = os.path.join(self.root, 'ImageSets', 'Parts', f'{self.split}.txt')
    cats = None
    if os.path.isfile(parts_file):
      try:
        with open(parts_file) as f:
          d = json.load(f)
      except ValueError as e:
        raise DatasetFileError(f'cannot parse JSON {parts_file}: {e}') from e
      if sorted(map(str, d)) == sorted(self.all_ids):
        cats = [d[i] for i in self.all_ids]
    if cats is None:
      cats = [parts_object_categories(os.path.join(self.root, 'human_parts', i + '.mat'))
              for i in self.all_ids]
    self._full_flags = np.array([HUMAN_CATEGORY in c for c in cats], bool)
    return self._full_flags

  @property
  def has_human_parts(self) -> np.ndarray:
    """Per-position human flags as used by __getitem__ (needs the full flag pass)."""
    if self._flags is None:
      # Flags are only precomputed when they can differ from the correct ones
      # (bug mode with a subset) or drive filtering; otherwise they are aligned.
      return subset_parts_flags(self.human_flags(), self.source_indices, False)
    return self._flags

  # -- access
  def __len__(self) -> int:
    return len(self.ids)

  def image_size(self, i: int) -> tuple[int, int]:
    """(H, W) of sample i from the JPEG header."""
    return image_size(self._paths(i)['image'])

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    """Sample dict: 'image' uint8 [H,W,3] + the requested task labels."""
    if not -len(self) <= i < len(self):
      raise IndexError(f'index {i} out of range for {len(self)} samples')
    i = int(i) % len(self)
    paths = self._paths(i)
    image = read_image(paths['image'], 'RGB')
    hw = image.shape[:2]
    sample = {'image': image}
    label_map = None
    if 'label_map' in paths:
      mat = load_mat(paths['label_map'])
      if 'LabelMap' not in mat:
        raise DatasetFileError(f'{paths["label_map"]}: no "LabelMap" variable')
      label_map = np.asarray(mat['LabelMap'])
      check_shape(paths['label_map'], label_map, hw)
    for task in self.tasks:
      if task == 'semseg':
        seg = read_image(paths['semseg'])
        if seg.ndim != 2:
          raise DatasetFileError(f'{paths["semseg"]}: expected a single-channel label PNG, got shape {seg.shape}')
        check_shape(paths['semseg'], seg, hw)
        sample['semseg'] = seg.astype(np.uint8)
      elif task == 'human_parts':
        flag = None if self._flags is None else bool(self._flags[i])
        sample['human_parts'], _ = human_parts_from_mat(paths['human_parts'], hw, flag)
      elif task == 'sal':
        sal = read_image(paths['sal'], 'L').astype(np.float32) / 255.
        check_shape(paths['sal'], sal, hw)
        sample['sal'] = (sal > 0.5).astype(np.uint8)
      elif task == 'normals':
        raw = read_image(paths['normals'], 'RGB')
        check_shape(paths['normals'], raw, hw)
        n = 2.0 * raw.astype(np.float32) / 255.0 - 1.0
        # Distilled normals are only trusted on classes that also exist in NYUD.
        valid = np.isin(label_map, self.normals_valid_classes)
        n = np.where(valid[..., None], n, np.float32(0))
        n[np.all(n == 0, axis=-1)] = IGNORE
        sample['normals'] = n.astype(np.float32)
      elif task == 'edge':
        sample['edge'] = edges_from_label_map(label_map)
    return sample

  def __repr__(self) -> str:
    return f'PascalContext(root={self.root!r}, split={self.split!r}, tasks={self.tasks}, n={len(self)})'
