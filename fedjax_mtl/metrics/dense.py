"""Dense-prediction metrics: on-device sufficient statistics, finalised once per split.

Definitions follow the released FedHCA2 evaluation (spec §5): everything is
pooled over the whole split (not averaged per image).
- semseg / human_parts mIoU: per-class TP/(TP+FP+FN) from a pooled confusion
  matrix, classes with zero union count as 0 and are averaged in; ignore 255.
- sal maxF: F_beta with beta^2 = 0.3 at thresholds 0.05..0.95 on P(salient),
  a pixel predicted positive when P >= t (the released code's `preds >= thresh`),
  TP / predicted-positive / actual-positive pooled; max over thresholds.
  With `sal_metric='mIoU'` (MaT-FL's protocol, NTKFedAvg's benchmark A): the
  per-image Jaccard at 15 thresholds linspace(0.2, 0.9), averaged over images,
  max over thresholds.
- normals mErr: mean angle 2*atan2(|p-g|, |p+g|) in degrees over valid pixels.
- depth RMSE: valid 0 < gt < 80, predictions clamped >= 0.
- edge: weighted BCE (the training proxy); odsF lives in `metrics.edge`.
Stats functions take one batch of head outputs `[B, H, W, C]` and labels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl.tasks import IGNORE, balanced_bce_loss

SAL_THRESHOLDS = np.round(np.arange(0.05, 1.0, 0.05), 2)
SAL_BETA2 = 0.3
# MaT-FL's saliency "mIoU" (ASTMT's eval_sal): per-image Jaccard at these thresholds.
SAL_JACCARD_THRESHOLDS = np.linspace(0.2, 0.9, 15)
SAL_METRICS = ('maxF', 'mIoU')


def confusion_stats(logits: jax.Array, labels: jax.Array, num_classes: int) -> dict:
  """Pooled confusion matrix [gt, pred] over non-ignored pixels."""
  pred = jnp.argmax(logits[..., :num_classes], -1)
  valid = labels != IGNORE
  flat = jnp.where(valid, labels.astype(jnp.int32) * num_classes + pred, num_classes**2)
  counts = jnp.bincount(flat.reshape(-1), length=num_classes**2 + 1)[:-1]
  return {'confusion': counts.reshape(num_classes, num_classes).astype(jnp.int32)}


def saliency_stats(logits: jax.Array, labels: jax.Array) -> dict:
  """TP, predicted (P >= threshold) and actual positives per threshold, over valid pixels."""
  prob = jax.nn.softmax(logits[..., :2].astype(jnp.float32), -1)[..., 1]
  valid = labels != IGNORE
  gt = (labels == 1) & valid
  th = jnp.asarray(SAL_THRESHOLDS, jnp.float32)
  pred = (prob[..., None] >= th) & valid[..., None]
  axes = tuple(range(prob.ndim))
  return {'tp': jnp.sum(pred & gt[..., None], axes).astype(jnp.float32),
          'pp': jnp.sum(pred, axes).astype(jnp.float32),
          'ap': jnp.sum(gt).astype(jnp.float32)}


def saliency_jaccard_stats(logits: jax.Array, labels: jax.Array) -> dict:
  """Per-image Jaccard of (P >= t) against the salient mask over valid pixels, at each
  of `SAL_JACCARD_THRESHOLDS`, summed over the images that have a valid pixel
  (padding images have none); an image with an empty union scores 1."""
  prob = jax.nn.softmax(logits[..., :2].astype(jnp.float32), -1)[..., 1]
  valid = labels != IGNORE
  gt = ((labels == 1) & valid)[..., None]
  th = jnp.asarray(SAL_JACCARD_THRESHOLDS, jnp.float32)
  pred = (prob[..., None] >= th) & valid[..., None]
  axes = tuple(range(1, prob.ndim))
  inter = jnp.sum(pred & gt, axes).astype(jnp.float32)
  union = jnp.sum(pred | gt, axes).astype(jnp.float32)
  jac = jnp.where(union > 0, inter / jnp.maximum(union, 1.), 1.)  # [B, thresholds]
  real = jnp.any(valid, axis=axes)
  return {'jaccard': jnp.sum(jnp.where(real[:, None], jac, 0.), 0),
          'images': jnp.sum(real).astype(jnp.float32)}


def sal_miou(jaccard, images) -> float:
  """MaT-FL's saliency mIoU x100: the per-image Jaccard averaged over images, max over
  the thresholds."""
  return float(100. * np.max(np.asarray(jaccard, np.float64) / max(float(images), 1.)))


def normals_stats(pred: jax.Array, labels: jax.Array) -> dict:
  """Sum of angular errors (degrees) and number of valid pixels."""
  valid = jnp.all(labels != IGNORE, -1)
  p = pred[..., :3].astype(jnp.float32)
  p = p / jnp.sqrt(jnp.sum(p**2, -1, keepdims=True) + 1e-12)
  g = jnp.where(valid[..., None], labels, 0.)
  g = g / jnp.sqrt(jnp.sum(g**2, -1, keepdims=True) + 1e-12)
  ang = 2. * jnp.arctan2(jnp.linalg.norm(p - g, axis=-1), jnp.linalg.norm(p + g, axis=-1))
  return {'sum': jnp.sum(jnp.where(valid, jnp.degrees(ang), 0.)),
          'count': jnp.sum(valid).astype(jnp.float32)}


def depth_stats(pred: jax.Array, labels: jax.Array) -> dict:
  """Sum of squared errors and valid count (0 < gt < 80, prediction >= 0)."""
  p = jnp.maximum(pred[..., 0].astype(jnp.float32), 0.)
  valid = (labels > 0) & (labels < 80)
  return {'sum': jnp.sum(jnp.where(valid, (p - labels)**2, 0.)),
          'count': jnp.sum(valid).astype(jnp.float32)}


def edge_loss_stats(logits: jax.Array, labels: jax.Array) -> dict:
  """Edge weighted-BCE summed per batch (a proxy until odsF is computed)."""
  valid = jnp.sum(labels != IGNORE).astype(jnp.float32)
  return {'sum': balanced_bce_loss(logits, labels) * jnp.maximum(valid, 1.),
          'count': valid}


def task_stats(task: str, out: jax.Array, labels: jax.Array, channels: int,
               sal_metric: str = 'maxF') -> dict:
  """Sufficient statistics of `task` for one batch (`sal_metric`: 'maxF', FedHCA2's
  pooled F-beta, or 'mIoU', MaT-FL's max-over-thresholds per-image Jaccard)."""
  if task in ('semseg', 'human_parts'):
    return confusion_stats(out, labels, channels)
  if task == 'sal':
    return saliency_jaccard_stats(out, labels) if sal_metric == 'mIoU' else saliency_stats(
        out, labels)
  if task == 'normals':
    return normals_stats(out, labels)
  if task == 'depth':
    return depth_stats(out, labels)
  if task == 'edge':
    return edge_loss_stats(out, labels)
  raise KeyError(task)


def miou(confusion: np.ndarray) -> float:
  """Mean IoU x100; zero-union classes count as 0."""
  c = np.asarray(confusion, np.float64)
  tp = np.diag(c)
  union = c.sum(0) + c.sum(1) - tp
  iou = np.where(union > 0, tp / np.maximum(union, 1), 0.)
  return float(100. * iou.mean())


def max_f(tp, pp, ap, beta2: float = SAL_BETA2) -> float:
  """Max F-beta over thresholds x100 from pooled counts."""
  tp, pp = np.asarray(tp, np.float64), np.asarray(pp, np.float64)
  prec = tp / np.maximum(pp, 1e-12)
  rec = tp / max(float(ap), 1e-12)
  f = (1 + beta2) * prec * rec / np.maximum(beta2 * prec + rec, 1e-12)
  return float(100. * f.max())


def finalize(task: str, stats: dict) -> float:
  """The reported metric of `task` from pooled statistics."""
  if task in ('semseg', 'human_parts'):
    return miou(stats['confusion'])
  if task == 'sal':
    if 'jaccard' in stats:
      return sal_miou(stats['jaccard'], stats['images'])
    return max_f(stats['tp'], stats['pp'], stats['ap'])
  count = max(float(stats['count']), 1.)
  if task == 'depth':
    return float(np.sqrt(float(stats['sum']) / count))
  return float(stats['sum']) / count  # normals mErr, edge loss
