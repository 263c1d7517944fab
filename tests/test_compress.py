"""Update compression (`algorithms.compress`) on tiny pytrees against NumPy oracles:

- `sparsify(rule)`: per-client top-k of Δ + e over the whole update (encoder and the
  client's own decoder rows), the base rule fed prev + sparse(u), e ← u − sparse(u),
  over several rounds, on stacked rows and on `Blocks`; fraction = 1 is the base rule
  bit for bit; clients with `row_valid` False pass through and keep their residual;
- `quantize(rule)`: every value on the documented grid, ±s sent exactly, unbiased
  (mean over many rounds within standard errors derived from the rounding variance),
  deterministic and split-independent; its log; pass-through of invalid rows;
- range errors, the config blocks and adapters, the payload helpers.
"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from conftest import fed_info
from fedjax_mtl.algorithms import compress, rules
from fedjax_mtl.algorithms.base import (Algorithm, Blocks, Client, ServerInputs,
                                        ServerState, stack, unstack)

N = 3
DECODER_CLIENT = (0, 1, 1, 2)  # client 1 owns two decoder rows
ENC = {'w': (4, 3), 'b': (5,)}
DEC = {'k': (2, 3)}
ROLES = {'encoder': (N, ENC), 'decoder': (len(DECODER_CLIENT), DEC)}
# Groups of clients {0, 1} and {2}: their rows as `Blocks` parts.
SIZES = {'encoder': (2, 1), 'decoder': (3, 1)}


def _info():
  return fed_info(N, DECODER_CLIENT)


def _tree(rng, rows, shapes, scale=1.0):
  return {k: (scale * rng.normal(size=(rows,) + s)).astype(np.float32) for k, s in shapes.items()}


def _inputs(prev, rng, rnd=0, row_valid=None):
  """Uploads = prev + a random step (leaves scaled differently, as layers are)."""
  local = {r: {k: (v + 0.1 * (j + 1) * rng.normal(size=v.shape)).astype(np.float32)
               for j, (k, v) in enumerate(t.items())} for r, t in prev.items()}
  return ServerInputs(prev=prev, local=local, num_examples=jnp.asarray([10., 20., 30.]),
                      num_steps=jnp.ones((N,), jnp.int32), client_ids=jnp.arange(N),
                      round=jnp.int32(rnd), row_valid=row_valid)


def _blocks(x):
  """The same inputs as the engine hands a `blocks` server: rows left in group parts."""
  split = lambda views: {r: unstack(v, SIZES[r]) for r, v in views.items()}
  return x._replace(prev=split(x.prev), local=split(x.local))


def _engine_rows(state, blocks):
  """The server's per-row state as the engine hands it back (per group for `Blocks`)."""
  if not blocks:
    return state
  return ServerState(state.shared, {r: unstack(v, SIZES[r]) for r, v in state.rows.items()})


def _flat(tree):
  if isinstance(tree, Blocks):
    tree = stack(tree)
  return np.concatenate([np.asarray(x).reshape(np.shape(x)[0], -1)
                         for x in jax.tree.leaves(tree)], 1)


def _residual(state, role):
  rows = state.rows[role]
  if isinstance(rows, Blocks):
    return _flat(Blocks(tuple(p['residual'] for p in rows.parts)))
  return _flat(rows['residual'])


def _numpy_sparsify(x, resid, info, fraction):
  """(sent, new residual) per role, rows flattened: per client, top-⌊f·d⌋ of |Δ + e|
  over its rows of all roles (float32 arithmetic, as the wrapper's)."""
  u = {r: (_flat(x.local[r]) - _flat(x.prev[r])) + resid[r] for r in x.local}
  sent = {r: np.zeros_like(v) for r, v in u.items()}
  for c in range(N):
    rows = [(r, i) for r in u for i, o in enumerate(info.row_client(r)) if o == c]
    vec = np.concatenate([u[r][i] for r, i in rows])
    k = int(np.floor(fraction * vec.size))
    keep = np.abs(vec) >= np.sort(np.abs(vec))[::-1][k - 1]
    assert keep.sum() == k  # random normals: no ties at the threshold
    lo = 0
    for r, i in rows:
      n = u[r].shape[1]
      sent[r][i] = np.where(keep[lo:lo + n], u[r][i], 0)
      lo += n
  return sent, {r: u[r] - sent[r] for r in u}


def _init(server, prev, blocks):
  return _engine_rows(server.init(prev), blocks)


