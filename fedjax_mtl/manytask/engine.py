"""One many-task round and one evaluation as jitted programs.

**State** (`ManyState`): each trainable leaf lives where its policy puts it
(`storage`):
- `global`: one row for everyone, the leaves of the algorithm's shared roles
  (their server, e.g. FedAvg's mean, gives every row the same value);
- `task`: one row per task, the heads when the adapters are shared (MaTU spec
  §7 item 7: heads are averaged per task over the pairs that trained it,
  weighted by their examples);
- `pair`: one row per (client, task) pair plus a dummy row, the personal
  leaves (FedPer's last block and head, Local's everything) and the shared ones
  of a server that gives each row its own value (MaT-FL's groups).
The frozen backbone is an argument of the programs, one copy, never per pair.

**Round** (`make_round`): the round's S slots (pair ids, padded with the dummy
pair) gather their start params (global rows broadcast inside the program, not
copied per slot), train in one `vmap` over slots of a `lax.scan` over local
steps (AdamW, fresh every round: stateless clients), go through the algorithm's
client `finalize` and its server part over the shared roles (rows = slots,
each weighted by its examples, the dummy by 0), and are written back by
storage. The client's extra loss (FedProx's proximal term) sees the slot's
start params. The program composes two halves (`round_parts`): one slot's
local training (with the client finalize) and the aggregation of all slots;
the Flower adapter runs the first on its clients, the second on its server.

**Evaluation** (`make_eval`): top-1 accuracy and mean cross-entropy of every
evaluated model on its task's whole test split: one model per task when every
leaf is `global` or `task`, else one per pair (a client's personal model on its
task, averaged per task by the caller, MaTU spec §7 item 9).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any, Callable, Iterator, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedjax_mtl import fields
from fedjax_mtl.algorithms.base import (Algorithm, ClientCtx, ServerInputs, ServerState,
                                        linear_outputs, role_view)
from fedjax_mtl.local_training import batch_plan, sgd_step
from fedjax_mtl.rounds import finite_rows
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.manytask import model as model_lib
from fedjax_mtl.manytask.setting import Setting

PyTree = Any
STORAGES = ('global', 'task', 'pair')


@flax.struct.dataclass
class ManyState:
  """Everything a many-task run changes (checkpointed as plain dicts)."""
  round: jax.Array
  rng: jax.Array
  shared: dict  # path -> leaf (one row)
  task_rows: dict  # path -> [T, ...]
  pair_rows: dict  # path -> [M + 1, ...] (row M: the dummy pair)
  server: PyTree = ()


def storage(alg: Algorithm, roles: dict, uniform: bool = True) -> dict:
  """path -> 'global' | 'task' | 'pair' (module docstring). `uniform=False`: the
  server gives each row of a shared role its own value (MaT-FL's groups), so
  those leaves are kept per pair too."""
  adapters_shared = alg.roles.get('decoder') == 'shared'

  def one(role):
    if role == 'head':
      return 'task' if adapters_shared or alg.roles.get('head') == 'shared' else 'pair'
    return 'global' if uniform and alg.roles.get(role) == 'shared' else 'pair'

  return {k: one(r) for k, r in roles.items()}


def init_state(setting: Setting, trainable: dict, where: dict, seed: int,
               server: PyTree = ()) -> ManyState:
  """Round-0 state: every row starts from `trainable` (shared LoRA init, the head init)."""
  rows = lambda n: {k: jnp.broadcast_to(v, (n,) + v.shape) + 0 for k, v in trainable.items()
                    if where[k] == ('task' if n == setting.num_tasks else 'pair')}
  return ManyState(round=jnp.int32(0), rng=jax.random.PRNGKey(seed),
                   shared={k: jnp.copy(v) for k, v in trainable.items() if where[k] == 'global'},
                   task_rows=rows(setting.num_tasks), pair_rows=rows(setting.num_pairs + 1),
                   server=server)


def _plan(index_row, count, key, epochs: int, steps_per_epoch: int, local_steps: int,
          batch: int, slot_epochs=None, max_steps: int = 0):
  """Batches [steps, B] (indices into the concatenated train set) and the real-step
  mask of one slot. Epochs: `local.batch_plan` with the last batch filled; with
  `slot_epochs` (this slot's epochs, at most `epochs`) the epochs from `slot_epochs`
  on are masked. Steps: `local_steps` batches from one permutation, cycling.
  `max_steps` > 0 keeps the first `max_steps` steps (`max_steps_per_round`)."""
  if max_steps:
    idx, mask = _plan(index_row, count, key, epochs, steps_per_epoch, local_steps, batch,
                      slot_epochs)
    return idx[:max_steps], mask[:max_steps]
  if local_steps:
    n = index_row.shape[0]
    u = jax.random.uniform(key, (n,))
    order = jnp.argsort(jnp.where(jnp.arange(n) < count, u, 2.))
    pos = jnp.arange(local_steps * batch) % jnp.maximum(count, 1)
    idx = index_row[order[pos]].reshape(local_steps, batch)
    return idx, jnp.broadcast_to(count > 0, (local_steps,))
  idx, mask = batch_plan(index_row, count, key, epochs, batch, steps_per_epoch, fill_last=True)
  if slot_epochs is not None:
    mask = mask & jnp.repeat(jnp.arange(epochs) < slot_epochs, steps_per_epoch)
  return idx, mask


def _axes(where: dict) -> dict:
  """vmap axes of a slot's start params: global leaves are one unbatched row."""
  return {k: None if w == 'global' else 0 for k, w in where.items()}


def client_segments(clients: jax.Array) -> jax.Array:
  """[S] segment id of each slot's client: the first slot of the same client
  (padding slots, client -1, each their own)."""
  s = clients.shape[0]
  same = (clients[:, None] == clients[None, :]) & (clients[:, None] >= 0)
  return jnp.where(clients >= 0, jnp.argmax(same, axis=1), jnp.arange(s)).astype(jnp.int32)


class Tables(NamedTuple):
  """What a run's programs read of its client split, and its initialisation: the
  single run closes over them (constants); a sweep's replica programs
  (`engines/many_replicas.py`) trace each replica's as inputs (`replica_tables`)."""
  pair_task: Any  # [M + 1] task of each pair (the dummy: 0)
  pair_counts: Any  # [M + 1] training examples of each pair (the dummy: 0)
  pair_client: Any  # [M + 1] client of each pair (the dummy: -1)
  origin: dict | None  # the trainable leaves' initialisation (`make_round`'s `origin`)


def tables(setting: Setting, origin: dict | None = None) -> Tables:
  """`setting`'s tables (host arrays) with `origin`."""
  return Tables(pair_task=setting.pair_task, pair_counts=setting.pair_counts,
                pair_client=np.append(setting.pairs[:, 0], -1).astype(np.int32),
                origin=origin)


_TABLES: contextvars.ContextVar[Tables | None] = contextvars.ContextVar('many_task_tables',
                                                                        default=None)


@contextlib.contextmanager
def replica_tables(t: Tables) -> Iterator[None]:
  """Trace the programs of `round_parts`, `make_round` and `make_eval` with `t` (a
  replica's traced tables) in place of the ones they were built with."""
  token = _TABLES.set(t)
  try:
    yield
  finally:
    _TABLES.reset(token)


def _current(own: Tables) -> Tables:
  """The tables of the program being traced: a replica's (`replica_tables`), else `own`."""
  t = _TABLES.get()
  return own if t is None else t


def epoch_steps(setting: Setting, batch_size: int) -> int:
  """Steps of one local epoch of the round program: the largest pair's batches."""
  return max(1, math.ceil(int(setting.counts.max()) / batch_size))


class RoundParts(NamedTuple):
  """`make_round`'s program in its two halves, plain functions to jit or compose: the
  local training of one slot, and the aggregation of the round's S slots. The Flower
  adapter (`flower/many_task.py`) runs `train` on the clients and the rest on the
  server; `make_round` composes them into the engine's one program."""
  # (state, slots [S]) -> each slot's start params (global leaves: one row, vmap axis
  # None in `axes`; task and pair leaves [S, ...])
  start: Callable
  # (state, slots [S]) -> [S] keys of the slots' local rounds
  keys: Callable
  # (start, backbone, pair, row [max_n], key, images, labels) of ONE slot -> (trained
  # params, upload (the client part's finalize), mean loss, steps)
  train: Callable
  # (start) of one slot -> what `train` gives a slot without data (the dummy pair):
  # its start params, their upload, loss 0 and 0 steps
  idle: Callable
  # (state, slots, start, trained [S], uploads [S], loss [S], steps [S]) -> (new
  # state, outputs); reads `trained` of the task and personal leaves only
  aggregate: Callable
  axes: dict  # vmap axes of `start`'s leaves


def round_parts(setting: Setting, model, alg: Algorithm, tx, roles: dict, where: dict, *,
                lr: float, batch_size: int, local_epochs: int, local_steps: int,
                heads: np.ndarray | None = None, origin: dict | None = None,
                task_epochs: np.ndarray | None = None, max_steps: int = 0,
                steps_per_epoch: int = 0) -> RoundParts:
  """`make_round`'s halves (`RoundParts`), of the same arguments but the mesh.
  `steps_per_epoch` > 0 replaces the largest pair's (a sweep's replicas share the
  largest of theirs: the steps past a pair's own are masked)."""
  inner, finish = model_lib.make_forward_parts(model, np.asarray(setting.num_classes), heads)
  own = tables(setting, origin)
  tab = lambda: _current(own)
  num_tasks, s = setting.num_tasks, setting.num_slots
  steps_per_epoch = steps_per_epoch or epoch_steps(setting, batch_size)
  axes = _axes(where)
  shared = alg.shared_roles
  client = alg.client

  if client.linearize_at not in ('start', 'origin') or (
      client.linearize_at == 'origin' and origin is None):
    raise ValueError(f'Client.linearize_at={client.linearize_at!r} needs start, or origin '
                     'with the origin given')
  point_of = ((lambda start: {**start, **{k: jnp.asarray(tab().origin[k]) for k in start}})
              if client.linearize_at == 'origin' else (lambda start: start))

  def loss_fn(params, start, backbone, images, labels, task):
    # The client part's forward (NTKFedAvg swaps in the one linearised around its
    # point: the round's start, or the run's origin) of the part the trainable
    # leaves act in; the frozen rest after it.
    logits = finish(client.forward(lambda p, bs, x, key: inner(backbone, p, x), params,
                                   point_of(start), None, images, None), task)
    loss = model_lib.cross_entropy(logits, labels)
    if client.loss is not None:
      loss = loss + client.loss(ClientCtx(params=params, start=start, state=(), server_rows={},
                                          labels=roles, batch={}))
    return loss

  grad_fn = jax.value_and_grad(loss_fn)

  if task_epochs is not None:
    local_epochs = int(np.max(task_epochs))
    epochs_of_task = jnp.asarray(task_epochs, jnp.int32)

  def train_slot(start, backbone, pair, row, key, images, labels):
    t = tab()
    task = jnp.asarray(t.pair_task)[pair]
    lr_now = fields.traced_value('optim.lr', lr)  # a sweep replica's, else the config's
    idx, mask = _plan(row, jnp.asarray(t.pair_counts)[pair], key, local_epochs, steps_per_epoch,
                      local_steps, batch_size,
                      None if task_epochs is None else epochs_of_task[task], max_steps)
    params = jax.tree.map(jnp.asarray, start)

    def step(carry, inp):
      params, opt = carry
      i, m = inp
      loss, grads = grad_fn(params, start, backbone, images[i], labels[i], task)
      new, new_opt = sgd_step(tx, lr_now, grads, opt, params, None)
      keep = lambda a, b: jax.tree.map(lambda x, y: jnp.where(m, x, y), a, b)
      return (keep(new, params), keep(new_opt, opt)), loss * m

    (params, _), losses = jax.lax.scan(step, (params, tx.init(params)), (idx, mask))
    steps = jnp.sum(mask)
    upload, _ = client.finalize(params, start, ())
    return params, upload, jnp.sum(losses) / jnp.maximum(steps, 1), steps

  def idle(start):
    params = jax.tree.map(jnp.asarray, start)
    upload, _ = client.finalize(params, start, ())
    return params, upload, jnp.float32(0.), jnp.int32(0)

  def slot_start(state: ManyState, slots):
    task = jnp.asarray(tab().pair_task)[slots]
    return {**state.shared,
            **{k: v[task] for k, v in state.task_rows.items()},
            **{k: v[slots] for k, v in state.pair_rows.items()}}

  def slot_keys(state: ManyState, slots):
    return jax.vmap(lambda i: jax.random.fold_in(jax.random.fold_in(state.rng, state.round),
                                                 i))(slots)

  def aggregate(state: ManyState, slots, start, trained, uploads, loss, steps):
    t = tab()
    task = jnp.asarray(t.pair_task)[slots]
    counts = jnp.asarray(t.pair_counts)[slots]
    clients = jnp.asarray(t.pair_client)[slots]
    origin = t.origin
    full_start = {k: (jnp.broadcast_to(v, (s,) + v.shape) if axes[k] is None else v)
                  for k, v in start.items()}
    x = ServerInputs(prev={r: role_view(full_start, roles, r) for r in shared},
                     local={r: role_view(uploads, roles, r) for r in shared},
                     num_examples=counts.astype(jnp.float32), num_steps=steps.astype(jnp.int32),
                     client_ids=clients, round=state.round,
                     row_valid=counts > 0, row_client=client_segments(clients),
                     row_task=task,
                     origin=None if origin is None else {r: role_view(origin, roles, r)
                                                         for r in shared})
    new, sstate, logs = alg.server.apply(ServerState(state.server, {}), x)
    new_flat = {k: v for r in shared for k, v in (new[r] or {}).items()}
    new_shared = {k: new_flat[k][0] for k in state.shared}
    onehot = (task[:, None] == jnp.arange(num_tasks)[None, :]).astype(jnp.float32)
    w = onehot * counts.astype(jnp.float32)[:, None]  # [S, T]
    total = jnp.sum(w, 0)
    has = total > 0

    def task_mean(old, rows):
      mean = jnp.tensordot(w / jnp.maximum(total, 1.), rows, axes=(0, 0))
      return jnp.where(has.reshape((-1,) + (1,) * (old.ndim - 1)), mean, old)

    new_task = {k: task_mean(v, trained[k]) for k, v in state.task_rows.items()}
    new_pair = {k: v.at[slots].set(new_flat[k] if k in new_flat else trained[k])
                for k, v in state.pair_rows.items()}
    new_state = state.replace(round=state.round + 1, shared=new_shared, task_rows=new_task,
                              pair_rows=new_pair, server=sstate.shared)
    real = counts > 0
    written = {**new_shared, **new_task}
    finite_agg = jnp.all(jnp.stack([jnp.all(jnp.isfinite(v)) for v in jax.tree.leaves(
        (written, sstate.shared, logs))] or [jnp.bool_(True)]))
    out = {'loss': loss, 'steps': steps, 'real': real,
           'finite': jnp.isfinite(loss) & finite_rows(trained, s), 'agg_finite': finite_agg,
           'agg': logs}
    return new_state, out

  return RoundParts(start=slot_start, keys=slot_keys, train=train_slot, idle=idle,
                    aggregate=aggregate, axes=axes)


def make_round(setting: Setting, model, alg: Algorithm, tx, roles: dict, where: dict, *,
               lr: float, batch_size: int, local_epochs: int, local_steps: int,
               heads: np.ndarray | None = None, origin: dict | None = None,
               task_epochs: np.ndarray | None = None, mesh: Mesh | None = None,
               max_steps: int = 0, max_parallel: int = 0, steps_per_epoch: int = 0):
  """Jitted `(state, backbone, slots [S], rows [S, max_n], images, labels) -> (state,
  outputs)`.

  `slots`: the round's pair ids; `rows`: each slot's sample indices into `images`
  uint8 [n, R, R, 3] / `labels` int32 [n] (`feed.RoundFeed`: every task's training
  set, or the round's samples). The state is donated. Outputs: per slot 'loss', 'steps', 'finite' (loss and
  trained params), 'agg_finite' and the server's logs. `heads`: frozen zero-shot
  heads (`model_lib.make_forward`). `origin`: the trainable leaves' shared
  initialisation (θ_p's trainable part), which the server sees as
  `ServerInputs.origin` with each slot's client (`row_client`: the first slot
  of the same client) and task (`row_task`). `task_epochs` [T]: local epochs of each
  task's pairs (NTKFedAvg's "local work", spec §4), in place of `local_epochs`;
  every slot runs the largest task's epochs, the ones beyond its own masked.
  `max_steps` > 0: every slot stops after that many steps (`max_steps_per_round`).
  `max_parallel` = k > 0 (`max_parallel_clients`): the slots train k at a time
  (`jax.lax.map` over batches of k), so the round's peak memory is that of k slots'
  training, not of all of them (one device only).
  `mesh`: on more than one device, the slots are spread over its `clients` axis
  (local training of each slot on its device; the aggregation's sums over slots
  become all-reduces) and the state stays replicated. The program is
  `round_parts`' halves composed: every slot's `train` in one vmap, then
  `aggregate`.
  """
  parts = round_parts(setting, model, alg, tx, roles, where, lr=lr, batch_size=batch_size,
                      local_epochs=local_epochs, local_steps=local_steps, heads=heads,
                      origin=origin, task_epochs=task_epochs, max_steps=max_steps,
                      steps_per_epoch=steps_per_epoch)
  spread = mesh is not None and mesh.size > 1
  if spread:
    by_slot = NamedSharding(mesh, P('clients'))
    rep = NamedSharding(mesh, P())
  if max_parallel and spread:
    raise ConfigError(f'max_parallel_clients={max_parallel} trains the many-task slots in '
                      f'batches on one device; with {mesh.size} devices set it to 0')
  batched = 0 < max_parallel < setting.num_slots

  def train_slots(start, backbone, slots, rows, keys, images, labels):
    if not batched:
      return jax.vmap(parts.train, in_axes=(parts.axes, None, 0, 0, 0, None, None))(
          start, backbone, slots, rows, keys, images, labels)
    per_slot = {k: v for k, v in start.items() if parts.axes[k] is not None}
    common = {k: v for k, v in start.items() if parts.axes[k] is None}
    one = lambda xs: parts.train({**common, **xs[0]}, backbone, *xs[1:], images, labels)
    return jax.lax.map(one, (per_slot, slots, rows, keys), batch_size=max_parallel)

  def round_fn(state: ManyState, backbone, slots, rows, images, labels):
    if spread:  # every slot-batched value follows: training runs where its slot is
      slots, rows = (jax.lax.with_sharding_constraint(x, by_slot) for x in (slots, rows))
    start = parts.start(state, slots)
    keys = parts.keys(state, slots)
    trained, uploads, loss, steps = train_slots(start, backbone, slots, rows, keys, images,
                                                labels)
    return parts.aggregate(state, slots, start, trained, uploads, loss, steps)

  if spread:
    return jax.jit(round_fn, donate_argnums=0, out_shardings=(rep, rep))
  return jax.jit(round_fn, donate_argnums=0)


def eval_models(setting: Setting, where: dict) -> np.ndarray:
  """Pair ids whose models are evaluated: every pair when some leaf is per pair,
  else the first pair of each task (all pairs of a task share its model)."""
  if any(w == 'pair' for w in where.values()):
    return np.arange(setting.num_pairs, dtype=np.int32)
  return np.array([int(np.flatnonzero(setting.pairs[:, 1] == t)[0])
                   for t in range(setting.num_tasks)], np.int32)


def make_alpha_tuner(setting: Setting, model, val_counts: np.ndarray, batch: int,
                     alphas: np.ndarray, heads: np.ndarray | None = None):
  """Jitted `(state, start, backbone, pairs [E], images, labels, offsets) -> correct
  [E, A]`: each pair's linear model around c (the shared leaves at the round's start,
  `start`, with the pair's own rows) at c + α·τ for every α of `alphas`, where
  τ = the state's shared leaves − c (the round's mean task vector when the server
  stepped with α = 1), counted right on its task's validation split.

  `ntkfedavg.alpha_sweep` per batch: one `jax.linearize` (a forward) and one JVP give
  the outputs for the whole grid (NTKFedAvg A.3); the frozen heads follow per α."""
  inner, finish = model_lib.make_forward_parts(model, np.asarray(setting.num_classes), heads)
  from fedjax_mtl.algorithms.ntkfedavg import alpha_sweep
  pair_task = jnp.asarray(setting.pair_task)
  counts = jnp.asarray(val_counts, jnp.int32)
  num_batches = max(1, math.ceil(int(np.max(val_counts)) / batch))
  grid = jnp.asarray(alphas, jnp.float32)

  def one(state, start, backbone, pair, images, labels, offsets):
    task = pair_task[pair]
    params = {**state.shared, **{k: v[task] for k, v in state.task_rows.items()},
              **{k: v[pair] for k, v in state.pair_rows.items()}}
    c = {**params, **start}
    tau = jax.tree.map(jnp.subtract, params, c)

    def body(acc, b):
      pos = b * batch + jnp.arange(batch)
      valid = pos < counts[task]
      i = offsets[task] + jnp.minimum(pos, counts[task] - 1)
      z = alpha_sweep(lambda p, x: inner(backbone, p, x), c, tau, images[i], grid)
      logits = jax.vmap(lambda z: finish(z, task))(z)  # [A, B, C]
      right = (jnp.argmax(logits, -1) == labels[i][None]) & valid[None]
      return acc + jnp.sum(right, 1), None

    right, _ = jax.lax.scan(body, jnp.zeros(grid.shape, jnp.int32), jnp.arange(num_batches))
    return right

  def tune(state, start, backbone, pairs, images, labels, offsets):
    return jax.lax.map(lambda p: one(state, start, backbone, p, images, labels, offsets), pairs)

  return jax.jit(tune)


def make_eval(setting: Setting, model, test_counts: np.ndarray, batch: int,
              heads: np.ndarray | None = None, linear: bool = False):
  """Jitted `(state, backbone, pairs [E], images, labels, offsets) -> (correct [E], loss [E])`:
  each pair's model (global + its task's head, or its own rows) on its task's test
  split (`images`/`labels` concatenated over tasks, task t from `offsets[t]`).

  `linear=True` (NTKFedAvg's evaluation B, spec §2.4): `(state, start, backbone, ...)`
  evaluates the model linearised around c at the state's params, f(x; c) +
  J_c(x)(θ − c), where c is `start` (the shared leaves at the round's start) with
  the pair's own rows as they are now."""
  inner, finish = model_lib.make_forward_parts(model, np.asarray(setting.num_classes), heads)
  own = tables(setting)
  counts = jnp.asarray(test_counts, jnp.int32)
  num_batches = max(1, math.ceil(int(np.max(test_counts)) / batch))

  def one(state, start, backbone, pair, images, labels, offsets):
    task = jnp.asarray(_current(own).pair_task)[pair]
    params = {**state.shared, **{k: v[task] for k, v in state.task_rows.items()},
              **{k: v[pair] for k, v in state.pair_rows.items()}}
    if linear:
      c = {**params, **start}
      f = lambda x: finish(linear_outputs(lambda p, x: inner(backbone, p, x), c, params, x), task)
    else:
      f = lambda x: finish(inner(backbone, params, x), task)

    def batch_sums(b):
      pos = b * batch + jnp.arange(batch)
      valid = pos < counts[task]
      i = offsets[task] + jnp.minimum(pos, counts[task] - 1)
      logits = f(images[i])
      y = labels[i]
      nll = model_lib.nll(logits, y)
      right = (jnp.argmax(logits, -1) == y) & valid
      return jnp.sum(right), jnp.sum(jnp.where(valid, nll, 0.))

    def body(acc, b):
      # Tasks have test splits of different sizes: the batches past this task's
      # last one are skipped (a real branch: pairs are a map, not a vmap).
      right, nll = jax.lax.cond(b * batch < counts[task], batch_sums,
                                lambda _: (jnp.int32(0), jnp.float32(0.)), b)
      return (acc[0] + right, acc[1] + nll), None

    (right, nll), _ = jax.lax.scan(body, (jnp.int32(0), jnp.float32(0.)),
                                   jnp.arange(num_batches))
    return right, nll / counts[task]

  def eval_fn(state, backbone, pairs, images, labels, offsets):
    return jax.lax.map(lambda p: one(state, None, backbone, p, images, labels, offsets), pairs)

  def eval_linear(state, start, backbone, pairs, images, labels, offsets):
    return jax.lax.map(lambda p: one(state, start, backbone, p, images, labels, offsets), pairs)

  return jax.jit(eval_linear if linear else eval_fn)
