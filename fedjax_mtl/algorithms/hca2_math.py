"""FedHCA² aggregation math: pure, jit-compatible JAX functions on stacked pytrees.

Every function takes "stacked pytrees": nested dicts (any pytree) of arrays whose
leaves share a leading axis (N clients for encoders, K decoders for decoders).
Nothing here concatenates all parameters into one vector: reductions are done
leaf by leaf (over the encoders, in cache-sized column chunks; the small leaves
`rows.packed_indices` chooses packed side by side into one operand) and summed,
so no temporary of the N updates' large leaves is made (the Swin-T encoder is 27.5M
parameters times N = 6..24 clients). :func:`conflict_averse_from` takes the local
and previous parameters and never materialises their difference.

Spec: ../shared/spec/fedhca2.md §3.2-§3.4 and §8, reference-code.md §1.8-§1.10.

* Encoders: :func:`conflict_averse` (CAGrad dual on the N x N Gram matrix, solved
  in-graph by :func:`solve_ca_dual`), returns Ũ with the released 1/(1+c²) rescale.
* Decoders: :func:`cross_attention` (softmax(V Vᵀ/√d) V per parameter tensor).
* Hyper weights: :func:`alpha_grad`, :func:`beta_grad` (closed-form gradients that
  equal ``jax.grad`` of :func:`alpha_surrogate` / :func:`beta_surrogate`, i.e. the
  released ``torch.autograd.backward(last_output, diff)``), :func:`personalize`,
  :func:`beta_per_leaf`, :func:`homo_average`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_mtl.algorithms.rows import (delta_gram, deviation_gram, gram,  # noqa: F401
                                        pack, packed_gram, row_leaves, segment_rows, unpack)

PyTree = Any

_HI = jax.lax.Precision.HIGHEST
_EPS = 1e-8  # the released code's epsilon, used in three places (see ca_objective)
# ‖g_w‖² is taken from the Gram matrix as wᵀAw only while
# (Σ_i w_i‖Δ_i‖)² / wᵀAw is at most this: its float32 error is about that ratio
# times the Gram matrix's relative accuracy (~1e-7..1e-6), so at most ~1e-5.
_MAX_GRAM_CANCELLATION = 16.0


def _leaves(tree: PyTree) -> list[jax.Array]:
  return jax.tree_util.tree_leaves(tree)


def _flat(x: jax.Array) -> jax.Array:
  """[N, ...] -> [N, d] in float32 (a reshape, not a copy, for float32 input)."""
  return jnp.reshape(x, (x.shape[0], -1)).astype(jnp.float32)


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
  return jnp.dot(a, b, precision=_HI)


# ----------------------------------------------------------------------------
# Clamp with torch.clamp's gradient.
# ----------------------------------------------------------------------------


@jax.custom_jvp
def clamp01(x: jax.Array) -> jax.Array:
  """clip(x, 0, 1) whose derivative is 1[0 <= x <= 1], like torch.clamp."""
  return jnp.clip(x, 0.0, 1.0)


@clamp01.defjvp
def _clamp01_jvp(primals, tangents):
  # jnp.clip is min(max(x, 0), 1), whose JAX derivative is 0.5 at exactly 0 and 1
  # (lax.max/min split ties). torch.clamp passes the full gradient at the
  # boundaries; the released α/β updates rely on that, so match it.
  (x,), (dx,) = primals, tangents
  x = jnp.asarray(x)
  inside = ((x >= 0.0) & (x <= 1.0)).astype(dx.dtype)
  return clamp01(x), dx * inside


def _in_unit_interval(x: jax.Array) -> jax.Array:
  return ((x >= 0.0) & (x <= 1.0)).astype(jnp.float32)


# ----------------------------------------------------------------------------
# Gram matrix and the CAGrad dual.
# ----------------------------------------------------------------------------


def _sqrt_phi(a: jax.Array, c: float | jax.Array) -> jax.Array:
  # Released: g0_norm = sqrt(mean(A) + 1e-8); sqrt(phi) = c * g0_norm + 1e-8.
  return c * jnp.sqrt(jnp.mean(a) + _EPS) + _EPS


def ca_objective(w: jax.Array, a: jax.Array, c: float | jax.Array) -> jax.Array:
  """Released CAGrad dual objective F(w) = wᵀA b + √φ·sqrt(wᵀA w + 1e-8), b = 1/N."""
  a = a.astype(jnp.float32)
  n = a.shape[0]
  ab = jnp.sum(a, axis=1) / n
  return _dot(w, ab) + _sqrt_phi(a, c) * jnp.sqrt(_dot(w, _dot(a, w)) + _EPS)


def solve_ca_dual(
    a: jax.Array,
    c: float | jax.Array,
    num_steps: int = 64,
    newton_cutoff: float = 1e-6,
    max_backtracks: int = 40,
) -> jax.Array:
  """Minimise the released CAGrad dual over the simplex in-graph; returns w* [N].

  Objective (released code, spec §3.2 steps 2-3)::

      F(w) = wᵀ A b + √φ · sqrt(wᵀ A w + 1e-8),  b = 1/N,
      √φ   = c · sqrt(mean(A) + 1e-8) + 1e-8.

  Normalisation. With t = trace(A)/N (mean squared update norm) and A' = A/t,
  F(w; A) = t · F'(w) where F'(w) = wᵀA'b + s'·sqrt(wᵀA'w + e'),
  s' = √φ/√t (√φ computed from the *raw* A, so both of its epsilons are the
  released ones) and e' = 1e-8/t. This is an exact identity, so the minimiser is
  the released one at every scale; only the float32 working range changes. Keeping
  e' = 1e-8 instead would change w* when ‖Δ‖² ~ 1e-8 (the epsilon then smooths the
  norm); dropping it would make F non-smooth where Gw = 0.

  Solver (fixed budget, everything in ``lax`` loops, float32, N ≤ ~64). Each of
  ``num_steps`` iterations does, all monotone in F:
    1. a projected-gradient step (``optax.projections.projection_simplex``) with a
       backtracked step size (sufficient-decrease test), which changes the support;
    2. a Newton step on the current face (support plus coordinates whose gradient
       is below the multiplier estimate wᵀ∇F), computed in Jacobi-scaled
       coordinates with an eigen-pseudo-inverse of the tangent-projected Hessian,
       followed by a projected backtracking search (can drop several coordinates);
    3. a step along the zero-curvature part of the face, where F is exactly linear
       (F depends on w only through u = Gw and is 1-homogeneous in u, so with a
       rank-deficient A the ray direction can be feasible), taken to the boundary.
  Objective differences are evaluated cancellation-free,
  F(w+d) - F(w) = A'b·d + s'·dᵀA'(2w+d)/(r(w+d) + r(w)), so the line searches are
  exact to float32 relative to ‖d‖ rather than to |F|.

  Accuracy (see tests/test_hca2_math.py): objective within ~1e-7 relative of the
  best of SLSQP (default and ftol=1e-16) and trust-constr on several hundred random
  and adversarial Gram matrices (collinear, conflicting, duplicated, rank-deficient,
  norms from 1e-5 to 1e4, mixed over 4 orders of magnitude), usually < 1e-9;
  SLSQP with default options is itself far off when the objective is small or huge
  (its ftol is absolute).
  """
  a = jnp.asarray(a, jnp.float32)
  n = a.shape[0]
  dtype = jnp.float32
  if n == 1:
    return jnp.ones((1,), dtype)

  t = jnp.trace(a) / n
  t = jnp.where(jnp.isfinite(t) & (t > 1e-30), t, 1.0)
  an = a / t
  e = _EPS / t
  s = _sqrt_phi(a, c) / jnp.sqrt(t)
  ab = jnp.sum(an, axis=1) / n
  proj = optax.projections.projection_simplex

  def mv(x):
    return _dot(an, x)

  def grad_info(w):
    aw = mv(w)
    r = jnp.sqrt(_dot(w, aw) + e)
    g = ab + s * aw / r
    hess = s * (an / r - jnp.outer(aw, aw) / r**3)
    return g, r, hess

  def delta_f(w, d, r):
    # Cancellation-free F'(w + d) - F'(w).
    q2 = _dot(d, mv(2.0 * w + d))
    rn = jnp.sqrt(jnp.maximum(r * r + q2, 0.0))
    return _dot(ab, d) + s * q2 / (rn + r)

  def jacobi(hess):
    dh = jnp.diag(hess)
    return jax.lax.rsqrt(jnp.maximum(dh, 1e-30 * jnp.max(dh)) + 1e-37)

  def face_directions(g, hess, m):
    """Newton direction and zero-curvature descent direction on the face m."""
    sc = jacobi(hess)
    hs = hess * jnp.outer(sc * m, sc * m)
    av = m * sc
    av = av / jnp.linalg.norm(av)
    p = jnp.eye(n, dtype=dtype) - jnp.outer(av, av)  # tangent of Σ w = 1 (scaled)
    hp = _dot(p, _dot(hs, p))
    lam, v = jnp.linalg.eigh(hp)
    keep = lam > newton_cutoff * jnp.max(lam)
    inv = jnp.where(keep, 1.0 / jnp.where(keep, lam, 1.0), 0.0)
    rhs = _dot(p, g * sc * m)
    coef = _dot(v.T, rhs)
    d_newton = sc * m * -_dot(v, inv * coef)
    d_flat = sc * m * -_dot(v, jnp.where(keep, 0.0, coef))
    fix = lambda d: jnp.where(jnp.isfinite(d), d, 0.0)
    return fix(d_newton), fix(d_flat), sc

  def backtrack(t0, accept):
    def cond(st):
      _, k, ok = st
      return (~ok) & (k < max_backtracks)

    def body(st):
      tt, k, _ = st
      tt = jnp.where(k > 0, 0.5 * tt, tt)
      return tt, k + 1, accept(tt)

    tt, _, ok = jax.lax.while_loop(cond, body, (jnp.asarray(t0, dtype), 0, False))
    return tt, ok

  def pg_step(w, eta):
    g, r, _ = grad_info(w)

    def accept(et):
      d = proj(w - et * g) - w
      return delta_f(w, d, r) <= _dot(g, d) + 0.5 / et * jnp.dot(d, d)

    eta, ok = backtrack(eta, accept)
    return jnp.where(ok, proj(w - eta * g), w), 2.0 * eta

  def newton_step(w):
    g, r, hess = grad_info(w)
    nu = jnp.dot(w, g)  # multiplier estimate: equals g_i on the optimal support
    pos = w > 0
    entering = g < nu
    d1, _, _ = face_directions(g, hess, (pos | entering).astype(dtype))
    # Coordinates at zero that the Newton step would push negative stay fixed.
    d, _, _ = face_directions(g, hess, (pos | (entering & (d1 > 0))).astype(dtype))

    def accept(tt):
      dd = proj(w + tt * d) - w
      return delta_f(w, dd, r) <= 1e-4 * _dot(g, dd)

    tt, ok = backtrack(1.0, accept)
    wn = proj(w + tt * d)
    ok = ok & (delta_f(w, wn - w, r) < 0)
    return jnp.where(ok, wn, w)

  def flat_step(w):
    g, r, hess = grad_info(w)
    m = (w > 0).astype(dtype)
    _, d, sc = face_directions(g, hess, m)
    # Exactly tangent: the largest weight absorbs the rounding of Σ d.
    d = d.at[jnp.argmax(w)].add(-jnp.sum(d))
    # Ignore rounding noise: near the face optimum this component is ~eps·‖g‖.
    significant = jnp.linalg.norm(m * d / sc) > 1e-5 * jnp.linalg.norm(g * sc * m)
    d = jnp.where(significant, d, 0.0)
    ratio = jnp.where(d < 0, w / jnp.where(d < 0, -d, 1.0), jnp.inf)
    t0 = jnp.min(ratio)
    t0 = jnp.where(jnp.isfinite(t0), t0, 0.0)

    def accept(tt):
      dd = proj(w + tt * d) - w
      return delta_f(w, dd, r) <= 0.5 * _dot(g, dd)

    tt, ok = backtrack(t0, accept)
    # The blocking coordinate lands exactly on the boundary.
    wn = proj(jnp.where(ratio <= tt * (1 + 1e-6), 0.0, w + tt * d))
    ok = ok & (delta_f(w, wn - w, r) < 0)
    return jnp.where(ok, wn, w)

  def body(_, carry):
    w, eta = carry
    w, eta = pg_step(w, eta)
    w = newton_step(w)
    w = flat_step(w)
    return w, eta

  w0 = jnp.full((n,), 1.0 / n, dtype)
  w, _ = jax.lax.fori_loop(0, num_steps, body, (w0, jnp.asarray(1.0, dtype)))
  return w


# ----------------------------------------------------------------------------
# Encoders: Hyper Conflict-Averse aggregation.
# ----------------------------------------------------------------------------


def conflict_averse(
    deltas: PyTree,
    c: float = 0.4,
    rescale: bool = True,
    return_aux: bool = False,
) -> PyTree | tuple[PyTree, dict[str, Any]]:
  """Conflict-averse update Ũ (one client's structure) from stacked client updates [N, ...]."""
  out, aux = conflict_averse_from(deltas, None, c=c, rescale=rescale)
  return (out, aux) if return_aux else out


def conflict_averse_from(
    local: PyTree,
    prev: PyTree | None,
    c: float = 0.4,
    rescale: bool = True,
    probe: PyTree | None = None,
    diagnostics: bool = True,
) -> tuple[PyTree, dict[str, Any]]:
  """:func:`conflict_averse` of Δ = local - prev (Δ = local if `prev` is None), with aux.

  `local` and `prev` are stacked `[N, ...]` trees or `rows.Blocks` of them
  (rows left in the client groups' arrays). Δ is never materialised. One
  chunked read pass over `local` and `prev` gives the Gram matrix A (and, with
  `probe`, aux["probe_dots"] = <probe, Δ_i>, e.g. the α hypergradient's inner
  products); after the solve, Ũ = Σ_i coef_i Δ_i with coef = (1/N + λ w)·scale
  is written in one elementwise pass. ‖g_w‖ comes from the Gram matrix when
  that is accurate (see `_MAX_GRAM_CANCELLATION`), else from one more read
  pass. `diagnostics=False` leaves out the aux entries that need more than A
  (‖Δ̄‖ and the distance ratio: one more read pass each call).
  """
  leaves = row_leaves(local)
  prevs = [None] * len(leaves) if prev is None else row_leaves(prev)
  n = segment_rows(leaves[0])
  # The small leaves are packed into one operand (rows.pack) shared by the
  # Gram pass, the ‖g_w‖ pass and Ũ; the large ones are read in place.
  packed = pack(local, prev, probe)
  a, probe_dots = packed_gram(packed)
  w = solve_ca_dual(a, c)
  sqrt_phi = _sqrt_phi(a, c)
  scale = 1.0 / (1.0 + c**2) if rescale else 1.0

  # ‖g_w‖² = wᵀAw cancels when the updates conflict (‖g_w‖ ≪ Σ_i w_i‖Δ_i‖), so
  # it is used only while that ratio is bounded; otherwise ‖g_w‖² is recomputed
  # from the rows wᵀΔ themselves (one elementwise pass per leaf), as the released
  # gw.norm().
  norms = jnp.sqrt(jnp.maximum(jnp.diag(a), 0.0))  # ‖Δ_i‖
  gw_sq = _dot(w, _dot(a, w))
  spread = jnp.square(_dot(w, norms))
  def combine(coef, xs, ys):
    """Σ_i coef_i Δ_i of one leaf, one elementwise pass over its row segments; it has
    the dtype of Δ: the deltas' own, or float32 when formed here from local - prev."""
    terms, lo = [], 0
    for j, x in enumerate(xs):
      y = None if ys is None else ys[j]
      terms += [coef[lo + i] * (x[i].astype(jnp.float32)
                                - (0.0 if y is None else y[i].astype(jnp.float32)))
                for i in range(x.shape[0])]
      lo += x.shape[0]
    return sum(terms).astype(xs[0].dtype if ys is None else jnp.float32)

  def gw_sq_from_rows():
    # Per leaf, one reduction over the rows of w_i (local_i - prev_i), fused: inside
    # a cond branch XLA:CPU would copy out every row slice that `combine` takes.
    def leaf(xs, ys):
      g, lo = 0.0, 0
      for j, x in enumerate(xs):
        d = x.astype(jnp.float32) - (0.0 if ys is None else ys[j].astype(jnp.float32))
        wj = w[lo:lo + x.shape[0]].reshape((-1,) + (1,) * (x.ndim - 1))
        g = g + jnp.sum(wj * d, axis=0)
        lo += x.shape[0]
      return jnp.sum(jnp.square(g))
    return sum(leaf(x, y) for x, y, _ in packed.ops)

  gw_sq = jax.lax.cond(gw_sq * _MAX_GRAM_CANCELLATION >= spread, lambda: gw_sq,
                       gw_sq_from_rows)
  gw_norm = jnp.sqrt(jnp.maximum(gw_sq, 0.0))
  lam = sqrt_phi / (gw_norm + _EPS)
  coef = (1.0 / n + lam * w) * scale
  # Ũ is read by every personalised row: it is formed inside a cond so that XLA
  # materialises it once rather than re-deriving it from the N updates inside
  # each consumer (XLA:CPU drops optimization barriers before fusion). The other
  # branch, taken only for a NaN coefficient, gives what the sum would: NaN.
  out = jax.lax.cond(
      ~jnp.any(jnp.isnan(coef)),
      lambda: [combine(coef, x, y) for x, y, _ in packed.ops],
      lambda: [jnp.full(x[0].shape[1:], jnp.nan, x[0].dtype if y is None else jnp.float32)
               for x, y, _ in packed.ops])
  out = [o.astype(x[0].dtype if y is None else jnp.float32) for o, x, y in
         zip(unpack(packed, out, [x[0] for x in leaves]), leaves, prevs)]
  structure = local.parts[0] if hasattr(local, 'parts') else local
  out = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(structure), out)

  # Diagnostics (spec §9.3) from the Gram matrix: <Δ_i, Δ̄> = (A 1/N)_i and
  # <Δ_i, g_w> = (A w)_i, so no extra pass over the N stacked updates.
  dots_mean = jnp.sum(a, axis=1) / n
  dots_ca = (dots_mean + lam * _dot(a, w)) * scale
  cos = a / jnp.maximum(jnp.outer(norms, norms), 1e-30)
  iu = np.triu_indices(n, 1)
  conflict_rate = jnp.mean((cos[iu] < 0).astype(jnp.float32)) if n > 1 else jnp.float32(0)
  aux = {
      "w": w,
      "objective": ca_objective(w, a, c),
      "gram": a,
      "cos": cos,
      "conflict_rate": conflict_rate,
      "min_dot_ca": jnp.min(dots_ca),
      "min_dot_mean": jnp.min(dots_mean),
      "lambda": lam,
      "gw_norm": gw_norm,
      "sqrt_phi": sqrt_phi,
      "probe_dots": probe_dots,
  }
  if diagnostics:
    # ‖Δ̄‖ from the rows Δ̄ (1ᵀA1/N² cancels like wᵀAw): one more read pass.
    mean_norm = jnp.sqrt(delta_gram(local, prev, mix=jnp.full((1, n), 1.0 / n))[0][0, 0])
    aux["mean_norm"] = mean_norm
    # ‖Ũ_prerescale - Δ̄‖/‖Δ̄‖ = λ‖g_w‖/‖Δ̄‖ = c up to the 1e-8 epsilons.
    aux["dist_ratio"] = lam * gw_norm / jnp.maximum(mean_norm, 1e-30)
  return out, aux


