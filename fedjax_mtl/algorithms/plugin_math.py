"""FedDEA's plug-in bases and enhancement modules: pure, jit-compatible JAX math.

Spec: `shared/spec/feddea.md` §2.4 (the plug-in table), §2.5 (PCGrad, HEAL),
§6 A5/A11/A12 (server step size, where the DEA-masked delta goes, defaults).

Conventions (every server function):
- `prev`: the unstacked global params θ (one row's shape).
- `deltas`: a stacked pytree `[K, ...]` of the client updates Δ_k = θ_k − start_k
  (after DEA masking where DEA is on: A11 says the base rule consumes the masked
  delta wherever it would have consumed Δ). Plain stacked trees, not `Blocks`.
- `weights`: `[K]` non-negative client weights, normalised here (raw example
  counts are fine); `ServerInputs.num_examples` is what the paper uses (Eq. 6).
- State is an explicit pytree passed in and returned; nothing is kept in Python.
- Arithmetic is float32; new params keep `prev`'s dtype.

Client-side helpers (FedDyn, MOON, FedACG) act on one client's unstacked tree
(the engine vmaps the client part).

References (public code read for the details the papers leave out):
FedNova (Wang et al. 2020), FedDyn (Acar et al. 2021; server rule as in
`geehokim/FedACG` `ServerDyn`), MOON (Li et al. 2021, `QinbinLi/MOON`), FedBN
(Li et al. 2021), FedDG-GA (Zhang et al. 2023, `MediaBrain-SJTU/FedDG-GA`
`utils/weight_adjust.py`), FedACG (Kim et al. 2024, `geehokim/FedACG`
`servers/base.py` `ServerM`), PCGrad (Yu et al. 2020), FedHEAL (Chen et al.
2024, `yuhangchen0/FedHEAL` `models/utils/federated_model.py`).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_mtl.algorithms.base import mix_rows, num_rows, sq_dist_trees, tree_mean

PyTree = Any

_HI = jax.lax.Precision.HIGHEST

# Defaults (spec §6 A12; the modules' own repositories where the spec says "check").
FEDDYN_ALPHA = 0.01
MOON_MU = 1.0
MOON_TAU = 0.5
FEDGA_STEP_SIZE = 0.2  # FedDG-GA `--step_size`
FEDACG_LAMBDA = 0.85  # FedACG `configs/server/FedACG.yaml` momentum
# FedACG's repo adds 1e-3 * ||θ - θ_look||² (no ½) to the loss; in the paper's
# β/2 ||·||² form that is β = 2e-3.
FEDACG_BETA = 2e-3
HEAL_TAU = 0.3  # FedHEAL `--threshold`
HEAL_BETA = 0.4  # FedHEAL `--beta`


# ----------------------------------------------------------------------------
# Shared pieces
# ----------------------------------------------------------------------------

def normalize_weights(weights: jax.Array) -> jax.Array:
  """`weights / Σ weights` in float32."""
  w = jnp.asarray(weights, jnp.float32)
  return w / jnp.sum(w)


def add_scaled(prev: PyTree, step: PyTree, scale: jax.Array | float = 1.0) -> PyTree:
  """prev + scale * step, computed in float32, cast back to prev's dtype."""
  return jax.tree.map(
      lambda p, s: (p.astype(jnp.float32) + scale * s.astype(jnp.float32)).astype(p.dtype),
      prev, step)


def _f32(tree: PyTree) -> PyTree:
  """`tree` with float32 leaves (so `tree_mean` keeps float32 for low-precision deltas)."""
  return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)


def _rows(v: jax.Array, ndim: int) -> jax.Array:
  """A `[K]` vector shaped to broadcast against a `[K, ...]` leaf of rank `ndim`."""
  return jnp.reshape(v, (-1,) + (1,) * (ndim - 1))


def weighted_update(prev: PyTree, deltas: PyTree, weights: jax.Array,
                    server_lr: float = 1.0) -> PyTree:
  """FedAvg / FedProx / MOON / FedGA server (spec Eq. 6): θ + η_g Σ_k w_k Δ_k.

  `server_lr` is Eq. 6's η_g (A5, 1 by default; raised for the §4.6
  amplification control).
  """
  return add_scaled(prev, tree_mean(_f32(deltas), normalize_weights(weights)), server_lr)


# ----------------------------------------------------------------------------
# FedNova (§2.4)
# ----------------------------------------------------------------------------

