"""Tests for fedjax_mtl.algorithms.plugin_math (FedDEA's plug-in bases and modules).

Every oracle is written here independently in NumPy float64 with plain loops,
following the papers / reference code the module docstring names, on a tiny
pytree of 2 leaves with K = 3 clients. The JAX side always runs under jit.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_mtl.algorithms import plugin_math as pm
from fedjax_mtl.models import decoder

K = 3
TOL = dict(rtol=1e-5, atol=1e-6)

_weighted = jax.jit(pm.weighted_update)
_nova = jax.jit(pm.fednova_update)
_dyn = functools.partial(jax.jit, static_argnames=('num_clients_total',))(pm.feddyn_server)
_dyn_pen = jax.jit(pm.feddyn_penalty)
_dyn_state = jax.jit(pm.feddyn_grad_state)
_moon = jax.jit(pm.moon_loss)
_ga = jax.jit(pm.fedga_weights)
_ga_step = functools.partial(jax.jit, static_argnames=('num_rounds',))(pm.fedga_step)
_acg = jax.jit(pm.fedacg_server)
_look = jax.jit(pm.fedacg_lookahead)
_acg_pen = jax.jit(pm.fedacg_penalty)
_pcgrad = jax.jit(pm.pcgrad)
_heal = jax.jit(pm.heal_aggregate)


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _stacked(rng: np.random.Generator, k: int = K, scale: float = 1.0) -> dict:
  """A stacked pytree of 2 leaves (10 values per row) with leading axis k."""
  f = lambda *s: (scale * rng.standard_normal((k, *s))).astype(np.float32)
  return {'w': f(2, 3), 'z': {'b': f(4)}}


def _single(rng: np.random.Generator, scale: float = 1.0) -> dict:
  return jax.tree.map(lambda x: x[0], _stacked(rng, 1, scale))


def _flat(tree) -> np.ndarray:
  """[K, D] float64 rows of a stacked tree (oracle side only)."""
  return np.concatenate([np.asarray(x, np.float64).reshape(x.shape[0], -1)
                         for x in jax.tree.leaves(tree)], axis=1)


def _flat1(tree) -> np.ndarray:
  """[D] float64 of an unstacked tree."""
  return np.concatenate([np.asarray(x, np.float64).reshape(-1) for x in jax.tree.leaves(tree)])


def _unflat1(vec: np.ndarray, like) -> dict:
  leaves, treedef = jax.tree.flatten(like)
  out, i = [], 0
  for x in leaves:
    n = int(np.prod(x.shape))
    out.append(vec[i:i + n].reshape(x.shape).astype(np.float32))
    i += n
  return jax.tree.unflatten(treedef, out)


def _unflat(rows: np.ndarray, like) -> dict:
  return jax.tree.map(lambda *xs: np.stack(xs), *[_unflat1(r, jax.tree.map(lambda x: x[0], like))
                                                  for r in rows])


def _close(got, want: np.ndarray, **tol):
  np.testing.assert_allclose(_flat1(got) if np.ndim(want) == 1 else _flat(got), want,
                             **(tol or TOL))


# ----------------------------------------------------------------------------
# FedAvg (the reference the reductions compare to) and FedNova
# ----------------------------------------------------------------------------


def test_weighted_update_matches_oracle_and_server_lr():
  rng = np.random.default_rng(0)
  prev, deltas = _single(rng), _stacked(rng)
  counts = np.array([5.0, 1.0, 2.0], np.float32)  # raw example counts
  p, d = _flat1(prev), _flat(deltas)
  w = counts / counts.sum()
  want = p + sum(w[k] * d[k] for k in range(K))
  _close(_weighted(prev, deltas, counts), want)
  want2 = p + 2.5 * sum(w[k] * d[k] for k in range(K))
  _close(_weighted(prev, deltas, counts, 2.5), want2)


def test_fednova_matches_oracle():
  rng = np.random.default_rng(1)
  prev, deltas = _single(rng), _stacked(rng)
  counts = np.array([3.0, 1.0, 4.0], np.float32)
  taus = np.array([10, 25, 4], np.int32)
  p, d = _flat1(prev), _flat(deltas)
  w = counts / counts.sum()
  tau_eff = sum(w[k] * taus[k] for k in range(K))
  want = p + tau_eff * sum(w[k] * d[k] / taus[k] for k in range(K))
  _close(_nova(prev, deltas, counts, taus), want)
  # A changed τ really changes the result (the normalisation is not a no-op).
  other = _flat1(_nova(prev, deltas, counts, np.array([10, 10, 4], np.int32)))
  assert np.max(np.abs(other - want)) > 1e-3


def test_fednova_equal_taus_is_fedavg():
  rng = np.random.default_rng(2)
  prev, deltas = _single(rng), _stacked(rng)
  counts = np.array([2.0, 7.0, 1.0], np.float32)
  got = _nova(prev, deltas, counts, np.full((K,), 17, np.int32))
  np.testing.assert_allclose(_flat1(got), _flat1(_weighted(prev, deltas, counts)), **TOL)


def test_fednova_zero_step_client_is_harmless():
  rng = np.random.default_rng(3)
  prev, deltas = _single(rng), _stacked(rng)
  deltas = jax.tree.map(lambda x: jnp.asarray(x).at[1].set(0.0), deltas)
  taus = np.array([5, 0, 5], np.int32)
  counts = np.ones((K,), np.float32)
  got = _flat1(_nova(prev, deltas, counts, taus))
  d = _flat(deltas)
  want = _flat1(prev) + (10 / 3) * (d[0] / 5 + d[2] / 5) / 3  # τ_eff = 10/3
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got, want, **TOL)


# ----------------------------------------------------------------------------
# FedDyn
# ----------------------------------------------------------------------------


def dyn_oracle(theta, locals_, h, alpha, m, w=None):
  """Acar et al. Alg. 1 server lines on float64 vectors (w: optional normalised weights)."""
  kk = len(locals_)
  w = np.full(kk, 1.0 / kk) if w is None else w
  h = h - alpha * (kk / m) * sum(w[k] * (locals_[k] - theta) for k in range(kk))
  theta = sum(w[k] * locals_[k] for k in range(kk)) - h / alpha
  return theta, h


@pytest.mark.parametrize('alpha,m', [(0.01, K), (0.1, 7)])
def test_feddyn_server_two_rounds_match_oracle(alpha, m):
  rng = np.random.default_rng(4)
  prev = _single(rng)
  h = pm.feddyn_init(prev)
  theta_o, h_o = _flat1(prev), np.zeros_like(_flat1(prev))
  for _ in range(2):
    deltas = _stacked(rng, scale=0.1)
    locals_o = [theta_o + r for r in _flat(deltas)]
    theta_o, h_o = dyn_oracle(theta_o, locals_o, h_o, alpha, m)
    prev, h = _dyn(prev, deltas, h, alpha, num_clients_total=m)
    # Float32 state carries the rounding of h / α; compare at that scale.
    np.testing.assert_allclose(_flat1(h), h_o, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(_flat1(prev), theta_o, rtol=1e-5, atol=1e-5)


def test_feddyn_server_weights():
  rng = np.random.default_rng(5)
  prev, deltas = _single(rng), _stacked(rng, scale=0.1)
  h = jax.tree.map(lambda x: x + 0.001, pm.feddyn_init(prev))
  counts = np.array([1.0, 2.0, 5.0], np.float32)
  theta_o, h_o = dyn_oracle(_flat1(prev), [_flat1(prev) + r for r in _flat(deltas)],
                            _flat1(h), 0.05, K, counts / counts.sum())
  new, new_h = _dyn(prev, deltas, h, 0.05, weights=counts)
  np.testing.assert_allclose(_flat1(new_h), h_o, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(_flat1(new), theta_o, rtol=1e-5, atol=1e-5)
  # Equal weights are the paper's uniform mean.
  eq, _ = _dyn(prev, deltas, h, 0.05, weights=np.ones((K,), np.float32))
  uni, _ = _dyn(prev, deltas, h, 0.05)
  np.testing.assert_allclose(_flat1(eq), _flat1(uni), **TOL)


def test_feddyn_client_penalty_and_state_match_oracle():
  rng = np.random.default_rng(6)
  params, start, g = _single(rng), _single(rng), _single(rng, 0.1)
  alpha = 0.01
  th, s, gv = _flat1(params), _flat1(start), _flat1(g)
  want = -gv @ th + 0.5 * alpha * np.sum((th - s) ** 2)
  np.testing.assert_allclose(float(_dyn_pen(params, start, g, alpha)), want, rtol=1e-5, atol=1e-6)
  grad = jax.jit(jax.grad(pm.feddyn_penalty))(params, start, g, alpha)
  np.testing.assert_allclose(_flat1(grad), -gv + alpha * (th - s), **TOL)
  _close(_dyn_state(g, params, start, alpha), gv - alpha * (th - s))


def test_feddyn_state_is_local_gradient_at_the_local_optimum():
  # L_k(θ) = ½‖θ − c‖²: after minimising L_k + penalty, the updated linear
  # state must equal ∇L_k(θ_k) = θ_k − c (FedDyn's first-order condition).
  rng = np.random.default_rng(7)
  c, start, g = _single(rng), _single(rng), _single(rng, 0.3)
  alpha = 0.5

  def objective(p):
    task = 0.5 * sum(jnp.sum(jnp.square(a - b)) for a, b in
                     zip(jax.tree.leaves(p), jax.tree.leaves(c)))
    return task + pm.feddyn_penalty(p, start, g, alpha)

  @jax.jit
  def solve(p):
    step = lambda _, q: jax.tree.map(lambda a, b: a - 0.5 * b, q, jax.grad(objective)(q))
    return jax.lax.fori_loop(0, 80, step, p)

  theta_k = solve(start)
  new_state = _dyn_state(g, theta_k, start, alpha)
  np.testing.assert_allclose(_flat1(new_state), _flat1(theta_k) - _flat1(c), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------
# MOON
# ----------------------------------------------------------------------------


def moon_oracle(z, zg, zps, mu, tau):
  def cos(a, b):
    return a @ b / (max(np.linalg.norm(a), 1e-8) * max(np.linalg.norm(b), 1e-8))
  total = 0.0
  for i in range(z.shape[0]):
    pos = np.exp(cos(z[i], zg[i]) / tau)
    neg = sum(np.exp(cos(z[i], zp[i]) / tau) for zp in zps)
    total += -np.log(pos / (pos + neg))
  return mu * total / z.shape[0]


def test_moon_loss_matches_oracle():
  rng = np.random.default_rng(8)
  z, zg, zp, zp2 = (rng.standard_normal((4, 6)).astype(np.float32) for _ in range(4))
  f64 = lambda a: np.asarray(a, np.float64)
  np.testing.assert_allclose(float(_moon(z, zg, zp, 1.0, 0.5)),
                             moon_oracle(f64(z), f64(zg), [f64(zp)], 1.0, 0.5), rtol=1e-5)
  np.testing.assert_allclose(float(_moon(z, zg, zp, 2.0, 0.1)),
                             moon_oracle(f64(z), f64(zg), [f64(zp)], 2.0, 0.1), rtol=1e-5)
  stacked_prev = np.stack([zp, zp2])
  np.testing.assert_allclose(float(_moon(z, zg, stacked_prev, 1.0, 0.5)),
                             moon_oracle(f64(z), f64(zg), [f64(zp), f64(zp2)], 1.0, 0.5),
                             rtol=1e-5)


def test_moon_loss_gradient_only_to_the_local_representation():
  rng = np.random.default_rng(9)
  z, zg, zp = (rng.standard_normal((3, 5)).astype(np.float32) for _ in range(3))
  gz, gg, gp = jax.jit(jax.grad(pm.moon_loss, argnums=(0, 1, 2)))(z, zg, zp)
  assert np.max(np.abs(np.asarray(gz))) > 1e-3
  assert not np.any(np.asarray(gg)) and not np.any(np.asarray(gp))
  # Pulling z toward z_glob (away from z_prev) lowers the loss.
  closer = z + 0.5 * (zg - z)
  assert float(_moon(closer, zg, zp)) < float(_moon(z, zg, zp))


# ----------------------------------------------------------------------------
# FedBN
# ----------------------------------------------------------------------------


def test_bn_mask_on_the_project_decoder():
  feats = [jax.ShapeDtypeStruct((1, 8 // 2**s, 8 // 2**s, 4 * 2**s), jnp.float32) for s in range(4)]
  shapes = jax.eval_shape(decoder.Decoder(4).init, jax.random.key(0), feats)
  params, stats = {'decoders': shapes['params']}, {'decoders': shapes['batch_stats']}
  want = {"['decoders']['fuse_bn']['bias']", "['decoders']['fuse_bn']['scale']"}
  for mask in (pm.bn_mask(params), pm.bn_mask(params, stats)):
    flagged = {jax.tree_util.keystr(p) for p, m in jax.tree_util.tree_leaves_with_path(mask) if m}
    assert flagged == want


def test_bn_mask_from_batch_stats_needs_no_naming_convention():
  # A torchvision-style block: 'downsample_1' is a BatchNorm, 'downsample_0' a conv.
  z = np.zeros((K, 2), np.float32)  # stacked leaves work the same
  params = {'layer1_0': {'conv1': {'kernel': z}, 'bn1': {'scale': z, 'bias': z},
                         'downsample_0': {'kernel': z},
                         'downsample_1': {'scale': z, 'bias': z}}}
  stats = {'layer1_0': {'bn1': {'mean': z, 'var': z}, 'downsample_1': {'mean': z, 'var': z}}}
  mask = pm.bn_mask(params, stats)
  flagged = {jax.tree_util.keystr(p) for p, m in jax.tree_util.tree_leaves_with_path(mask) if m}
  assert flagged == {"['layer1_0']['bn1']['bias']", "['layer1_0']['bn1']['scale']",
                     "['layer1_0']['downsample_1']['bias']",
                     "['layer1_0']['downsample_1']['scale']"}
  assert not pm.bn_mask(params)['layer1_0']['downsample_1']['scale']  # names alone miss it


@pytest.mark.parametrize('name,is_bn', [
    ('BatchNorm_0', True), ('BatchNorm', True), ('bn1', True), ('bn', True),
    ('fuse_bn', True), ('layer1_bn_2', True), ('batch_norm', True),
    ('LayerNorm_0', False), ('norm0', False), ('patch_norm', False), ('abnormal', False),
    ('bnx', False), ('kernel', False),
])
def test_bn_mask_names(name, is_bn):
  tree = {'enc': {name: {'scale': np.zeros(2)}}, 'other': {'kernel': np.zeros(2)}}
  mask = pm.bn_mask(tree)
  assert mask['enc'][name]['scale'] is is_bn
  assert mask['other']['kernel'] is False


def test_keep_local():
  rng = np.random.default_rng(10)
  agg, local = _stacked(rng), _stacked(rng)
  mask = {'w': False, 'z': {'b': True}}
  out = jax.jit(lambda a, l: pm.keep_local(a, l, mask))(agg, local)
  np.testing.assert_array_equal(out['w'], agg['w'])
  np.testing.assert_array_equal(out['z']['b'], local['z']['b'])


# ----------------------------------------------------------------------------
# FedGA (FedDG-GA)
# ----------------------------------------------------------------------------


def ga_oracle(weight_dict: dict, before: dict, after: dict, step_size: float) -> dict:
  """FedDG-GA's refine_weight_dict_by_GA + weight_clip (loss metric), with 1/K for its 1/3."""
  value = np.array([after[s] - before[s] for s in before])
  step = step_size / len(weight_dict)
  norm_gap = value / np.max(np.abs(value))
  out = {}
  for i, s in enumerate(weight_dict):
    out[s] = float(np.clip(weight_dict[s] + norm_gap[i] * step, 0.0, 1.0))
  total = sum(out.values())
  return {s: v / total for s, v in out.items()}


