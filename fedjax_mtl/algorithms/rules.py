"""Server rules and rule combinators: small pure transforms over role views.

A rule sees every shared role's rows (`ServerInputs.prev/local`: role ->
`[rows, ...]`) and returns new rows for each. Rules that treat every role
alike (`identity`, `mean`) map over whatever roles they get; `by_role` gives
each role its own rule; wrappers (`for_rounds`, `with_server_momentum`, `dea`,
`grouped`, `unified`) take any rule and return a rule.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl.algorithms import topk
from fedjax_mtl.algorithms.base import (STACKABLE, Blocks, FedInfo, Server, ServerInputs,
                                        ServerState, Views, block_rows, broadcast_rows, num_rows,
                                        row_offsets, stack, tree_mean, tree_sub, unstack)

PyTree = Any


def _no_state(views: Views) -> ServerState:
  return ServerState()


def identity() -> Server:
  """Every row keeps its upload (Local training)."""
  return Server(init=_no_state, apply=lambda state, x: (dict(x.local), state, {}), blocks=True)


WEIGHTINGS = ('uniform', 'examples')


def check_weighting(weighting: str) -> None:
  if weighting not in WEIGHTINGS:
    raise ValueError(f'unknown weighting {weighting!r}; valid choices: '
                     + ', '.join(map(repr, WEIGHTINGS)))


def row_weights(weighting: str, info: FedInfo, role: str, x: ServerInputs) -> jax.Array:
  """[rows] normalised weights of `role`'s rows: uniform, or by the number of local
  examples of each row's owner client (Eq. 6's w_k); over the round's participants
  only when `x.row_valid` marks them (the others weigh 0)."""
  owners = jnp.asarray(info.row_client(role))
  if weighting == 'uniform':
    n = jnp.ones(owners.shape, jnp.float32)
  else:
    n = x.num_examples[owners].astype(jnp.float32)
  if x.row_valid is not None:
    n = jnp.where(x.row_valid[owners], n, 0.)
  return n / jnp.sum(n)


def mean(weighting: str = 'uniform', info: FedInfo | None = None) -> Server:
  """FedAvg: every row gets the mean of its role's uploaded rows.

  `weighting='uniform'` (FedHCA2's released baselines) or `'examples'` (rows
  weighted by their owner client's number of local examples; needs `info`).
  With partial participation (`ServerInputs.row_valid`) the mean is over the
  participants' rows, and every row gets it: the clients that sat the round out
  hold the new global model, as they would download it when next sampled.
  """
  check_weighting(weighting)

  def apply(state, x: ServerInputs):
    out = {}
    for role, local in x.local.items():
      w = (row_weights(weighting, info, role, x)
           if weighting == 'examples' or x.row_valid is not None else None)
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


def _per_client_dot(num_clients: int, owners: np.ndarray, fn: Callable, *views) -> jax.Array:
  """[num_clients] Σ over each client's rows of `fn(*leaves)` · `leaves[0]` (views of one
  structure, stacked or `Blocks` split alike; `owners[i]` owns row i), as one row-wise
  float32 dot per leaf: XLA:CPU runs a dot near memory speed, where a row-wise sum of
  the same product runs 2× slower (FedDEA's energy logs, BENCHMARKS.md)."""
  total = jnp.zeros((num_clients,), jnp.float32)
  for parts in zip(*(row_offsets(v) for v in views)):
    lo = parts[0][0]
    leaves = [jax.tree.leaves(p) for _, p in parts]
    rows = leaves[0][0].shape[0]
    flat = lambda x: x.astype(jnp.float32).reshape(rows, -1)
    per_row = sum(jnp.einsum('ri,ri->r', flat(fn(*xs)), flat(xs[0]),
                             precision=jax.lax.Precision.HIGHEST)
                  for xs in zip(*leaves))
    total = total + jax.ops.segment_sum(per_row, jnp.asarray(owners[lo:lo + rows]),
                                        num_segments=num_clients)
  return total


def dea_logs(deltas: Views, mask: Views, info: FedInfo, scale: float) -> dict:
  """FedDEA's per-round diagnostics (spec §2.2), per client over its whole update:

  - `dea_energy` e_k = ‖m⊙Δ‖²/‖Δ‖² (≥ ρ for the top-ρ mask);
  - `dea_amplification` ‖Δ̃‖/‖Δ‖ = scale·√e_k;
  - `dea_kept_<role>`: the fraction of the client's kept entries in that role
    (encoder vs its own decoder and head);
  - `dea_jaccard` [N, N]: |K_i ∩ K_j| / |K_i ∪ K_j| of the kept sets, over the roles
    with one row per client (the encoder; in the unified model every role).

  The kept sets are counted as bits (`topk.packed_rows`: 32 entries an int32 word,
  one integer pass over the masks) and intersected by popcount, so the Jaccard
  costs a 32nd of a pass per pair, not a float Gram matrix of the masks.
  """
  n = info.num_clients
  owners = {r: np.asarray(info.row_client(r)) for r in deltas}
  total = sum(_per_client_dot(n, owners[r], lambda d: d, deltas[r]) for r in deltas)
  kept_sq = sum(_per_client_dot(n, owners[r], lambda d, m: jnp.where(m != 0, d, 0),
                                deltas[r], mask[r]) for r in deltas)
  bits = {r: topk.packed_rows(mask[r]) for r in deltas}
  kept = {r: sum(jax.ops.segment_sum(topk.popcount_rows(w), jnp.asarray(owners[r][lo:lo + len(w)]),
                                     num_segments=n) for lo, w in bits[r]).astype(jnp.float32)
          for r in deltas}
  num_kept = sum(kept.values())
  energy = kept_sq / jnp.maximum(total, jnp.finfo(jnp.float32).tiny)
  logs = {'dea_energy': energy, 'dea_amplification': scale * jnp.sqrt(energy)}
  logs.update({f'dea_kept_{r}': v / jnp.maximum(num_kept, 1.) for r, v in kept.items()})
  one_row = [r for r in deltas if tuple(owners[r]) == tuple(range(n))]
  if one_row:
    inter = sum(topk.popcount_gram(jnp.concatenate([w for _, w in bits[r]], axis=0))
                for r in one_row).astype(jnp.float32)
    size = jnp.diagonal(inter)
    union = size[:, None] + size[None, :] - inter
    logs['dea_jaccard'] = inter / jnp.maximum(union, 1.)
  return logs


def dea(rule: Server, info: FedInfo, rho: float, variant: str = 'top', rescale: bool = True,
        server_lr: float = 1.0, seed: int = 0) -> Server:
  """FedDEA over any rule (spec §2.1, §6 A4/A5/A11/A13): per client, ONE mask over its
  whole update (all its rows of all roles, every leaf; not per layer) keeping the
  ⌊ρ·d⌋ entries of largest |Δ| (ties at the threshold kept), the kept entries scaled
  by 1/ρ (`rescale`); the base rule then reads prev + Δ̃ as the client's upload, so
  Δ̃ is what it consumes wherever it would consume Δ.

  `variant`: 'top' (FedDEA), 'small' (ablation a: the smallest |Δ|) or 'random'
  (ablation c: k random entries, drawn per round from `seed`); the exact threshold
  comes from `topk.top_rho_mask` (selection, no sort). `server_lr` η_g scales the
  base rule's step, prev + η_g·(rule − prev) (A5: the step-size control for the
  1/ρ amplification). ρ = 1 with η_g = 1 is the base rule itself, bit for bit.
  Logs: `dea_logs` (when masking).
  """
  if not 0 < rho <= 1:
    raise ValueError(f'rho={rho} is out of range; valid range: 0 < rho <= 1')
  if variant not in topk.VARIANTS:
    raise ValueError(f'unknown mask variant {variant!r}; valid choices: '
                     + ', '.join(repr(v) for v in topk.VARIANTS))
  if rho == 1 and server_lr == 1:
    return rule  # every entry kept, no rescale, the base step: the base rule bit for bit
  row_client = {r: info.row_client(r) for r in STACKABLE}
  scale = 1.0 / rho if rescale else 1.0

  def apply(state, x: ServerInputs):
    logs = {}
    if rho < 1:
      deltas = {r: tree_sub(x.local[r], x.prev[r]) for r in x.local}
      key = jax.random.fold_in(jax.random.PRNGKey(seed), x.round)
      mask = topk.top_rho_mask(deltas, {r: row_client[r] for r in deltas}, info.num_clients,
                               rho, variant, key if variant == 'random' else None, jnp.int32)
      kept = lambda p, d, m: p.astype(jnp.float32) + jnp.where(m != 0, scale * d, 0.)
      local = {r: jax.tree.map(lambda p, d, m: kept(p, d, m).astype(p.dtype),
                               x.prev[r], deltas[r], mask[r]) for r in x.local}
      logs = dea_logs(deltas, mask, info, scale)
      x = x._replace(local=local)
    new, st, inner_logs = rule.apply(state, x)
    if server_lr != 1:
      new = {r: jax.tree.map(lambda p, v: (p.astype(jnp.float32) + server_lr * (
          v.astype(jnp.float32) - p.astype(jnp.float32))).astype(p.dtype), x.prev[r], v)
             for r, v in new.items()}
    return new, st, {**inner_logs, **logs}

  return Server(init=rule.init, apply=apply, blocks=rule.blocks)


def unified_info(info: FedInfo) -> FedInfo:
  """What a rule sees inside `unified`: every role has one row per client (the
  client's view of the whole unified model)."""
  return dataclasses.replace(info, num_decoders=info.num_clients,
                             decoder_client=tuple(range(info.num_clients)),
                             decoder_names=info.client_names, decoder_keys=info.client_keys)


def unified(rule: Server, info: FedInfo) -> Server:
  """One global model for task-level clients (FedDEA's HTA-FMTL setting, spec §1.6,
  §6 A1 'literal'): θ = the encoder + every task's decoder and head, and client k's
  update is zero outside its encoder and its own task's decoder and head.

  `rule` (built on `unified_info(info)`) sees per client one row of the whole θ:
  the encoder row as uploaded, and every task row ('decoder', 'head': `[N, K, ...]`)
  equal to the round's start except the client's own, which holds its upload. So
  a weighted mean gives task j's parameters prev_j + w_owner·Δ_j, a top-ρ mask
  counts d over the whole θ, and per-client server state covers the whole θ.
  Task row j of the result is row owner(j)'s entry j. Needs every client to own
  exactly one row of each task role (one task per client).
  """
  n = info.num_clients
  owner = {'decoder': np.asarray(info.decoder_client), 'head': np.arange(n)}
  for r, o in owner.items():
    if sorted(o.tolist()) != list(range(n)):
      raise ValueError(f'unified model: every client must own exactly one {r} row, '
                       f'got owners {o.tolist()}')
  # Engine row j of a task role is client owner[j]'s row of the inner rule.
  inverse = {r: np.argsort(o) for r, o in owner.items()}
  task_roles = lambda views: [r for r in owner if r in views]

  def expand(prev, local, r):
    own = owner[r][None, :] == np.arange(n)[:, None]  # [N clients, K rows]
    def one(p, l):
      o = jnp.asarray(own).reshape(own.shape + (1,) * (p.ndim - 1))
      return jnp.where(o, l[None], p[None])
    return jax.tree.map(one, prev, local)

  def rows_in(rows, r):  # engine rows (row j) -> inner rows (client c)
    return jax.tree.map(lambda v: v[inverse[r]], rows) if r in owner else rows

  def rows_out(rows, r):
    return jax.tree.map(lambda v: v[owner[r]], rows) if r in owner else rows

  def init(views: Views) -> ServerState:
    uviews = {r: (expand(v, v, r) if r in owner else v) for r, v in views.items()}
    st = rule.init(uviews)
    return ServerState(st.shared, {r: rows_out(v, r) for r, v in st.rows.items()})

  def apply(state: ServerState, x: ServerInputs):
    prev, local = dict(x.prev), dict(x.local)
    for r in task_roles(x.local):
      local[r] = expand(x.prev[r], x.local[r], r)
      prev[r] = jax.tree.map(lambda p: jnp.broadcast_to(p[None], (n,) + p.shape), x.prev[r])
    rows = {r: rows_in(v, r) for r, v in state.rows.items()}
    new, st, logs = rule.apply(ServerState(state.shared, rows),
                               x._replace(prev=prev, local=local))
    out = dict(new)
    for r in task_roles(new):
      cols = np.arange(len(owner[r]))
      out[r] = jax.tree.map(lambda v, r=r: v[owner[r], cols], new[r])
    return out, ServerState(st.shared, {r: rows_out(v, r) for r, v in st.rows.items()}), logs

  return Server(init=init, apply=apply)


def group_info(info: FedInfo, role: str, rows: Sequence[int]) -> FedInfo:
  """The federation a rule sees inside one group of `role`'s rows (`grouped`): every
  row is a client of its own (its owner's examples, steps, losses and participation),
  so a rule that reads per-client facts (weights by examples, FedNova's steps, the
  round's participants) reads its owner's. Decoder rows are named and keyed by their
  task decoder, the others by their owner client."""
  rows = [int(i) for i in rows]
  owners = [info.row_client(role)[i] for i in rows]
  if role == 'decoder':
    names = tuple(info.decoder_names[i] for i in rows)
    keys = tuple(info.decoder_keys[i] for i in rows) if info.decoder_keys else ()
  else:
    names = tuple(info.client_names[c] for c in owners)
    keys = tuple(info.client_keys[c] for c in owners) if info.client_keys else ()
  homo = [0]
  for a, b in zip(keys[:-1], keys[1:]) if keys else ():
    homo.append(homo[-1] + (a != b))
  n = len(rows)
  return dataclasses.replace(
      info, num_clients=n, num_decoders=n, decoder_client=tuple(range(n)), decoder_names=names,
      client_names=names, homo_groups=tuple(homo) if keys else tuple(range(n)),
      client_keys=keys, decoder_keys=keys,
      num_participants=min(n, info.num_participants))


# Per-client [N] fields of `ServerInputs` that `grouped` re-indexes by its rows' owners.
_PER_CLIENT = ('num_examples', 'num_steps', 'client_ids', 'first_loss', 'last_loss',
               'row_valid')


def grouped(build: Callable[[FedInfo], Server], info: FedInfo,
            row_groups: Mapping[str, Sequence[int]]) -> Server:
  """A rule applied separately within each group of rows (static group ids per
  role's row, e.g. per dataset): `build(group_info(...))` gives the rule of one
  group of one role, which sees that group's rows as its federation (every row a
  client, with its owner's per-client inputs; under partial participation, the
  group's participants, and a group none of whose clients took part keeps its rows
  and its state). Per-row server state follows its rows."""
  def groups_of(role):
    ids = np.asarray(row_groups[role])
    return [np.flatnonzero(ids == g) for g in np.unique(ids)]

  rules_of = {r: [build(group_info(info, r, idx)) for idx in groups_of(r)] for r in row_groups}
  take = lambda t, idx: jax.tree.map(lambda v: v[jnp.asarray(idx)], t)

  def init(views: Views) -> ServerState:
    states = {r: [rule.init({r: take(v, idx)}) for rule, idx in zip(rules_of[r], groups_of(r))]
              for r, v in views.items()}
    return ServerState(shared={r: [s.shared for s in ss] for r, ss in states.items()},
                       rows={r: _cat_rows([s.rows.get(r, {}) for s in ss], groups_of(r))
                             for r, ss in states.items()})

  def apply(state: ServerState, x: ServerInputs):
    out, shared, rows, logs = {}, {}, {}, {}
    for r in x.local:
      parts, sh, rw = [], [], []
      owners = np.asarray(info.row_client(r))
      for gi, (rule, idx) in enumerate(zip(rules_of[r], groups_of(r))):
        per_client = {k: None if getattr(x, k) is None else getattr(x, k)[owners[idx]]
                      for k in _PER_CLIENT}
        sub = x._replace(prev={r: take(x.prev[r], idx)}, local={r: take(x.local[r], idx)},
                         encoded=None if x.encoded is None else {r: take(x.encoded[r], idx)},
                         **per_client)
        st = ServerState(state.shared[r][gi], {r: take(state.rows.get(r, {}), idx)})
        new, st_new, lg = rule.apply(st, sub)
        if sub.row_valid is not None:  # a group none of whose clients took part: as is
          anyone = jnp.any(sub.row_valid)
          keep = lambda a, b: jax.tree.map(lambda u, v: jnp.where(anyone, u, v), a, b)
          new, st_new = {r: keep(new[r], sub.prev[r])}, keep(st_new, st)
        st = st_new
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