# ----------------------------------------------------------------------------
# Decoders: Hyper Cross-Attention aggregation.
# ----------------------------------------------------------------------------


def _attend(leaf: jax.Array, valid: jax.Array | None = None
            ) -> tuple[jax.Array, jax.Array, jax.Array]:
  v = _flat(leaf)
  d = v.shape[1]
  # Keys include self; no projections; 1/sqrt(d) with d = numel of this tensor.
  logits = _dot(v, v.T) / math.sqrt(d)
  if valid is not None:  # only the participants' decoders are keys
    logits = jnp.where(valid[None, :], logits, -jnp.inf)
  attn = jax.nn.softmax(logits, axis=-1)
  out = _dot(attn, v).reshape(leaf.shape).astype(leaf.dtype)
  # 0·log 0 = 0: a masked key's weight is exactly 0 (1e-38 is a float32 denormal,
  # flushed to 0 on CPU, so a floor there would give 0·(−inf)).
  entropy = -jnp.sum(jnp.where(attn > 0, attn * jnp.log(jnp.where(attn > 0, attn, 1.)), 0.),
                     axis=-1)
  if valid is None:
    return out, attn, jnp.mean(entropy)
  return out, attn, jnp.sum(jnp.where(valid, entropy, 0.)) / jnp.maximum(jnp.sum(valid), 1)