def test_fedga_weights_match_oracle_over_rounds():
  rng = np.random.default_rng(11)
  sites = ['a', 'b', 'c']
  w_o = {s: 1 / 3 for s in sites}
  w = jnp.full((K,), 1 / 3, jnp.float32)
  rounds = 5
  for r in range(rounds):
    before = {s: float(rng.uniform(0.2, 1.0)) for s in sites}
    after = {s: before[s] + float(rng.normal(0, 0.3)) for s in sites}
    step = 0.2 * (1 - r / rounds)
    w_o = ga_oracle(w_o, before, after, step)
    gaps = np.array([after[s] - before[s] for s in sites], np.float32)
    w = _ga(w, gaps, _ga_step(r, num_rounds=rounds))
    np.testing.assert_allclose(np.asarray(w), [w_o[s] for s in sites], rtol=1e-5, atol=1e-7)
  assert abs(float(jnp.sum(w)) - 1.0) < 1e-6


def test_fedga_weights_clip_and_direction():
  w = jnp.array([0.02, 0.49, 0.49], jnp.float32)
  gaps = np.array([-1.0, 0.5, 0.0], np.float32)  # client 0 pushed below 0 -> clipped
  got = np.asarray(_ga(w, gaps, 0.3))
  raw = np.clip(np.array([0.02, 0.49, 0.49]) + np.array([-1.0, 0.5, 0.0]) * 0.1, 0, 1)
  np.testing.assert_allclose(got, raw / raw.sum(), rtol=1e-6)
  assert got[0] == 0.0 and got[1] > 0.49  # larger gap -> larger weight
  # No gap: unchanged.
  np.testing.assert_allclose(np.asarray(_ga(w, np.zeros(K, np.float32), 0.3)), w, rtol=1e-6)


