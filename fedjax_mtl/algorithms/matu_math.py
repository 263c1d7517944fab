"""MaTU's math (spec matu.md §2): task unification, modulators and the stateless
many-task server, on flat task vectors.

Every function works on one round's rows at once: row i is one (client, task)
pair with its task vector `vectors[i]` ([S, d], the pair's trained adapters
minus their shared initialisation), `group[i]` (segment id of its client, in
[0, S): the rows of one client share it), `task[i]` (in [0, T)), `counts[i]`
(|D_n^t|) and `valid[i]` (False: a padding row; it joins no client and no task).
Sums and maxima over a client's rows are segment sums and maxima (none when every
client has one row), sums over a task's rows segment sums, the task similarity is
one matmul of sign matrices: all of a round in one jitted program. `round_update`
walks column blocks of the rows (`round_blocks`), so its only [S, d] temporary is
one buffer of reconstructions.

**Unification** (Eq. 2, the EMR-Merging code's rules): σ = sgn(Σ_i τ^i) with a
zero sum mapped to −1 (`tie='emr'`; `tie='zero'` keeps sgn(0) = 0);
μ_j = max |τ^i_j| over the τ^i whose sign agrees with σ_j; τ = σ ⊙ μ.
Masks m^i = (τ^i ⊙ τ > 0); rescalers λ^i = Σ|τ^i| / Σ|m^i ⊙ τ| (0 when the
mask keeps nothing: the task is fully masked).

**Server** (Eq. 3–7, pure, keeps nothing): per task t over its rows N^t,
α^t = |mean sgn(m_n^t ⊙ τ_n)|, m̂^t = 1 where α^t ≥ ρ else α^t;
τ̂^t = m̂^t ⊙ Σ_n γ_n^t λ_n^t m_n^t ⊙ τ_n (the server sees reconstructions, not
τ_n^t: spec §7 item 1), γ = |D_n^t| / Σ|D^t|;
S = ½(sgn(T̂) sgn(T̂)ᵀ / d + 1); Z^t = the top-κ tasks t' ≠ t of this round
with S(t, t') > ε; τ̃^t = m̂^t ⊙ Σ_{Z^t} S(t, t') τ̂^{t'};
`combine='sum'`: τ^t = τ̂^t + τ̃^t (Eq. 7 as printed);
`combine='avg'`: τ^t = ½(τ̂^t + τ̃^t / Σ_{Z^t} S), τ̂^t when Z^t is empty.
`cross='none'`: τ̃ = 0; `cross='uniform'`: weights 1/|T_r| over every task of
the round (Fig. 6b's variants).

**Downlink** (§2.4): each client's rows are unified again from the new task
vectors of its tasks; the client recovers task t as λ_n^t m_n^t ⊙ τ_n.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

TIES = ('emr', 'zero')
CROSS = ('similarity', 'none', 'uniform')
COMBINES = ('sum', 'avg')
_HI = jax.lax.Precision.HIGHEST
# Values per [S, c] column block of `round_blocks`' passes (about 1 MiB of float32).
_BLOCK = 1 << 18


def _sign(total: jax.Array, tie: str) -> jax.Array:
  if tie == 'emr':  # EMR-Merging's `flag = (sum > 0) * 2 - 1`
    return jnp.where(total > 0, 1., -1.).astype(total.dtype)
  return jnp.sign(total)


def _single(group: jax.Array) -> jax.Array:
  """Whether every group has one row (k_n = 1; padding rows, all 0, count too)."""
  return jnp.all(jax.ops.segment_sum(jnp.ones_like(group), group, num_segments=group.shape[0]) <= 1)


def _three(x: jax.Array) -> jax.Array:
  """[3, ...] τ, max(τ, 0), max(−τ, 0)."""
  return jnp.stack([x, jnp.maximum(x, 0.), jnp.maximum(-x, 0.)])


def _unified(red: jax.Array, tie: str) -> jax.Array:
  """τ = σ ⊙ μ from a group's sum, max(τ, 0) and max(−τ, 0) ([3, ...]): μ over the
  rows whose sign agrees with σ is the second where σ = 1, the third where σ = −1."""
  sigma = _sign(red[0], tie)
  return jnp.where(sigma > 0, red[1], jnp.where(sigma < 0, -red[2], 0.))


def _group_reduce(v: jax.Array, group: jax.Array) -> jax.Array:
  """[3, S, c] per group id: Σ τ, max(τ, 0), max(−τ, 0) over the group's rows of
  `v` [S, c] (segment sums and maxima; 0 for ids without rows)."""
  s = v.shape[0]
  return jnp.stack([jax.ops.segment_sum(v, group, num_segments=s),
                    jnp.maximum(jax.ops.segment_max(jnp.maximum(v, 0.), group, num_segments=s), 0.),
                    jnp.maximum(jax.ops.segment_max(jnp.maximum(-v, 0.), group, num_segments=s), 0.)])


def _unify_cols(v: jax.Array, group: jax.Array, single: jax.Array, valid: jax.Array, tie: str):
  """Eq. 2 on columns `v` [S, c] of the rows (padding rows already 0). Returns
  `(mine [S, c] each row's group's unified columns, masks [S, c])`. When every
  group has one row (`single`), each row is its group's reduction: no segment ops."""
  mine = jax.lax.cond(single, lambda: _unified(_three(v), tie),
                      lambda: _unified(_group_reduce(v, group), tie)[group])
  return mine, (v * mine > 0) & valid[:, None]