@pytest.mark.parametrize('blocks', [False, True])
def test_sparsify_over_mean_matches_numpy_with_error_feedback(blocks):
  rng = np.random.default_rng(0)
  info = _info()
  fraction = 0.3
  server = compress.sparsify(rules.mean(), info, fraction)
  apply = jax.jit(server.apply)
  prev = {r: _tree(rng, n, s) for r, (n, s) in ROLES.items()}
  state = _init(server, prev, blocks)
  resid = {r: np.zeros_like(_flat(v)) for r, v in prev.items()}
  for rnd in range(3):
    x = _inputs(prev, rng, rnd)
    sent, resid = _numpy_sparsify(x, resid, info, fraction)
    out, state, logs = apply(state, _blocks(x) if blocks else x)
    for r in x.local:
      assert isinstance(out[r], Blocks) == blocks
      want = np.tile((_flat(x.prev[r]).astype(np.float64) + sent[r]).mean(0),
                     (sent[r].shape[0], 1))
      np.testing.assert_allclose(_flat(out[r]), want, rtol=1e-5, atol=1e-6)
      np.testing.assert_array_equal(_residual(state, r), resid[r])
    kept = [sum((sent[r][i] != 0).sum() for r in sent
                for i, o in enumerate(info.row_client(r)) if o == c) for c in range(N)]
    d = [sum(sent[r].shape[1] for r in sent for o in info.row_client(r) if o == c)
         for c in range(N)]
    np.testing.assert_allclose(logs['sparse_kept'], np.divide(kept, d), rtol=1e-6)
    norm = [np.sqrt(sum(np.sum(resid[r][i].astype(np.float64) ** 2) for r in resid
                        for i, o in enumerate(info.row_client(r)) if o == c)) for c in range(N)]
    np.testing.assert_allclose(logs['sparse_residual_norm'], norm, rtol=1e-5)
    prev = jax.tree.map(np.asarray, {r: stack(v) for r, v in out.items()})
  assert all(np.any(v != 0) for v in resid.values())  # error feedback carried something


def test_sparsify_fraction_one_is_the_base_rule_bitwise():
  rng = np.random.default_rng(1)
  info = _info()
  base = rules.with_server_momentum(rules.mean(), 0.9)  # a rule with per-row state
  wrapped = compress.sparsify(base, info, 1.0)
  prev = {r: _tree(rng, n, s) for r, (n, s) in ROLES.items()}
  sa, sb = base.init(prev), wrapped.init(prev)
  for rnd in range(2):
    x = _inputs(prev, rng, rnd)
    # prev + (local − prev) is not local in float32 here: a wrapper re-adding Δ would show.
    assert any(np.any(x.prev[r][k] + (x.local[r][k] - x.prev[r][k]) != x.local[r][k])
               for r in x.prev for k in x.prev[r])
    a, sa, _ = jax.jit(base.apply)(sa, x)
    b, sb, _ = jax.jit(wrapped.apply)(sb, x)
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
      np.testing.assert_array_equal(u, v)
    for r in prev:
      np.testing.assert_array_equal(_flat(sa.rows[r]['momentum']),
                                    _flat(sb.rows[r]['inner']['momentum']))
      assert not np.any(_residual(sb, r))
    prev = jax.tree.map(np.asarray, a)
  # On `Blocks`, over a `blocks` rule.
  x = _blocks(_inputs(prev, rng))
  a, _, _ = jax.jit(rules.mean().apply)(ServerState(), x)
  server = compress.sparsify(rules.mean(), info, 1.0)
  b, _, _ = jax.jit(server.apply)(_init(server, prev, True), x)
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize('blocks', [False, True])
def test_sparsify_invalid_rows_pass_through_and_keep_their_residual(blocks):
  rng = np.random.default_rng(2)
  info = _info()
  server = compress.sparsify(rules.identity(), info, 0.25)
  apply = jax.jit(server.apply)
  prev = {r: _tree(rng, n, s) for r, (n, s) in ROLES.items()}
  wrap = _blocks if blocks else (lambda x: x)
  _, state, _ = apply(_init(server, prev, blocks), wrap(_inputs(prev, rng)))
  x = _inputs(prev, rng, 1)
  own = {r: np.asarray(info.row_client(r)) == 1 for r in x.local}  # client 1's rows
  # Client 1 did not take part: its upload is where it started (and its step is ignored).
  absent = x._replace(local={r: {k: np.where(own[r].reshape((-1,) + (1,) * (v.ndim - 1)),
                                             x.prev[r][k], v) for k, v in t.items()}
                             for r, t in x.local.items()})
  out, st, _ = apply(state, wrap(absent._replace(row_valid=jnp.asarray([True, False, True]))))
  full, _, _ = apply(state, wrap(absent))
  for r in x.local:
    np.testing.assert_array_equal(_flat(out[r])[own[r]], _flat(absent.local[r])[own[r]])
    np.testing.assert_array_equal(_residual(st, r)[own[r]], _residual(state, r)[own[r]])
    assert np.any(_residual(state, r)[own[r]])
    # The other clients' masks and uploads are their own.
    np.testing.assert_array_equal(_flat(out[r])[~own[r]], _flat(full[r])[~own[r]])


