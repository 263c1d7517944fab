"""FedHCA2 as a rule and in the engine (the math is pinned in test_hca2_math.py).

- the public API (`algorithms.hca2.conflict_averse` / `cross_attention`) on nested pytrees;
- the rule's personalised updates, hyper step and ablations on random stacked trees;
- in the engine: α = β = 0 (hyper lr 0, homo off) reproduces Local bitwise; the
  round compiles once; α/β/w*/entropy are logged and plotted.
"""

import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from conftest import tiny_config
from fedjax_mtl import experiment, train
from fedjax_mtl.engines import dense
from fedjax_mtl.algorithms import FedInfo, ServerInputs, get_algorithm
from fedjax_mtl.algorithms import hca2
from fedjax_mtl.algorithms import hca2_math as hm
from fedjax_mtl.algorithms.base import Blocks, stack, unstack
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.models.decoder import DECODER_LAYERS
from fedjax_mtl.report import read_jsonl

N, K = 4, 6


def _tree(rng, lead, scale=1e-2):
  """A nested encoder-like pytree with leading axis `lead`."""
  return {'a': {'kernel': rng.normal(size=(lead, 5, 3)).astype(np.float32) * scale,
                'bias': rng.normal(size=(lead, 3)).astype(np.float32) * scale},
          'b': rng.normal(size=(lead, 7)).astype(np.float32) * scale}


def _dec_tree(rng, lead, scale=1e-2):
  """A decoder-shaped pytree (the six FedHCA2 layers)."""
  t = {f'linear_{i}': {'kernel': rng.normal(size=(lead, 4, 2)), 'bias': rng.normal(size=(lead, 2))}
       for i in range(4)}
  t['fuse_conv'] = {'kernel': rng.normal(size=(lead, 8, 2)), 'bias': rng.normal(size=(lead, 2))}
  t['fuse_bn'] = {'scale': rng.normal(size=(lead, 2)), 'bias': rng.normal(size=(lead, 2))}
  return jax.tree.map(lambda x: (x * scale).astype(np.float32), t)


def _info(n=N, k=K, homo=None):
  return FedInfo(num_clients=n, num_decoders=k, decoder_client=tuple(range(k)),
                 decoder_names=tuple(f'd{i}' for i in range(k)),
                 client_names=tuple(f'c{i}' for i in range(n)),
                 homo_groups=homo or tuple(range(n)), decoder_layers=DECODER_LAYERS)


class AggInputs(NamedTuple):
  enc_prev: dict
  enc_local: dict
  dec_prev: dict
  dec_local: dict
  round: jax.Array


class _Rule:
  """The FedHCA2 server on (encoders, decoders), as the engine calls it by role."""

  def __init__(self, server):
    self.server = server

  def init(self, enc, dec):
    return self.server.init({'encoder': enc, 'decoder': dec})

  def apply(self, state, x: AggInputs):
    inputs = ServerInputs(
        prev={'encoder': x.enc_prev, 'decoder': x.dec_prev},
        local={'encoder': x.enc_local, 'decoder': x.dec_local},
        num_examples=jnp.ones((N,)), num_steps=jnp.ones((N,), jnp.int32),
        client_ids=jnp.arange(N), round=x.round)
    out, state, logs = self.server.apply(state, inputs)
    return (out.get('encoder', x.enc_local), out.get('decoder', x.dec_local), state, logs)


def _rule(homo=None, **knobs):
  cfg = ml_collections.ConfigDict({'hca2': hca2.default_config()})
  cfg.hca2.update(knobs)
  return _Rule(get_algorithm('hca2', _info(homo=homo), cfg).server)


def test_public_api_on_nested_pytrees():
  rng = np.random.default_rng(0)
  d = _tree(rng, N)
  u = hca2.conflict_averse(d, c=0.4, rescale=True)
  assert jax.tree.structure(u) == jax.tree.structure(jax.tree.map(lambda x: x[0], d))
  # Reference: SciPy-free closed form check of Ũ = (Δ̄ + √φ/‖g_w‖ g_w)/(1+c²) with the
  # rule's own w*, on the concatenated vector.
  flat = np.concatenate([np.asarray(x).reshape(N, -1) for x in jax.tree.leaves(d)], 1)
  w = np.asarray(hm.solve_ca_dual(jnp.asarray(flat @ flat.T), 0.4))
  mean = flat.mean(0)
  gw = w @ flat
  lam = (0.4 * np.sqrt((flat @ flat.T).mean() + 1e-8) + 1e-8) / (np.linalg.norm(gw) + 1e-8)
  want = (mean + lam * gw) / 1.16
  got = np.concatenate([np.asarray(x).ravel() for x in jax.tree.leaves(u)])
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-9)
  # c = 0, no rescale: the mean update.
  u0 = hca2.conflict_averse(d, c=0.0, rescale=False)
  for a, b in zip(jax.tree.leaves(u0), jax.tree.leaves(d)):
    np.testing.assert_allclose(a, np.asarray(b).mean(0), rtol=1e-5, atol=1e-9)
  dec = _dec_tree(rng, K)
  a = hca2.cross_attention(dec)
  assert jax.tree.structure(a) == jax.tree.structure(dec)
  v = np.asarray(dec['fuse_conv']['kernel']).reshape(K, -1)
  logits = v @ v.T / np.sqrt(v.shape[1])
  att = np.exp(logits - logits.max(1, keepdims=True))
  att /= att.sum(1, keepdims=True)
  np.testing.assert_allclose(np.asarray(a['fuse_conv']['kernel']).reshape(K, -1), att @ v,
                             rtol=1e-5, atol=1e-9)


