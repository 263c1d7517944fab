"""One communication round as pure functions: local training of every client
group (the algorithm's client part inside the vmapped steps), then the server
part on the shared roles' rows gathered across groups, scattered back.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl import federation, local_training
from fedjax_mtl.algorithms import rows as rows_lib
from fedjax_mtl.algorithms.base import (ServerInputs, ServerState, merge_view, role_view, stack,
                                        unstack)
from fedjax_mtl.experiment import Experiment, train_compiler_options
from fedjax_mtl.state import FedState, GroupState

PyTree = Any


def state_shardings(exp: Experiment) -> FedState:
  """Shardings of the state (a prefix tree): client groups along `clients`, the rest
  replicated. Given as the round's output shardings, so that the next call sees the
  shardings of the first (one compiled round, not two)."""
  rep = exp.replicated
  return FedState(round=rep, rng=rep, groups=[exp.client_sharding] * len(exp.fed.groups),
                  server=rep)


def group_key(state: FedState, g: int) -> jax.Array:
  """Round key of client group `g` (local training randomness)."""
  return jax.random.fold_in(jax.random.fold_in(state.rng, state.round), g)


def make_begin(exp: Experiment):
  """The jitted `(params, server_rows) -> params` of the client part's `begin(params,
  server_rows, labels)` on every client, or None when the algorithm has none."""
  begin = exp.algorithm.client.begin
  if begin is None:
    return None

  def fn(params, rows):
    return [jax.vmap(lambda p, r, lab=lab: begin(p, r, lab))(p, r)
            for p, r, lab in zip(params, rows, exp.labels)]

  return jax.jit(fn, out_shardings=exp.client_sharding)


def begin_round(begin_fn, state: FedState) -> FedState:
  """The state whose params local training starts from: each client's params through
  `begin_fn` (`make_begin`), or `state` itself when it is None."""
  if begin_fn is None:
    return state
  params = begin_fn([gs.params for gs in state.groups], [gs.server_rows for gs in state.groups])
  return state.replace(groups=[gs.replace(params=p) for gs, p in zip(state.groups, params)])


def start_axes(exp: Experiment, g: int):
  """Group `g`'s `Experiment.start_axes` (0 when every leaf has a row per client)."""
  return 0 if exp.start_axes is None else exp.start_axes[g]


def _is_none(x) -> bool:
  return x is None


def make_round_start(exp: Experiment):
  """The jitted `params -> start` giving each group's round-start params, as local
  training and the aggregation read them, where `Experiment.start_axes` marks
  leaves that every client starts from alike (the unified model's encoder): a copy
  holding one row of those leaves and every row of the others. The groups' params
  can then be donated to local training: a round holds one copy of the global
  model plus the clients' trained state, not a second copy per client. None when
  no leaf is marked: the start is the params themselves (`round_start`)."""
  if exp.start_axes is None:
    return None
  rep, shard = exp.replicated, exp.client_sharding

  def one(ax, x):
    return x[0] if ax is None else jnp.copy(x)

  def fn(params):
    return [jax.tree.map(one, ax, p, is_leaf=_is_none) for ax, p in zip(exp.start_axes, params)]

  outs = [jax.tree.map(lambda ax: rep if ax is None else shard, ax, is_leaf=_is_none)
          for ax in exp.start_axes]
  return jax.jit(fn, out_shardings=outs)


def round_start(start_fn, params: list) -> list:
  """Each group's round-start params: `start_fn(params)` (`make_round_start`), or
  `params` itself when it is None."""
  return params if start_fn is None else start_fn(params)


def abstract_round_start(exp: Experiment, params: list) -> list:
  """`round_start`'s output shapes and shardings for abstract `params`."""
  if exp.start_axes is None:
    return params
  return [jax.tree.map(lambda ax, x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype,
                                                          sharding=exp.replicated)
                       if ax is None else x, ax, p, is_leaf=_is_none)
          for ax, p in zip(exp.start_axes, params)]


def expand_start(exp: Experiment, start: list) -> list:
  """`round_start`'s output with a row per client everywhere (inside a program:
  the broadcast is read in place by the fusions that consume it)."""
  if exp.start_axes is None:
    return start
  return [jax.tree.map(lambda ax, x, n=g.num_total: jnp.broadcast_to(x, (n,) + x.shape)
                       if ax is None else x, ax, s, is_leaf=_is_none)
          for ax, s, g in zip(exp.start_axes, start, exp.fed.groups)]


def finalize(exp: Experiment, trained: list[GroupState], start: list) -> tuple[list, list]:
  """The client part's finalize on every group: (group states, uploads)."""
  out = [local_training.finalize_group(exp.algorithm, gs, s, start_axes(exp, g))
         for g, (gs, s) in enumerate(zip(trained, start))]
  return [o[0] for o in out], [o[1] for o in out]


def group_valid(exp: Experiment, valid: jax.Array) -> list[jax.Array]:
  """Per group, [rows] bool of its clients in the [N] participants mask `valid`
  (padding rows False)."""
  return [jnp.concatenate([valid[jnp.asarray(g.client_ids)], jnp.zeros((g.num_pad,), bool)])
          for g in exp.fed.groups]


def server_step(exp: Experiment, state: FedState, start: list, trained: list[GroupState],
                uploads: list, metrics: list, valid: jax.Array | None = None
                ) -> tuple[FedState, dict]:
  """Aggregate the uploads of the shared roles against the round's start params.

  `start` = each group's params at the round start (`round_start`'s output);
  `trained` = the group states after local training; `metrics[g]['steps']` =
  local steps per client; `valid` ([N] bool, None: every client) = the round's
  participants, which the server sees as `ServerInputs.row_valid` (each rule decides
  what its per-row state does for the others: a client's own state, such as
  `sparsify`'s residual or FedAMP's cloud model, stays; a global quantity kept per
  row, such as server momentum, moves for every row).
  Returns the next state (round + 1) and the server's logs.

  A `blocks` server reads the rows where they are (the groups' arrays) and its
  new rows become the groups' new arrays as they are; other servers get the
  rows concatenated across groups (`stack`) and their output is split back.
  """
  alg, fed = exp.algorithm, exp.fed
  roles = alg.shared_roles
  to_server = (lambda v: v) if alg.server.blocks else stack
  from_server = ((lambda v, r: v) if alg.server.blocks
                 else (lambda v, r: unstack(v, federation.block_sizes(fed, r))))

  def gather(trees, role):
    return to_server(federation.gather_blocks(trees, fed, role))

  start = expand_start(exp, start)
  steps = jnp.concatenate([m['steps'][:g.num_real] for m, g in zip(metrics, fed.groups)])
  edge = {k: jnp.concatenate([m[k][:g.num_real] if k in m else jnp.zeros((g.num_real,))
                              for m, g in zip(metrics, fed.groups)])
          for k in ('first_loss', 'last_loss')}
  inputs = ServerInputs(
      prev={r: gather([role_view(p, lab, r) for p, lab in zip(start, exp.labels)], r)
            for r in roles},
      local={r: gather([role_view(p, lab, r) for p, lab in zip(uploads, exp.labels)], r)
             for r in roles},
      num_examples=jnp.asarray(fed.num_examples), num_steps=steps.astype(jnp.int32),
      client_ids=jnp.arange(fed.num_clients, dtype=jnp.int32), round=state.round,
      first_loss=edge['first_loss'], last_loss=edge['last_loss'], row_valid=valid)
  row_roles = trained[0].server_rows.keys() if trained[0].server_rows else ()
  rows = {r: gather([gs.server_rows[r] for gs in trained], r) for r in row_roles}
  new, sstate, logs = alg.server.apply(ServerState(state.server, rows), inputs)
  params = [gs.params for gs in trained]
  for r in roles:
    old = [role_view(p, lab, r) for p, lab in zip(params, exp.labels)]
    params = [merge_view(p, v) for p, v in
              zip(params, federation.scatter_blocks(from_server(new[r], r), fed, r, old))]
  new_rows = {r: (federation.scatter_blocks(from_server(v, r), fed, r,
                                            [gs.server_rows[r] for gs in trained])
                  if jax.tree.leaves(v) else [gs.server_rows[r] for gs in trained])
              for r, v in sstate.rows.items()}
  groups = [jax.lax.with_sharding_constraint(
      gs.replace(params=p, server_rows={r: new_rows[r][i] for r in new_rows}),
      exp.client_sharding) for i, (gs, p) in enumerate(zip(trained, params))]
  return FedState(round=state.round + 1, rng=state.rng, groups=groups,
                  server=sstate.shared), logs


def make_train_fns(exp: Experiment) -> list:
  """Per group: jitted `(gstate, start, data, round, rng, total[, frac]) -> (gstate,
  metrics)`, one round of local training on device-resident data (in-memory feed);
  `start` = the group's `round_start`; `total` = `num_rounds(exp)`, an argument so
  that runs of any length share the program; `frac` ([rows] float32, with
  stragglers): the share of its local steps each client completes.

  Each group's trainer is its own program, and so is the aggregation
  (`make_agg_fn`): a group's program is compiled once whatever the federation
  around it, and the aggregation the engine runs is exactly the one
  `scripts/bench.py --only=engine_agg` times. The group state is donated where
  `round_start` keeps its own copy of the start (`Experiment.start_axes`);
  otherwise its params are the start the aggregation reads, and are kept.
  """
  return jit_trainers(exp, train_bodies(exp))


def jit_trainers(exp: Experiment, bodies: list) -> list:
  """The group trainers `bodies` jitted with the state's shardings and donation."""
  return [jax.jit(run, out_shardings=(exp.client_sharding, exp.client_sharding),
                  donate_argnums=train_donation(exp),
                  compiler_options=train_compiler_options(exp.config))
          for run in bodies]


def group_trainers(exp: Experiment) -> list:
  """Per group: `local_training.make_group_trainer` with the run's settings."""
  cfg = exp.config
  return [local_training.make_group_trainer(spec, m, exp.tx, cfg.optim, cfg.batch_size,
                                            cfg.num_rounds, exp.algorithm, lab,
                                            start_axes(exp, g),
                                            int(cfg.get('max_steps_per_round', 0)),
                                            int(cfg.get('max_parallel_clients', 0)))
          for g, (spec, m, lab) in enumerate(zip(exp.fed.groups, exp.models_train, exp.labels))]


def train_donation(exp: Experiment) -> tuple[int, ...]:
  """The trainers' donated arguments (`make_train_fns`)."""
  return (0,) if exp.start_axes is not None else ()


def train_bodies(exp: Experiment) -> list:
  """Per group: `make_train_fns`' function before it is jitted (a sweep's replica
  programs vmap it)."""
  def body(g, trainer):
    def run(gs, start, data, rnd, state_rng, total, frac=None):
      key = group_key(FedState(round=rnd, rng=state_rng, groups=[]), g)
      return trainer(gs, data, rnd, key, start, total, frac)
    return run

  return [body(g, trainer) for g, trainer in enumerate(group_trainers(exp))]


def take_rows(tree: PyTree, rows: jax.Array, axes: PyTree = 0) -> PyTree:
  """The rows `rows` of every leaf with a client axis (`axes`: 0, or per leaf 0 or
  None for a leaf every client shares, kept whole)."""
  if axes is None or isinstance(axes, int):
    return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), tree)
  return jax.tree.map(lambda ax, x: x if ax is None else jnp.take(x, rows, axis=0), axes, tree,
                      is_leaf=_is_none)


def put_rows(tree: PyTree, part: PyTree, rows: jax.Array) -> PyTree:
  """`tree` with its rows `rows` replaced by `part`'s."""
  return jax.tree.map(lambda x, p: x.at[rows].set(p.astype(x.dtype)), tree, part)


def sampled_bodies(exp: Experiment) -> list:
  """Per group: `(gstate, start, data, round, rng, total, rows) -> (gstate, metrics)`,
  local training of the group rows `rows` only (a round's participants: a fixed number
  per group, `participation.Sampler`). Their rows of the state are gathered, trained
  with the keys, batches and learning rates they have in a full round, and written
  back; the other rows are left as they are, and their metrics are zero (no steps)."""
  out = []
  for g, (spec, trainer) in enumerate(zip(exp.fed.groups, group_trainers(exp))):
    table = local_training.group_rows(spec)

    def run(gs, start, data, rnd, state_rng, total, rows, frac=None, g=g, trainer=trainer,
            table=table, n=spec.num_total):
      key = group_key(FedState(round=rnd, rng=state_rng, groups=[]), g)
      part, metrics = trainer.sampled(take_rows(gs, rows), data, rnd, key,
                                      take_rows(start, rows, start_axes(exp, g)),
                                      local_training.GroupRows(*take_rows(tuple(table), rows)),
                                      total, frac)
      zeros = {k: jnp.zeros((n,) + v.shape[1:], v.dtype) for k, v in metrics.items()}
      return put_rows(gs, part, rows), put_rows(zeros, metrics, rows)

    out.append(run)
  return out


def make_sampled_train_fns(exp: Experiment) -> list:
  """`sampled_bodies`, jitted like `make_train_fns` (the group rows are an argument:
  one program for every round's draw)."""
  return jit_trainers(exp, sampled_bodies(exp))


def num_rounds(exp: Experiment) -> np.int32:
  """The trainers' `total` argument: the run's rounds, which the learning-rate
  schedule spans (a host scalar: every process passes the same value)."""
  return np.int32(exp.config.num_rounds)


def make_chunk_fns(exp: Experiment) -> list:
  """Per group: jitted `(gstate, start, acc, chunk, rng, round, total) -> (gstate, acc)` on
  streamed chunks (`total` as in `make_train_fns`)."""
  cfg = exp.config

  def chunk_fn(g, trainer):
    def run(gs, start, acc, chunk, state_rng, rnd, total):
      key = group_key(FedState(round=rnd, rng=state_rng, groups=[]), g)
      return trainer(gs, start, acc, chunk, key, rnd, total=total)
    return jax.jit(run, donate_argnums=(0, 2), out_shardings=exp.client_sharding,
                   compiler_options=train_compiler_options(cfg))

  return [chunk_fn(g, local_training.make_chunk_trainer(spec, m, exp.tx, cfg.optim, cfg.num_rounds,
                                               exp.algorithm, lab, start_axes(exp, g),
                                               int(cfg.get('max_parallel_clients', 0))))
          for g, (spec, m, lab) in enumerate(zip(exp.fed.groups, exp.models_train, exp.labels))]


def finite_rows(tree: PyTree, n: int) -> jax.Array:
  """[n] bool: every floating value of client row i of `tree` is finite."""
  rows = [x.reshape(n, -1) for x in jax.tree.leaves(tree)
          if jnp.issubdtype(x.dtype, jnp.inexact)]
  # Σ x·0 is 0 when every value is finite and NaN otherwise (inf·0 and NaN·0 are NaN):
  # a float reduction, which XLA:CPU runs as one fused pass, where `all(isfinite)`
  # writes a bool per entry and reduces it in windows (a third of FedAvg's round
  # aggregation at Swin-T scale).
  return functools.reduce(jnp.logical_and, [jnp.isfinite(jnp.sum(x * 0, axis=1))
                                            for x in _packed_columns(rows)],
                          jnp.ones(n, bool))


def _packed_columns(rows: list[jax.Array]) -> list[jax.Array]:
  """[r, d] arrays with the ones `rows.packed_indices` chooses concatenated along d in
  float32 (inf and NaN kept): one reduction over them, not one per leaf, as a
  program's compile time grows with its reductions (a Swin client has ~200
  leaves); the others as they are."""
  chosen = set(rows_lib.packed_indices([x.shape[1] for x in rows]))
  small = [x.astype(jnp.float32) for i, x in enumerate(rows) if i in chosen]
  big = [x for i, x in enumerate(rows) if i not in chosen]
  return big + ([jnp.concatenate(small, axis=1)] if small else [])


def health(metrics: list, trained: list, new: list, server: PyTree) -> dict:
  """Which clients' round went non-finite, computed on device with the round.

  'loss' [n, slots] per group (the logged training losses), 'params' [n] per
  group (after local training), 'agg' [n] per group (after aggregation) and
  'server' (the server state and logs, one flag). One fused read of the
  params; the host looks at the flags with the round's other outputs.
  """
  finite_all = [jnp.all(jnp.isfinite(x)) for x in _packed_columns(
      [x.reshape(1, -1) for x in jax.tree.leaves(server) if jnp.issubdtype(x.dtype, jnp.inexact)])]
  sizes = [m['loss'].shape[0] for m in metrics]
  return {'loss': [jnp.isfinite(m['loss']) for m in metrics],
          'params': [finite_rows(p, n) for p, n in zip(trained, sizes)],
          'agg': [finite_rows(p, n) for p, n in zip(new, sizes)],
          'server': functools.reduce(jnp.logical_and, finite_all, jnp.bool_(True))}


def make_agg_fn(exp: Experiment, streamed: bool = False):
  """Jitted end of a round, `(core, params, start, metrics) -> (core, outputs)`: the
  client part's finalize, the server part over the shared roles, the new rows
  written back into the groups. Call it through `aggregate`.

  The program sees only what aggregation reads or writes: `core` is the state
  with each group reduced to its client-part state and per-row server state
  (donated, with the round, RNG and server state); `params` are the trained
  params and `start` each group's `round_start` (read, not donated); optimizer states, batch-norm statistics and personal models stay
  outside (no pass-through copies). The new params get fresh buffers: XLA:CPU
  copies a donated input that a loop reads before an output overwrites it (the
  Gram pass does), and JAX pairs donated inputs with outputs by shape, so a
  donated params tree would cost a full copy of every encoder.
  `metrics` per group: {'loss' [n, slots], 'steps' [n], 'first_loss' [n],
  'last_loss' [n]}, or with `streamed` the chunk accumulators {'loss_sum',
  'steps', 'first_loss', 'last_loss'}. The outputs carry the round's
  `health` flags (non-finite losses, params, aggregation results).
  """
  return jax.jit(agg_body(exp, streamed), donate_argnums=0,
                 out_shardings=(state_shardings(exp), exp.replicated))


def agg_body(exp: Experiment, streamed: bool = False):
  """`make_agg_fn`'s function before it is jitted (a sweep's replica programs vmap it).
  Its optional last argument `valid` ([N] bool) marks a round's participants
  (`server_step`); the client-part state of the others is left as it was."""
  def agg_fn(core: FedState, params, start, metrics, valid=None):
    if streamed:
      metrics = [{'loss': a['loss_sum'] / jnp.maximum(a['steps'], 1)[:, None],
                  'steps': a['steps'],
                  **{k: a[k] for k in ('first_loss', 'last_loss') if k in a}} for a in metrics]
    groups = [GroupState(params=p, batch_stats=None, opt_state=None, client=c['client'],
                         server_rows=c['server_rows'], personal=None)
              for p, c in zip(params, core.groups)]
    trained, uploads = finalize(exp, groups, start)
    if valid is not None:
      trained = [t.replace(client=rows_lib.keep_rows(t.client, gs.client, on))
                 for t, gs, on in zip(trained, groups, group_valid(exp, valid))]
    new_state, logs = server_step(exp, core.replace(groups=groups), start, trained, uploads,
                                  metrics, valid)
    new_core = new_state.replace(groups=[
        {'params': gs.params, 'client': gs.client, 'server_rows': gs.server_rows}
        for gs in new_state.groups])
    written = [[role_view(gs.params, lab, r) for r in exp.algorithm.shared_roles]
               for gs, lab in zip(new_state.groups, exp.labels)]  # what the server wrote
    checks = health(metrics, params, written, (new_state.server, logs))
    return new_core, {'train': metrics, 'agg': logs, 'health': checks}

  return agg_fn


def agg_core(state: FedState) -> FedState:
  """The part of the state the aggregation program takes (see `make_agg_fn`)."""
  return state.replace(groups=[{'client': gs.client, 'server_rows': gs.server_rows}
                               for gs in state.groups])


def aggregate(agg_fn, state: FedState, start: list, metrics: list,
              stats_fn=None, valid=None) -> tuple:
  """Run `make_agg_fn`'s program on the trained `state`: (next state, outputs);
  then `stats_fn` (`make_stats_fn`), if given, on the batch-norm statistics.
  `valid`: the round's participants ([N] bool), or None for every client (both
  programs take it)."""
  extra = () if valid is None else (valid,)
  core, out = agg_fn(agg_core(state), [gs.params for gs in state.groups], start, metrics,
                     *extra)
  groups = [gs.replace(**g) for gs, g in zip(state.groups, core.groups)]
  if stats_fn is not None:
    stats = stats_fn([gs.batch_stats for gs in groups], *extra)
    groups = [gs.replace(batch_stats=b) for gs, b in zip(groups, stats)]
  return core.replace(groups=groups), out


def make_stats_fn(exp: Experiment):
  """The jitted `[group batch_stats] -> [group batch_stats]` of an algorithm with
  `average_stats` (MaT-FL's aggregation of every `backbone` key, running
  statistics included: NTKFedAvg spec A8's FedAvg): every client's encoder
  batch-norm statistics become their uniform mean over the real clients (with a
  second argument `valid`, the round's [N] participants: over the participants, as
  the parameters are); None for the other algorithms (each client keeps its own
  statistics)."""
  if not exp.algorithm.average_stats:
    return None
  fed = exp.fed

  def average(stats: list, *valid) -> list:
    if not all('encoder' in (s or {}) for s in stats):
      return stats  # an encoder without batch norm
    if valid:
      on = [v[:g.num_real].astype(jnp.float32)
            for v, g in zip(group_valid(exp, valid[0]), fed.groups)]
      part = lambda x, g, w: jnp.tensordot(w, x[:g.num_real].astype(jnp.float32), 1)
      count = jnp.sum(valid[0].astype(jnp.float32))
    else:
      on = [None] * len(fed.groups)
      part = lambda x, g, w: jnp.sum(x[:g.num_real], 0)
      count = fed.num_clients
    total = jax.tree.map(lambda *xs: sum(xs), *[
        jax.tree.map(lambda x, g=g, w=w: part(x, g, w), s['encoder'])
        for s, g, w in zip(stats, fed.groups, on)])
    mean = jax.tree.map(lambda t: t / count, total)
    return [{**s, 'encoder': jax.tree.map(
        lambda m, x: jnp.broadcast_to(m, x.shape).astype(x.dtype), mean, s['encoder'])}
        for s in stats]

  return jax.jit(average, donate_argnums=0)


def group_steps(exp: Experiment) -> list[int]:
  """Local steps of each client group's round (its longest client's, at most
  `max_steps_per_round` when that is set)."""
  cap = int(exp.config.get('max_steps_per_round', 0))
  steps = [g.local_epochs * (max(g.counts) // exp.config.batch_size) for g in exp.fed.groups]
  return [min(s, cap) if cap else s for s in steps]


def eval_variables(exp: Experiment, gs: GroupState) -> tuple[PyTree, PyTree]:
  """(params, batch_stats) a group's clients are evaluated with: the personal
  model where the algorithm trains one, else the client's own."""
  if exp.algorithm.client.personal_model:
    return gs.personal[0], gs.personal[1]
  return gs.params, gs.batch_stats
