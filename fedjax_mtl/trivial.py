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


def task_metric(dataset: str, task: str, train: dict, test: dict,
                sal_metric: str = 'maxF') -> float:
  """The trivial predictor's metric of `task` (module docstring)."""
  info = tasks_lib.DATASETS[dataset]
  y, gt = np.asarray(train[task]), np.asarray(test[task])
  if task == 'edge':  # odsF is scored on the host, from edge probabilities
    prior = np.mean(y == 1, axis=0)  # [H, W]
    acc = edge_lib.EdgeODSAccumulator(max_dist=info.edge_max_dist)
    acc.update(np.broadcast_to(prior, gt.shape), gt)
    return 100. * edge_lib.ods_from_counts(acc.counts, acc.thresholds)['odsF']
  # The constant prediction, in the model's output layout [n, H, W, channels].
  channels = info.channels(task)
  out = np.zeros(gt.shape[:3] + (channels,), np.float32)
  if task in ('semseg', 'human_parts'):  # the majority class's logit far above the rest
    counts = np.bincount(y[y != IGNORE].ravel().astype(np.int64), minlength=channels)
    out[:] = -10.
    out[..., int(np.argmax(counts))] = 10.
  elif task == 'sal':  # softmax probability p of "salient" everywhere
    p = float(np.mean(y[y != IGNORE] == 1))
    out[..., 1] = np.log(p / (1. - p))
  elif task == 'normals':
    m = y[np.all(y != IGNORE, -1)].astype(np.float64).mean(0)
    out[:] = m / np.linalg.norm(m)
  elif task == 'depth':
    out[:] = y[(y > 0) & (y < 80)].mean()
  else:
    raise KeyError(task)
  return dense.finalize(task, dense.task_stats(task, jnp.asarray(out), jnp.asarray(gt),
                                               channels, sal_metric))


def trivial_metrics(config) -> dict[str, float]:
  """{dataset/task: the trivial predictor's metric} on `config`'s synthetic data, for
  every task of the datasets its scenario uses."""
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
