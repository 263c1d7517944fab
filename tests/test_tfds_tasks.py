"""TFDS readers of the real 8-task benchmark, on tiny datasets written in TFDS's format.

Each fake dataset is the real TFDS builder class (its features, configs,
version and file names) with the example generator replaced: a few PNG images
per split whose colour encodes (label, position, split), written by TFDS
itself as array_record (and one converted to tfrecord frames), without
TensorFlow and without network access.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import sys

import numpy as np
import pytest
from PIL import Image

import tensorflow_datasets as tfds
from array_record.python import array_record_module as arm

from fedjax_mtl.data import image_preprocess as ip
from fedjax_mtl.data import tfds_tasks
from fedjax_mtl.errors import ConfigError

SPLIT_CODE = {'train': 40, 'validation': 120, 'test': 200}
MAGENTA = (255, 0, 255)
# TFDS split -> examples written, per task
SIZES = {
    'mnist': {'train': 20, 'test': 12},
    'svhn': {'train': 50, 'test': 8},
    'eurosat': {'train': 40},
    'resisc45': {'train': 20},
    'dtd': {'train': 10, 'validation': 6, 'test': 8},
    'cars': {'train': 12, 'test': 6},
    'sun397': {'train': 12, 'test': 6},
}


def _red(label: int) -> int:
  return (int(label) * 37 + 11) % 256


def _png(array: np.ndarray) -> bytes:
  buf = io.BytesIO()
  Image.fromarray(array).save(buf, format='PNG')
  return buf.getvalue()


def _image(feature, label: int, i: int, split: str) -> bytes:
  """A PNG of the feature's shape (24 x 40 when free): colour (red(label), i, split

  code), with magenta bands on the left and right fifths of free-shape images.
  """
  h, w, c = feature.shape
  h, w = h or 24, w or 40
  colour = (_red(label), i % 256, SPLIT_CODE[split])
  if c == 1:
    return _png(np.full((h, w), colour[0], np.uint8))
  a = np.empty((h, w, 3), np.uint8)
  a[:] = colour
  if feature.shape[1] is None:
    a[:, :w // 5] = MAGENTA
    a[:, w - w // 5:] = MAGENTA
  return _png(a)


def _example(features, label: int, i: int, split: str) -> dict:
  ex = {}
  for key, f in features.items():
    if key == 'image':
      ex[key] = _image(f, label, i, split)
    elif key == 'label':
      ex[key] = label
    elif isinstance(f, tfds.features.BBoxFeature):
      ex[key] = tfds.features.BBox(0.1, 0.1, 0.9, 0.9)
    else:  # Text ids / file names
      ex[key] = f'{split}_{i:05d}.png'  # parsed back by _keys
  return ex


def write_fake(data_dir, task: str, sizes: dict[str, int], version: str | None = None):
  """Prepare the real TFDS builder of `task` in `data_dir` with fake examples."""
  name, _, config = tfds_tasks.TASK_SPECS[task].tfds_name.partition('/')
  real = tfds.builder_cls(name)
  body = {
      'name': real.name,
      'pkg_dir_path': real._get_pkg_dir_path(),
      '_split_generators': lambda self, dl_manager: {
          s: self._generate_examples(s, n) for s, n in sizes.items()},
      '_generate_examples': _generate,
  }
  if version is not None:
    body.update(VERSION=tfds.core.Version(version), SUPPORTED_VERSIONS=[],
                RELEASE_NOTES={version: 'test'})
  fake = type(f'Fake{real.__name__}', (real,), body, skip_registration=True)
  kwargs = {'config': config} if config else {}
  b = fake(data_dir=os.fspath(data_dir), file_format='array_record', **kwargs)
  b.download_and_prepare()
  return b


def _generate(self, split, n):
  c = self.info.features['label'].num_classes
  rng = np.random.default_rng(SPLIT_CODE[split])
  for i in range(n):
    label = int(rng.integers(c)) if i >= c else i  # small splits still hold labels 0, 1, ...
    yield i, _example(self.info.features, label, i, split)


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp('tfds')
  for task, sizes in SIZES.items():
    write_fake(d, task, sizes)
  return str(d)


def _check_pairs(images, labels, split_code=None, inner=slice(None)):
  """Every image's colour matches its label (and split); positions are distinct."""
  assert images.dtype == np.uint8 and labels.dtype == np.int32
  patch = images[:, inner, inner].astype(int)
  centre = np.median(patch.reshape(len(images), -1, 3), axis=1)
  np.testing.assert_allclose(centre[:, 0], [_red(l) for l in labels], atol=2)
  if split_code is not None:
    np.testing.assert_allclose(centre[:, 2], split_code, atol=2)
  return centre[:, 1].round().astype(int)


