"""The real 8-task classification benchmark, read from TensorFlow Datasets.

The task-arithmetic benchmark of MaTU (spec matu §1.2) and NTKFedAvg (spec
ntkfedavg §1.3): SUN397, Cars, RESISC45, EuroSAT, SVHN, GTSRB, MNIST, DTD.
``load`` returns the same arrays as ``mini8.load`` (uint8 RGB ``[n, R, R, 3]``,
int32 labels), so the real tasks can replace the offline stand-ins;
``normalize(images, 'augreg' | 'clip')`` makes the network input, on the host or
on the device.

Nothing is ever downloaded. Datasets are read from the user's TFDS data dir
(``data_dir``, else $TFDS_DATA_DIR, else ``~/tensorflow_datasets``); a dataset
that is not there raises ``ConfigError`` whose one-line message holds the
command that fetches it, e.g.
``tfds build mnist --data_dir=/data/tfds --file_format=array_record``.
TensorFlow is not needed: array_record (and parquet) datasets are read through
``builder.as_data_source``, tfrecord ones (TFDS's default format) with a small
record reader of this module; images are decoded with PIL. Any prepared
version of a dataset is accepted (the one the installed TFDS code names, else
the newest on disk). tensorflow_datasets itself is imported only when a TFDS
task is read (``pip install "fedjax_mtl[tfds]"``).

Tasks, TFDS datasets and splits (TFDS split strings; n = examples):

========  ============================  =================  ============  ================
task      TFDS name                     train              val           test
========  ============================  =================  ============  ================
sun397    sun397/standard-part1-120k    train (19,850)     carved        test (19,850)
cars      cars196                       train (8,144)      carved        test (8,041)
resisc45  resisc45                      train[:60%]        train[60%:    train[80%:]
                                        (18,900)           80%] (6,300)  (6,300)
eurosat   eurosat/rgb                   train[:80%]        train[80%:    train[90%:]
                                        (21,600)           90%] (2,700)  (2,700)
svhn      svhn_cropped                  train (73,257)     carved        test (26,032)
gtsrb     (not in TFDS: ImageFolder)    train (26,640)     carved        test (12,630)
mnist     mnist                         train (60,000)     carved        test (10,000)
dtd       dtd                           train+validation   carved        test (1,880)
                                        (3,760)
========  ============================  =================  ============  ================

These follow the task-vectors code (Ilharco et al.) that MaTU and NTKFedAvg
build on: SUN397 uses official partition 1 (TFDS's ``standard-part1-120k``
config stores those images with at most 120k pixels, larger than any input
resolution used here); DTD merges the official train and validation sets of
split 1 for training and tests on its test set; EuroSAT is split
21,600 / 2,700 / 2,700 (task-vectors' random 80/10/10 split) and RESISC45
18,900 / 6,300 / 6,300 (the 60/20/20 sizes of the "In-domain representation
learning for remote sensing" split the task-vectors code uses). TFDS has only a
single ``train`` split for these two, so the split here is carved by position:
TFDS stores examples in a fixed pseudo-random order (a hash of each example's
key), so contiguous slices are random, class-mixed and deterministic for a
dataset version, but they are *not* the same images as the reference files.

Splits of ``load``:
  train            the full training set (what final accuracies are trained on);
  test             the test set;
  val              a held-out validation set. Where the table says "carved" it
                   is ``min(int(0.1 * n_train), 5000)`` training examples picked
                   by ``np.random.default_rng(0).permutation(n_train)`` (the
                   size rule of task-vectors' ``<Dataset>Val``, 10 % capped at
                   5,000, seed 0; not the same indices as torch's
                   ``random_split``);
  train_minus_val  the training set without the carved val examples (equal to
                   ``train`` for EuroSAT and RESISC45, whose val is separate).

GTSRB is not in TFDS (4.9): it is read with ``imagefolder.load`` from
``<data_dir>/gtsrb/{train,test}/<class>/...`` (or ``folder_root``), 43 class
folders whose sorted names give the labels (the training archive's ``00000`` ..
``00042`` folders; the test images sorted into the same folders by
``GT-final_test.csv``). The sizes in the table are those of torchvision's GTSRB
(``GTSRB-Training_fixed``, used by task-vectors); the older
``GTSRB_Final_Training_Images`` archive holds 39,209 training images.

Labels are TFDS's (``class_names``). They agree with the class lists of the
task-vectors code for every task but SUN397, where TFDS follows
``ClassName.txt`` (category paths sorted bytewise: ``/j/jail/indoor`` = 206
before ``/j/jail_cell`` = 207) and a list sorted after flattening the paths to
folder names has these two swapped; heads built from class names must use the
order of ``class_names``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import shlex
import struct
from typing import Iterator

import numpy as np

from fedjax_mtl.data import image_preprocess as ip
from fedjax_mtl.data import imagefolder
from fedjax_mtl.data.image_preprocess import NORMALIZATION, normalize  # noqa: F401 (re-export)
from fedjax_mtl.errors import ConfigError, check_choice

ENV_DATA_DIR = 'TFDS_DATA_DIR'
DEFAULT_DATA_DIR = '~/tensorflow_datasets'
INSTALL_HINT = 'pip install "fedjax_mtl[tfds]"'
SPLITS = ('train', 'val', 'test', 'train_minus_val')
VAL_FRACTION = 0.1
MAX_VAL = 5000
VAL_SEED = 0
READ_CHUNK = 512  # examples read (and held encoded) at a time


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """Where a task's data is: a TFDS dataset (``name[/config]``, no version) and its

  split strings, or ``tfds_name=None`` for an ImageFolder (split folder names).
  ``val`` None: carved from ``train`` (module docstring).
  """
  tfds_name: str | None
  num_classes: int
  train: str
  test: str
  val: str | None = None


TASK_SPECS = {
    'sun397': TaskSpec('sun397/standard-part1-120k', 397, 'train', 'test'),
    'cars': TaskSpec('cars196', 196, 'train', 'test'),
    'resisc45': TaskSpec('resisc45', 45, 'train[:60%]', 'train[80%:]', 'train[60%:80%]'),
    'eurosat': TaskSpec('eurosat/rgb', 10, 'train[:80%]', 'train[90%:]', 'train[80%:90%]'),
    'svhn': TaskSpec('svhn_cropped', 10, 'train', 'test'),
    'gtsrb': TaskSpec(None, 43, 'train', 'test'),
    'mnist': TaskSpec('mnist', 10, 'train', 'test'),
    'dtd': TaskSpec('dtd', 47, 'train+validation', 'test'),
}
TASKS = tuple(TASK_SPECS)  # the paper's table order


def num_classes(task: str) -> int:
  """Number of classes of `task`."""
  check_choice('benchmark task', task, TASKS)
  return TASK_SPECS[task].num_classes


def resolve_data_dir(data_dir=None) -> str:
  """`data_dir`, else $TFDS_DATA_DIR, else ~/tensorflow_datasets (user-expanded)."""
  d = data_dir or os.environ.get(ENV_DATA_DIR) or DEFAULT_DATA_DIR
  return os.path.abspath(os.path.expanduser(os.fspath(d)))


def build_command(task: str, data_dir=None) -> str:
  """The command that downloads and prepares `task` into the data dir."""
  check_choice('benchmark task', task, TASKS)
  name = TASK_SPECS[task].tfds_name
  if name is None:
    raise ConfigError(f'task {task!r} is not in TFDS; it is read from an ImageFolder')
  d = shlex.quote(resolve_data_dir(data_dir))
  return f'tfds build {name} --data_dir={d} --file_format=array_record'


def _import_tfds():
  try:
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ConfigError(f'reading TFDS datasets needs tensorflow_datasets ({e}); '
                      f'install it with: {INSTALL_HINT}') from None
  return tfds


def _prepared_builder(tfds, name: str, data_dir: str):
  """The builder of a prepared version of `name` in `data_dir`, or None."""
  if not os.path.isdir(os.path.join(data_dir, name.split('/')[0])):
    return None  # nothing of this dataset there (and no TFDS warning about it)
  try:
    builder = tfds.builder(name, data_dir=data_dir)
    if builder.is_prepared():
      return builder
  except Exception:  # pylint: disable=broad-except
    pass  # e.g. files of a version the installed code does not know: try the files
  try:  # another version on disk (newest), read from its files alone
    builder = tfds.core.read_only_builder.builder_from_files(name, data_dir=data_dir)
  except Exception:  # pylint: disable=broad-except
    return None
  return builder if builder.is_prepared() else None


def open_builder(task: str, data_dir=None):
  """The prepared TFDS builder of `task`; ConfigError with the build command if missing."""
  check_choice('benchmark task', task, TASKS)
  spec = TASK_SPECS[task]
  if spec.tfds_name is None:
    raise ConfigError(f'task {task!r} is not in TFDS; it is read from an ImageFolder')
  tfds = _import_tfds()
  d = resolve_data_dir(data_dir)
  builder = _prepared_builder(tfds, spec.tfds_name, d)
  if builder is None:
    raise ConfigError(f'TFDS dataset {spec.tfds_name!r} (task {task!r}) is not prepared in '
                      f'{d}; fetch it once with: {build_command(task, d)}')
  got = builder.info.features['label'].num_classes
  if got != spec.num_classes:
    raise ConfigError(f'TFDS dataset {builder.info.full_name} in {d} has {got} classes, '
                      f'task {task!r} needs {spec.num_classes}')
  return builder


def _folder_root(task: str, data_dir, folder_root) -> str:
  """The ImageFolder root of a task TFDS lacks (``<data_dir>/<task>`` by default)."""
  root = (os.path.expanduser(os.fspath(folder_root)) if folder_root
          else os.path.join(resolve_data_dir(data_dir), task))
  if not os.path.isdir(root):
    spec = TASK_SPECS[task]
    raise ConfigError(f'task {task!r} is not in TFDS and is read from an ImageFolder, but '
                      f'{root!r} does not exist; arrange it as {root}/{spec.train}/<class>/'
                      f'<image> and {root}/{spec.test}/<class>/<image> ({spec.num_classes} '
                      'class folders, labels in sorted name order) or pass folder_root')
  return root


# ---- reading TFDS records -------------------------------------------------------------

def _tfrecord_payloads(path: str, skip: int, take: int) -> Iterator[bytes]:
  """Records `skip` .. `skip + take - 1` (take < 0: to the end) of one TFRecord file.

  Frame: uint64 length, uint32 masked CRC of the length, payload, uint32 CRC of
  the payload (little-endian); the CRCs are not checked.
  """
  with open(path, 'rb') as f:
    i = 0
    while take < 0 or i < skip + take:
      head = f.read(12)
      if not head:
        return
      if len(head) < 12:
        raise ConfigError(f'truncated TFRecord file {path!r}')
      (length,) = struct.unpack('<Q', head[:8])
      if i < skip:
        f.seek(length + 4, os.SEEK_CUR)
      else:
        data = f.read(length)
        f.seek(4, os.SEEK_CUR)
        if len(data) < length:
          raise ConfigError(f'truncated TFRecord file {path!r}')
        yield data
      i += 1


class _SplitReader:
  """Examples (encoded image bytes, label) of one TFDS split string of a builder."""

  def __init__(self, tfds, builder, split: str):
    self._builder = builder
    info = builder.info
    formats = info.available_file_formats() or {info.file_format}
    random_access = set(tfds.core.file_adapters.FileFormat.with_random_access())
    self._decoders = {'image': tfds.decode.SkipDecoding()}
    try:
      if formats & random_access:
        self._source = builder.as_data_source(split=split, decoders=self._decoders)
        self._instructions = None
        self.size = len(self._source)
      elif tfds.core.file_adapters.FileFormat.TFRECORD in formats:
        self._source = None
        sub = info.splits[split]
        self._instructions = list(sub.file_instructions)
        self.size = int(sub.num_examples)
      else:
        raise ConfigError(f'TFDS dataset {info.full_name} is stored as '
                          f'{", ".join(sorted(f.value for f in formats))}, which this reader '
                          'does not support; rebuild it with --file_format=array_record')
    except (ValueError, KeyError) as e:
      raise ConfigError(f'TFDS dataset {info.full_name}: cannot read split {split!r}: '
                        f'{" ".join(str(e).split())}') from None

  def read(self, indices: np.ndarray) -> Iterator[tuple[np.ndarray, list]]:
    """Yield (positions into `indices`, examples) chunks covering all `indices`."""
    order = np.argsort(indices, kind='stable')  # read in storage order
    if self._source is not None:
      for start in range(0, len(order), READ_CHUNK):
        pos = order[start:start + READ_CHUNK]
        yield pos, list(self._source.__getitems__([int(i) for i in indices[pos]]))
      return
    features = self._builder.info.features
    sorted_idx = indices[order]
    k = 0  # next position in `order`
    base = 0  # index of the first record of the current file instruction
    pos, batch = [], []
    for fi in self._instructions:
      take = fi.take if fi.take >= 0 else fi.examples_in_shard - fi.skip
      if k >= len(order):
        break
      if sorted_idx[k] >= base + take:
        base += take
        continue
      path = fi.filename
      if not os.path.isabs(path):
        path = os.path.join(os.fspath(self._builder.data_path), path)
      for j, raw in enumerate(_tfrecord_payloads(path, fi.skip, take)):
        while k < len(order) and sorted_idx[k] == base + j:
          pos.append(order[k])
          batch.append(features.deserialize_example_np(raw, decoders=self._decoders))
          k += 1
        if len(batch) >= READ_CHUNK:
          yield np.asarray(pos), batch
          pos, batch = [], []
        if k >= len(order) or sorted_idx[k] >= base + take:
          break
      base += take
    if batch:
      yield np.asarray(pos), batch
    if k < len(order):
      raise ConfigError(f'TFDS dataset {self._builder.info.full_name}: files hold fewer '
                        f'examples than its dataset_info.json says')


def _read_tfds(tfds, builder, split: str, indices: np.ndarray | None, *, resolution: int,
               interpolation: str, resize: str, task: str
               ) -> tuple[np.ndarray, np.ndarray] | int:
  """Preprocessed images and labels of `indices` of a split string (size if None)."""
  reader = _SplitReader(tfds, builder, split)
  if indices is None:
    return reader.size
  images = np.empty((len(indices), resolution, resolution, 3), np.uint8)
  labels = np.empty((len(indices),), np.int64)
  fn = functools.partial(_decode, resolution=resolution, interpolation=interpolation,
                         resize=resize, where=f'{builder.info.full_name} {split}')
  workers = min(ip.num_workers(), max(1, len(indices) // 16))
  pool = concurrent.futures.ThreadPoolExecutor(workers) if workers > 1 else None
  try:
    for pos, examples in reader.read(np.asarray(indices, np.int64)):
      labels[pos] = [int(e['label']) for e in examples]
      ip.preprocess_into(images, pos, [e['image'] for e in examples], fn, pool)
  finally:
    if pool is not None:
      pool.shutdown()
  c = TASK_SPECS[task].num_classes
  if len(labels) and (labels.min() < 0 or labels.max() >= c):
    raise ConfigError(f'TFDS dataset {builder.info.full_name}: labels outside 0..{c - 1}')
  return images, labels.astype(np.int32)


def _decode(data, *, resolution: int, interpolation: str, resize: str, where: str):
  try:
    return ip.preprocess(data, resolution, interpolation, resize)
  except OSError as e:  # undecodable image bytes
    raise ConfigError(f'cannot decode an image of {where}: {" ".join(str(e).split())}') from None


# ---- the public reader ----------------------------------------------------------------

def _carve(n: int) -> tuple[np.ndarray, np.ndarray]:
  """(val, rest) sorted indices of a training set of `n` examples."""
  n_val = min(int(VAL_FRACTION * n), MAX_VAL)
  perm = np.random.default_rng(VAL_SEED).permutation(n)
  return np.sort(perm[:n_val]), np.sort(perm[n_val:])


def _source_split(spec: TaskSpec, split: str) -> tuple[str, bool | None]:
  """(source split, carve) where carve None = whole split, True = val part, False = rest."""
  if split == 'test':
    return spec.test, None
  if split == 'train':
    return spec.train, None
  if spec.val is not None:
    return (spec.val if split == 'val' else spec.train), None
  return spec.train, split == 'val'


def load(task: str, split: str = 'train', *, data_dir=None, resolution: int = 224,
         num: int | None = None, seed: int = 0, interpolation: str = 'bicubic',
         resize: str = 'crop', folder_root=None, dtype=np.uint8
         ) -> tuple[np.ndarray, np.ndarray]:
  """Images uint8 [n, R, R, 3] RGB (float32 in [0, 1] with ``dtype=np.float32``, as

  ``mini8.load``) and int32 labels of one split of `task`.

  `split` is one of SPLITS (module docstring). `num` None reads the whole split
  in storage order; otherwise `num` distinct examples in random order, drawn
  from ``default_rng([crc32(f'{task}/{split}'), seed])``. Preprocessing
  (`interpolation`, `resize`): see ``image_preprocess``; 'bicubic' + 'crop' is
  the CLIP / task-vectors eval transform. `folder_root` is GTSRB's ImageFolder
  root (default ``<data_dir>/gtsrb``).

  A whole split is held in memory at R x R x 3 bytes per image (SUN397 train at
  224: 19,850 x 150 KB = 3 GB); `num` reads a subset.
  """
  check_choice('benchmark task', task, TASKS)
  check_choice('split', split, SPLITS)
  resolution = ip.check_options(resolution, interpolation, resize)
  dtype = ip.check_dtype(dtype)
  spec = TASK_SPECS[task]
  source, carve = _source_split(spec, split)

  if spec.tfds_name is None:
    root = _folder_root(task, data_dir, folder_root)
    classes = imagefolder.class_names(root, spec.train)
    if len(classes) != spec.num_classes:
      raise ConfigError(f'ImageFolder {os.path.join(root, spec.train)!r} has {len(classes)} '
                        f'class folders, task {task!r} needs {spec.num_classes}')
    n = len(imagefolder.list_files(root, source, classes)[0])
    base = _select(n, carve)
    pick = base[ip.subsample(len(base), num, seed, f'{task}/{split}', _what(task, split))]
    return imagefolder.load(root, source, resolution=resolution, interpolation=interpolation,
                            resize=resize, classes=classes, indices=pick, dtype=dtype)

  tfds = _import_tfds()
  builder = open_builder(task, data_dir)
  n = _read_tfds(tfds, builder, source, None, resolution=resolution,
                 interpolation=interpolation, resize=resize, task=task)
  base = _select(n, carve)
  pick = base[ip.subsample(len(base), num, seed, f'{task}/{split}', _what(task, split))]
  images, labels = _read_tfds(tfds, builder, source, pick, resolution=resolution,
                              interpolation=interpolation, resize=resize, task=task)
  return ip.as_dtype(images, dtype), labels


def _select(n: int, carve: bool | None) -> np.ndarray:
  if carve is None:
    return np.arange(n, dtype=np.int64)
  val, rest = _carve(n)
  return val if carve else rest


def _what(task: str, split: str) -> str:
  return f'split {split!r} of task {task!r}'


def split_size(task: str, split: str = 'train', *, data_dir=None, folder_root=None) -> int:
  """Number of examples of a split, without decoding any image."""
  check_choice('benchmark task', task, TASKS)
  check_choice('split', split, SPLITS)
  spec = TASK_SPECS[task]
  source, carve = _source_split(spec, split)
  if spec.tfds_name is None:
    root = _folder_root(task, data_dir, folder_root)
    n = len(imagefolder.list_files(root, source, imagefolder.class_names(root, spec.train))[0])
  else:
    n = _read_tfds(_import_tfds(), open_builder(task, data_dir), source, None,
                   resolution=ip.MIN_RESOLUTION, interpolation='bicubic', resize='crop',
                   task=task)
  return len(_select(n, carve))


def class_names(task: str, *, data_dir=None, folder_root=None) -> tuple[str, ...]:
  """Class names of `task` in label order (TFDS's label names; GTSRB's folder names)."""
  check_choice('benchmark task', task, TASKS)
  spec = TASK_SPECS[task]
  if spec.tfds_name is None:
    return imagefolder.class_names(_folder_root(task, data_dir, folder_root), spec.train)
  return tuple(open_builder(task, data_dir).info.features['label'].names)
