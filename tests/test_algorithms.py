"""Algorithms as client + server parts, on tiny pytrees against NumPy oracles.

- client parts: FedProx's, Ditto's and FedAMP's extra gradient terms, FedBABU's
  and FedSTA's trainable roles;
- server rules and combinators: mean (uniform / by examples), by_role,
  for_rounds, server momentum, grouping, MaT-FL's and FedAMP's
  rules through the registry;
- the registry: compositions by name and their errors.
Two-round runs of every baseline in the engine are in test_algorithms_engine.py.
"""

import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedjax_mtl import algorithms, local_training
from fedjax_mtl.algorithms import ClientCtx, FedInfo, ServerInputs, ServerState, rules
from fedjax_mtl.algorithms import fedamp_math, matfl_math
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.models.multitask import param_roles

N, K = 4, 6  # clients; decoders (clients 0..2 single-task, client 3 holds three)
DEC_CLIENT = (0, 1, 2, 3, 3, 3)


def _info(**kw):
  base = dict(num_clients=N, num_decoders=K, decoder_client=DEC_CLIENT,
              decoder_names=tuple(f'd{i}' for i in range(K)),
              client_names=tuple(f'c{i}' for i in range(N)), homo_groups=tuple(range(N)),
              decoder_layers=('linear_0', 'fuse_bn'), num_rounds=5,
              client_keys=(('p', 'a'), ('p', 'b'), ('q', 'c'), ('q', 'a+c')),
              decoder_keys=(('p', 'a'), ('p', 'b'), ('q', 'c'), ('q', 'a'), ('q', 'c'),
                            ('q', 'd')))
  base.update(kw)
  return FedInfo(**base)


def _stack(rng, rows, scale=1.0):
  return {'encoder': {'w': rng.normal(size=(rows, 3, 2)).astype(np.float32) * scale,
                      'b': rng.normal(size=(rows, 2)).astype(np.float32) * scale}}


def _dec(rng, rows, scale=1.0):
  return {'decoders': {'linear_0': {'kernel': rng.normal(size=(rows, 2, 2)).astype(np.float32)
                                    * scale},
                       'fuse_bn': {'scale': rng.normal(size=(rows, 2)).astype(np.float32)
                                   * scale}}}


def _inputs(rng, rnd=0, roles=('encoder', 'decoder')):
  prev = {'encoder': _stack(rng, N), 'decoder': _dec(rng, K)}
  local_ = {r: jax.tree.map(lambda p: p + 0.1 * rng.normal(size=p.shape).astype(np.float32), v)
            for r, v in prev.items()}
  return ServerInputs(prev={r: prev[r] for r in roles}, local={r: local_[r] for r in roles},
                      num_examples=jnp.asarray([10., 20., 30., 40.]),
                      num_steps=jnp.asarray([1, 2, 3, 4], jnp.int32),
                      client_ids=jnp.arange(N), round=jnp.int32(rnd))


def _flat(tree):
  return np.concatenate([np.asarray(x).reshape(np.shape(x)[0], -1) for x in jax.tree.leaves(tree)],
                        1)


def _client_params(rng):
  """One client's params in the multi-task model's layout, and their role labels."""
  p = {'encoder': {'w': rng.normal(size=(3, 2)).astype(np.float32)},
       'decoders': {'linear_0': {'kernel': rng.normal(size=(2, 2, 2)).astype(np.float32)}},
       'head_0': {'kernel': rng.normal(size=(2, 3)).astype(np.float32)}}
  return p, param_roles(p)


def _algorithm(spec, **blocks):
  cfg = ml_collections.ConfigDict({k: ml_collections.ConfigDict(v) for k, v in blocks.items()})
  return algorithms.get_algorithm(spec, _info(), cfg)


def _grad_of_extra(loss, params, start, labels, state=(), server_rows=None):
  ctx = lambda p: ClientCtx(params=p, start=start, state=state, server_rows=server_rows or {},
                            labels=labels, batch={})
  return jax.grad(lambda p: loss(ctx(p)))(params)


# ---------------------------------------------------------------------------
# Client parts.
# ---------------------------------------------------------------------------

