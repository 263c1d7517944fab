"""Local training of one client group: jitted, vmapped over clients, scanned over steps.

The algorithm's client part is compiled into the step: its extra loss terms,
its forward (the model's apply by default), which roles train this round, an
optional personal model trained alongside (Ditto), and its finalize step.

Each client runs its local epochs of AdamW on its own shuffled data; clients with
fewer batches get masked padding steps (parameters, optimizer and batch-norm
states are frozen there). Single-task clients with different tasks share one
compiled step through per-client task ids: each slot's loss is the loss of the
task that client holds in that slot, selected by mask.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_mtl import fields, tasks as tasks_lib
from fedjax_mtl.algorithms.base import Algorithm, ClientCtx
from fedjax_mtl.federation import GroupSpec
from fedjax_mtl.state import GroupState

PyTree = Any


OPTIMIZERS = ('adamw', 'adam_amsgrad', 'sgd')
LR_SCHEDULES = ('cosine', 'round_decay')


class AmsgradState(NamedTuple):
  count: jax.Array
  mu: optax.Updates
  nu: optax.Updates
  nu_max: optax.Updates


def scale_by_torch_amsgrad(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
  """The direction of `torch.optim.Adam(amsgrad=True)`: the running maximum is
  taken of the raw second moment, and bias-corrected afterwards,
  m̂ / (sqrt(max_t v_t) / sqrt(1 − β2^t) + ε) with m̂ = m / (1 − β1^t).
  (`optax.scale_by_amsgrad` takes the maximum of the bias-corrected moments,
  which differs in the first steps, when 1 − β2^t is small.)"""

  def init(params):
    z = lambda: jax.tree.map(jnp.zeros_like, params)
    return AmsgradState(jnp.zeros((), jnp.int32), z(), z(), z())

  def update(grads, state, params=None):
    del params
    t = state.count + 1
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, grads)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, grads)
    nu_max = jax.tree.map(jnp.maximum, state.nu_max, nu)
    tf = t.astype(jnp.float32)
    c1, c2 = 1 - b1 ** tf, 1 - b2 ** tf
    out = jax.tree.map(lambda m, v: (m / c1) / (jnp.sqrt(v) / jnp.sqrt(c2) + eps), mu, nu_max)
    return out, AmsgradState(t, mu, nu, nu_max)

  return optax.GradientTransformation(init, update)


def make_optimizer(optim_cfg) -> optax.GradientTransformation:
  """The local optimizer's direction; the lr is applied per step (`step_lrs`).

  `optim.name='adamw'` (default): AdamW, torch defaults, decoupled decay on all
  params. `'adam_amsgrad'`: MaT-FL's `torch.optim.Adam(amsgrad=True,
  weight_decay=wd)`, whose decay is an L2 term added to the gradient before the
  moments (NTKFedAvg spec §1.2). `'sgd'`: `torch.optim.SGD(momentum=m,
  weight_decay=wd)`, the gradient plus the L2 term, through momentum
  (`optim.momentum`; 0: plain SGD, whose step is linear in the gradient)."""
  name = optim_cfg.get('name', 'adamw')
  if name == 'sgd':
    momentum = float(optim_cfg.get('momentum', 0.0))
    tx = optax.chain(optax.add_decayed_weights(optim_cfg.weight_decay),
                     optax.trace(decay=momentum) if momentum else optax.identity())
  elif name == 'adam_amsgrad':
    tx = optax.chain(optax.add_decayed_weights(optim_cfg.weight_decay),
                     scale_by_torch_amsgrad(optim_cfg.b1, optim_cfg.b2, optim_cfg.eps))
  else:
    tx = optax.chain(
        optax.scale_by_adam(b1=optim_cfg.b1, b2=optim_cfg.b2, eps=optim_cfg.eps),
        optax.add_decayed_weights(optim_cfg.weight_decay))
  # Every rule here is elementwise, so it runs on one flat vector of the client's
  # parameters (its moments are flat vectors too): one fused update instead of one
  # per leaf. The default config's trainers compile in 6.5 / 7.3 s instead of
  # 8.6 / 8.8 s; a round runs about 4 % slower on 2 cores (the raveled copies;
  # BENCHMARKS.md).
  return optax.flatten(tx)


def step_lrs(epoch_of_step: jax.Array, round_idx: jax.Array, optim_cfg,
             total_epochs: int | jax.Array) -> jax.Array:
  """The learning rate of every local step: `optim.schedule='cosine'` (default) is
  `epoch_lr` of the step's global local epoch; `'round_decay'` is MaT-FL's
  lr · decay^round, constant within a round (`optim.round_decay`, 0.99)."""
  if optim_cfg.get('schedule', 'cosine') == 'round_decay':
    lr = fields.traced_value('optim.lr', optim_cfg.lr) * jnp.power(jnp.float32(optim_cfg.get('round_decay', 0.99)),
                                  jnp.asarray(round_idx, jnp.float32))
    return jnp.broadcast_to(lr, jnp.shape(epoch_of_step)).astype(jnp.float32)
  return epoch_lr(epoch_of_step, optim_cfg, total_epochs)


def fresh_opt_state(tx: optax.GradientTransformation, optim_cfg, opt_state, params):
  """The clients' optimizer state for a new round: a new state when
  `optim.reset_each_round` (MaT-FL builds a new optimizer every round), else the
  kept one."""
  if not optim_cfg.get('reset_each_round', False):
    return opt_state
  return jax.vmap(tx.init)(params)


def epoch_lr(epoch: jax.Array, optim_cfg, total_epochs: int | jax.Array) -> jax.Array:
  """timm CosineLRScheduler with warm-up prefix, stepped after each local epoch.

  Global local-epoch k runs at the value for t = max(k - 1, 0): the released
  code steps the scheduler after the epoch, so epochs 0 and 1 both use the
  warm-up start value.
  """
  t = jnp.maximum(epoch - 1, 0).astype(jnp.float32)
  lr = fields.traced_value('optim.lr', optim_cfg.lr)  # traced in a sweep's replica
  lr0, lr_min = optim_cfg.warmup_lr_init, optim_cfg.min_lr
  warm = float(optim_cfg.warmup_epochs)
  warm_lr = lr0 + t * (lr - lr0) / max(warm, 1.)
  if isinstance(total_epochs, int):
    t_initial = max(total_epochs - optim_cfg.warmup_epochs, 1)
    tc = jnp.minimum(t - warm, t_initial)
    phase = jnp.pi * tc / t_initial  # XLA folds: tc * (f32(pi) * f32(1 / t_initial))
  else:
    # A traced `total_epochs` (the engine's trainers: one program for any num_rounds),
    # computed as XLA folds the constant above: the same float32 values.
    t_initial = jnp.maximum(total_epochs - optim_cfg.warmup_epochs, 1).astype(jnp.float32)
    tc = jnp.minimum(t - warm, t_initial)
    phase = tc * (jnp.float32(jnp.pi) * (1. / t_initial))
  cos_lr = lr_min + 0.5 * (lr - lr_min) * (1. + jnp.cos(phase))
  return jnp.where(t < warm, warm_lr, cos_lr)


def normalize_image(image: jax.Array, box: jax.Array | None = None) -> jax.Array:
  """uint8 RGB `[..., H, W, 3]` -> float32 normalised with ImageNet statistics.

  `box` `[..., 4]` = (top, left, height, width) of each image inside its
  padded canvas: pixels outside are set to 0 after normalising, which is the
  reference's "normalise, then pad the image with 0" (the real-data pipeline
  ships padded uint8 images and their boxes; 4x less host work and transfer).
  """
  mean = jnp.asarray(tasks_lib.IMAGE_MEAN, jnp.float32)
  std = jnp.asarray(tasks_lib.IMAGE_STD, jnp.float32)
  x = (image.astype(jnp.float32) - mean) / std
  if box is None:
    return x
  h, w = image.shape[-3:-1]
  b = box[..., None, :]
  rows = (jnp.arange(h) >= b[..., 0]) & (jnp.arange(h) < b[..., 0] + b[..., 2])
  cols = (jnp.arange(w) >= b[..., 1]) & (jnp.arange(w) < b[..., 1] + b[..., 3])
  inside = rows[..., :, None] & cols[..., None, :]
  return jnp.where(inside[..., None], x, 0.)


def batch_plan(index_row: jax.Array, count: jax.Array, key: jax.Array, epochs: int,
               batch_size: int, steps_per_epoch: int | None = None,
               fill_last: bool = False) -> tuple[jax.Array, jax.Array]:
  """Shuffled batches `[E*S, B]` of one client (`count` real entries of `index_row`)
  and the mask of its real steps: each epoch a fresh permutation (keyed by
  `fold_in(key, epoch)`), `S = steps_per_epoch` (default: the row's length // B).

  `fill_last=False` drops the short last batch (`count // B` real steps: the dense
  engine, as the reference's drop_last); `True` keeps it, filled from the
  permutation's start (`ceil(count / B)` real steps: the many-task engine). Steps
  past the real ones are padding.
  """
  n = index_row.shape[0]
  steps = n // batch_size if steps_per_epoch is None else steps_per_epoch

  def one_epoch(e):
    u = jax.random.uniform(jax.random.fold_in(key, e), (n,))
    order = jnp.argsort(jnp.where(jnp.arange(n) < count, u, 2.))
    if fill_last:
      pos = jnp.arange(steps * batch_size) % jnp.maximum(count, 1)
      real = (count + batch_size - 1) // batch_size
    else:
      pos, real = jnp.arange(steps * batch_size), count // batch_size
    return index_row[order[pos]].reshape(steps, batch_size), jnp.arange(steps) < real

  idx, mask = jax.vmap(one_epoch)(jnp.arange(epochs))
  return idx.reshape(-1, batch_size), mask.reshape(-1)


def make_task_loss(group: GroupSpec) -> Callable:
  """`loss(outs, batch, task_ids) -> (weighted total, [slots] losses)` of one client.

  Each slot's loss is the loss of the task the client holds in that slot,
  selected by task id where a slot holds different tasks across the group.
  """
  info = tasks_lib.DATASETS[group.dataset]

  def loss(outs, batch, task_ids):
    slot_losses = []
    for s, out in enumerate(outs):
      per_task = []
      for t in group.slot_tasks[s]:
        loss = tasks_lib.task_loss(t, out, batch[t], info.channels(t))
        if len(group.slot_tasks[s]) > 1:  # heterogeneous slot: select by task id
          loss = jnp.where(task_ids[s] == info.task_id(t), loss, 0.)
        per_task.append((loss, info.loss_weights[t] * loss))
      slot_losses.append((sum(l for l, _ in per_task), sum(w for _, w in per_task)))
    total = sum(w for _, w in slot_losses)
    return total, jnp.stack([l for l, _ in slot_losses])

  return loss


def model_apply(model_train) -> Callable:
  """`apply(params, batch_stats, image, key) -> (outputs, new batch_stats)` in train mode."""
  def apply(params, batch_stats, image, key):
    outs, new_state = model_train.apply(
        {'params': params, 'batch_stats': batch_stats}, image,
        rngs={'dropout': key}, mutable=['batch_stats'])
    return outs, new_state['batch_stats']
  return apply


def encoder_features(model_train, batch_stats: PyTree, image: jax.Array,
                     key: jax.Array) -> Callable[[PyTree], jax.Array]:
  """`features(encoder_params) -> [B, C]`: the encoder's last-stage map of `image`,
  averaged over space, in train mode (batch-norm statistics used, not updated).
  Only traced when a client part calls it."""
  variables = {'batch_stats': batch_stats['encoder']} if 'encoder' in (batch_stats or {}) else {}

  def features(enc_params):
    feats, _ = model_train.encoder.apply({'params': enc_params, **variables}, image, train=True,
                                         rngs={'dropout': key}, mutable=['batch_stats'])
    return jnp.mean(feats[-1].astype(jnp.float32), axis=(1, 2))
  return features


def trainable_mask(labels: PyTree, alg: Algorithm, round_idx: jax.Array) -> PyTree | None:
  """Per-leaf "this leaf trains this round" (frozen roles and the client's
  `trainable(round)`), or None when every leaf trains (no masking compiled)."""
  dynamic = alg.client.trainable(round_idx) if alg.client.trainable is not None else {}
  def one(role):
    if alg.roles.get(role) == 'frozen':
      return dynamic.get(role, False)
    return dynamic.get(role, True)
  mask = jax.tree.map(one, labels)
  if all(m is True for m in jax.tree.leaves(mask)):
    return None
  return mask


def sgd_step(tx, lr_t, grads, opt_state, params, mask):
  """One optimizer step; frozen leaves keep their value (their step size is zero,
  as a zero learning rate for a parameter group would do: the optimizer's
  moments still see their gradients)."""
  updates, new_opt = tx.update(grads, opt_state, params)
  new_params = jax.tree.map(lambda p, u: p - lr_t * u, params, updates)
  if mask is not None:
    new_params = jax.tree.map(lambda m, a, b: jnp.where(m, a, b), mask, new_params, params)
  return new_params, new_opt


def _make_client_scan(group: GroupSpec, model_train, tx: optax.GradientTransformation,
                      alg: Algorithm, labels: PyTree, get_batch: Callable) -> Callable:
  """`scan(cs, start, tids, xs, key, round) -> (cs, loss_sum, step_losses)` of one client.

  `cs` is the client's `GroupState` slice, `start` the params it started the
  round from; `xs` = (batch source, mask, lr, step) per step; `get_batch(source)`
  gives the step's batch (a gather from device-resident arrays, or the streamed
  batch). Masked steps leave parameters, batch-norm and optimizer states (and
  the personal model) unchanged.
  """
  task_loss = make_task_loss(group)
  client = alg.client
  if client.frozen_stats:  # inference-mode model; the statistics stay as they are
    apply_eval = model_apply(model_train.clone(train=False))
    outputs = lambda p, bs, x, k: apply_eval(p, bs, x, k)[0]
    forward = lambda params, start, bs, image, key: (
        client.forward(outputs, params, start, bs, image, key), bs)
  else:
    apply = model_apply(model_train)
    forward = lambda params, start, bs, image, key: client.forward(
        apply, params, start, bs, image, key)

  def loss_fn(params, batch_stats, start, cs, tids, batch, key, extra):
    outs, new_bs = forward(params, start, batch_stats, batch['image'], key)
    total, slot_losses = task_loss(outs, batch, tids)
    if extra is not None:
      features = encoder_features(model_train, batch_stats, batch['image'], key)
      total = total + extra(ClientCtx(params=params, start=start, state=cs.client,
                                      server_rows=cs.server_rows, labels=labels,
                                      batch=batch, features=features))
    return total, (new_bs, slot_losses)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def scan(cs: GroupState, start, tids, xs, key, round_idx):
    mask = trainable_mask(labels, alg, round_idx)

    def step(carry, inp):
      cs = carry
      src, m_t, lr_t, t = inp
      batch = dict(get_batch(src))
      batch['image'] = normalize_image(batch['image'], batch.pop('box', None))
      key_t = jax.random.fold_in(key, t)
      (_, (new_bs, slot_loss)), grads = grad_fn(
          cs.params, cs.batch_stats, start, cs, tids, batch, key_t, client.loss)
      new_params, new_opt = sgd_step(tx, lr_t, grads, cs.opt_state, cs.params, mask)
      new = cs.replace(params=new_params, batch_stats=new_bs, opt_state=new_opt)
      if client.personal_model:
        p_params, p_bs, p_opt = cs.personal
        (_, (p_new_bs, _)), p_grads = grad_fn(
            p_params, p_bs, start, cs, tids, batch, jax.random.fold_in(key_t, 1),
            client.personal_loss)
        p_params, p_opt = sgd_step(tx, lr_t, p_grads, p_opt, p_params, mask)
        new = new.replace(personal=(p_params, p_new_bs, p_opt))
      keep = lambda a, b: jax.tree.map(lambda x, y: jnp.where(m_t, x, y), a, b)
      return keep(new, cs), slot_loss * m_t

    cs, losses = jax.lax.scan(step, cs, xs)
    return cs, jnp.sum(losses, 0), jnp.sum(losses, 1)

  return scan


def edge_losses(totals: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(loss of the first step, loss of the last real step) of one client's steps:
  the model it started from, and (one step before) the model it ends with, each
  on one batch (FedGA's generalisation gap reads them). `totals` [T] are the
  steps' summed task losses, `mask` [T] their real-step mask; 0 without real steps."""
  real = mask.astype(bool)
  last = totals.shape[0] - 1 - jnp.argmax(real[::-1])
  first = jnp.argmax(real)
  some = jnp.any(real)
  return jnp.where(some, totals[first], 0.), jnp.where(some, totals[last], 0.)


