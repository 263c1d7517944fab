"""Server rules and rule combinators: small pure transforms over role views.

A rule sees every shared role's rows (`ServerInputs.prev/local`: role ->
`[rows, ...]`) and returns new rows for each. Rules that treat every role
alike (`identity`, `mean`) map over whatever roles they get; `by_role` gives
each role its own rule; wrappers (`for_rounds`, `with_server_momentum`,
`masked`, `grouped`) take any rule and return a rule.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl.algorithms.base import (Blocks, FedInfo, Server, ServerInputs, ServerState,
                                        Views, block_rows, broadcast_rows, stack, tree_mean,
                                        tree_sub, unstack)


def _no_state(views: Views) -> ServerState:
  return ServerState()


def identity() -> Server:
  """Every row keeps its upload (Local training)."""
  return Server(init=_no_state, apply=lambda state, x: (dict(x.local), state, {}), blocks=True)


def mean(weighting: str = 'uniform', info: FedInfo | None = None) -> Server:
  """FedAvg: every row gets the mean of its role's uploaded rows.

  `weighting='uniform'` (FedHCA2's released baselines) or `'examples'` (rows
  weighted by their owner client's number of local examples; needs `info`).
  """
  if weighting not in ('uniform', 'examples'):
    raise ValueError(f"unknown weighting {weighting!r}; valid choices: 'uniform', 'examples'")

  def apply(state, x: ServerInputs):
    out = {}
    for role, local in x.local.items():
      w = None
      if weighting == 'examples':
        n = x.num_examples[jnp.asarray(info.row_client(role))]
        w = n / jnp.sum(n)
      out[role] = broadcast_rows(tree_mean(local, w), local)
    return out, state, {}

  return Server(init=_no_state, apply=apply, blocks=True)


def by_role(rules: Mapping[str, Server]) -> Server:
  """Role `r`'s rows go through `rules[r]` alone (e.g. FedHCA2's two rules).

  Takes `Blocks` views; a part rule without `blocks` gets its role's rows
  (and per-row state) concatenated and its output split back.
  """
  def init(views: Views) -> ServerState:
    states = {r: rules[r].init({r: views[r]}) for r in rules if r in views}
    return ServerState(shared={r: s.shared for r, s in states.items()},
                       rows={r: s.rows.get(r, {}) for r, s in states.items()})

  def apply(state: ServerState, x: ServerInputs):
    out, shared, rows, logs = {}, {}, {}, {}
    for r, rule in rules.items():
      if r not in x.local:
        continue
      prev, local, rw = x.prev[r], x.local[r], state.rows.get(r, {})
      back = lambda v: v
      if isinstance(local, Blocks) and not rule.blocks:
        sizes = block_rows(local)
        prev, local = stack(prev), stack(local)
        rw = stack(rw) if isinstance(rw, Blocks) else rw
        back = lambda v, sizes=sizes: (unstack(v, sizes) if jax.tree.leaves(v) else v)
      sub = x._replace(prev={r: prev}, local={r: local})
      new, st, lg = rule.apply(ServerState(state.shared[r], {r: rw}), sub)
      out[r] = back(new[r])
      shared[r], rows[r] = st.shared, back(st.rows.get(r, {}))
      logs.update(lg)
    return out, ServerState(shared, rows), logs

  return Server(init=init, apply=apply, blocks=True)


def for_rounds(rule: Server, num_rounds: int) -> Server:
  """`rule` in rounds < `num_rounds` (0-based), then every row keeps its upload."""
  def apply(state, x):
    new, st, logs = rule.apply(state, x)
    on = x.round < num_rounds
    pick = lambda a, b: jax.tree.map(lambda u, v: jnp.where(on, u, v), a, b)
    return pick(new, dict(x.local)), pick(st, state), logs

  return Server(init=rule.init, apply=apply, blocks=rule.blocks)


def with_server_momentum(rule: Server, momentum: float = 0.9, lr: float = 1.0) -> Server:
  """Server momentum over any rule (FedAvgM): per row, with Δ = rule output - prev,
  m ← momentum·m + Δ and θ ← prev + lr·m. The momentum buffers are per-row state
  (sharded with the clients)."""
  def init(views: Views) -> ServerState:
    inner = rule.init(views)
    m = {r: jax.tree.map(lambda v: jnp.zeros(v.shape, jnp.float32), v) for r, v in views.items()}
    return ServerState(shared=inner.shared,
                       rows={r: {'inner': inner.rows.get(r, {}), 'momentum': m[r]} for r in views})

  def apply(state: ServerState, x: ServerInputs):
    inner_state = ServerState(state.shared, {r: v['inner'] for r, v in state.rows.items()})
    new, st, logs = rule.apply(inner_state, x)
    out, rows = {}, {}
    for r, v in new.items():
      m = jax.tree.map(lambda m, a, p: momentum * m + (a.astype(jnp.float32) - p.astype(jnp.float32)),
                       state.rows[r]['momentum'], v, x.prev[r])
      out[r] = jax.tree.map(lambda p, mm: (p.astype(jnp.float32) + lr * mm).astype(p.dtype),
                            x.prev[r], m)
      rows[r] = {'inner': st.rows.get(r, {}), 'momentum': m}
    return out, ServerState(st.shared, rows), logs

  return Server(init=init, apply=apply)


def top_rho_mask(deltas: Views, row_client: Mapping[str, Sequence[int]], num_clients: int,
                 rho: float) -> Views:
  """Per client, keep the ⌊ρ·d⌋ largest |Δ| over its whole update (all its rows of
  all roles; ties at the threshold kept): a 0/1 mask shaped like `deltas`."""
  flat = {r: jax.tree.map(lambda v: v.reshape(v.shape[0], -1), t) for r, t in deltas.items()}
  per_client = []
  for c in range(num_clients):
    parts = [jnp.abs(v[i]) for r, t in flat.items() for v in jax.tree.leaves(t)
             for i in np.flatnonzero(np.asarray(row_client[r]) == c)]
    per_client.append(jnp.concatenate(parts))
  # ⌊ρ·d_c⌋ per client: clients with more task decoders have larger updates.
  thresh = jnp.stack([jax.lax.top_k(v, max(int(np.floor(rho * v.shape[0])), 1))[0][-1]
                      for v in per_client])
  out = {}
  for r, t in deltas.items():
    th = thresh[jnp.asarray(row_client[r])]
    out[r] = jax.tree.map(
        lambda v: (jnp.abs(v) >= th.reshape((-1,) + (1,) * (v.ndim - 1))).astype(jnp.float32), t)
  return out


def masked(rule: Server, info: FedInfo, rho: float, rescale: bool = True) -> Server:
  """The base rule sees sparsified updates: per client, the top-ρ entries of Δ by
  magnitude (over its whole update), scaled by 1/ρ when `rescale`; the rest of
  each upload is the round's starting value."""
  if rho == 1:
    return rule  # every entry kept, no rescale: the base rule bit for bit
  row_client = {r: info.row_client(r) for r in ('encoder', 'decoder')}
  scale = 1.0 / rho if rescale else 1.0

  def apply(state, x: ServerInputs):
    deltas = {r: tree_sub(x.local[r], x.prev[r]) for r in x.local}
    mask = top_rho_mask(deltas, row_client, info.num_clients, rho)
    local = {r: jax.tree.map(lambda p, d, m: (p.astype(jnp.float32) + scale * m * d).astype(p.dtype),
                             x.prev[r], deltas[r], mask[r]) for r in x.local}
    new, st, logs = rule.apply(state, x._replace(local=local))
    kept = sum(jnp.sum(m) for t in mask.values() for m in jax.tree.leaves(t))
    total = sum(m.size for t in mask.values() for m in jax.tree.leaves(t))
    return new, st, {**logs, 'masked_kept_fraction': kept / total}

  return Server(init=rule.init, apply=apply)