def _row_sums(x: jax.Array) -> jax.Array:
  """[S] sums over each row: a reduction over the minor axis, which XLA fuses with
  the elementwise work that produces `x` (no [S, d] temporary)."""
  return jnp.sum(x, axis=1)


def _kept(mine: jax.Array, masks: jax.Array) -> jax.Array:
  """[S] Σ|m ⊙ τ_group| per row: the rescalers' denominators."""
  return _row_sums(jnp.where(masks, jnp.abs(mine), 0.))


def _lambdas(abs_sums: jax.Array, kept: jax.Array, valid: jax.Array) -> jax.Array:
  """[S] rescalers Σ|τ^i| / Σ|m^i ⊙ τ| (0 for padding rows and empty masks)."""
  ok = valid & (kept > 0)
  return jnp.where(ok, abs_sums / jnp.where(ok, kept, 1.), 0.)


def unify(vectors: jax.Array, group: jax.Array, valid: jax.Array, tie: str = 'emr'):
  """Unify each group's rows (Eq. 2). Returns `(unified [S, d], masks [S, d] bool,
  lambdas [S])`: `unified[g]` is group g's unified vector (0 for ids no valid row
  has), `masks[i]` and `lambdas[i]` row i's mask and rescaler against its group's."""
  v = jnp.where(valid[:, None], vectors, 0.)
  unified = _unified(_group_reduce(v, group), tie)
  mine = unified[group]
  masks = (v * mine > 0) & valid[:, None]
  return unified, masks, _lambdas(_row_sums(jnp.abs(v)), _kept(mine, masks), valid)


def reconstruct(unified: jax.Array, group: jax.Array, masks: jax.Array,
                lambdas: jax.Array) -> jax.Array:
  """[S, d] each row's task vector as its client recovers it: λ m ⊙ τ_group."""
  return lambdas[:, None] * jnp.where(masks, unified[group], 0.)


def similarity(vectors: jax.Array) -> jax.Array:
  """[T, T] sign similarity of Eq. 5: ½(mean_j sgn(a_j) sgn(b_j) + 1)."""
  return _similarity(_sign_gram(vectors), vectors.shape[1])


def _sign_gram(vectors: jax.Array) -> jax.Array:
  """[T, T] Σ_j sgn(a_j) sgn(b_j): exact integers (below 2^24), so column blocks
  add up to the same matrix in any order."""
  sg = jnp.sign(vectors)
  return jnp.dot(sg, sg.T, precision=_HI)


def _similarity(gram: jax.Array, d: int) -> jax.Array:
  return 0.5 * (gram / d + 1.)


def cross_weights(sim: jax.Array, present: jax.Array, cross: str, eps: float,
                  kappa: int) -> jax.Array:
  """[T, T] weights W[t, t'] of the cross-task vector τ̃^t = m̂^t ⊙ Σ W[t, t'] τ̂^{t'}
  (rows of tasks absent this round are 0)."""
  t = sim.shape[0]
  both = present[:, None] & present[None, :]
  if cross == 'none':
    return jnp.zeros_like(sim)
  if cross == 'uniform':
    return jnp.where(both, 1. / jnp.maximum(jnp.sum(present), 1), 0.)
  cand = both & ~jnp.eye(t, dtype=bool) & (sim > eps)
  k = min(int(kappa), t)
  if k <= 0:
    return jnp.zeros_like(sim)
  score = jnp.where(cand, sim, -1.)
  top, idx = jax.lax.top_k(score, k)  # ties: the lower task index first
  rows = jnp.broadcast_to(jnp.arange(t)[:, None], idx.shape)
  return jnp.zeros_like(sim).at[rows, idx].add(jnp.where(top >= 0, top, 0.))


