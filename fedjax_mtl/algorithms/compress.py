"""Update compression over any server rule: stochastic quantisation and top-k
sparsification with error feedback.

Both wrappers rewrite each client's update Δ = local − prev into what a client
would send, and the base rule then reads prev + (decoded upload) as the
client's upload (as `rules.dea` does), so any rule aggregates compressed
updates unchanged.

- `quantize(rule, info, bits)`: per (row, leaf) a float32 scale s = max |Δ| and
  every entry stochastically rounded onto 2^bits levels evenly spaced over
  [−s, s] (QSGD-style, unbiased: E[Q(Δ)] = Δ).
- `sparsify(rule, info, fraction)`: per client, the ⌊fraction·d⌋ entries of
  largest |Δ + e| over its whole update (all its rows of all roles), the rest
  carried to the next round in the residual e (error feedback), kept per row in
  `ServerState.rows` so it is stored and checkpointed with the clients.

Rows whose `ServerInputs.row_valid` is False (clients that did not take part)
pass through unchanged. `quantize_payload` / `sparsify_payload` count the bits
each client sends under the encodings the wrappers assume.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl import fields
from fedjax_mtl.algorithms import counter_rng, topk
from fedjax_mtl.algorithms.base import (Algorithm, Blocks, FedInfo, Server, ServerInputs,
                                        ServerState, Views, block_rows, row_offsets, stack,
                                        tree_sub, unstack, where_rows)

PyTree = Any

MIN_BITS, MAX_BITS = 1, 16  # 2^16 levels already exceed what a float32 scale resolves
SCALE_BITS = 32  # one float32 scale per (row, leaf)
INDEX_BITS = 32  # one int32 position per kept entry
# Keeps quantisation's random stream apart from other users of the run's seed
# (FedDEA's random masks fold the same (seed, round) key).
_SALT = zlib.crc32(b'quantize') & 0x7FFFFFFF

QUANTIZE = fields.Block('quantize', {
    'bits': fields.Field(8, 'quantize(...): bits per entry of each client update (2^bits levels '
                         'over [-s, s], s = max |update| of the row\'s leaf; stochastic '
                         'rounding, unbiased)',
                         fields.Rule(lambda v: MIN_BITS <= v <= MAX_BITS,
                                     f'{MIN_BITS} <= {{name}} <= {MAX_BITS}')),
    'log_error': fields.Field(False, 'quantize(...): log quant_rel_error, each client\'s '
                              '||Q(update) - update|| / ||update|| (two more passes over the '
                              'updates: at Swin-T scale about +0.6x FedAvg\'s aggregation)'),
})

SPARSIFY = fields.Block('sparsify', {
    'fraction': fields.Field(0.1, 'sparsify(...): fraction of each client update sent (top-k '
                             'by magnitude over the whole update, the rest fed back next round)',
                             fields.fraction()),
})


# ----------------------------------------------------------------------------
# Rows and per-client sums.
# ----------------------------------------------------------------------------

def _map_leaves(fn: Callable, *views: PyTree) -> PyTree:
  """fn(first row, leaf index, *leaves) -> leaf over views of one structure, part by part
  (`Blocks` kept); the leaf index is the leaf's position in one row's tree."""
  parts = []
  for group in zip(*(row_offsets(v) for v in views)):
    lo = group[0][0]
    leaves, tdef = jax.tree.flatten(group[0][1])
    others = [jax.tree.leaves(p) for _, p in group[1:]]
    parts.append(jax.tree.unflatten(tdef, [fn(lo, i, *xs)
                                           for i, xs in enumerate(zip(leaves, *others))]))
  return Blocks(tuple(parts)) if isinstance(views[0], Blocks) else parts[0]


def _valid_rows(info: FedInfo, role: str, x: ServerInputs) -> jax.Array | None:
  """[rows] bool: the rows of `role` whose owner client uploaded (None: all of them)."""
  if x.row_valid is None:
    return None
  rows = x.row_valid[jnp.asarray(info.row_client(role))]
  # Sliced per part and broadcast inside elementwise loops: a gather fused there would
  # run per entry (as in topk._map_rows).
  return jax.lax.optimization_barrier(rows)


def _where_rows(valid: jax.Array | None, lo: int, a: jax.Array, b: jax.Array) -> jax.Array:
  """a on the part's valid rows (from row `lo`), b on the others."""
  return a if valid is None else where_rows(valid[lo:lo + a.shape[0]], a, b)


