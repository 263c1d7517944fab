"""MaT-FL dynamic-grouping math: pure, jit-compatible JAX functions on stacked pytrees.

Server side of MaT-FL (Cai et al., CVPRW 2023; reference code ``VITA-Group/MaT-FL``
``dg_utils.py``, spec: ../shared/spec/reference-code.md §2). Only the backbone
(encoder) is aggregated. Its inputs are "stacked pytrees": any pytree whose leaves
share a leading client axis [N, ...].

* The compared vectors are the flattened backbone deviations from the current
  mean ("model soup"), d_i = w_i - mean_j w_j, and S = cos(d_i, d_j)
  (:func:`deviation_gram`, :func:`cosine_from_gram`).
* ``'hard'`` grouping (released ``get_grouping_score``): sklearn
  ``AgglomerativeClustering(n_clusters=K, affinity='cosine', linkage='average')``
  on the d_i, here :func:`agglomerative_average` on 1 - S, then a uniform mean
  inside each cluster (:func:`hard_group_weights`).
* ``'soft'`` grouping (released ``get_soft_grouping_score``): the rows of
  max(S + th, 0), normalised to sum 1 (:func:`soft_group_weights`).

Both give a row-stochastic [N, N] matrix W (:func:`group_weights`), and each
client's new encoder is sum_j W_ij w_j (:func:`mix`).

Nothing concatenates the leaves into one [N, D] copy: the Gram matrix is summed
leaf by leaf and the mix is one [N, N] x [N, d] contraction per leaf (an encoder
can be 6 x 27.5M float32 parameters).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fedjax_mtl.algorithms.base import deviation_gram, mix_rows, num_rows  # noqa: F401 (re-exported)

PyTree = Any

_HI = jax.lax.Precision.HIGHEST
MODES = ('hard', 'soft')




def cosine_from_gram(g: jax.Array) -> jax.Array:
  """Cosine similarity [N, N] from a Gram matrix; a zero vector has cos 0 with others, 1 with itself."""
  g = jnp.asarray(g, jnp.float32)
  norm = jnp.sqrt(jnp.maximum(jnp.diagonal(g), 0.0))
  nonzero = norm > 0
  safe = jnp.where(nonzero, norm, 1.0)
  # Divide by each norm separately: their product may underflow for tiny vectors.
  cos = g / safe[:, None] / safe[None, :]
  cos = jnp.where(nonzero[:, None] & nonzero[None, :], cos, 0.0)
  # Rounding can push |cos| slightly above 1; the diagonal is exactly 1 (also for
  # a zero vector: the released soft grouping would give it a 0/0 row instead).
  cos = jnp.clip(cos, -1.0, 1.0)
  return jnp.where(jnp.eye(g.shape[0], dtype=bool), 1.0, cos)


def agglomerative_average(dist: jax.Array, num_clusters: int,
                          valid: jax.Array | None = None) -> jax.Array:
  """Average-linkage agglomerative clustering of a precomputed [N, N] distance matrix: labels [N] int32.

  Merges the closest pair of active clusters N - K times (ties: the smallest
  (i, j), i < j, in row-major order) with the Lance-Williams update
  d(k, i∪j) = (n_i d(k, i) + n_j d(k, j)) / (n_i + n_j). This is the partition
  that sklearn's ``AgglomerativeClustering(linkage='average')`` and SciPy's
  ``linkage(method='average')`` + ``fcluster(criterion='maxclust')`` cut at K
  clusters (average linkage is monotone, so merge order = height order).
  Labels are canonical: client 0's cluster is 0, the next cluster by first
  client index is 1, and so on. ``num_clusters`` must be a static int.
  With ``valid`` [N] bool only the valid rows are clustered (V of them, V - K
  merges, none when V <= K) and the invalid rows get label -1.
  """
  dist = jnp.asarray(dist, jnp.float32)
  n = dist.shape[0]
  if dist.shape != (n, n):
    raise ValueError(f'agglomerative_average: dist must be square, got {dist.shape}')
  k = int(num_clusters)
  if not 1 <= k <= n:
    raise ValueError(f'agglomerative_average: num_clusters must be in [1, {n}], got {k}')
  idx = jnp.arange(n)
  upper = idx[:, None] < idx[None, :]
  # Read the upper triangle only (like SciPy's condensed form) and mirror it.
  d0 = jnp.where(upper, dist, dist.T)

  def merge(_, state):
    d, size, active, rep = state
    # Candidate pairs: i < j, both active. argmin takes the first minimum in
    # row-major order, which is the documented tie-break.
    ok = upper & active[:, None] & active[None, :]
    flat = jnp.argmin(jnp.where(ok, d, jnp.inf).ravel())
    i, j = flat // n, flat % n
    ni, nj = size[i], size[j]
    row = (ni * d[i] + nj * d[j]) / (ni + nj)
    # Cluster i∪j keeps the slot (and representative) of i, the smaller index,
    # so each representative is its cluster's smallest client index.
    d = d.at[i, :].set(row).at[:, i].set(row)
    size = size.at[i].add(nj)
    active = active.at[j].set(False)
    rep = jnp.where(rep == j, i, rep)
    return d, size, active, rep

  if valid is None:
    state = (d0, jnp.ones((n,), jnp.float32), jnp.ones((n,), bool), idx)
    _, _, active, rep = jax.lax.fori_loop(0, n - k, merge, state)
  else:
    valid = jnp.asarray(valid, bool)
    merges = jnp.maximum(jnp.sum(valid.astype(jnp.int32)) - k, 0)
    state = (d0, jnp.ones((n,), jnp.float32), valid, idx)
    _, _, active, rep = jax.lax.fori_loop(0, merges, merge, state)
  # A representative is its cluster's first client, so the canonical label is
  # the number of active representatives before it.
  rank = jnp.cumsum(active.astype(jnp.int32)) - 1
  labels = rank[rep].astype(jnp.int32)
  return labels if valid is None else jnp.where(valid, labels, -1)


def hard_group_weights(labels: jax.Array) -> jax.Array:
  """W [N, N] with W_ij = 1/|C(i)| if labels_i == labels_j else 0 (uniform mean in the cluster)."""
  labels = jnp.asarray(labels)
  same = (labels[:, None] == labels[None, :]).astype(jnp.float32)
  return same / jnp.sum(same, axis=1, keepdims=True)


def soft_group_weights(cos: jax.Array, th: float | jax.Array = 0.0) -> jax.Array:
  """W [N, N] = rows of max(cos + th, 0) normalised to sum 1 (needs th > -1: the diagonal is 1 + th)."""
  s = jnp.maximum(jnp.asarray(cos, jnp.float32) + th, 0.0)
  return s / jnp.sum(s, axis=1, keepdims=True)


def group_weights(
    stacked: PyTree, mode: str, num_clusters: int = 2, th: float | jax.Array = 0.0,
    valid: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """MaT-FL grouping weights W [N, N] and aux {'cos': [N, N], 'labels': [N] int32}.

  ``mode`` ('hard' | 'soft') and ``num_clusters`` are static; ``th`` (soft only)
  may be traced; ``num_clusters`` is checked (1 <= K <= N) in hard mode only.
  Hard mode's labels are the canonical cluster labels; soft mode
  has no partition, so its labels are all zeros (one soft group).
  ``valid`` [N] bool (row 0 valid): the grouping of the valid rows alone (their
  mean, their clusters), each invalid row keeping itself (W_ii = 1, label -1).
  """
  if valid is not None:
    return _valid_group_weights(stacked, mode, num_clusters, th, jnp.asarray(valid, bool))
  if mode not in MODES:
    raise ValueError(f'group_weights: mode must be one of {MODES}, got {mode!r}')
  n = num_rows(stacked)
  if mode == 'hard' and not 1 <= int(num_clusters) <= n:
    raise ValueError(f'group_weights: num_clusters must be in [1, {n}] (N clients), got {num_clusters}')
  cos = cosine_from_gram(deviation_gram(stacked))
  if mode == 'hard':
    labels = agglomerative_average(1.0 - cos, num_clusters)
    weights = hard_group_weights(labels)
  else:
    labels = jnp.zeros((n,), jnp.int32)
    weights = soft_group_weights(cos, th)
  return weights, {'cos': cos, 'labels': labels}


def _valid_group_weights(stacked, mode, num_clusters, th, valid):
  n = num_rows(stacked)
  if mode not in MODES:
    raise ValueError(f'group_weights: mode must be one of {MODES}, got {mode!r}')
  if mode == 'hard' and not 1 <= int(num_clusters) <= n:
    raise ValueError(f'group_weights: num_clusters must be in [1, {n}] (N clients), got {num_clusters}')
  pair = valid[:, None] & valid[None, :]
  cos = jnp.where(pair, cosine_from_gram(deviation_gram(stacked, valid)), 0.0)
  eye = jnp.eye(n, dtype=bool)
  if mode == 'hard':
    labels = agglomerative_average(1.0 - cos, num_clusters, valid)
    same = (labels[:, None] == labels[None, :]) & pair
  else:
    labels = jnp.where(valid, 0, -1).astype(jnp.int32)
    same = jnp.where(pair, jnp.maximum(cos + th, 0.0), 0.0)
  s = jnp.where(valid[:, None], same.astype(jnp.float32), eye.astype(jnp.float32))
  return s / jnp.sum(s, axis=1, keepdims=True), {'cos': cos, 'labels': labels}


# new_i = Σ_j W_ij w_j per leaf, each leaf keeping its dtype (one [N, N] x [N, d]
# contraction per leaf).
mix = mix_rows


__all__ = [
    'MODES',
    'agglomerative_average',
    'cosine_from_gram',
    'deviation_gram',
    'group_weights',
    'hard_group_weights',
    'mix',
    'soft_group_weights',
]