def fednova_update(prev: PyTree, deltas: PyTree, weights: jax.Array, taus: jax.Array,
                   server_lr: float = 1.0) -> PyTree:
  """FedNova server: θ + η_g τ_eff Σ_k w_k Δ_k / τ_k with τ_eff = Σ_k w_k τ_k.

  τ_k is client k's number of local steps (`ServerInputs.num_steps`; with
  AdamW the normaliser a_k = τ_k, as for plain SGD in the FedNova paper). A
  client with τ_k = 0 has Δ_k = 0 and is divided by 1 instead. With equal τ_k
  this is FedAvg. DEA's mask is unaffected by the scalar 1/τ_k (spec §2.4).
  """
  w = normalize_weights(weights)
  tau = jnp.asarray(taus, jnp.float32)
  tau_eff = jnp.sum(w * tau)
  coef = w / jnp.maximum(tau, 1.0)  # w_k / τ_k
  return add_scaled(prev, tree_mean(_f32(deltas), coef),
              server_lr * tau_eff)


# ----------------------------------------------------------------------------
# FedDyn (§2.4, A12: α = 0.01)
# ----------------------------------------------------------------------------

def feddyn_init(params: PyTree) -> PyTree:
  """FedDyn server state h⁰ = 0 (unstacked, float32); also a client's ∇L_k state."""
  return jax.tree.map(lambda x: jnp.zeros(jnp.shape(x), jnp.float32), params)


def feddyn_server(prev: PyTree, deltas: PyTree, h: PyTree, alpha: float = FEDDYN_ALPHA,
                  num_clients_total: int | None = None,
                  weights: jax.Array | None = None) -> tuple[PyTree, PyTree]:
  """FedDyn server over the participants P (Acar et al. 2021, Alg. 1):

    h ← h − α (1/m) Σ_{k∈P} (θ_k − θ)
    θ ← (1/|P|) Σ_{k∈P} θ_k − h / α

  with θ_k = θ + Δ_k, m = `num_clients_total` (default: all K rows
  participate). Under DEA (§2.4, A-REC) Δ_k is the masked delta, i.e.
  θ̂_k = θ + Δ̃_k enters both lines. `weights=None` is the paper's uniform mean;
  given weights w (normalised) replace 1/|P| Σ by Σ w_k and (1/m) Σ by
  (|P|/m) Σ w_k. Returns (new θ, new h).
  """
  k = num_rows(deltas)
  m = k if num_clients_total is None else num_clients_total
  w = (jnp.full((k,), 1.0 / k, jnp.float32) if weights is None
       else normalize_weights(weights))
  mean_delta = tree_mean(_f32(deltas), w)
  new_h = jax.tree.map(lambda hh, d: hh.astype(jnp.float32) - alpha * (k / m) * d,
                       h, mean_delta)
  new_theta = jax.tree.map(
      lambda p, d, hh: (p.astype(jnp.float32) + d - hh / alpha).astype(p.dtype),
      prev, mean_delta, new_h)
  return new_theta, new_h


def feddyn_penalty(params: PyTree, start: PyTree, grad_state: PyTree,
                   alpha: float = FEDDYN_ALPHA) -> jax.Array:
  """FedDyn client's extra loss: −⟨∇L_k(θ_k^{t−1}), θ⟩ + α/2 ‖θ − θ^{t−1}‖².

  `start` is the server model θ^{t−1} the client started from; `grad_state`
  is the client's ∇L_k(θ_k^{t−1}) (zero before its first round).
  """
  lin = sum(jnp.sum(g.astype(jnp.float32) * p.astype(jnp.float32))
            for g, p in zip(jax.tree.leaves(grad_state), jax.tree.leaves(params)))
  return -lin + 0.5 * alpha * sq_dist_trees(params, start)


def feddyn_grad_state(grad_state: PyTree, params: PyTree, start: PyTree,
                      alpha: float = FEDDYN_ALPHA) -> PyTree:
  """FedDyn client state after local training: ∇L_k ← ∇L_k − α (θ_k − θ^{t−1}).

  This is the first-order condition of the local objective at its optimum, so
  at a stationary θ_k it equals the true ∇L_k(θ_k).
  """
  f32 = lambda x: x.astype(jnp.float32)
  return jax.tree.map(lambda g, p, s: f32(g) - alpha * (f32(p) - f32(s)), grad_state, params, start)


# ----------------------------------------------------------------------------
# MOON (§2.4, A12: μ = 1, τ = 0.5)
# ----------------------------------------------------------------------------

