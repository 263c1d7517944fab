"""Input-independent predictors of every dense task: the floor a trained model must beat.

Each is fitted on a dataset's whole training split and scored on its test split
with the engine's own metrics (`metrics.dense`, `metrics.edge`):

- semseg, human_parts: the training set's majority class everywhere (mIoU);
- sal: the training set's salient fraction as a constant probability (maxF, or
  MaT-FL's per-image mIoU with `sal_metric='mIoU'`);
- normals: the training set's mean normal, normalised, everywhere (mErr);
- depth: the training set's mean valid depth everywhere (RMSE);
- edge: the training set's mean edge map (a per-pixel prior: a constant map has
  no local maxima for odsF's non-maximum suppression to keep) (odsF).

`python -m fedjax_mtl.trivial --config=configs/hca2.py` prints them for the
config's synthetic data; `trivial_metrics(config)` returns {dataset/task: value}.
"""

from __future__ import annotations

import sys

import jax.numpy as jnp
import numpy as np

from fedjax_mtl import experiment, tasks as tasks_lib
from fedjax_mtl.metrics import dense
from fedjax_mtl.metrics import edge as edge_lib
from fedjax_mtl.tasks import IGNORE


def _logits_of_class(c: int, channels: int, shape: tuple) -> jnp.ndarray:
  out = np.full(shape + (channels,), -10., np.float32)
  out[..., c] = 10.
  return jnp.asarray(out)


def task_metric(dataset: str, task: str, train: dict, test: dict,
                sal_metric: str = 'maxF') -> float:
  """The trivial predictor's metric of `task` (module docstring)."""
  info = tasks_lib.DATASETS[dataset]
  y, gt = np.asarray(train[task]), np.asarray(test[task])
  shape = gt.shape[:3]
  if task in ('semseg', 'human_parts'):
    counts = np.bincount(y[y != IGNORE].ravel().astype(np.int64),
                         minlength=info.channels(task))
    logits = _logits_of_class(int(np.argmax(counts)), info.channels(task), shape)
    return dense.finalize(task, dense.task_stats(task, logits, jnp.asarray(gt),
                                                 info.channels(task)))
  if task == 'sal':
    p = float(np.mean(y[y != IGNORE] == 1))
    logit = np.log(p / (1. - p))
    out = np.zeros(shape + (2,), np.float32)
    out[..., 1] = logit
    return dense.finalize(task, dense.task_stats(task, jnp.asarray(out), jnp.asarray(gt), 2,
                                                 sal_metric))
  if task == 'normals':
    valid = np.all(y != IGNORE, -1)
    m = y[valid].astype(np.float64).mean(0)
    out = np.broadcast_to((m / np.linalg.norm(m)).astype(np.float32), gt.shape)
    return dense.finalize(task, dense.task_stats(task, jnp.asarray(out), jnp.asarray(gt), 3))
  if task == 'depth':
    valid = (y > 0) & (y < 80)
    out = np.full(shape + (1,), float(y[valid].mean()), np.float32)
    return dense.finalize(task, dense.task_stats(task, jnp.asarray(out), jnp.asarray(gt), 1))
  if task == 'edge':
    prior = np.mean(y == 1, axis=0)  # [H, W]
    acc = edge_lib.EdgeODSAccumulator(max_dist=info.edge_max_dist)
    acc.update(np.broadcast_to(prior, gt.shape), gt)
    return 100. * edge_lib.ods_from_counts(acc.counts, acc.thresholds)['odsF']
  raise KeyError(task)


def trivial_metrics(config) -> dict[str, float]:
  """{dataset/task: the trivial predictor's metric} on `config`'s synthetic data, for
  every task a client of its scenario holds."""
  data = experiment.load_data(config)
  out = {}
  for d in sorted(data):
    for t in tasks_lib.DATASETS[d].tasks:
      if t in data[d]['test']:
        out[f'{d}/{t}'] = task_metric(d, t, data[d]['train'], data[d]['test'],
                                      str(config.get('sal_metric', 'maxF')))
  return out


def main(argv: list[str]) -> None:
  from absl import flags
  from ml_collections import config_flags
  cfg = config_flags.DEFINE_config_file('config', 'configs/hca2.py', 'run config')
  flags.FLAGS(argv)
  for k, v in trivial_metrics(cfg.value).items():
    print(f'{k}: {v:.4g}')


if __name__ == '__main__':
  main(sys.argv)