def cross_attention(
    deltas: PyTree, return_attention: bool = False, valid: jax.Array | None = None
) -> PyTree | tuple[PyTree, dict[str, PyTree]]:
  """Per-tensor cross attention Ã = softmax(V Vᵀ/√d) V over stacked decoder updates [K, ...];
  with `valid` ([K] bool) only those rows are keys (the round's participants)."""
  leaves, treedef = jax.tree_util.tree_flatten(deltas)
  res = [_attend(x, valid) for x in leaves]
  out = jax.tree_util.tree_unflatten(treedef, [r[0] for r in res])
  if not return_attention:
    return out
  info = {
      "attention": jax.tree_util.tree_unflatten(treedef, [r[1] for r in res]),
      "entropy": jax.tree_util.tree_unflatten(treedef, [r[2] for r in res]),
  }
  return out, info


# ----------------------------------------------------------------------------
# Hyper weights α (encoders, [N]) and β (decoders, [K, L]).
# ----------------------------------------------------------------------------


def hyper_grad(dots: jax.Array, weight: jax.Array) -> jax.Array:
  """Released hypergradient -<agg^(r-1), Δθ^(r)> · 1[0 ≤ weight ≤ 1] from the inner products."""
  return -dots * _in_unit_interval(weight)


def _per_row_dot(x: jax.Array, y: jax.Array) -> jax.Array:
  """<x_k, y_k> for stacked x, y [K, ...] -> [K]."""
  return jnp.sum(_flat(x) * _flat(y), axis=1)


