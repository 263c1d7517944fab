"""Client-level DP (`fedjax_mtl.algorithms.dp`): the wrapper against NumPy oracles on
tiny pytrees, and the accountant against `dp_accounting` and a published ε.

- clipping: one L2 norm per client over all its rows of all roles (encoder row +
  the decoder rows it owns), every post-clip norm ≤ C, unclipped updates unchanged,
  on stacked views and on `Blocks`; σ = 0 over `rules.mean()` is the mean of the
  clipped uploads;
- noise: std σC/√n per row ('sum': σC on the sum over participants, σC/n on the
  mean) or σC ('row'), checked with chi-square intervals, not hand-tuned tolerances;
- participation: non-participants pass through bit for bit and are not counted;
- adaptive clipping: one step of C ← C·exp(−η(b̄ − γ)) against NumPy;
- ε: equal to `dp_accounting` composed directly, its documented examples, and the
  TF-Privacy MNIST DP-SGD tutorial's published ε = 2.92.
"""

import math
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import dp_accounting
import pytest
from scipy import stats

from conftest import fed_info
from fedjax_mtl.algorithms import ServerInputs, dp, rules
from fedjax_mtl.algorithms import local as local_alg
from fedjax_mtl.algorithms import fedavg
from fedjax_mtl.algorithms.base import Blocks, stack, unstack

N = 4
DECODER_CLIENT = (0, 1, 2, 3, 3, 3)  # client 3 owns three decoder rows
SMALL = {'encoder': (N, {'w': (5, 3), 'b': (7,)}), 'decoder': (6, {'k': (2, 3), 's': (4,)})}
BIG = {'encoder': (N, {'w': (40, 25), 'b': (25,)}), 'decoder': (6, {'k': (30, 20)})}
SIZES = {'encoder': (3, 1), 'decoder': (3, 3)}  # rows per Blocks part


def _info():
  return fed_info(N, DECODER_CLIENT)


def _inputs(seed, roles=SMALL, scales=(0.1, 0.5, 1.0, 2.0), rnd=0, valid=None):
  """prev/local views for `roles`; client c's update entries have std `scales[c]`."""
  rng = np.random.default_rng(seed)
  info = _info()
  prev, local = {}, {}
  for r, (rows, shapes) in roles.items():
    owner = np.asarray(info.row_client(r))
    prev[r] = {k: rng.normal(size=(rows,) + s).astype(np.float32) for k, s in shapes.items()}
    local[r] = {k: (v + rng.normal(size=v.shape) * np.asarray(scales)[owner].reshape(
        (-1,) + (1,) * len(shapes[k]))).astype(np.float32) for k, v in prev[r].items()}
  return ServerInputs(prev=prev, local=local, num_examples=jnp.asarray([10., 20., 30., 40.]),
                      num_steps=jnp.ones((N,), jnp.int32), client_ids=jnp.arange(N),
                      round=jnp.int32(rnd), row_valid=None if valid is None else jnp.asarray(valid))


def _blocks(x):
  return x._replace(prev={r: unstack(v, SIZES[r]) for r, v in x.prev.items()},
                    local={r: unstack(v, SIZES[r]) for r, v in x.local.items()})


def _apply(server, x, state=None):
  state = server.init({r: stack(v) for r, v in x.prev.items()}) if state is None else state
  return jax.jit(server.apply)(state, x)


def _flat(tree):
  tree = stack(tree)
  return np.concatenate([np.asarray(v, np.float64).reshape(np.shape(v)[0], -1)
                         for v in jax.tree.leaves(tree)], 1)


def _oracle(x, clip, valid=None):
  """NumPy: per client its norm over all its rows of all roles, and the clipped uploads."""
  info = _info()
  valid = np.ones(N, bool) if valid is None else np.asarray(valid)
  deltas = {r: _flat(x.local[r]) - _flat(x.prev[r]) for r in x.local}
  sq = np.zeros(N)
  for r, d in deltas.items():
    for i, c in enumerate(info.row_client(r)):
      sq[c] += np.sum(d[i] ** 2)
  norm = np.sqrt(sq)
  factor = np.where(valid, np.minimum(1.0, clip / np.maximum(norm, 1e-30)), 1.0)
  up = {r: _flat(x.prev[r]) + factor[np.asarray(info.row_client(r))][:, None] * d
        for r, d in deltas.items()}
  return norm, factor, up