def finalize_group(alg: Algorithm, gstate: GroupState, start: PyTree,
                   start_axes: PyTree = 0) -> tuple[GroupState, PyTree]:
  """The client part's finalize on every client: (new group state, uploads).
  `start_axes` (0, or per leaf 0 / None) says which leaves of `start` are one
  row shared by every client (None) rather than a row per client."""
  upload, cstate = jax.vmap(alg.client.finalize, in_axes=(0, start_axes, 0))(
      gstate.params, start, gstate.client)
  return gstate.replace(client=cstate), upload


def _client_keys(key: jax.Array, num: int | jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per-client dropout key streams of a group's round key: of rows `0..num-1`, or of
  the group rows in the array `num` (one client trained alone, `GroupRows`)."""
  rows = jnp.arange(num) if isinstance(num, int) else num
  keys = jax.vmap(lambda c: jax.random.fold_in(key, c))(rows)
  return keys, jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)


class GroupRows(NamedTuple):
  """Which rows of a group a trainer trains, and their static inputs as arrays: the
  whole group in the engine; one client's row where that client trains alone
  (`fedjax_mtl.flower`: same keys, batches and lr as its row in the engine)."""
  ids: jax.Array  # [n] int32 rows within the group (the per-client key streams)
  index_table: jax.Array  # [n, max_n] train indices
  counts: jax.Array  # [n] train images per client
  task_ids: jax.Array  # [n, slots]


def group_rows(group: GroupSpec, rows: tuple[int, ...] | None = None) -> GroupRows:
  """`GroupRows` of `rows` of `group` (default: all of them)."""
  rows = tuple(range(group.num_total)) if rows is None else tuple(rows)
  sel = list(rows)
  return GroupRows(ids=jnp.asarray(rows, jnp.int32),
                   index_table=jnp.asarray(group.index_table[sel]),
                   counts=jnp.asarray(group.counts[sel]),
                   task_ids=jnp.asarray(group.task_ids[sel]))


def map_clients(fn: Callable, in_axes: tuple, max_parallel: int = 0) -> Callable:
  """`fn` over the client axis: `jax.vmap(fn, in_axes)` (every client of the group in
  one batched step), or with `max_parallel` > 0 a loop over the clients in vmapped
  batches of `max_parallel` (`max_parallel_clients`: a group's peak memory is then
  that of `max_parallel` clients, for the time of the sequential batches).
  `in_axes` entries are 0 (a row per client), None (shared) or a pytree of those
  (a prefix of the argument), as for `jax.vmap`; outputs have the client axis first.

  The loop writes each batch's clients back into the rows they were read from: `fn`'s
  first argument has a row per client and its first output has the same tree (the
  clients' state), so the group's state is updated in place (the loop carries it;
  with the argument donated no second copy of the group exists: a 4c PASCAL group of
  20 Swin-T clients holds 6 GiB of parameters and AdamW moments)."""
  if not max_parallel:
    return jax.vmap(fn, in_axes=in_axes)

  def call(*args):
    axes = [jax.tree.map(lambda ax, sub: jax.tree.map(lambda _: ax, sub), ax, arg,
                         is_leaf=lambda x: x is None)
            if not (ax is None or isinstance(ax, int)) else jax.tree.map(lambda _: ax, arg)
            for ax, arg in zip(in_axes, args)]
    leaves, treedef = jax.tree.flatten(list(args))
    ax_leaves = jax.tree.leaves(axes, is_leaf=lambda x: x is None)
    assert len(ax_leaves) == len(leaves) and set(ax_leaves) <= {0, None}, ax_leaves
    assert in_axes[0] == 0, 'the first argument (the clients\' state) has a row per client'
    num_state = len(jax.tree.leaves(args[0]))  # its leaves come first in `leaves`
    mapped = [i for i, ax in enumerate(ax_leaves) if ax == 0 and i >= num_state]
    leaf_axes = [0 if i < num_state or i in mapped else None for i in range(len(leaves))]
    n = leaves[0].shape[0]
    k = min(int(max_parallel), n)

    def batch(state, lo: Any, size: int):
      """`fn` on the clients lo..lo+size: their state rows from `state`. The outputs
      pass an optimization barrier: every read of the old rows happens before any
      write (without it XLA fused the AdamW moments' update into both the moments'
      and the parameters' in-place writes, both reading the old moments, and copied
      every moment of the group in each iteration: 4.4 GB for the 4c PASCAL group).
      XLA:CPU keeps the barrier only with `experiment.KEEP_REMAT_ON_CPU`, which
      `experiment.train_compiler_options` gives programs with this loop."""
      full = list(leaves)
      for i, x in enumerate(state):
        full[i] = jax.lax.dynamic_slice_in_dim(x, lo, size)
      for i in mapped:
        full[i] = jax.lax.dynamic_slice_in_dim(leaves[i], lo, size)
      return jax.lax.optimization_barrier(
          jax.vmap(lambda *xs: fn(*jax.tree.unflatten(treedef, xs)), in_axes=leaf_axes)(*full))

    def write(bufs, out, lo):
      return [jax.lax.dynamic_update_slice_in_dim(b, o.astype(b.dtype), lo, 0)
              for b, o in zip(bufs, out)]

    out_shapes = jax.eval_shape(lambda: batch(leaves[:num_state], 0, k))
    out_tree = jax.tree.structure(out_shapes)
    if jax.tree.structure(out_shapes[0]) != jax.tree.structure(args[0]):
      raise ValueError('map_clients: the first output must have the tree of the first '
                       'argument (the clients\' state)')
    rest = [jnp.zeros((n,) + x.shape[1:], x.dtype) for x in jax.tree.leaves(out_shapes[1:])]

    def body(b, carry):
      state, rest = carry
      out = batch(state, b * k, k)
      return (write(state, jax.tree.leaves(out[0]), b * k),
              write(rest, jax.tree.leaves(out[1:]), b * k))

    carry = (leaves[:num_state], rest)
    carry = jax.lax.fori_loop(0, n // k, body, carry) if n // k > 1 else (
        body(0, carry) if n // k == 1 else carry)
    if n % k:  # the last clients, fewer than k
      lo = n - n % k
      out = batch(carry[0], lo, n % k)
      carry = (write(carry[0], jax.tree.leaves(out[0]), lo),
               write(carry[1], jax.tree.leaves(out[1:]), lo))
    state, rest = carry
    return jax.tree.unflatten(out_tree, state + rest)

  return call


def make_group_trainer(group: GroupSpec, model_train, tx: optax.GradientTransformation,
                       optim_cfg, batch_size: int, total_rounds: int, alg: Algorithm,
                       labels: PyTree, start_axes: PyTree = 0, max_steps: int = 0,
                       max_parallel: int = 0) -> Callable:
  """Returns `train(gstate, data, round, key, start=None) -> (gstate, metrics)` for this group.

  `gstate` is the group's `GroupState` (leading client axis); `data` = the
  dataset's train arrays (shared by all clients of the group), on device; each
  client's batches are gathered by index inside the step. `start` = the params
  the clients started the round from, as the client part's losses read them
  (default: `gstate.params`); its leaves where `start_axes` is None are one row
  shared by every client (`rounds.round_start`). The returned params
  are the clients' trained params; `metrics` has per-client 'loss' [n, slots],
  'steps' [n], and 'first_loss' / 'last_loss' [n] (`edge_losses`).
  `train.rows(gstate, data, round, key, rows)` trains the `GroupRows` `rows` of
  the group alone (`gstate` holding those rows; each client starts from its own
  params), as the engine trains them among the others. `total` (traced int32): the
  run's rounds, which the learning-rate schedule spans, as an argument instead of
  the constant `total_rounds`, so that one program serves any number of rounds.
  `frac` ([n] float32, stragglers): each client takes only the first ceil(frac·its
  steps) steps of its round, the rest masked. `max_steps` > 0 keeps each client's first `max_steps` steps of the round
  (`max_steps_per_round`); `max_parallel` > 0 trains the clients in batches of that
  many (`map_clients`, `max_parallel_clients`).
  """
  epochs = group.local_epochs
  used = ('image',) + group.tasks_used

  def train_client(cs, start, tids, idx, mask, lrs, data, key, round_idx):
    scan = _make_client_scan(group, model_train, tx, alg, labels,
                             lambda i: {k: data[k][i] for k in used})
    steps = jnp.arange(idx.shape[0])
    cs, loss_sum, totals = scan(cs, start, tids, (idx, mask, lrs, steps), key, round_idx)
    return cs, (loss_sum / jnp.maximum(jnp.sum(mask), 1), *edge_losses(totals, mask))

  def train_rows(gstate, data, round_idx, key, start, axes, rows: GroupRows, total=None,
                 frac=None):
    total = total_rounds if total is None else total
    keys, step_keys = _client_keys(key, rows.ids)
    plan_keys = jax.vmap(lambda k: jax.random.fold_in(k, 0))(keys)
    idx, mask = jax.vmap(lambda r, c, k: batch_plan(r, c, k, epochs, batch_size))(
        rows.index_table, rows.counts, plan_keys)
    steps_per_epoch = idx.shape[1] // epochs
    if max_steps:
      idx, mask = idx[:, :max_steps], mask[:, :max_steps]
    if frac is not None:  # stragglers: each client's first ceil(frac · its steps) steps
      done = jnp.cumsum(mask.astype(jnp.int32), axis=1)
      budget = jnp.ceil(frac * jnp.sum(mask, axis=1)).astype(jnp.int32)
      mask = jnp.where(done <= budget[:, None], mask, jnp.zeros_like(mask))
    epoch_of_step = round_idx * epochs + jnp.arange(idx.shape[1]) // steps_per_epoch
    lrs = step_lrs(epoch_of_step, round_idx, optim_cfg, total * epochs)
    gstate = gstate.replace(opt_state=fresh_opt_state(tx, optim_cfg, gstate.opt_state,
                                                      gstate.params))
    gstate, loss = map_clients(train_client, (0, axes, 0, 0, 0, None, None, 0, None),
                               max_parallel)(
        gstate, start, rows.task_ids, idx, mask, lrs, data, step_keys, round_idx)
    loss, first, last = loss
    return gstate, {'loss': loss, 'steps': jnp.sum(mask, 1), 'first_loss': first,
                    'last_loss': last}

  def train(gstate: GroupState, data, round_idx, key, start=None, total=None, frac=None):
    if start is None:
      return train_rows(gstate, data, round_idx, key, gstate.params, 0, group_rows(group), total,
                        frac)
    return train_rows(gstate, data, round_idx, key, start, start_axes, group_rows(group), total,
                      frac)

  train.rows = lambda gstate, data, round_idx, key, rows: train_rows(
      gstate, data, round_idx, key, gstate.params, 0, rows)
  # Some rows of the group (a round's participants, `rounds.sampled_bodies`): `gstate`
  # and `start` hold those rows (leaves of `start` shared by every client stay whole).
  train.sampled = lambda gstate, data, round_idx, key, start, rows, total=None, frac=None: (
      train_rows(gstate, data, round_idx, key, start, start_axes, rows, total, frac))
  return train


def make_chunk_trainer(group: GroupSpec, model_train, tx: optax.GradientTransformation,
                       optim_cfg, total_rounds: int, alg: Algorithm, labels: PyTree,
                       start_axes: PyTree = 0, max_parallel: int = 0) -> Callable:
  """Returns `train_chunk(gstate, start, acc, chunk, key, round) -> (gstate, acc)` for streamed data.

  `start` = the group's params at the start of the round (leaves where
  `start_axes` is None: one row shared by every client); `chunk` = {'x':
  batches [n, T, B, ...], 'mask' [n, T], 'epoch' [T] absolute local epochs,
  'step' [T] positions in the round}; `key` is the group's round key (as in
  `make_group_trainer`, so dropout streams match per step). `acc` =
  {'loss_sum' [n, slots], 'steps' [n], 'first_loss' [n], 'last_loss' [n]}
  accumulates over a round's chunks. `ids` ([n] int32, default every row): the group
  rows `gstate` holds, when it holds only some (one client trained alone). `total`,
  `max_parallel`: as in `make_group_trainer`.
  """
  task_ids = jnp.asarray(group.task_ids)
  scan = _make_client_scan(group, model_train, tx, alg, labels, lambda b: b)
  def train_chunk(gstate, start, acc, chunk, key, round_idx, ids=None, total=None):
    _, step_keys = _client_keys(key, group.num_total if ids is None else ids)
    tids = task_ids if ids is None else task_ids[ids]
    total = total_rounds if total is None else total
    lrs = step_lrs(chunk['epoch'], round_idx, optim_cfg, total * group.local_epochs)
    if optim_cfg.get('reset_each_round', False):  # the round's first chunk starts afresh
      fresh = fresh_opt_state(tx, optim_cfg, gstate.opt_state, gstate.params)
      gstate = gstate.replace(opt_state=jax.tree.map(
          lambda a, b: jnp.where(chunk['step'][0] == 0, a, b), fresh, gstate.opt_state))
    gstate, loss_sum, totals = map_clients(
        lambda cs, s, t, x, m, k: scan(cs, s, t, (x, m, lrs, chunk['step']), k, round_idx),
        (0, start_axes, 0, 0, 0, 0), max_parallel)(
            gstate, start, tids, chunk['x'], chunk['mask'], step_keys)
    first, last = jax.vmap(edge_losses)(totals, chunk['mask'])
    real = jnp.any(chunk['mask'].astype(bool), axis=1)
    acc = {'loss_sum': acc['loss_sum'] + loss_sum,
           'steps': acc['steps'] + jnp.sum(chunk['mask'], 1),
           'first_loss': jnp.where(chunk['step'][0] == 0, first, acc['first_loss']),
           'last_loss': jnp.where(real, last, acc['last_loss'])}
    return gstate, acc

  return train_chunk
