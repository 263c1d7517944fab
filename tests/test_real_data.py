"""Real-data readers, cache, transforms and grain pipeline on tiny fake dataset trees.

The trees use the real formats (JPEG/PNG via Pillow, PASCAL-Part / Context .mat
files via scipy.io, .npy depth, json, split txt files) at toy sizes.
"""

from __future__ import annotations

import colorsys
import importlib.util
import json
import os
import pickle
import shutil

import numpy as np
import pytest
import scipy.io
from PIL import Image

from fedjax_mtl.data import cache as cache_lib
from fedjax_mtl.data import pipeline
from fedjax_mtl.data import transforms as T
from fedjax_mtl.data.nyud import NYUDv2
from fedjax_mtl.data.pascal_context import (
    DatasetFileError, PascalContext, edges_from_label_map, thin)

from fake_datasets import (CONTEXT, N_IDS, NH, NW, NYU, P_IDS, PH, PW, VALID_CONTEXT,
                           _box, _parts_mat, _png, make_nyud, make_pascal)


@pytest.fixture(scope='module')
def trees(tmp_path_factory):
  base = tmp_path_factory.mktemp('data')
  return {'pascal': make_pascal(str(base / 'PASCALContext')), 'nyud': make_nyud(str(base / 'NYUDv2')),
          'base': base}


# --------------------------------------------------------------------------- readers

def test_pascal_reader_conventions(trees):
  root = trees['pascal']
  ds = PascalContext(root, 'train')
  assert len(ds) == 4 and ds.ids == P_IDS
  for i in range(4):
    s = ds[i]
    assert set(s) == {'image', 'semseg', 'human_parts', 'sal', 'normals', 'edge'}
    assert s['image'].dtype == np.uint8 and s['image'].shape == (PH, PW, 3)
    np.testing.assert_array_equal(s['image'], np.asarray(Image.open(f'{root}/JPEGImages/{P_IDS[i]}.jpg')))
    for k in ('semseg', 'human_parts', 'sal', 'edge'):
      assert s[k].dtype == np.uint8 and s[k].shape == (PH, PW), k
    sub = 'VOC12' if i % 2 == 0 else 'pascal-context'
    np.testing.assert_array_equal(s['semseg'], np.asarray(Image.open(f'{root}/semseg/{sub}/{P_IDS[i]}.png')))
    raw_sal = np.asarray(Image.open(f'{root}/sal_distill/{P_IDS[i]}.png'))
    np.testing.assert_array_equal(s['sal'], (raw_sal / 255. > 0.5).astype(np.uint8))
    assert set(np.unique(s['edge'])) <= {0, 1} and s['edge'].sum() > 0
    lm = scipy.io.loadmat(f'{root}/pascal-context/trainval/{P_IDS[i]}.mat')['LabelMap']
    np.testing.assert_array_equal(s['edge'], edges_from_label_map(lm))
    # Normals: 2x/255-1 on NYU-compatible classes, 255 (all channels) elsewhere.
    n = s['normals']
    assert n.dtype == np.float32 and n.shape == (PH, PW, 3)
    raw = np.asarray(Image.open(f'{root}/normals_distill/{P_IDS[i]}.png')).astype(np.float32)
    valid = np.isin(lm, list(VALID_CONTEXT))
    np.testing.assert_allclose(n[valid], 2 * raw[valid] / 255 - 1, atol=1e-6)
    assert np.all(n[~valid] == 255) and np.all(np.abs(n[valid]) <= 1)
  parts = [ds[i]['human_parts'] for i in range(4)]
  assert set(np.unique(parts[0])) == {0, 1, 2}  # head -> 1, torso -> 2, bg 0
  assert parts[0][8, 20] == 1 and parts[0][20, 20] == 2 and parts[0][38, 2] == 0
  assert np.all(parts[1] == 255)  # no human
  assert parts[2][22, 12] == 4 and parts[2][30, 22] == 5  # lhand -> 4, ruleg -> 5
  assert np.all(parts[3] == 255)  # human without parts
  assert ds.has_human_parts.tolist() == [True, False, True, True]
  only = PascalContext(root, 'train', ('sal',))
  assert set(only[0]) == {'image', 'sal'}