def grouped(rule: Server, row_groups: Mapping[str, Sequence[int]]) -> Server:
  """`rule` applied separately within each group of rows (static group ids per
  role's row, e.g. per dataset); per-row server state follows its rows."""
  def groups_of(role):
    ids = np.asarray(row_groups[role])
    return [np.flatnonzero(ids == g) for g in np.unique(ids)]

  take = lambda t, idx: jax.tree.map(lambda v: v[jnp.asarray(idx)], t)

  def init(views: Views) -> ServerState:
    states = {r: [rule.init({r: take(v, idx)}) for idx in groups_of(r)] for r, v in views.items()}
    return ServerState(shared={r: [s.shared for s in ss] for r, ss in states.items()},
                       rows={r: _cat_rows([s.rows.get(r, {}) for s in ss], groups_of(r))
                             for r, ss in states.items()})

  def apply(state: ServerState, x: ServerInputs):
    out, shared, rows, logs = {}, {}, {}, {}
    for r in x.local:
      parts, sh, rw = [], [], []
      for gi, idx in enumerate(groups_of(r)):
        sub = x._replace(prev={r: take(x.prev[r], idx)}, local={r: take(x.local[r], idx)})
        st = ServerState(state.shared[r][gi], {r: take(state.rows.get(r, {}), idx)})
        new, st, lg = rule.apply(st, sub)
        parts.append(new[r])
        sh.append(st.shared)
        rw.append(st.rows.get(r, {}))
        logs.update({f'{k}_group{gi}': v for k, v in lg.items()})
      out[r] = _cat_rows(parts, groups_of(r))
      shared[r], rows[r] = sh, _cat_rows(rw, groups_of(r))
    return out, ServerState(shared, rows), logs

  return Server(init=init, apply=apply)


def _cat_rows(parts: list, groups: list[np.ndarray]):
  """Per-group stacked rows back in the original row order."""
  if not jax.tree.leaves(parts[0]):
    return parts[0]
  order = np.argsort(np.concatenate(groups))
  return jax.tree.map(lambda *xs: jnp.concatenate(xs, 0)[jnp.asarray(order)], *parts)