def _cosine(a: jax.Array, b: jax.Array, eps: float = 1e-8) -> jax.Array:
  """Cosine similarity over the last axis, norms clamped at eps (torch's CosineSimilarity)."""
  na = jnp.maximum(jnp.linalg.norm(a, axis=-1), eps)
  nb = jnp.maximum(jnp.linalg.norm(b, axis=-1), eps)
  return jnp.sum(a * b, axis=-1) / (na * nb)


def moon_loss(z: jax.Array, z_glob: jax.Array, z_prev: jax.Array,
              mu: float = MOON_MU, tau: float = MOON_TAU) -> jax.Array:
  """MOON model-contrastive loss, batch mean (Li et al. 2021, Eq. 3):

    μ · −log( e^{sim(z, z_glob)/τ} / (e^{sim(z, z_glob)/τ} + Σ_p e^{sim(z, z_prev_p)/τ}) )

  z, z_glob: `[B, D]` representations of the local model being trained and of
  the global model; z_prev: `[B, D]` (the client's previous local model) or
  `[P, B, D]` (a buffer of P previous models). z_glob and z_prev get no
  gradient (MOON computes them from frozen copies).
  """
  z = z.astype(jnp.float32)
  z_glob = jax.lax.stop_gradient(z_glob).astype(jnp.float32)
  z_prev = jax.lax.stop_gradient(z_prev).astype(jnp.float32)
  if z_prev.ndim == z.ndim:
    z_prev = z_prev[None]
  pos = _cosine(z, z_glob)  # [B]
  neg = jax.vmap(lambda zp: _cosine(z, zp))(z_prev)  # [P, B]
  logits = jnp.concatenate([pos[None], neg], axis=0) / tau  # [1 + P, B]
  return mu * jnp.mean(jax.nn.logsumexp(logits, axis=0) - logits[0])


# ----------------------------------------------------------------------------
# FedBN (§2.4)
# ----------------------------------------------------------------------------

_BN_TOKEN = re.compile(r'^(bn\d*|batchnorm\d*|batch_?norm(_\d+)?)$', re.IGNORECASE)


def _is_bn_name(name: str) -> bool:
  """A module name of a BatchNorm: Flax's `BatchNorm_<i>`, or `bn`/`bn1` as a `_` token
  (`fuse_bn` in `models/decoder.py`); never LayerNorm (`norm0`, `patch_norm`)."""
  if _BN_TOKEN.match(name):
    return True
  return any(_BN_TOKEN.match(t) for t in name.split('_'))


def _key_name(k) -> str:
  for attr in ('key', 'name', 'idx'):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def path_names(path) -> tuple[str, ...]:
  return tuple(_key_name(k) for k in path)


def norm_modules(batch_stats: PyTree) -> frozenset:
  """Module paths (names from the root) of the layers that keep batch-norm statistics."""
  return frozenset(path_names(p)[:-1]
                   for p, _ in jax.tree_util.tree_leaves_with_path(batch_stats))


def bn_mask(params: PyTree, batch_stats: PyTree | None = None) -> PyTree:
  """FedBN's label: True on every leaf of a BatchNorm module (its scale and bias).

  With `batch_stats` (the model's `batch_stats` collection, same nesting as
  `params`, stacked or not), a BatchNorm is any module that keeps running
  statistics: exact for every model, e.g. the ResNet's `downsample_1`. Without
  it, module names decide: Flax's `BatchNorm_<i>` or a `bn`/`bn<i>` token
  (`fuse_bn` in `models/decoder.py`, `bn1`), never LayerNorm (`norm0`). Path
  based, so it also works on stacked views and `jax.eval_shape` trees.
  """
  if batch_stats is not None:
    modules = norm_modules(batch_stats)
    return jax.tree_util.tree_map_with_path(
        lambda path, _: path_names(path)[:-1] in modules, params)
  return jax.tree_util.tree_map_with_path(
      lambda path, _: any(_is_bn_name(n) for n in path_names(path)), params)


def keep_local(aggregated: PyTree, local: PyTree, mask: PyTree) -> PyTree:
  """FedBN server: leaves where `mask` (e.g. `bn_mask`) is True keep the clients'
  own `local` rows; the others take `aggregated` (same stacked structure)."""
  return jax.tree.map(lambda a, l, m: l if m else a, aggregated, local, mask)


# ----------------------------------------------------------------------------
# FedGA = FedDG-GA (§2.4)
# ----------------------------------------------------------------------------

