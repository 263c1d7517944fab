"""Tests for fedjax_mtl.algorithms.fedamp_math and fedsta_math (server aggregation math).

Oracles are written here independently in NumPy float64 on the concatenated
flattened models (the modules never concatenate). Everything runs through jit.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_mtl.algorithms import fedamp_math as amp
from fedjax_mtl.algorithms import fedsta_math as sta

_dists = jax.jit(amp.pairwise_sq_dists)
_xi = jax.jit(amp.attention_weights)
_cloud = jax.jit(amp.cloud_models)


@functools.partial(jax.jit, static_argnames=('body_frozen',))
def _sta(prev, local, client_weights=None, body_frozen=False):
  return sta.aggregate(prev, local, client_weights=client_weights, body_frozen=body_frozen)


# ----------------------------------------------------------------------------
# Helpers and NumPy oracles
# ----------------------------------------------------------------------------


def _tree(rng: np.random.Generator, n: int, scale: float = 1.0, offset: float = 0.0) -> dict:
  """A nested pytree of 3 leaves (37 values per client) with leading axis n."""
  f = lambda *s: (offset + scale * rng.standard_normal((n, *s))).astype(np.float32)
  return {'a': f(3, 4), 'b': {'c': f(5), 'd': f(2, 2, 5)}}


def _flat(tree) -> np.ndarray:
  """[N, D] float64 concatenation of the leaves (oracle side only)."""
  leaves = jax.tree_util.tree_leaves(tree)
  return np.concatenate([np.asarray(x, np.float64).reshape(x.shape[0], -1) for x in leaves], axis=1)


def _permute(tree, perm):
  return jax.tree_util.tree_map(lambda x: np.asarray(x)[perm], tree)


def amp_oracle(w: np.ndarray, alpha_k: float, sigma: float):
  """PFLlib send_models in float64: coef over j != i, coef_self = 1 - sum, u = sum coef w_j + coef_self w_i."""
  n = w.shape[0]
  d = np.array([[np.sum((w[i] - w[j]) ** 2) for j in range(n)] for i in range(n)])
  xi = np.zeros((n, n))
  for i in range(n):
    for j in range(n):
      if j != i:
        xi[i, j] = alpha_k * np.exp(-d[i, j] / sigma) / sigma
    xi[i, i] = 1.0 - xi[i].sum()
  return d, xi, xi @ w


def _assert_tree_close(got, want_flat: np.ndarray, **tol):
  np.testing.assert_allclose(_flat(got), want_flat, **tol)


# ----------------------------------------------------------------------------
# FedAMP
# ----------------------------------------------------------------------------


def _hand_tree(offset: float = 0.0) -> dict:
  # Three clients, coordinates split over two leaves:
  # w1 = (0, 0 | 0), w2 = (.5, .5 | 0), w3 = (0, 0 | 1), so
  # D12 = 0.5, D13 = 1.0, D23 = 0.25 + 0.25 + 1 = 1.5.
  xy = np.array([[0.0, 0.0], [0.5, 0.5], [0.0, 0.0]], np.float32) + offset
  z = np.array([[[0.0]], [[0.0]], [[1.0]]], np.float32) + offset
  # Keys sort as the coordinates run (tree_leaves orders dict keys).
  return {'xy': xy, 'znested': {'z': z}}


@pytest.mark.parametrize('offset', [0.0, 3.0])
def test_fedamp_hand_example(offset):
  tree = _hand_tree(offset)
  u, aux = _cloud(tree, 1.0, 1.0)
  d = np.array([[0.0, 0.5, 1.0], [0.5, 0.0, 1.5], [1.0, 1.5, 0.0]])
  np.testing.assert_allclose(np.asarray(aux['sq_dists']), d, rtol=1e-6, atol=1e-6)

  # alpha_k = sigma = 1: xi_ij = exp(-D_ij), xi_ii = 1 - the others.
  e12, e13, e23 = np.exp(-0.5), np.exp(-1.0), np.exp(-1.5)
  xi = np.array([
      [1 - e12 - e13, e12, e13],
      [e12, 1 - e12 - e23, e23],
      [e13, e23, 1 - e13 - e23],
  ])
  np.testing.assert_allclose(np.asarray(aux['weights']), xi, rtol=1e-6, atol=1e-6)

  w1 = np.array([0.0, 0.0, 0.0]) + offset
  w2 = np.array([0.5, 0.5, 0.0]) + offset
  w3 = np.array([0.0, 0.0, 1.0]) + offset
  want = np.stack([
      xi[0, 0] * w1 + e12 * w2 + e13 * w3,
      e12 * w1 + xi[1, 1] * w2 + e23 * w3,
      e13 * w1 + e23 * w2 + xi[2, 2] * w3,
  ])
  _assert_tree_close(u, want, rtol=1e-6, atol=1e-6)


def test_fedamp_hand_example_alpha_sigma():
  # alpha_k = 0.5, sigma = 2: xi_ij = 0.5 * exp(-D_ij / 2) / 2.
  _, aux = _cloud(_hand_tree(), 0.5, 2.0)
  a12, a13, a23 = 0.25 * np.exp(-0.25), 0.25 * np.exp(-0.5), 0.25 * np.exp(-0.75)
  xi = np.array([
      [1 - a12 - a13, a12, a13],
      [a12, 1 - a12 - a23, a23],
      [a13, a23, 1 - a13 - a23],
  ])
  np.testing.assert_allclose(np.asarray(aux['weights']), xi, rtol=1e-6, atol=1e-6)
  # attention_weights alone, on the oracle distances.
  d = np.array([[0.0, 0.5, 1.0], [0.5, 0.0, 1.5], [1.0, 1.5, 0.0]], np.float32)
  np.testing.assert_allclose(np.asarray(_xi(d, 0.5, 2.0)), xi, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('alpha_k,sigma', [(1.0, 1.0), (0.3, 20.0)])
def test_fedamp_matches_numpy_oracle(alpha_k, sigma):
  rng = np.random.default_rng(0)
  tree = _tree(rng, 4, scale=0.2)
  u, aux = _cloud(tree, alpha_k, sigma)
  d, xi, want = amp_oracle(_flat(tree), alpha_k, sigma)
  np.testing.assert_allclose(np.asarray(aux['sq_dists']), d, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(aux['weights']), xi, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(aux['weights']).sum(axis=1), 1.0, atol=1e-6)
  _assert_tree_close(u, want, rtol=1e-5, atol=1e-6)
  _assert_tree_close(jax.jit(amp.mix)(aux['weights'], tree), want, rtol=1e-5, atol=1e-6)
  # Structure and dtypes are preserved.
  assert jax.tree_util.tree_structure(u) == jax.tree_util.tree_structure(tree)
  assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(u))


def test_fedamp_permutation_equivariance():
  rng = np.random.default_rng(1)
  tree = _tree(rng, 4, scale=0.2)
  perm = np.array([2, 0, 3, 1])
  u, aux = _cloud(tree, 1.0, 1.0)
  up, auxp = _cloud(_permute(tree, perm), 1.0, 1.0)
  d, xi = np.asarray(aux['sq_dists']), np.asarray(aux['weights'])
  np.testing.assert_allclose(np.asarray(auxp['sq_dists']), d[perm][:, perm], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(auxp['weights']), xi[perm][:, perm], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(_flat(up), _flat(u)[perm], rtol=1e-5, atol=1e-6)


def test_fedamp_identical_models():
  rng = np.random.default_rng(2)
  one = _tree(rng, 1)
  tree = jax.tree_util.tree_map(lambda x: np.repeat(x, 4, axis=0), one)
  alpha_k, sigma = 0.5, 2.0
  u, aux = _cloud(tree, alpha_k, sigma)
  np.testing.assert_array_equal(np.asarray(aux['sq_dists']), 0.0)
  xi = np.full((4, 4), alpha_k / sigma)
  np.fill_diagonal(xi, 1.0 - 3 * alpha_k / sigma)
  np.testing.assert_allclose(np.asarray(aux['weights']), xi, rtol=1e-6)
  _assert_tree_close(u, _flat(tree), rtol=1e-6, atol=0)


def test_fedamp_accuracy_near_one():
  # w ~ 1 with 1e-3 differences: D ~ 7e-5 must not drown in the rounding of
  # |w|^2 ~ 37 (the Gram of the raw w's is off by ~20% here).
  rng = np.random.default_rng(3)
  tree = _tree(rng, 12, scale=1e-3, offset=1.0)
  u, aux = _cloud(tree, 1.0, 1.0)
  w = _flat(tree)
  d, xi, want = amp_oracle(w, 1.0, 1.0)
  np.testing.assert_allclose(np.asarray(aux['sq_dists']), d, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(aux['weights']), xi, rtol=1e-6, atol=1e-6)
  # xi_ii ~ -10 here (extrapolation), yet u must be right to float32
  # resolution at 1 (one ulp, 1.2e-7); tensordot(xi, w) is off by ~2e-6.
  np.testing.assert_allclose(_flat(u), want, rtol=0, atol=1.2e-7)


# ----------------------------------------------------------------------------
# FedSTA
# ----------------------------------------------------------------------------


def test_fedsta_uniform_matches_numpy_oracle():
  rng = np.random.default_rng(4)
  prev, local = _tree(rng, 3), _tree(rng, 3)
  new, aux = _sta(prev, local)
  want = np.repeat(_flat(local).mean(axis=0, keepdims=True), 3, axis=0)
  _assert_tree_close(new, want, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(aux['weights']), np.full(3, 1 / 3), rtol=1e-6)
  assert jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(local)
  assert all(a.shape == b.shape for a, b in
             zip(jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(local)))


def test_fedsta_weighted_matches_numpy_oracle():
  rng = np.random.default_rng(5)
  prev, local = _tree(rng, 3), _tree(rng, 3)
  cw = np.array([1.0, 2.0, 5.0], np.float32)
  new, aux = _sta(prev, local, cw)
  p = cw / cw.sum()
  want = np.repeat((p[:, None] * _flat(local)).sum(axis=0, keepdims=True), 3, axis=0)
  _assert_tree_close(new, want, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(aux['weights']), p, rtol=1e-6)


def test_fedsta_permutation_equivariance():
  rng = np.random.default_rng(6)
  prev, local = _tree(rng, 3), _tree(rng, 3)
  cw = np.array([1.0, 2.0, 5.0], np.float32)
  perm = np.array([2, 0, 1])
  new, aux = _sta(prev, local, cw)
  newp, auxp = _sta(_permute(prev, perm), _permute(local, perm), cw[perm])
  np.testing.assert_allclose(_flat(newp), _flat(new)[perm], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(auxp['weights']), np.asarray(aux['weights'])[perm], rtol=1e-6)


def test_fedsta_reductions():
  rng = np.random.default_rng(7)
  # Shared round-start body: the rule is FedAvg of the updates applied to it.
  body = _tree(rng, 1)
  prev = jax.tree_util.tree_map(lambda x: np.repeat(x, 3, axis=0), body)
  local = jax.tree_util.tree_map(lambda x: x + 0.01 * rng.standard_normal(x.shape).astype(np.float32), prev)
  new, _ = _sta(prev, local)
  fedavg_updates = _flat(prev) + (_flat(local) - _flat(prev)).mean(axis=0, keepdims=True)
  _assert_tree_close(new, fedavg_updates, rtol=1e-6, atol=1e-6)

  # Identical local encoders: identity.
  new, _ = _sta(local, prev)
  _assert_tree_close(new, _flat(prev), rtol=1e-6, atol=1e-6)

  # Task-specific stage (body frozen): the round-start encoders come back.
  new, aux = _sta(prev, local, body_frozen=True)
  np.testing.assert_array_equal(_flat(new), _flat(prev))
  np.testing.assert_allclose(np.asarray(aux['weights']), np.full(3, 1 / 3), rtol=1e-6)

  # One client: identity on the local encoder.
  one_prev, one_local = _tree(rng, 1), _tree(rng, 1)
  new, _ = _sta(one_prev, one_local)
  _assert_tree_close(new, _flat(one_local), rtol=1e-6, atol=0)


def test_fedsta_defaults_and_errors():
  assert sta.DEFAULTS == {'client_weights': None, 'body_frozen': False}
  rng = np.random.default_rng(8)
  prev, local = _tree(rng, 3), _tree(rng, 3)
  with pytest.raises(ValueError):
    sta.aggregate(prev, local, client_weights=np.ones(2, np.float32))
  with pytest.raises(ValueError):
    sta.aggregate({'a': prev['a']}, local)
  with pytest.raises(ValueError):
    sta.aggregate(prev, {'a': np.zeros((3, 2)), 'b': np.zeros((2, 2))})