def _inputs(rng, round_):
  enc_prev, dec_prev = _tree(rng, N, 1.), _dec_tree(rng, K, 1.)
  enc_local = jax.tree.map(lambda p, d: p + d, enc_prev, _tree(rng, N))
  dec_local = jax.tree.map(lambda p, d: p + d, dec_prev, _dec_tree(rng, K))
  return AggInputs(enc_prev, enc_local, dec_prev, dec_local, jnp.int32(round_))


def test_rule_personalised_updates_and_hyper_step():
  rng = np.random.default_rng(1)
  rule = _rule()
  x1 = _inputs(rng, 0)
  state = rule.init(x1.enc_prev, x1.dec_prev)
  apply = jax.jit(rule.apply)
  enc, dec, state1, logs = apply(state, x1)
  # Round 1: no hyper step; θ = θ_local + 0.1·Ũ and θ_k = θ_k,local + 0.1·Ã_k.
  np.testing.assert_array_equal(state1.shared['encoder']['alpha'], np.full(N, 0.1, np.float32))
  d_enc = jax.tree.map(lambda a, b: a - b, x1.enc_local, x1.enc_prev)
  d_dec = jax.tree.map(lambda a, b: a - b, x1.dec_local, x1.dec_prev)
  u = hca2.conflict_averse(d_enc)
  a = hca2.cross_attention(d_dec)
  for got, loc, g in zip(jax.tree.leaves(enc), jax.tree.leaves(x1.enc_local), jax.tree.leaves(u)):
    np.testing.assert_allclose(got, loc + 0.1 * np.asarray(g)[None], rtol=1e-6, atol=1e-7)
  for got, loc, g in zip(jax.tree.leaves(dec), jax.tree.leaves(x1.dec_local), jax.tree.leaves(a)):
    np.testing.assert_allclose(got, loc + 0.1 * np.asarray(g), rtol=1e-6, atol=1e-7)
  assert logs['beta'].shape == (K, len(DECODER_LAYERS)) and logs['ca_w'].shape == (N,)
  np.testing.assert_allclose(np.sum(logs['ca_w']), 1., rtol=1e-5)
  assert logs['attention_entropy'].shape == (6,)
  assert np.all(logs['attention_entropy'] <= np.log(K) + 1e-5)
  # Round 2: one SGD step with g_α = -<Ũ^(1), Δθ^(2)>, g_β per layer likewise.
  x2 = _inputs(rng, 1)
  _, _, state2, logs2 = apply(state1, x2)
  d2 = jax.tree.map(lambda a, b: a - b, x2.enc_local, x2.enc_prev)
  g_alpha = -sum(np.sum(np.asarray(d).reshape(N, -1) * np.asarray(uu).reshape(1, -1), 1)
                 for d, uu in zip(jax.tree.leaves(d2), jax.tree.leaves(u)))
  np.testing.assert_allclose(logs2['alpha_grad'], g_alpha, rtol=1e-4, atol=1e-8)
  want_alpha = 0.1 - 1e-2 * (g_alpha + 1e-4 * 0.1)
  np.testing.assert_allclose(state2.shared['encoder']['alpha'], want_alpha, rtol=1e-5)
  d2d = jax.tree.map(lambda a, b: a - b, x2.dec_local, x2.dec_prev)
  g_beta = np.zeros((K, 6))
  for l, name in enumerate(DECODER_LAYERS):
    for p in d2d[name]:
      g_beta[:, l] -= np.sum(np.asarray(d2d[name][p]).reshape(K, -1)
                             * np.asarray(a[name][p]).reshape(K, -1), 1)
  np.testing.assert_allclose(logs2['beta_grad'], g_beta, rtol=1e-4, atol=1e-8)
  np.testing.assert_allclose(state2.shared['decoder']['beta'], 0.1 - 1e-2 * (g_beta + 1e-5),
                             rtol=1e-5)