def test_fedprox_gradient_term_is_mu_times_distance_on_shared_leaves():
  rng = np.random.default_rng(0)
  params, labels = _client_params(rng)
  start, _ = _client_params(rng)
  alg = _algorithm('fedprox', fedprox={'mu': 0.01})
  g = _grad_of_extra(alg.client.loss, params, start, labels)
  for part in ('encoder', 'decoders'):
    for a, p, s in zip(jax.tree.leaves(g[part]), jax.tree.leaves(params[part]),
                       jax.tree.leaves(start[part])):
      np.testing.assert_allclose(a, 0.01 * (p - s), rtol=1e-5, atol=1e-9)
  np.testing.assert_array_equal(g['head_0']['kernel'], 0.)  # heads are personal
  assert alg.server is not None and alg.shared_roles == ('encoder', 'decoder')


def test_ditto_personal_term_pulls_to_the_round_start_global_model():
  rng = np.random.default_rng(1)
  v, labels = _client_params(rng)
  w_start, _ = _client_params(rng)
  alg = _algorithm('ditto', ditto={'lam': 0.1})
  assert alg.client.personal_model and alg.client.loss is None
  g = _grad_of_extra(alg.client.personal_loss, v, w_start, labels)
  np.testing.assert_allclose(g['encoder']['w'], 0.1 * (v['encoder']['w'] - w_start['encoder']['w']),
                             rtol=1e-5)
  np.testing.assert_array_equal(g['head_0']['kernel'], 0.)


def test_fedamp_client_term_pulls_to_its_cloud_model():
  rng = np.random.default_rng(2)
  params, labels = _client_params(rng)
  centre, _ = _client_params(rng)
  alg = _algorithm('fedamp', fedamp={'lam': 1.0, 'alpha_k': 2.0, 'sigma': 1.0})
  rows = {'encoder': {'center': {'encoder': centre['encoder']}},
          'decoder': {'center': {'decoders': centre['decoders']}}}
  g = _grad_of_extra(alg.client.loss, params, params, labels, server_rows=rows)
  # λ/(2α_k)·‖w − u‖² -> gradient λ/α_k·(w − u)
  np.testing.assert_allclose(g['encoder']['w'], 0.5 * (params['encoder']['w']
                                                       - centre['encoder']['w']), rtol=1e-5)
  np.testing.assert_allclose(
      g['decoders']['linear_0']['kernel'],
      0.5 * (params['decoders']['linear_0']['kernel'] - centre['decoders']['linear_0']['kernel']),
      rtol=1e-5)
  np.testing.assert_array_equal(g['head_0']['kernel'], 0.)


def test_frozen_roles_follow_the_round():
  _, labels = _client_params(np.random.default_rng(3))
  babu = _algorithm('fedbabu', fedbabu={'finetune_rounds': 1})  # 5 rounds: last one tunes
  sta = _algorithm('fedsta', fedsta={'task_specific_rounds': 2})
  for rnd, want_babu, want_sta in ((0, (True, False, False), (True, True, True)),
                                   (3, (True, False, False), (False, True, True)),
                                   (4, (True, True, True), (False, True, True))):
    for alg, want in ((babu, want_babu), (sta, want_sta)):
      m = local_training.trainable_mask(labels, alg, jnp.int32(rnd))
      got = (bool(m['encoder']['w']), bool(m['decoders']['linear_0']['kernel']),
             bool(m['head_0']['kernel']))
      assert got == want, (alg.name, rnd)
  assert local_training.trainable_mask(labels, _algorithm('fedavg'), jnp.int32(0)) is None


# ---------------------------------------------------------------------------
# Server rules and combinators.
# ---------------------------------------------------------------------------

def _apply(server, x, state=None):
  views = {r: x.prev[r] for r in x.prev}
  state = server.init(views) if state is None else state
  return jax.jit(server.apply)(state, x)


def test_mean_uniform_and_by_examples():
  x = _inputs(np.random.default_rng(4), roles=('encoder',))
  for weighting, w in (('uniform', np.full(N, 0.25)), ('examples', np.array([1, 2, 3, 4]) / 10)):
    out, _, _ = _apply(rules.mean(weighting, _info()), x)
    want = w @ _flat(x.local['encoder'])
    np.testing.assert_allclose(_flat(out['encoder']), np.tile(want, (N, 1)), rtol=1e-6)


def test_fedper_and_fedavg_share_what_they_say():
  assert _algorithm('fedper').shared_roles == ('encoder',)
  assert _algorithm('matfl').shared_roles == ('encoder',)
  assert _algorithm('local').shared_roles == ()
  x = _inputs(np.random.default_rng(5))
  out, _, _ = _apply(_algorithm('fedavg').server, x)
  np.testing.assert_allclose(_flat(out['decoder']),
                             np.tile(_flat(x.local['decoder']).mean(0), (K, 1)), rtol=1e-6)