def test_tasks_and_classes():
  assert tfds_tasks.TASKS == ('sun397', 'cars', 'resisc45', 'eurosat', 'svhn', 'gtsrb',
                              'mnist', 'dtd')
  assert [tfds_tasks.num_classes(t) for t in tfds_tasks.TASKS] == [397, 196, 45, 10, 10, 43,
                                                                   10, 47]
  for task, spec in tfds_tasks.TASK_SPECS.items():
    if spec.tfds_name is not None:  # the datasets exist in the installed TFDS
      cls = tfds.builder_cls(spec.tfds_name.split('/')[0])
      if '/' in spec.tfds_name:
        assert spec.tfds_name.split('/')[1] in cls.builder_configs
  with pytest.raises(ConfigError, match='valid choices'):
    tfds_tasks.num_classes('imagenet')


def test_label_orders_of_tfds(tmp_path):
  """Label names come from the installed TFDS code, no data needed (module docstring)."""
  def names(task):
    return tfds.builder(tfds_tasks.TASK_SPECS[task].tfds_name,
                        data_dir=str(tmp_path)).info.features['label'].names
  assert names('sun397')[206:208] == ['/j/jail/indoor', '/j/jail_cell']
  assert names('eurosat') == sorted(names('eurosat'))
  assert names('svhn') == [str(d) for d in range(10)]
  assert names('resisc45')[:2] == ['airplane', 'airport'] and names('dtd')[0] == 'banded'
  # The zero-shot heads' class names follow the labels the readers give.
  from fedjax_mtl.data import zeroshot_templates as zs
  flat = lambda n: n.split('/', 2)[2].replace('_', ' ').replace('/', ' ')
  assert [flat(n) for n in names('sun397')] == list(zs.CLASSNAMES['SUN397'])
  for task, key in (('cars', 'Cars'), ('resisc45', 'RESISC45'), ('dtd', 'DTD')):
    assert [n.replace('_', ' ').lower() for n in names(task)] == [
        n.replace('_', ' ').lower() for n in zs.CLASSNAMES[key]], task
  assert not any(tmp_path.iterdir())


def test_mnist_grayscale_to_rgb_and_resize(data_dir):
  x, y = tfds_tasks.load('mnist', 'test', data_dir=data_dir, resolution=32)
  assert x.shape == (12, 32, 32, 3) and y.shape == (12,)
  assert (x[..., 0] == x[..., 1]).all() and (x[..., 1] == x[..., 2]).all()
  np.testing.assert_array_equal(x[:, 16, 16, 0], [_red(l) for l in y])
  assert set(y[:10].tolist()) == set(range(10))
  x2, y2 = tfds_tasks.load('mnist', 'test', data_dir=data_dir, resolution=32)
  np.testing.assert_array_equal(x, x2)  # deterministic
  np.testing.assert_array_equal(y, y2)
  xf, yf = tfds_tasks.load('mnist', 'test', data_dir=data_dir, resolution=32, dtype=np.float32)
  assert xf.dtype == np.float32  # as mini8.load(dtype=np.float32): the uint8 image / 255
  np.testing.assert_allclose(xf, x / 255., rtol=1e-6)
  np.testing.assert_array_equal(yf, y)


def _keys(data_dir, task: str, split: str) -> list[int]:
  """Generator positions of a TFDS split in storage order (from the text feature)."""
  b = tfds.builder(tfds_tasks.TASK_SPECS[task].tfds_name, data_dir=data_dir)
  src = b.as_data_source(split, decoders={'image': tfds.decode.SkipDecoding()})
  text = 'id' if 'id' in b.info.features else 'filename'
  out = []
  for k in range(len(src)):
    v = src[k][text]
    out.append(int((v.decode() if isinstance(v, bytes) else v).split('_')[1][:5]))
  return out