def _client_sq_norms(views, info):
  sq = np.zeros(N)
  for r, v in views.items():
    for i, c in enumerate(info.row_client(r)):
      sq[c] += np.sum(v[i] ** 2)
  return sq


def _chi2_ok(noise: np.ndarray, std: float, p: float = 1e-6) -> tuple[float, float, float]:
  """Σz²/std² of zero-mean Gaussian entries ~ χ²(M): its value and the two-sided
  (1 − p) interval. The relative error of the std estimate so allowed is about
  ±4.9/√(2M) (the chi-square sampling error), derived, not tuned."""
  m = noise.size
  s = float(np.sum(noise.astype(np.float64) ** 2) / std ** 2)
  return s, stats.chi2.ppf(p / 2, m), stats.chi2.ppf(1 - p / 2, m)


# ---------------------------------------------------------------- clipping


@pytest.mark.parametrize('blocks', [False, True])
def test_clipping_bound_per_client_over_all_its_rows(blocks):
  info = _info()
  x = _inputs(0)
  norm, factor, want = _oracle(x, 1.0)
  clip = float(np.median(norm))  # two clients clipped, two not
  norm, factor, want = _oracle(x, clip)
  assert (factor < 1).sum() == 2 and (factor == 1).sum() == 2
  server = dp.dp(rules.identity(), info, clip, 0.0)
  xin = _blocks(x) if blocks else x
  out, _, logs = _apply(server, xin)
  if blocks:
    assert all(isinstance(v, Blocks) for v in out.values())
  got = {r: _flat(out[r]) for r in out}
  for r in got:
    np.testing.assert_allclose(got[r], want[r], rtol=1e-5, atol=1e-6)
  post = np.sqrt(_client_sq_norms({r: got[r] - _flat(x.prev[r]) for r in got}, info))
  assert np.all(post <= clip * (1 + 1e-5))
  for c in np.flatnonzero(factor == 1):  # unclipped clients keep their upload
    for r in got:
      rows = [i for i, o in enumerate(info.row_client(r)) if o == c]
      np.testing.assert_allclose(got[r][rows], _flat(x.local[r])[rows], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(logs['dp_norm'], norm, rtol=1e-5)
  np.testing.assert_array_equal(logs['dp_clipped'], (factor < 1).astype(np.float32))
  assert float(logs['dp_clip']) == pytest.approx(clip)
  assert float(logs['dp_participants']) == N


def test_sigma_zero_over_mean_is_the_mean_of_clipped_uploads():
  x = _inputs(1)
  _, _, want = _oracle(x, 0.8)
  out, _, _ = _apply(dp.dp(rules.mean(), _info(), 0.8, 0.0), x)
  for r in out:
    np.testing.assert_allclose(_flat(out[r]), np.tile(want[r].mean(0), (len(want[r]), 1)),
                               rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- noise


@pytest.mark.parametrize('noise', ['sum', 'row'])
def test_noise_std_per_row(noise):
  sigma, clip = 1.3, 0.7
  x = _inputs(2, BIG)
  _, _, clipped = _oracle(x, clip)
  out, _, _ = _apply(dp.dp(rules.identity(), _info(), clip, sigma, noise=noise), x)
  std = sigma * clip / (math.sqrt(N) if noise == 'sum' else 1.0)
  info = _info()
  for c in range(N):  # each participant's own noise, over all its rows
    z = np.concatenate([(_flat(out[r]) - clipped[r])[[i for i, o in enumerate(
        info.row_client(r)) if o == c]].ravel() for r in out])
    s, lo, hi = _chi2_ok(z, std)
    assert lo < s < hi, (c, s, lo, hi)


@pytest.mark.parametrize('noise', ['sum', 'row'])
def test_noise_on_the_mean_over_participants(noise):
  """'sum': the mean carries N(0, (σC/n)²), the central mechanism (Σ clip + N(0, σ²C²))/n;
  'row': √n times that. Read on the encoder (one row per client)."""
  sigma, clip = 1.3, 0.7
  x = _inputs(3, BIG)
  _, _, clipped = _oracle(x, clip)
  out, _, _ = _apply(dp.dp(rules.mean(), _info(), clip, sigma, noise=noise), x)
  z = _flat(out['encoder'])[0] - clipped['encoder'].mean(0)
  std = sigma * clip / (N if noise == 'sum' else math.sqrt(N))
  s, lo, hi = _chi2_ok(z, std)
  assert lo < s < hi, (s, lo, hi)


def test_noise_is_deterministic_per_seed_and_round_and_blocks_agree():
  info = _info()
  x = _inputs(4)
  server = dp.dp(rules.identity(), info, 0.5, 1.0, seed=7)
  a, _, _ = _apply(server, x)
  b, _, _ = _apply(server, _blocks(x))
  c, _, _ = _apply(server, x._replace(round=jnp.int32(1)))
  d, _, _ = _apply(dp.dp(rules.identity(), info, 0.5, 1.0, seed=8), x)
  for r in a:
    np.testing.assert_array_equal(_flat(a[r]), _flat(b[r]))  # a row's noise ignores the split
    assert not np.allclose(_flat(a[r]), _flat(c[r]))
    assert not np.allclose(_flat(a[r]), _flat(d[r]))


def test_non_participants_pass_through_and_are_not_counted():
  info = _info()
  valid = [True, False, True, True]
  x = _inputs(5, BIG, scales=(0.1, 5.0, 1.0, 2.0), valid=valid)
  sigma, clip = 1.0, 0.5
  _, _, clipped = _oracle(x, clip, valid)
  out, _, logs = _apply(dp.dp(rules.identity(), info, clip, sigma), x)
  for r in out:
    rows = [i for i, o in enumerate(info.row_client(r)) if o == 1]
    for k in out[r]:
      np.testing.assert_array_equal(np.asarray(out[r][k])[rows], x.local[r][k][rows])
  assert float(logs['dp_participants']) == 3
  assert float(logs['dp_norm'][1]) == 0 and float(logs['dp_clipped'][1]) == 0
  z = np.concatenate([(_flat(out[r]) - clipped[r])[[i for i, o in enumerate(
      info.row_client(r)) if o != 1]].ravel() for r in out])
  s, lo, hi = _chi2_ok(z, sigma * clip / math.sqrt(3))  # n = 3, not 4
  assert lo < s < hi, (s, lo, hi)


def test_many_task_rows_of_one_client_share_one_norm():
  """With `ServerInputs.row_client` (the many-task round's client segments) the unit is
  the real client: slots 0 and 1 of one client are clipped by one joint norm, n = 3."""
  info = _info()
  x = _inputs(8)._replace(row_client=jnp.asarray([0, 0, 2, 3], jnp.int32))
  norm, _, _ = _oracle(x, 1.0)
  joint = np.sqrt(norm[0] ** 2 + norm[1] ** 2)
  clip = float(norm[0] * 1.01)  # slot 0 alone would pass; the client does not
  out, _, logs = _apply(dp.dp(rules.identity(), info, clip, 0.0), x)
  np.testing.assert_allclose(logs['dp_norm'], [joint, 0., norm[2], norm[3]], rtol=1e-5)
  assert float(logs['dp_participants']) == 3
  got = {r: _flat(out[r]) - _flat(x.prev[r]) for r in out}
  sq = _client_sq_norms(got, info)
  assert math.sqrt(sq[0] + sq[1]) == pytest.approx(clip, rel=1e-5)


# ---------------------------------------------------------------- adaptive clipping


@pytest.mark.parametrize('clip,direction', [(1e-3, 1), (1e3, -1), (None, -1)])
def test_adaptive_clip_follows_the_geometric_update(clip, direction):
  info = _info()
  x = _inputs(6)
  norm, _, _ = _oracle(x, 1.0)
  clip = float(np.sort(norm)[1] + 1e-3) if clip is None else clip  # 2 of 4 unclipped
  gamma, lr = 0.3, 0.2
  server = dp.dp(rules.mean(), info, clip, 0.0, adaptive=True, target_quantile=gamma,
                 clip_lr=lr)
  out, st, logs = _apply(server, x)
  frac = np.mean(norm <= clip)
  want = clip * np.exp(-lr * (frac - gamma))
  np.testing.assert_allclose(float(st.shared['clip']), want, rtol=1e-6)
  assert np.sign(want - clip) == direction  # b̄ < γ: C grows; b̄ > γ: C shrinks
  assert float(logs['dp_clip']) == pytest.approx(clip)
  # The next round clips with the new C.
  _, st2, logs2 = _apply(server, x._replace(round=jnp.int32(1)), st)
  assert float(logs2['dp_clip']) == pytest.approx(want, rel=1e-6)
  frac2 = np.mean(norm <= want)
  np.testing.assert_allclose(float(st2.shared['clip']), want * np.exp(-lr * (frac2 - gamma)),
                             rtol=1e-6)


# ---------------------------------------------------------------- accountant


@pytest.mark.parametrize('q,sigma,rounds,kind', [(0.01, 1.1, 500, 'rdp'), (1.0, 2.0, 10, 'rdp'),
                                                 (1.0, 2.0, 10, 'pld')])
def test_epsilon_is_dp_accounting_composed_directly(q, sigma, rounds, kind):
  acc = (dp_accounting.rdp.RdpAccountant() if kind == 'rdp'
         else dp_accounting.pld.PLDAccountant())
  event = dp_accounting.GaussianDpEvent(sigma)
  acc.compose(event if q == 1 else dp_accounting.PoissonSampledDpEvent(q, event), rounds)
  assert dp.epsilon(sigma, q, rounds, 1e-5, kind) == acc.get_epsilon(1e-5)


def test_epsilon_matches_the_library_documented_examples():
  # rdp_privacy_accountant_test.test_compute_epsilon_delta_gaussian: σ = 4.530877117 is
  # exactly (1, 1e-6)-DP for one Gaussian release (on the default orders within 1e-5).
  assert dp.epsilon(4.530877117, 1.0, 1, 1e-6) == pytest.approx(1.0, abs=1e-5)
  # pld_privacy_accountant_test.test_gaussian_basic: three Gaussians of σ = √3 are one of
  # σ = 1, exactly (1, 0.126936)-DP (the library's tolerance, 1e-3) ...
  eps = dp.epsilon(math.sqrt(3), 1.0, 3, 0.126936, 'pld')
  assert eps == pytest.approx(1.0, abs=1e-3)
  # ... which is Balle & Wang's (2018) closed form δ(ε) = Φ(½ − ε) − e^ε Φ(−½ − ε) at σ = 1,
  exact = stats.norm.cdf(0.5 - 1.0) - math.e * stats.norm.cdf(-0.5 - 1.0)
  assert exact == pytest.approx(0.126936, abs=1e-6)
  # and RDP, an upper bound, is no tighter than the exact curve.
  assert dp.epsilon(math.sqrt(3), 1.0, 3, exact) >= 1.0


def test_epsilon_against_the_published_mnist_dpsgd_figure():
  """TF-Privacy's MNIST DP-SGD tutorial (tensorflow/privacy tutorials/README.md): σ = 1.12,
  q = 256/60000, 60 epochs (14062 steps), δ = 1e-5: ε = 2.92, from its RDP accountant
  (orders 1.1..10.9, 12..63; ε = min_α RDP(α) − log δ/(α − 1), Mironov 2017). The
  library's RDP curve on those orders with that conversion gives the published number;
  `epsilon` uses the library's tighter conversion and orders, so it is below it."""
  q, sigma, steps, delta = 256 / 60000, 1.12, 60 * 60000 // 256, 1e-5
  orders = [1 + x / 10. for x in range(1, 100)] + list(range(12, 64))
  acc = dp_accounting.rdp.RdpAccountant(orders)
  acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)),
              steps)
  classic = float(np.min(acc.rdp - math.log(delta) / (acc.orders - 1)))
  assert round(classic, 2) == 2.92
  eps = dp.epsilon(sigma, q, steps, delta)
  assert 2.0 < eps <= classic


