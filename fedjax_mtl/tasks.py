"""Task and dataset registry: channels, losses, loss weights, metrics, directions.

Label conventions (shared by the synthetic benchmark and the real readers):
ignore index 255 everywhere; normals in [-1, 1] with all three channels 255 where
invalid; depth in metres with 255 where invalid; edge and sal in {0, 1}.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import jax
import jax.numpy as jnp

from fedjax_mtl.errors import check_choice

IGNORE = 255
# ImageNet statistics on the 0..255 scale, as the reference normalises images.
IMAGE_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGE_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """Static description of a dataset family (real or synthetic, same labels)."""
  name: str
  tasks: tuple[str, ...]
  semseg_classes: int
  train_size: tuple[int, int]  # paper crop size (H, W) of the real data
  edge_max_dist: float  # odsF localisation tolerance relative to the diagonal
  loss_weights: Mapping[str, float]
  default_local_epochs: int

  def channels(self, task: str) -> int:
    """Head output channels of `task` on this dataset."""
    return {
        'semseg': self.semseg_classes, 'human_parts': 7, 'sal': 2,
        'normals': 3, 'edge': 1, 'depth': 1}[task]

  def task_id(self, task: str) -> int:
    """Index of `task` in this dataset's task tuple."""
    check_choice('task', task, self.tasks, f' of dataset {self.name!r}')
    return self.tasks.index(task)


DATASETS: dict[str, DatasetInfo] = {
    'pascal': DatasetInfo(
        name='pascal', tasks=('semseg', 'human_parts', 'sal', 'normals', 'edge'),
        semseg_classes=21, train_size=(512, 512), edge_max_dist=0.0075,
        loss_weights={'semseg': 1., 'human_parts': 2., 'sal': 5., 'normals': 10.,
                      'edge': 50.},
        default_local_epochs=1),
    'nyud': DatasetInfo(
        name='nyud', tasks=('semseg', 'depth', 'normals', 'edge'),
        semseg_classes=40, train_size=(448, 576), edge_max_dist=0.011,
        loss_weights={'semseg': 1., 'depth': 1., 'normals': 10., 'edge': 50.},
        default_local_epochs=4),
}

ALL_TASKS = ('semseg', 'human_parts', 'sal', 'normals', 'edge', 'depth')
# Tasks whose metric is better when lower (normals mErr, depth RMSE).
LOWER_IS_BETTER = frozenset({'normals', 'depth'})
METRIC_NAMES = {'semseg': 'mIoU', 'human_parts': 'mIoU', 'sal': 'maxF',
                'normals': 'mErr', 'depth': 'RMSE', 'edge': 'odsF'}


def get_dataset(name: str) -> DatasetInfo:
  """Dataset family by name, with a clear error listing the valid ones."""
  check_choice('dataset', name, DATASETS)
  return DATASETS[name]


def _safe_div(num, den):
  return num / jnp.maximum(den, 1.)


def cross_entropy_loss(logits, labels):
  """CE with ignore 255: sum over valid pixels / number of valid pixels."""
  valid = labels != IGNORE
  safe = jnp.where(valid, labels, 0).astype(jnp.int32)
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
  return _safe_div(jnp.sum(nll * valid), jnp.sum(valid))


def normals_loss(pred, labels):
  """L1 between the L2-normalised prediction and gt, summed over xyz / #valid."""
  valid = jnp.all(labels != IGNORE, axis=-1)
  pred = pred.astype(jnp.float32)
  pred = pred / jnp.sqrt(jnp.sum(pred**2, -1, keepdims=True) + 1e-12)
  gt = jnp.where(valid[..., None], labels, 0.)
  l1 = jnp.sum(jnp.abs(pred - gt), -1)
  return _safe_div(jnp.sum(l1 * valid), jnp.sum(valid))


def balanced_ce_loss(logits, labels):
  """Saliency CE with per-batch weights (1-p, p), p = negative fraction."""
  valid = labels != IGNORE
  pos = (labels == 1) & valid
  n_valid = jnp.sum(valid)
  p = _safe_div(jnp.sum(valid & ~pos), n_valid)
  w = jnp.where(pos, p, 1. - p)
  safe = jnp.where(valid, labels, 0).astype(jnp.int32)
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
  return _safe_div(jnp.sum(w * nll * valid), n_valid)


def balanced_bce_loss(logits, labels, pos_weight: float = 0.95):
  """Edge BCE-with-logits, pos weight w/(1-w), divided by 1/(1-w), mean over valid."""
  logits = logits[..., 0].astype(jnp.float32)
  valid = labels != IGNORE
  y = (labels == 1).astype(jnp.float32)
  pw = pos_weight / (1. - pos_weight)
  per = -(pw * y * jax.nn.log_sigmoid(logits) + (1. - y) * jax.nn.log_sigmoid(-logits))
  per = per * (1. - pos_weight)
  return _safe_div(jnp.sum(per * valid), jnp.sum(valid))


def depth_loss(pred, labels):
  """L1 over valid depth pixels (label != 255) / #valid."""
  pred = pred[..., 0].astype(jnp.float32)
  valid = labels != IGNORE
  return _safe_div(jnp.sum(jnp.abs(pred - labels) * valid), jnp.sum(valid))


LOSSES: dict[str, Callable] = {
    'semseg': cross_entropy_loss, 'human_parts': cross_entropy_loss,
    'sal': balanced_ce_loss, 'normals': normals_loss, 'edge': balanced_bce_loss,
    'depth': depth_loss}


def task_loss(task: str, out: jax.Array, labels: jax.Array, channels: int) -> jax.Array:
  """Unweighted loss of `task` on the first `channels` head outputs."""
  return LOSSES[task](out[..., :channels], labels)


# ----------------------------------------------------------------------------
# Classification benchmarks of the many-task setting (fedjax_mtl/manytask).
# ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ClassificationTask:
  """One classification task: cross-entropy on a linear head over the [CLS]
  feature (or a frozen zero-shot head), top-1 accuracy (higher is better);
  results also report it normalised by an Individual run and the mean over tasks."""
  benchmark: str
  name: str
  num_classes: int
  loss: str = 'cross_entropy'
  metric: str = 'accuracy'


def classification_tasks(benchmark: str) -> tuple[ClassificationTask, ...]:
  """The tasks of a classification benchmark, in its order: `mini8` (offline,
  `data/mini8.py`), `tfds8` (the 8-task benchmark read from TFDS, `data/tfds_tasks.py`)
  or `folder30` (MaTU's 30 tasks as ImageFolder trees, `data/folder30.py`; their
  class counts depend on the user's folders, so they are 0 here and read per task
  when a run is built, `manytask.setting.num_classes`)."""
  check_choice('many.benchmark', benchmark, CLASSIFICATION_BENCHMARKS)
  if benchmark == 'folder30':
    from fedjax_mtl.data import folder30
    return tuple(ClassificationTask(benchmark, t, 0) for t in folder30.TASKS)
  if benchmark == 'mini8':
    from fedjax_mtl.data import mini8 as source
  else:
    from fedjax_mtl.data import tfds_tasks as source
  return tuple(ClassificationTask(benchmark, t, source.num_classes(t)) for t in source.TASKS)


CLASSIFICATION_BENCHMARKS = ('mini8', 'tfds8', 'folder30')
