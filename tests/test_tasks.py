"""Task registry and per-task losses vs independent NumPy references (spec fedhca2.md §4).

Labels follow the library convention read by `local.make_loss_fn`: dense maps
`[B, H, W]` (semseg / human_parts / sal / edge uint8, depth float32 metres) and
normals `[B, H, W, 3]` float32; ignore value 255 everywhere (all three normal
channels 255 where invalid). Head outputs are `[B, H, W, C]` and may carry more
channels than the task needs (heterogeneous slots are padded to the max).
"""

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_mtl import tasks
from fedjax_mtl.errors import ConfigError

B, H, W = 2, 6, 7
EXTRA = 3  # spare head channels beyond the task's own


# ----------------------------------------------------------------------------
# NumPy references written from the spec / released losses.py semantics:
# masked selection of valid pixels, sum, divide by max(#valid, 1).


def _log_softmax(x):
  x = x.astype(np.float64)
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def ref_ce(logits, labels, class_weight=None):
  lab = labels.astype(np.int64)
  valid = lab != 255
  lp = _log_softmax(logits)[valid]  # [n, C]
  y = lab[valid]
  nll = -lp[np.arange(len(y)), y]
  w = np.ones_like(nll) if class_weight is None else np.asarray(class_weight)[y]
  return float((w * nll).sum() / max(valid.sum(), 1))


def ref_balanced_ce(logits, labels):
  lab = labels.astype(np.int64)
  masked = lab[lab != 255]
  # Released CELoss(balanced=True): pos_weight = #negatives / #valid,
  # class weights (1 - pos_weight, pos_weight) for classes (0, 1).
  pos_weight = (1.0 - masked).sum() / max(masked.size, 1)
  return ref_ce(logits, labels, class_weight=(1.0 - pos_weight, pos_weight))


def ref_normals(pred, labels):
  pred = pred.astype(np.float64)
  norm = np.linalg.norm(pred, axis=-1, keepdims=True)
  out = pred / np.maximum(norm, 1e-12)  # F.normalize(p=2)
  mask = np.all(labels != 255, axis=-1)
  l1 = np.abs(out[mask] - labels[mask].astype(np.float64)).sum()
  return float(l1 / max(mask.sum(), 1))


def ref_edge(logits, labels, w=0.95):
  x = logits[..., 0].astype(np.float64)
  mask = labels != 255
  x, y = x[mask], (labels[mask] == 1).astype(np.float64)
  factor = 1.0 / (1.0 - w)
  # BCEWithLogits(pos_weight = w * factor), mean over valid, then / factor.
  log_sig = -np.logaddexp(0.0, -x)
  log_one_minus = -np.logaddexp(0.0, x)
  per = -(w * factor * y * log_sig + (1 - y) * log_one_minus)
  return float(per.mean() / factor) if per.size else 0.0


def ref_depth(pred, labels):
  p = pred[..., 0].astype(np.float64)
  mask = labels != 255
  return float(np.abs(p[mask] - labels[mask]).sum() / max(mask.sum(), 1))


REFS = {'semseg': ref_ce, 'human_parts': ref_ce, 'sal': ref_balanced_ce,
        'normals': ref_normals, 'edge': ref_edge, 'depth': ref_depth}


def random_labels(rng, task, channels, ignore_frac=0.25, shape=(B, H, W)):
  """Random labels of `task` in the library format with ~ignore_frac ignored."""
  ign = rng.uniform(size=shape) < ignore_frac
  if task in ('semseg', 'human_parts'):
    lab = rng.integers(0, channels, size=shape)
    return np.where(ign, 255, lab).astype(np.uint8)
  if task in ('sal', 'edge'):
    lab = (rng.uniform(size=shape) < 0.3).astype(np.int64)
    return np.where(ign, 255, lab).astype(np.uint8)
  if task == 'normals':
    n = rng.normal(size=shape + (3,))
    n /= np.linalg.norm(n, axis=-1, keepdims=True)
    return np.where(ign[..., None], 255., n).astype(np.float32)
  if task == 'depth':
    d = rng.uniform(0.5, 10., size=shape)
    return np.where(ign, 255., d).astype(np.float32)
  raise KeyError(task)


def random_out(rng, channels, shape=(B, H, W), scale=2.0):
  return (scale * rng.normal(size=shape + (channels + EXTRA,))).astype(np.float32)