def test_server_momentum_over_two_rounds():
  rng = np.random.default_rng(6)
  server = rules.with_server_momentum(rules.mean(), momentum=0.5, lr=2.0)
  x1, x2 = _inputs(rng, 0, ('encoder',)), _inputs(rng, 1, ('encoder',))
  out1, st, _ = _apply(server, x1)
  out2, _, _ = _apply(server, x2, st)
  m = np.zeros_like(_flat(x1.prev['encoder']))
  for x, out in ((x1, out1), (x2, out2)):
    prev, loc = _flat(x.prev['encoder']), _flat(x.local['encoder'])
    m = 0.5 * m + (loc.mean(0) - prev)
    np.testing.assert_allclose(_flat(out['encoder']), prev + 2.0 * m, rtol=1e-5, atol=1e-6)
  # The momentum buffers are per-row state: one row per client, kept with the clients.
  assert jax.tree.leaves(st.rows['encoder']['momentum'])[0].shape[0] == N


def test_grouped_mean_is_the_mean_within_each_group():
  x = _inputs(np.random.default_rng(9))
  alg = _algorithm('grouped(fedavg)', grouped={'by': 'dataset'})
  out, _, _ = _apply(alg.server, x)
  enc, got = _flat(x.local['encoder']), _flat(out['encoder'])
  for members in ([0, 1], [2, 3]):  # clients on dataset p, on dataset q
    np.testing.assert_allclose(got[members], np.tile(enc[members].mean(0), (2, 1)), rtol=1e-6)
  dec, got = _flat(x.local['decoder']), _flat(out['decoder'])
  for members in ([0, 1], [2, 3, 4, 5]):
    np.testing.assert_allclose(got[members], np.tile(dec[members].mean(0), (len(members), 1)),
                               rtol=1e-6)


def test_for_rounds_stops_aggregating():
  x = _inputs(np.random.default_rng(10), roles=('encoder',))
  server = rules.for_rounds(rules.mean(), 2)
  on, _, _ = _apply(server, x._replace(round=jnp.int32(1)))
  off, _, _ = _apply(server, x._replace(round=jnp.int32(2)))
  assert not np.allclose(_flat(on['encoder']), _flat(x.local['encoder']))
  np.testing.assert_array_equal(_flat(off['encoder']), _flat(x.local['encoder']))


def test_by_role_gives_each_role_its_rule():
  x = _inputs(np.random.default_rng(11))
  out, _, _ = _apply(rules.by_role({'encoder': rules.mean(), 'decoder': rules.identity()}), x)
  np.testing.assert_array_equal(_flat(out['decoder']), _flat(x.local['decoder']))
  np.testing.assert_allclose(_flat(out['encoder'])[0], _flat(x.local['encoder']).mean(0), rtol=1e-6)


def test_matfl_rule_on_four_clients_with_two_known_groups():
  # Deviations from the mean point along +e0 for clients 0, 2 and +e1 for 1, 3.
  base = np.ones((N, 6), np.float32)
  dirs = np.array([[1, 0], [0, 1], [1, 0], [0, 1]], np.float32) * 1e-2
  base[:, :2] += dirs + np.array([[0.1e-2, 0], [0, 0.2e-2], [-0.1e-2, 0], [0, -0.1e-2]])
  enc = {'encoder': {'w': base.reshape(N, 3, 2)}}
  x = ServerInputs(prev={'encoder': enc}, local={'encoder': enc}, num_examples=jnp.ones(N),
                   num_steps=jnp.ones(N, jnp.int32), client_ids=jnp.arange(N),
                   round=jnp.int32(0))
  hard, _, logs = _apply(_algorithm('matfl', matfl={'mode': 'hard', 'num_clusters': 2}).server, x)
  got = _flat(hard['encoder'])
  np.testing.assert_allclose(got[[0, 2]], np.tile(base[[0, 2]].mean(0), (2, 1)), rtol=1e-6)
  np.testing.assert_allclose(got[[1, 3]], np.tile(base[[1, 3]].mean(0), (2, 1)), rtol=1e-6)
  np.testing.assert_array_equal(logs['matfl_encoder_labels'], [0, 1, 0, 1])
  soft, _, logs = _apply(_algorithm('matfl', matfl={'mode': 'soft', 'th': 0.0}).server, x)
  w = np.asarray(logs['matfl_encoder_weights'])
  np.testing.assert_allclose(w.sum(1), 1., rtol=1e-6)
  np.testing.assert_allclose(_flat(soft['encoder']), w @ base, rtol=1e-5)


