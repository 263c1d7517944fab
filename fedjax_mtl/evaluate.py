"""Jitted, client-batched evaluation of a group on its dataset's test split.

Every client evaluates its own tasks on the full test split (as the released
code does). Statistics accumulate on device over test batches (`lax.scan`) and
are fetched once per evaluation; `finalize_group` turns them into metrics.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl import tasks as tasks_lib
from fedjax_mtl.federation import GroupSpec
from fedjax_mtl.local import normalize_image
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


def make_group_evaluator(group: GroupSpec, model_eval) -> Callable:
  """Returns `evaluate(params, batch_stats, test_batches) -> stats` for the group.

  `stats[s][task]` holds the pooled statistics of `task` in slot `s`, with a
  leading client axis, masked to the clients that hold `task` in that slot.
  """
  info = tasks_lib.DATASETS[group.dataset]
  task_ids = jnp.asarray(group.task_ids)
  used = ('image',) + group.tasks_used

  def client_stats(params, batch_stats, tids, batch):
    outs = model_eval.apply({'params': params, 'batch_stats': batch_stats},
                            normalize_image(batch['image'], batch.get('box')))
    stats = []
    for s, out in enumerate(outs):
      per = {}
      for t in group.slot_tasks[s]:
        st = dense.task_stats(t, out, batch[t], info.channels(t))
        on = tids[s] == info.task_id(t)
        per[t] = jax.tree.map(lambda x: jnp.where(on, x, jnp.zeros_like(x)), st)
      stats.append(per)
    return stats

  def evaluate(params, batch_stats, test_batches):
    batches = {k: test_batches[k] for k in used + ('box',) if k in test_batches}
    first = jax.tree.map(lambda x: x[0], batches)
    init = jax.eval_shape(
        lambda: jax.vmap(client_stats, (0, 0, 0, None))(params, batch_stats, task_ids, first))
    init = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), init)

    def body(acc, batch):
      st = jax.vmap(client_stats, (0, 0, 0, None))(params, batch_stats, task_ids, batch)
      return jax.tree.map(jnp.add, acc, st), None

    acc, _ = jax.lax.scan(body, init, batches)
    return acc

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
      rows.append({'client': clients[cid].name, 'dataset': group.dataset, 'task': task,
                   'metric': metric, 'value': dense.finalize(task, st)})
  return rows


def make_edge_predictor(group: GroupSpec, model_eval) -> Callable | None:
  """`predict(params, batch_stats, batch) -> [n_clients, B, H, W]` edge probabilities.

  Each client's edge map comes from the slot where it holds 'edge' (zeros for
  clients without edge). None if no client of the group has the edge task.
  """
  info = tasks_lib.DATASETS[group.dataset]
  if 'edge' not in group.tasks_used:
    return None
  edge_id = info.task_id('edge')
  task_ids = jnp.asarray(group.task_ids)

  def client(params, batch_stats, tids, batch):
    outs = model_eval.apply({'params': params, 'batch_stats': batch_stats},
                            normalize_image(batch['image'], batch.get('box')))
    prob = jnp.zeros(outs[0].shape[:3], jnp.float32)
    for s, out in enumerate(outs):
      if 'edge' in group.slot_tasks[s]:
        prob = jnp.where(tids[s] == edge_id, jax.nn.sigmoid(out[..., 0]), prob)
    return prob

  batched = jax.vmap(client, (0, 0, 0, None))
  return lambda params, batch_stats, batch: batched(params, batch_stats, task_ids, batch)


def edge_ods_rows(group: GroupSpec, predict: Callable, gstate, test_batches: Iterable[dict],
                  clients) -> list[dict]:
  """odsF rows (×100) of the group's edge clients over the whole test split.

  `test_batches` yields {'image', 'edge'[, 'box']} batches (padding marked 255 in
  'edge', cropped away before matching). Predictions are fetched batch by
  batch and scored on the host with the SEISM-equivalent pipeline in
  `metrics.edge` (NMS, thinning, one-to-one matching within maxDist, counts
  pooled over the split).
  """
  from fedjax_mtl.metrics.edge import EdgeODSAccumulator
  info = tasks_lib.DATASETS[group.dataset]
  edge_id = info.task_id('edge')
  holders = [j for j in range(group.num_real) if edge_id in group.task_ids[j]]
  accs = {j: EdgeODSAccumulator(max_dist=info.edge_max_dist) for j in holders}
  for batch in test_batches:
    inputs = {k: batch[k] for k in ('image', 'box') if k in batch}
    probs = np.asarray(jax.device_get(predict(gstate['params'], gstate['batch_stats'],
                                              inputs)))
    gt = np.asarray(batch['edge'])
    for j in holders:
      accs[j].update(probs[j], gt, valid_mask=gt != tasks_lib.IGNORE)
  return [{'client': clients[group.client_ids[j]].name, 'dataset': group.dataset,
           'task': 'edge', 'metric': 'odsF', 'value': 100. * accs[j].finalize()['odsF']}
          for j in holders]