def _client_sums(info: FedInfo, fn: Callable, *trees: Views) -> jax.Array:
  """[num_clients] Σ over each client's rows of all roles of fn(*leaves) (trees: role ->
  views of one structure, stacked or `Blocks` split alike)."""
  n = info.num_clients
  total = jnp.zeros((n,), jnp.float32)
  for role in trees[0]:
    owners = np.asarray(info.row_client(role))
    for group in zip(*(row_offsets(t[role]) for t in trees)):
      lo = group[0][0]
      leaves = [jax.tree.leaves(p) for _, p in group]
      if not leaves[0]:
        continue
      rows = leaves[0][0].shape[0]
      per_row = sum(jnp.sum(fn(*xs).astype(jnp.float32).reshape(rows, -1), axis=1)
                    for xs in zip(*leaves))
      total = total + jax.ops.segment_sum(per_row, jnp.asarray(owners[lo:lo + rows]),
                                          num_segments=n)
  return total


def _ratio(num: jax.Array, den: jax.Array) -> jax.Array:
  """num / den, 0 where den is 0."""
  return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.), 0.)


def _upload(prev: PyTree, sent: PyTree, local: PyTree, valid: jax.Array | None) -> PyTree:
  """prev + sent in the leaves' dtype on valid rows; the upload itself elsewhere."""
  return _map_leaves(lambda lo, i, p, s, l: _where_rows(
      valid, lo, (p.astype(jnp.float32) + s).astype(p.dtype), l), prev, sent, local)


# ----------------------------------------------------------------------------
# Stochastic quantisation.
# ----------------------------------------------------------------------------

def check_bits(bits: int) -> None:
  """Raise ValueError unless `bits` is an integer in [MIN_BITS, MAX_BITS]."""
  if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not (
      MIN_BITS <= bits <= MAX_BITS):
    raise ValueError(f'bits={bits!r} is out of range; valid range: integers '
                     f'{MIN_BITS} <= bits <= {MAX_BITS}')


def row_scales(delta: jax.Array) -> jax.Array:
  """[rows, 1] s = max |Δ| of each row of a leaf ([rows, ...])."""
  return jnp.max(jnp.abs(delta.reshape(delta.shape[0], -1)), axis=1, keepdims=True, initial=0.)


