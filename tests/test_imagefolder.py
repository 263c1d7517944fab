"""ImageFolder reader and the shared image preprocessing, on folders of small images."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from fedjax_mtl.data import image_preprocess as ip
from fedjax_mtl.data import imagefolder
from fedjax_mtl.errors import ConfigError

CLASSES = ('cat', 'dog', 'zebra')


def _colour(label: int, i: int) -> tuple[int, int, int]:
  return (40 + 80 * label, 10 * i, 77)


@pytest.fixture(scope='module')
def root(tmp_path_factory):
  """root/{train,test}/{cat,dog,zebra}/ with PNG, JPEG, PPM, grayscale and RGBA files."""
  r = tmp_path_factory.mktemp('folder')
  for split, n in (('train', 4), ('test', 2)):
    for label, name in enumerate(CLASSES):
      d = r / split / name
      d.mkdir(parents=True)
      for i in range(n):
        a = np.full((20, 30, 3), _colour(label, i), np.uint8)
        if i == 1:
          (d / 'sub').mkdir(exist_ok=True)  # images are found recursively
          Image.fromarray(a).save(d / 'sub' / f'{i}.ppm')
        elif i == 3:
          rgba = np.concatenate([a, np.full((20, 30, 1), 128, np.uint8)], -1)
          Image.fromarray(rgba).save(d / f'{i}.PNG')
        else:
          Image.fromarray(a).save(d / f'{i}.png')
      (d / 'GT.csv').write_text('annotations are ignored\n')
      (d / '.hidden.png').write_bytes(b'not an image')
  (r / 'train' / 'README.txt').write_text('loose files are ignored\n')
  g = r / 'gray' / 'only'
  g.mkdir(parents=True)
  Image.fromarray(np.full((10, 10), 99, np.uint8)).save(g / 'g.png')
  Image.fromarray(np.full((12, 12), 1000, np.uint16)).save(g / 'g16.png')
  Image.fromarray(np.full((10, 10, 3), (200, 30, 60), np.uint8)).save(g / 'j.jpg', quality=95)
  return r


def test_class_names_and_files(root):
  assert imagefolder.class_names(root, 'train') == CLASSES
  files, labels, classes = imagefolder.list_files(root, 'train')
  assert classes == CLASSES and len(files) == 12
  np.testing.assert_array_equal(labels, np.repeat(np.arange(3), 4))
  assert [f.rsplit('/', 2)[-2:] for f in files[:4]] == [['cat', '0.png'], ['cat', '2.png'],
                                                          ['cat', '3.PNG'], ['sub', '1.ppm']]


def test_load_shapes_labels_and_pairs(root):
  x, y = imagefolder.load(root, 'train', resolution=16)
  assert x.shape == (12, 16, 16, 3) and x.dtype == np.uint8 and y.dtype == np.int32
  np.testing.assert_array_equal(y, np.repeat(np.arange(3), 4))
  order = (0, 2, 3, 1)  # sorted paths: 0.png, 2.png, 3.PNG, sub/1.ppm
  want = np.array([_colour(l, i) for l in range(3) for i in order], np.uint8)
  np.testing.assert_array_equal(x[:, 8, 8], want)  # RGBA: alpha dropped
  assert (x == x[:, :1, :1]).all()  # solid images stay solid through resizing
  xs, ys = imagefolder.load(root, 'train', resolution=16, num=5, seed=1)
  assert xs.shape == (5, 16, 16, 3)
  np.testing.assert_array_equal(xs[:, 0, 0, 0], 40 + 80 * ys)
  xs2, ys2 = imagefolder.load(root, 'train', resolution=16, num=5, seed=1)
  np.testing.assert_array_equal(xs, xs2)
  np.testing.assert_array_equal(ys, ys2)
  xf, yf = imagefolder.load(root, 'train', resolution=16, num=5, seed=1, dtype='float32')
  assert xf.dtype == np.float32 and np.array_equal(yf, ys)
  np.testing.assert_allclose(xf, xs / 255., rtol=1e-6)
  _, y3 = imagefolder.load(root, 'test', resolution=8, indices=[5, 0])
  np.testing.assert_array_equal(y3, [2, 0])
  with pytest.raises(ConfigError, match='fewer than num=13'):
    imagefolder.load(root, 'train', num=13)


def test_grayscale_16bit_and_jpeg(root):
  x, y = imagefolder.load(root, 'gray', resolution=8, interpolation='bilinear',
                          resize='squash')
  assert x.shape == (3, 8, 8, 3) and y.tolist() == [0, 0, 0]
  g, g16, j = x[:, 4, 4]
  assert g.tolist() == [99, 99, 99]
  assert g16.tolist() == [4, 4, 4]  # 1000 / 65535 * 255, the 16-bit range mapped to 8 bits
  np.testing.assert_allclose(j, (200, 30, 60), atol=6)


def test_crop_and_squash_geometry():
  """A 40 x 20 image with red / green / blue vertical thirds-ish bands."""
  a = np.zeros((20, 40, 3), np.uint8)
  a[:, :10] = (255, 0, 0)
  a[:, 10:30] = (0, 255, 0)
  a[:, 30:] = (0, 0, 255)
  img = Image.fromarray(a)
  # crop: shorter side 20 -> 10, longer 40 -> 20; centre crop columns 5..14 of the
  # resized image = source columns 10..29: all green (edge columns see filter bleed).
  c = ip.preprocess(img, 10)
  assert c.shape == (10, 10, 3)
  assert (c[:, 1:-1, 1] > 240).all() and (c[:, 1:-1, [0, 2]] < 15).all()
  # no resize at all when the shorter side already matches: an exact centre crop
  np.testing.assert_array_equal(ip.preprocess(img, 20), a[:, 10:30])
  s = ip.preprocess(img, 10, 'bilinear', 'squash')
  assert (s[:, 0, 0] > 240).all() and (s[:, -1, 2] > 240).all() and (s[:, 5, 1] > 240).all()
  # portrait images crop rows
  np.testing.assert_array_equal(ip.preprocess(Image.fromarray(a.transpose(1, 0, 2)), 20),
                                a[:, 10:30].transpose(1, 0, 2))
  # torchvision's sizes: the longer side is int(R * long / short), offsets rounded
  odd = Image.fromarray(np.arange(21 * 33 * 3, dtype=np.uint8).reshape(21, 33, 3))
  assert ip.preprocess(odd, 7).shape == (7, 7, 3)


def test_errors_are_one_line_and_list_what_was_found(root, tmp_path):
  cases = [
      (lambda: imagefolder.load(tmp_path / 'absent', 'train'), 'does not exist'),
      (lambda: imagefolder.load(root, 'val'), r"no split folder 'val'; found split folders: "
                                             r'gray, test, train'),
      (lambda: imagefolder.load(root, 'test', classes=('cat', 'dog')),
       'class folders not in the given classes: zebra'),
  ]
  empty = tmp_path / 'e'
  (empty / 'train' / 'a').mkdir(parents=True)
  (empty / 'train' / 'b').mkdir(parents=True)
  Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(empty / 'train' / 'a' / 'x.png')
  (empty / 'train' / 'b' / 'notes.txt').write_text('x')
  cases.append((lambda: imagefolder.load(empty, 'train'),
                r"class folder '.*/b' holds no image files \(.*\); found files: notes.txt"))
  flat = tmp_path / 'flat' / 'train'
  flat.mkdir(parents=True)
  Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(flat / 'x.png')
  cases.append((lambda: imagefolder.load(tmp_path / 'flat', 'train'),
                'has no class sub-folders; found files: x.png'))
  bad = tmp_path / 'bad' / 'train' / 'c'
  bad.mkdir(parents=True)
  (bad / 'broken.jpg').write_bytes(b'\xff\xd8 not really a jpeg')
  cases.append((lambda: imagefolder.load(tmp_path / 'bad', 'train'),
                "cannot read image .*broken.jpg"))
  cases.append((lambda: imagefolder.load(root, 'train', resolution=3), 'resolution'))
  cases.append((lambda: imagefolder.load(root, 'train', resize='pad'), 'resize mode'))
  for fn, pattern in cases:
    with pytest.raises(ConfigError, match=pattern) as e:
      fn()
    assert '\n' not in str(e.value)


def test_normalize_numpy_and_float_inputs():
  x = np.array([0, 255], np.uint8).reshape(1, 1, 2, 1).repeat(3, -1)
  n = imagefolder.normalize(x, 'augreg')
  np.testing.assert_allclose(n[0, 0, :, 0], [-1, 1], atol=1e-6)
  f = imagefolder.normalize(x.astype(np.float32) / 255., 'augreg')  # floats are [0, 1]
  np.testing.assert_allclose(f, n, atol=1e-6)
  i = imagefolder.normalize(x, 'imagenet')
  np.testing.assert_allclose(i[0, 0, 0], -np.array(ip.NORMALIZATION['imagenet'][0])
                             / ip.NORMALIZATION['imagenet'][1], rtol=1e-5)


def _write_task(root, classes: int, per_class: dict):
  """An ImageFolder task: <root>/<split>/class<k>/<i>.png, colour-coded by class."""
  for split, n in per_class.items():
    for k in range(classes):
      d = root / split / f'class{k}'
      d.mkdir(parents=True)
      for i in range(n):
        Image.new('RGB', (20, 24), _colour(k, i)).save(d / f'{i}.png')


def test_folder30_benchmark_runs_matus_fig5_setting(tmp_path):
  """folder30 (MaTU's 30 tasks as ImageFolder trees): class counts come from the
  train folders, `configs/matu.py:paper,table=fig5` (shrunk) trains on two of them,
  and a missing task or data dir is one error line."""
  from conftest import override
  from fedjax_mtl import config_doc, train
  from fedjax_mtl.data import folder30
  from fedjax_mtl.errors import ConfigError
  _write_task(tmp_path / 'beans', 3, {'train': 8, 'test': 2})
  _write_task(tmp_path / 'weather', 4, {'train': 6, 'test': 2})
  assert folder30.num_classes('beans', str(tmp_path)) == 3
  images, labels = folder30.load('weather', 'test', data_dir=str(tmp_path), resolution=16)
  assert images.shape == (8, 16, 16, 3) and sorted(set(labels.tolist())) == [0, 1, 2, 3]
  cfg = config_doc.load_config('configs/matu.py:paper,table=fig5,k=2')
  cfg = override(cfg, **{'many.data_dir': str(tmp_path), 'many.tasks': 'beans,weather',
                         'many.model': 'vit_micro', 'many.resolution': 16, 'many.lora_rank': 2,
                         'many.pretrained': '', 'many.num_clients': 2,
                         'many.class_split': 'iid', 'num_rounds': 1, 'eval_every': 1,
                         'batch_size': 4, 'eval_batch_size': 8, 'progress': False})
  out = train.train_and_evaluate(cfg, str(tmp_path / 'w'))
  assert {r['task'] for r in out['eval']} == {'beans', 'weather'}
  with pytest.raises(ConfigError, match="folder30 task 'cifar10' is missing") as e:
    folder30.load('cifar10', data_dir=str(tmp_path))
  assert '\n' not in str(e.value)
  with pytest.raises(ConfigError, match='needs its folder'):
    folder30.resolve_data_dir('')
