"""Tests for fedjax_mtl.algorithms.hca2_math (FedHCA² aggregation math)."""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

from fedjax_mtl.algorithms import hca2_math as h
from fedjax_mtl.algorithms import rows as row_lib
from fedjax_mtl.federation import consecutive_group_ids

C = 0.4

# jit once per shape and reuse (c is a traced argument, so one compile per N).
_solve = jax.jit(h.solve_ca_dual)


@functools.partial(jax.jit, static_argnames=("rescale",))
def _ca(deltas, c, rescale=True):
  return h.conflict_averse(deltas, c, rescale=rescale, return_aux=True)


# ----------------------------------------------------------------------------
# float64 references
# ----------------------------------------------------------------------------


def released_objective(a: np.ndarray, c: float):
  """The released objective exactly as in the FedHCA² code, in float64."""
  n = a.shape[0]
  b = np.ones(n) / n
  sqrt_phi = c * np.sqrt(a.mean() + 1e-8) + 1e-8
  return lambda x: x @ a @ b + sqrt_phi * np.sqrt(x @ a @ x + 1e-8)


def slsqp_released(a: np.ndarray, c: float) -> np.ndarray:
  """scipy.optimize.minimize exactly as the released code calls it (SLSQP, defaults)."""
  n = a.shape[0]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    res = so.minimize(
        released_objective(a, c),
        np.ones(n) / n,
        bounds=[(0, 1)] * n,
        constraints={"type": "eq", "fun": lambda x: np.sum(x) - 1},
        method="SLSQP",
    )
  return res.x


def _scaled_problem(a: np.ndarray, c: float):
  # Exact rescaling of the released objective (see solve_ca_dual docstring).
  n = a.shape[0]
  t = np.trace(a) / n
  an, e = a / t, 1e-8 / t
  s = (c * np.sqrt(a.mean() + 1e-8) + 1e-8) / np.sqrt(t)
  ab = an.mean(axis=1)
  f = lambda x: x @ ab + s * np.sqrt(x @ an @ x + e)
  g = lambda x: ab + s * (an @ x) / np.sqrt(x @ an @ x + e)
  return f, g


def tight_references(a: np.ndarray, c: float) -> list[np.ndarray]:
  """High-precision float64 solutions: SLSQP (ftol 1e-16) and trust-constr on the scaled problem."""
  n = a.shape[0]
  f, g = _scaled_problem(a, c)
  x0 = np.ones(n) / n
  out = []
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    r = so.minimize(
        f, x0, jac=g, method="SLSQP", bounds=[(0, 1)] * n,
        constraints={"type": "eq", "fun": lambda x: x.sum() - 1, "jac": lambda x: np.ones(n)},
        options={"ftol": 1e-16, "maxiter": 2000},
    )
    out.append(r.x)
    r = so.minimize(
        f, x0, jac=g, method="trust-constr", bounds=so.Bounds(0, 1),
        constraints=so.LinearConstraint(np.ones((1, n)), 1, 1),
        options={"gtol": 1e-14, "xtol": 1e-14, "maxiter": 3000},
    )
    out.append(r.x)
  fixed = []
  for x in out:
    x = np.clip(x, 0, None)
    fixed.append(x / x.sum())
  return fixed


def ours(a: np.ndarray, c: float) -> np.ndarray:
  w = np.asarray(_solve(jnp.asarray(a, jnp.float32), c), np.float64)
  w = np.clip(w, 0, None)
  return w / w.sum()  # float32 rounding of Σw; evaluated in float64 below


def ca_update_np(x: np.ndarray, w: np.ndarray, c: float, rescale: bool = True) -> np.ndarray:
  """Released get_ca_delta in float64 given dual weights w (x: [N, d])."""
  a = x @ x.T
  g0 = x.mean(0)
  sqrt_phi = c * np.sqrt(a.mean() + 1e-8) + 1e-8
  gw = w @ x
  g = g0 + sqrt_phi / (np.linalg.norm(gw) + 1e-8) * gw
  return g / (1 + c**2) if rescale else g


