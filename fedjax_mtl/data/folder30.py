"""The 30-task benchmark of MaTU's Figs. 4-5 (EMR-Merging's "30 ViTs"), read from folders.

Most of its datasets are not in TFDS (MangoLeafBD, KenyanFood13, Animal-10N,
Garbage, Fruits-360, ...), so each task is an ImageFolder tree a user prepares::

    <data_dir>/<task>/train/<class>/*.jpg
    <data_dir>/<task>/test/<class>/*.jpg

with `<task>` one of `TASKS` (the EMR-Merging list, spec matu §1.2, in its
order). Classes are the train split's folders sorted by name; the test split's
folders must be a subset of them (`imagefolder.list_files`). The number of
classes of a task is read from its train folder, so a dataset version with more
or fewer classes (Fruits-360 has grown over the years) needs no code change.
Images are resized to `resolution` (shorter side, centre crop) and grayscale
ones become 3 channels, as `imagefolder.load` does.
"""

from __future__ import annotations

import os

import numpy as np

from fedjax_mtl.data import imagefolder
from fedjax_mtl.errors import ConfigError, check_choice

TASKS = ('mnist', 'cifar10', 'vegetables', 'food101', 'kvasir', 'intel_images', 'cars',
         'eurosat', 'weather', 'cats_dogs', 'mango_leaf', 'beans', 'cifar100', 'gtsrb',
         'svhn', 'dogs', 'fashion_mnist', 'pets', 'landscape', 'flowers', 'stl10', 'cub200',
         'emnist', 'dtd', 'resisc45', 'sun397', 'kenyan_food13', 'animal10n', 'garbage',
         'fruits360')
ENV_DATA_DIR = 'FEDJAX_MTL_FOLDER30_DIR'


def resolve_data_dir(data_dir=None) -> str:
  """`data_dir`, else $FEDJAX_MTL_FOLDER30_DIR; ConfigError when neither is set."""
  d = data_dir or os.environ.get(ENV_DATA_DIR)
  if not d:
    raise ConfigError('the folder30 benchmark needs its folder: set many.data_dir (or $'
                      f'{ENV_DATA_DIR}) to a directory holding <task>/train and <task>/test')
  return os.path.abspath(os.path.expanduser(os.fspath(d)))


def task_root(task: str, data_dir=None) -> str:
  """`<data_dir>/<task>`, checked to exist (one ConfigError line with the layout)."""
  check_choice('benchmark task', task, TASKS)
  root = os.path.join(resolve_data_dir(data_dir), task)
  if not os.path.isdir(root):
    raise ConfigError(f'folder30 task {task!r} is missing: expected {root}/train/<class>/'
                      f'<images> and {root}/test/<class>/<images>')
  return root


def class_names(task: str, data_dir=None) -> tuple[str, ...]:
  """The task's classes: its train split's class folders, sorted."""
  return imagefolder.class_names(task_root(task, data_dir), 'train')


def num_classes(task: str, data_dir=None) -> int:
  return len(class_names(task, data_dir))


def load(task: str, split: str = 'train', *, data_dir=None, resolution: int = 224,
         num: int | None = None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Images uint8 [n, R, R, 3] and int32 labels of one split ('train' or 'test') of
  `task`, labelled in the train split's class order."""
  check_choice('split', split, ('train', 'test'))
  root = task_root(task, data_dir)
  return imagefolder.load(root, split, resolution=resolution, num=num, seed=seed,
                          classes=imagefolder.class_names(root, 'train'))