def test_fedga_step_decays_linearly():
  got = [float(_ga_step(r, num_rounds=4, step_size=0.2)) for r in range(5)]
  np.testing.assert_allclose(got, [0.2, 0.15, 0.1, 0.05, 0.0], atol=1e-7)


# ----------------------------------------------------------------------------
# FedACG
# ----------------------------------------------------------------------------


def test_fedacg_three_rounds_match_oracle():
  rng = np.random.default_rng(12)
  lam = 0.85
  theta = _single(rng)
  m = pm.fedacg_init(theta)
  th_o, m_o = _flat1(theta), np.zeros_like(_flat1(theta))
  counts = np.array([1.0, 3.0, 2.0], np.float32)
  w = counts / counts.sum()
  for _ in range(3):
    look_o = th_o + lam * m_o
    look = _look(theta, m, lam)
    np.testing.assert_allclose(_flat1(look), look_o, **TOL)
    deltas = _stacked(rng, scale=0.1)  # θ_k − θ̃
    d = _flat(deltas)
    mean = sum(w[k] * d[k] for k in range(K))
    m_o = lam * m_o + mean
    th_o = th_o + m_o
    theta, m = _acg(theta, deltas, counts, m, lam)
    _close(m, m_o)
    _close(theta, th_o)
    # θ^t is the weighted mean of the local models θ̃ + Δ_k (the reference's form).
    _close(theta, look_o + mean)