def test_rule_is_permutation_equivariant_over_clients_and_decoders():
  rng = np.random.default_rng(2)
  rule = _rule()
  x = _inputs(rng, 0)
  pn, pk = rng.permutation(N), rng.permutation(K)
  perm = lambda t, p: jax.tree.map(lambda v: v[p], t)
  xp = AggInputs(perm(x.enc_prev, pn), perm(x.enc_local, pn), perm(x.dec_prev, pk),
                 perm(x.dec_local, pk), x.round)
  enc, dec, _, _ = jax.jit(rule.apply)(rule.init(x.enc_prev, x.dec_prev), x)
  enc_p, dec_p, _, _ = jax.jit(rule.apply)(rule.init(xp.enc_prev, xp.dec_prev), xp)
  for a, b in zip(jax.tree.leaves(perm(enc, pn)) + jax.tree.leaves(perm(dec, pk)),
                  jax.tree.leaves(enc_p) + jax.tree.leaves(dec_p)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_ablations_and_homo_averaging():
  rng = np.random.default_rng(3)
  x = _inputs(rng, 0)
  mean = lambda t: jax.tree.map(lambda v: np.broadcast_to(np.asarray(v).mean(0), v.shape), t)
  for enc_rule, dec_rule in [('fedavg', 'none'), ('none', 'fedavg')]:
    rule = _rule(encoder_agg=enc_rule, decoder_agg=dec_rule)
    enc, dec, _, logs = jax.jit(rule.apply)(rule.init(x.enc_prev, x.dec_prev), x)
    want_enc = mean(x.enc_local) if enc_rule == 'fedavg' else x.enc_local
    want_dec = mean(x.dec_local) if dec_rule == 'fedavg' else x.dec_local
    for a, b in zip(jax.tree.leaves((enc, dec)), jax.tree.leaves((want_enc, want_dec))):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert not logs
  # Homo groups (clients 0,1 and 2,3): each keeps θ_prev + group-mean Δ + α·Ũ.
  rule = _rule(homo=(0, 0, 1, 1))
  enc, _, _, _ = jax.jit(rule.apply)(rule.init(x.enc_prev, x.dec_prev), x)
  d = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), x.enc_local, x.enc_prev)
  u = hca2.conflict_averse(d)  # from the raw deltas
  for got, p, dd, uu in zip(jax.tree.leaves(enc), jax.tree.leaves(x.enc_prev),
                            jax.tree.leaves(d), jax.tree.leaves(u)):
    gm = np.concatenate([np.repeat(dd[:2].mean(0, keepdims=True), 2, 0),
                         np.repeat(dd[2:].mean(0, keepdims=True), 2, 0)])
    np.testing.assert_allclose(got, np.asarray(p) + gm + 0.1 * np.asarray(uu)[None],
                               rtol=1e-5, atol=1e-6)
  # The declared choices are refused by validation, before anything is built.
  from fedjax_mtl import validate
  bad = tiny_config('hca2', **{'hca2.encoder_agg': 'mean'})
  with pytest.raises(ConfigError, match="unknown hca2.encoder_agg 'mean'; valid choices"):
    validate.check_config(bad)


def test_blocks_views_give_the_stacked_result():
  """The engine hands the rule each role's rows as `Blocks` (the client groups' own
  arrays); the result equals the rule on the concatenated rows, also when a homo
  run spans two parts, and the personalised encoders come back as `Blocks`."""
  rng = np.random.default_rng(5)
  x = _inputs(rng, 1)
  split = lambda t, sizes: unstack(jax.tree.map(jnp.asarray, t), sizes)
  xb = x._replace(enc_prev=split(x.enc_prev, (3, 1)), enc_local=split(x.enc_local, (3, 1)),
                  dec_prev=split(x.dec_prev, (4, 2)), dec_local=split(x.dec_local, (4, 2)))
  for homo in (None, (0, 1, 2, 2), (0, 0, 1, 1)):
    rule = _rule(homo=homo)
    state = rule.init(x.enc_prev, x.dec_prev)
    enc, dec, st, logs = jax.jit(rule.apply)(state, x)
    enc_b, dec_b, st_b, logs_b = jax.jit(rule.apply)(state, xb)
    assert isinstance(enc_b, Blocks) and isinstance(dec_b, Blocks)
    for a, b in zip(jax.tree.leaves((enc, dec, st, logs)),
                    jax.tree.leaves((stack(enc_b), stack(dec_b), st_b, logs_b))):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_homo_encoders_are_not_materialised():
  """The personalised encoders need no copy of the N updates: the compiled rule's
  scratch memory stays below one row's worth (the Gram pass's cache-sized chunks),
  with or without homo runs (the deltas and their homo average were 2N rows; a
  row slice in the ‖g_w‖ fallback branch was 2N rows of scratch too)."""
  n, d = 8, 1 << 20
  rng = np.random.default_rng(6)
  prev = {'w': jnp.asarray(rng.normal(size=(n, d)).astype(np.float32))}
  local = {'w': prev['w'] + 1e-2 * jnp.asarray(rng.normal(size=(n, d)).astype(np.float32))}
  row_bytes = d * 4
  for homo in (None, (0, 0, 0, 0, 1, 1, 1, 1)):
    server = hca2.conflict_averse_encoders(_info(n=n, k=1, homo=homo),
                                           hca2.default_config())
    state = server.init({'encoder': prev})

    def apply(state, local, prev):
      x = ServerInputs(prev={'encoder': Blocks((prev,))}, local={'encoder': Blocks((local,))},
                       num_examples=jnp.ones((n,)), num_steps=jnp.ones((n,), jnp.int32),
                       client_ids=jnp.arange(n), round=jnp.int32(1))
      return server.apply(state, x)

    compiled = jax.jit(apply).lower(state, local, prev).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    assert temp < row_bytes, (homo, temp / row_bytes)


