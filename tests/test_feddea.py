"""FedDEA (spec feddea): the `dea` wrapper and the unified-model setting, on tiny
pytrees against NumPy oracles, plus one short run of `configs/feddea.py:smoke`.

- `dea(rule)`: one top-⌊ρd⌋ mask per client over its whole update (all its rows
  of all roles), ties kept, 1/ρ rescale, the base rule fed prev + Δ̃; the
  ablation variants, no rescale, the server step η_g; ρ = 1 is the base rule;
- its logs (spec §2.2) against NumPy;
- `unified(rule)` (spec §6 A1 'literal'): task row j moves by w_owner·Δ_j, and a
  DEA mask inside it counts d over the whole unified θ;
- the registry's errors for bad values and compositions.
"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from conftest import tiny_config
from fedjax_mtl import algorithms, experiment, report, train
from fedjax_mtl.algorithms import FedInfo, ServerInputs, ServerState, plugin_math, rules
from fedjax_mtl.algorithms.base import Blocks, unstack
from fedjax_mtl.errors import ConfigError

N = 4


def _info(decoder_client=(0, 1, 2, 3, 3, 3), keys=None, **kw):
  k = len(decoder_client)
  keys = keys or (('p', 'a'), ('p', 'b'), ('q', 'c'), ('q', 'a+c'))
  return FedInfo(num_clients=N, num_decoders=k, decoder_client=tuple(decoder_client),
                 decoder_names=tuple(f'd{i}' for i in range(k)),
                 client_names=tuple(f'c{i}' for i in range(N)), homo_groups=tuple(range(N)),
                 decoder_layers=('lin',), num_rounds=3, client_keys=keys,
                 decoder_keys=tuple(('p', f't{i}') for i in range(k)), **kw)


def _tree(rng, rows, shapes):
  return {name: rng.normal(size=(rows,) + s).astype(np.float32) for name, s in shapes.items()}


ENC = {'w': (5, 3), 'b': (7,)}
DEC = {'k': (2, 3), 's': (4,)}
HEAD = {'head_0': (3,)}


def _inputs(rng, roles, rnd=0, ties=False):
  """prev/local views for `roles` {role: (rows, shapes)}; `ties`: Δ in steps of 0.5."""
  prev = {r: _tree(rng, n, s) for r, (n, s) in roles.items()}
  step = lambda p: (np.round(rng.normal(size=p.shape) * 2) / 2 if ties
                    else 0.1 * rng.normal(size=p.shape)).astype(np.float32)
  local = {r: {k: v + step(v) for k, v in t.items()} for r, t in prev.items()}
  return ServerInputs(prev=prev, local=local, num_examples=jnp.asarray([10., 20., 30., 40.]),
                      num_steps=jnp.asarray([1, 2, 3, 4], jnp.int32),
                      client_ids=jnp.arange(N), round=jnp.int32(rnd))


def _flat(tree):
  return np.concatenate([np.asarray(x).reshape(np.shape(x)[0], -1)
                         for x in jax.tree.leaves(tree)], 1)


def _apply(server, x, state=None):
  views = {r: x.prev[r] for r in x.prev}
  state = server.init(views) if state is None else state
  return jax.jit(server.apply)(state, x)


def _client_vectors(x, info, which):
  """Per client: its concatenated Δ over all its rows of all roles (role order of x)."""
  out = []
  for c in range(N):
    parts = []
    for r in [r for r in ('encoder', 'decoder', 'head') if r in x.local]:
      d = _flat(x.local[r]) - _flat(x.prev[r])
      parts += [d[i] for i, o in enumerate(info.row_client(r)) if o == c]
    out.append(np.concatenate(parts))
  return out


def _numpy_mask(v, rho, variant='top'):
  k = max(int(np.floor(rho * v.size)), 1)
  a = np.abs(v)
  if variant == 'small':
    return (a <= np.sort(a)[k - 1]).astype(np.float32)
  return (a >= np.sort(a)[::-1][k - 1]).astype(np.float32)


HETERO = {'encoder': (N, ENC), 'decoder': (6, DEC)}


@pytest.mark.parametrize('ties', [False, True])
def test_dea_over_fedavg_is_per_client_top_rho_then_the_mean(ties):
  rng = np.random.default_rng(0)
  info = _info()
  x = _inputs(rng, HETERO, ties=ties)
  rho = 0.3
  out, _, logs = _apply(rules.dea(rules.mean(), info, rho), x)
  # NumPy: each client's mask over its whole update (encoder + its decoders).
  masked = {r: _flat(x.prev[r]).copy() for r in x.prev}
  for c, v in enumerate(_client_vectors(x, info, 'top')):
    m = _numpy_mask(v, rho)
    assert m.sum() >= np.floor(rho * v.size)  # ties at the threshold are kept (A4)
    if not ties:
      assert m.sum() == np.floor(rho * v.size)
    lo = 0
    for r in ('encoder', 'decoder'):
      d = _flat(x.local[r]) - _flat(x.prev[r])
      for i, o in enumerate(info.row_client(r)):
        if o == c:
          masked[r][i] += d[i] * m[lo:lo + d.shape[1]] / rho
          lo += d.shape[1]
  for r in x.local:
    want = np.tile(masked[r].mean(0), (masked[r].shape[0], 1))
    np.testing.assert_allclose(_flat(out[r]), want, rtol=1e-5, atol=1e-6)
  assert set(logs) >= {'dea_energy', 'dea_amplification', 'dea_kept_encoder',
                       'dea_kept_decoder', 'dea_jaccard'}


def test_dea_on_blocks_equals_dea_on_stacked_rows():
  rng = np.random.default_rng(1)
  info = _info()
  x = _inputs(rng, HETERO)
  sizes = {'encoder': (3, 1), 'decoder': (3, 3)}
  xb = x._replace(prev={r: unstack(v, sizes[r]) for r, v in x.prev.items()},
                  local={r: unstack(v, sizes[r]) for r, v in x.local.items()})
  server = rules.dea(rules.identity(), info, 0.4)
  a, _, la = jax.jit(server.apply)(ServerState(), x)
  b, _, lb = jax.jit(server.apply)(ServerState(), xb)
  assert isinstance(b['encoder'], Blocks)
  for r in a:
    np.testing.assert_array_equal(_flat(a[r]), _flat(rules.stack(b[r])))
  for k in la:
    np.testing.assert_allclose(la[k], lb[k], rtol=1e-6)


def test_rho_one_is_the_base_rule_bitwise():
  info = _info()
  base = rules.mean()
  assert rules.dea(base, info, 1.0) is base
  x = _inputs(np.random.default_rng(2), HETERO)
  cfg = ml_collections.ConfigDict({'dea': {'rho': 1.0, 'variant': 'top', 'rescale': True,
                                           'server_lr': 1.0}})
  a, _, _ = _apply(algorithms.get_algorithm('fedavg', info, cfg).server, x)
  b, _, _ = _apply(algorithms.get_algorithm('dea(fedavg)', info, cfg).server, x)
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(u, v)


def test_ablations_small_random_and_no_rescale():
  rng = np.random.default_rng(3)
  info = _info()
  x = _inputs(rng, HETERO)
  rho = 0.25
  vecs = _client_vectors(x, info, 'top')

  def kept_update(server, rnd=0):
    out, _, _ = _apply(server, x._replace(round=jnp.int32(rnd)))
    return [v for v in _client_vectors(x._replace(local=out), info, 'top')]

  # (a) small: the smallest |Δ| kept, rescaled by 1/ρ.
  for v, got in zip(vecs, kept_update(rules.dea(rules.identity(), info, rho, 'small'))):
    np.testing.assert_allclose(got, v * _numpy_mask(v, rho, 'small') / rho, rtol=1e-5,
                               atol=1e-7)
  # (b) no rescale: the top entries as they are.
  for v, got in zip(vecs, kept_update(rules.dea(rules.identity(), info, rho, rescale=False))):
    np.testing.assert_allclose(got, v * _numpy_mask(v, rho), rtol=1e-5, atol=1e-7)
  # (c) random: exactly k entries per client, each kept one rescaled, a new draw per round.
  server = rules.dea(rules.identity(), info, rho, 'random', seed=5)
  r0, r0_again, r1 = kept_update(server, 0), kept_update(server, 0), kept_update(server, 1)
  for v, a, b, c in zip(vecs, r0, r0_again, r1):
    keep = a != 0
    assert keep.sum() == np.floor(rho * v.size)
    np.testing.assert_allclose(a[keep], v[keep] / rho, rtol=1e-5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(keep, c != 0)


def test_server_step_control():
  rng = np.random.default_rng(4)
  info = _info()
  x = _inputs(rng, HETERO)
  out, _, _ = _apply(rules.dea(rules.mean(), info, 1.0, server_lr=2.5), x)
  for r in x.local:
    prev, mean = _flat(x.prev[r]), _flat(x.local[r]).mean(0)
    np.testing.assert_allclose(_flat(out[r]), prev + 2.5 * (mean - prev), rtol=1e-5, atol=1e-5)


def test_logs_match_numpy():
  rng = np.random.default_rng(5)
  info = _info()
  x = _inputs(rng, HETERO)
  rho = 0.3
  _, _, logs = _apply(rules.dea(rules.identity(), info, rho), x)
  masks, energy = [], []
  for c, v in enumerate(_client_vectors(x, info, 'top')):
    m = _numpy_mask(v, rho)
    masks.append(m)
    energy.append(np.sum((m * v) ** 2) / np.sum(v ** 2))
    enc_size = _flat(x.prev['encoder']).shape[1]
    np.testing.assert_allclose(logs['dea_kept_encoder'][c], m[:enc_size].sum() / m.sum(),
                               rtol=1e-6)
    np.testing.assert_allclose(logs['dea_kept_decoder'][c], m[enc_size:].sum() / m.sum(),
                               rtol=1e-6)
  np.testing.assert_allclose(logs['dea_energy'], energy, rtol=1e-5)
  np.testing.assert_allclose(logs['dea_amplification'], np.sqrt(energy) / rho, rtol=1e-5)
  # Jaccard over the one-row-per-client role (the encoder; decoders have several owners' rows).
  enc = [m[:_flat(x.prev['encoder']).shape[1]].astype(bool) for m in masks]
  jac = np.array([[np.sum(a & b) / np.sum(a | b) for b in enc] for a in enc])
  np.testing.assert_allclose(logs['dea_jaccard'], jac, rtol=1e-6)


TASK_LEVEL = {'encoder': (N, ENC), 'decoder': (N, DEC), 'head': (N, HEAD)}
TASK_KEYS = (('p', 'a'), ('p', 'b'), ('p', 'c'), ('p', 'd'))


def _unified_oracle(x, w, rho=None):
  """NumPy: θ + Σ_k w_k·Δ̃_k over the whole unified θ (encoder + all task rows),
  Δ̃_k = top-ρ of client k's full-θ update (zeros on other tasks' rows) / ρ."""
  enc_p, enc_l = _flat(x.prev['encoder']), _flat(x.local['encoder'])
  task = ('decoder', 'head')
  tp = {r: _flat(x.prev[r]) for r in task}
  tl = {r: _flat(x.local[r]) for r in task}
  new_enc, new_task = enc_p[0].copy(), {r: tp[r].copy() for r in task}
  for c in range(N):
    # Client c's update over the unified θ = [encoder | all decoders | all heads].
    full = [enc_l[c] - enc_p[c]]
    for r in task:
      d = np.zeros_like(tp[r])
      d[c] = tl[r][c] - tp[r][c]
      full.append(d.reshape(-1))
    v = np.concatenate(full)
    m = np.ones_like(v) if rho is None else _numpy_mask(v, rho) / rho
    dv = w[c] * m * v
    new_enc += dv[:enc_p.shape[1]]
    lo = enc_p.shape[1]
    for r in task:
      new_task[r] += dv[lo:lo + tp[r].size].reshape(tp[r].shape)
      lo += tp[r].size
  return new_enc, new_task


@pytest.mark.parametrize('rho', [None, 0.3])
def test_unified_literal_matches_the_whole_theta_oracle(rho):
  rng = np.random.default_rng(6)
  info = _info(decoder_client=(0, 1, 2, 3), keys=TASK_KEYS)
  cfg = ml_collections.ConfigDict({'unified': 'literal', 'fedavg': {'weighting': 'examples'},
                                   'dea': {'rho': rho or 1.0, 'variant': 'top',
                                           'rescale': True, 'server_lr': 1.0}})
  alg = algorithms.get_algorithm('dea(fedavg)', info, cfg)
  assert alg.shared_roles == ('encoder', 'decoder', 'head')
  x = _inputs(rng, TASK_LEVEL)
  # Every client starts the round from the one global model.
  start = {k: np.broadcast_to(v[:1], v.shape) for k, v in x.prev['encoder'].items()}
  x = x._replace(prev={**x.prev, 'encoder': start},
                 local={**x.local, 'encoder': {k: v - x.prev['encoder'][k] + start[k]
                                               for k, v in x.local['encoder'].items()}})
  out, _, logs = _apply(alg.server, x)
  w = np.asarray([10., 20., 30., 40.]) / 100.
  enc, task = _unified_oracle(x, w, rho)
  np.testing.assert_allclose(_flat(out['encoder']), np.tile(enc, (N, 1)), rtol=1e-5, atol=1e-6)
  for r in ('decoder', 'head'):
    np.testing.assert_allclose(_flat(out[r]), task[r], rtol=1e-5, atol=1e-6)
  if rho:  # every role has one row per client in the unified view: Jaccard over the whole θ
    assert logs['dea_jaccard'].shape == (N, N)
    np.testing.assert_allclose(np.asarray(logs['dea_kept_encoder'])
                               + logs['dea_kept_decoder'] + logs['dea_kept_head'], 1., rtol=1e-6)


def test_unified_owner_leaves_task_parameters_to_their_owner():
  info = _info(decoder_client=(0, 1, 2, 3), keys=TASK_KEYS)
  cfg = ml_collections.ConfigDict({'unified': 'owner'})
  alg = algorithms.get_algorithm('dea(fedprox)', info, cfg)
  assert alg.roles == {'encoder': 'shared', 'decoder': 'personal', 'head': 'personal'}
  assert alg.shared_roles == ('encoder',)


def _validated(spec, blocks):
  """ConfigError of validation for the smoke config of `spec` with `blocks` set."""
  from fedjax_mtl import validate
  cfg = tiny_config(spec)
  for name, values in blocks.items():
    for k, v in values.items():
      cfg[name][k] = v
  with pytest.raises(ConfigError) as e:
    validate.check_config(cfg)
  return str(e.value)


@pytest.mark.parametrize('spec,cfg,message', [
    # The dea block's declared ranges: refused by validation, before anything is built.
    ('dea(fedavg)', {'dea': {'rho': 0.0}}, 'dea.rho=0.0 is out of range; valid range: '
     '0 < rho <= 1'),
    ('dea(fedavg)', {'dea': {'rho': 1.5}}, 'valid range: 0 < rho <= 1'),
    ('dea(fedavg)', {'dea': {'variant': 'largest'}}, "unknown dea.variant 'largest'"),
    ('dea(fedavg)', {'dea': {'server_lr': 0.0}}, 'dea.server_lr=0.0 is out of range'),
])
def test_bad_dea_values_are_one_clear_error_of_validation(spec, cfg, message):
  error = _validated(spec, cfg)
  assert message in error and '\n' not in error


@pytest.mark.parametrize('spec,cfg,info_kw,message', [
    ('dea(local)', {}, {}, "'local' shares no parameters"),
    ('dea(fedavgg)', {}, {}, "unknown algorithm 'fedavgg'"),
    ('dea', {}, {}, "wrapper 'dea' needs an algorithm inside"),
    ('dea(fedavg)', {'unified': 'both'}, {}, "unknown unified 'both'"),
    ('dea(hca2)', {'unified': 'literal'}, {'decoder_client': (0, 1, 2, 3), 'keys': TASK_KEYS},
     "base 'hca2'; valid bases: 'fedavg', 'fedprox'"),
    ('dea(fedavg)', {'unified': 'literal'}, {}, "client 'c3' holds several tasks"),
])
def test_bad_values_are_one_clear_error(spec, cfg, info_kw, message):
  blocks = {k: (ml_collections.ConfigDict({**algorithms.dea_config().to_dict(), **v})
                if k == 'dea' else v) for k, v in cfg.items()}
  with pytest.raises(ConfigError, match=None) as e:
    algorithms.get_algorithm(spec, _info(**info_kw), ml_collections.ConfigDict(blocks))
  assert message in str(e.value)
  assert '\n' not in str(e.value)


def test_feddea_smoke_run_trains_one_unified_model(tmp_path):
  import importlib.util
  import os
  spec = importlib.util.spec_from_file_location(
      'feddea_config', os.path.join(os.path.dirname(__file__), '..', 'configs', 'feddea.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  cfg = mod.get_config('smoke')
  cfg.progress = False
  cfg.num_rounds = 2
  base = tiny_config()
  assert cfg.model.encoder == base.model.encoder  # the shared smoke model (compile cache)
  out = train.train_and_evaluate(cfg, str(tmp_path))
  exp = experiment.build(cfg)
  assert exp.fed.num_clients == 3 and all(len(c.tasks) == 1 for c in exp.fed.clients)
  params = jax.device_get(out['state'].groups[0].params)
  for leaf in jax.tree.leaves(params['encoder']):  # one global encoder after aggregation
    np.testing.assert_array_equal(leaf, np.broadcast_to(leaf[:1], leaf.shape))
  assert {r['unified'] for r in out['eval']} == {'literal'}
  rows = report.read_jsonl(str(tmp_path / 'metrics.jsonl'))
  agg = [r for r in rows if r['type'] == 'agg']
  assert len(agg) == 2 and all(min(r['dea_energy']) >= 0.25 for r in agg)
  assert '[unified=literal]' in (tmp_path / 'results.md').read_text()


def _feddea_config(variant='smoke'):
  import importlib.util
  import os
  spec = importlib.util.spec_from_file_location(
      'feddea_config', os.path.join(os.path.dirname(__file__), '..', 'configs', 'feddea.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  cfg = mod.get_config(variant)
  cfg.progress = False
  return cfg


@pytest.mark.parametrize('algorithm,encoder', [('dea(fedacg)', None),
                                               ('dea(fedbn)', 'resnet18')])
def test_unified_round_keeps_one_encoder_and_equals_a_row_per_client(algorithm, encoder):
  """The unified round keeps one row of the round-start encoder (the groups' params
  are donated to local training) and gives bitwise the round that keeps a row per
  client; FedBN's batch norms stay a row per client. FedACG's lookahead start and
  MOON-free client terms read the shared row."""
  import dataclasses
  from fedjax_mtl import rounds
  from fedjax_mtl.engines.dense import DenseEngine
  cfg = _feddea_config()
  cfg.algorithm = algorithm
  cfg.num_rounds = 2
  if encoder:
    cfg.model.encoder = encoder
    cfg.model.kwargs = {'stage_sizes': (1, 1, 1, 1), 'width': 8}
  exp = experiment.build(cfg)
  axes = exp.start_axes[0]
  flat = jax.tree_util.tree_flatten_with_path(axes, is_leaf=lambda a: a is None)[0]
  shared = {'/'.join(plugin_math.path_names(p)) for p, a in flat if a is None}
  assert shared and all(n.startswith('encoder/') for n in shared)
  if encoder:  # batch norms stay with their client (FedBN)
    assert 'encoder/bn1/scale' not in shared and 'encoder/conv1/kernel' in shared
  else:
    assert {n for n, _ in ((('/'.join(plugin_math.path_names(p))), a) for p, a in flat)
            if n.startswith('encoder/')} == shared
  per_row = dataclasses.replace(exp, start_axes=None)
  finals = []
  for e in (exp, per_row):
    engine = DenseEngine(e)
    engine.open(0)
    state = experiment.init_state(e)
    start = rounds.round_start(engine.programs.round_start, [gs.params for gs in state.groups])
    if e.start_axes is not None:  # one row of each shared leaf
      for a, x, full in zip(jax.tree.leaves(axes, is_leaf=lambda a: a is None),
                            jax.tree.leaves(start[0]), jax.tree.leaves(state.groups[0].params)):
        assert x.shape == (full.shape[1:] if a is None else full.shape)
    for rnd in (1, 2):
      state, _ = engine.run_round(state, rnd)
    finals.append(jax.device_get(state.groups[0].params))
  jax.tree.map(np.testing.assert_array_equal, *finals)


# ---------------------------------------------------------------------------
# The plug-in bases (spec §2.4) and the enhancement modules (§2.5) as wired in.
# ---------------------------------------------------------------------------

def _cfg(**blocks):
  return ml_collections.ConfigDict({k: ml_collections.ConfigDict(v) if isinstance(v, dict)
                                    else v for k, v in blocks.items()})


def _start_equal(x):
  """Every row of every role starts the round from one model (as after aggregation)."""
  prev = {r: {k: np.broadcast_to(v[:1], v.shape) for k, v in t.items()} for r, t in x.prev.items()}
  local = {r: {k: v - x.prev[r][k] + prev[r][k] for k, v in t.items()}
           for r, t in x.local.items()}
  return x._replace(prev=prev, local=local)


def test_fednova_normalises_by_local_steps_and_is_fedavg_with_equal_steps():
  info = _info()
  x = _start_equal(_inputs(np.random.default_rng(10), HETERO))
  cfg = _cfg(fedavg={'weighting': 'examples'})
  out, _, _ = _apply(algorithms.get_algorithm('fednova', info, cfg).server, x)
  steps = np.asarray(x.num_steps, np.float64)
  for r in x.local:
    owners = np.asarray(info.row_client(r))
    n = np.asarray(x.num_examples)[owners]
    w, tau = n / n.sum(), steps[owners]
    d = _flat(x.local[r]) - _flat(x.prev[r])
    want = _flat(x.prev[r])[0] + (w * tau).sum() * ((w / tau)[:, None] * d).sum(0)
    np.testing.assert_allclose(_flat(out[r]), np.tile(want, (len(owners), 1)), rtol=1e-5,
                               atol=1e-6)
  same = x._replace(num_steps=jnp.full((N,), 3, jnp.int32))
  a, _, _ = _apply(algorithms.get_algorithm('fednova', info, cfg).server, same)
  b, _, _ = _apply(algorithms.get_algorithm('fedavg', info, cfg).server, same)
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)


def test_feddyn_server_state_and_client_terms_over_two_rounds():
  info = _info()
  alpha = 0.1
  alg = algorithms.get_algorithm('feddyn', info, _cfg(feddyn={'alpha': alpha}))
  rng = np.random.default_rng(11)
  x = _start_equal(_inputs(rng, HETERO))
  state = alg.server.init(x.prev)
  h = {r: np.zeros(_flat(x.prev[r]).shape[1]) for r in x.local}
  for rnd in range(2):
    out, state, _ = jax.jit(alg.server.apply)(state, x._replace(round=jnp.int32(rnd)))
    for r in x.local:
      d = (_flat(x.local[r]) - _flat(x.prev[r])).mean(0)  # uniform weights
      h[r] = h[r] - alpha * d
      want = _flat(x.prev[r])[0] + d - h[r] / alpha
      np.testing.assert_allclose(_flat(out[r]), np.tile(want, (_flat(out[r]).shape[0], 1)),
                                 rtol=1e-4, atol=1e-5)
    x = _start_equal(x._replace(prev=out, local={r: {k: v + 0.05 for k, v in out[r].items()}
                                                for r in out}))
  # Client: ∂/∂θ of −⟨g, θ⟩ + α/2‖θ − start‖² on shared leaves; nothing on the head.
  from fedjax_mtl.algorithms import ClientCtx
  from fedjax_mtl.models.multitask import param_roles
  params = {'encoder': {'w': jnp.ones((3,))}, 'decoders': {'k': jnp.full((2,), 2.)},
            'head_0': {'k': jnp.full((2,), 3.)}}
  start = jax.tree.map(jnp.zeros_like, params)
  g = alg.client.init(params)
  g = jax.tree.map(lambda v: v + 0.5, g)
  grad = jax.grad(lambda p: alg.client.loss(ClientCtx(p, start, g, {}, param_roles(params),
                                                      {})))(params)
  np.testing.assert_allclose(grad['encoder']['w'], -0.5 + alpha * 1.0, rtol=1e-6)
  np.testing.assert_allclose(grad['decoders']['k'], -0.5 + alpha * 2.0, rtol=1e-6)
  np.testing.assert_array_equal(grad['head_0']['k'], 0.)
  _, new_g = alg.client.finalize(params, start, g)
  np.testing.assert_allclose(new_g['encoder']['w'], 0.5 - alpha * 1.0, rtol=1e-6)


def test_fedbn_keeps_batch_norm_parameters_local_and_out_of_the_dea_mask():
  info = _info(norm_modules=frozenset({('bn',)}))
  x = _inputs(np.random.default_rng(12), {'encoder': (N, {'w': (5, 3), 'bn': (4,)}),
                                           'decoder': (6, DEC)})
  x = x._replace(prev={**x.prev, 'encoder': {'w': x.prev['encoder']['w'],
                                            'bn': {'scale': x.prev['encoder']['bn']}}},
                 local={**x.local, 'encoder': {'w': x.local['encoder']['w'],
                                              'bn': {'scale': x.local['encoder']['bn']}}})
  for spec in ('fedbn', 'dea(fedbn)'):
    alg = algorithms.get_algorithm(spec, info, _cfg(dea=algorithms.dea_config().to_dict()))
    out, _, _ = _apply(alg.server, x)
    np.testing.assert_array_equal(out['encoder']['bn']['scale'], x.local['encoder']['bn']['scale'])
    w = np.asarray(out['encoder']['w'])
    np.testing.assert_allclose(w, np.broadcast_to(w[:1], w.shape), rtol=1e-6)


def test_pcgrad_projects_conflicting_updates_only():
  info = _info(decoder_client=(0, 1, 2, 3), keys=TASK_KEYS)
  alg = algorithms.get_algorithm('pcgrad(fedavg)', info, _cfg())
  base = algorithms.get_algorithm('fedavg', info, _cfg())
  rng = np.random.default_rng(13)
  x = _start_equal(_inputs(rng, {'encoder': (N, ENC), 'decoder': (N, DEC)}))
  # Non-conflicting updates (all positive): PCGrad changes nothing.
  pos = {r: {k: x.prev[r][k] + np.abs(v - x.prev[r][k]) for k, v in t.items()}
         for r, t in x.local.items()}
  a, _, logs = _apply(alg.server, x._replace(local=pos))
  b, _, _ = _apply(base.server, x._replace(local=pos))
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)
  # General updates: each client's projected update against NumPy in the logged order.
  out, _, logs = _apply(alg.server, x)
  deltas = np.concatenate([_flat(x.local[r]) - _flat(x.prev[r]) for r in ('decoder', 'encoder')],
                          1)
  order = np.asarray(plugin_math.pcgrad_order(jax.random.fold_in(jax.random.PRNGKey(0), 0), N))
  proj = []
  for k in range(N):
    g = deltas[k].astype(np.float64)
    for j in order[k]:
      if j != k and g @ deltas[j] < 0:
        g = g - (g @ deltas[j]) / (deltas[j] @ deltas[j]) * deltas[j]
    proj.append(g)
  want = np.concatenate([_flat(x.prev[r]) for r in ('decoder', 'encoder')], 1)[0] + \
      np.mean(proj, 0)
  got = np.concatenate([_flat(out[r]) for r in ('decoder', 'encoder')], 1)
  np.testing.assert_allclose(got, np.tile(want, (N, 1)), rtol=1e-4, atol=1e-5)


def test_heal_over_fedavg_is_fedheal_over_two_rounds():
  info = _info(decoder_client=(0, 1, 2, 3), keys=TASK_KEYS)
  alg = algorithms.get_algorithm('heal(fedavg)', info, _cfg())
  rng = np.random.default_rng(14)
  x = _start_equal(_inputs(rng, {'encoder': (N, ENC), 'decoder': (N, DEC)}))
  state = alg.server.init(x.prev)
  ref = plugin_math.heal_init(x.prev)
  for rnd in range(2):
    out, state, logs = jax.jit(alg.server.apply)(state, x._replace(round=jnp.int32(rnd)))
    deltas = {r: jax.tree.map(lambda a, b: a - b, x.local[r], x.prev[r]) for r in x.local}
    prev0 = {r: jax.tree.map(lambda v: v[0], x.prev[r]) for r in x.prev}
    want, ref, _ = plugin_math.heal_aggregate(ref, prev0, deltas)
    for r in x.local:
      np.testing.assert_allclose(_flat(out[r]), np.tile(_flat(jax.tree.map(
          lambda v: v[None], want[r]))[0], (N, 1)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logs['heal_weights'], ref.weights / ref.weights.sum(), rtol=1e-6)
    x = _start_equal(_inputs(rng, {'encoder': (N, ENC), 'decoder': (N, DEC)}))
    x = x._replace(prev={r: jax.tree.map(np.asarray, v) for r, v in x.prev.items()})


@pytest.mark.parametrize('spec,blocks,message', [
    ('heal(fedavg)', {}, 'heal() needs one update per client, but the decoder role has 6 rows'),
    ('pcgrad(fedprox)', {}, 'pcgrad() needs one update per client'),
])
def test_bad_bases_and_modules_are_one_clear_error(spec, blocks, message):
  with pytest.raises(ConfigError) as e:
    algorithms.get_algorithm(spec, _info(), _cfg(**blocks))
  assert message in str(e.value) and '\n' not in str(e.value)


@pytest.mark.parametrize('spec,blocks,message', [
    # Declared ranges: refused by validation, before anything is built.
    ('heal(fedavg)', {'heal': {'tau': 1.0, 'beta': 0.4}}, 'heal.tau=1.0 is out of range; '
     'valid range: 0 <= tau < 1'),
    ('feddyn', {'feddyn': {'alpha': 0.0}}, 'feddyn.alpha=0.0 is out of range'),
])
def test_bad_base_and_module_settings_are_one_clear_error_of_validation(spec, blocks, message):
  error = _validated(spec, blocks)
  assert message in error and '\n' not in error


def test_moon_client_term_is_the_contrastive_loss_of_the_three_representations():
  info = _info(decoder_client=(0, 1, 2, 3), keys=TASK_KEYS)
  alg = algorithms.get_algorithm('moon', info, _cfg(moon={'mu': 1.0, 'tau': 0.5}))
  from fedjax_mtl.algorithms import ClientCtx
  rng = np.random.default_rng(15)
  params = {'encoder': {'w': jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)}}
  start = {'encoder': {'w': jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)}}
  image = jnp.asarray(rng.normal(size=(5, 3)), jnp.float32)
  features = lambda enc: image @ enc['w']  # a stand-in encoder: [B, 4] representations
  state = alg.client.init(start)  # the previous local model: the round-0 global model
  ctx = lambda p, s: ClientCtx(p, start, s, {}, {}, {}, features=features)
  want = plugin_math.moon_loss(features(params['encoder']), features(start['encoder']),
                               features(state), 1.0, 0.5)
  np.testing.assert_allclose(alg.client.loss(ctx(params, state)), want, rtol=1e-6)
  # Before a client's first round its previous model is the global one: no gradient.
  g = jax.grad(lambda p: alg.client.loss(ctx(p, state)))(params)
  np.testing.assert_allclose(g['encoder']['w'], 0., atol=1e-6)
  _, new_state = alg.client.finalize(params, start, state)
  np.testing.assert_array_equal(new_state['w'], params['encoder']['w'])
  assert alg.roles == {'encoder': 'shared', 'decoder': 'shared', 'head': 'personal'}


def test_fedacg_lookahead_and_momentum_over_two_rounds():
  from fedjax_mtl.algorithms import fedacg
  from fedjax_mtl.models.multitask import param_roles
  info = _info()
  lam = 0.5
  alg = algorithms.get_algorithm('fedacg', info, _cfg(fedacg={'lam': lam, 'beta': 0.01}))
  rng = np.random.default_rng(16)
  x = _start_equal(_inputs(rng, HETERO))
  state = alg.server.init(x.prev)
  m = {r: np.zeros(_flat(x.prev[r]).shape) for r in x.local}
  for rnd in range(2):
    out, state, _ = jax.jit(alg.server.apply)(state, x._replace(round=jnp.int32(rnd)))
    for r in x.local:
      mean = _flat(x.local[r]).mean(0)  # uniform FedAvg of the uploads: θ̃ + mean Δ
      np.testing.assert_allclose(_flat(out[r]), np.tile(mean, (_flat(out[r]).shape[0], 1)),
                                 rtol=1e-5, atol=1e-6)
      m[r] = lam * m[r] + (_flat(out[r]) - _flat(x.prev[r]))
      np.testing.assert_allclose(_flat(state.rows[r][fedacg.MOMENTUM]), m[r], rtol=1e-5,
                                 atol=1e-6)
    x = _start_equal(_inputs(rng, HETERO))
  # A client starts from θ + λ m on its shared roles; heads are left alone.
  params = {'encoder': {'w': jnp.ones((3,))}, 'decoders': {'k': jnp.ones((2, 2))},
            'head_0': {'k': jnp.ones((2,))}}
  rows = {'encoder': {fedacg.MOMENTUM: {'encoder': {'w': jnp.full((3,), 2.)}}},
          'decoder': {fedacg.MOMENTUM: {'decoders': {'k': jnp.full((2, 2), 4.)}}}}
  out = alg.client.begin(params, rows, param_roles(params))
  np.testing.assert_allclose(out['encoder']['w'], 1. + lam * 2.)
  np.testing.assert_allclose(out['decoders']['k'], 1. + lam * 4.)
  np.testing.assert_array_equal(out['head_0']['k'], 1.)


def test_edge_losses_pick_the_first_and_the_last_real_step():
  from fedjax_mtl.local_training import edge_losses
  totals = jnp.asarray([5., 4., 9., 3., 2., 7.])
  mask = jnp.asarray([1, 1, 0, 1, 1, 0])  # epochs of 3 steps, the last of each padding
  first, last = edge_losses(totals, mask)
  assert float(first) == 5. and float(last) == 2.
  assert [float(v) for v in edge_losses(totals, jnp.zeros(6))] == [0., 0.]


def test_fedga_weights_follow_the_generalisation_gaps_over_two_rounds():
  info = _info(decoder_client=(0, 1, 2, 3), keys=TASK_KEYS)
  d = 0.2
  alg = algorithms.get_algorithm('fedga', info, _cfg(fedga={'step_size': d}))
  rng = np.random.default_rng(17)
  x = _start_equal(_inputs(rng, {'encoder': (N, ENC), 'decoder': (N, DEC)}))
  last0 = jnp.asarray([1.0, 2.0, 1.5, 0.5])
  first1 = jnp.asarray([1.2, 2.0, 1.0, 0.9])
  state = alg.server.init(x.prev)
  out, state, logs = jax.jit(alg.server.apply)(
      state, x._replace(round=jnp.int32(0), first_loss=first1 * 0, last_loss=last0))
  np.testing.assert_allclose(logs['fedga_weights'], 0.25)  # round 0: uniform, no gap yet
  np.testing.assert_allclose(_flat(out['encoder']), np.tile(_flat(x.local['encoder']).mean(0),
                                                              (N, 1)), rtol=1e-5, atol=1e-6)
  out, state, logs = jax.jit(alg.server.apply)(
      state, x._replace(round=jnp.int32(1), first_loss=first1, last_loss=last0))
  gaps = np.asarray(first1 - last0)
  a = np.clip(0.25 + d * (1 - 0 / 3) / N * gaps / np.abs(gaps).max(), 0, 1)
  a = a / a.sum()
  np.testing.assert_allclose(logs['fedga_weights'], a, rtol=1e-6)
  np.testing.assert_allclose(logs['fedga_gaps'], gaps, rtol=1e-6)
  for r in x.local:
    np.testing.assert_allclose(_flat(out[r]), np.tile((a[:, None] * _flat(x.local[r])).sum(0),
                                                      (N, 1)), rtol=1e-5, atol=1e-6)