def alpha_grad(prev_u: PyTree, local_deltas: PyTree, alpha: jax.Array) -> jax.Array:
  """g_α_i = -<Ũ^(r-1), Δθ_i^(r)> · 1[0 ≤ α_i ≤ 1] (released backward), shape [N].

  The inner products come from the Gram pass, as in the rule (which gets them
  from :func:`conflict_averse_from` as aux["probe_dots"]).
  """
  return hyper_grad(delta_gram(local_deltas, probe=prev_u)[1], alpha)


def beta_grad(
    prev_a: PyTree, local_deltas: PyTree, beta: jax.Array, layer_of_leaf: PyTree
) -> jax.Array:
  """g_β_{k,l} = -Σ_{p in layer l} <Ã^(r-1)_{k,p}, Δθ^(r)_{k,p}> · 1[0 ≤ β_{k,l} ≤ 1], shape [K, L]."""
  g = jnp.zeros(beta.shape, jnp.float32)
  for pa, x, layer in zip(
      _leaves(prev_a), _leaves(local_deltas), _leaves(layer_of_leaf), strict=True
  ):
    g = g.at[:, layer].add(_per_row_dot(pa, x))
  return hyper_grad(g, beta)


def beta_per_leaf(beta: jax.Array, layer_of_leaf: PyTree) -> PyTree:
  """Per-leaf [K] weights beta[:, layer] with the structure of ``layer_of_leaf``."""
  return jax.tree_util.tree_map(lambda layer: beta[:, layer], layer_of_leaf)