def test_splits_carved_val_and_subsample(data_dir):
  x, y = tfds_tasks.load('svhn', 'train', data_dir=data_dir, resolution=16)
  full = _check_pairs(x, y, SPLIT_CODE['train'])
  keys = _keys(data_dir, 'svhn', 'train')
  assert full.tolist() == keys  # whole split: storage order
  assert sorted(keys) == list(range(50))
  xv, yv = tfds_tasks.load('svhn', 'val', data_dir=data_dir, resolution=16)
  xr, yr = tfds_tasks.load('svhn', 'train_minus_val', data_dir=data_dir, resolution=16)
  val, rest = _check_pairs(xv, yv), _check_pairs(xr, yr)
  assert len(val) == 5 and len(rest) == 45  # 10 % of 50
  perm = np.random.default_rng(0).permutation(50)
  assert val.tolist() == [keys[k] for k in np.sort(perm[:5])]
  assert sorted(val.tolist() + rest.tolist()) == list(range(50))
  assert tfds_tasks.split_size('svhn', 'val', data_dir=data_dir) == 5
  assert tfds_tasks.split_size('svhn', 'train_minus_val', data_dir=data_dir) == 45
  # num: a random subset, distinct, reproducible, seed-dependent
  xs, ys = tfds_tasks.load('svhn', 'train', data_dir=data_dir, resolution=16, num=20, seed=3)
  sub = _check_pairs(xs, ys, SPLIT_CODE['train'])
  assert len(set(sub.tolist())) == 20
  xs2, ys2 = tfds_tasks.load('svhn', 'train', data_dir=data_dir, resolution=16, num=20, seed=3)
  np.testing.assert_array_equal(xs, xs2)
  np.testing.assert_array_equal(ys, ys2)
  xo, _ = tfds_tasks.load('svhn', 'train', data_dir=data_dir, resolution=16, num=20, seed=4)
  assert not np.array_equal(xs, xo)
  with pytest.raises(ConfigError, match='fewer than num=60'):
    tfds_tasks.load('svhn', 'train', data_dir=data_dir, num=60)


def test_positional_splits_eurosat_resisc45(data_dir):
  sizes = {s: tfds_tasks.split_size('eurosat', s, data_dir=data_dir)
           for s in tfds_tasks.SPLITS}
  assert sizes == {'train': 32, 'val': 4, 'test': 4, 'train_minus_val': 32}
  keys = _keys(data_dir, 'eurosat', 'train')
  got = {}
  for s in ('train', 'val', 'test'):
    x, y = tfds_tasks.load('eurosat', s, data_dir=data_dir, resolution=16)
    assert x.shape == (sizes[s], 16, 16, 3)
    got[s] = _check_pairs(x, y, SPLIT_CODE['train']).tolist()
  # train[:80%], train[80%:90%], train[90%:] of the storage order
  assert got == {'train': keys[:32], 'val': keys[32:36], 'test': keys[36:]}
  sizes = [tfds_tasks.split_size('resisc45', s, data_dir=data_dir) for s in tfds_tasks.SPLITS]
  assert sizes == [12, 4, 4, 12]  # 60 / 20 / 20


def test_dtd_train_merges_validation_and_crop_vs_squash(data_dir):
  x, y = tfds_tasks.load('dtd', 'train', data_dir=data_dir, resolution=12)
  assert x.shape == (16, 12, 12, 3)
  _check_pairs(x, y, inner=slice(2, -2))
  centre = x[:, 6, 6, 2].astype(int)
  assert (abs(centre - SPLIT_CODE['train']) <= 2).sum() == 10
  assert (abs(centre - SPLIT_CODE['validation']) <= 2).sum() == 6
  # 'crop' (default): the 24 x 40 image's shorter side -> 12, longer -> 20, then a
  # centre crop of columns 4..15 = source columns 8..31, inside the magenta bands
  # (source columns 0..7 and 32..39); only the crop's edge columns see filter bleed.
  magenta = (x[..., 0] > 200) & (x[..., 1] < 60) & (x[..., 2] > 200)
  assert not magenta[:, :, 1:-1].any()
  xs, ys = tfds_tasks.load('dtd', 'test', data_dir=data_dir, resolution=12, resize='squash',
                           interpolation='bilinear')
  magenta = (xs[..., 0] > 200) & (xs[..., 1] < 60) & (xs[..., 2] > 200)
  assert magenta[:, :, 0].all() and magenta[:, :, -1].all() and not magenta[:, :, 6].any()
  _check_pairs(xs, ys, SPLIT_CODE['test'], inner=slice(4, -4))


@pytest.mark.parametrize('task', ['svhn', 'cars', 'sun397'])
def test_other_tasks_read(data_dir, task):
  for split in ('train', 'test'):
    n = SIZES[task][split]
    x, y = tfds_tasks.load(task, split, data_dir=data_dir, resolution=20)
    assert x.shape == (n, 20, 20, 3) and y.min() >= 0 and y.max() < tfds_tasks.num_classes(task)
    _check_pairs(x, y, SPLIT_CODE[split], inner=slice(5, -5))
  assert len(tfds_tasks.class_names(task, data_dir=data_dir)) == tfds_tasks.num_classes(task)