@pytest.mark.parametrize('kind,rounds', [('rdp', 200), ('pld', 4)])
def test_epsilons_per_round(kind, rounds):
  q = 0.05 if kind == 'rdp' else 1.0  # a PLD of a subsampled Gaussian: about a second a round
  eps = dp.epsilons(1.0, q, rounds, 1e-5, kind)
  assert len(eps) == rounds
  assert all(b >= a for a, b in zip(eps, eps[1:]))
  assert eps[0] == pytest.approx(dp.epsilon(1.0, q, 1, 1e-5, kind), rel=1e-9)
  assert eps[-1] == pytest.approx(dp.epsilon(1.0, q, rounds, 1e-5, kind), rel=1e-9)


def test_epsilon_edge_cases():
  assert dp.epsilon(0.0, 0.1, 10, 1e-5) == math.inf
  assert dp.epsilons(0.0, 0.1, 2, 1e-5) == [math.inf, math.inf]
  assert dp.epsilon(1.0, 0.1, 0, 1e-5) == 0.0


def test_missing_dp_accounting_says_how_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, 'dp_accounting', None)
  with pytest.raises(ImportError, match=r"pip install '\.\[dp\]'"):
    dp.epsilon(1.0, 0.1, 10, 1e-5)


# ---------------------------------------------------------------- config and errors


