"""One communication round as pure functions: local training of every client
group (the algorithm's client part inside the vmapped steps), then the server
part on the shared roles' rows gathered across groups, scattered back.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fedjax_mtl import federation, local
from fedjax_mtl.algorithms.base import ServerInputs, ServerState
from fedjax_mtl.experiment import Experiment, train_compiler_options, views
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


def finalize(exp: Experiment, trained: list[GroupState], start: list) -> tuple[list, list]:
  """The client part's finalize on every group: (group states, uploads)."""
  out = [local.finalize_group(exp.algorithm, gs, s) for gs, s in zip(trained, start)]
  return [o[0] for o in out], [o[1] for o in out]


def server_step(exp: Experiment, state: FedState, start: list, trained: list[GroupState],
                uploads: list, metrics: list) -> tuple[FedState, dict]:
  """Aggregate the uploads of the shared roles against the round's start params.

  `start` = each group's params at the round start; `trained` = the group
  states after local training; `metrics[g]['steps']` = local steps per client.
  Returns the next state (round + 1) and the server's logs.
  """
  alg, fed = exp.algorithm, exp.fed
  roles = alg.shared_roles
  steps = jnp.concatenate([m['steps'][:g.num_real] for m, g in zip(metrics, fed.groups)])
  inputs = ServerInputs(
      prev={r: views(exp, start, r) for r in roles},
      local={r: views(exp, uploads, r) for r in roles},
      num_examples=jnp.asarray(fed.num_examples), num_steps=steps.astype(jnp.int32),
      client_ids=jnp.arange(fed.num_clients, dtype=jnp.int32), round=state.round)
  row_roles = trained[0].server_rows.keys() if trained[0].server_rows else ()
  rows = {r: federation.gather_rows([gs.server_rows[r] for gs in trained], fed, r)
          for r in row_roles}
  new, sstate, logs = alg.server.apply(ServerState(state.server, rows), inputs)
  params = [gs.params for gs in trained]
  for r in roles:
    old = [federation.role_view(p, lab, r) for p, lab in zip(params, exp.labels)]
    params = [federation.merge_view(p, v)
              for p, v in zip(params, federation.scatter_rows(new[r], fed, r, old))]
  new_rows = {r: federation.scatter_rows(v, fed, r, [gs.server_rows[r] for gs in trained])
              for r, v in sstate.rows.items()}
  groups = [jax.lax.with_sharding_constraint(
      gs.replace(params=p, server_rows={r: new_rows[r][i] for r in new_rows}),
      exp.client_sharding) for i, (gs, p) in enumerate(zip(trained, params))]
  return FedState(round=state.round + 1, rng=state.rng, groups=groups,
                  server=sstate.shared), logs


def make_round_fn(exp: Experiment):
  """One jitted communication round on device-resident data: train all groups,
  finalize, aggregate, scatter back."""
  cfg = exp.config
  trainers = [local.make_group_trainer(g, m, exp.tx, cfg.optim, cfg.batch_size,
                                       cfg.num_rounds, exp.algorithm, lab)
              for g, m, lab in zip(exp.fed.groups, exp.models_train, exp.labels)]

  def round_fn(state: FedState, data):
    trained, metrics = [], []
    for g, (spec, train) in enumerate(zip(exp.fed.groups, trainers)):
      gs, m = train(state.groups[g], data[spec.dataset]['train'], state.round,
                    group_key(state, g))
      trained.append(gs)
      metrics.append(m)
    start = [gs.params for gs in state.groups]
    trained, uploads = finalize(exp, trained, start)
    new_state, logs = server_step(exp, state, start, trained, uploads, metrics)
    return new_state, {'train': metrics, 'agg': logs}

  return jax.jit(round_fn, donate_argnums=0, out_shardings=(state_shardings(exp), exp.replicated),
                 compiler_options=train_compiler_options(cfg))


def make_chunk_fns(exp: Experiment) -> list:
  """Per group: jitted `(gstate, start, acc, chunk, rng, round) -> (gstate, acc)` on streamed chunks."""
  cfg = exp.config

  def chunk_fn(g, trainer):
    def run(gs, start, acc, chunk, state_rng, rnd):
      key = group_key(FedState(round=rnd, rng=state_rng, groups=[]), g)
      return trainer(gs, start, acc, chunk, key, rnd)
    return jax.jit(run, donate_argnums=(0, 2), out_shardings=exp.client_sharding,
                   compiler_options=train_compiler_options(cfg))

  return [chunk_fn(g, local.make_chunk_trainer(spec, m, exp.tx, cfg.optim, cfg.num_rounds,
                                               exp.algorithm, lab))
          for g, (spec, m, lab) in enumerate(zip(exp.fed.groups, exp.models_train, exp.labels))]


def make_agg_fn(exp: Experiment):
  """Jitted end of a streamed round: finalize, aggregate, per-client mean losses."""
  def agg_fn(state: FedState, start, accs):
    metrics = [{'loss': a['loss_sum'] / jnp.maximum(a['steps'], 1)[:, None],
                'steps': a['steps']} for a in accs]
    trained, uploads = finalize(exp, list(state.groups), start)
    new_state, logs = server_step(exp, state, start, trained, uploads, metrics)
    return new_state, {'train': metrics, 'agg': logs}

  return jax.jit(agg_fn, donate_argnums=0,
                 out_shardings=(state_shardings(exp), exp.replicated))


def eval_variables(exp: Experiment, gs: GroupState) -> tuple[PyTree, PyTree]:
  """(params, batch_stats) a group's clients are evaluated with: the personal
  model where the algorithm trains one, else the client's own."""
  if exp.algorithm.client.personal_model:
    return gs.personal[0], gs.personal[1]
  return gs.params, gs.batch_stats