def make_updates(rng, n, d, lo=-1.0, hi=1.0, common=True):
  """Random client updates with norms 10^U(lo, hi); optional shared (possibly opposed) direction."""
  norms = 10 ** rng.uniform(lo, hi, n)
  x = rng.standard_normal((n, d))
  if common:
    direction = rng.standard_normal(d)
    x = x * rng.uniform(0.2, 1.5, (n, 1)) + rng.uniform(-1.0, 2.0, n)[:, None] * direction
  return x / np.linalg.norm(x, axis=1, keepdims=True) * norms[:, None]


def as_tree(x: np.ndarray) -> dict:
  """Split [N, d] rows into a nested dict pytree (tests the leaf-wise reductions)."""
  n, d = x.shape
  k = d // 3
  return {
      "enc": {"w": jnp.asarray(x[:, :k].reshape(n, k, 1), jnp.float32)},
      "b": jnp.asarray(x[:, k:], jnp.float32),
  }


def tree_to_np(t) -> np.ndarray:
  """Unstacked pytree from as_tree structure -> flat float64 vector (same order)."""
  return np.concatenate([np.asarray(t["enc"]["w"], np.float64).ravel(), np.asarray(t["b"], np.float64).ravel()])


def rel_gap(f_ours: float, f_ref: float) -> float:
  return (f_ours - f_ref) / abs(f_ref)


# ----------------------------------------------------------------------------
# Gram / solver
# ----------------------------------------------------------------------------


