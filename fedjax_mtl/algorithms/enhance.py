"""The enhancement modules FedDEA compares with (spec feddea §2.5), as wrappers
over any server rule: like `rules.dea`, each transforms every client's update
and hands the base rule prev + (transformed Δ) wherever it would read Δ.

- `pcgrad(rule)`: each client's update, flattened over its whole θ, is projected
  off every other client's update it conflicts with (negative inner product),
  in a random order per client and round (`plugin_math.pcgrad_coefficients` on
  the [N, N] Gram matrix: no [N, d] copy).
- `heal(rule)`: FedHEAL's sign-consistency masks and momentum client weights;
  FedHEAL's step is Σ_k t_k with t_k = q_k ⊙ m_k ⊙ Δ_k (per-coordinate
  renormalised weights q), so client k hands the base rule t_k / w_k, w_k being
  the base's own client weight (`fedavg.weighting`): over FedAvg that is
  exactly FedHEAL, over other bases their rule applied to FedHEAL's terms.

Both act on one update per client, so every role they see must have one row
per client: the unified model (`config.unified='literal'`), task-level clients,
or a base that shares the encoders only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_mtl.algorithms import plugin_math, rules
from fedjax_mtl.algorithms.base import (FedInfo, Server, ServerInputs, ServerState, Views,
                                        mix_rows, stack, tree_sub)
from fedjax_mtl.errors import ConfigError


def check_one_row_per_client(name: str, roles: tuple[str, ...], info: FedInfo) -> None:
  """A ConfigError unless every role in `roles` has exactly one row per client."""
  for r in roles:
    if tuple(info.row_client(r)) != tuple(range(info.num_clients)):
      raise ConfigError(
          f'{name}() needs one update per client, but the {r} role has '
          f'{len(info.row_client(r))} rows for {info.num_clients} clients (a multi-task '
          "client holds several); use task-level clients (e.g. config.unified='literal' "
          'with configs/feddea.py) or a base that shares the encoders only')


def pcgrad(rule: Server, info: FedInfo, seed: int = 0) -> Server:
  """PCGrad over the clients' updates, then `rule` (spec §2.5)."""
  def apply(state, x: ServerInputs):
    prev = {r: stack(v) for r, v in x.prev.items()}
    deltas = {r: tree_sub(stack(x.local[r]), prev[r]) for r in x.local}
    order = plugin_math.pcgrad_order(jax.random.fold_in(jax.random.PRNGKey(seed), x.round),
                                     info.num_clients)
    coef = plugin_math.pcgrad_coefficients(plugin_math.gram(deltas), order)
    projected = {r: mix_rows(coef, d) for r, d in deltas.items()}
    local = plugin_math.add_scaled(prev, projected)
    new, st, logs = rule.apply(state, x._replace(prev=prev, local=local))
    return new, st, {**logs, 'pcgrad_coefficients': coef}

  return Server(init=rule.init, apply=apply)


def heal(rule: Server, info: FedInfo, weighting: str = 'uniform',
         tau: float = plugin_math.HEAL_TAU, beta: float = plugin_math.HEAL_BETA) -> Server:
  """FedHEAL's masks and weights over the clients' updates, then `rule` (spec §2.5).

  State: the sign histories per client row (`ServerState.rows`, sharded with the
  clients) and the client weights, their momentum and each client's count of rounds
  (shared). Under partial participation (`ServerInputs.row_valid`) FedHEAL runs over
  the round's participants, its online clients (`plugin_math.heal_terms`).
  """
  rules.check_weighting(weighting)

  def init(views: Views) -> ServerState:
    inner = rule.init(views)
    hs = plugin_math.heal_init(views)
    return ServerState(shared={'inner': inner.shared,
                               'heal': (hs.weights, hs.delta, hs.count)},
                       rows={r: {'inner': inner.rows.get(r, {}), 'history': hs.history[r]}
                             for r in views})

  def apply(state: ServerState, x: ServerInputs):
    prev = {r: stack(v) for r, v in x.prev.items()}
    deltas = {r: tree_sub(stack(x.local[r]), prev[r]) for r in x.local}
    weights, delta, count = state.shared['heal']
    hs = plugin_math.HealState(history={r: state.rows[r]['history'] for r in deltas},
                               weights=weights, delta=delta, count=count)
    terms, hs, heal_logs = plugin_math.heal_terms(hs, deltas, tau, beta, x.row_valid)
    w = rules.row_weights(weighting, info, 'encoder', x)  # one row per client: w_k
    w = jnp.where(w > 0, w, 1.)  # a client that sat out has weight 0 and term 0
    step = {r: jax.tree.map(lambda t: t / w.reshape((-1,) + (1,) * (t.ndim - 1)), v)
            for r, v in terms.items()}
    inner = ServerState(state.shared['inner'], {r: v['inner'] for r, v in state.rows.items()})
    local = plugin_math.add_scaled(prev, step)
    new, st, logs = rule.apply(inner, x._replace(prev=prev, local=local))
    rows = {r: {'inner': st.rows.get(r, {}), 'history': hs.history[r]} for r in deltas}
    shared = {'inner': st.shared, 'heal': (hs.weights, hs.delta, hs.count)}
    return new, ServerState(shared, rows), {**logs, 'heal_weights': heal_logs['weights']}

  return Server(init=init, apply=apply)
