"""Dense metrics: accumulate-then-finalize vs NumPy references (spec fedhca2.md §5).

Every metric is pooled over the whole split: sufficient statistics of several
batches are summed and finalised once, which must equal the statistics of one
big batch and the reference formula, and generally differs from the mean of
per-batch metrics.
"""

import types
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_mtl import evaluation, tasks
from fedjax_mtl.federation import GroupSpec
from fedjax_mtl.metrics import dense

H, W = 5, 6


# ----------------------------------------------------------------------------
# NumPy references


def _softmax(x):
  x = x.astype(np.float64)
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def ref_miou(logits, labels, num_classes):
  """Per-class TP/(TP+FP+FN) over the pooled valid pixels; zero-union -> 0."""
  pred = np.argmax(logits[..., :num_classes], -1)
  valid = labels != 255
  ious = []
  for c in range(num_classes):
    tp = np.sum((pred == c) & (labels == c) & valid)
    fp = np.sum((pred == c) & (labels != c) & valid)
    fn = np.sum((pred != c) & (labels == c) & valid)
    ious.append(tp / (tp + fp + fn) if tp + fp + fn > 0 else 0.)
  return 100. * np.mean(ious)


def ref_confusion(logits, labels, num_classes):
  pred = np.argmax(logits[..., :num_classes], -1)
  valid = labels != 255
  conf = np.zeros((num_classes, num_classes), np.int64)
  np.add.at(conf, (labels[valid].astype(np.int64), pred[valid]), 1)
  return conf


def ref_max_f(logits, labels, beta2=0.3, positive=np.greater_equal):
  """The released SaliencyMeter: a pixel is predicted salient when P >= threshold."""
  prob = _softmax(logits[..., :2])[..., 1]
  valid = labels != 255
  prob, gt = prob[valid], labels[valid] == 1
  best = 0.
  for k in range(1, 20):  # thresholds 0.05, 0.10, ..., 0.95
    pred = positive(prob, k / 20.)
    tp = np.sum(pred & gt)
    pp, ap = np.sum(pred), np.sum(gt)
    prec = tp / pp if pp else 0.
    rec = tp / ap if ap else 0.
    f = (1 + beta2) * prec * rec / (beta2 * prec + rec) if prec + rec > 0 else 0.
    best = max(best, f)
  return 100. * best


def ref_merr(pred, labels):
  """Mean angle (degrees) over valid pixels, via arccos of the cosine."""
  valid = np.all(labels != 255, -1)
  p = pred[..., :3][valid].astype(np.float64)
  g = labels[valid].astype(np.float64)
  p /= np.linalg.norm(p, axis=-1, keepdims=True)
  g /= np.linalg.norm(g, axis=-1, keepdims=True)
  cos = np.clip(np.sum(p * g, -1), -1., 1.)
  return float(np.degrees(np.arccos(cos)).mean())


def ref_rmse(pred, labels):
  p = np.maximum(pred[..., 0].astype(np.float64), 0.)
  valid = (labels > 0) & (labels < 80)
  return float(np.sqrt(np.mean((p[valid] - labels[valid]) ** 2)))


def ref_edge_bce(logits, labels, w=0.95):
  x = logits[..., 0].astype(np.float64)
  valid = labels != 255
  x, y = x[valid], (labels[valid] == 1).astype(np.float64)
  per = -(w * y * -np.logaddexp(0., -x) + (1 - w) * (1 - y) * -np.logaddexp(0., x))
  return float(per.mean())


# ----------------------------------------------------------------------------
# Random batches


