"""The input-independent predictors (fedjax_mtl/trivial.py) against closed forms in NumPy."""

import numpy as np
import pytest

from fedjax_mtl import trivial
from fedjax_mtl.data import synthetic
from fedjax_mtl.metrics.dense import SAL_BETA2
from fedjax_mtl.tasks import IGNORE


@pytest.fixture(scope='module')
def pascal():
  return (synthetic.generate('pascal', 'train', 40, (24, 24), seed=0, version=2),
          synthetic.generate('pascal', 'test', 20, (24, 24), seed=0, version=2))


@pytest.fixture(scope='module')
def nyud():
  return (synthetic.generate('nyud', 'train', 40, (24, 24), seed=0, version=2),
          synthetic.generate('nyud', 'test', 20, (24, 24), seed=0, version=2))


def test_majority_class_miou(pascal):
  # The majority class c everywhere: IoU_c = (test pixels of c) / (valid pixels), every
  # other class 0 (a class absent from the test split too: zero union counts as 0).
  train, test = pascal
  for task, classes in (('semseg', 21), ('human_parts', 7)):
    y = train[task][train[task] != IGNORE]
    c = np.bincount(y.ravel(), minlength=classes).argmax()
    gt = test[task][test[task] != IGNORE]
    want = 100. * np.mean(gt == c) / classes
    assert trivial.task_metric('pascal', task, train, test) == pytest.approx(want, rel=1e-5)


def test_constant_saliency_max_f(pascal):
  # A constant probability p marks every pixel salient at the thresholds <= p (precision
  # q, the test split's salient fraction; recall 1) and none above: maxF is that F.
  train, test = pascal
  q = np.mean(test['sal'][test['sal'] != IGNORE] == 1)
  want = 100. * (1 + SAL_BETA2) * q / (SAL_BETA2 * q + 1)
  assert trivial.task_metric('pascal', 'sal', train, test) == pytest.approx(want, rel=1e-5)


def test_mean_depth_rmse_and_mean_normal_error(nyud):
  train, test = nyud
  d, g = train['depth'], test['depth']
  mean = d[(d > 0) & (d < 80)].astype(np.float64).mean()
  valid = (g > 0) & (g < 80)
  want = np.sqrt(np.mean((mean - g[valid]) ** 2))
  assert trivial.task_metric('nyud', 'depth', train, test) == pytest.approx(want, rel=1e-4)
  n = train['normals'].reshape(-1, 3).astype(np.float64).mean(0)
  n /= np.linalg.norm(n)
  gt = test['normals'].reshape(-1, 3).astype(np.float64)
  gt /= np.linalg.norm(gt, axis=-1, keepdims=True)
  want = np.degrees(np.arccos(np.clip(gt @ n, -1., 1.))).mean()
  assert trivial.task_metric('nyud', 'normals', train, test) == pytest.approx(want, abs=1e-2)


def test_edge_prior_is_far_below_the_labels_themselves(nyud):
  # The per-pixel prior scores far below the labels themselves taken as predictions
  # (about 81, not 100: non-maximum suppression thins the label maps' 1-pixel edges).
  from fedjax_mtl.metrics import edge
  train, test = nyud
  prior = trivial.task_metric('nyud', 'edge', train, test)
  acc = edge.EdgeODSAccumulator(max_dist=0.011)
  acc.update(test['edge'].astype(np.float64), test['edge'])
  perfect = 100. * edge.ods_from_counts(acc.counts, acc.thresholds)['odsF']
  assert perfect > 70. and 0. <= prior < perfect / 2
