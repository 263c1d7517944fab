"""FedAMP server math: pure, jit-compatible JAX functions on stacked pytrees.

FedAMP (Huang et al., "Personalized Cross-Silo Federated Learning on Non-IID
Data", AAAI 2021), exactly as PFLlib implements it (``TsingZ0/PFLlib``,
``system/flcore/servers/serveramp.py`` ``send_models`` and ``e``). The inputs
are "stacked pytrees": any pytree whose leaves share a leading client axis
[N, ...], here the clients' current models w_1..w_N.

Server, per round (full participation)::

  D_ij  = ||w_i - w_j||^2                  (over all leaves, flattened)
  xi_ij = alpha_k * exp(-D_ij / sigma) / sigma     for j != i
  xi_ii = 1 - sum_{j != i} xi_ij
  u_i   = sum_j xi_ij w_j                  (client i's personalised cloud model)

PFLlib defaults alpha_k = 1, sigma = 1 (FedHCA2 uses λ = α_k = σ = 1). Note that
xi_ii goes negative when the models are close (D_ij << sigma): with D ~ 0 and
alpha_k = sigma = 1, xi_ii = 2 - N, so u_i extrapolates away from the others.
That is PFLlib's behaviour and is kept.

Client side (not implemented here, for reference). The FedAMP objective is
F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2, trained from the client's own
current model (PFLlib keeps training ``client.model``; u_i is stored only as
``client_u`` for the proximal term: ``set_parameters`` writes
``client_u = mu + coef_self * client.model``). PFLlib's ``clientamp.py`` writes
the term as ``0.5 * lamda / alphaK * torch.norm(gm - pm, p=2)`` (the norm, not
its square) on ``p.data`` copies, which carry no gradient, so in PFLlib the
term does not change the updates at all; the paper's squared proximal term
does.

Numerics: D comes from the Gram matrix of the deviations from the mean, summed
leaf by leaf (D_ij = G_ii + G_jj - 2 G_ij), clamped at 0 with an exact zero
diagonal. The cloud models are formed as u_i = w_i + sum_{j != i} xi_ij (w_j - w_i),
one [N, N] x [N, d] contraction per leaf on w - w_1: xi_ii (which rounds at
its own magnitude, up to N - 2) is never multiplied into |w|, so the error of
u - w scales with the spread of the models, not their size. Nothing concatenates the leaves into one [N, D] copy and no N x N x d
tensor is formed (a model can be 24 x 27.5M float32 parameters).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fedjax_mtl.algorithms.base import deviation_gram, num_rows

PyTree = Any

_HI = jax.lax.Precision.HIGHEST




def pairwise_sq_dists(stacked: PyTree) -> jax.Array:
  """Squared Euclidean distances [N, N] between the clients' flattened models."""
  n = num_rows(stacked)
  g = deviation_gram(stacked)  # exactly symmetric: D_ij and D_ji agree bitwise
  sq = jnp.diagonal(g)
  d = jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * g, 0.0)
  return jnp.where(jnp.eye(n, dtype=bool), 0.0, d)


def attention_weights(sq_dists: jax.Array, alpha_k: float = 1.0, sigma: float = 1.0) -> jax.Array:
  """FedAMP message-passing weights xi [N, N] from squared distances; rows sum to 1."""
  off = _off_diagonal_weights(sq_dists, alpha_k, sigma)
  return off + jnp.diag(1.0 - jnp.sum(off, axis=1))


def _off_diagonal_weights(sq_dists: jax.Array, alpha_k: float, sigma: float) -> jax.Array:
  """xi with a zero diagonal: alpha_k exp(-D_ij / sigma) / sigma for j != i."""
  d = jnp.asarray(sq_dists, jnp.float32)
  eye = jnp.eye(d.shape[0], dtype=bool)
  return jnp.where(eye, 0.0, alpha_k * jnp.exp(-d / sigma) / sigma)


def _expand(v: jax.Array, ndim: int) -> jax.Array:
  return jnp.reshape(v, (-1,) + (1,) * (ndim - 1))


def mix(weights: jax.Array, stacked: PyTree) -> PyTree:
  """New stacked pytree with u_i = sum_j W_ij w_j for every leaf, each leaf keeping its dtype."""
  w = jnp.asarray(weights, jnp.float32)
  row_sums = jnp.sum(w, axis=1)

  def one(x: jax.Array) -> jax.Array:
    xf = x.astype(jnp.float32)
    x0 = xf[:1]
    # sum_j W_ij w_j = (sum_j W_ij) w_1 + sum_j W_ij (w_j - w_1): large or
    # negative weights then multiply only the small, exactly formed
    # differences, not |w| ~ 1.
    y = jnp.tensordot(w, xf - x0, axes=1, precision=_HI)
    return (y + _expand(row_sums, x.ndim) * x0).astype(x.dtype)

  return jax.tree_util.tree_map(one, stacked)


def _mix_off_diagonal(off: jax.Array, stacked: PyTree) -> PyTree:
  """u_i = w_i + sum_j A_ij (w_j - w_i) for a zero-diagonal A, i.e. mix with xi_ii = 1 - sum_j A_ij."""
  a = jnp.asarray(off, jnp.float32)
  row_sums = jnp.sum(a, axis=1)

  def one(x: jax.Array) -> jax.Array:
    xf = x.astype(jnp.float32)
    c = xf - xf[:1]  # exact for close models; the terms below are all small
    y = jnp.tensordot(a, c, axes=1, precision=_HI) - _expand(row_sums, x.ndim) * c
    return (xf + y).astype(x.dtype)

  return jax.tree_util.tree_map(one, stacked)


def cloud_models(
    stacked: PyTree, alpha_k: float = 1.0, sigma: float = 1.0, valid: jax.Array | None = None
) -> tuple[PyTree, dict[str, jax.Array]]:
  """FedAMP cloud models u (stacked like the input) and aux {'weights': xi, 'sq_dists': D}.

  `valid` ([N] bool, partial participation): u_i mixes the participants' models only,
  as PFLlib's server mixes the uploaded models (xi_ij = 0 unless i and j both took
  part; a non-participant's u_i is then its own model, which the caller discards)."""
  d = pairwise_sq_dists(stacked)
  off = _off_diagonal_weights(d, alpha_k, sigma)
  if valid is not None:
    off = jnp.where(valid[:, None] & valid[None, :], off, 0.0)
  xi = off + jnp.diag(1.0 - jnp.sum(off, axis=1))
  # Mixed from the off-diagonal weights: the same u = xi w, without the rounded
  # xi_ii (see the module docstring).
  return _mix_off_diagonal(off, stacked), {'weights': xi, 'sq_dists': d}


__all__ = [
    'attention_weights',
    'cloud_models',
    'mix',
    'pairwise_sq_dists',
]