def test_gram_matches_numpy_on_nested_pytree():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((5, 301))
  a = np.asarray(jax.jit(h.gram)(as_tree(x)))
  np.testing.assert_allclose(a, x @ x.T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("n", [6, 17])  # pairwise row reductions / one dot per chunk
def test_delta_gram_chunked_pass_matches_numpy(n):
  # Leaf sizes reach every path: the large-chunk loop with an exact split, the
  # small-chunk loop with a tail, and a single block.
  rng = np.random.default_rng(1)
  sizes = {"big": 2 * row_lib.GRAM_CHUNK + 7 * 1024, "mid": 3 * row_lib.GRAM_CHUNK_SMALL + 11,
           "small": 37}
  assert row_lib.chunking(sizes["mid"], row_lib.GRAM_CHUNK_SMALL)[0] * 3 != sizes["mid"]  # has a tail
  local = {k: rng.standard_normal((n, d)).astype(np.float32) for k, d in sizes.items()}
  prev = {k: (v + 0.01 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in local.items()}
  probe = {k: rng.standard_normal(d).astype(np.float32) for k, d in sizes.items()}
  mix = rng.standard_normal((2, n)).astype(np.float32)
  f = jax.jit(h.delta_gram)
  delta = np.concatenate([local[k].astype(np.float64) - prev[k] for k in sorted(sizes)], 1)
  v = np.concatenate([probe[k].astype(np.float64) for k in sorted(sizes)])
  # float32 accumulation: errors relative to the norms, not to each (near-zero) entry.
  close = lambda got, want, scale: np.testing.assert_allclose(
      np.asarray(got), want, rtol=2e-5, atol=2e-6 * scale)
  a, dots = f(local, prev, probe)
  gram = delta @ delta.T
  close(a, gram, gram.max())
  close(dots, delta @ v, np.sqrt(gram.max() * (v @ v)))
  m, none = f(local, prev, None, mix)
  assert none is None
  rows = mix.astype(np.float64) @ delta
  close(m, rows @ rows.T, (rows * rows).sum(1).max())


def test_packed_indices_fill_the_budget_with_the_smallest_leaves(monkeypatch):
  monkeypatch.setattr(row_lib, "PACK_MAX_COLUMNS", 100)
  monkeypatch.setattr(row_lib, "PACK_WIDE_COLUMNS", 1000)
  monkeypatch.setattr(row_lib, "PACK_BUDGET_COLUMNS", 900)
  cols = [50, 700, 99, 300, 5000, 400, 200]
  # every leaf under 100 (149 columns), then 200, 300 (649); 400 would pass 900
  assert row_lib.packed_indices(cols) == [0, 2, 3, 6]
  monkeypatch.setattr(row_lib, "PACK_BUDGET_COLUMNS", 0)  # the small ones whatever the budget
  assert row_lib.packed_indices(cols) == [0, 2]


def test_packed_small_leaves_give_the_per_leaf_result(monkeypatch):
  # The Gram pass, ‖g_w‖ and Ũ over packed small leaves (one operand) equal the
  # same computed leaf by leaf; rows in two Blocks parts, a bfloat16 leaf, a
  # leaf large enough to stay on its own.
  rng = np.random.default_rng(3)
  shapes = {"big": (row_lib.PACK_WIDE_COLUMNS + 5,), "mid": (row_lib.PACK_MAX_COLUMNS + 3,),
            "w": (7, 3), "b": (11,), "half": (4, 5), "s": ()}
  def tree(n, scale=1.0):
    t = {k: (scale * rng.standard_normal((n,) + s)).astype(np.float32) for k, s in shapes.items()}
    t["half"] = jnp.asarray(t["half"], jnp.bfloat16)
    return t
  local = [tree(2), tree(3)]
  prev = [jax.tree.map(lambda x: x + 0.1 * jnp.ones_like(x), t) for t in local]
  probe = jax.tree.map(lambda x: jnp.asarray(x[0], jnp.float32), tree(1))
  def run():
    f = jax.jit(lambda lo, pr, pb: h.conflict_averse_from(
        row_lib.Blocks(tuple(lo)), row_lib.Blocks(tuple(pr)), c=0.4, probe=pb,
        diagnostics=False))
    return f(local, prev, probe)
  def groups():
    return sorted(len(i) for i in row_lib.pack_small(
        row_lib.row_leaves(row_lib.Blocks(tuple(local))), [None] * 6, [None] * 6).leaves)
  assert groups() == [1, 5]  # "big" alone, the rest ("mid" within the budget) packed
  u, aux = run()
  monkeypatch.setattr(row_lib, "PACK_BUDGET_COLUMNS", 0)  # only the leaves under 4,096
  assert groups() == [1, 1, 4]
  u1, aux1 = run()
  monkeypatch.setattr(row_lib, "PACK_MAX_COLUMNS", 0)  # every leaf on its own
  assert groups() == [1] * 6
  u0, aux0 = run()
  for got, want in zip(jax.tree.leaves((u1, aux1)), jax.tree.leaves((u, aux))):
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=1e-5, atol=1e-6)
  assert jax.tree.map(lambda x: (x.shape, x.dtype), u) == jax.tree.map(
      lambda x: (x.shape, x.dtype), u0)
  for got, want in zip(jax.tree.leaves(u), jax.tree.leaves(u0)):
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=1e-5, atol=1e-6)
  for k in ("w", "gram", "probe_dots", "gw_norm"):
    np.testing.assert_allclose(np.asarray(aux[k]), np.asarray(aux0[k]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [2, 5, 6, 12, 24])
def test_solver_matches_slsqp_realistic_scale(n):
  # Runs through conflict_averse (float32 Gram of a pytree, in-graph solver); the
  # objective is evaluated in float64 on the exact Gram matrix.
  rng = np.random.default_rng(100 + n)
  for common in (True, False):
    x = make_updates(rng, n, 10_000, -1, 1, common=common)
    a = x @ x.T
    f = released_objective(a, C)
    u, aux = _ca(as_tree(x), C)
    w = np.clip(np.asarray(aux["w"], np.float64), 0, None)
    w /= w.sum()
    f_ours = f(w)
    f_slsqp = f(slsqp_released(a, C))
    refs = tight_references(a, C)
    f_best = min([f_slsqp, f_ours] + [f(r) for r in refs])
    # At least as good as the released SLSQP, and at the best known optimum.
    assert f_ours <= f_slsqp + 1e-6 * abs(f_slsqp)
    assert rel_gap(f_ours, f_best) <= 1e-6
    np.testing.assert_allclose(float(aux["objective"]), f_ours, rtol=1e-5)
    # Ũ vs the float64 released update at the best reference solution.
    w_best = min(refs + [w], key=f)
    u_ref = ca_update_np(x, w_best, C)
    assert np.linalg.norm(tree_to_np(u) - u_ref) <= 1e-4 * np.linalg.norm(u_ref)


@pytest.mark.parametrize("lo,hi", [(-3.3, -2.7), (-5.0, -4.0)])
def test_solver_small_scale_beats_slsqp(lo, hi):
  # Objective ~1e-4..1e-8: SLSQP's absolute ftol=1e-6 makes it stop early.
  rng = np.random.default_rng(7)
  for n in (6, 12, 24):
    x = make_updates(rng, n, 2_000, lo, hi)
    a = x @ x.T
    f = released_objective(a, C)
    f_ours = f(ours(a, C))
    f_slsqp = f(slsqp_released(a, C))
    assert f_ours <= f_slsqp + 1e-9 * abs(f_slsqp)
    f_best = min([f_ours] + [f(r) for r in tight_references(a, C)])
    assert rel_gap(f_ours, f_best) <= 1e-6


def _adversarial_cases():
  rng = np.random.default_rng(1)
  cases = []
  for n in (6, 24):
    base = rng.standard_normal(2_000)
    cases.append(("collinear", base + 1e-3 * rng.standard_normal((n, 2_000)), C))
    x = 0.1 * rng.standard_normal((n, 2_000))
    x[::2] += base
    x[1::2] -= base * rng.uniform(0.5, 1.5, (n // 2, 1))
    cases.append(("conflict", x, C))
    x = make_updates(rng, n, 2_000)
    x[1::2] = x[::2]
    cases.append(("duplicates", x, C))
    cases.append(("huge", make_updates(rng, n, 2_000, 2, 4), C))
    cases.append(("mixed_norms", make_updates(rng, n, 2_000, -3, 1, common=False), 0.9))
    cases.append(("rank_deficient", make_updates(rng, n, 5, -1, 1), 0.9))
  return cases


def test_solver_adversarial_gram_matrices():
  for name, x, c in _adversarial_cases():
    a = x @ x.T
    f = released_objective(a, c)
    f_ours = f(ours(a, c))
    f_best = min([f_ours, f(slsqp_released(a, c))] + [f(r) for r in tight_references(a, c)])
    gap = rel_gap(f_ours, f_best)
    assert gap <= 1e-6, (name, x.shape, gap)


def two_client_closed_form(a: np.ndarray, c: float) -> float:
  """Exact w1* for N = 2 (float64).

  With u = w1 Δ1 + (1-w1) Δ2, κ = A11 + A22 - 2A12, y = κ w1 + A12 - A22,
  D = det A and β = (A22 - A11)/2: F'(w1) = -β + s·y/R with
  R² = (y² + D + κ e)/κ. F' = 0 gives y = β·sqrt((D + κe)/(s²κ - β²)) when
  s²κ > β²; otherwise |s y/R| ≤ s√κ ≤ |β| so F is monotone and w1* ∈ {0, 1}.
  F is convex, so clipping the stationary point to [0, 1] is exact.
  """
  a11, a22, a12 = a[0, 0], a[1, 1], a[0, 1]
  e = 1e-8
  s = c * np.sqrt(a.mean() + e) + e
  kappa = a11 + a22 - 2 * a12
  det = a11 * a22 - a12**2
  beta = (a22 - a11) / 2
  if s**2 * kappa > beta**2:
    y = beta * np.sqrt((det + kappa * e) / (s**2 * kappa - beta**2))
    return float(np.clip((y - a12 + a22) / kappa, 0.0, 1.0))
  return 1.0 if beta > 0 else 0.0


def test_two_client_analytic():
  rng = np.random.default_rng(3)
  interior = boundary = 0
  for trial in range(12):
    x = make_updates(rng, 2, 500, -0.3, 0.3, common=trial % 2 == 0)
    if trial % 3 == 0:
      x[1] = -0.3 * x[0] + 0.05 * rng.standard_normal(500)  # strongly conflicting pair
    a = x @ x.T
    c = [0.1, 0.4, 0.9][trial % 3]
    f = released_objective(a, c)
    w1 = two_client_closed_form(a, c)
    # Cross-check the closed form with a bounded 1-D minimiser.
    r = so.minimize_scalar(lambda t: f(np.array([t, 1 - t])), bounds=(0, 1), method="bounded",
                           options={"xatol": 1e-12})
    assert f(np.array([w1, 1 - w1])) <= r.fun + 1e-12 * abs(r.fun)
    w = ours(a, c)
    assert abs(w[0] - w1) <= 1e-4
    assert rel_gap(f(w), f(np.array([w1, 1 - w1]))) <= 1e-6
    interior += 0 < w1 < 1
    boundary += w1 in (0.0, 1.0)
  assert interior >= 3 and boundary >= 1  # both regimes exercised


# ----------------------------------------------------------------------------
# conflict_averse
# ----------------------------------------------------------------------------


def test_c_zero_gives_mean_update():
  rng = np.random.default_rng(4)
  x = make_updates(rng, 6, 10_000)
  mean = x.mean(0)
  for rescale in (False, True):
    u, _ = _ca(as_tree(x), 0.0, rescale=rescale)
    np.testing.assert_allclose(tree_to_np(u), mean, rtol=1e-5, atol=1e-6 * np.abs(mean).max())


@pytest.mark.parametrize("c", [0.1, 0.4, 0.9])
def test_distance_to_mean_is_c_and_strong_duality(c):
  rng = np.random.default_rng(5)
  x = make_updates(rng, 6, 10_000)
  u_pre, aux = _ca(as_tree(x), c, rescale=False)
  u_pre = tree_to_np(u_pre)
  mean = x.mean(0)
  ratio = np.linalg.norm(u_pre - mean) / np.linalg.norm(mean)
  np.testing.assert_allclose(ratio, c, rtol=1e-4)
  np.testing.assert_allclose(float(aux["dist_ratio"]), c, rtol=1e-4)
  u, aux_r = _ca(as_tree(x), c, rescale=True)
  np.testing.assert_allclose(tree_to_np(u) * (1 + c**2), u_pre, rtol=1e-5, atol=1e-7)
  # Primal value min_i <Δ_i, Ũ> equals the dual optimum F(w*), and beats the mean.
  dots = x @ u_pre
  np.testing.assert_allclose(dots.min(), float(aux["objective"]), rtol=1e-4)
  np.testing.assert_allclose(float(aux_r["min_dot_ca"]) * (1 + c**2), dots.min(), rtol=1e-4)
  assert dots.min() >= (x @ mean).min()
  np.testing.assert_allclose(float(aux["min_dot_mean"]), (x @ mean).min(), rtol=1e-4)


def test_conflict_averse_aux_diagnostics():
  rng = np.random.default_rng(6)
  x = make_updates(rng, 6, 10_000)
  _, aux = _ca(as_tree(x), C)
  a = x @ x.T
  nrm = np.sqrt(np.diag(a))
  cos = a / np.outer(nrm, nrm)
  np.testing.assert_allclose(np.asarray(aux["cos"]), cos, rtol=1e-4, atol=1e-5)
  iu = np.triu_indices(6, 1)
  assert float(aux["conflict_rate"]) == pytest.approx(np.mean(cos[iu] < 0))
  assert 0 < float(aux["conflict_rate"]) < 1
  w = np.asarray(aux["w"])
  assert w.shape == (6,) and np.all(w >= 0) and abs(w.sum() - 1) < 1e-5


def test_conflict_averse_permutation_invariant():
  rng = np.random.default_rng(8)
  x = make_updates(rng, 6, 10_000)
  perm = rng.permutation(6)
  u, aux = _ca(as_tree(x), C)
  u_p, aux_p = _ca(as_tree(x[perm]), C)
  np.testing.assert_allclose(tree_to_np(u_p), tree_to_np(u), rtol=1e-4, atol=1e-5 * np.abs(tree_to_np(u)).max())
  np.testing.assert_allclose(np.asarray(aux_p["w"]), np.asarray(aux["w"])[perm], atol=1e-4)


# ----------------------------------------------------------------------------
# cross_attention
# ----------------------------------------------------------------------------


def _cross_attention_np(leaf: np.ndarray):
  k = leaf.shape[0]
  v = leaf.reshape(k, -1).astype(np.float64)
  logits = v @ v.T / np.sqrt(v.shape[1])
  p = np.exp(logits - logits.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  ent = -(p * np.log(p)).sum(1).mean()
  return (p @ v).reshape(leaf.shape), p, ent


def _dec_tree(rng, k=5, scale=0.3):
  return {
      "linear": {"kernel": jnp.asarray(scale * rng.standard_normal((k, 8, 6)), jnp.float32),
                 "bias": jnp.asarray(scale * rng.standard_normal((k, 6)), jnp.float32)},
      "bn": {"scale": jnp.asarray(1 + scale * rng.standard_normal((k, 4)), jnp.float32)},
  }


def test_cross_attention_matches_numpy():
  rng = np.random.default_rng(10)
  tree = _dec_tree(rng, scale=1.0)  # logits ~ sqrt(d): attention far from uniform
  out, info = jax.jit(functools.partial(h.cross_attention, return_attention=True))(tree)
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    ref, p, ent = _cross_attention_np(np.asarray(leaf))
    got = functools.reduce(lambda t, k: t[k.key], path, out)
    attn = functools.reduce(lambda t, k: t[k.key], path, info["attention"])
    e = functools.reduce(lambda t, k: t[k.key], path, info["entropy"])
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(attn), p, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(float(e), ent, rtol=1e-5)
  # At least one leaf has clearly non-uniform attention (the test is not vacuous).
  assert min(float(e) for e in jax.tree.leaves(info["entropy"])) < 0.9 * np.log(5)


def test_cross_attention_identical_updates_and_equivariance():
  rng = np.random.default_rng(11)
  one = rng.standard_normal((8, 6))
  same = {"w": jnp.asarray(np.broadcast_to(one, (4, 8, 6)), jnp.float32)}
  out = jax.jit(h.cross_attention)(same)
  np.testing.assert_allclose(np.asarray(out["w"]), np.broadcast_to(one, (4, 8, 6)), rtol=1e-5, atol=1e-6)

  tree = _dec_tree(rng)
  perm = rng.permutation(5)
  out = jax.jit(h.cross_attention)(tree)
  out_p = jax.jit(h.cross_attention)(jax.tree.map(lambda x: x[perm], tree))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a)[perm], np.asarray(b), rtol=1e-5, atol=1e-6),
               out, out_p)


def test_cross_attention_small_updates_near_uniform():
  # Spec §3.3: realistic per-element updates give ~uniform attention (entropy ≈ log K).
  rng = np.random.default_rng(12)
  tree = {"w": jnp.asarray(1e-3 * rng.standard_normal((9, 96, 96)), jnp.float32)}
  out, info = h.cross_attention(tree, return_attention=True)
  assert float(info["entropy"]["w"]) == pytest.approx(np.log(9), rel=1e-4)
  np.testing.assert_allclose(np.asarray(out["w"]), np.broadcast_to(np.asarray(tree["w"]).mean(0), (9, 96, 96)),
                             atol=1e-6)


# ----------------------------------------------------------------------------
# Hyper weights
# ----------------------------------------------------------------------------

_BOUNDARY_VALUES = np.array([-0.2, 0.0, 0.1, 0.5, 1.0, 1.3], np.float32)


def test_alpha_grad_equals_autodiff_of_released_backward():
  rng = np.random.default_rng(13)
  n = len(_BOUNDARY_VALUES)
  tree = lambda *lead: {"a": {"k": jnp.asarray(rng.standard_normal(lead + (4, 3)), jnp.float32)},
                        "b": jnp.asarray(rng.standard_normal(lead + (5,)), jnp.float32)}
  theta_pp, d_prev, d_local = tree(n), tree(n), tree(n)
  u_prev = tree()
  alpha = jnp.asarray(_BOUNDARY_VALUES)  # includes exactly 0 and 1 (torch.clamp passes grad there)
  auto = jax.jit(jax.grad(h.alpha_surrogate))(alpha, theta_pp, d_prev, u_prev, d_local)
  closed = jax.jit(h.alpha_grad)(u_prev, d_local, alpha)
  np.testing.assert_allclose(np.asarray(auto), np.asarray(closed), rtol=1e-5, atol=1e-5)
  # Independent float64 value of the closed form.
  flat = lambda t, lead: np.concatenate([np.asarray(t["a"]["k"], np.float64).reshape(lead + (-1,)),
                                         np.asarray(t["b"], np.float64).reshape(lead + (-1,))], -1)
  ref = -(flat(d_local, (n,)) @ flat(u_prev, ())) * ((_BOUNDARY_VALUES >= 0) & (_BOUNDARY_VALUES <= 1))
  np.testing.assert_allclose(np.asarray(closed), ref, rtol=1e-5, atol=1e-5)
  assert np.all(np.asarray(closed)[[1, 4]] != 0)  # boundary values get the full gradient
  # Why clamp01 exists: jnp.clip's derivative is 0.5 at exactly 0 and 1.
  assert float(jax.grad(lambda x: jnp.clip(x, 0.0, 1.0))(0.0)) == 0.5
  assert float(jax.grad(h.clamp01)(0.0)) == 1.0 and float(jax.grad(h.clamp01)(1.0)) == 1.0


def test_beta_grad_equals_autodiff_of_released_backward():
  rng = np.random.default_rng(14)
  k, n_layers = 4, 3
  tree = lambda: {"linears_0": {"kernel": jnp.asarray(rng.standard_normal((k, 6, 5)), jnp.float32),
                                "bias": jnp.asarray(rng.standard_normal((k, 5)), jnp.float32)},
                  "fuse": {"kernel": jnp.asarray(rng.standard_normal((k, 1, 1, 5, 5)), jnp.float32)},
                  "bn": {"scale": jnp.asarray(rng.standard_normal((k, 5)), jnp.float32),
                         "bias": jnp.asarray(rng.standard_normal((k, 5)), jnp.float32)}}
  layers = {"linears_0": {"kernel": 0, "bias": 0}, "fuse": {"kernel": 1}, "bn": {"scale": 2, "bias": 2}}
  theta_pp, d_prev, a_prev, d_local = tree(), tree(), tree(), tree()
  beta = jnp.asarray(rng.choice(_BOUNDARY_VALUES, (k, n_layers)))
  beta = beta.at[0].set(jnp.asarray([0.0, 1.0, 0.5]))
  auto = jax.jit(jax.grad(lambda b, *t: h.beta_surrogate(b, layers, *t)))(beta, theta_pp, d_prev, a_prev, d_local)
  closed = jax.jit(lambda *a: h.beta_grad(*a, layers))(a_prev, d_local, beta)
  assert closed.shape == (k, n_layers)
  np.testing.assert_allclose(np.asarray(auto), np.asarray(closed), rtol=1e-5, atol=1e-5)
  # float64 reference of the per-layer sums
  ref = np.zeros((k, n_layers))
  for (pa, x, lay) in zip(jax.tree.leaves(a_prev), jax.tree.leaves(d_local), jax.tree.leaves(layers)):
    ref[:, lay] -= (np.asarray(pa, np.float64).reshape(k, -1) * np.asarray(x, np.float64).reshape(k, -1)).sum(1)
  b = np.asarray(beta)
  ref *= (b >= 0) & (b <= 1)
  np.testing.assert_allclose(np.asarray(closed), ref, rtol=1e-5, atol=1e-5)
  assert np.all(np.asarray(closed)[0] != 0)


def test_personalize_and_beta_per_leaf():
  rng = np.random.default_rng(15)
  n = 5
  prev = {"w": jnp.asarray(rng.standard_normal((n, 3, 2)), jnp.float32), "b": jnp.asarray(rng.standard_normal((n, 2)), jnp.float32)}
  delta = jax.tree.map(lambda x: 0.1 * x + 0.01, prev)
  u = {"w": jnp.asarray(rng.standard_normal((3, 2)), jnp.float32), "b": jnp.asarray(rng.standard_normal(2), jnp.float32)}
  alpha = jnp.asarray([-0.5, 0.0, 0.3, 1.0, 2.0])
  out = jax.jit(h.personalize)(prev, delta, alpha, u)
  ac = np.clip(np.asarray(alpha), 0, 1)
  for key in ("w", "b"):
    ref = np.asarray(prev[key]) + np.asarray(delta[key]) + ac.reshape((n,) + (1,) * (prev[key].ndim - 1)) * np.asarray(u[key])[None]
    np.testing.assert_allclose(np.asarray(out[key]), ref, rtol=1e-6, atol=1e-6)
  # α = 0 (and β = 0) is exactly local training.
  local = h.personalize(prev, delta, jnp.zeros(n), u)
  jax.tree.map(lambda a, p, d: np.testing.assert_array_equal(np.asarray(a), np.asarray(p + d)), local, prev, delta)

  # Decoders: stacked Ã, β per (decoder, layer) broadcast to leaves.
  layers = {"w": 1, "b": 0}
  beta = jnp.asarray(rng.uniform(-0.2, 1.2, (n, 2)), jnp.float32)
  per_leaf = h.beta_per_leaf(beta, layers)
  np.testing.assert_array_equal(np.asarray(per_leaf["w"]), np.asarray(beta[:, 1]))
  agg = jax.tree.map(lambda x: 0.5 * x, prev)
  out = jax.jit(h.personalize)(prev, delta, per_leaf, agg)
  for key, lay in layers.items():
    bc = np.clip(np.asarray(beta[:, lay]), 0, 1).reshape((n,) + (1,) * (prev[key].ndim - 1))
    ref = np.asarray(prev[key]) + np.asarray(delta[key]) + bc * np.asarray(agg[key])
    np.testing.assert_allclose(np.asarray(out[key]), ref, rtol=1e-6, atol=1e-6)


def test_homo_average_matches_numpy():
  rng = np.random.default_rng(16)
  keys = [("pascal", ("semseg",)), ("pascal", ("semseg",)), ("pascal", ("edge",)),
          ("nyud", ("depth", "edge")), ("nyud", ("depth", "edge")), ("nyud", ("depth", "edge"))]
  ids = consecutive_group_ids(keys)
  assert ids == (0, 0, 1, 2, 2, 2)
  assert consecutive_group_ids(["a", "b", "a"]) == (0, 1, 2)  # only consecutive runs group
  tree = {"x": {"y": jnp.asarray(rng.standard_normal((6, 3, 4)), jnp.float32)},
          "z": jnp.asarray(rng.standard_normal((6, 5)), jnp.float32)}
  out = jax.jit(functools.partial(h.homo_average, group_ids=ids))(tree)
  ids_np = np.asarray(ids)
  for got, x in zip(jax.tree.leaves(out), jax.tree.leaves(tree)):
    x = np.asarray(x, np.float64)
    ref = np.stack([x[ids_np == g].mean(0) for g in ids_np])
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-6, atol=1e-6)
  # All singletons: identity (every 1C scenario).
  same = h.homo_average(tree, tuple(range(6)))
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), same, tree)


def test_eager_equals_jit_on_nested_pytree():
  rng = np.random.default_rng(17)
  tree = {"a": {"b": jnp.asarray(rng.standard_normal((4, 3, 5)), jnp.float32)},
          "c": jnp.asarray(rng.standard_normal((4, 7)), jnp.float32)}
  ca_e = h.conflict_averse(tree)
  ca_j = jax.jit(h.conflict_averse)(tree)
  assert jax.tree.structure(ca_j) == jax.tree.structure(tree)
  assert ca_j["a"]["b"].shape == (3, 5) and ca_j["c"].shape == (7,) and ca_j["c"].dtype == jnp.float32
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6), ca_e, ca_j)
  xa_e = h.cross_attention(tree)
  xa_j = jax.jit(h.cross_attention)(tree)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7), xa_e, xa_j)