def personalize(prev_params: PyTree, local_deltas: PyTree, weight: Any, agg: PyTree) -> PyTree:
  """θ_new = θ_prev + Δ + clamp(weight, 0, 1) · agg, per client/decoder (stacked leading axis).

  ``weight`` is one [N] array (broadcast to every leaf, encoders: α) or a pytree of
  [K] arrays with the leaves' structure (decoders: :func:`beta_per_leaf`). ``agg``
  leaves are either unstacked (one client's shape, e.g. Ũ, shared by all clients)
  or stacked like the deltas (e.g. Ã); told apart by rank. The clamp has
  torch.clamp's gradient, so ``jax.grad`` through this is the released backward.
  """
  if isinstance(weight, (jax.Array, np.ndarray)):
    weight = jax.tree_util.tree_map(lambda _: weight, local_deltas)

  def one(p, d, wgt, g):
    wc = clamp01(jnp.asarray(wgt, jnp.float32))
    wc = wc.reshape(wc.shape + (1,) * (d.ndim - 1))
    g = g.astype(jnp.float32)
    if g.ndim == d.ndim - 1:
      g = g[None]
    return (p.astype(jnp.float32) + d.astype(jnp.float32) + wc * g).astype(p.dtype)

  return jax.tree_util.tree_map(one, prev_params, local_deltas, weight, agg)