def test_nyud_reader_conventions(trees):
  root = trees['nyud']
  ds = NYUDv2(root, 'train')
  assert len(ds) == 3 and ds.ids == N_IDS
  s = ds[1]
  assert set(s) == {'image', 'semseg', 'depth', 'normals', 'edge'}
  raw_seg = np.asarray(Image.open(f'{root}/segmentation/{N_IDS[1]}.png')).astype(int)
  assert s['semseg'].dtype == np.uint8
  np.testing.assert_array_equal(s['semseg'], np.where(raw_seg == 0, 255, raw_seg - 1))
  assert s['semseg'][s['semseg'] != 255].max() <= 39
  d = np.load(f'{root}/depth/{N_IDS[1]}.npy')
  assert s['depth'].dtype == np.float32 and s['depth'].shape == (NH, NW)
  np.testing.assert_array_equal(s['depth'], np.where(d == 0, 255, d))
  raw_n = np.asarray(Image.open(f'{root}/normals/{N_IDS[1]}.png')).astype(np.float32)
  np.testing.assert_allclose(s['normals'], 2 * raw_n / 255 - 1, atol=1e-6)
  raw_e = np.asarray(Image.open(f'{root}/edge/{N_IDS[1]}.png'))
  np.testing.assert_array_equal(s['edge'], (raw_e == 255).astype(np.uint8))
  sub = NYUDv2(root, 'val', ('depth',), indices=[2, 0])
  assert sub.ids == [N_IDS[2], N_IDS[0]] and set(sub[0]) == {'image', 'depth'}


def test_parts_flags_after_subsetting(trees):
  root = trees['pascal']
  # Full flags [1, 0, 1, 1]; the client gets images [1, 2].
  good = PascalContext(root, 'train', indices=[1, 2])
  assert good.has_human_parts.tolist() == [False, True]
  assert np.all(good[0]['human_parts'] == 255) and good[1]['human_parts'][22, 12] == 4
  # Reference bug: position i reads the flag of image i of the full split -> [1, 0],
  # so image 2's part labels are silently dropped.
  bug = PascalContext(root, 'train', indices=[1, 2], reproduce_parts_index_bug=True)
  assert bug.has_human_parts.tolist() == [True, False]
  assert np.all(bug[0]['human_parts'] == 255) and np.all(bug[1]['human_parts'] == 255)
  # Parts-only clients drop images without humans (reference rule), with each flag set.
  only = PascalContext(root, 'train', ('human_parts',), indices=[1, 2])
  assert only.ids == [P_IDS[2]]
  only_bug = PascalContext(root, 'train', ('human_parts',), indices=[1, 2], reproduce_parts_index_bug=True)
  assert only_bug.ids == [P_IDS[1]]  # keeps the human-less image, drops the human one
  keep = PascalContext(root, 'train', ('human_parts',), indices=[1, 2], drop_images_without_humans=False)
  assert keep.ids == [P_IDS[1], P_IDS[2]]


def test_human_flags_without_parts_file(trees, tmp_path):
  root = make_pascal(str(tmp_path / 'P'), parts_file=False)
  flags = PascalContext(root, 'train', ('human_parts',), drop_images_without_humans=False).human_flags()
  assert flags.tolist() == PascalContext(trees['pascal'], 'train').human_flags().tolist()
  assert not os.listdir(os.path.join(root, 'ImageSets/Parts'))  # never writes into the dataset


def test_thin_and_edges():
  # skimage.morphology.thin docstring example (Guo-Hall).
  sq = np.zeros((7, 7), bool)
  sq[1:-1, 2:-2] = True
  sq[0, 1] = True
  expected = np.zeros((7, 7), np.uint8)
  expected[0, 1] = expected[1, 2] = 1
  expected[2:5, 3] = 1
  np.testing.assert_array_equal(thin(sq).astype(np.uint8), expected)
  # Two regions: |Laplacian| > 0 is 2 px wide at the boundary; thinning keeps 1 px per row.
  lm = np.zeros((10, 12), np.int32)
  lm[:, 6:] = 3
  e = edges_from_label_map(lm)
  expected = np.zeros((10, 12), np.uint8)
  expected[1:, 5] = 1  # verified against skimage.morphology.thin(|cv2.Laplacian| > 0)
  np.testing.assert_array_equal(e, expected)
  assert edges_from_label_map(np.full((5, 5), 4)).sum() == 0