def make_batch(rng, task, n, channels, ignore_frac):
  shape = (n, H, W)
  ign = rng.uniform(size=shape) < ignore_frac
  if task in ('semseg', 'human_parts'):
    lab = np.where(ign, 255, rng.integers(0, channels, shape)).astype(np.uint8)
    out = rng.normal(size=shape + (channels,))
    # Make predictions correlated with the labels so IoUs are not tiny.
    hit = (rng.uniform(size=shape) < 0.5) & ~ign
    out[hit, lab[hit]] += 4.
  elif task == 'sal':
    lab = np.where(ign, 255, rng.uniform(size=shape) < 0.35).astype(np.uint8)
    out = rng.normal(size=shape + (2,))
    out[..., 1] += 1.5 * (lab == 1)
  elif task == 'normals':
    g = rng.normal(size=shape + (3,))
    g /= np.linalg.norm(g, axis=-1, keepdims=True)
    lab = np.where(ign[..., None], 255., g)
    out = g + 0.7 * rng.normal(size=shape + (3,))
  elif task == 'depth':
    d = rng.uniform(0.3, 10., shape)
    lab = np.where(ign, 255., d)
    lab[0, 0, 0] = 0.  # invalid by the metric's 0 < gt < 80 rule
    lab[0, 0, 1] = 85.  # invalid as well
    out = (d + rng.normal(size=shape))[..., None]
    out[0, 1, 0, 0] = -3.  # clamped to 0 before the error
  elif task == 'edge':
    lab = np.where(ign, 255, rng.uniform(size=shape) < 0.2).astype(np.uint8)
    out = rng.normal(size=shape + (1,))
  else:
    raise KeyError(task)
  if task in ('normals', 'depth'):
    lab = lab.astype(np.float32)
  return out.astype(np.float32), lab


REFS = {'semseg': ref_miou, 'human_parts': ref_miou, 'sal': ref_max_f,
        'normals': ref_merr, 'depth': ref_rmse, 'edge': ref_edge_bce}
CASES = [('pascal', t) for t in tasks.DATASETS['pascal'].tasks] + [
    ('nyud', t) for t in ('semseg', 'depth')]

_stats_jit = jax.jit(dense.task_stats, static_argnums=(0, 3))


def stats(task, out, labels, channels):
  return jax.tree.map(np.asarray, _stats_jit(task, jnp.asarray(out), jnp.asarray(labels),
                                             channels))


def add(a, b):
  return jax.tree.map(lambda x, y: np.asarray(x) + np.asarray(y), a, b)


def ref_metric(task, out, labels, channels):
  if task in ('semseg', 'human_parts'):
    return REFS[task](out, labels, channels)
  return REFS[task](out, labels)


def split_batches(rng, task, channels, sizes=(3, 3, 3)):
  """Batches with very different ignore fractions (so per-batch means differ)."""
  batches = [make_batch(rng, task, n, channels, f) for n, f in zip(sizes, (0.05, 0.6, 0.3))]
  out = np.concatenate([o for o, _ in batches])
  lab = np.concatenate([l for _, l in batches])
  return batches, out, lab


# ----------------------------------------------------------------------------
# Pooled accumulation vs one batch vs reference


@pytest.mark.parametrize('dataset,task', CASES)
def test_accumulated_batches_equal_one_big_batch_and_reference(dataset, task):
  rng = np.random.default_rng(zlib.crc32(f'{dataset}/{task}'.encode()))
  c = tasks.DATASETS[dataset].channels(task)
  batches, out, lab = split_batches(rng, task, c)
  acc = None
  for o, l in batches:
    s = stats(task, o, l, c)
    acc = s if acc is None else add(acc, s)
  big = stats(task, out, lab, c)
  for a, b in zip(jax.tree.leaves(acc), jax.tree.leaves(big)):
    np.testing.assert_allclose(a, b, rtol=1e-5)
  got = dense.finalize(task, acc)
  np.testing.assert_allclose(got, dense.finalize(task, big), rtol=1e-5)
  np.testing.assert_allclose(got, ref_metric(task, out, lab, c), rtol=1e-4, atol=1e-6)
  # Pooling matters: the mean of per-batch metrics is a different number.
  per_batch = np.mean([ref_metric(task, o, l, c) for o, l in batches])
  assert not np.isclose(got, per_batch, rtol=1e-4)


@pytest.mark.parametrize('num_classes', [7, 21, 40])
def test_confusion_matrix_matches_reference(num_classes):
  rng = np.random.default_rng(num_classes)
  out, lab = make_batch(rng, 'semseg', 3, num_classes, 0.3)
  # Extra head channels (heterogeneous slot padding) are not argmax candidates.
  out = np.concatenate([out, np.full(out.shape[:-1] + (4,), 1e3, np.float32)], -1)
  conf = stats('semseg', out, lab, num_classes)['confusion']
  assert conf.shape == (num_classes, num_classes)
  np.testing.assert_array_equal(conf, ref_confusion(out, lab, num_classes))
  assert conf.sum() == np.sum(lab != 255)