def quantize_codes(delta: jax.Array, uniform: jax.Array, bits: int,
                   s: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """(codes [rows, d] float32 in 0..2^bits − 1, scales s [rows, 1]) of a leaf's rows
  ([rows, ...], float32) given uniforms in [0, 1) of its shape (`quantize_leaf`);
  `s`: the rows' scales when computed already (`row_scales`)."""
  levels = (1 << bits) - 1  # L − 1: the number of steps between −s and s
  rows = delta.shape[0]
  flat = delta.reshape(rows, -1)
  s = row_scales(delta) if s is None else s
  # Steps per unit, rounded up by 2^-22 (relative) so that Δ = s lands at or above
  # L − 1 whatever the float rounding (clamped there: the top level, s, exactly);
  # Δ = −s gives t = 0 exactly. No per-entry test of the ends, which cost a third
  # of this pass. The scale-up biases E[Q(Δ)] by at most 2^-22·2s.
  half_per = jnp.where(s > 0, (0.5 * levels * (1. + 2. ** -22)) / jnp.where(s > 0, s, 1.), 0.)
  t = (flat + s) * half_per
  low = jnp.floor(t)
  code = low + (uniform.reshape(rows, -1) < t - low).astype(jnp.float32)
  return jnp.minimum(code, float(levels)), s


def dequantize(codes: jax.Array, s: jax.Array, bits: int) -> jax.Array:
  """The levels of `quantize_codes`' codes ([rows, d], scales [rows, 1]): code j is
  −s + j·2s/(L−1); code 0 is −s exactly (0·x − s), the top code is pinned to s."""
  levels = (1 << bits) - 1
  return jnp.where(codes >= levels, s, codes * (2. * s / levels) - s)


def quantize_leaf(delta: jax.Array, uniform: jax.Array, bits: int,
                  s: jax.Array | None = None) -> jax.Array:
  """Q(Δ) of a leaf's rows ([rows, ...], float32) given uniforms in [0, 1) of its shape.

  Grid: per row, s = max |Δ| and the L = 2^bits levels −s + j·2s/(L−1), j = 0..L−1
  (L evenly spaced points from −s to s; the code j is what is sent). With
  t = (Δ + s)·(L−1)/(2s) ∈ [0, L−1] (Δ's position in steps from −s), the code is
  ⌊t⌋ + 1[u < t − ⌊t⌋]: rounded up with probability equal to the distance from the
  lower level, so E[Q(Δ)] = Δ; ±s are levels, so each row's extreme entry is sent
  exactly. With 1 bit the levels are ±s. (Up to float32: the uniforms come in steps
  of 2^-24, and t is scaled up by 2^-22 so that Δ = s is exactly the top level: the
  bias is below 2^-22·2s + step·2^-24.)
  """
  return dequantize(*quantize_codes(delta, uniform, bits, s), bits).reshape(delta.shape)


def _uniforms(seed: int, rnd, role: str, i: int, lo: int, shape: tuple[int, ...]) -> jax.Array:
  """The uniforms `quantize` rounds leaf `i` of `role`'s rows lo.. with in 0-based
  round `rnd` (one hash per entry of its global index: equal wherever the rows are)."""
  tag = zlib.crc32(role.encode()) & 0x7FFFFFFF
  return counter_rng.uniform(counter_rng.key(seed, rnd, _SALT, tag, i), lo, shape)


def quantize(rule: Server, info: FedInfo, bits: int, seed: int = 0,
             log_error: bool = False) -> Server:
  """Stochastic uniform quantisation (QSGD-style, unbiased) of every client's update
  over any rule: per (row, leaf) one float32 scale s = max |Δ| and each entry rounded at
  random onto the 2^bits levels evenly spaced over [−s, s] (`quantize_leaf`); the base
  rule reads prev + Q(Δ) as the upload. Randomness: one `counter_rng` hash per entry
  of its global index under a key of (seed, round, a salt, the role, the leaf's
  position): deterministic, equal for stacked and `Blocks` views. Rows with `row_valid` False pass through.
  Logs (`log_error`; `quantize.log_error` in a run, off by default as it reads the
  updates twice more): `quant_rel_error` [num_clients] ‖Q(Δ) − Δ‖/‖Δ‖ over each
  client's whole update.
  With `ServerInputs.encoded` the clients quantised their own updates
  (`encode_quantized`, the same codes) and it holds the decoded Q(Δ): the rule reads
  prev + it, and the error is the clients' to report.
  """
  check_bits(bits)

  def apply(state: ServerState, x: ServerInputs):
    if x.encoded is not None:  # the clients quantised their updates (`encode_quantized`)
      local = {r: _upload(x.prev[r], x.encoded[r], x.local[r], _valid_rows(info, r, x))
               for r in x.local}
      return rule.apply(state, x._replace(local=local, encoded=None))
    deltas, sent, local = {}, {}, {}
    for role in x.local:
      valid = _valid_rows(info, role, x)

      def q(lo, i, d, p, l, role=role, valid=valid):
        u = _uniforms(seed, x.round, role, i, lo, d.shape)
        # s from prev − local, |·| of it equal to |Δ| to the bit: a subtraction of its
        # own, which XLA:CPU fuses into the reduction, where a shared Δ is written
        # out for it first (a write and a read of every update: 7 % of the program).
        s = row_scales(p.astype(jnp.float32) - l.astype(jnp.float32))
        return _where_rows(valid, lo, quantize_leaf(d, u, bits, s), d)

      deltas[role] = tree_sub(x.local[role], x.prev[role])
      sent[role] = _map_leaves(q, deltas[role], x.prev[role], x.local[role])
      local[role] = _upload(x.prev[role], sent[role], x.local[role], valid)
    new, st, logs = rule.apply(state, x._replace(local=local))
    if not log_error:
      return new, st, logs
    err = _client_sums(info, lambda q, d: jnp.square(q - d), sent, deltas)
    norm = _client_sums(info, jnp.square, deltas)
    return new, st, {**logs, 'quant_rel_error': jnp.sqrt(_ratio(err, norm))}

  return Server(init=rule.init, apply=apply, blocks=rule.blocks)


def encoding(config) -> str | None:
  """The compression a client applies to its own upload before sending it (a Flower
  deployment): 'quantize' or 'sparsify' when it is the algorithm's outermost wrapper
  (the first to see the uploads, so what the clients send is what it would make of
  them), else None (a compression wrapper further in then runs at the server on the
  full uploads)."""
  from fedjax_mtl import algorithms  # (the registry imports this module)
  wrappers = algorithms.parse(str(config.algorithm))[:-1]
  return wrappers[0] if wrappers and wrappers[0] in ('quantize', 'sparsify') else None


def encode_quantized(prev: PyTree, up: PyTree, role: str, lo: int, rnd, seed: int,
                     bits: int) -> tuple[list, list, jax.Array, jax.Array]:
  """One client's quantised update of `role` (its rows lo.. of the role's stacked
  view: `prev` the rows it was sent, `up` its trained rows, one tree): the codes
  `quantize` would make of them in 0-based round `rnd` (the same uniforms) as
  (codes per leaf [rows, d] uint16, scales per leaf [rows, 1] float32,
  Σ(Q(Δ) − Δ)², ΣΔ²)."""
  codes, scales = [], []
  err = norm = jnp.float32(0.)
  for i, (p, u) in enumerate(zip(jax.tree.leaves(prev), jax.tree.leaves(up))):
    d = u.astype(jnp.float32) - p.astype(jnp.float32)
    code, scale = quantize_codes(d, _uniforms(seed, rnd, role, i, lo, d.shape), bits)
    flat = d.reshape(d.shape[0], -1)
    err = err + jnp.sum(jnp.square(dequantize(code, scale, bits) - flat))
    norm = norm + jnp.sum(jnp.square(flat))
    codes.append(code.astype(jnp.uint16))
    scales.append(scale)
  return codes, scales, err, norm


def decode_quantized(codes: list, scales: list, like: PyTree, bits: int) -> PyTree:
  """Q(Δ) (float32, `like`'s structure and shapes) from `encode_quantized`'s codes."""
  leaves, tdef = jax.tree.flatten(like)
  return jax.tree.unflatten(tdef, [
      dequantize(jnp.asarray(c, jnp.float32).reshape(x.shape[0], -1), jnp.asarray(s),
                 bits).reshape(x.shape) for c, s, x in zip(codes, scales, leaves)])


def quantize_payload(values: np.ndarray, leaf_rows: np.ndarray, bits: int) -> np.ndarray:
  """Bits each client sends under `quantize`: `values`·bits (one bits-bit code j per
  shared entry, the level s·(2j − (L−1))/(L−1)) plus 32 per (row, leaf) tensor for its
  float32 scale s; `values` = shared entries per client, `leaf_rows` = its (row, leaf)
  tensors (int64 array like `values`)."""
  check_bits(bits)
  return np.asarray(values, np.int64) * bits + SCALE_BITS * np.asarray(leaf_rows, np.int64)


# ----------------------------------------------------------------------------
# Top-k sparsification with error feedback.
# ----------------------------------------------------------------------------

def check_fraction(fraction: float) -> None:
  """Raise ValueError unless 0 < fraction <= 1."""
  if not 0 < fraction <= 1:
    raise ValueError(f'fraction={fraction!r} is out of range; valid range: 0 < fraction <= 1')


def _split_rows(rows: PyTree, like: PyTree) -> tuple[PyTree, PyTree]:
  """(inner rule's rows, residual) of one role's per-row state, the residual in the
  form of `like` (stacked or `Blocks`). A `blocks` server gets its rows as `Blocks`
  of the groups' {'inner', 'residual'} trees; others as one such tree."""
  if isinstance(rows, Blocks):
    inner = Blocks(tuple(p['inner'] for p in rows.parts))
    inner = inner if jax.tree.leaves(inner) else {}
    resid = Blocks(tuple(p['residual'] for p in rows.parts))
  else:
    inner, resid = rows['inner'], rows['residual']
  if isinstance(like, Blocks) and not isinstance(resid, Blocks):
    resid = unstack(resid, block_rows(like))
  elif not isinstance(like, Blocks) and isinstance(resid, Blocks):
    resid = stack(resid)
  return inner, resid


def _join_rows(inner: PyTree, resid: PyTree) -> PyTree:
  """One role's per-row state in the form `_split_rows` reads (per part for `Blocks`)."""
  if not isinstance(resid, Blocks):
    return {'inner': stack(inner), 'residual': resid}
  sizes = block_rows(resid)
  if isinstance(inner, Blocks):
    parts = inner.parts
  elif jax.tree.leaves(inner):
    parts = unstack(inner, sizes).parts
  else:
    parts = ({},) * len(sizes)
  return Blocks(tuple({'inner': i, 'residual': e} for i, e in zip(parts, resid.parts)))


def sparsify(rule: Server, info: FedInfo, fraction: float) -> Server:
  """Top-k sparsification with error feedback over any rule: per client, u = Δ + e
  (e its residual, zero at first), the k = ⌊fraction·d⌋ (at least 1) entries of largest
  |u| over its whole update (all its rows of all roles; ties at the threshold kept:
  `topk.top_rho_mask`) are sent, the base rule reads prev + sparse(u) as the upload, and
  e ← u − sparse(u). The residual is per-row state (float32, in `ServerState.rows[role]`
  as {'inner': the rule's rows, 'residual': e}), stored and checkpointed with the
  clients. Rows with `row_valid` False send nothing and keep their residual.
  fraction = 1 is the base rule bit for bit (e stays 0).
  Logs (fraction < 1), per client [num_clients]: `sparse_kept` (sent entries / d) and
  `sparse_residual_norm` ‖e‖ after the round.
  With `ServerInputs.encoded` the clients sparsified their own updates and keep their
  residuals (`encode_sparse`, a Flower deployment): the rule reads prev + it, the
  residual rows here stay 0, and the logs are the clients' to report.
  """
  check_fraction(fraction)
  row_client = {r: info.row_client(r) for r in ('encoder', 'decoder', 'head')}

  def init(views: Views) -> ServerState:
    inner = rule.init(views)
    zeros = lambda v: jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), v)
    return ServerState(shared=inner.shared,
                       rows={r: {'inner': inner.rows.get(r, {}), 'residual': zeros(v)}
                             for r, v in views.items()})

  def apply(state: ServerState, x: ServerInputs):
    missing = [r for r in x.local if r not in state.rows]
    if missing:
      raise ValueError(f'sparsify keeps a residual per row, but the server state has no rows '
                       f'for {missing}; run it where per-row server state is kept (the dense '
                       'engine)')
    split = {r: _split_rows(state.rows[r], x.local[r]) for r in x.local}
    inner = ServerState(state.shared, {r: v[0] for r, v in split.items()})
    resid = {r: v[1] for r, v in split.items()}
    if x.encoded is not None or fraction == 1:
      if x.encoded is not None:  # the clients sent sparse(u) and keep e (`encode_sparse`)
        x = x._replace(local={r: _upload(x.prev[r], x.encoded[r], x.local[r],
                                         _valid_rows(info, r, x)) for r in x.local},
                       encoded=None)
      # (fraction = 1: everything sent, the uploads as they are; e stays 0 either way)
      new, st, logs = rule.apply(inner, x)
      return new, ServerState(st.shared, {r: _join_rows(st.rows.get(r, {}), resid[r])
                                          for r in x.local}), logs
    valid = {r: _valid_rows(info, r, x) for r in x.local}
    # Rows that did not upload enter the selection as zeros: they take no client's k.
    u = {r: _map_leaves(lambda lo, i, d, e, r=r: _where_rows(valid[r], lo, d + e,
                                                             jnp.zeros_like(d)),
                        tree_sub(x.local[r], x.prev[r]), resid[r]) for r in x.local}
    mask = topk.top_rho_mask(u, {r: row_client[r] for r in u}, info.num_clients, fraction,
                             'top', None, jnp.int32)
    sent = {r: jax.tree.map(lambda v, m: jnp.where(m != 0, v, 0.), u[r], mask[r]) for r in u}
    local = {r: _upload(x.prev[r], sent[r], x.local[r], valid[r]) for r in u}
    new_resid = {r: _map_leaves(lambda lo, i, v, s, e, r=r: _where_rows(valid[r], lo, v - s, e),
                                u[r], sent[r], resid[r]) for r in u}
    new, st, logs = rule.apply(inner, x._replace(local=local))
    rows = {r: _join_rows(st.rows.get(r, {}), new_resid[r]) for r in x.local}
    kept_mask = {r: _map_leaves(lambda lo, i, m, r=r: _where_rows(valid[r], lo, m,
                                                                  jnp.zeros_like(m)),
                                mask[r]) for r in u}
    d = topk.client_sizes(u, {r: row_client[r] for r in u}, info.num_clients)
    kept = _client_sums(info, lambda m: m, kept_mask) / jnp.asarray(np.maximum(d, 1),
                                                                     jnp.float32)
    resid_norm = jnp.sqrt(_client_sums(info, jnp.square, new_resid))
    return new, ServerState(st.shared, rows), {**logs, 'sparse_kept': kept,
                                               'sparse_residual_norm': resid_norm}

  return Server(init=init, apply=apply, blocks=rule.blocks)