# --------------------------------------------------------------------------- errors

def test_missing_root_and_bad_files(trees, tmp_path):
  missing = str(tmp_path / 'nope')
  with pytest.raises(FileNotFoundError, match='nope.*JPEGImages'):
    PascalContext(missing)
  with pytest.raises(FileNotFoundError, match='nope.*gt_sets'):
    NYUDv2(missing)
  root = shutil.copytree(trees['pascal'], str(tmp_path / 'P'))
  bad = os.path.join(root, 'JPEGImages', P_IDS[1] + '.jpg')
  with open(bad, 'wb') as f:
    f.write(b'not a jpeg')
  ds = PascalContext(root)
  with pytest.raises(DatasetFileError, match=P_IDS[1] + r'\.jpg'):
    ds[1]
  os.remove(os.path.join(root, 'sal_distill', P_IDS[2] + '.png'))
  with pytest.raises(DatasetFileError, match=P_IDS[2] + r'\.png'):
    PascalContext(root)
  assert len(PascalContext(root, tasks=('semseg',), indices=[0])) == 1  # unaffected tasks still load
  nroot = shutil.copytree(trees['nyud'], str(tmp_path / 'N'))
  with open(os.path.join(nroot, 'depth', N_IDS[0] + '.npy'), 'wb') as f:
    f.write(b'garbage')
  with pytest.raises(DatasetFileError, match=N_IDS[0] + r'\.npy'):
    NYUDv2(nroot)[0]


# --------------------------------------------------------------------------- cache

def _assert_same(a, b):
  assert set(a) == set(b)
  for k in a:
    assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_cache_roundtrip(trees, tmp_path):
  out = str(tmp_path / 'pascal_train')
  spec = importlib.util.spec_from_file_location(
      'prepare_data', os.path.join(os.path.dirname(__file__), '..', 'scripts', 'prepare_data.py'))
  prep = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(prep)
  assert prep.main(['--dataset', 'pascal', '--root', trees['pascal'], '--out', out, '--quiet']) == 0
  assert os.path.isfile(os.path.join(out, 'COMPLETE'))
  assert not [n for n in os.listdir(tmp_path) if '.tmp-' in n]
  reader, cached = PascalContext(trees['pascal']), cache_lib.CachedDataset(out)
  assert len(cached) == 4 and cached.ids == reader.ids
  for i in range(4):
    _assert_same(cached[i], reader[i])
  for kw in ({'indices': [1, 2]}, {'indices': [1, 2], 'reproduce_parts_index_bug': True},
             {'indices': [3, 0, 2], 'reproduce_parts_index_bug': True}):
    r, c = PascalContext(trees['pascal'], **kw), cache_lib.CachedDataset(out, **kw)
    assert r.ids == c.ids
    for i in range(len(r)):
      _assert_same(c[i], r[i])
  r = PascalContext(trees['pascal'], tasks=('human_parts',), indices=[1, 2], reproduce_parts_index_bug=True)
  c = cache_lib.CachedDataset(out, tasks=('human_parts',), indices=[1, 2], reproduce_parts_index_bug=True)
  assert c.ids == r.ids and len(c) == 1
  _assert_same(c[0], r[0])
  # Picklable for grain workers (memory maps reopened lazily).
  c2 = pickle.loads(pickle.dumps(cache_lib.CachedDataset(out)))
  _assert_same(c2[3], reader[3])
  # NYUD through the library call.
  nout = cache_lib.prepare('nyud', trees['nyud'], 'train', str(tmp_path / 'nyud_train'), verbose=False)
  nr, nc = NYUDv2(trees['nyud']), cache_lib.CachedDataset(nout)
  for i in range(3):
    _assert_same(nc[i], nr[i])
  # An existing complete cache is reused, not rebuilt.
  mtime = os.path.getmtime(os.path.join(nout, 'COMPLETE'))
  cache_lib.prepare('nyud', trees['nyud'], 'train', nout, verbose=False)
  assert os.path.getmtime(os.path.join(nout, 'COMPLETE')) == mtime


