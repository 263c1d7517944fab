"""scripts/make_fake_datasets.py: tiny copies of every dataset, read back by the real readers.

Each dataset is written at a tiny --fraction (a few images per split; the
30-task trees with their images capped at 24 px, plus a few tasks at their real
sizes) and read through PascalContext, NYUDv2, the cache build, tfds_tasks and
folder30: split sizes, image sizes, label ranges, labels that are not
degenerate, and labels equal to the procedural scenes they were rendered from.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.ndimage as ndi
from PIL import Image

from fedjax_mtl.data import folder30, real, tfds_tasks
from fedjax_mtl.data.nyud import NYUDv2
from fedjax_mtl.data.pascal_context import (
    HUMAN_CATEGORY, PascalContext, parts_object_categories)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRACTION = 0.001  # PASCAL 5 / 5 images, NYUD 2 / 2 (the minimum)


def _load_script():
  name = 'make_fake_datasets'
  if name not in sys.modules:
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(REPO, 'scripts', 'make_fake_datasets.py'))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pool workers look it up by name
    spec.loader.exec_module(module)
  return sys.modules[name]


mfd = _load_script()


def _quiet(_):
  pass


@pytest.fixture(scope='module')
def dense(tmp_path_factory):
  out = str(tmp_path_factory.mktemp('dense'))
  summary = mfd.run(out, ('pascal', 'nyud'), FRACTION, workers=1, cache=True, log=_quiet)
  return out, summary


def _near(mask: np.ndarray, ref: np.ndarray, px: int = 2) -> float:
  """Share of `mask` pixels within `px` pixels of `ref`."""
  if not mask.any():
    return 0.
  return float((mask & ndi.binary_dilation(ref, iterations=px)).sum() / mask.sum())


def test_tables_match_the_readers():
  assert tuple(mfd.TASKS30) == folder30.TASKS
  assert set(mfd.TASKS8) == set(tfds_tasks.TASKS)
  for task, spec in tfds_tasks.TASK_SPECS.items():
    if spec.tfds_name is not None:  # the split strings the reader asks for exist
      assert {s.split('[')[0] for p in (spec.train, spec.test, spec.val or '') if p
              for s in p.split('+')} <= set(mfd.TASKS8[task].splits)
  assert mfd.TASKS8['sun397'].splits == {'train': 19850, 'test': 19850}
  assert mfd.TASKS30['mnist'].train == 60000 and mfd.TASKS30['svhn'].test == 26032
  # every class of every task has its own pattern code
  for task, t in mfd.TASKS30.items():
    codes = {mfd.class_code(task, c, t.num_classes, t.image.gray) for c in range(t.num_classes)}
    assert len(codes) == t.num_classes


def test_pascal_read_back(dense):
  out, summary = dense
  root = os.path.join(out, 'PASCALContext')
  assert summary['pascal']['counts'] == {'train': 5, 'val': 5}
  ids = mfd.pascal_ids(0)
  classes, humans = set(), 0
  for split in ('train', 'val'):
    ds = PascalContext(root, split)
    assert len(ds) == 5
    ks = sorted(ids[split][:5])
    assert ds.ids == [mfd.pascal_id(k) for k in ks]
    flags = ds.human_flags()  # from ImageSets/Parts, equal to the .mat files
    mats = [HUMAN_CATEGORY in parts_object_categories(os.path.join(root, 'human_parts', i + '.mat'))
            for i in ds.ids]
    np.testing.assert_array_equal(flags, mats)
    for i, k in enumerate(ks):
      s = ds[i]
      ref = mfd.pascal_sample(k, split, 0)
      h, w = s['image'].shape[:2]
      assert max(h, w) == 500 and 330 <= min(h, w) <= 500
      seg = s['semseg']
      assert set(np.unique(seg)) <= set(range(21)) | {255}
      np.testing.assert_array_equal(seg[seg != 255], ref['semseg'][seg != 255])
      assert (seg == 255).mean() < 0.05
      classes |= set(np.unique(seg)) - {255}
      np.testing.assert_array_equal(s['human_parts'], ref['human_parts'])
      humans += int(flags[i])
      if flags[i]:
        assert set(np.unique(s['human_parts'])) <= set(range(7)) and s['human_parts'].max() > 0
      np.testing.assert_array_equal(s['sal'], ref['sal'])
      assert 0 < s['sal'].mean() < 1
      valid = ~np.all(s['normals'] == 255, axis=-1)
      assert 0.02 < valid.mean() < 1  # NYU-compatible classes only
      np.testing.assert_allclose(s['normals'][valid], ref['normals'][valid], atol=1 / 255 + 1e-6)
      edge = s['edge'].astype(bool)
      assert edge.any() and _near(edge, ref['edge'].astype(bool)) > 0.95
  assert len(classes) >= 6 and humans >= 2


def test_nyud_read_back(dense):
  out, summary = dense
  assert summary['nyud']['counts'] == {'train': 2, 'val': 2}
  ids = mfd.nyud_ids(0)
  classes = set()
  for split in ('train', 'val'):
    ds = NYUDv2(os.path.join(out, 'NYUDv2'), split)
    ks = sorted(ids[split][:2])
    assert ds.ids == [mfd.nyud_id(k) for k in ks]
    for i, k in enumerate(ks):
      s, ref = ds[i], mfd.nyud_sample(k, split, 0)
      assert s['image'].shape == (425, 560, 3)
      seg = s['semseg']
      assert set(np.unique(seg)) <= set(range(40)) | {255}
      np.testing.assert_array_equal(seg[seg != 255], ref['semseg'][seg != 255])
      assert (seg == 255).mean() < 0.05
      classes |= set(np.unique(seg)) - {255}
      d = s['depth']
      ok = d != 255
      assert ok.mean() > 0.9 and d[ok].min() > 0 and d[ok].max() < 80
      np.testing.assert_array_equal(d[ok], ref['depth'][ok])
      np.testing.assert_array_equal(s['edge'], ref['edge'])
      assert s['edge'].any()
      np.testing.assert_allclose(s['normals'], ref['normals'], atol=1 / 255 + 1e-6)
  assert len(classes) >= 5


def test_caches_are_where_a_run_reads_them(dense):
  import ml_collections
  out, _ = dense
  config = ml_collections.ConfigDict({'data': {'data_dir': out, 'cache_dir': ''}})
  for dataset, reader in (('pascal', PascalContext), ('nyud', NYUDv2)):
    for split in ('train', 'val'):
      cached = real.open_split(config, dataset, split)
      raw = reader(os.path.join(out, real.DATASET_DIRS[dataset]), split)
      assert cached.ids == raw.ids
      a, b = cached[0], raw[0]
      assert a.keys() == b.keys()
      for key in a:
        np.testing.assert_array_equal(a[key], b[key])


def test_tasks8_read_back(tmp_path):
  tfds = pytest.importorskip('tensorflow_datasets')
  out = str(tmp_path)
  summary = mfd.run(out, ('tasks8',), 1e-4, workers=1, log=_quiet)
  d = os.path.join(out, 'tfds')
  assert summary['tasks8']['counts']['mnist'] == {'train': 10, 'test': 10}
  assert summary['tasks8']['counts']['gtsrb'] == {'train': 43, 'test': 10}
  sizes = {'train': 0, 'test': 0}
  for task in tfds_tasks.TASKS:
    c = tfds_tasks.num_classes(task)
    for split in ('train', 'test'):
      x, y = tfds_tasks.load(task, split, data_dir=d, resolution=8)
      sizes[split] += len(y)
      assert x.shape == (len(y), 8, 8, 3) and x.std() > 10
      assert 0 <= y.min() and y.max() < c and len(np.unique(y)) >= min(len(y), c, 2)
    # val + train_minus_val partition train (carved) or are separate slices
    n_val = tfds_tasks.split_size(task, 'val', data_dir=d)
    assert n_val >= 1
  assert tfds_tasks.split_size('eurosat', 'train', data_dir=d) == 8  # train[:80%] of 10
  assert tfds_tasks.split_size('dtd', 'train', data_dir=d) == 20  # train + validation
  # the stored images have the real datasets' shapes
  def first(name, split='train'):
    return tfds.builder(name, data_dir=d).as_data_source(split=split)[0]['image']
  assert first('mnist').shape == (28, 28, 1)
  assert first('svhn_cropped').shape == (32, 32, 3)
  assert first('eurosat/rgb').shape == (64, 64, 3)
  assert first('resisc45').shape == (256, 256, 3)
  h, w, _ = first('sun397/standard-part1-120k').shape
  assert 100_000 < h * w <= 120_000
  assert 400 <= max(first('cars196').shape[:2]) <= 1000
  with Image.open(os.path.join(d, 'gtsrb', 'train', '00000', '00000_00000.ppm')) as im:
    assert im.format == 'PPM' and 25 <= max(im.size) <= 90


def test_tasks30_every_task_small(tmp_path):
  out = str(tmp_path)
  mfd.run(out, ('tasks30',), 1e-9, workers=1, log=_quiet, max_side=24)
  d = os.path.join(out, 'folder30')
  for task, t in mfd.TASKS30.items():
    assert folder30.num_classes(task, d) == t.num_classes
    x, y = folder30.load(task, 'train', data_dir=d, resolution=8)
    np.testing.assert_array_equal(np.bincount(y, minlength=t.num_classes), 1)
    x, y = folder30.load(task, 'test', data_dir=d, resolution=8)
    assert len(y) == min(t.num_classes, 10) and len(np.unique(y)) == len(y)


def test_tasks30_real_sizes(tmp_path):
  out = str(tmp_path)
  # --test_fraction scales the test folders alone (mnist 10,000 * 0.005; the others at
  # their floors)
  summary = mfd.run(out, ('tasks30',), 0.003, workers=1, tasks=['beans', 'mango_leaf', 'mnist'],
                    log=_quiet, test_fraction=0.005)
  assert summary['tasks30']['counts'] == {'beans': {'train': 3, 'test': 3},
                                          'mango_leaf': {'train': 10, 'test': 8},
                                          'mnist': {'train': 180, 'test': 50}}
  manifest = json.load(open(os.path.join(out, 'fake_datasets.json')))['tasks30']
  assert manifest['fraction'] == 0.003 and manifest['test_fraction'] == 0.005
  assert manifest['counts']['mnist'] == {'train': 180, 'test': 50}
  assert manifest['full']['mnist'] == {'train': 60000, 'test': 10000}
  d = os.path.join(out, 'folder30')
  assert sorted(os.listdir(d)) == ['beans', 'mango_leaf', 'mnist']
  expect = {'beans': ((500, 500), 'RGB', 'JPEG'), 'mango_leaf': ((320, 240), 'RGB', 'JPEG'),
            'mnist': ((28, 28), 'L', 'PNG')}
  for task, (size, mode, fmt) in expect.items():
    files, labels, _ = folder30.imagefolder.list_files(os.path.join(d, task), 'train')
    assert len(np.unique(labels)) == mfd.TASKS30[task].num_classes
    with Image.open(files[0]) as im:
      assert (im.size, im.mode, im.format) == (size, mode, fmt)
  x, y = folder30.load('mnist', 'train', data_dir=d, resolution=16)
  assert np.bincount(y).tolist() == [18] * 10


def _main(capsys, *argv):
  rc = mfd.main(list(argv))
  return rc, capsys.readouterr()


@pytest.mark.parametrize('argv, needle', [
    (['--datasets=pascal,imagenet'], "unknown --datasets entry 'imagenet'; valid choices: "
                                     'pascal, nyud, tasks8, tasks30'),
    (['--fraction=0'], "--fraction must be a number in (0, 1], got '0'"),
    (['--fraction=1.5'], "--fraction must be a number in (0, 1], got '1.5'"),
    (['--fraction=half'], "--fraction must be a number in (0, 1], got 'half'"),
    (['--datasets=tasks30', '--tasks=mnist,imagenet'], "unknown --tasks entry 'imagenet'"),
    (['--datasets=pascal', '--tasks=mnist'], '--tasks applies to tasks8 / tasks30'),
    (['--workers=-1'], '--workers must be >= 0'),
    (['--test_fraction=2'], "--test_fraction must be a number in (0, 1], got '2'"),
])
def test_bad_input_is_one_error_line(tmp_path, capsys, argv, needle):
  out = tmp_path / 'out'
  rc, cap = _main(capsys, f'--out={out}', *argv)
  assert rc == 2 and cap.out == ''
  assert cap.err.count('\n') == 1 and cap.err.startswith('error: ') and needle in cap.err
  assert not out.exists()  # nothing written


def test_missing_tfds_is_one_error_line(tmp_path, capsys, monkeypatch):
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', None)  # import fails
  rc, cap = _main(capsys, f'--out={tmp_path / "out"}', '--datasets=tasks8')
  assert rc == 2 and cap.err.count('\n') == 1
  assert 'tasks8 needs tensorflow_datasets' in cap.err and 'fedjax_mtl[tfds]' in cap.err
  assert not (tmp_path / 'out').exists()


def test_existing_output_refused_then_overwritten(tmp_path, capsys):
  out = tmp_path / 'out'
  stale = out / 'cache' / 'nyud_train'
  stale.mkdir(parents=True)
  (stale / 'COMPLETE').write_text('old')
  rc, cap = _main(capsys, f'--out={out}', '--datasets=nyud', '--fraction=0.001')
  assert rc == 2 and cap.err.count('\n') == 1 and 'pass --overwrite' in cap.err
  assert (stale / 'COMPLETE').read_text() == 'old' and not (out / 'NYUDv2').exists()
  # --overwrite replaces the dataset (and drops its stale cache); a pool of 2 writers,
  # in a fresh interpreter as from the command line (this test process may hold JAX's
  # threads, which a forked pool must not inherit)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  r = subprocess.run([sys.executable, os.path.join(root, 'scripts', 'make_fake_datasets.py'),
                      f'--out={out}', '--datasets=nyud', '--fraction=0.001', '--workers=2',
                      '--test_fraction=0.005', '--overwrite', '--quiet'],
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 0 and r.stderr == '', r.stderr
  assert not stale.exists()
  assert f'--config.data.data_dir={out}' in r.stdout and 'scripts/prepare_data.py' in r.stdout
  # --test_fraction scales the val split alone (654 * 0.005 = 3 images; train at its floor)
  assert len(NYUDv2(str(out / 'NYUDv2'), 'val')) == 3
  assert len(NYUDv2(str(out / 'NYUDv2'), 'train')) == 2
  manifest = json.loads((out / 'fake_datasets.json').read_text())
  assert manifest['nyud'] == {'fraction': 0.001, 'test_fraction': 0.005,
                              'counts': {'train': 2, 'val': 3},
                              'full': {'train': 795, 'val': 654}}