def test_wrap_dp_reads_the_block_and_refuses_a_rule_without_shared_roles():
  info = _info()
  config = ml_collections.ConfigDict({'seed': 3, 'dp': {'clip_norm': 0.5, 'noise_multiplier': 0.}})
  server = dp.wrap_dp(fedavg.build(info, config), info, config)
  x = _inputs(7)
  _, _, logs = _apply(server, x)
  assert float(logs['dp_clip']) == 0.5
  with pytest.raises(ValueError, match='^dp\\(\\.\\.\\.\\) needs a rule with shared parameters; '
                     'local shares none$'):
    dp.wrap_dp(local_alg.build(info), info, config)
  f = dp.DP.fields
  assert not f['clip_norm'].rule.ok(0) and f['clip_norm'].rule.ok(0.1)
  assert not f['noise_multiplier'].rule.ok(-0.1) and f['noise_multiplier'].rule.ok(0)
  assert not f['delta'].rule.ok(0) and not f['delta'].rule.ok(1) and f['delta'].rule.ok(1e-5)
  assert f['noise'].valid_choices() == ('sum', 'row')
  assert set(dp.DP.defaults()) == {'clip_norm', 'noise_multiplier', 'delta', 'noise', 'adaptive',
                                   'target_quantile', 'clip_lr'}