def test_missing_dataset_is_one_line_with_build_command(tmp_path, monkeypatch):
  with pytest.raises(ConfigError) as e:
    tfds_tasks.load('dtd', 'train', data_dir=str(tmp_path))
  msg = str(e.value)
  assert '\n' not in msg
  assert f'tfds build dtd --data_dir={tmp_path}' in msg
  monkeypatch.setenv('TFDS_DATA_DIR', str(tmp_path / 'env'))
  with pytest.raises(ConfigError, match=r'tfds build sun397/standard-part1-120k '
                     r'--data_dir=\S*env --file_format=array_record'):
    tfds_tasks.load('sun397', 'test')
  assert not any(p.name != 'env' for p in tmp_path.iterdir())  # nothing downloaded/created
  assert not (tmp_path / 'env').exists()


def test_missing_tfds_install_hint(monkeypatch):
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', None)
  with pytest.raises(ConfigError, match=r'pip install "fedjax_mtl\[tfds\]"'):
    tfds_tasks.load('mnist', 'test', data_dir='/nonexistent')


def test_bad_arguments(data_dir):
  with pytest.raises(ConfigError, match='split'):
    tfds_tasks.load('mnist', 'validation', data_dir=data_dir)
  with pytest.raises(ConfigError, match='resolution'):
    tfds_tasks.load('mnist', 'test', data_dir=data_dir, resolution=2)
  with pytest.raises(ConfigError, match='interpolation'):
    tfds_tasks.load('mnist', 'test', data_dir=data_dir, interpolation='nearest')
  with pytest.raises(ConfigError, match='dtype'):
    tfds_tasks.load('mnist', 'test', data_dir=data_dir, dtype=np.float16)


def test_other_version_on_disk(tmp_path):
  write_fake(tmp_path, 'mnist', {'train': 4, 'test': 3}, version='1.0.0')
  assert (tmp_path / 'mnist' / '1.0.0' / 'dataset_info.json').exists()
  x, y = tfds_tasks.load('mnist', 'test', data_dir=str(tmp_path), resolution=8)
  assert x.shape == (3, 8, 8, 3)
  assert sorted(y.tolist()) == [0, 1, 2]


def _frame(payload: bytes) -> bytes:
  return struct.pack('<Q', len(payload)) + b'\0' * 4 + payload + b'\0' * 4


def _to_tfrecord(src_dir, dst_dir):
  """Copy a prepared array_record dataset as tfrecord: same serialized examples in

  TFRecord frames (CRCs left zero: the reader does not check them), same info.
  """
  shutil.copytree(src_dir, dst_dir)
  for f in list(dst_dir.iterdir()):
    if '.array_record-' in f.name:
      reader = arm.ArrayRecordReader(str(f))
      records = reader.read_all()
      reader.close()
      out = f.with_name(f.name.replace('.array_record-', '.tfrecord-'))
      out.write_bytes(b''.join(_frame(r) for r in records))
      f.unlink()
  info = json.loads((dst_dir / 'dataset_info.json').read_text())
  info['fileFormat'] = 'tfrecord'
  (dst_dir / 'dataset_info.json').write_text(json.dumps(info))


def test_tfrecord_dataset_without_tensorflow(tmp_path, data_dir):
  for task in ('svhn', 'eurosat'):
    name = tfds_tasks.TASK_SPECS[task].tfds_name
    src = tfds.builder(name, data_dir=data_dir)
    _to_tfrecord(src.data_path, tmp_path / os.path.relpath(src.data_path, data_dir))
    assert tfds.builder(name, data_dir=str(tmp_path)).info.file_format.value == 'tfrecord'
  for task, split in (('svhn', 'train'), ('svhn', 'test'), ('eurosat', 'test'),
                      ('eurosat', 'val')):
    x, y = tfds_tasks.load(task, split, data_dir=str(tmp_path), resolution=8)
    xa, ya = tfds_tasks.load(task, split, data_dir=data_dir, resolution=8)
    assert len(y) == tfds_tasks.split_size(task, split, data_dir=data_dir)
    np.testing.assert_array_equal(x, xa)
    np.testing.assert_array_equal(y, ya)
  for split in ('train', 'val', 'train_minus_val'):
    x, y = tfds_tasks.load('svhn', split, data_dir=str(tmp_path), resolution=8, num=4, seed=1)
    xa, ya = tfds_tasks.load('svhn', split, data_dir=data_dir, resolution=8, num=4, seed=1)
    np.testing.assert_array_equal(x, xa)
    np.testing.assert_array_equal(y, ya)
  assert 'tensorflow' not in sys.modules