# Jitted once per (task, channels, shapes): much cheaper than op-by-op dispatch.
_loss_jit = jax.jit(tasks.task_loss, static_argnums=(0, 3))
_value_and_grad_jit = jax.jit(jax.value_and_grad(tasks.task_loss, argnums=1),
                              static_argnums=(0, 3))


def loss(task, out, labels, channels):
  return float(_loss_jit(task, jnp.asarray(out), jnp.asarray(labels), channels))


def value_and_grad(task, out, labels, channels):
  v, g = _value_and_grad_jit(task, jnp.asarray(out), jnp.asarray(labels), channels)
  return float(v), np.asarray(g)


TASK_CASES = [(d, t) for d, info in tasks.DATASETS.items() for t in info.tasks]


# ----------------------------------------------------------------------------
# Registry


def test_loss_weights_match_spec():
  # Spec §4 table / released losses.py: same weights for ST and MT clients.
  assert dict(tasks.DATASETS['pascal'].loss_weights) == {
      'semseg': 1., 'human_parts': 2., 'sal': 5., 'normals': 10., 'edge': 50.}
  assert dict(tasks.DATASETS['nyud'].loss_weights) == {
      'semseg': 1., 'depth': 1., 'normals': 10., 'edge': 50.}


def test_dataset_tasks_and_channels_match_spec():
  p, n = tasks.DATASETS['pascal'], tasks.DATASETS['nyud']
  assert set(p.tasks) == {'semseg', 'human_parts', 'sal', 'normals', 'edge'}
  assert set(n.tasks) == {'semseg', 'depth', 'normals', 'edge'}
  # Spec §2 heads: PASCAL SemSeg 21, Parts 7, Normals 3, Edge 1, Sal 2;
  # NYUD SemSeg 40, Normals 3, Edge 1, Depth 1.
  assert {t: p.channels(t) for t in p.tasks} == {
      'semseg': 21, 'human_parts': 7, 'normals': 3, 'edge': 1, 'sal': 2}
  assert {t: n.channels(t) for t in n.tasks} == {
      'semseg': 40, 'normals': 3, 'edge': 1, 'depth': 1}
  for info in (p, n):
    assert set(info.loss_weights) == set(info.tasks)
    for i, t in enumerate(info.tasks):
      assert info.task_id(t) == i
  # Edge maxDist and crop sizes (spec §2, §5) and local epochs (spec §3.5).
  assert p.edge_max_dist == pytest.approx(0.0075)
  assert n.edge_max_dist == pytest.approx(0.011)
  assert p.train_size == (512, 512) and n.train_size == (448, 576)
  assert p.default_local_epochs == 1 and n.default_local_epochs == 4
  assert set(tasks.ALL_TASKS) == set(p.tasks) | set(n.tasks)


def test_metric_names_and_directions():
  assert tasks.METRIC_NAMES == {'semseg': 'mIoU', 'human_parts': 'mIoU', 'sal': 'maxF',
                                'normals': 'mErr', 'depth': 'RMSE', 'edge': 'odsF'}
  assert tasks.LOWER_IS_BETTER == {'normals', 'depth'}
  assert set(tasks.LOSSES) == set(tasks.ALL_TASKS)


def test_image_statistics_are_imagenet_on_255_scale():
  np.testing.assert_allclose(tasks.IMAGE_MEAN, np.array([0.485, 0.456, 0.406]) * 255)
  np.testing.assert_allclose(tasks.IMAGE_STD, np.array([0.229, 0.224, 0.225]) * 255)
  assert tasks.IGNORE == 255


def test_unknown_dataset_and_task_raise_config_error_with_choices():
  assert tasks.get_dataset('nyud') is tasks.DATASETS['nyud']
  with pytest.raises(ConfigError) as e:
    tasks.get_dataset('cityscapes')
  assert "'pascal'" in str(e.value) and "'nyud'" in str(e.value)
  with pytest.raises(ConfigError) as e:
    tasks.DATASETS['nyud'].task_id('sal')
  assert "'depth'" in str(e.value) and 'nyud' in str(e.value)


# ----------------------------------------------------------------------------
# Losses vs references


