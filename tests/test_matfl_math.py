"""Tests for fedjax_mtl.algorithms.matfl_math (MaT-FL dynamic-grouping math).

The oracles are NumPy (float64) on the concatenated flattened deviations and
SciPy's average-linkage clustering (what sklearn's AgglomerativeClustering with
affinity='cosine', linkage='average' calls).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import pdist, squareform

from fedjax_mtl.algorithms import matfl_math as m

# Everything is tested through jit (mode / num_clusters static), compiled once
# per shape and reused.
_gram = jax.jit(m.deviation_gram)
_cos = jax.jit(m.cosine_from_gram)
_agglo = jax.jit(m.agglomerative_average, static_argnums=1)
_hard = jax.jit(m.hard_group_weights)
_soft = jax.jit(m.soft_group_weights)
_group = jax.jit(m.group_weights, static_argnames=('mode', 'num_clusters'))
_mix = jax.jit(m.mix)


@functools.partial(jax.jit, static_argnames=('mode', 'num_clusters'))
def _aggregate(stacked, mode, num_clusters=2, th=0.0):
  w, aux = m.group_weights(stacked, mode, num_clusters, th)
  return m.mix(w, stacked), w, aux


# ----------------------------------------------------------------------------
# Helpers and NumPy/SciPy oracles
# ----------------------------------------------------------------------------


def make_tree(rng: np.random.Generator, n: int, base: float = 0.0, scale: float = 1.0):
  """A stacked pytree of 3 leaves (54 values per client): base + scale * noise."""
  shapes = {'conv': {'kernel': (3, 2, 3), 'bias': (3,)}, 'norm': (4, 2, 4)}

  def leaf(shape):
    return (base + scale * rng.standard_normal((n, *shape))).astype(np.float32)

  return jax.tree_util.tree_map(leaf, shapes, is_leaf=lambda s: isinstance(s, tuple))


def flat64(tree) -> np.ndarray:
  """[N, D] float64 concatenation of the flattened leaves (the released `delta` layout)."""
  leaves = jax.tree_util.tree_leaves(tree)
  return np.concatenate([np.asarray(x, np.float64).reshape(x.shape[0], -1) for x in leaves], 1)


def deviations64(tree) -> np.ndarray:
  x = flat64(tree)
  return x - x.mean(0, keepdims=True)


def cos64(x: np.ndarray) -> np.ndarray:
  norm = np.linalg.norm(x, axis=1)
  return (x @ x.T) / np.outer(norm, norm)


def scipy_labels(x: np.ndarray, k: int) -> np.ndarray:
  """sklearn AgglomerativeClustering(k, affinity='cosine', linkage='average') via SciPy."""
  z = linkage(pdist(x, 'cosine'), method='average')
  return fcluster(z, t=k, criterion='maxclust')


def canonical(labels) -> np.ndarray:
  """Relabel by first appearance, so partitions compare with ==."""
  seen: dict[int, int] = {}
  return np.array([seen.setdefault(int(v), len(seen)) for v in np.asarray(labels)])


def two_cluster_tree(rng: np.random.Generator):
  """4 clients near 1.0: {0, 2} moved along u, {1, 3} along v (deviations ~ ±(u - v))."""
  tree = make_tree(rng, 4, base=1.0, scale=0.0)
  sign = np.array([1.0, -1.0, 1.0, -1.0])

  def move(x):
    u = rng.standard_normal(x.shape[1:])
    noise = 0.05 * rng.standard_normal(x.shape)
    return (x + 1e-3 * (sign.reshape(-1, *[1] * (x.ndim - 1)) * u + noise)).astype(np.float32)

  return jax.tree_util.tree_map(move, tree)


# ----------------------------------------------------------------------------
# deviation_gram / cosine_from_gram
# ----------------------------------------------------------------------------


@pytest.mark.parametrize('base,scale', [(0.0, 1.0), (1.0, 1e-3)])
def test_deviation_gram_matches_numpy(base, scale):
  tree = make_tree(np.random.default_rng(0), 5, base=base, scale=scale)
  d = deviations64(tree)
  ref = d @ d.T
  g = np.asarray(_gram(tree))
  assert g.shape == (5, 5) and g.dtype == np.float32
  # Off-diagonal entries can be near 0: measure against the diagonal's scale.
  tol = 1e-3 * np.abs(np.diag(ref)).max()
  np.testing.assert_allclose(g, ref, rtol=1e-3, atol=tol)
  np.testing.assert_allclose(np.diag(g), np.diag(ref), rtol=1e-4)
  np.testing.assert_array_equal(g, g.T)


def test_deviation_gram_does_not_cancel_for_large_nearly_equal_weights():
  # w ~ 1 with 1e-6 differences: double-centring the Gram of the w's in float32
  # would lose everything (the w's Gram is ~54, its rounding ~1e-5).
  tree = make_tree(np.random.default_rng(1), 4, base=1.0, scale=1e-6)
  d = deviations64(tree)
  np.testing.assert_allclose(np.asarray(_cos(_gram(tree))), cos64(d), atol=2e-3)


def test_cosine_from_gram():
  x = np.random.default_rng(2).standard_normal((4, 7))
  x[2] = 0.0  # a zero vector: cos 0 with the others, 1 with itself
  c = np.asarray(_cos(jnp.asarray(x @ x.T, jnp.float32)))
  with np.errstate(invalid='ignore', divide='ignore'):
    ref = np.nan_to_num(cos64(x))
  np.fill_diagonal(ref, 1.0)
  np.testing.assert_allclose(c, ref, atol=1e-6)
  assert c[2, 2] == 1.0 and np.all(c[2, [0, 1, 3]] == 0) and np.all(c[[0, 1, 3], 2] == 0)


# ----------------------------------------------------------------------------
# agglomerative_average
# ----------------------------------------------------------------------------


def test_agglomerative_two_known_clusters():
  tree = two_cluster_tree(np.random.default_rng(3))
  d = deviations64(tree)
  dist = 1.0 - np.asarray(_cos(_gram(tree)))
  labels = np.asarray(_agglo(dist, 2))
  assert labels.dtype == np.int32
  np.testing.assert_array_equal(labels, [0, 1, 0, 1])
  np.testing.assert_array_equal(canonical(scipy_labels(d, 2)), [0, 1, 0, 1])


def test_agglomerative_random_draws_match_scipy():
  rng = np.random.default_rng(4)
  for draw in range(20):
    n = (5, 8, 12)[draw % 3]
    k = (2, 3)[(draw // 3) % 2]
    x = rng.standard_normal((n, 6))
    if draw % 2:  # some draws with cluster structure
      x += 2.0 * rng.standard_normal((k + 1, 6))[rng.integers(0, k + 1, n)]
    dist = squareform(pdist(x, 'cosine')).astype(np.float32)
    labels = np.asarray(_agglo(dist, k))
    ref = canonical(scipy_labels(x, k))
    np.testing.assert_array_equal(labels, ref, err_msg=f'draw {draw}: n={n} k={k}')
    assert len(np.unique(labels)) == k


def test_agglomerative_edge_cases_and_ties():
  dist = squareform(pdist(np.random.default_rng(5).standard_normal((5, 3)), 'cosine'))
  np.testing.assert_array_equal(np.asarray(_agglo(dist, 5)), np.arange(5))  # no merge
  np.testing.assert_array_equal(np.asarray(_agglo(dist, 1)), np.zeros(5))  # all merged
  # All distances equal: merge (0, 1), then ({0,1}, 2) by the smallest-(i, j) rule.
  ties = 1.0 - np.eye(4, dtype=np.float32)
  np.testing.assert_array_equal(np.asarray(_agglo(ties, 2)), [0, 0, 0, 1])
  # Canonical labels: client 0's cluster is 0, then by first appearance.
  blocks = np.array([[0, 9, 1, 9], [9, 0, 9, 9], [1, 9, 0, 9], [9, 9, 9, 0]], np.float32)
  np.testing.assert_array_equal(np.asarray(_agglo(blocks, 3)), [0, 1, 0, 2])


# ----------------------------------------------------------------------------
# Weights and mix
# ----------------------------------------------------------------------------


def test_hard_group_weights_by_hand():
  w = np.asarray(_hard(jnp.array([0, 1, 0, 0, 2], jnp.int32)))
  third = 1.0 / 3.0
  ref = np.array([[third, 0, third, third, 0],
                  [0, 1, 0, 0, 0],
                  [third, 0, third, third, 0],
                  [third, 0, third, third, 0],
                  [0, 0, 0, 0, 1]])
  np.testing.assert_allclose(w, ref, rtol=1e-6)


@pytest.mark.parametrize('th', [0.0, 0.3, -0.2])
def test_soft_group_weights_by_hand(th):
  cos = np.array([[1.0, 0.5, -0.4], [0.5, 1.0, 0.1], [-0.4, 0.1, 1.0]], np.float32)
  w = np.asarray(_soft(cos, th))
  s = np.maximum(cos.astype(np.float64) + th, 0.0)
  np.testing.assert_allclose(w, s / s.sum(1, keepdims=True), rtol=1e-6)
  assert np.all(w >= 0)
  np.testing.assert_allclose(w.sum(1), 1.0, rtol=1e-6)


def test_four_client_example_hard_and_soft():
  tree = two_cluster_tree(np.random.default_rng(6))
  x = flat64(tree)
  new, w, aux = _aggregate(tree, 'hard')
  np.testing.assert_array_equal(np.asarray(aux['labels']), [0, 1, 0, 1])
  np.testing.assert_allclose(np.asarray(w), [[.5, 0, .5, 0], [0, .5, 0, .5]] * 2)
  ref = np.stack([(x[0] + x[2]) / 2, (x[1] + x[3]) / 2] * 2)
  np.testing.assert_allclose(flat64(new), ref, rtol=1e-6)

  new, w, aux = _aggregate(tree, 'soft')
  c = cos64(deviations64(tree))
  np.testing.assert_allclose(np.asarray(aux['cos']), c, atol=1e-4)
  np.testing.assert_array_equal(np.asarray(aux['labels']), np.zeros(4))
  s = np.maximum(c, 0.0)  # cross-cluster cosines are ~ -1: clamped to 0
  s /= s.sum(1, keepdims=True)
  np.testing.assert_allclose(np.asarray(w), s, atol=1e-4)
  assert np.all(np.asarray(w)[[0, 0, 1, 1, 2, 2, 3, 3], [1, 3, 0, 2, 1, 3, 0, 2]] == 0)
  np.testing.assert_allclose(flat64(new), s @ x, rtol=1e-5)


def test_mix_matches_numpy_and_keeps_dtypes():
  rng = np.random.default_rng(7)
  tree = make_tree(rng, 5)
  tree['half'] = rng.standard_normal((5, 6)).astype(np.float16)
  w = rng.random((5, 5)).astype(np.float32)
  w /= w.sum(1, keepdims=True)
  out = _mix(w, tree)
  for x, y in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(out)):
    assert y.dtype == x.dtype and y.shape == x.shape
    ref = np.tensordot(w.astype(np.float64), np.asarray(x, np.float64), axes=1)
    tol = 2e-3 if x.dtype == np.float16 else 1e-5
    np.testing.assert_allclose(np.asarray(y, np.float64), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize('mode', ['hard', 'soft'])
def test_permutation_equivariance(mode):
  rng = np.random.default_rng(8)
  tree = make_tree(rng, 6, base=1.0, scale=1e-3)  # random draws: no ties
  perm = rng.permutation(6)
  new, w, aux = _aggregate(tree, mode, num_clusters=3, th=0.1)
  new_p, w_p, aux_p = _aggregate(jax.tree_util.tree_map(lambda x: x[perm], tree), mode,
                                 num_clusters=3, th=0.1)
  np.testing.assert_allclose(np.asarray(w_p), np.asarray(w)[perm][:, perm], atol=1e-5)
  np.testing.assert_allclose(np.asarray(aux_p['cos']), np.asarray(aux['cos'])[perm][:, perm],
                             atol=1e-4)
  np.testing.assert_allclose(flat64(new_p), flat64(new)[perm], rtol=1e-6)
  if mode == 'hard':
    labels = np.asarray(aux['labels'])
    assert len(np.unique(labels)) == 3
    np.testing.assert_array_equal(np.asarray(aux_p['labels']), canonical(labels[perm]))
    ref = canonical(scipy_labels(deviations64(tree), 3))
    np.testing.assert_array_equal(labels, ref)


def test_group_weights_validation():
  tree = make_tree(np.random.default_rng(9), 3)
  with pytest.raises(ValueError, match="'hard', 'soft'"):
    m.group_weights(tree, 'median')
  for k in (0, 4):
    with pytest.raises(ValueError, match='num_clusters'):
      m.group_weights(tree, 'hard', num_clusters=k)
  with pytest.raises(ValueError, match='leading rows axis'):
    m.group_weights({'a': np.zeros((3, 2)), 'b': np.zeros((2, 2))}, 'soft')
