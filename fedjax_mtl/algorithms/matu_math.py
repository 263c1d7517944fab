"""MaTU's math (spec matu.md §2): task unification, modulators and the stateless
many-task server, on flat task vectors.

Every function works on one round's rows at once: row i is one (client, task)
pair with its task vector `vectors[i]` ([S, d], the pair's trained adapters
minus their shared initialisation), `group[i]` (segment id of its client, in
[0, S): the rows of one client share it), `task[i]` (in [0, T)), `counts[i]`
(|D_n^t|) and `valid[i]` (False: a padding row; it joins no client and no task).
Sums and maxima over a client's rows are segment sums and maxima, sums over a
task's rows one-hot contractions, the task similarity is one matmul of sign
matrices: all of a round in one jitted program.

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


def _onehot(ids: jax.Array, n: int, valid: jax.Array) -> jax.Array:
  """[n, S] float32: entry (k, i) = 1 where row i is valid and has id k."""
  return ((ids[None, :] == jnp.arange(n)[:, None]) & valid[None, :]).astype(jnp.float32)


def _sign(total: jax.Array, tie: str) -> jax.Array:
  if tie == 'emr':  # EMR-Merging's `flag = (sum > 0) * 2 - 1`
    return jnp.where(total > 0, 1., -1.).astype(total.dtype)
  return jnp.sign(total)


def unify(vectors: jax.Array, group: jax.Array, valid: jax.Array, tie: str = 'emr'):
  """Unify each group's rows (Eq. 2). Returns `(unified [S, d], masks [S, d] bool,
  lambdas [S])`: `unified[g]` is group g's unified vector (0 for ids no valid row
  has), `masks[i]` and `lambdas[i]` row i's mask and rescaler against its group's."""
  s = vectors.shape[0]
  v = jnp.where(valid[:, None], vectors, 0.)
  # Segment sums and maxima are scatters (O(S d)); a one-hot matmul would cost S² d.
  total = jax.ops.segment_sum(v, group, num_segments=s)
  sigma = _sign(total, tie)
  agree = v * sigma[group] > 0
  mu = jax.ops.segment_max(jnp.where(agree, jnp.abs(v), 0.), group, num_segments=s)
  unified = sigma * jnp.maximum(mu, 0.)
  mine = unified[group]
  masks = (v * mine > 0) & valid[:, None]
  kept = _row_sums(jnp.abs(jnp.where(masks, mine, 0.)))
  lambdas = jnp.where(kept > 0, _row_sums(jnp.abs(v)) / jnp.where(kept > 0, kept, 1.), 0.)
  return unified, masks, jnp.where(valid, lambdas, 0.)


def _row_sums(x: jax.Array) -> jax.Array:
  """[S] sums over each row: a reduction over the minor axis, which XLA fuses with
  the elementwise work that produces `x` (no [S, d] temporary)."""
  return jnp.sum(x, axis=1)


def reconstruct(unified: jax.Array, group: jax.Array, masks: jax.Array,
                lambdas: jax.Array) -> jax.Array:
  """[S, d] each row's task vector as its client recovers it: λ m ⊙ τ_group."""
  return lambdas[:, None] * jnp.where(masks, unified[group], 0.)


def similarity(vectors: jax.Array) -> jax.Array:
  """[T, T] sign similarity of Eq. 5: ½(mean_j sgn(a_j) sgn(b_j) + 1)."""
  sg = jnp.sign(vectors)
  return 0.5 * (jnp.dot(sg, sg.T, precision=_HI) / vectors.shape[1] + 1.)


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


def server(unified: jax.Array, group: jax.Array, masks: jax.Array, lambdas: jax.Array,
           task: jax.Array, counts: jax.Array, valid: jax.Array, num_tasks: int, *,
           rho: float = 0.4, eps: float = 0.5, kappa: int = 3, cross: str = 'similarity',
           combine: str = 'sum'):
  """The stateless server (Eq. 3–7) on the round's uploads. Returns
  `(new task vectors [T, d], present [T] bool, logs)`; tasks no valid row holds
  get 0."""
  recon = jnp.where(masks, unified[group], 0.)
  oh = _onehot(task, num_tasks, valid)
  n_t = jnp.sum(oh, axis=1)
  present = n_t > 0
  alpha = jnp.abs(jnp.dot(oh, jnp.sign(recon), precision=_HI)) / jnp.maximum(n_t, 1.)[:, None]
  m_hat = jnp.where(alpha >= rho, 1., alpha)
  w = oh * counts.astype(jnp.float32)[None, :]
  gamma = w / jnp.maximum(jnp.sum(w, axis=1, keepdims=True), 1e-12)
  t_hat = m_hat * jnp.dot(gamma * lambdas[None, :], recon, precision=_HI)
  sim = similarity(t_hat)
  cw = cross_weights(sim, present, cross, eps, kappa)
  t_cross = m_hat * jnp.dot(cw, t_hat, precision=_HI)
  if combine == 'sum':
    new = t_hat + t_cross
  else:
    tot = jnp.sum(cw, axis=1, keepdims=True)
    new = jnp.where(tot > 0, 0.5 * (t_hat + t_cross / jnp.where(tot > 0, tot, 1.)), t_hat)
  new = jnp.where(present[:, None], new, 0.)
  logs = {'matu_similarity': sim, 'matu_cross_weights': cw,
          'matu_tau_l1': _row_sums(jnp.abs(new)), 'matu_present': present,
          'matu_agree': _row_sums((present[:, None] & (alpha >= rho)).astype(jnp.float32))
                        / unified.shape[1]}
  return new, present, logs


def downlink(new_tasks: jax.Array, group: jax.Array, task: jax.Array, valid: jax.Array,
             tie: str = 'emr'):
  """Each client's unified vector, masks and rescalers from the new task vectors
  of its tasks (§2.4): `unify(new_tasks[task], group, valid)`."""
  return unify(new_tasks[task], group, valid, tie)


def round_update(vectors: jax.Array, group: jax.Array, task: jax.Array, counts: jax.Array,
                 valid: jax.Array, num_tasks: int, *, tie: str = 'emr', **server_kw):
  """One MaTU round on the trained task vectors [S, d]: clients unify and upload,
  the server aggregates, clients recover their tasks. Returns `(recovered [S, d],
  logs)`: row i is the task vector pair i starts the next round from (padding
  rows 0)."""
  up, masks, lambdas = unify(vectors, group, valid, tie)
  new, _, logs = server(up, group, masks, lambdas, task, counts, valid, num_tasks, **server_kw)
  down, dmasks, dlambdas = downlink(new, group, task, valid, tie)
  # Rows whose mask kept nothing (λ = 0, spec §7 item 8): a zero task vector (a pair
  # whose adapters have not moved yet), or a task fully out-voted in its client's sign.
  masked = valid & ((lambdas == 0) | (dlambdas == 0))
  logs = {**logs, 'matu_lambda_up': lambdas, 'matu_lambda_down': dlambdas,
          'matu_fully_masked': jnp.sum(masked.astype(jnp.int32))}
  return reconstruct(down, group, dmasks, dlambdas), logs


def upload_bits(d: int, k: int) -> int:
  """Bits a client holding k tasks uploads (spec §7 item 14): the unified vector
  in float32, plus k bit masks and k float32 rescalers when k > 1 (with one task
  the mask is τ ≠ 0 and λ = 1, nothing to send)."""
  return 32 * d + (k * (d + 32) if k > 1 else 0)