def test_incomplete_cache_refused(trees, tmp_path):
  out = cache_lib.prepare('nyud', trees['nyud'], 'val', str(tmp_path / 'c'), tasks=('depth',), verbose=False)
  os.remove(os.path.join(out, 'COMPLETE'))
  with pytest.raises(cache_lib.CacheError, match='COMPLETE'):
    cache_lib.CachedDataset(out)
  with pytest.raises(cache_lib.CacheError, match='not a complete cache'):
    cache_lib.prepare('nyud', trees['nyud'], 'val', out, verbose=False)
  # A build that fails half-way leaves neither the cache nor its temp directory.
  root = shutil.copytree(trees['nyud'], str(tmp_path / 'N'))
  with open(os.path.join(root, 'edge', N_IDS[2] + '.png'), 'wb') as f:
    f.write(b'broken')
  with pytest.raises(DatasetFileError, match=N_IDS[2]):
    cache_lib.prepare('nyud', root, 'train', str(tmp_path / 'd'), verbose=False)
  assert sorted(os.listdir(tmp_path)) == ['N', 'c']


# --------------------------------------------------------------------------- transforms

def _coord_sample(h=40, w=48):
  """Every field encodes pixel coordinates so misalignment is detectable."""
  r, c = np.mgrid[:h, :w]
  img = np.stack([r, c, np.full_like(r, 7)], -1).astype(np.uint8)
  n = np.stack([np.full((h, w), 0.6), np.full((h, w), 0.0), np.full((h, w), 0.8)], -1).astype(np.float32)
  n[:, : w // 4] = 255  # ignored normals
  return {'image': img, 'semseg': r.astype(np.uint8), 'human_parts': c.astype(np.uint8),
          'edge': ((r + c) % 2).astype(np.uint8), 'normals': n,
          'depth': (1 + r * 0.1 + c * 0.01).astype(np.float32)}


def test_flip_mirrors_labels_and_negates_normals_x():
  s = _coord_sample()
  f = T.hflip_sample(s)
  for k in ('image', 'semseg', 'human_parts', 'edge', 'depth'):
    np.testing.assert_array_equal(f[k], s[k][:, ::-1])
  valid = f['normals'][..., 0] != 255
  np.testing.assert_array_equal(f['normals'][..., 0][valid], -s['normals'][:, ::-1, 0][valid])
  np.testing.assert_array_equal(f['normals'][..., 1:], s['normals'][:, ::-1, 1:])
  assert np.all(f['normals'][:, -(s['image'].shape[1] // 4):] == 255)  # ignore untouched
  assert s['normals'][0, -1, 0] == np.float32(0.6)  # input not modified


def test_scale_divides_depth_and_keeps_alignment():
  s = _coord_sample()
  s['depth'][0, 0] = 255  # ignore stays ignore
  for scale in (0.5, 1.5, 2.0):
    o = T.scale_sample(s, scale)
    h, w = int(40 * scale), int(48 * scale)
    assert o['image'].shape == (h, w, 3) and o['semseg'].shape == (h, w)
    rows, cols = o['semseg'].astype(int), o['human_parts'].astype(int)  # nearest source coords
    expect = (1 + rows * 0.1 + cols * 0.01) / scale
    ign = (rows == 0) & (cols == 0)
    np.testing.assert_allclose(o['depth'][~ign], expect[~ign], rtol=1e-5)
    assert np.all(o['depth'][ign] == 255)
    # Bilinear image of a coordinate ramp stays within 1 of the nearest label.
    assert np.abs(o['image'][..., 0] - rows).max() <= 1.0 and np.abs(o['image'][..., 1] - cols).max() <= 1.0
    assert o['normals'].dtype == np.float32 and set(np.unique(o['normals'][..., 0])) <= {np.float32(0.6), 255}


def test_crop_flip_alignment_and_fused_equivalence():
  s = _coord_sample()
  for seed in range(20):
    o = T.random_scale_crop_flip(s, np.random.default_rng(seed), (24, 32), min_scale=1., max_scale=1.)
    assert o['image'].shape == (24, 32, 3)
    np.testing.assert_array_equal(o['image'][..., 0], o['semseg'])
    np.testing.assert_array_equal(o['image'][..., 1], o['human_parts'])
    np.testing.assert_allclose(o['depth'], 1 + o['semseg'] * 0.1 + o['human_parts'] * 0.01, rtol=1e-6)
    d = np.diff(o['human_parts'].astype(int), axis=1)
    flipped = np.all(d == -1)
    assert flipped or np.all(d == 1)
    valid = o['normals'][..., 0] != 255
    assert np.all(o['normals'][..., 0][valid] == (-0.6 if flipped else 0.6))
    # Fused == scale -> crop -> flip with the same generator (bit-identical).
    a = T.random_scale_crop_flip(s, np.random.default_rng(seed), (24, 32))
    r = np.random.default_rng(seed)
    b = T.random_hflip(T.random_crop(T.random_scale(s, r), r, (24, 32)), r)
    _assert_same(a, b)


def test_cat_max_ratio():
  seg = np.zeros((100, 100), np.uint8)
  seg[:, 70:] = 1
  s = {'image': np.zeros((100, 100, 3), np.uint8), 'semseg': seg}

  def ok_rate(ratio):
    good = 0
    for seed in range(60):
      c = T.random_crop(s, np.random.default_rng(seed), (50, 50), cat_max_ratio=ratio)['semseg']
      cnt = np.bincount(c.ravel(), minlength=2)
      good += (cnt > 0).sum() > 1 and cnt.max() / cnt.sum() < 0.75
    return good / 60

  assert ok_rate(0.75) > 0.9 and ok_rate(1.0) < 0.6


def test_pad_eval_and_ignore_regions():
  s = _coord_sample(30, 20)
  s['depth'][5, 5] = 0
  s['human_parts'] = np.where(s['human_parts'] > 5, 255, 0).astype(np.uint8)  # no part pixels
  o = T.apply_transforms(s, T.eval_transforms((40, 32)))
  assert o['image'].shape == (40, 32, 3) and o['image'].dtype == np.float32
  top, left = 5, 6
  inner = (slice(top, top + 30), slice(left, left + 20))
  pad = np.ones((40, 32), bool)
  pad[inner] = False
  assert np.all(o['image'][pad] == 0)
  expect = (s['image'].astype(np.float32) / 255 - T.IMAGENET_MEAN) / T.IMAGENET_STD
  np.testing.assert_allclose(o['image'][inner], expect, atol=1e-5)
  for k in ('semseg', 'edge'):
    assert o[k].dtype == np.uint8 and np.all(o[k][pad] == 255)
  np.testing.assert_array_equal(o['semseg'][inner], s['semseg'])
  assert np.all(o['normals'][pad] == 255) and np.all(o['depth'][pad] == 255)
  assert o['depth'][top + 5, left + 5] == 255
  assert np.all(o['human_parts'] == 255)  # parts map without part pixels -> all ignore
  with pytest.raises(ValueError, match='larger than the target'):
    T.pad_to_size(s, (16, 16))
  n = np.zeros((4, 4, 3), np.float32)
  n[0, 0] = (0, 0, 1)
  out = T.add_ignore_regions({'image': np.zeros((4, 4, 3)), 'normals': n})['normals']
  assert np.all(out[0, 0] == (0, 0, 1)) and np.all(out.reshape(-1, 3)[1:] == 255)


def test_photometric_and_hsv():
  # Values from cv2.cvtColor (OpenCV 5.0, vectorised path) on the same pixels.
  px = np.array([[[255, 0, 0], [12, 200, 37], [90, 90, 90], [3, 7, 250], [200, 100, 101], [0, 0, 0],
                  [255, 254, 0], [17, 33, 201]]], np.uint8)
  assert T.rgb_to_hsv_u8(px).tolist() == [[[0, 255, 255], [64, 240, 200], [0, 0, 90], [119, 252, 250],
                                           [0, 127, 200], [0, 0, 0], [30, 255, 255], [117, 233, 201]]]
  hsv = np.array([[[0, 255, 255], [179, 128, 77], [60, 10, 250], [119, 255, 3], [45, 200, 200],
                   [150, 77, 128], [90, 0, 99], [30, 255, 255]]], np.uint8)
  assert T.hsv_to_rgb_u8(hsv).tolist() == [[[255, 0, 0], [77, 38, 39], [240, 250, 240], [0, 0, 3],
                                            [121, 200, 43], [128, 89, 127], [99, 99, 99], [255, 255, 0]]]
  rng = np.random.default_rng(0)
  img = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
  hsv = T.rgb_to_hsv_u8(img)
  for (r, g, b), (h, s, v) in zip(img.reshape(-1, 3)[:64], hsv.reshape(-1, 3)[:64].astype(int)):
    ch, cs, cv = colorsys.rgb_to_hsv(r / 255, g / 255, b / 255)
    assert min(abs(h - ch * 180) % 180, 180 - abs(h - ch * 180) % 180) <= 1
    assert abs(s - cs * 255) <= 1 and v == round(cv * 255)
  assert np.abs(T.hsv_to_rgb_u8(hsv).astype(int) - img).max() <= 6
  outs = [T.photometric_distortion({'image': img}, np.random.default_rng(k))['image'] for k in range(8)]
  assert all(o.dtype == np.uint8 and o.shape == img.shape for o in outs)
  assert sum(np.abs(o.astype(int) - img).max() > 6 for o in outs) >= 4  # real jitter, not just round-trip noise
  again = T.photometric_distortion({'image': img}, np.random.default_rng(3))['image']
  np.testing.assert_array_equal(again, outs[3])


# --------------------------------------------------------------------------- pipeline

def test_loader_order_determinism_and_drop_last():
  source = [{'image': np.full((4, 4, 3), i, np.uint8), 'semseg': np.full((4, 4), i, np.uint8)} for i in range(10)]
  idx = [1, 3, 4, 6, 7, 9, 0]

  def order(seed, epoch):
    return [b['semseg'][:, 0, 0].tolist() for b in pipeline.train_loader(source, idx, 3, seed, epoch, [])]

  o = order(0, 0)
  assert len(o) == 2 and all(len(b) == 3 for b in o)  # 7 // 3 batches, remainder dropped
  assert set(sum(o, [])) <= set(idx) and len(set(sum(o, []))) == 6
  assert o == order(0, 0)
  assert o != order(0, 1) and o != order(1, 0)
  np.testing.assert_array_equal(pipeline.epoch_order(idx, 0, 0)[:6], sum(o, []))


def test_loader_augmentation_determinism(trees, tmp_path):
  ds = PascalContext(trees['pascal'])
  ts = T.train_transforms((32, 32))

  def epoch(seed, e):
    return list(pipeline.train_loader(ds, None, 2, seed, e, ts, worker_count=0))

  a, b, c = epoch(5, 0), epoch(5, 0), epoch(5, 1)
  assert len(a) == 2
  for x, y in zip(a, b):
    _assert_same(x, y)
  assert a[0]['image'].shape == (2, 32, 32, 3) and a[0]['image'].dtype == np.float32
  assert a[0]['normals'].shape == (2, 32, 32, 3) and a[0]['semseg'].dtype == np.uint8
  assert any(not np.array_equal(x['image'], y['image']) for x, y in zip(a, c))
  # The cache is a drop-in grain source: same batches as the reader.
  out = cache_lib.prepare('pascal', trees['pascal'], 'train', str(tmp_path / 'c'), verbose=False)
  for x, y in zip(a, pipeline.train_loader(cache_lib.CachedDataset(out), None, 2, 5, 0, ts)):
    _assert_same(x, y)
  # Eval loader keeps the remainder and pads to the fixed size.
  ev = list(pipeline.eval_loader(ds, 3, T.eval_transforms((48, 48))))
  assert [e['image'].shape[0] for e in ev] == [3, 1] and ev[0]['semseg'].shape == (3, 48, 48)


def test_stack_clients_and_benchmark_smoke():
  b1 = {'image': np.zeros((2, 4, 4, 3), np.float32), 'semseg': np.zeros((2, 4, 4), np.uint8)}
  b2 = {k: v + 1 for k, v in b1.items()}
  g = pipeline.stack_clients([b1, b2])
  assert g['image'].shape == (2, 2, 4, 4, 3) and g['semseg'][1].max() == 1
  with pytest.raises(ValueError, match='fields'):
    pipeline.stack_clients([b1, {'image': b1['image']}])
  with pytest.raises(ValueError, match='shapes'):
    pipeline.stack_clients([b1, {'image': b1['image'][:1], 'semseg': b1['semseg']}])
  r = pipeline.benchmark_pipeline(num_batches=1, batch_size=2, size=(32, 32), image_hw=(24, 40))
  assert r['images'] == 2 and r['images_per_s'] > 0
