"""NYUD-v2 multi-task reader (the ATRC / MTI-Net / FedHCA2 layout).

Expected layout under ``root`` (the "NYUDv2" folder of the standard tarball)::

  images/<id>.png          RGB
  segmentation/<id>.png    40 classes as 1..40, 0 = unlabelled
  depth/<id>.npy           float metres, 0 = missing
  normals/<id>.png         2 * x / 255 - 1
  edge/<id>.png            0 / 255
  gt_sets/{train,val}.txt  795 / 654 ids

Samples follow the library conventions: semseg = raw - 1 with raw 0 -> 255,
depth 0 -> 255, normals with zero norm -> 255, edge binarised at 0.5 after /255
(the release's edge PNGs are 0/255, so this equals the reference's float map).
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from fedjax_mtl.data.pascal_context import (
    IGNORE, SPLITS, DatasetFileError, check_shape, check_tasks, image_size, read_image,
    read_split, require_file, select_subset)

NYUD_TASKS = ('semseg', 'depth', 'normals', 'edge')
_LAYOUT = ('images/*.png, segmentation/*.png, depth/*.npy, normals/*.png, edge/*.png, '
           'gt_sets/{train,val}.txt')
_DIRS = {'image': ('images', '.png'), 'semseg': ('segmentation', '.png'),
         'depth': ('depth', '.npy'), 'normals': ('normals', '.png'), 'edge': ('edge', '.png')}


def load_depth(path: str) -> np.ndarray:
  """float32 [H,W] depth in metres from a .npy file, naming the path on failure."""
  require_file(path)
  try:
    d = np.load(path, allow_pickle=False)
  except Exception as e:
    raise DatasetFileError(f'cannot read depth file {path}: {type(e).__name__}: {e}') from e
  d = np.asarray(d, np.float32)
  if d.ndim == 3 and d.shape[-1] == 1:
    d = d[..., 0]
  if d.ndim != 2:
    raise DatasetFileError(f'{path}: expected a 2-D depth map, got shape {d.shape}')
  return d


class NYUDv2:
  """Random-access NYUD-v2 reader returning library-convention samples."""

  dataset_name = 'nyud'

  def __init__(self, root: str, split: str = 'train', tasks: Sequence[str] = NYUD_TASKS, *,
               indices: Sequence[int] | None = None, check_files: bool = True):
    """Index the split; `indices` subsets it (a client chunk), in that order."""
    self.root = os.fspath(root)
    if not os.path.isdir(self.root):
      raise FileNotFoundError(f'NYUD-v2 root not found: {self.root!r} (expected a folder with {_LAYOUT})')
    if split not in SPLITS:
      raise ValueError(f'unknown NYUD-v2 split {split!r}; valid: {", ".join(SPLITS)}')
    self.split = split
    self.tasks = check_tasks(tasks, NYUD_TASKS, 'NYUD-v2')
    split_file = os.path.join(self.root, 'gt_sets', f'{split}.txt')
    if not os.path.isfile(split_file):
      raise FileNotFoundError(f'NYUD-v2 split file not found: {split_file!r} (expected layout: {_LAYOUT})')
    self.all_ids = read_split(split_file)
    self.source_indices, _ = select_subset(len(self.all_ids), indices, None, False, False)
    # Unlike the reference (bug 2), ids follow the subset.
    self.ids = [self.all_ids[i] for i in self.source_indices]
    if check_files:
      for i in range(len(self.ids)):
        for p in self._paths(i).values():
          require_file(p)

  def _paths(self, i: int) -> dict[str, str]:
    keys = ('image',) + self.tasks
    return {k: os.path.join(self.root, _DIRS[k][0], self.ids[i] + _DIRS[k][1]) for k in keys}

  def __len__(self) -> int:
    return len(self.ids)

  def image_size(self, i: int) -> tuple[int, int]:
    """(H, W) of sample i from the PNG header."""
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
    for task in self.tasks:
      path = paths[task]
      if task == 'semseg':
        raw = read_image(path)
        if raw.ndim != 2:
          raise DatasetFileError(f'{path}: expected a single-channel label PNG, got shape {raw.shape}')
        seg = raw.astype(np.int32) - 1
        seg[seg < 0] = IGNORE
        if seg.max(initial=0) > 255:
          raise DatasetFileError(f'{path}: label values above 256')
        out = seg.astype(np.uint8)
      elif task == 'depth':
        out = load_depth(path)
        out = np.where(out == 0, np.float32(IGNORE), out).astype(np.float32)
      elif task == 'normals':
        raw = read_image(path, 'RGB')
        out = (2.0 * raw.astype(np.float32) / 255.0 - 1.0).astype(np.float32)
        out[np.all(out == 0, axis=-1)] = IGNORE
      else:  # edge
        e = read_image(path)
        if e.ndim == 3:
          e = e[..., 0]
        out = (e.astype(np.float32) / 255. > 0.5).astype(np.uint8)
      check_shape(path, out, hw)
      sample[task] = out
    return sample

  def __repr__(self) -> str:
    return f'NYUDv2(root={self.root!r}, split={self.split!r}, tasks={self.tasks}, n={len(self)})'