def _task_rows(task: jax.Array, counts: jax.Array, valid: jax.Array, num_tasks: int):
  """Per-row task ids for the task segment sums (padding rows: `num_tasks`, which
  the sums drop), |N^t| [T] and γ [S] (|D_n^t| / Σ|D^t|, 0 for padding rows)."""
  ids = jnp.where(valid, task, num_tasks)
  n_t = jax.ops.segment_sum(valid.astype(jnp.float32), ids, num_segments=num_tasks)
  c = jnp.where(valid, counts.astype(jnp.float32), 0.)
  tot = jax.ops.segment_sum(c, ids, num_segments=num_tasks)
  gamma = jnp.where(valid, c / jnp.maximum(tot[jnp.clip(ids, 0, num_tasks - 1)], 1e-12), 0.)
  return ids, n_t, gamma


def _task_cols(recon: jax.Array, weights: jax.Array, ids: jax.Array, n_t: jax.Array,
               rho: float, num_tasks: int):
  """Eq. 3–4 on columns of the reconstructions m_n ⊙ τ_n [S, c]: `(alpha, m̂, τ̂)`,
  each [T, c]; `weights` [S] = γ λ."""
  sgn = jax.ops.segment_sum(jnp.sign(recon), ids, num_segments=num_tasks)
  alpha = jnp.abs(sgn) / jnp.maximum(n_t, 1.)[:, None]
  m_hat = jnp.where(alpha >= rho, 1., alpha)
  t_hat = m_hat * jax.ops.segment_sum(weights[:, None] * recon, ids, num_segments=num_tasks)
  return alpha, m_hat, t_hat


def _combine(t_hat: jax.Array, m_hat: jax.Array, cw: jax.Array, present: jax.Array,
             combine: str) -> jax.Array:
  """Eq. 6–7 on columns [T, c]: the new task vectors (0 for absent tasks)."""
  t_cross = m_hat * jnp.dot(cw, t_hat, precision=_HI)
  if combine == 'sum':
    new = t_hat + t_cross
  else:
    tot = jnp.sum(cw, axis=1, keepdims=True)
    new = jnp.where(tot > 0, 0.5 * (t_hat + t_cross / jnp.where(tot > 0, tot, 1.)), t_hat)
  return jnp.where(present[:, None], new, 0.)


def _logs(sim, cw, tau_l1, present, agree_counts, d):
  return {'matu_similarity': sim, 'matu_cross_weights': cw, 'matu_tau_l1': tau_l1,
          'matu_present': present, 'matu_agree': jnp.where(present, agree_counts, 0.) / d}


def server(unified: jax.Array, group: jax.Array, masks: jax.Array, lambdas: jax.Array,
           task: jax.Array, counts: jax.Array, valid: jax.Array, num_tasks: int, *,
           rho: float = 0.4, eps: float = 0.5, kappa: int = 3, cross: str = 'similarity',
           combine: str = 'sum'):
  """The stateless server (Eq. 3–7) on the round's uploads. Returns
  `(new task vectors [T, d], present [T] bool, logs)`; tasks no valid row holds
  get 0."""
  recon = jnp.where(masks, unified[group], 0.)
  ids, n_t, gamma = _task_rows(task, counts, valid, num_tasks)
  present = n_t > 0
  alpha, m_hat, t_hat = _task_cols(recon, gamma * lambdas, ids, n_t, rho, num_tasks)
  sim = similarity(t_hat)
  cw = cross_weights(sim, present, cross, eps, kappa)
  new = _combine(t_hat, m_hat, cw, present, combine)
  agree = _row_sums((alpha >= rho).astype(jnp.float32))
  return new, present, _logs(sim, cw, _row_sums(jnp.abs(new)), present, agree,
                             unified.shape[1])


def downlink(new_tasks: jax.Array, group: jax.Array, task: jax.Array, valid: jax.Array,
             tie: str = 'emr'):
  """Each client's unified vector, masks and rescalers from the new task vectors
  of its tasks (§2.4): `unify(new_tasks[task], group, valid)`."""
  return unify(new_tasks[task], group, valid, tie)


def _over_cols(body, d: int, width: int, carry):
  """`carry = body(start, width, carry)` over the column blocks [start, start + width)
  of d columns: a loop over the full blocks, then the narrower last one."""
  n = d // width
  if n:
    carry = jax.lax.fori_loop(0, n, lambda k, c: body(k * width, width, c), carry)
  if d % width:
    carry = body(n * width, d % width, carry)
  return carry


def _cols(x: jax.Array, start, width: int) -> jax.Array:
  return jax.lax.dynamic_slice_in_dim(x, start, width, axis=1)


def _put(x: jax.Array, cols: jax.Array, start) -> jax.Array:
  return jax.lax.dynamic_update_slice_in_dim(x, cols, start, axis=1)