def test_fedacg_lambda_zero_is_fedavg():
  rng = np.random.default_rng(13)
  prev, deltas = _single(rng), _stacked(rng)
  m = _single(rng)  # any momentum: λ = 0 must ignore it
  counts = np.array([4.0, 1.0, 1.0], np.float32)
  new, _ = _acg(prev, deltas, counts, m, 0.0)
  np.testing.assert_allclose(_flat1(new), _flat1(_weighted(prev, deltas, counts)), **TOL)
  np.testing.assert_allclose(_flat1(_look(prev, m, 0.0)), _flat1(prev), **TOL)


def test_fedacg_penalty():
  rng = np.random.default_rng(14)
  p, look = _single(rng), _single(rng)
  want = 0.5 * 2e-3 * np.sum((_flat1(p) - _flat1(look)) ** 2)
  np.testing.assert_allclose(float(_acg_pen(p, look)), want, rtol=1e-5)
  assert pm.FEDACG_LAMBDA == 0.85


# ----------------------------------------------------------------------------
# PCGrad
# ----------------------------------------------------------------------------


def pcgrad_oracle(g: np.ndarray, order: np.ndarray) -> np.ndarray:
  out = []
  for k in range(g.shape[0]):
    gk = g[k].copy()
    for j in order[k]:
      if j == k:
        continue
      dot = gk @ g[j]
      if dot < 0:
        gk = gk - dot / (g[j] @ g[j]) * g[j]
    out.append(gk)
  return np.stack(out)