def test_miou_counts_zero_union_classes_as_zero():
  # 3 classes, class 2 never appears in gt or prediction, 0 and 1 perfect:
  # the released evaluation averages the zero-union class in as IoU 0.
  conf = np.array([[5, 0, 0], [0, 3, 0], [0, 0, 0]])
  assert dense.miou(conf) == pytest.approx(200. / 3)
  # A class predicted but absent from gt has IoU 0 (union = FP > 0).
  conf = np.array([[4, 1, 0], [0, 3, 0], [0, 0, 0]])
  assert dense.miou(conf) == pytest.approx(100. * (4 / 5 + 3 / 4 + 0.) / 3)


def test_max_f_formula_and_thresholds():
  np.testing.assert_allclose(dense.SAL_THRESHOLDS, np.arange(1, 20) / 20.)
  assert dense.SAL_BETA2 == pytest.approx(0.3)
  tp = np.array([8., 6., 0.])
  pp = np.array([10., 6., 0.])
  ap = 12.
  f = []
  for t, p in zip(tp, pp):
    prec, rec = (t / p if p else 0.), t / ap
    f.append(1.3 * prec * rec / (0.3 * prec + rec) if t else 0.)
  assert dense.max_f(tp, pp, ap) == pytest.approx(100. * max(f))
  assert dense.max_f(np.zeros(19), np.zeros(19), 0.) == 0.  # no positives anywhere


def test_saliency_stats_ignore_255_and_count_per_threshold():
  lab = np.array([[[1, 0, 255, 1]]], np.uint8)
  p1 = np.array([0.07, 0.5, 0.99, 0.93])  # P(salient) per pixel
  logits = np.stack([np.zeros(4), np.log(p1 / (1 - p1))], -1)[None, None].astype(np.float32)
  s = stats('sal', logits, lab, 2)
  th = dense.SAL_THRESHOLDS
  valid_p, valid_gt = p1[[0, 1, 3]], np.array([1, 0, 1], bool)
  np.testing.assert_array_equal(s['pp'], [(valid_p >= t).sum() for t in th])
  np.testing.assert_array_equal(s['tp'], [((valid_p >= t) & valid_gt).sum() for t in th])
  assert float(s['ap']) == 2.


def test_saliency_counts_a_probability_equal_to_a_threshold_as_positive():
  # Equal logits give P(salient) = 0.5 exactly, a threshold: the released evaluation
  # (`preds >= thresh`) counts those pixels as predicted salient.
  lab = np.array([[[1, 1, 1, 1, 1, 0, 255, 0, 0]]], np.uint8)
  p1 = np.array([.5, .5, .5, .5, .93, .47, .5, .32, .07])
  logits = np.stack([np.zeros(9), np.log(p1 / (1 - p1))], -1)[None, None].astype(np.float32)
  assert np.all(np.asarray(jax.nn.softmax(jnp.asarray(logits), -1))[0, 0, [0, 1, 2, 3, 6], 1]
                == 0.5)
  s = stats('sal', logits, lab, 2)
  half = list(dense.SAL_THRESHOLDS).index(0.5)
  assert (s['pp'][half], s['tp'][half]) == (5., 5.)  # the four ties and 0.93
  got = dense.finalize('sal', s)
  ge, gt = ref_max_f(logits, lab), ref_max_f(logits, lab, positive=np.greater)
  assert got == pytest.approx(ge, rel=1e-6) and ge == pytest.approx(100.)
  # With P > t the ties drop out at 0.5, and 0.45 also admits the non-salient 0.47.
  assert gt == pytest.approx(100. * 1.3 * (5 / 6) / (.3 * 5 / 6 + 1))