def round_blocks(src, block, d: int, group: jax.Array, task: jax.Array, counts: jax.Array,
                 valid: jax.Array, num_tasks: int, *, tie: str = 'emr', rho: float = 0.4,
                 eps: float = 0.5, kappa: int = 3, cross: str = 'similarity',
                 combine: str = 'sum'):
  """`round_update` on task vectors [S, d] that `block(src, start, width)` gives
  column block by column block ([S, width] float32; padding rows may hold
  anything; `src` a pytree of arrays, `start` traced, `width` static).

  `unify`, `server`, `downlink` and `reconstruct` in three loops over column
  blocks of about `_BLOCK` values: (1) unify, the reconstructions m ⊙ τ_n into one
  [S, d] buffer, rescaler sums; (2) τ̂ and m̂ [T, d], the sign Gram matrix of S;
  (3) the new task vectors, downlink unify, its m ⊙ τ_n over the buffer, rescaler
  sums. The result is λ times the buffer (XLA fuses it into its consumer)."""
  s, t = group.shape[0], num_tasks
  width = min(d, max(128, _BLOCK // max(s, t) // 128 * 128))
  ids, n_t, gamma = _task_rows(task, counts, valid, t)
  present = n_t > 0
  single = _single(group)
  zs = jnp.zeros(s, jnp.float32)

  def up(start, w):
    v = jnp.where(valid[:, None], block(src, start, w), 0.)
    return (v,) + _unify_cols(v, group, single, valid, tie)

  def sums(start, w, carry):
    recon, a, k = carry
    v, mine, masks = up(start, w)
    return (_put(recon, jnp.where(masks, mine, 0.), start), a + _row_sums(jnp.abs(v)),
            k + _kept(mine, masks))

  recon, a, k = _over_cols(sums, d, width, (jnp.zeros((s, d), jnp.float32), zs, zs))
  lambdas = _lambdas(a, k, valid)
  weights = gamma * lambdas

  def aggregate(start, w, carry):
    t_hat, m_hat, gram, agree = carry
    alpha, mh, th = _task_cols(_cols(recon, start, w), weights, ids, n_t, rho, t)
    return (_put(t_hat, th, start), _put(m_hat, mh, start), gram + _sign_gram(th),
            agree + _row_sums((alpha >= rho).astype(jnp.float32)))

  zt = jnp.zeros((t, d), jnp.float32)
  t_hat, m_hat, gram, agree = _over_cols(
      aggregate, d, width, (zt, zt, jnp.zeros((t, t), jnp.float32), jnp.zeros(t, jnp.float32)))
  sim = _similarity(gram, d)
  cw = cross_weights(sim, present, cross, eps, kappa)

  def combined(start, w, carry):  # the downlink's m ⊙ τ overwrite the uploads
    out, l1, a, k = carry
    new = _combine(_cols(t_hat, start, w), _cols(m_hat, start, w), cw, present, combine)
    rows = jnp.where(valid[:, None], new[task], 0.)
    mine, masks = _unify_cols(rows, group, single, valid, tie)
    return (_put(out, jnp.where(masks, mine, 0.), start), l1 + _row_sums(jnp.abs(new)),
            a + _row_sums(jnp.abs(rows)), k + _kept(mine, masks))

  out, tau_l1, a, k = _over_cols(combined, d, width, (recon, jnp.zeros(t, jnp.float32), zs, zs))
  dlambdas = _lambdas(a, k, valid)
  recovered = dlambdas[:, None] * out
  # Rows whose mask kept nothing (λ = 0, spec §7 item 8): a zero task vector (a pair
  # whose adapters have not moved yet), or a task fully out-voted in its client's sign.
  masked = valid & ((lambdas == 0) | (dlambdas == 0))
  logs = {**_logs(sim, cw, tau_l1, present, agree, d), 'matu_lambda_up': lambdas,
          'matu_lambda_down': dlambdas, 'matu_fully_masked': jnp.sum(masked.astype(jnp.int32))}
  return recovered, logs


def round_update(vectors: jax.Array, group: jax.Array, task: jax.Array, counts: jax.Array,
                 valid: jax.Array, num_tasks: int, *, tie: str = 'emr', **server_kw):
  """One MaTU round on the trained task vectors [S, d]: clients unify and upload,
  the server aggregates, clients recover their tasks. Returns `(recovered [S, d],
  logs)`: row i is the task vector pair i starts the next round from (padding
  rows 0). Computed by `round_blocks`."""
  return round_blocks(vectors, _cols, vectors.shape[1], group, task, counts, valid,
                      num_tasks, tie=tie, **server_kw)


def upload_bits(d: int, k: int) -> int:
  """Bits a client holding k tasks uploads (spec §7 item 14): the unified vector
  in float32, plus k bit masks and k float32 rescalers when k > 1 (with one task
  the mask is τ ≠ 0 and λ = 1, nothing to send)."""
  return 32 * d + (k * (d + 32) if k > 1 else 0)