def encode_sparse(prev: Views, up: Views, residual: Views,
                  fraction: float) -> tuple[Views, Views, jax.Array, jax.Array]:
  """One client's top-k upload with error feedback, as `sparsify` makes it (a Flower
  client, `encoding` 'sparsify'): `prev` the rows it was sent, `up` its trained rows,
  `residual` its e (role -> one tree each, its rows). Returns (sent: u on the kept
  entries and 0 elsewhere, the new residual u − sent, entries kept, ‖e‖²), with
  u = Δ + e and the mask `topk.top_rho_mask` of u over the client's whole update."""
  u = {r: jax.tree.map(lambda a, b, e: b.astype(jnp.float32) - a.astype(jnp.float32) + e,
                       prev[r], up[r], residual[r]) for r in up}
  mask = topk.top_rho_mask(u, {r: [0] * jax.tree.leaves(v)[0].shape[0] for r, v in u.items()},
                           1, fraction, 'top', None, jnp.int32)
  sent = {r: jax.tree.map(lambda v, m: jnp.where(m != 0, v, 0.), u[r], mask[r]) for r in u}
  new = {r: jax.tree.map(jnp.subtract, u[r], sent[r]) for r in u}
  kept = sum(jnp.sum(m) for m in jax.tree.leaves(mask))
  norm = sum(jnp.sum(jnp.square(e)) for e in jax.tree.leaves(new))
  return sent, new, kept, norm