def _conflicting(rng) -> dict:
  # Client 1 points partly against client 0; client 2 is random.
  a = rng.standard_normal(10)
  rows = np.stack([a, -0.8 * a + 0.5 * rng.standard_normal(10), rng.standard_normal(10)])
  like = _stacked(rng)
  return _unflat(rows, like)


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_pcgrad_matches_oracle(seed):
  rng = np.random.default_rng(20 + seed)
  deltas = _conflicting(rng)
  key = jax.random.key(seed)
  order = np.asarray(pm.pcgrad_order(key, K))
  for row in order:
    assert sorted(row.tolist()) == list(range(K))
  got = _pcgrad(deltas, key)
  g = _flat(deltas)
  want = pcgrad_oracle(g, order)
  assert np.max(np.abs(want - g)) > 1e-2  # some projection happened
  np.testing.assert_allclose(_flat(got), want, rtol=1e-5, atol=1e-5)


def test_pcgrad_order_changes_with_key_and_matters():
  rng = np.random.default_rng(30)
  g = rng.standard_normal((K, 10))
  g[1] = -0.7 * g[0] + 0.3 * rng.standard_normal(10)
  g[2] = -0.6 * g[0] - 0.2 * g[1] + 0.3 * rng.standard_normal(10)
  deltas = _unflat(g, _stacked(rng))
  orders = {tuple(map(tuple, np.asarray(pm.pcgrad_order(jax.random.key(s), K)))) for s in range(8)}
  assert len(orders) > 1
  results = [_flat(_pcgrad(deltas, jax.random.key(s))) for s in range(8)]
  for s, r in enumerate(results):
    np.testing.assert_allclose(
        r, pcgrad_oracle(_flat(deltas), np.asarray(pm.pcgrad_order(jax.random.key(s), K))),
        rtol=1e-5, atol=1e-5)


