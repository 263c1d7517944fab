"""Tiny fake PASCAL-Context / NYUD-v2 trees in the real on-disk formats (for tests).

JPEG/PNG via Pillow, PASCAL-Part / Context .mat files via scipy.io, .npy depth,
json and split txt files, at toy sizes.
"""

from __future__ import annotations

import json
import os

import numpy as np
import scipy.io
from PIL import Image

PH, PW = 40, 48  # fake PASCAL image size
NH, NW = 32, 40  # fake NYUD image size
P_IDS = ['2008_000001', '2008_000002', '2008_000003', '2008_000004']
N_IDS = ['0001', '0002', '0003']
CONTEXT = {'aeroplane': 2, 'bed': 5, 'sofa': 7, 'wall': 9, 'tvmonitor': 11, 'sky': 13}
NYU = {'wall': 1, 'bed': 2, 'sofa': 3, 'unknown': 0, 'chair': 4}
VALID_CONTEXT = {5, 7, 9, 11}  # NYU ∩ context (minus 'unknown') + tvmonitor


def _png(path, arr, mode=None):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  Image.fromarray(arr, mode).save(path) if mode else Image.fromarray(arr).save(path)


def _parts_mat(path, objects):
  """PASCAL-Part file: anno(imname, objects(class, class_ind, mask, parts(part_name, mask)))."""
  objs = np.zeros((1, len(objects)), dtype=[('class', 'O'), ('class_ind', 'O'), ('mask', 'O'), ('parts', 'O')])
  for j, (cind, mask, parts) in enumerate(objects):
    if parts:
      pa = np.zeros((1, len(parts)), dtype=[('part_name', 'O'), ('mask', 'O')])
      for k, (name, pm) in enumerate(parts):
        pa[0, k] = (name, pm.astype(np.uint8))
    else:
      pa = np.zeros((0, 0))
    objs[0, j] = ('obj', np.array([[cind]]), mask.astype(np.uint8), pa)
  anno = np.zeros((1, 1), dtype=[('imname', 'O'), ('objects', 'O')])
  anno[0, 0] = ('img', objs)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  scipy.io.savemat(path, {'anno': anno})


def _box(r0, r1, c0, c1, hw=(PH, PW)):
  m = np.zeros(hw, bool)
  m[r0:r1, c0:c1] = True
  return m


def make_pascal(root, parts_file=True, ids=P_IDS, num_val=2):
  """A PASCALContext/ tree with train images `ids` and the first `num_val` as val."""
  rng = np.random.default_rng(0)
  for sub in ('ImageSets/Context', 'ImageSets/Parts', 'json', 'pascal-context/trainval'):
    os.makedirs(os.path.join(root, sub), exist_ok=True)
  for split in ('train', 'val'):
    with open(os.path.join(root, 'ImageSets/Context', f'{split}.txt'), 'w') as f:
      f.write('\n'.join(ids if split == 'train' else ids[:num_val]) + '\n')
  with open(os.path.join(root, 'json/context_classes.json'), 'w') as f:
    json.dump(CONTEXT, f)
  with open(os.path.join(root, 'json/nyu_classes.json'), 'w') as f:
    json.dump(NYU, f)
  with open(os.path.join(root, 'json/pascal_part.json'), 'w') as f:
    json.dump({'1': {'body': 1}}, f)
  person = _box(5, 35, 10, 30)
  parts_per_image = [
      [(15, person, [('head', _box(5, 12, 15, 25)), ('torso', _box(12, 25, 12, 28))]), (8, _box(0, 5, 0, 5), [])],
      [(5, _box(10, 30, 10, 30), [])],  # no human
      [(15, person, [('lhand', _box(20, 24, 10, 14)), ('ruleg', _box(25, 35, 20, 25))])],
      [(15, person, [])],  # human without part annotations
  ]
  cats = {}
  for k, im_id in enumerate(ids):
    _png(os.path.join(root, 'JPEGImages', im_id + '.jpg'),
         rng.integers(0, 256, (PH, PW, 3), dtype=np.uint8))
    lm = np.full((PH, PW), 9, np.uint16)  # wall (valid for normals)
    lm[:, PW // 2:] = 13  # sky (not an NYU class)
    lm[5:15, 5:15] = 11  # tvmonitor (manual addition)
    lm[20 + k % 4:30, 30:40] = 2  # aeroplane (invalid)
    scipy.io.savemat(os.path.join(root, 'pascal-context/trainval', im_id + '.mat'), {'LabelMap': lm})
    seg = rng.integers(0, 21, (PH, PW)).astype(np.uint8)
    seg[0, :] = 255
    sub = 'VOC12' if k % 2 == 0 else 'pascal-context'  # both locations are used
    _png(os.path.join(root, 'semseg', sub, im_id + '.png'), seg, 'L')
    _parts_mat(os.path.join(root, 'human_parts', im_id + '.mat'), parts_per_image[k % 4])
    cats[im_id] = [c for c, _, _ in parts_per_image[k % 4]]
    sal = rng.choice(np.array([0, 100, 200, 255], np.uint8), (PH, PW))
    _png(os.path.join(root, 'sal_distill', im_id + '.png'), sal, 'L')
    _png(os.path.join(root, 'normals_distill', im_id + '.png'),
         rng.integers(0, 256, (PH, PW, 3), dtype=np.uint8))
  if parts_file:
    with open(os.path.join(root, 'ImageSets/Parts/train.txt'), 'w') as f:
      json.dump(cats, f)
  return root


def make_nyud(root, ids=N_IDS):
  """An NYUDv2/ tree whose train and val splits are both `ids`."""
  rng = np.random.default_rng(1)
  os.makedirs(os.path.join(root, 'gt_sets'), exist_ok=True)
  for split in ('train', 'val'):
    with open(os.path.join(root, 'gt_sets', f'{split}.txt'), 'w') as f:
      f.write('\n'.join(ids) + '\n')
  for im_id in ids:
    _png(os.path.join(root, 'images', im_id + '.png'), rng.integers(0, 256, (NH, NW, 3), dtype=np.uint8))
    _png(os.path.join(root, 'segmentation', im_id + '.png'), rng.integers(0, 41, (NH, NW)).astype(np.uint8), 'L')
    d = rng.uniform(0.5, 9.5, (NH, NW)).astype(np.float32)
    d[:3, :3] = 0
    os.makedirs(os.path.join(root, 'depth'), exist_ok=True)
    np.save(os.path.join(root, 'depth', im_id + '.npy'), d)
    _png(os.path.join(root, 'normals', im_id + '.png'), rng.integers(0, 256, (NH, NW, 3), dtype=np.uint8))
    _png(os.path.join(root, 'edge', im_id + '.png'), (rng.random((NH, NW)) < 0.1).astype(np.uint8) * 255, 'L')
  return root