def kept_count(values: np.ndarray, fraction: float) -> np.ndarray:
  """Entries a client sends of its `values` (= d) under a top-`fraction` selection:
  k = max(⌊fraction·d⌋, 1), 0 for d = 0, d for fraction = 1 (`sparsify`, FedDEA's ρ)."""
  d = np.asarray(values, np.int64)
  if fraction == 1:
    return d
  return np.where(d > 0, np.maximum(np.floor(fraction * d).astype(np.int64), 1), 0)


def position_bits(values: np.ndarray, kept: np.ndarray) -> np.ndarray:
  """Bits of the positions of `kept` of `values` entries: the smaller of a d-bit bitmap
  and `kept` 32-bit indices."""
  return np.minimum(np.asarray(values, np.int64), INDEX_BITS * np.asarray(kept, np.int64))


def sparsify_payload(values: np.ndarray, fraction: float, value_bits: int = 32) -> np.ndarray:
  """Bits each client sends under `sparsify`, for `values` (= d) shared entries per
  client: k = `kept_count` values of `value_bits` each plus their `position_bits`:
  k·value_bits + min(d, 32·k). Assumes exactly k entries sent (ties at the threshold,
  which the mask keeps too, are not counted); fraction = 1 sends the dense update,
  d·value_bits (no positions); d = 0 sends nothing."""
  check_fraction(fraction)
  k = kept_count(values, fraction)
  if fraction == 1:
    return k * value_bits
  return k * value_bits + position_bits(values, k)


# ----------------------------------------------------------------------------
# Config adapters (registered as wrappers in `fedjax_mtl.algorithms`).
# ----------------------------------------------------------------------------

def _seed(config) -> int:
  return int(config.get('seed', 0)) if config is not None else 0


def wrap_quantize(alg: Algorithm, info: FedInfo, config) -> Server:
  """`quantize(alg.server)` with `config.quantize` and the run's seed."""
  q = QUANTIZE.of(config)
  return quantize(alg.server, info, int(q.bits), _seed(config), bool(q.log_error))


def wrap_sparsify(alg: Algorithm, info: FedInfo, config) -> Server:
  """`sparsify(alg.server)` with `config.sparsify`."""
  return sparsify(alg.server, info, float(SPARSIFY.of(config).fraction))