def alpha_surrogate(
    alpha: jax.Array,
    prev_prev_params: PyTree,
    prev_deltas: PyTree,
    prev_u: PyTree,
    local_deltas: PyTree,
) -> jax.Array:
  """f(α) = Σ_i <θ_i^agg(α), -Δθ_i^(r)> with θ^agg from round r-1; ∇f = :func:`alpha_grad`.

  This is what the released ``torch.autograd.backward(last_output, diff)`` with
  diff = θ^last - θ^local = -Δθ^(r) differentiates: last_output is the round-(r-1)
  aggregate θ^(r-2) + Δθ^(r-1) + clamp(α)·Ũ^(r-1). Only the clamp(α)·Ũ term
  depends on α, so ∂f/∂α_i = -<Ũ^(r-1), Δθ_i^(r)>·1[0 ≤ α_i ≤ 1].
  """
  agg = personalize(prev_prev_params, prev_deltas, alpha, prev_u)
  return -sum(
      jnp.sum(p.astype(jnp.float32) * x.astype(jnp.float32))
      for p, x in zip(_leaves(agg), _leaves(local_deltas), strict=True)
  )


def beta_surrogate(
    beta: jax.Array,
    layer_of_leaf: PyTree,
    prev_prev_params: PyTree,
    prev_deltas: PyTree,
    prev_a: PyTree,
    local_deltas: PyTree,
) -> jax.Array:
  """f(β) = Σ_k <θ_k^agg(β), -Δθ_k^(r)> over all decoder tensors; ∇f = :func:`beta_grad`."""
  agg = personalize(prev_prev_params, prev_deltas, beta_per_leaf(beta, layer_of_leaf), prev_a)
  return -sum(
      jnp.sum(p.astype(jnp.float32) * x.astype(jnp.float32))
      for p, x in zip(_leaves(agg), _leaves(local_deltas), strict=True)
  )


