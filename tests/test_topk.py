"""Exact per-client k-th largest |Δ| and top-ρ masks (algorithms/topk.py) against
NumPy sorts: several leaves (one large enough to be its own key block), negative
values, zeros, NaN, ties at the threshold, clients whose rows span roles and
`Blocks` parts, k = 1 and k = d, entries placed to share a compaction column, the
'small' and 'random' variants.

Few distinct programs (each compiles in seconds): the shapes repeat across tests.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_mtl.algorithms import topk
from fedjax_mtl.algorithms.base import Blocks

K = 3
SIZES = ((350, 200), (7,), (333,), ())  # 70000 entries: >= 2^16, not a multiple of 240
D = sum(int(np.prod(s)) for s in SIZES)
ROWS = (0, 1, 2, 3, 3, 2)  # decoder rows' owners: client 3's span both Blocks parts
DISTS = ('normal', 'ties', 'zeros', 'scales')


def _keys(a) -> np.ndarray:
  """NumPy twin of the key: the bit pattern of |a| (NaN above inf, -0 == +0)."""
  return np.abs(np.asarray(a, np.float32)).view(np.int32) & 0x7FFFFFFF


def _draw(rng, dist: str, shape) -> np.ndarray:
  if dist == 'normal':
    x = rng.normal(size=shape)
  elif dist == 'ties':  # 13 magnitudes, each thousands of times
    x = rng.integers(-6, 7, size=shape) / 4
  elif dist == 'zeros':
    x = np.where(rng.random(shape) < 0.4, 0.0, rng.normal(size=shape))
  else:  # a scale per leaf, 10 decades apart at most
    x = rng.normal(size=shape) * 10.0 ** rng.uniform(-8, 2)
  return x.astype(np.float32)


def _leaves(rng, dist: str, rows: int = K) -> list[np.ndarray]:
  return [_draw(rng, dist, (rows,) + s) for s in SIZES]


def _flat(leaves, row) -> np.ndarray:
  return np.concatenate([np.asarray(x[row]).reshape(-1) for x in leaves])


def _kth_desc(keys: np.ndarray, k: int) -> int:
  return int(np.sort(keys)[::-1][k - 1])


_KTH = jax.jit(lambda leaves, k: topk.kth_largest_abs(leaves, k))


@pytest.fixture(autouse=True)
def _passes(monkeypatch):
  """Every test here runs the counting passes (updates of at most `_SORT_UP_TO` entries
  per client take one sort instead; the sort's own test below switches it back)."""
  monkeypatch.setattr(topk, '_SORT_UP_TO', 0)


@pytest.mark.parametrize('dist', DISTS)
def test_kth_largest_matches_numpy(dist):
  leaves = _leaves(np.random.default_rng(DISTS.index(dist)), dist)
  for ks in ([1, 2, D], [D // 3, D // 2, D - 1], [7, D // 4, 40000]):
    got = _keys(np.asarray(_KTH(leaves, jnp.asarray(ks))))
    want = [_kth_desc(_keys(_flat(leaves, c)), ks[c]) for c in range(K)]
    np.testing.assert_array_equal(got, want, err_msg=f'{dist} k={ks}')


def test_nan_counts_as_largest_and_k_is_clipped():
  leaves = _leaves(np.random.default_rng(5), 'normal')
  leaves[0][0, :3] = np.nan
  leaves[0][1, :2] = -np.inf
  got = np.asarray(_KTH(leaves, jnp.asarray([3, 2, 10 * D])))
  assert np.isnan(got[0]) and got[1] == np.inf
  assert got[2] == np.abs(_flat(leaves, 2)).min()  # k beyond d: the smallest


def test_entries_sharing_a_compaction_column_still_give_the_exact_value():
  # The large leaf's first L entries form a key block; each eighth of it is compacted
  # in columns of 16 entries L/128 apart, or, on retry, of 15 entries L/120 apart.
  # Client 0's three largest entries (a ulp apart, so one bracket holds them) share a
  # column of 16: the retry separates them. Client 1's also share a column of 15:
  # counting passes over the whole update go on. Client 2's share none.
  leaves = _leaves(np.random.default_rng(6), 'normal')
  n = leaves[0][0].size
  block = n - n % topk._BLOCK
  a, b = block // topk._SPLIT // 16, block // topk._SPLIT // 15
  top = np.float32(10.0) + np.arange(3, dtype=np.float32) * np.spacing(np.float32(10.0))
  big = leaves[0].reshape(K, -1)
  big[0, [1000, 1000 + a]] = top[:2]
  big[1, [1000, 1000 + a, 1000 + b]] = top
  big[2, [1000, 3000]] = top[:2]
  for k in (1, 2, 3, 4):
    got = _keys(np.asarray(_KTH(leaves, jnp.asarray([k] * K))))
    want = [_kth_desc(_keys(_flat(leaves, c)), k) for c in range(K)]
    np.testing.assert_array_equal(got, want, err_msg=f'k={k}')


def _views(rng):
  """Encoder rows (one per client) and decoder rows (owners ROWS), each split into two
  `Blocks` parts as the engine hands them to a `blocks` rule. Client 2's encoder row
  repeats 13 magnitudes, so its threshold is tied thousands of times."""
  enc = _leaves(rng, 'normal', rows=4)
  enc[0][2] = _draw(rng, 'ties', SIZES[0])
  dec = [rng.normal(size=(len(ROWS), 4, 5)).astype(np.float32),
         rng.normal(size=(len(ROWS), 3)).astype(np.float32)]
  split = lambda leaves, at: Blocks(({str(i): x[:at] for i, x in enumerate(leaves)},
                                     {str(i): x[at:] for i, x in enumerate(leaves)}))
  deltas = {'encoder': split(enc, 2), 'decoder': split(dec, 3)}
  return deltas, {'encoder': tuple(range(4)), 'decoder': ROWS}, enc, dec


def _client(enc, dec, c) -> np.ndarray:
  """Client c's whole update: its encoder row, then its decoder rows."""
  return np.concatenate([_flat(enc, c)] + [_flat(dec, i) for i, o in enumerate(ROWS) if o == c])


def _stacked(view) -> list[np.ndarray]:
  parts = [jax.tree.leaves(p) for p in view.parts]
  return [np.concatenate(xs, 0) for xs in zip(*parts)]


_RHO = 0.3


def _mask_fn(variant):
  row_client = {'encoder': tuple(range(4)), 'decoder': ROWS}
  return jax.jit(lambda d, key: topk.top_rho_mask(d, row_client, 4, _RHO, variant, key))


@pytest.mark.parametrize('variant', ['top', 'small'])
def test_masks_are_per_client_over_roles_and_blocks_parts(variant):
  deltas, row_client, enc, dec = _views(np.random.default_rng(7))
  mask = _mask_fn(variant)(deltas, None)
  assert jax.tree.structure(mask) == jax.tree.structure(deltas)  # Blocks kept
  got_enc, got_dec = _stacked(mask['encoder']), _stacked(mask['decoder'])
  for c in range(4):
    keys = _keys(_client(enc, dec, c))
    k = int(np.floor(_RHO * keys.size))
    if variant == 'top':
      want = keys >= _kth_desc(keys, k)
    else:
      want = keys <= int(np.sort(keys)[k - 1])
    got = _client(got_enc, got_dec, c)
    np.testing.assert_array_equal(got, want.astype(np.float32), err_msg=f'client {c}')
    # At least k; more only on ties (client 2: thousands tie at its threshold).
    assert got.sum() >= k and (got.sum() > k) == (c == 2)


@pytest.mark.parametrize('variant', topk.VARIANTS)
def test_small_updates_sort_to_the_same_threshold_and_mask(variant, monkeypatch):
  deltas, row_client, _, _ = _views(np.random.default_rng(10))
  deltas['encoder'].parts[0]['0'][1, :5] = np.nan  # NaN above everything
  deltas['encoder'].parts[0]['0'][1, 5:9] = -0.0
  deltas['encoder'].parts[0]['0'][1, 9:12] = 1e-42  # denormals, ordered exactly
  key = jax.random.PRNGKey(3)
  outs = []
  for up_to in (0, 1 << 30):  # the passes, then one sort
    monkeypatch.setattr(topk, '_SORT_UP_TO', up_to)
    mask = _mask_fn(variant)(deltas, key)
    kth = jax.jit(lambda d: topk.kth_largest_abs(d, jnp.asarray([1, 9, 40000, 7, 1]),
                                                 row_client, num_clients=5))(deltas)
    outs.append((mask, kth))
  (mask_p, kth_p), (mask_s, kth_s) = outs
  np.testing.assert_array_equal(_keys(kth_s), _keys(kth_p))
  assert np.isnan(kth_s[1]) and kth_s[4] == 0  # client 4 owns no rows
  for x, y in zip(jax.tree.leaves(mask_p), jax.tree.leaves(mask_s)):
    np.testing.assert_array_equal(x, y)


def test_random_variant_keeps_exactly_k_uniformly_and_is_deterministic_in_its_key():
  deltas, row_client, _, _ = _views(np.random.default_rng(9))
  run = _mask_fn('random')
  a, b, other = (run(deltas, jax.random.PRNGKey(s)) for s in (0, 0, 1))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)
  assert any(np.any(np.asarray(x) != np.asarray(y))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(other)))
  enc, dec = _stacked(a['encoder']), _stacked(a['decoder'])
  sizes = topk.client_sizes(deltas, row_client, 4)
  for c in range(4):
    assert _client(enc, dec, c).sum() == np.floor(_RHO * sizes[c])
  # Spread over the whole update, not one end of it: each quarter keeps about ρ.
  quarters = enc[0].reshape(4, 4, -1).mean(axis=2)
  np.testing.assert_allclose(quarters, _RHO, atol=0.02)


def test_rho_one_keeps_everything():
  deltas, row_client, _, _ = _views(np.random.default_rng(8))
  mask = topk.top_rho_mask(deltas, row_client, 4, 1.0)
  assert all(np.all(np.asarray(m) == 1) for m in jax.tree.leaves(mask))
  assert jax.tree.structure(mask) == jax.tree.structure(deltas)


@pytest.mark.parametrize('kwargs, message', [
    (dict(rho=0.5, variant='largest'), "unknown mask variant 'largest'; valid choices"),
    (dict(rho=0.0), 'valid range: 0 < rho <= 1'),
    (dict(rho=0.5, variant='random'), "'random' needs a PRNG key"),
])
def test_bad_arguments_name_the_problem(kwargs, message):
  deltas = {'encoder': [np.ones((1, 4), np.float32)]}
  with pytest.raises(ValueError, match=message):
    topk.top_rho_mask(deltas, {'encoder': (0,)}, 1, **kwargs)


@pytest.mark.parametrize('dtype', [jnp.int32, jnp.bool_, jnp.float32])
def test_packed_kept_sets_count_and_intersect_like_numpy(dtype):
  """`packed_rows` + `popcount_rows` / `popcount_gram` (FedDEA's kept counts and
  Jaccard): a big leaf packed where it lies (not a multiple of 32 per row, its end
  joins the small block), small leaves gathered, two `Blocks` parts that must line
  up word for word, every mask dtype."""
  rng = np.random.default_rng(3)
  shapes = [(70_001,), (5, 7), (3,), (2, 33_000)]  # the last: 66,000 entries per row
  masks = [rng.random((5,) + s) < p for s, p in zip(shapes, (0.3, 0.5, 0.6, 0.1))]
  view = Blocks(tuple({str(i): jnp.asarray(m[lo:hi]).astype(dtype) for i, m in enumerate(masks)}
                      for lo, hi in ((0, 2), (2, 5))))
  parts = topk.packed_rows(view)
  assert [lo for lo, _ in parts] == [0, 2]
  words = jnp.concatenate([w for _, w in parts], axis=0)
  flat = np.concatenate([m.reshape(5, -1) for m in masks], axis=1).astype(np.int64)
  np.testing.assert_array_equal(np.asarray(topk.popcount_rows(words)), flat.sum(1))
  np.testing.assert_array_equal(np.asarray(topk.popcount_gram(words)), flat @ flat.T)