def test_normals_error_known_angles():
  # 90 degrees, 180 degrees and 0 degrees (prediction scale is irrelevant); one ignored.
  lab = np.array([[[[1., 0., 0.], [0., 0., 1.], [0., 1., 0.], [255., 255., 255.]]]],
                 np.float32)
  pred = np.array([[[[0., 3., 0.], [0., 0., -2.], [0., 0.5, 0.], [1., 0., 0.]]]], np.float32)
  s = stats('normals', pred, lab, 3)
  assert float(s['count']) == 3.
  assert dense.finalize('normals', s) == pytest.approx((90. + 180. + 0.) / 3, rel=1e-5)


def test_depth_rmse_valid_range_and_clamp():
  lab = np.array([[[2., 0., 255., 79.5, 90.]]], np.float32)
  pred = np.array([[[[-1.], [5.], [5.], [79.5], [0.]]]], np.float32)
  s = stats('depth', pred, lab, 1)
  assert float(s['count']) == 2.  # 0, 255 and 90 are invalid
  # pred -1 is clamped to 0: error 2 on the first pixel, 0 on the 79.5 one.
  assert dense.finalize('depth', s) == pytest.approx(np.sqrt(4. / 2.))


@pytest.mark.parametrize('dataset,task', CASES)
def test_perfect_prediction(dataset, task):
  c = tasks.DATASETS[dataset].channels(task)
  rng = np.random.default_rng(1)
  n = 3  # same shapes as elsewhere: reuses the compiled stats functions
  if task in ('semseg', 'human_parts'):
    lab = rng.integers(0, c, (n, H, W))
    lab = np.where(rng.uniform(size=lab.shape) < 0.2, 255, lab)
    lab.reshape(-1)[:c] = np.arange(c)  # every class present, else mIoU < 100
    lab = lab.astype(np.uint8)
    out = 10. * np.eye(c)[np.where(lab == 255, 0, lab)]
    out[lab == 255] = rng.normal(size=(np.sum(lab == 255), c))  # ignored pixels: anything
    want = 100.
  elif task == 'sal':
    lab = np.where(rng.uniform(size=(n, H, W)) < 0.2, 255,
                   rng.uniform(size=(n, H, W)) < 0.4).astype(np.uint8)
    out = np.stack([np.zeros(lab.shape), np.where(lab == 1, 20., -20.)], -1)
    want = 100.
  elif task == 'normals':
    _, lab = make_batch(rng, 'normals', n, 3, 0.2)
    out = np.where(lab == 255, rng.normal(size=lab.shape), 2. * lab)
    want = 0.
  elif task == 'depth':
    _, lab = make_batch(rng, 'depth', n, 1, 0.2)
    out = np.where(lab == 255, 7., lab)[..., None]
    want = 0.
  else:  # edge: no perfect-score proxy; confident correct logits give ~0 BCE
    lab = np.where(rng.uniform(size=(n, H, W)) < 0.2, 255,
                   rng.uniform(size=(n, H, W)) < 0.3).astype(np.uint8)
    out = np.where(lab == 1, 30., -30.)[..., None]
    want = 0.
  got = dense.finalize(task, stats(task, out.astype(np.float32), lab, c))
  assert got == pytest.approx(want, abs=1e-3)


@pytest.mark.parametrize('task', ['semseg', 'sal', 'normals', 'depth', 'edge'])
def test_all_ignored_split_finalizes_to_finite_value(task):
  c = tasks.DATASETS['pascal' if task != 'depth' else 'nyud'].channels(task)
  rng = np.random.default_rng(2)
  out, lab = make_batch(rng, task, 3, c, 1.1)
  if task == 'depth':
    lab[:] = 255.
  s = stats(task, out, lab, c)
  got = dense.finalize(task, s)
  assert np.isfinite(got)
  assert got == 0.


def test_task_stats_rejects_unknown_task():
  with pytest.raises(KeyError):
    dense.task_stats('optical_flow', jnp.zeros((1, 2, 2, 2)), jnp.zeros((1, 2, 2)), 2)


# ----------------------------------------------------------------------------
# evaluation.py helpers: padded test batching and per-client finalisation


