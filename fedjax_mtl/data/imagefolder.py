"""ImageFolder reader: real classification datasets stored as class folders.

For datasets TFDS does not have (GTSRB, most of the 30-task benchmark) or that
a user keeps as plain image files. Layout::

    root/<split>/<class name>/**/<image>.{jpg,jpeg,png,ppm,bmp,...}

- Classes are the sub-folders of ``root/<split>`` sorted by name; label i is the
  i-th name (as torchvision's ``ImageFolder``). Pass ``classes`` (e.g. the
  train split's ``class_names``) to pin the label order of another split; its
  class folders must then be a subset of ``classes``.
- Images are found recursively inside a class folder, sorted by path; other
  files (CSV annotations, ...) and hidden files are ignored, and so are loose
  files directly in ``root/<split>``.
- Images are preprocessed as in ``image_preprocess`` (RGB, resize shorter side
  + centre crop or squash, bicubic or bilinear) and returned uint8
  ``[n, R, R, 3]`` with int32 labels, like ``mini8.load`` and
  ``tfds_tasks.load``; ``image_preprocess.normalize`` makes the network input.

Bad input (missing root or split, no class folders, an empty class folder, an
unreadable image) raises ``ConfigError`` with one line saying what was found.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os

import numpy as np

from fedjax_mtl.data import image_preprocess as ip
from fedjax_mtl.data.image_preprocess import NORMALIZATION, normalize  # noqa: F401 (re-export)
from fedjax_mtl.errors import ConfigError

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.pgm', '.pbm', '.bmp', '.gif', '.tif',
                    '.tiff', '.webp')
_SHOW = 8  # names listed in an error message


def _listing(names, what: str) -> str:
  names = sorted(names)
  if not names:
    return f'no {what}'
  more = f', ... ({len(names)} in all)' if len(names) > _SHOW else ''
  return f'{what}: ' + ', '.join(names[:_SHOW]) + more


def _visible(names):
  return [n for n in names if not n.startswith('.')]


def _split_dir(root, split: str) -> str:
  root = os.fspath(os.path.expanduser(root))
  if not os.path.isdir(root):
    raise ConfigError(f'ImageFolder root {root!r} does not exist or is not a folder; expected '
                      f'{os.path.join(root, "<split>", "<class>", "<image>")}')
  path = os.path.join(root, split)
  if not os.path.isdir(path):
    found = [n for n in _visible(os.listdir(root)) if os.path.isdir(os.path.join(root, n))]
    raise ConfigError(f'ImageFolder root {root!r} has no split folder {split!r}; found '
                      f'{_listing(found, "split folders")}')
  return path


def class_names(root, split: str = 'train') -> tuple[str, ...]:
  """The sorted class-folder names of ``root/<split>``."""
  path = _split_dir(root, split)
  entries = _visible(os.listdir(path))
  classes = sorted(n for n in entries if os.path.isdir(os.path.join(path, n)))
  if not classes:
    raise ConfigError(f'ImageFolder split folder {path!r} has no class sub-folders; found '
                      f'{_listing(entries, "files")}')
  return tuple(classes)


def _is_image(name: str) -> bool:
  return not name.startswith('.') and name.lower().endswith(IMAGE_EXTENSIONS)


def list_files(root, split: str = 'train',
               classes: tuple[str, ...] | list[str] | None = None
               ) -> tuple[list[str], np.ndarray, tuple[str, ...]]:
  """(image paths, int32 labels, class names) of one split, in sorted order."""
  path = _split_dir(root, split)
  found = class_names(root, split)
  if classes is None:
    classes = found
  else:
    classes = tuple(classes)
    extra = sorted(set(found) - set(classes))
    if extra:
      raise ConfigError(f'ImageFolder split folder {path!r} has class folders not in the '
                        f'given classes: {", ".join(extra[:_SHOW])}; '
                        f'{_listing(classes, "classes")}')
  files, labels = [], []
  for label, name in enumerate(classes):
    cdir = os.path.join(path, name)
    if not os.path.isdir(cdir):
      continue  # a class with no folder in this split (classes pinned by the caller)
    images, others = [], []
    for dirpath, dirnames, filenames in os.walk(cdir, followlinks=True):
      dirnames[:] = sorted(_visible(dirnames))
      for f in sorted(filenames):
        (images if _is_image(f) else others).append(os.path.join(dirpath, f))
    if not images:
      raise ConfigError(f'ImageFolder class folder {cdir!r} holds no image files '
                        f'({", ".join(IMAGE_EXTENSIONS)}); found '
                        f'{_listing([os.path.relpath(o, cdir) for o in others], "files")}')
    files += images
    labels += [label] * len(images)
  return files, np.asarray(labels, np.int32), classes


def _read(path: str, resolution: int, interpolation: str, resize: str) -> np.ndarray:
  try:
    return ip.preprocess(path, resolution, interpolation, resize)
  except OSError as e:  # PIL.UnidentifiedImageError and truncated files are OSErrors
    raise ConfigError(f'cannot read image {path!r}: {" ".join(str(e).split())}') from None


def load(root, split: str = 'train', *, resolution: int = 224, num: int | None = None,
         seed: int = 0, interpolation: str = 'bicubic', resize: str = 'crop',
         classes: tuple[str, ...] | list[str] | None = None,
         indices: np.ndarray | None = None, dtype=np.uint8) -> tuple[np.ndarray, np.ndarray]:
  """Images uint8 [n, R, R, 3] (or float32 in [0, 1] with ``dtype=np.float32``) and

  int32 labels of ``root/<split>``.

  ``num`` None reads the whole split in sorted-path order; otherwise ``num``
  distinct images in random order (``image_preprocess.subsample``, keyed by the
  split name and ``seed``). ``indices`` (into the sorted file list) selects
  images explicitly instead and overrides ``num``.
  """
  resolution = ip.check_options(resolution, interpolation, resize)
  dtype = ip.check_dtype(dtype)
  files, labels, _ = list_files(root, split, classes)
  if indices is None:
    indices = ip.subsample(len(files), num, seed, f'imagefolder/{split}',
                           f'ImageFolder split {split!r} of {os.fspath(root)!r}')
  else:
    indices = np.asarray(indices, np.int64).reshape(-1)
    if indices.size and (indices.min() < 0 or indices.max() >= len(files)):
      raise ConfigError(f'indices out of range for the {len(files)} images of split {split!r}')
  out = np.empty((len(indices), resolution, resolution, 3), np.uint8)
  fn = functools.partial(_read, resolution=resolution, interpolation=interpolation,
                         resize=resize)
  paths = [files[i] for i in indices]
  workers = min(ip.num_workers(), max(1, len(paths) // 16))
  if workers > 1:
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      ip.preprocess_into(out, range(len(paths)), paths, fn, pool)
  else:
    ip.preprocess_into(out, range(len(paths)), paths, fn)
  return ip.as_dtype(out, dtype), labels[indices]