@pytest.mark.parametrize('dataset,task', TASK_CASES)
def test_task_loss_matches_numpy_reference(dataset, task):
  rng = np.random.default_rng(zlib.crc32(f'{dataset}/{task}'.encode()))
  c = tasks.DATASETS[dataset].channels(task)
  labels = random_labels(rng, task, c)
  out = random_out(rng, c)
  got = loss(task, out, labels, c)
  want = REFS[task](out[..., :c], labels)
  assert np.isfinite(got)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('dataset,task', TASK_CASES)
def test_task_loss_ignores_spare_channels_and_ignored_pixels(dataset, task):
  rng = np.random.default_rng(7)
  c = tasks.DATASETS[dataset].channels(task)
  labels = random_labels(rng, task, c, ignore_frac=0.4)
  out = random_out(rng, c)
  base = loss(task, out, labels, c)
  # Spare channels beyond `channels` belong to other tasks of the slot.
  out2 = out.copy()
  out2[..., c:] = 100. * rng.normal(size=out2[..., c:].shape)
  assert loss(task, out2, labels, c) == pytest.approx(base, rel=1e-6)
  # Predictions at ignored pixels do not matter.
  ign = np.all(labels == 255, -1) if task == 'normals' else labels == 255
  assert ign.any()
  out3 = out.copy()
  out3[ign] = 50. * rng.normal(size=out3[ign].shape)
  assert loss(task, out3, labels, c) == pytest.approx(base, rel=1e-5)
  # ... but predictions at valid pixels do.
  out4 = out.copy()
  out4[~ign, :c] += 3. * rng.normal(size=out4[~ign, :c].shape)
  assert loss(task, out4, labels, c) != pytest.approx(base, rel=1e-4)


@pytest.mark.parametrize('dataset,task', TASK_CASES)
def test_fully_ignored_batch_gives_zero_finite_loss_and_grads(dataset, task):
  rng = np.random.default_rng(3)
  c = tasks.DATASETS[dataset].channels(task)
  labels = random_labels(rng, task, c, ignore_frac=1.1)
  assert np.all(labels == 255)
  value, grad = value_and_grad(task, random_out(rng, c), labels, c)
  assert np.isfinite(value) and value == 0.
  assert np.all(np.isfinite(grad))
  assert np.abs(grad).max() == 0.


@pytest.mark.parametrize('dataset,task', TASK_CASES)
def test_grads_finite_and_nonzero_on_valid_pixels(dataset, task):
  rng = np.random.default_rng(11)
  c = tasks.DATASETS[dataset].channels(task)
  labels = random_labels(rng, task, c)
  out = random_out(rng, c)
  if task == 'normals':
    out[0, 0, 0] = 0.  # a zero prediction must not produce NaN gradients
  _, grad = value_and_grad(task, out, labels, c)
  assert np.all(np.isfinite(grad))
  assert np.all(grad[..., c:] == 0.)  # spare channels get no gradient
  ign = np.all(labels == 255, -1) if task == 'normals' else labels == 255
  assert np.all(grad[ign] == 0.)
  assert np.abs(grad[~ign]).sum() > 0.


def test_cross_entropy_divides_by_valid_count_not_pixel_count():
  # Uniform logits: every valid pixel costs log(C); ignored pixels cost nothing.
  c = 21
  labels = np.full((1, 4, 5), 255, np.uint8)
  labels[0, :2, :3] = 4
  out = np.zeros((1, 4, 5, c), np.float32)
  got = loss('semseg', out, labels, c)
  np.testing.assert_allclose(got, np.log(c), rtol=1e-6)


def test_normals_loss_is_scale_invariant_and_zero_at_the_label():
  rng = np.random.default_rng(0)
  labels = random_labels(rng, 'normals', 3)
  gt = np.where(labels == 255, rng.normal(size=labels.shape), labels).astype(np.float32)
  assert loss('normals', 7.5 * gt, labels, 3) == pytest.approx(0., abs=1e-6)
  out = random_out(rng, 3)
  a = loss('normals', out, labels, 3)
  b = loss('normals', 0.01 * out, labels, 3)
  assert a == pytest.approx(b, rel=1e-5)
  # One valid pixel with the opposite normal: L1 = sum |(-n) - n| = 2 * |n|_1.
  lab = np.full((1, 1, 2, 3), 255., np.float32)
  n = np.array([0.6, 0., -0.8], np.float32)
  lab[0, 0, 0] = n
  pred = np.zeros((1, 1, 2, 3), np.float32)
  pred[0, 0, 0] = -n
  pred[0, 0, 1] = [1., 1., 1.]
  got = loss('normals', pred, lab, 3)
  assert got == pytest.approx(2 * np.abs(n).sum(), rel=1e-6)