# ----------------------------------------------------------------------------
# Homo aggregation (released code only, encoders, 2C/4C).
# ----------------------------------------------------------------------------


def homo_average(deltas: PyTree, group_ids: Sequence[int]) -> PyTree:
  """Replace each client's update by the mean over its group (static ``group_ids``, length N)."""
  ids_np = np.asarray(group_ids)
  if ids_np.ndim != 1:
    raise ValueError("group_ids must be a 1-D static sequence of ints")
  uniq, seg = np.unique(ids_np, return_inverse=True)
  if len(uniq) == len(ids_np):
    return deltas  # all singletons (every 1C scenario): nothing to do
  num = len(uniq)
  counts = np.bincount(seg, minlength=num).astype(np.float32)
  seg_j = jnp.asarray(seg, jnp.int32)
  inv = jnp.asarray(1.0 / counts[seg])

  def one(x):
    if x.shape[0] != len(ids_np):
      raise ValueError(f"leading axis {x.shape[0]} != len(group_ids) {len(ids_np)}")
    sums = jax.ops.segment_sum(x.astype(jnp.float32), seg_j, num_segments=num)
    mean = sums[seg_j] * inv.reshape((-1,) + (1,) * (x.ndim - 1))
    return mean.astype(x.dtype)

  return jax.tree_util.tree_map(one, deltas)