def _quantized(bits, rng, seed=0, rnd=0, blocks=False, row_valid=None):
  """(Δ per role, Q(Δ) per role, logs) with prev = 0 (so the output is Q(Δ) exactly)."""
  info = _info()
  prev = {r: jax.tree.map(np.zeros_like, _tree(rng, n, s)) for r, (n, s) in ROLES.items()}
  x = _inputs(prev, rng, rnd, row_valid)
  server = compress.quantize(rules.identity(), info, bits, seed, log_error=True)
  out, _, logs = jax.jit(server.apply)(ServerState(), _blocks(x) if blocks else x)
  return x, {r: jax.tree.map(np.asarray, stack(v)) for r, v in out.items()}, logs


@pytest.mark.parametrize('bits', [1, 2, 8, 16])
def test_quantize_values_lie_on_the_grid_with_the_extremes_exact(bits):
  x, q, _ = _quantized(bits, np.random.default_rng(3))
  steps = 2 ** bits - 1
  for r in x.local:
    for k, delta in x.local[r].items():
      d, v = delta.reshape(len(delta), -1), q[r][k].reshape(len(delta), -1)
      s = np.abs(d).max(1, keepdims=True).astype(np.float64)
      code = (v / s * steps + steps) / 2  # j of the level s·(2j − (L−1))/(L−1)
      np.testing.assert_allclose(code, np.round(code), atol=1e-2)
      assert code.min() > -1e-2 and code.max() < steps + 1e-2
      # One of the two levels around Δ.
      np.testing.assert_array_less(np.abs(code - (d / s * steps + steps) / 2), 1 + 1e-2)
      assert np.all(np.abs(v) <= s)
      ext = np.argmax(np.abs(d), 1)
      rows = np.arange(len(d))
      np.testing.assert_array_equal(v[rows, ext], d[rows, ext])  # ±s is a level: sent exactly
      if bits == 1:
        np.testing.assert_array_equal(np.abs(v), np.broadcast_to(s, v.shape))


@pytest.mark.parametrize('bits', [1, 3])
def test_quantize_is_unbiased(bits):
  rng = np.random.default_rng(4)
  info = _info()
  prev = {r: jax.tree.map(np.zeros_like, _tree(rng, n, s)) for r, (n, s) in ROLES.items()}
  x = _inputs(prev, rng)
  server = compress.quantize(rules.identity(), info, bits, seed=7)
  m = 4000
  draws = jax.jit(jax.vmap(lambda t: server.apply(ServerState(), x._replace(round=t))[0]))(
      jnp.arange(m, dtype=jnp.int32))
  steps = 2 ** bits - 1
  z = []
  for r in x.local:
    for k, delta in x.local[r].items():
      d = delta.reshape(len(delta), -1).astype(np.float64)
      mean = np.asarray(draws[r][k], np.float64).reshape((m,) + d.shape).mean(0)
      s = np.abs(d).max(1, keepdims=True)
      # Rounded up with probability f between levels `step` apart: variance step²·f(1−f).
      w = (d / s * steps + steps) / 2
      f = w - np.clip(np.floor(w), 0, steps - 1)
      var = (2 * s / steps) ** 2 * f * (1 - f)
      se = np.sqrt(var / m)
      slack = 1e-6 * s  # float32 rounding of the levels
      np.testing.assert_array_less(np.abs(mean - d), 5 * se + slack)
      z.append(((mean - d) / np.where(se > 0, se, 1))[var > 1e-12 * s ** 2])
  z = np.concatenate(z)
  # Calibration: the standardized errors' mean square is 1 ± a few of its standard errors.
  assert abs(np.mean(z ** 2) - 1) < 5 * np.sqrt(2 / z.size)


def test_quantize_is_deterministic_and_split_independent():
  a = _quantized(4, np.random.default_rng(5), seed=1, rnd=2)[1]
  b = _quantized(4, np.random.default_rng(5), seed=1, rnd=2, blocks=True)[1]
  c = _quantized(4, np.random.default_rng(5), seed=1, rnd=3)[1]
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(u, v)
  assert any(np.any(u != v) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(c)))