def test_pcgrad_leaves_non_conflicting_updates_unchanged():
  rng = np.random.default_rng(31)
  base = np.abs(rng.standard_normal((K, 10))) + 0.1  # all positive: pairwise dots > 0
  deltas = _unflat(base, _stacked(rng))
  got = _pcgrad(deltas, jax.random.key(3))
  np.testing.assert_allclose(_flat(got), _flat(deltas), rtol=0, atol=0)


def test_pcgrad_two_clients_removes_the_conflict():
  rng = np.random.default_rng(32)
  a = rng.standard_normal(10)
  g = np.stack([a, -a + 0.1 * rng.standard_normal(10)])
  deltas = _unflat(g, _stacked(rng, k=2))
  got = _flat(_pcgrad(deltas, jax.random.key(0)))
  # Each projected update is orthogonal to the other original update.
  assert abs(got[0] @ g[1]) < 1e-4 and abs(got[1] @ g[0]) < 1e-4
  assert got[0] @ g[1] > -1e-4


# ----------------------------------------------------------------------------
# FedHEAL
# ----------------------------------------------------------------------------


class HealOracle:
  """FedHEAL's consistency_mask / compute_distance / get_params_diff_weights /
  aggregate_nets_parameter on lists of float64 leaves (full participation)."""

  def __init__(self, k: int, tau: float, beta: float):
    self.k, self.tau, self.beta = k, tau, beta
    self.epoch = 0
    self.hist = {}
    self.prev_w, self.prev_d = {}, {}

  def round(self, theta: list, deltas: list):  # deltas[i]: list of leaves of client i
    masks, upd, dist = {}, {}, {}
    for i in range(self.k):
      u = [-d for d in deltas[i]]  # update_diff = global - local
      if self.epoch == 0:
        self.hist[i] = [(x >= 0).astype(np.float64) for x in u]
        masks[i] = [np.ones_like(x) for x in u]
      else:
        masks[i] = []
        for l, x in enumerate(u):
          h = self.hist[i][l]
          cons = np.where(x >= 0, h, 1 - h)
          masks[i].append((cons > self.tau).astype(np.float64))
        for l, x in enumerate(u):
          self.hist[i][l] = (self.hist[i][l] * self.epoch + (x >= 0)) / (self.epoch + 1)
      upd[i] = [x * m for x, m in zip(u, masks[i])]
      dist[i] = sum(np.linalg.norm(x) for x in upd[i])
    weight = {}
    for i in range(self.k):
      dw = (1 - self.beta) * self.prev_d.get(i, 0) + self.beta * dist[i] / sum(dist.values())
      nw = self.prev_w.get(i, 1 / self.k) + dw
      weight[i] = nw
      self.prev_w[i], self.prev_d[i] = nw, dw
    total = sum(weight.values())
    freq = {i: weight[i] / total for i in range(self.k)}
    new = []
    for l, t in enumerate(theta):
      adj = np.stack([freq[i] * masks[i][l] for i in range(self.k)])
      tot = adj.sum(0)
      out = t.copy()
      for i in range(self.k):
        wp = np.where(tot == 0, freq[i], adj[i] / np.where(tot == 0, 1, tot))
        out = out - upd[i][l] * wp
      new.append(out)
    self.epoch += 1
    return new, freq, masks