def fedga_step(round_idx: jax.Array | int, num_rounds: int,
               step_size: float = FEDGA_STEP_SIZE) -> jax.Array:
  """FedDG-GA's linearly decaying step d^r = d (1 − r / R) for 0-based round r.

  (The reference script passes `step_size − (i − 1) step_size / comm`, one
  round ahead of this; the paper's decay is the one here.)
  """
  return step_size * (1.0 - jnp.asarray(round_idx, jnp.float32) / num_rounds)


def fedga_weights(weights: jax.Array, gaps: jax.Array, step: jax.Array | float) -> jax.Array:
  """FedDG-GA aggregation-weight update (`refine_weight_dict_by_GA`, loss metric):

    a_k ← a_k + (d^r / K) · G_k / max_j |G_j|,   then clip to [0, 1] and renormalise,

  with G_k = L_k(global model after aggregation) − L_k(client k's local model)
  on client k's data: weight moves toward clients the global model serves worst.
  The reference hard-codes 1/3 for its 3 training domains (= 1/K, the initial
  uniform weight). All-zero gaps leave the weights unchanged; the new weights
  are used for the next round's aggregation (`weighted_update`).
  """
  w = jnp.asarray(weights, jnp.float32)
  g = jnp.asarray(gaps, jnp.float32)
  k = w.shape[0]
  scale = jnp.max(jnp.abs(g))
  norm_gap = jnp.where(scale > 0, g / jnp.where(scale > 0, scale, 1.0), 0.0)
  w = jnp.clip(w + norm_gap * step / k, 0.0, 1.0)
  total = jnp.sum(w)
  return jnp.where(total > 0, w / jnp.where(total > 0, total, 1.0), 1.0 / k)


# ----------------------------------------------------------------------------
# FedACG (§2.4, A12: λ = 0.85)
# ----------------------------------------------------------------------------

def fedacg_init(params: PyTree) -> PyTree:
  """FedACG server momentum m⁰ = 0 (unstacked, float32)."""
  return jax.tree.map(lambda x: jnp.zeros(jnp.shape(x), jnp.float32), params)


def fedacg_lookahead(theta: PyTree, momentum: PyTree, lam: float = FEDACG_LAMBDA) -> PyTree:
  """The model the clients start from: θ̃ = θ^{t−1} + λ m^{t−1}."""
  return add_scaled(theta, momentum, lam)


def fedacg_server(prev: PyTree, deltas: PyTree, weights: jax.Array, momentum: PyTree,
                  lam: float = FEDACG_LAMBDA) -> tuple[PyTree, PyTree]:
  """FedACG server (Kim et al. 2024, Alg. 1; `ServerM` with FedACG=True):

    m^t = λ m^{t−1} + Σ_k w_k Δ_k,   θ^t = θ^{t−1} + m^t  (= θ̃ + Σ_k w_k Δ_k)

  `prev` is θ^{t−1} (not the lookahead); Δ_k = θ_k − θ̃ is relative to the
  lookahead θ̃ = `fedacg_lookahead(prev, momentum, lam)` the clients started
  from (under DEA, the masked delta). The reference averages uniformly; pass
  equal weights for that. λ = 0 is FedAvg. Returns (θ^t, m^t).
  """
  mean_delta = tree_mean(_f32(deltas), normalize_weights(weights))
  new_m = jax.tree.map(lambda m, d: lam * m.astype(jnp.float32) + d, momentum, mean_delta)
  return add_scaled(prev, new_m), new_m


def fedacg_penalty(params: PyTree, lookahead: PyTree,
                   beta: float = FEDACG_BETA) -> jax.Array:
  """FedACG client's extra loss β/2 ‖θ − θ̃‖² toward the lookahead θ̃ it started at."""
  return 0.5 * beta * sq_dist_trees(params, lookahead)


# ----------------------------------------------------------------------------
# PCGrad over client updates (§2.5)
# ----------------------------------------------------------------------------

def gram(stacked: PyTree) -> jax.Array:
  """[K, K] inner products of the flattened rows, summed leaf by leaf (no [K, d] copy)."""
  def one(x):
    x = x.astype(jnp.float32).reshape(x.shape[0], -1)
    return jnp.matmul(x, x.T, precision=_HI)
  return sum(one(x) for x in jax.tree.leaves(stacked))