def test_normals_pixel_with_any_255_channel_is_ignored():
  # The convention is all three channels 255; the mask is "all channels != 255"
  # as in the released L1Loss, so a single 255 channel already drops the pixel.
  lab = np.array([[[[0., 0., 1.], [255., 0., 0.]]]], np.float32)
  pred = np.array([[[[0., 0., 1.], [1., 0., 0.]]]], np.float32)
  assert loss('normals', pred, lab, 3) == pytest.approx(0., abs=1e-6)


def test_balanced_ce_weights_favour_the_rarer_class():
  # 1 positive, 3 negatives valid (+ ignored): p = #neg/#valid = 0.75, so the
  # positive pixel has weight 0.75 and negatives 0.25. Uniform logits -> log 2 each.
  labels = np.array([[[1, 0, 0, 0, 255, 255]]], np.uint8)
  out = np.zeros((1, 1, 6, 2), np.float32)
  got = loss('sal', out, labels, 2)
  want = (0.75 * np.log(2) + 3 * 0.25 * np.log(2)) / 4
  assert got == pytest.approx(want, rel=1e-6)
  # Misclassifying only the rare positive costs more than only one negative.
  wrong_pos = out.copy()
  wrong_pos[0, 0, 0] = [5., -5.]
  wrong_neg = out.copy()
  wrong_neg[0, 0, 1] = [-5., 5.]
  assert loss('sal', wrong_pos, labels, 2) > loss('sal', wrong_neg, labels, 2)
  # All-positive batch: p = 0, the positive class weight vanishes.
  labels1 = np.array([[[1, 1, 255]]], np.uint8)
  out1 = np.array([[[[3., -3.], [2., 0.], [0., 0.]]]], np.float32)
  assert loss('sal', out1, labels1, 2) == pytest.approx(0., abs=1e-7)


def test_edge_bce_equals_095_pos_005_neg_weighting():
  # Zero logits: -log sigma(0) = log 2 for both classes, weighted 0.95 / 0.05.
  rng = np.random.default_rng(5)
  labels = random_labels(rng, 'edge', 1, ignore_frac=0.3, shape=(2, 8, 8))
  n_pos = int((labels == 1).sum())
  n_neg = int((labels == 0).sum())
  out = np.zeros(labels.shape + (1,), np.float32)
  got = loss('edge', out, labels, 1)
  want = np.log(2.) * (0.95 * n_pos + 0.05 * n_neg) / (n_pos + n_neg)
  assert got == pytest.approx(want, rel=1e-6)
  # pos_weight argument of the underlying function
  got7 = float(jax.jit(tasks.balanced_bce_loss)(out, labels, pos_weight=0.7))
  assert got7 == pytest.approx(np.log(2.) * (0.7 * n_pos + 0.3 * n_neg) / (n_pos + n_neg),
                               rel=1e-6)


def test_edge_bce_is_stable_for_large_logits():
  labels = np.array([[[1, 0, 1, 0]]], np.uint8)
  out = np.array([[[[80.], [-80.], [-80.], [80.]]]], np.float32)
  got = loss('edge', out, labels, 1)
  assert np.isfinite(got)
  assert got == pytest.approx(ref_edge(out, labels), rel=1e-5)


def test_depth_loss_ignores_255_and_counts_zero_depth_labels():
  # 255 is the only invalid marker of the loss (depth 0 is turned into 255 by the
  # readers' AddIgnoreRegions before it reaches the loss).
  labels = np.array([[[2., 255., 4.]]], np.float32)
  pred = np.array([[[[1.], [-100.], [4.5]]]], np.float32)
  got = loss('depth', pred, labels, 1)
  assert got == pytest.approx((1. + 0.5) / 2, rel=1e-6)


def test_loss_accepts_bfloat16_outputs():
  rng = np.random.default_rng(9)
  labels = random_labels(rng, 'semseg', 21)
  out = random_out(rng, 21)
  got = loss('semseg', jnp.asarray(out, jnp.bfloat16), labels, 21)
  want = ref_ce(np.asarray(jnp.asarray(out, jnp.bfloat16).astype(jnp.float32))[..., :21], labels)
  assert got == pytest.approx(want, rel=1e-5)
