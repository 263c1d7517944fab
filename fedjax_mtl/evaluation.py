"""Jitted, client-batched evaluation of a group on its dataset's test split.

Every client evaluates its own tasks on the full test split (as the released
code does). Statistics accumulate on device over test batches (`lax.scan`) and
are fetched once per evaluation; `finalize_group` turns them into metrics.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl import tasks as tasks_lib
from fedjax_mtl.algorithms.base import linearized_forward
from fedjax_mtl.federation import GroupSpec
from fedjax_mtl.local_training import normalize_image
from fedjax_mtl.metrics import dense

PyTree = Any


def batch_test_split(split: dict[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
  """Reshape a split to `[num_batches, B, ...]`, padding with ignore labels."""
  n = len(split['image'])
  nb = -(-n // batch_size)
  pad = nb * batch_size - n
  out = {}
  for k, v in split.items():
    fill = 0 if k == 'image' else tasks_lib.IGNORE
    v = np.concatenate([v, np.full((pad,) + v.shape[1:], fill, v.dtype)]) if pad else v
    out[k] = v.reshape((nb, batch_size) + v.shape[1:])
  return out


def edge_holders(group: GroupSpec) -> tuple[int, ...]:
  """Indices of the group's real clients that hold the edge task."""
  info = tasks_lib.DATASETS[group.dataset]
  if 'edge' not in group.tasks_used:
    return ()
  edge_id = info.task_id('edge')
  return tuple(j for j in range(group.num_real) if edge_id in group.task_ids[j])


def make_group_evaluator(group: GroupSpec, model_eval, edge_probs: bool = False,
                         sal_metric: str = 'maxF', linear: bool = False,
                         max_parallel: int = 0) -> Callable:
  """Returns `evaluate(params, batch_stats, test_batches) -> (stats, probs)` for the group.

  The group's clients run as one vmapped batch, or with `max_parallel` > 0
  (`max_parallel_clients`) in vmapped batches of that many, one after the other: the
  evaluation's activations are then those of `max_parallel` clients (the 20 PASCAL
  clients of the 4c layout at 512², batch 8, asked for 13.7 GB at once).

  `linear=True` (NTKFedAvg's evaluation B, spec §2.4): `evaluate(..., point)` scores the
  model linearised around each client's `point` (its backbone at the round's start,
  [clients, ...]) at its params, batch norm on its running statistics.

  `stats[s][task]` holds the pooled statistics of `task` in slot `s`, with a
  leading client axis, masked to the clients that hold `task` in that slot.
  With `edge_probs` and edge clients in the group, `probs` [batches,
  holders, B, H, W] are the edge clients' edge probabilities (for the
  host-side odsF) from the same forward pass; else None.
  """
  info = tasks_lib.DATASETS[group.dataset]
  task_ids = jnp.asarray(group.task_ids)
  used = ('image',) + group.tasks_used
  holders = jnp.asarray(edge_holders(group), jnp.int32) if edge_probs else None
  with_probs = edge_probs and len(edge_holders(group)) > 0
  edge_id = info.task_id('edge') if with_probs else -1

  def client_stats(params, batch_stats, tids, batch, point=None):
    image = normalize_image(batch['image'], batch.get('box'))
    if linear:  # f(x; c) + J_c(x)(θ − c) around the client's point c (heads as they are)
      apply = lambda p, bs, x, key: model_eval.apply({'params': p, 'batch_stats': bs}, x)
      outs = linearized_forward(apply, params, {**params, **point}, batch_stats, image, None)
    else:
      outs = model_eval.apply({'params': params, 'batch_stats': batch_stats}, image)
    stats = []
    prob = jnp.zeros(outs[0].shape[:3], jnp.float32) if with_probs else None
    for s, out in enumerate(outs):
      per = {}
      for t in group.slot_tasks[s]:
        st = dense.task_stats(t, out, batch[t], info.channels(t), sal_metric)
        on = tids[s] == info.task_id(t)
        per[t] = jax.tree.map(lambda x: jnp.where(on, x, jnp.zeros_like(x)), st)
      stats.append(per)
      if with_probs and 'edge' in group.slot_tasks[s]:
        prob = jnp.where(tids[s] == edge_id, jax.nn.sigmoid(out[..., 0]), prob)
    return stats, prob

  @jax.jit  # inlined by XLA; traced once for the accumulators' shapes and the scan body
  def run(params, batch_stats, tids, batch, point):
    if not max_parallel or max_parallel >= group.num_total:
      return jax.vmap(client_stats, (0, 0, 0, None, 0 if linear else None))(
          params, batch_stats, tids, batch, point)
    return jax.lax.map(lambda x: client_stats(*x[:3], batch, x[3]),
                       (params, batch_stats, tids, point), batch_size=int(max_parallel))

  def evaluate(params, batch_stats, test_batches, point=None):
    batches = {k: test_batches[k] for k in used + ('box',) if k in test_batches}
    first = jax.tree.map(lambda x: x[0], batches)
    init = jax.eval_shape(lambda: run(params, batch_stats, task_ids, first, point)[0])
    init = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), init)

    def body(acc, batch):
      st, prob = run(params, batch_stats, task_ids, batch, point)
      return jax.tree.map(jnp.add, acc, st), (prob[holders] if with_probs else None)

    acc, probs = jax.lax.scan(body, init, batches)
    return acc, probs

  return evaluate