def test_batch_test_split_pads_with_ignore_and_keeps_pooled_stats():
  rng = np.random.default_rng(4)
  n, bs = 7, 3
  split = {'image': rng.integers(0, 256, (n, H, W, 3)).astype(np.uint8)}
  outs = {}
  for task in ('semseg', 'sal', 'normals', 'depth', 'edge'):
    c = tasks.DATASETS['pascal'].channels(task) if task != 'depth' else 1
    o, l = make_batch(rng, task, n, c, 0.2)
    split[task], outs[task] = l, o
  batched = evaluation.batch_test_split(split, bs)
  assert batched['image'].shape == (3, bs, H, W, 3)
  assert np.all(batched['image'].reshape(-1, H, W, 3)[n:] == 0)
  for task in ('semseg', 'sal', 'normals', 'depth', 'edge'):
    lab_b = batched[task]
    assert lab_b.shape == (3, bs) + split[task].shape[1:]
    assert lab_b.dtype == split[task].dtype
    flat = lab_b.reshape((-1,) + split[task].shape[1:])
    np.testing.assert_array_equal(flat[:n], split[task])
    assert np.all(flat[n:] == 255)
    # Predictions on the padding are arbitrary; pooled stats must not change.
    c = outs[task].shape[-1]
    pad_out = np.concatenate([outs[task], 5. * rng.normal(size=(2,) + outs[task].shape[1:])])
    pad_out = pad_out.astype(np.float32).reshape((3, bs) + outs[task].shape[1:])
    acc = None
    for b in range(3):
      s = stats(task, pad_out[b], lab_b[b], c)
      acc = s if acc is None else add(acc, s)
    want = stats(task, outs[task], split[task], c)
    for a, w in zip(jax.tree.leaves(acc), jax.tree.leaves(want)):
      np.testing.assert_allclose(a, w, rtol=1e-5)


def test_batch_test_split_without_padding_is_a_reshape():
  x = {'image': np.arange(4 * 2 * 2 * 3, dtype=np.uint8).reshape(4, 2, 2, 3),
       'semseg': np.arange(16, dtype=np.uint8).reshape(4, 2, 2)}
  b = evaluation.batch_test_split(x, 2)
  np.testing.assert_array_equal(b['image'], x['image'].reshape(2, 2, 2, 2, 3))
  np.testing.assert_array_equal(b['semseg'], x['semseg'].reshape(2, 2, 2, 2))


def test_finalize_group_picks_each_clients_task_and_stats():
  # Two PASCAL ST clients sharing one heterogeneous slot: client 0 holds semseg,
  # client 1 holds sal; stats carry a leading client axis (zeros where masked).
  info = tasks.DATASETS['pascal']
  rng = np.random.default_rng(6)
  o_seg, l_seg = make_batch(rng, 'semseg', 2, 21, 0.2)
  o_sal, l_sal = make_batch(rng, 'sal', 2, 2, 0.2)
  s_seg, s_sal = stats('semseg', o_seg, l_seg, 21), stats('sal', o_sal, l_sal, 2)
  zeros = lambda t: jax.tree.map(np.zeros_like, t)
  stack = lambda a, b: jax.tree.map(lambda x, y: np.stack([x, y]), a, b)
  group_stats = [{'semseg': stack(s_seg, zeros(s_seg)), 'sal': stack(zeros(s_sal), s_sal)}]
  group = GroupSpec(
      dataset='pascal', client_ids=(3, 5), num_pad=0,
      task_ids=np.array([[info.task_id('semseg')], [info.task_id('sal')]]),
      head_channels=(21,), slot_tasks=(('semseg', 'sal'),), local_epochs=1,
      index_table=np.zeros((2, 4), np.int32), counts=np.array([4, 4]))
  clients = {3: types.SimpleNamespace(name='a'), 5: types.SimpleNamespace(name='b')}
  rows = evaluation.finalize_group(group, group_stats, clients)
  assert [(r['client'], r['task'], r['metric']) for r in rows] == [
      ('a', 'semseg', 'mIoU'), ('b', 'sal', 'maxF')]
  assert all(r['dataset'] == 'pascal' for r in rows)
  assert rows[0]['value'] == pytest.approx(ref_miou(o_seg, l_seg, 21), rel=1e-5)
  assert rows[1]['value'] == pytest.approx(ref_max_f(o_sal, l_sal), rel=1e-5)