def test_fedamp_rule_keeps_models_and_sends_cloud_models():
  x = _inputs(np.random.default_rng(12))
  alg = _algorithm('fedamp')
  st = alg.server.init(x.prev)
  # Round-0 cloud models are the starting models (PFLlib's first round).
  np.testing.assert_array_equal(_flat(st.rows['encoder']['center']), _flat(x.prev['encoder']))
  out, st, _ = _apply(alg.server, x, st)
  np.testing.assert_array_equal(_flat(out['encoder']), _flat(x.local['encoder']))
  for role in ('encoder', 'decoder'):
    w = _flat(x.local[role]).astype(np.float64)
    d = ((w[:, None] - w[None]) ** 2).sum(-1)
    xi = np.exp(-d) * (1 - np.eye(len(w)))
    xi[np.diag_indices(len(w))] = 1 - xi.sum(1)
    np.testing.assert_allclose(_flat(st.rows[role]['center']), xi @ w, rtol=1e-4, atol=1e-5)
  u, _ = fedamp_math.cloud_models(x.local['encoder'])
  np.testing.assert_array_equal(_flat(u), _flat(st.rows['encoder']['center']))
  assert matfl_math.MODES == ('hard', 'soft')


# ---------------------------------------------------------------------------
# The registry: compositions by name and their errors.
# ---------------------------------------------------------------------------

def test_compositions_by_name():
  assert algorithms.parse('dea(momentum(fedavg))') == ['dea', 'momentum', 'fedavg']
  alg = _algorithm('momentum(fedprox)')
  assert alg.name == 'momentum(fedprox)' and alg.client.loss is not None
  hca2_avg = _algorithm('hca2', hca2={'encoder_agg': 'fedavg', 'decoder_agg': 'none'})
  assert hca2_avg.roles['decoder'] == 'personal' and hca2_avg.shared_roles == ('encoder',)


@pytest.mark.parametrize('spec, blocks, message', [
    ('fedfoo', {}, "unknown algorithm 'fedfoo'; valid choices: 'local', 'fedavg'"),
    ('dea', {}, "wrapper 'dea' needs an algorithm inside, e.g. dea(fedavg)"),
    ('fedavg(fedprox)', {}, "'fedavg' is an algorithm, not a wrapper; valid wrappers: 'momentum'"),
    ('squash(fedavg)', {}, "unknown algorithm wrapper 'squash' in 'squash(fedavg)'"),
    ('dea(local)', {}, "'local' shares no parameters"),
    ('dea(fedavg', {}, 'cannot read algorithm'),
    # More clusters than clients: a bound only the built federation knows.
    ('matfl', {'matfl': {'mode': 'hard', 'num_clusters': 5, 'th': 0.0}},
     'matfl.num_clusters=5 is out of range; valid range: 1 <= num_clusters <= number of clients (4)'),
])
def test_bad_algorithms_are_one_clear_error(spec, blocks, message):
  with pytest.raises(ConfigError, match=re.escape(message)):
    _algorithm(spec, **blocks)


@pytest.mark.parametrize('spec, blocks, message', [
    # Ranges and choices the blocks declare: refused by validation, before build().
    ('fedprox', {'fedprox': {'mu': -1.0}}, 'fedprox.mu=-1.0 is out of range; valid range: mu >= 0'),
    ('matfl', {'matfl': {'mode': 'ward', 'num_clusters': 2, 'th': 0.0}}, "unknown matfl.mode 'ward'"),
    ('ditto', {'ditto': {'lam': -0.1}}, 'ditto.lam=-0.1 is out of range'),
    ('fedamp', {'fedamp': {'lam': 1.0, 'alpha_k': 0.0, 'sigma': 1.0}},
     'fedamp.alpha_k=0.0 is out of range; valid range: alpha_k > 0'),
    ('fedbabu', {'fedbabu': {'finetune_rounds': 5}}, 'fedbabu.finetune_rounds=5 is out of range'),
    ('grouped(fedavg)', {'grouped': {'by': 'colour'}}, "unknown grouped.by 'colour'"),
])
def test_bad_algorithm_settings_are_one_clear_error_of_validation(spec, blocks, message):
  from conftest import tiny_config
  from fedjax_mtl import validate
  config = tiny_config(spec)  # smoke: 3 rounds
  for name, values in blocks.items():
    config[name] = ml_collections.ConfigDict(values)
  with pytest.raises(ConfigError, match=re.escape(message)) as e:
    validate.check_config(config)
  assert '\n' not in str(e.value)