def _leaves64(tree):
  return [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]


def test_heal_four_rounds_match_oracle():
  rng = np.random.default_rng(40)
  prev = _single(rng)
  state = pm.heal_init(_stacked(rng))
  oracle = HealOracle(K, 0.3, 0.4)
  theta_o = _leaves64(prev)
  saw_partial_mask = False
  for _ in range(4):
    deltas = _stacked(rng, scale=0.1)
    d_leaves = _leaves64(deltas)
    theta_o, freq, masks = oracle.round(theta_o, [[x[i] for x in d_leaves] for i in range(K)])
    prev, state, aux = _heal(state, prev, deltas, 0.3, 0.4)
    np.testing.assert_allclose(np.asarray(aux['weights']), [freq[i] for i in range(K)], **TOL)
    for l, m in enumerate(jax.tree.leaves(aux['masks'])):
      np.testing.assert_array_equal(np.asarray(m), np.stack([masks[i][l] for i in range(K)]))
      saw_partial_mask |= bool(0 < np.asarray(m).mean() < 1)
    for got, want in zip(jax.tree.leaves(prev), theta_o):
      np.testing.assert_allclose(np.asarray(got), want, **TOL)
    for l, h in enumerate(jax.tree.leaves(state.history)):
      np.testing.assert_allclose(np.asarray(h), np.stack([oracle.hist[i][l] for i in range(K)]),
                                 **TOL)
  assert saw_partial_mask
  assert np.all(np.asarray(state.count) == 4)


def test_heal_over_participants_runs_fedheal_over_its_online_clients():
  """FedHEAL with some clients sitting out (`valid`): an oracle that runs FedHEAL's
  rules over the round's participants only, each client's history averaged over the
  rounds it took part in, its first round unmasked (client 2 first takes part in
  round 3), weights momentum-updated and normalised over the participants; the
  clients that sat out keep their history, weight and momentum."""
  k, tau, beta = 4, 0.3, 0.4
  rng = np.random.default_rng(42)
  prev = _single(rng)
  state = pm.heal_init(_stacked(rng, k))
  theta = _leaves64(prev)
  hist, seen, w, dw = {}, np.zeros(k, int), np.full(k, 1 / k), np.zeros(k)
  valids = [[1, 1, 0, 1], [0, 1, 0, 1], [1, 0, 1, 1], [1, 1, 1, 0]]
  for valid in map(np.asarray, valids):
    valid = valid.astype(bool)
    deltas = jax.tree.map(lambda x: x * valid.reshape((-1,) + (1,) * (x.ndim - 1)),
                          _stacked(rng, k, scale=0.1))
    d = _leaves64(deltas)
    on = np.flatnonzero(valid)
    masks, upd, dist = {}, {}, {}
    for i in on:
      u = [-x[i] for x in d]
      if seen[i] == 0:
        hist[i] = [(x >= 0).astype(np.float64) for x in u]
        masks[i] = [np.ones_like(x) for x in u]
      else:
        masks[i] = [(np.where(x >= 0, h, 1 - h) > tau).astype(np.float64)
                    for x, h in zip(u, hist[i])]
        hist[i] = [(h * seen[i] + (x >= 0)) / (seen[i] + 1) for x, h in zip(u, hist[i])]
      upd[i] = [x * m for x, m in zip(u, masks[i])]
      dist[i] = sum(np.linalg.norm(x) for x in upd[i])
    for i in on:
      dw[i] = (1 - beta) * dw[i] + beta * dist[i] / sum(dist.values())
      w[i] = w[i] + dw[i]
    freq = {i: w[i] / w[on].sum() for i in on}
    for l, t in enumerate(theta):
      adj = {i: freq[i] * masks[i][l] for i in on}
      tot = sum(adj.values())
      for i in on:
        t = t - upd[i][l] * np.where(tot == 0, freq[i], adj[i] / np.where(tot == 0, 1, tot))
      theta[l] = t
    seen += valid
    terms, state, aux = jax.jit(pm.heal_terms)(state, deltas, tau, beta, jnp.asarray(valid))
    got = [p + np.sum(np.asarray(x, np.float64), 0) for p, x in zip(_leaves64(prev), jax.tree.leaves(terms))]
    prev = jax.tree.unflatten(jax.tree.structure(prev), [g.astype(np.float32) for g in got])
    for g, want in zip(got, theta):
      np.testing.assert_allclose(g, want, **TOL)
    np.testing.assert_allclose(np.asarray(aux['weights']),
                               [freq.get(i, 0.) for i in range(k)], **TOL)
    np.testing.assert_array_equal(np.asarray(state.count), seen)
    np.testing.assert_allclose(np.asarray(state.weights), w, **TOL)
    for i in range(k):
      if i in hist:
        for h, want in zip([x[i] for x in jax.tree.leaves(state.history)], hist[i]):
          np.testing.assert_allclose(np.asarray(h), want, **TOL)