def test_quantize_log_and_invalid_rows():
  info = _info()
  x, q, logs = _quantized(2, np.random.default_rng(6), row_valid=jnp.asarray([True, False, True]))
  for c in range(N):
    err = sum(np.sum((q[r][k][i].astype(np.float64) - x.local[r][k][i]) ** 2)
              for r in x.local for k in x.local[r] for i, o in enumerate(info.row_client(r))
              if o == c)
    norm = sum(np.sum(x.local[r][k][i].astype(np.float64) ** 2)
               for r in x.local for k in x.local[r] for i, o in enumerate(info.row_client(r))
               if o == c)
    want = 0. if c == 1 else np.sqrt(err / norm)
    np.testing.assert_allclose(logs['quant_rel_error'][c], want, rtol=1e-5)
    for r in x.local:
      for i, o in enumerate(info.row_client(r)):
        if o == 1:  # did not take part: its upload as it is
          for k in x.local[r]:
            np.testing.assert_array_equal(q[r][k][i], x.local[r][k][i])
  assert logs['quant_rel_error'][0] > 0
  # Without the log (a run's default: quantize.log_error=False) the same uploads.
  plain = compress.quantize(rules.identity(), info, 2, 0)
  out, _, none = jax.jit(plain.apply)(ServerState(), x)
  assert 'quant_rel_error' not in none
  for u, v in zip(jax.tree.leaves({r: stack(v) for r, v in out.items()}), jax.tree.leaves(q)):
    np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize('bits', [0, 17, 32, -1, 2.5, True])
def test_bad_bits_raise(bits):
  with pytest.raises(ValueError, match=r'valid range: integers 1 <= bits <= 16'):
    compress.quantize(rules.mean(), _info(), bits)
  with pytest.raises(ValueError, match=r'1 <= bits <= 16'):
    compress.quantize_payload(np.array([1]), np.array([1]), bits)


@pytest.mark.parametrize('fraction', [0., -0.1, 1.5])
def test_bad_fraction_raises(fraction):
  with pytest.raises(ValueError, match=r'valid range: 0 < fraction <= 1'):
    compress.sparsify(rules.mean(), _info(), fraction)
  with pytest.raises(ValueError, match=r'valid range: 0 < fraction <= 1'):
    compress.sparsify_payload(np.array([10]), fraction)


def test_config_blocks_and_adapters():
  assert compress.QUANTIZE.of(None).bits == 8
  assert compress.SPARSIFY.of(None).fraction == 0.1
  bits = compress.QUANTIZE.fields['bits']
  assert [bits.rule.ok(v) for v in (0, 1, 16, 17)] == [False, True, True, False]
  assert bits.range_text('bits') == '(1 <= bits <= 16)'
  frac = compress.SPARSIFY.fields['fraction']
  assert [frac.rule.ok(v) for v in (0, 0.5, 1, 1.1)] == [False, True, True, False]
  info = _info()
  alg = Algorithm(name='fedavg', client=Client(), server=rules.mean(),
                  roles={'encoder': 'shared', 'decoder': 'shared', 'head': 'personal'})
  cfg = ml_collections.ConfigDict({'quantize': {'bits': 3}, 'sparsify': {'fraction': 0.5},
                                   'seed': 11})
  rng = np.random.default_rng(8)
  prev = {r: _tree(rng, n, s) for r, (n, s) in ROLES.items()}
  x = _inputs(prev, rng)
  pairs = [(compress.wrap_quantize(alg, info, cfg), compress.quantize(rules.mean(), info, 3, 11)),
           (compress.wrap_sparsify(alg, info, cfg), compress.sparsify(rules.mean(), info, 0.5))]
  for got, want in pairs:
    assert got.blocks == want.blocks
    a, _, _ = jax.jit(got.apply)(got.init(prev), x)
    b, _, _ = jax.jit(want.apply)(want.init(prev), x)
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
      np.testing.assert_array_equal(u, v)
  # Defaults without a config.
  q = compress.wrap_quantize(alg, info, None)
  a, _, _ = jax.jit(q.apply)(ServerState(), x)
  b, _, _ = jax.jit(compress.quantize(rules.mean(), info, 8, 0).apply)(ServerState(), x)
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(u, v)


def test_payload_helpers():
  # values·bits + 32 per (row, leaf) scale.
  np.testing.assert_array_equal(
      compress.quantize_payload(np.array([100, 10, 0]), np.array([3, 2, 0]), 4), [496, 104, 0])
  np.testing.assert_array_equal(compress.quantize_payload(np.array([7]), np.array([1]), 1), [39])
  # k = max(⌊f·d⌋, 1) values + min(d-bit bitmap, 32-bit indices).
  d = np.array([1000, 10, 64, 0])
  np.testing.assert_array_equal(compress.sparsify_payload(d, 0.1),  # k = 100, 1, 6, 0
                                [3200 + 1000, 32 + 10, 192 + 64, 0])
  np.testing.assert_array_equal(compress.sparsify_payload(d, 0.01, value_bits=16),  # k = 10, 1, 1
                                [160 + 320, 16 + 10, 16 + 32, 0])
  np.testing.assert_array_equal(compress.sparsify_payload(d, 1.0), 32 * d)  # dense