def test_gtsrb_reads_imagefolder(tmp_path):
  root = tmp_path / 'gtsrb'
  for split, n in (('train', 2), ('test', 1)):
    for c in range(43):
      d = root / split / f'{c:05d}'
      d.mkdir(parents=True)
      for i in range(n):
        Image.fromarray(np.full((30, 30, 3), (_red(c), i, 9), np.uint8)).save(d / f'{i}.ppm')
  x, y = tfds_tasks.load('gtsrb', 'test', data_dir=str(tmp_path), resolution=8)
  assert x.shape == (43, 8, 8, 3)
  np.testing.assert_array_equal(y, np.arange(43))
  _check_pairs(x, y)
  assert tfds_tasks.split_size('gtsrb', 'val', data_dir=str(tmp_path)) == 8
  _, yv = tfds_tasks.load('gtsrb', 'val', folder_root=str(root), resolution=8)
  _, yr = tfds_tasks.load('gtsrb', 'train_minus_val', folder_root=str(root), resolution=8)
  assert len(yv) == 8 and len(yr) == 78
  assert tfds_tasks.class_names('gtsrb', folder_root=str(root))[:2] == ('00000', '00001')
  with pytest.raises(ConfigError, match=r'not in TFDS .* ImageFolder') as e:
    tfds_tasks.load('gtsrb', 'test', data_dir=str(tmp_path / 'none'))
  assert '\n' not in str(e.value)
  shutil.rmtree(root / 'test' / '00042')  # labels stay those of the train classes
  _, y = tfds_tasks.load('gtsrb', 'test', data_dir=str(tmp_path), resolution=8)
  np.testing.assert_array_equal(y, np.arange(42))
  with pytest.raises(ConfigError, match='no split folder'):
    tfds_tasks.load('gtsrb', 'val', folder_root=str(root / 'train'))


def test_normalize_constants():
  x = np.array([[[0, 128, 255]]], np.uint8)
  a = tfds_tasks.normalize(x, 'augreg')
  np.testing.assert_allclose(a, [[[-1., 128 / 127.5 - 1, 1.]]], atol=1e-6)
  assert a.dtype == np.float32
  c = tfds_tasks.normalize(x, 'clip')
  mean, std = ip.NORMALIZATION['clip']
  np.testing.assert_allclose(c[0, 0], (np.array([0, 128, 255]) / 255. - mean) / std, rtol=1e-5)
  import jax.numpy as jnp
  np.testing.assert_allclose(np.asarray(tfds_tasks.normalize(jnp.asarray(x), 'clip')), c,
                             rtol=1e-6)
  with pytest.raises(ConfigError, match='normalization'):
    tfds_tasks.normalize(x, 'openai')


def test_many_task_paper_config_runs_on_tfds_data(data_dir, tmp_path):
  """`configs/<algorithm>.py:paper,table=2` (MaTU's Table 2 setting: the real tasks
  from a TFDS data dir, per-round gathered samples), shrunk to a micro ViT, 2 tasks
  and 2 rounds, trains, evaluates and writes its table."""
  from conftest import override
  from fedjax_mtl import config_doc, train
  cfg = config_doc.load_config('configs/fedavg.py:paper,table=2')
  assert (cfg.setting, cfg.many.benchmark, cfg.many.feed, cfg.many.zeta_t) == (
      'many_task', 'tfds8', 'round', 0.5)
  cfg = override(cfg, **{'many.data_dir': data_dir, 'many.tasks': 'mnist,svhn',
                         'many.model': 'vit_micro', 'many.resolution': 16,
                         'many.lora_rank': 2, 'many.pretrained': '', 'many.num_clients': 2,
                         'many.class_split': 'iid', 'many.participation': 1.0,
                         'num_rounds': 2, 'eval_every': 1, 'batch_size': 8,
                         'eval_batch_size': 8, 'progress': False})
  out = train.train_and_evaluate(cfg, str(tmp_path / 'w'))
  acc = {r['task']: r['value'] for r in out['eval'] if r['metric'] == 'accuracy'}
  assert set(acc) == {'mnist', 'svhn'} and all(0 <= v <= 100 for v in acc.values())
  assert 'mnist' in (tmp_path / 'w' / 'results.md').read_text()