@pytest.fixture(scope='module')
def hca2_run(tmp_path_factory):
  wd = str(tmp_path_factory.mktemp('hca2'))
  out = train.train_and_evaluate(tiny_config('hca2', hca2=hca2.default_config()), wd)
  return wd, out


def test_engine_round_compiles_once_and_logs_hyperweights(hca2_run):
  wd, out = hca2_run
  exp = experiment.build(tiny_config('hca2', hca2=hca2.default_config()))
  programs = dense.programs(exp)
  assert all(f._cache_size() == 1 for f in programs.train_fns + [programs.agg_fn])
  # The evaluation compiled in the background during round 1 (the first evaluation is
  # round 2), once: the loop's calls found it compiled.
  assert programs.eval_fn._cache_size() == 1
  timing = read_jsonl(os.path.join(wd, 'timing.jsonl'))
  assert 'evaluate' not in timing[0]['compile_s']
  assert [(r['round'], set(r.get('background_compile_s', ()))) for r in timing[1:]] == [
      (1, set()), (2, {'evaluate'}), (3, set())]
  rows = read_jsonl(os.path.join(wd, 'metrics.jsonl'))
  agg = [r for r in rows if r['type'] == 'agg']
  n, k = exp.fed.num_clients, exp.fed.num_decoders
  assert [r['round'] for r in agg] == [1, 2, 3]
  assert np.shape(agg[0]['alpha']) == (n,) and np.shape(agg[0]['beta']) == (k, 6)
  assert np.shape(agg[0]['ca_w']) == (n,) and np.shape(agg[0]['attention_entropy']) == (6,)
  # α/β stay at their init in round 1 and move from round 2 on, by client-specific
  # hypergradients (tiny on a tiny model: raw inner products of small updates).
  np.testing.assert_array_equal(np.float32(agg[0]['alpha']), np.full(n, 0.1, np.float32))
  assert len(set(agg[1]['alpha'])) > 1 and len({tuple(b) for b in agg[1]['beta']}) > 1
  assert np.all(np.asarray(agg[1]['alpha_grad']) != 0)
  for f in ('alpha.png', 'beta.png'):
    assert os.path.getsize(os.path.join(wd, f)) > 1000
  # Encoders: θ_i = θ_i,local + clamp(α_i)·Ũ with the stored Ũ (1c: no homo groups).
  state = out['state']
  enc = experiment.views(exp, [g.params for g in state.groups], 'encoder')
  u = state.server['encoder']['prev_u']
  alpha = np.clip(np.asarray(state.server['encoder']['alpha']), 0, 1)
  diff = jax.tree.map(lambda e, uu: np.asarray(e) - alpha.reshape((-1,) + (1,) * uu.ndim)
                      * np.asarray(uu)[None], enc, u)
  # After removing each client's α-share, what is left is that client's local model:
  # different per client (personalised), unlike FedAvg.
  leaf = jax.tree.leaves(diff)[1]
  assert not np.allclose(leaf[0], leaf[1])


def test_zero_hyperweights_reproduce_local_bitwise(tmp_path):
  zero = hca2.default_config()
  zero.update(alpha_init=0., beta_init=0., hyper_lr=0., homo=False)
  short = dict(num_rounds=2, eval_every=2)  # the reduction holds round by round
  h = train.train_and_evaluate(tiny_config('hca2', hca2=zero, **short),
                               str(tmp_path / 'h'))
  loc = train.train_and_evaluate(tiny_config('local', **short), str(tmp_path / 'l'))
  core = lambda st: [(g.params, g.batch_stats, g.opt_state) for g in st.groups]
  for a, b in zip(jax.tree.leaves(core(h['state'])), jax.tree.leaves(core(loc['state']))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert [r['value'] for r in h['eval']] == [r['value'] for r in loc['eval']]