def pcgrad_order(key: jax.Array, num_clients: int) -> jax.Array:
  """[K, K] int32: row k is the random order in which client k visits the clients."""
  keys = jax.random.split(key, num_clients)
  return jax.vmap(lambda kk: jax.random.permutation(kk, num_clients))(keys).astype(jnp.int32)


def pcgrad_coefficients(gram: jax.Array, order: jax.Array) -> jax.Array:
  """[K, K] C with g'_k = Σ_j C_kj Δ_j: PCGrad run on the Gram matrix alone.

  For each k, g'_k starts at Δ_k; for j in `order[k]` (j ≠ k): if
  ⟨g'_k, Δ_j⟩ < 0, g'_k ← g'_k − ⟨g'_k, Δ_j⟩ / ‖Δ_j‖² Δ_j. Projections are
  against the original Δ_j, as in PCGrad. Since g'_k stays in span{Δ}, every
  inner product is c_k · G[:, j].
  """
  g = jnp.asarray(gram, jnp.float32)
  k = g.shape[0]
  eye = jnp.eye(k, dtype=jnp.float32)

  def row(i, perm):
    def visit(c, j):
      dot = jnp.dot(c, g[:, j], precision=_HI)
      nj = g[j, j]
      hit = (j != i) & (dot < 0) & (nj > 0)
      return c - jnp.where(hit, dot / jnp.where(nj > 0, nj, 1.0), 0.0) * eye[j], None
    c, _ = jax.lax.scan(visit, eye[i], perm)
    return c

  return jax.vmap(row)(jnp.arange(k), jnp.asarray(order, jnp.int32))


def pcgrad(deltas: PyTree, key: jax.Array) -> PyTree:
  """PCGrad at the server over the client updates (spec §2.5): each client's
  flattened Δ_k is projected off every other Δ_j it conflicts with (negative
  inner product), visiting the others in a random order drawn from `key`.
  Returns the projected updates g'_k (stacked like `deltas`) for the base rule.
  """
  order = pcgrad_order(key, num_rows(deltas))
  return mix_rows(pcgrad_coefficients(gram(deltas), order), deltas)


# ----------------------------------------------------------------------------
# FedHEAL (§2.5, A12: τ = 0.3, β = 0.4)
# ----------------------------------------------------------------------------

class HealState(NamedTuple):
  """FedHEAL's server state.

  history: stacked `[K, ...]` float32, per client and coordinate the fraction of
    its past rounds in which θ − θ_k ≥ 0 (FedHEAL's `increase_history`);
  weights: `[K]` the un-normalised client weights (`previous_weights`);
  delta: `[K]` their last momentum step (`previous_delta_weights`);
  count: `[K]` int32, the rounds each client took part in so far (FedHEAL's
    `epoch_index` under full participation, where every entry equals it).
  """
  history: PyTree
  weights: jax.Array
  delta: jax.Array
  count: jax.Array


def heal_init(stacked: PyTree, weights: jax.Array | None = None) -> HealState:
  """FedHEAL state for the `[K, ...]` structure of `stacked` (deltas or client params).

  FedHEAL starts every client at weight 1/K (`weights=None`); data-size
  weights may be passed instead (normalised here).
  """
  k = num_rows(stacked)
  w = jnp.full((k,), 1.0 / k, jnp.float32) if weights is None else normalize_weights(weights)
  return HealState(
      history=jax.tree.map(lambda x: jnp.zeros(jnp.shape(x), jnp.float32), stacked),
      weights=w, delta=jnp.zeros((k,), jnp.float32), count=jnp.zeros((k,), jnp.int32))