def finalize_group(group: GroupSpec, stats, clients) -> list[dict]:
  """Per (client, task) metric rows from fetched group statistics."""
  info = tasks_lib.DATASETS[group.dataset]
  rows = []
  for j, cid in enumerate(group.client_ids):
    for s in range(group.num_slots):
      task = info.tasks[int(group.task_ids[j, s])]
      st = jax.tree.map(lambda x: np.asarray(x[j]), stats[s][task])
      metric = tasks_lib.METRIC_NAMES[task] if task != 'edge' else 'loss'
      if task == 'sal' and 'jaccard' in st:
        metric = 'mIoU'
      rows.append({'client': clients[cid].name, 'dataset': group.dataset, 'task': task,
                   'metric': metric, 'value': dense.finalize(task, st)})
  return rows


# `eval_edge_ods`: odsF at every evaluation, only at the final round's (the edge test
# loss at the others), or never.
EDGE_ODS_MODES = ('every', 'final', 'off')


def edge_ods_mode(config) -> str:
  """`config.eval_edge_ods` as one of EDGE_ODS_MODES (the bool of configs written
  before it had three values: true = 'every', false = 'off')."""
  mode = config.get('eval_edge_ods', 'every')
  return {True: 'every', False: 'off'}.get(mode, mode) if isinstance(mode, bool) else mode


def scores_edge_ods(config, rnd: int | None) -> bool:
  """Whether the evaluation of round `rnd` (1-based; None: outside the rounds, e.g. of a
  finished run's state) scores edge clients by odsF rather than their test loss."""
  mode = edge_ods_mode(config)
  return mode == 'every' or (mode == 'final' and (rnd is None
                                                  or rnd >= int(config.num_rounds)))


class EdgeScores:
  """Host-side odsF of a group's edge clients, fed batch by batch.

  `update(probs, gt)` takes the edge probabilities [holders, B, H, W] the
  evaluator returned for one test batch and its edge labels [B, H, W]
  (padding marked 255, cropped away before matching); `rows()` gives the odsF
  rows (×100) from the SEISM-equivalent pipeline in `metrics.edge` (NMS,
  thinning, one-to-one matching within maxDist, counts pooled over the split).
  With a `pool` (`metrics.edge.CountsPool`) `update` only submits the images, and
  `rows()` collects their counts.
  """

  def __init__(self, group: GroupSpec, clients, pool=None):
    from fedjax_mtl.metrics.edge import EdgeODSAccumulator
    self.group, self.clients = group, clients
    self.holders = edge_holders(group)
    info = tasks_lib.DATASETS[group.dataset]
    self.accs = [EdgeODSAccumulator(max_dist=info.edge_max_dist, pool=pool)
                 for _ in self.holders]

  def update(self, probs, gt) -> None:
    probs, gt = np.asarray(probs), np.asarray(gt)
    for i, acc in enumerate(self.accs):
      acc.update(probs[i], gt, valid_mask=gt != tasks_lib.IGNORE)

  def rows(self) -> list[dict]:
    g = self.group
    return [{'client': self.clients[g.client_ids[j]].name, 'dataset': g.dataset,
             'task': 'edge', 'metric': 'odsF', 'value': 100. * acc.finalize()['odsF']}
            for j, acc in zip(self.holders, self.accs)]