@pytest.mark.parametrize('kwargs,match', [
    ({'clip_norm': 0.}, r'clip_norm=0\.0 is out of range; valid range: clip_norm > 0'),
    ({'clip_norm': -1.}, 'clip_norm > 0'),
    ({'noise_multiplier': -0.5}, 'valid range: noise_multiplier >= 0'),
    ({'noise': 'local'}, "unknown dp noise mode 'local'; valid choices: 'sum', 'row'"),
    ({'target_quantile': 1.5}, '0 <= target_quantile <= 1'),
])
def test_bad_wrapper_input(kwargs, match):
  args = {'clip_norm': 1.0, 'noise_multiplier': 1.0, **kwargs}
  with pytest.raises(ValueError, match=match) as e:
    dp.dp(rules.mean(), _info(), **args)
  assert '\n' not in str(e.value)


@pytest.mark.parametrize('args,match', [
    ((-1., 0.1, 10, 1e-5), 'noise_multiplier >= 0'),
    ((1., 0., 10, 1e-5), '0 < sampling_rate <= 1'),
    ((1., 1.5, 10, 1e-5), '0 < sampling_rate <= 1'),
    ((1., 0.1, -1, 1e-5), 'rounds'),
    ((1., 0.1, 10, 0.), '0 < delta < 1'),
    ((1., 0.1, 10, 1e-5, 'moments'), "unknown accountant 'moments'; valid choices: 'rdp', 'pld'"),
])
def test_bad_accountant_input(args, match):
  with pytest.raises(ValueError, match=match) as e:
    dp.epsilon(*args)
  assert '\n' not in str(e.value)