def heal_terms(state: HealState, deltas: PyTree, tau: float = HEAL_TAU,
               beta: float = HEAL_BETA,
               valid: jax.Array | None = None) -> tuple[PyTree, HealState, dict]:
  """One FedHEAL round (`FedAvGHEAL.loc_update`) as per-client terms
  t_k = q_k ⊙ m_k ⊙ Δ_k whose sum over k is FedHEAL's step.

  `valid` ([K] bool, None: all): the round's participants, FedHEAL's online clients.
  Only they update their history (r below is each client's own count of rounds taken
  part in), their weight momentum δ and weight a; p normalises a over them, so the
  others' terms are 0 and their state is kept.

  With u_k = θ − θ_k = −Δ_k and s_k = [u_k ≥ 0] per coordinate (FedHEAL's sign
  convention, so Δ = 0 counts as "decrease"):
  1. mask: in the first round m_k = 1; afterwards m_k = [c_k > τ] with
     c_k = H_k where s_k else 1 − H_k (history of this sign); then
     H_k ← (H_k r + s_k) / (r + 1), r = rounds so far.
  2. distance d_k = Σ_leaves ‖m_k ⊙ Δ_k‖₂ (a sum of per-tensor norms, as FedHEAL).
  3. weights: δ_k ← (1 − β) δ_k + β d_k / Σ_j d_j;  a_k ← a_k + δ_k;
     p_k = a_k / Σ_j a_j.
  4. per coordinate, q_k = p_k m_k / Σ_j p_j m_j, or p_k where no client keeps it.
  Returns (stacked terms, new state, {'weights': p [K], 'masks': stacked m}).
  """
  k = num_rows(deltas)
  on = jnp.ones((k,), bool) if valid is None else jnp.asarray(valid, bool)
  count = state.count
  r = count.astype(jnp.float32)
  first = count == 0

  def leaf_mask(d, h):
    s = (d.astype(jnp.float32) <= 0).astype(jnp.float32)
    cons = jnp.where(s > 0, h, 1.0 - h)
    rk, firstk, onk = _rows(r, d.ndim), _rows(first, d.ndim), _rows(on, d.ndim)
    m = jnp.where(firstk, 1.0, (cons > tau).astype(jnp.float32)) * onk
    return m, jnp.where(onk, (h * rk + s) / (rk + 1.0), h)

  pairs = jax.tree.map(leaf_mask, deltas, state.history)
  is_pair = lambda x: isinstance(x, tuple)
  masks = jax.tree.map(lambda p: p[0], pairs, is_leaf=is_pair)
  history = jax.tree.map(lambda p: p[1], pairs, is_leaf=is_pair)
  masked = jax.tree.map(lambda d, m: d.astype(jnp.float32) * m, deltas, masks)

  dist = sum(jnp.sqrt(jnp.sum(jnp.square(x.reshape(k, -1)), axis=1))
             for x in jax.tree.leaves(masked))
  total = jnp.sum(dist)
  share = jnp.where(total > 0, dist / jnp.where(total > 0, total, 1.0), 0.0)
  delta_w = jnp.where(on, (1.0 - beta) * state.delta + beta * share, state.delta)
  raw_w = jnp.where(on, state.weights + delta_w, state.weights)
  online = jnp.where(on, raw_w, 0.)
  p = online / jnp.sum(online)

  def leaf_term(md, m):
    pk = _rows(p, m.ndim)
    a = pk * m
    tot = jnp.sum(a, axis=0, keepdims=True)
    q = jnp.where(tot == 0, pk, a / jnp.where(tot == 0, 1.0, tot))
    return q * md

  terms = jax.tree.map(leaf_term, masked, masks)
  new_state = HealState(history=history, weights=raw_w, delta=delta_w,
                        count=count + on.astype(jnp.int32))
  return terms, new_state, {'weights': p, 'masks': masks}


def heal_aggregate(state: HealState, prev: PyTree, deltas: PyTree, tau: float = HEAL_TAU,
                   beta: float = HEAL_BETA) -> tuple[PyTree, HealState, dict]:
  """One FedHEAL round: θ ← θ + Σ_k q_k m_k Δ_k (`heal_terms`).
  Returns (new θ, new state, {'weights': p [K], 'masks': stacked m}).
  """
  terms, new_state, logs = heal_terms(state, deltas, tau, beta)
  new_theta = jax.tree.map(
      lambda p, t: (p.astype(jnp.float32) + jnp.sum(t, axis=0)).astype(p.dtype), prev, terms)
  return new_theta, new_state, logs


__all__ = [
    'FEDACG_BETA', 'FEDACG_LAMBDA', 'FEDDYN_ALPHA', 'FEDGA_STEP_SIZE', 'HEAL_BETA',
    'HEAL_TAU', 'MOON_MU', 'MOON_TAU',
    'HealState',
    'bn_mask',
    'fedacg_init',
    'fedacg_lookahead',
    'fedacg_penalty',
    'fedacg_server',
    'feddyn_grad_state',
    'feddyn_init',
    'feddyn_penalty',
    'feddyn_server',
    'fedga_step',
    'fedga_weights',
    'fednova_update',
    'gram',
    'heal_aggregate',
    'heal_terms',
    'heal_init',
    'keep_local',
    'add_scaled',
    'moon_loss',
    'norm_modules',
    'path_names',
    'normalize_weights',
    'pcgrad',
    'pcgrad_coefficients',
    'pcgrad_order',
    'weighted_update',
]