def test_heal_first_round_is_weighted_averaging():
  rng = np.random.default_rng(41)
  prev, deltas = _single(rng), _stacked(rng)
  counts = np.array([1.0, 2.0, 3.0], np.float32)
  # β = 0: the client weights stay at their initial values, so round 1 (all-ones
  # masks) is plain weighted averaging with those weights.
  new, _, aux = _heal(pm.heal_init(deltas, counts), prev, deltas, 0.3, 0.0)
  assert all(np.all(np.asarray(m) == 1) for m in jax.tree.leaves(aux['masks']))
  np.testing.assert_allclose(_flat1(new), _flat1(_weighted(prev, deltas, counts)), **TOL)
  # Any β: still the weighted average, with the momentum-updated weights p.
  new, _, aux = _heal(pm.heal_init(deltas), prev, deltas, 0.3, 0.4)
  np.testing.assert_allclose(_flat1(new), _flat1(_weighted(prev, deltas, aux['weights'])), **TOL)
  assert abs(float(jnp.sum(aux['weights'])) - 1) < 1e-6


def test_heal_coordinate_kept_by_no_client_stays():
  rng = np.random.default_rng(42)
  prev = _single(rng)
  d1 = _stacked(rng)
  _, state, _ = _heal(pm.heal_init(d1), prev, d1, 0.3, 0.4)
  # Round 2: every client flips the sign of coordinate w[0, 0] (consistency 0
  # -> no client keeps it) and keeps the sign elsewhere (all kept).
  d2 = jax.tree.map(lambda x: 2.0 * x, d1)
  d2['w'] = jnp.asarray(d2['w']).at[:, 0, 0].multiply(-1.0)
  new, _, aux = _heal(state, prev, d2, 0.3, 0.4)
  assert not np.any(np.asarray(aux['masks']['w'])[:, 0, 0])
  assert np.asarray(new['w'])[0, 0] == np.asarray(prev['w'])[0, 0]
  # Every other coordinate: kept by all, so the p-weighted average.
  avg = _weighted(prev, d2, aux['weights'])
  np.testing.assert_allclose(np.asarray(new['w']).reshape(-1)[1:],
                             np.asarray(avg['w']).reshape(-1)[1:], **TOL)
  np.testing.assert_allclose(np.asarray(new['z']['b']), np.asarray(avg['z']['b']), **TOL)


def test_bf16_params_keep_dtype():
  rng = np.random.default_rng(50)
  prev = jax.tree.map(lambda x: x.astype(jnp.bfloat16), _single(rng))
  deltas = _stacked(rng, scale=0.1)
  counts = np.ones((K,), np.float32)
  outs = [_weighted(prev, deltas, counts), _nova(prev, deltas, counts, np.ones(K, np.int32)),
          _acg(prev, deltas, counts, pm.fedacg_init(prev))[0],
          _dyn(prev, deltas, pm.feddyn_init(prev))[0],
          _heal(pm.heal_init(deltas), prev, deltas)[0]]
  for out in outs:
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(out))
