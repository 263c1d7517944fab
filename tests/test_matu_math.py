"""Tests for fedjax_mtl.algorithms.matu_math (MaTU's math, spec matu.md §2).

Every check compares the JAX code (run through `jax.jit`, float32 inputs) with
an independent NumPy oracle written from the spec (float64, explicit Python
loops over clients and tasks):

* `unify` vs a re-implementation of EMR-Merging's `emr_merge` (§2.1: flag =
  (sum > 0)*2 - 1, mask_i = tau_i*flag > 0, unified = max_i |mask_i*tau_i|*flag,
  rescaler_i = sum|tau_i| / sum|unified*mask_i|), several groups of different
  sizes in shuffled row order, with padding rows full of garbage that must not
  influence anything (mask False, lambda 0); tie='zero' vs tie='emr' agree on
  continuous data; exact-zero sums follow each tie rule;
* the k_n = 1 identities (§2.6): unified = tau, mask = (tau != 0), lambda = 1;
* the server's alpha / m_hat (Eq. 3) on hand-made sign patterns, including the
  rho boundary (alpha == rho -> 1) and a task held by one client (m_hat = mask);
* `similarity` (Eq. 5): symmetric, in [0, 1], orthogonal signs -> 0.5,
  diagonal = ½(fraction nonzero + 1);
* `cross_weights`: top-kappa of S > eps, self and absent tasks excluded;
  'uniform' and 'none';
* one full round (`round_update`) against a NumPy oracle of the pseudo-code of
  §2.5 (+ §7 items 1, 2: the server sees reconstructions, Z^t excludes t,
  'sum' / 'avg' combine), for every cross / combine mode and kappa in {1, 2};
* the l1 norm kept by the reconstruction (§2.6);
* purity of `round_update` (bitwise-deterministic, inputs untouched, no state);
* the bit accounting of §7 item 14, with `numpy.packbits` for the mask sizes.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_mtl.algorithms import matu_math as mm

_unify = jax.jit(mm.unify, static_argnames=('tie',))
_similarity = jax.jit(mm.similarity)
_cross = jax.jit(mm.cross_weights, static_argnames=('cross', 'kappa'))
# rho and eps are traced (fewer compilations); kappa and the modes are static.
_server = jax.jit(mm.server, static_argnames=('num_tasks', 'kappa', 'cross', 'combine'))
_round = jax.jit(mm.round_update, static_argnames=('num_tasks', 'tie', 'kappa', 'cross',
                                                   'combine'))

GARBAGE = 1e30  # padding rows' values: would dominate every sum / max if they leaked


def f32(x):
  return jnp.asarray(np.asarray(x, np.float32))


# ----------------------------------------------------------------------------
# NumPy oracles (float64, explicit loops)
# ----------------------------------------------------------------------------


def np_emr_merge(taus, tie='emr'):
  """EMR-Merging's `emr_merge` on a list of k task vectors [d] (float64).

  Returns (unified [d], masks [k][d] bool, rescalers [k])."""
  taus = [np.asarray(t, np.float64) for t in taus]
  d = taus[0].shape[0]
  total = np.zeros(d)
  for t in taus:
    total += t
  if tie == 'emr':
    flag = (total > 0) * 2. - 1.
  else:
    flag = np.sign(total)
  masks = [(t * flag) > 0 for t in taus]
  mx = np.zeros(d)
  for t, m in zip(taus, masks):
    mx = np.maximum(mx, np.abs(m * t))
  unified = mx * flag
  rescalers = []
  for t, m in zip(taus, masks):
    den = np.sum(np.abs(unified * m))
    rescalers.append(np.sum(np.abs(t)) / den if den > 0 else 0.)
  return unified, masks, np.array(rescalers)


def np_similarity(vecs):
  """Eq. 5 with explicit loops: S[a, b] = ½(1/d Σ_i sgn(a_i) sgn(b_i) + 1)."""
  vecs = np.asarray(vecs, np.float64)
  n, d = vecs.shape
  s = np.zeros((n, n))
  for a in range(n):
    for b in range(n):
      acc = 0.
      for i in range(d):
        acc += np.sign(vecs[a, i]) * np.sign(vecs[b, i])
      s[a, b] = 0.5 * (acc / d + 1.)
  return s


def np_cross_weights(sim, present, cross, eps, kappa):
  """W[t, t'] from the spec: top-kappa of {t' present, t' != t, S > eps}, weight
  S(t, t'); 'uniform': 1/|T_r| over every present t' (t included); 'none': 0."""
  sim = np.asarray(sim, np.float64)
  t_n = sim.shape[0]
  w = np.zeros((t_n, t_n))
  tasks_r = [t for t in range(t_n) if present[t]]
  for t in tasks_r:
    if cross == 'none':
      continue
    if cross == 'uniform':
      for u in tasks_r:
        w[t, u] = 1. / len(tasks_r)
      continue
    cand = [u for u in tasks_r if u != t and sim[t, u] > eps]
    cand.sort(key=lambda u: -sim[t, u])  # stable: a tie keeps the lower index first
    for u in cand[:kappa]:
      w[t, u] = sim[t, u]
  return w


def np_round(rows, num_tasks, *, rho, eps, kappa, cross, combine, tie='emr'):
  """One MaTU round (spec §2.5) on `rows` = [(client, task, tau [d], count, valid)].

  Returns (recovered [S, d] in row order, new task vectors {t: [d]}, cross weights
  [T, T])."""
  d = len(rows[0][2])
  clients = sorted({r[0] for r in rows if r[4]})
  # ---- clients: unify, masks, rescalers (Eq. 2) ----
  up = {}  # client -> (unified, {task: (mask, lambda, count)})
  for n in clients:
    mine = [r for r in rows if r[4] and r[0] == n]
    uni, masks, lams = np_emr_merge([r[2] for r in mine], tie)
    up[n] = (uni, {r[1]: (masks[i], lams[i], r[3]) for i, r in enumerate(mine)})
  # ---- server ----
  present = [any(t in up[n][1] for n in clients) for t in range(num_tasks)]
  tasks_r = [t for t in range(num_tasks) if present[t]]
  t_hat, m_hat = {}, {}
  for t in tasks_r:
    holders = [n for n in clients if t in up[n][1]]
    total_count = sum(up[n][1][t][2] for n in holders)
    sgn_sum = np.zeros(d)
    for n in holders:
      sgn_sum += np.sign(up[n][1][t][0] * up[n][0])  # sgn(m_n^t ⊙ τ_n)
    alpha = np.abs(sgn_sum / len(holders))
    mh = np.where(alpha >= rho, 1., alpha)
    acc = np.zeros(d)
    for n in holders:
      mask, lam, count = up[n][1][t]
      gamma = count / total_count
      acc += gamma * lam * mh * (mask * up[n][0])  # reconstruction m_n^t ⊙ τ_n (§7 item 1)
    t_hat[t], m_hat[t] = acc, mh
  sim_r = np_similarity(np.stack([t_hat[t] for t in tasks_r]))
  sim = np.full((num_tasks, num_tasks), 0.5)
  for a, ta in enumerate(tasks_r):
    for b, tb in enumerate(tasks_r):
      sim[ta, tb] = sim_r[a, b]
  w = np_cross_weights(sim, present, cross, eps, kappa)
  new = {}
  for t in tasks_r:
    tilde = np.zeros(d)
    for u in tasks_r:
      if w[t, u] != 0:
        tilde += w[t, u] * m_hat[t] * t_hat[u]
    if combine == 'sum':
      new[t] = t_hat[t] + tilde
    else:
      tot = sum(w[t, u] for u in tasks_r)
      new[t] = 0.5 * (t_hat[t] + tilde / tot) if tot > 0 else t_hat[t]
  # ---- downlink: unify the new vectors of each client's tasks, recover ----
  rec = np.zeros((len(rows), d))
  for n in clients:
    idx = [i for i, r in enumerate(rows) if r[4] and r[0] == n]
    uni, masks, lams = np_emr_merge([new[rows[i][1]] for i in idx], tie)
    for j, i in enumerate(idx):
      rec[i] = lams[j] * masks[j] * uni
  return rec, new, w


# ----------------------------------------------------------------------------
# Shared fixtures
# ----------------------------------------------------------------------------


def _groups_case(seed=0, d=10, sizes=(1, 2, 3, 5)):
  """Random rows for groups of the given sizes, shuffled, plus 3 padding rows
  (one in an existing group, one in an unused id, one NaN/inf-filled)."""
  rng = np.random.default_rng(seed)
  vecs, group = [], []
  for g, k in enumerate(sizes):
    for _ in range(k):
      vecs.append(rng.normal(size=d))
      group.append(g)
  n_valid = len(vecs)
  pad = [np.full(d, GARBAGE), -np.full(d, GARBAGE), np.full(d, GARBAGE)]
  pad[2][::2] = np.nan
  pad[2][1::2] = np.inf
  vecs += pad
  group += [1, len(sizes), 3]  # ids shared with real groups, and an unused one
  valid = [True] * n_valid + [False] * 3
  order = rng.permutation(len(vecs))
  vecs = np.stack(vecs)[order]
  group = np.array(group)[order]
  valid = np.array(valid)[order]
  return vecs, group, valid


def _check_unify_vs_ref(vecs, group, valid, tie, rtol=1e-5):
  uni, masks, lams = _unify(f32(vecs), jnp.asarray(group, jnp.int32), jnp.asarray(valid), tie=tie)
  uni, masks, lams = np.asarray(uni), np.asarray(masks), np.asarray(lams)
  s = vecs.shape[0]
  assert uni.shape == vecs.shape and masks.shape == vecs.shape and lams.shape == (s,)
  assert masks.dtype == bool
  for g in range(s):
    rows = [i for i in range(s) if valid[i] and group[i] == g]
    if not rows:
      np.testing.assert_array_equal(uni[g], 0.)  # an id no valid row has
      continue
    ref_u, ref_m, ref_l = np_emr_merge([vecs[i] for i in rows], tie)
    np.testing.assert_allclose(uni[g], ref_u, rtol=rtol, atol=0)
    for j, i in enumerate(rows):
      np.testing.assert_array_equal(masks[i], ref_m[j])
      # the paper's definition of the mask, m^i = (τ^i ⊙ τ > 0), is the same
      np.testing.assert_array_equal(masks[i], vecs[i] * ref_u > 0)
      np.testing.assert_allclose(lams[i], ref_l[j], rtol=rtol, atol=0)
  for i in range(s):
    if not valid[i]:
      assert not masks[i].any()
      assert lams[i] == 0.
  assert np.all(np.isfinite(uni)) and np.all(np.isfinite(lams))
  return uni, masks, lams


# ----------------------------------------------------------------------------
# 1. unify vs EMR-Merging
# ----------------------------------------------------------------------------


@pytest.mark.parametrize('seed', [0, 1])
@pytest.mark.parametrize('tie', ['emr', 'zero'])
def test_unify_matches_emr_merge_reference(seed, tie):
  vecs, group, valid = _groups_case(seed)
  _check_unify_vs_ref(vecs, group, valid, tie)


def test_unify_exact_zero_sums_follow_tie_rule():
  """Integer data with exact cancellations and zeros: each tie rule is EMR's
  (flag = -1 on a zero sum) or sgn(0) = 0, against the reference."""
  vecs = np.array([
      [1., -1., 0., 2., -3., 0.],
      [-1., 1., 0., -2., 1., 0.],
      [0., 0., 0., 0., 2., 5.],  # group 1, k = 1, one exact zero
      [3., -3., 1., 0., 0., -1.],  # group 2
      [-3., 3., -1., 0., 0., 1.],  # group 2: sums exactly zero everywhere
      [GARBAGE] * 6,  # padding in group 0
  ])
  group = np.array([0, 0, 1, 2, 2, 0])
  valid = np.array([True] * 5 + [False])
  for tie in ('emr', 'zero'):
    uni, masks, lams = _check_unify_vs_ref(vecs, group, valid, tie)
  # group 2 under 'zero': nothing survives, both rows fully masked, lambda 0
  assert not masks[3].any() and not masks[4].any() and lams[3] == lams[4] == 0.
  # ... under 'emr' the zero sum means flag -1: the negative entries survive
  _, masks_e, lams_e = _unify(f32(vecs), jnp.asarray(group), jnp.asarray(valid), tie='emr')
  np.testing.assert_array_equal(np.asarray(masks_e)[3], vecs[3] < 0)
  np.testing.assert_array_equal(np.asarray(masks_e)[4], vecs[4] < 0)


@pytest.mark.parametrize('seed', [0, 3])
def test_unify_tie_zero_equals_emr_on_continuous_data(seed):
  vecs, group, valid = _groups_case(seed, sizes=(2, 3, 4))
  args = (f32(vecs), jnp.asarray(group), jnp.asarray(valid))
  ue, me, le = _unify(*args, tie='emr')
  uz, mz, lz = _unify(*args, tie='zero')
  np.testing.assert_array_equal(np.asarray(me), np.asarray(mz))
  np.testing.assert_array_equal(np.asarray(le), np.asarray(lz))
  np.testing.assert_array_equal(
      np.asarray(mm.reconstruct(ue, args[1], me, le)),
      np.asarray(mm.reconstruct(uz, args[1], mz, lz)))
  # the unified vectors of real groups agree too (ids without rows: 0 in both)
  used = np.unique(group[valid])
  np.testing.assert_array_equal(np.asarray(ue)[used], np.asarray(uz)[used])


# ----------------------------------------------------------------------------
# 2. k_n = 1 identities (§2.6)
# ----------------------------------------------------------------------------


@pytest.mark.parametrize('tie', ['emr', 'zero'])
def test_single_task_client_identities(tie):
  rng = np.random.default_rng(5)
  d, s = 9, 5
  vecs = rng.normal(size=(s, d))
  vecs[rng.random((s, d)) < 0.3] = 0.  # exact zeros: mask must be tau != 0
  vecs[4] = GARBAGE  # padding row in group 4
  group = np.arange(s)
  valid = np.array([True] * 4 + [False])
  uni, masks, lams = _unify(f32(vecs), jnp.asarray(group), jnp.asarray(valid), tie=tie)
  uni, masks, lams = np.asarray(uni), np.asarray(masks), np.asarray(lams)
  v32 = vecs.astype(np.float32)
  np.testing.assert_array_equal(uni[:4], v32[:4])
  np.testing.assert_array_equal(masks[:4], v32[:4] != 0)
  np.testing.assert_allclose(lams[:4], 1., rtol=1e-6)
  rec = np.asarray(mm.reconstruct(jnp.asarray(uni), jnp.asarray(group), jnp.asarray(masks),
                                   jnp.asarray(lams)))
  np.testing.assert_allclose(rec[:4], v32[:4], rtol=1e-6)
  np.testing.assert_array_equal(uni[4], 0.)
  assert not masks[4].any() and lams[4] == 0.


# ----------------------------------------------------------------------------
# 3. alpha and m_hat (Eq. 3)
# ----------------------------------------------------------------------------

# Task 0 held by 5 clients: rows = clients, columns = coordinates; the sign of
# m_n ⊙ τ_n. alpha = |mean|, expected m_hat for rho = 0.4.
_PATTERN = np.array([
    #  a=1  .2  .4  0   .8  .2  0   .2  .4
    [+1, +1, +1, +1, -1, +1, 0, -1, +1],
    [+1, +1, +1, -1, -1, 0, 0, -1, +1],
    [+1, +1, 0, 0, -1, 0, 0, +1, +1],
    [+1, -1, 0, 0, -1, 0, 0, 0, -1],
    [+1, -1, 0, 0, 0, 0, 0, 0, 0],
], np.float64)
_ALPHA = np.array([1., .2, .4, 0., .8, .2, 0., .2, .4])
_MHAT_RHO_04 = np.array([1., .2, 1., 0., 1., .2, 0., .2, 1.])  # alpha == rho -> 1
_SINGLE = np.array([+1, 0, -1, -1, 0, +1, +1, 0, -1], np.float64)  # task 1: one client


def _alpha_case():
  """Server inputs for the hand-made patterns; masked-out coordinates of the
  unified vectors hold garbage the server must ignore."""
  rng = np.random.default_rng(7)
  d = _PATTERN.shape[1]
  signs = np.concatenate([_PATTERN, _SINGLE[None], np.zeros((1, d))])  # + a padding row
  mags = rng.uniform(0.5, 2.0, size=signs.shape)
  masks = signs != 0
  unified = np.where(masks, signs * mags, rng.normal(size=signs.shape) * 100)
  unified[-1] = GARBAGE
  masks[-1] = True  # a padding row's mask: must not count either
  group = np.arange(signs.shape[0])
  task = np.array([0, 0, 0, 0, 0, 1, 0])
  counts = np.array([3, 1, 4, 1, 5, 9, 10 ** 6])
  lambdas = rng.uniform(0.5, 2.0, size=signs.shape[0])
  valid = np.array([True] * 6 + [False])
  return unified, group, masks, lambdas, task, counts, valid


def _weighted_recon(unified, masks, lambdas, task, counts, valid, t):
  rows = [i for i in range(len(task)) if valid[i] and task[i] == t]
  tot = sum(counts[i] for i in rows)
  return sum(counts[i] / tot * lambdas[i] * masks[i] * unified[i] for i in rows)


@pytest.mark.parametrize('rho, mhat0', [(0.4, _MHAT_RHO_04),
                                        (0.41, np.where(_ALPHA >= 0.41, 1., _ALPHA))])
@pytest.mark.parametrize('cross', ['none', 'uniform'])
def test_alpha_and_mhat_hand_made(rho, mhat0, cross):
  """new^t = m̂^t ⊙ a^t (+ m̂^t ⊙ ½ Σ_t' m̂^t' ⊙ a^t' for 'uniform'), with
  a^t = Σ γ λ m ⊙ τ_n: 'uniform' exposes m̂^t on every coordinate where the
  other task's vector is nonzero, so m̂ of the single-holder task is visible."""
  unified, group, masks, lambdas, task, counts, valid = _alpha_case()
  new, present, logs = _server(f32(unified), jnp.asarray(group), jnp.asarray(masks),
                               f32(lambdas), jnp.asarray(task), jnp.asarray(counts),
                               jnp.asarray(valid), 3, rho=rho, eps=0.5, kappa=2, cross=cross,
                               combine='sum')
  a = [_weighted_recon(unified, masks, lambdas, task, counts, valid, t) for t in (0, 1)]
  mhat1 = (_SINGLE != 0).astype(np.float64)  # single holder: m̂ = its mask as 0/1
  mh = [mhat0, mhat1]
  t_hat = [mh[t] * a[t] for t in (0, 1)]
  if cross == 'none':
    expect = t_hat
  else:
    expect = [t_hat[t] + mh[t] * 0.5 * (t_hat[0] + t_hat[1]) for t in (0, 1)]
  new = np.asarray(new)
  np.testing.assert_allclose(new[0], expect[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new[1], expect[1], rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(new[2], 0.)  # absent task
  np.testing.assert_array_equal(np.asarray(present), [True, True, False])
  # the logged agreement: fraction of coordinates with alpha >= rho
  np.testing.assert_allclose(np.asarray(logs['matu_agree']),
                             [np.mean(_ALPHA >= rho), np.mean(_SINGLE != 0), 0.], rtol=1e-6)
  if cross == 'uniform':
    # the single-holder task's m̂ is 0 where its mask is 0 although task 0 is not
    off = (_SINGLE == 0) & (t_hat[0] != 0)
    assert off.any()
    np.testing.assert_array_equal(new[1][off], 0.)


# ----------------------------------------------------------------------------
# 4. similarity (Eq. 5)
# ----------------------------------------------------------------------------


def test_similarity_properties():
  rng = np.random.default_rng(11)
  vecs = rng.normal(size=(5, 16))
  vecs[rng.random(vecs.shape) < 0.3] = 0.
  vecs[4] = 0.  # an all-zero (absent) task
  s = np.asarray(_similarity(f32(vecs)))
  np.testing.assert_allclose(s, np_similarity(vecs), rtol=1e-6)
  np.testing.assert_array_equal(s, s.T)
  assert np.all(s >= 0.) and np.all(s <= 1.)
  np.testing.assert_allclose(np.diag(s), 0.5 * (np.mean(vecs != 0, axis=1) + 1.), rtol=1e-6)
  np.testing.assert_allclose(s[4], 0.5, rtol=0)  # a zero vector: neither agrees nor conflicts
  # orthogonal sign patterns give 0.5, opposite 0, equal 1
  a = np.array([1., 2., 3., 4.])
  b = np.array([5., -1., 2., -7.])
  s = np.asarray(_similarity(f32(np.stack([a, b, -a, 2 * a]))))
  np.testing.assert_allclose(s[0, 1], 0.5, rtol=0)
  np.testing.assert_allclose(s[0, 2], 0., atol=0)
  np.testing.assert_allclose(s[0, 3], 1., rtol=0)


# ----------------------------------------------------------------------------
# 5. cross_weights
# ----------------------------------------------------------------------------


def test_cross_weights_hand_made():
  sim = np.array([
      [1.0, 0.9, 0.7, 0.5, 0.95],
      [0.9, 0.8, 0.6, 0.55, 0.4],
      [0.7, 0.6, 1.0, 0.3, 0.99],
      [0.5, 0.55, 0.3, 1.0, 0.2],
      [0.95, 0.4, 0.99, 0.2, 1.0],
  ])
  present = np.array([True, True, True, True, False])  # task 4 absent
  args = (f32(sim), jnp.asarray(present))
  w1 = np.asarray(_cross(*args, cross='similarity', eps=0.5, kappa=1))
  expect1 = np.zeros((5, 5))
  expect1[0, 1] = 0.9  # 0.95 (task 4) is absent, 1.0 is itself
  expect1[1, 0] = 0.9
  expect1[2, 0] = 0.7
  expect1[3, 1] = 0.55  # S(3, 0) = 0.5 == eps: excluded (strict >)
  np.testing.assert_allclose(w1, expect1, rtol=1e-6, atol=0)
  w2 = np.asarray(_cross(*args, cross='similarity', eps=0.5, kappa=2))
  expect2 = expect1.copy()
  expect2[0, 2] = 0.7
  expect2[1, 2] = 0.6
  expect2[2, 1] = 0.6
  np.testing.assert_allclose(w2, expect2, rtol=1e-6, atol=0)
  # kappa >= T: all candidates
  w9 = np.asarray(_cross(*args, cross='similarity', eps=0.5, kappa=9))
  np.testing.assert_allclose(w9, np_cross_weights(sim, present, 'similarity', 0.5, 9),
                             rtol=1e-6, atol=0)
  assert np.all(np.diag(w9) == 0.) and np.all(w9[4] == 0.) and np.all(w9[:, 4] == 0.)
  wu = np.asarray(_cross(*args, cross='uniform', eps=0.5, kappa=1))
  expect_u = np.zeros((5, 5))
  expect_u[:4, :4] = 0.25  # 1/|T_r|, t itself included
  np.testing.assert_allclose(wu, expect_u, rtol=1e-6, atol=0)
  wn = np.asarray(_cross(*args, cross='none', eps=0.5, kappa=1))
  np.testing.assert_array_equal(wn, 0.)
  # ties: the spec does not order them; the code's docstring says the lower
  # task index wins, which is what this checks
  tie = np.array([[1., .7, .7], [.7, 1., .6], [.7, .6, 1.]])
  wt = np.asarray(_cross(f32(tie), jnp.ones(3, bool), cross='similarity', eps=0.5, kappa=1))
  np.testing.assert_allclose(wt, [[0., .7, 0.], [.7, 0., 0.], [.7, 0., 0.]], rtol=1e-6)


@pytest.mark.parametrize('kappa', [1, 2, 6])
def test_cross_weights_random_vs_oracle(kappa):
  for seed, eps in [(0, 0.3), (1, 0.5), (2, 0.6)]:
    rng = np.random.default_rng(seed * 10 + kappa)
    t = 6
    a = rng.uniform(0, 1, size=(t, t))
    sim = (a + a.T) / 2
    np.fill_diagonal(sim, 1.)
    present = rng.random(t) < 0.8
    present[0] = True
    w = np.asarray(_cross(f32(sim), jnp.asarray(present), cross='similarity', eps=eps,
                          kappa=kappa))
    np.testing.assert_allclose(w, np_cross_weights(sim, present, 'similarity', eps, kappa),
                               rtol=1e-6, atol=0)
    assert np.all((w > 0).sum(axis=1) <= kappa)


# ----------------------------------------------------------------------------
# 6. one full round vs the §2.5 oracle
# ----------------------------------------------------------------------------

_D = 12
# client -> its tasks; client0 {0, 1}, client1 {1, 2}, client2 {0, 1, 2}
_HOLD = {0: (0, 1), 1: (1, 2), 2: (0, 1, 2)}


def _round_case(seed=2, d=None):
  """Rows (client, task, tau, count, valid): tasks 0 and 1 share most of a
  common direction (similar: S > eps), task 2 is mostly its own; one padding row.
  `d` columns (default `_D`)."""
  _D = d or globals()['_D']
  rng = np.random.default_rng(seed)
  common = rng.normal(size=_D)
  base = {0: common + 0.3 * rng.normal(size=_D),
          1: common + 0.3 * rng.normal(size=_D),
          2: 0.4 * common + rng.normal(size=_D)}
  rows = []
  for n, tasks in _HOLD.items():
    for t in tasks:
      tau = base[t] + 0.5 * rng.normal(size=_D)
      rows.append((n, t, tau, int(rng.integers(5, 50)), True))
  rows.insert(3, (0, 1, np.full(_D, GARBAGE), 10 ** 6, False))  # padding row, client 0's id
  return rows


def _round_inputs(rows):
  return (f32(np.stack([r[2] for r in rows])), jnp.asarray([r[0] for r in rows], jnp.int32),
          jnp.asarray([r[1] for r in rows], jnp.int32),
          jnp.asarray([r[3] for r in rows], jnp.int32), jnp.asarray([r[4] for r in rows]))


@pytest.mark.parametrize('cross, kappa, combine, num_tasks', [
    (cross, kappa, combine, 3)
    for cross, kappa in [('similarity', 1), ('similarity', 2), ('none', 1), ('uniform', 1)]
    for combine in ('sum', 'avg')
] + [  # 4 tasks: task 3 is absent this round (no weight, not in |T_r|, output 0)
    ('similarity', 2, 'avg', 4), ('uniform', 1, 'avg', 4),
])
def test_round_update_matches_oracle(cross, kappa, combine, num_tasks):
  rows = _round_case()
  kw = dict(rho=0.4, eps=0.5, kappa=kappa, cross=cross, combine=combine)
  rec_ref, new_ref, w_ref = np_round(rows, num_tasks, **kw)
  if cross == 'similarity':
    assert (w_ref > 0).any()  # the test exercises the cross-task path
  rec, logs = _round(*_round_inputs(rows), num_tasks, **kw)
  rec = np.asarray(rec)
  np.testing.assert_allclose(rec, rec_ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(rec[3], 0.)  # the padding row
  np.testing.assert_allclose(np.asarray(logs['matu_cross_weights']), w_ref, rtol=1e-5, atol=0)
  np.testing.assert_allclose(np.asarray(logs['matu_tau_l1']),
                             [np.abs(new_ref[t]).sum() if t in new_ref else 0.
                              for t in range(num_tasks)], rtol=1e-5)
  if cross == 'similarity':
    assert (np.asarray(logs['matu_cross_weights']) > 0).any()


@pytest.mark.parametrize('single', [False, True])
def test_round_update_over_many_column_blocks_matches_oracle(monkeypatch, single):
  """`round_update` walks column blocks (`round_blocks`): with 128-column blocks over
  1,000 columns (seven full blocks and a ragged one) it is the oracle's round, for
  multi-task clients and for one task per client (the path without segment ops)."""
  monkeypatch.setattr(mm, '_BLOCK', 1)  # the smallest block: 128 columns
  rows = _round_case(d=1000)
  if single:  # one row per client: client ids 0..S-1
    rows = [(i, t, tau, c, ok) for i, (_, t, tau, c, ok) in enumerate(rows)]
  kw = dict(rho=0.4, eps=0.5, kappa=2, cross='similarity', combine='avg')
  rec_ref, _, w_ref = np_round(rows, 3, **kw)
  rec, logs = jax.jit(mm.round_update, static_argnames=('num_tasks', 'kappa', 'cross',
                                                        'combine'))(*_round_inputs(rows), 3, **kw)
  np.testing.assert_allclose(np.asarray(rec), rec_ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(logs['matu_cross_weights']), w_ref, rtol=1e-5, atol=0)


def test_round_case_similarity_has_no_boundary_ties():
  """The round data's task similarities: some above eps, some not, and no tie
  at a top-kappa boundary (the spec does not order ties)."""
  rows = _round_case()
  # recompute the server's S from its τ̂ (cross='none', 'sum' returns τ̂ itself)
  _, t_hat, _ = np_round(rows, 3, rho=0.4, eps=0.5, kappa=1, cross='none', combine='sum')
  s = np_similarity(np.stack([t_hat[t] for t in range(3)]))
  off = s[~np.eye(3, dtype=bool)]
  assert (off > 0.5).any()  # cross-task transfer happens ...
  assert (off <= 0.5).any()  # ... and eps filters something out (here S == eps exactly)
  for t in range(3):
    others = sorted((s[t, u] for u in range(3) if u != t), reverse=True)
    assert others[0] != others[1] or others[0] <= 0.5


# ----------------------------------------------------------------------------
# 7. the reconstruction keeps the l1 norm
# ----------------------------------------------------------------------------


def test_reconstruction_keeps_l1_norm():
  vecs, group, valid = _groups_case(4, d=16, sizes=(2, 3, 4, 1))
  g = jnp.asarray(group)
  uni, masks, lams = _unify(f32(vecs), g, jnp.asarray(valid), tie='emr')
  rec = np.asarray(mm.reconstruct(uni, g, masks, lams))
  masks = np.asarray(masks)
  for i in range(len(vecs)):
    if valid[i]:
      assert masks[i].any()
      np.testing.assert_allclose(np.abs(rec[i]).sum(), np.abs(vecs[i]).sum(), rtol=1e-5)
      # direction of τ^i on the kept coordinates, 0 elsewhere
      assert np.all(rec[i][masks[i]] * vecs[i][masks[i]] > 0)
      np.testing.assert_array_equal(rec[i][~masks[i]], 0.)
    else:
      np.testing.assert_array_equal(rec[i], 0.)
  # and after a round: each recovered row has the l1 norm of its new task vector
  rows = _round_case()
  out, logs = _round(*_round_inputs(rows), 3, rho=0.4, eps=0.5, kappa=2, cross='similarity',
                     combine='avg')
  l1 = np.asarray(logs['matu_tau_l1'])
  for i, r in enumerate(rows):
    if r[4]:
      np.testing.assert_allclose(np.abs(np.asarray(out)[i]).sum(), l1[r[1]], rtol=1e-5)


# ----------------------------------------------------------------------------
# 8. purity
# ----------------------------------------------------------------------------


def test_round_update_is_pure():
  rows = _round_case()
  inputs = _round_inputs(rows)
  before = [np.array(x) for x in inputs]
  kw = dict(rho=0.4, eps=0.5, kappa=2, cross='similarity', combine='sum')
  out1, logs1 = _round(*inputs, 3, **kw)
  # another round on other data in between: nothing may carry over
  other = _round_inputs(_round_case(seed=9))
  _round(*other, 3, **kw)
  out2, logs2 = _round(*inputs, 3, **kw)
  np.testing.assert_array_equal(np.asarray(out1), np.asarray(out2))
  assert np.asarray(out1).tobytes() == np.asarray(out2).tobytes()
  for k in logs1:
    assert np.asarray(logs1[k]).tobytes() == np.asarray(logs2[k]).tobytes(), k
  for b, x in zip(before, inputs):
    np.testing.assert_array_equal(b, np.asarray(x))
  # numpy inputs are not modified either
  np_in = [np.array(x) for x in inputs]
  copies = [x.copy() for x in np_in]
  _round(*np_in, 3, **kw)
  for c, x in zip(copies, np_in):
    np.testing.assert_array_equal(c, x)


# ----------------------------------------------------------------------------
# 9. bit accounting (§7 item 14)
# ----------------------------------------------------------------------------


@pytest.mark.parametrize('d', [1, 8, 13, 100, 589_824])
@pytest.mark.parametrize('k', [1, 2, 3, 7])
def test_upload_bits(d, k):
  bits = mm.upload_bits(d, k)
  assert bits == (32 * d if k == 1 else 32 * d + k * (d + 32))
  if k > 1 and d <= 100:
    rng = np.random.default_rng(d * 10 + k)
    masks = rng.random((k, d)) < 0.5
    packed = np.packbits(masks, axis=-1)
    assert packed.nbytes == k * math.ceil(d / 8)
    # the k·d mask bits of the formula are the packed size up to byte padding
    assert k * d <= 8 * packed.nbytes < k * (d + 8)
    np.testing.assert_array_equal(np.unpackbits(packed, axis=-1, count=d).astype(bool), masks)
    assert bits - 32 * d - 32 * k == k * d
