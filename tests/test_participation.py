"""Partial participation (fedjax_mtl/participation.py) in the dense engine.

- the sampler: slots per group, stateless seeded draws, weighting by examples;
- the server rules over the participants only, against NumPy over two rounds of a
  4-client federation (FedAvg's mean, uniform and by examples; FedNova; FedDyn's h);
- the engine: non-participants keep every part of their state through local
  training and aggregation, participants train as in a full round, FedAvg's new
  model is the mean of the participants' uploads, a resumed run draws the same
  clients, bad input is one line before anything is written.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_resumes_bitwise, fed_info, tiny_config
from fedjax_mtl import experiment, participation, rounds, train
from fedjax_mtl.algorithms import FedInfo, ServerInputs, ServerState, fednova, feddyn, rules
from fedjax_mtl.engines import dense
from fedjax_mtl.errors import ConfigError

N = 4


def test_slots_share_the_rounds_clients_among_the_groups():
  assert participation.total(0.1, 24) == 3 and participation.total(1.0, 24) == 24
  assert participation.total(5, 24) == 5
  # 4c: 20 PASCAL and 4 NYUD clients at 10 %: 3 a round, quotas 2.5 and 0.5: the
  # groups get 2 or 3 and 0 or 1, 3 in all, each client 1/8 of the rounds.
  assert participation.slot_options((20, 4), 0.1) == ((2, 3), (1,))
  assert participation.slot_options((20, 4), 0.5) == ((10,), (2,))
  draws = np.array([participation.round_slots((20, 4), 0.1, 0, r) for r in range(1, 2001)])
  assert set(map(tuple, draws)) == {(3, 0), (2, 1)} and (draws.sum(1) == 3).all()
  np.testing.assert_allclose(draws.mean(0), [2.5, 0.5], atol=4 * 0.5 / np.sqrt(2000))
  assert participation.round_slots((4, 1), 1.0, 0, 1) == (4, 1)
  # Quotas 2.4 and 0.6 (smoke, half of 5): (2, 1) or (3, 0), E = the quota.
  draws = np.array([participation.round_slots((4, 1), 0.5, 0, r) for r in range(1, 2001)])
  np.testing.assert_allclose(draws.mean(0), [2.4, 0.6], atol=4 * 0.5 / np.sqrt(2000))
  for bad in (0, -0.5, 1.5, 7, True, 'half'):
    with pytest.raises(ConfigError, match='participation=.* is out of range; valid: a fraction'):
      participation.total(bad, 6)


def test_draws_are_seeded_stateless_and_weighted_by_examples():
  a = participation.sample((20, 4), (3, 1), seed=0, rnd=5)
  assert [len(r) for r in a] == [3, 1] and all(np.all(np.diff(r) > 0) for r in a)
  np.testing.assert_array_equal(np.concatenate(a), np.concatenate(
      participation.sample((20, 4), (3, 1), seed=0, rnd=5)))
  draws = [participation.sample((20, 4), (3, 1), seed=0, rnd=r) for r in range(1, 41)]
  assert len({tuple(d[0]) for d in draws}) > 30  # rounds draw other clients
  # By examples: one client holds 91 % of a group's examples.
  ex = [np.array([100] + [1] * 9, np.float64)]
  hits = sum(0 in participation.sample((10,), (1,), 0, r, ex)[0] for r in range(1, 401))
  assert hits > 300  # p = 0.917: 400 draws give 367 ± 6


def _info():
  return fed_info(N, tuple(range(N)))


def _round(rng, prev, valid):
  """Uploads: participants moved, the others' uploads are their start (untrained)."""
  local = {r: jax.tree.map(lambda p: np.where(valid.reshape((-1,) + (1,) * (p.ndim - 1)),
                                              p + rng.normal(size=p.shape).astype(np.float32),
                                              p), v) for r, v in prev.items()}
  return local


@pytest.mark.parametrize('weighting', ['uniform', 'examples'])
def test_fedavg_fednova_and_feddyn_aggregate_the_participants_only(weighting):
  rng = np.random.default_rng(0)
  info = _info()
  examples = np.array([10., 20., 30., 40.], np.float32)
  steps = np.array([2, 4, 1, 3], np.int32)
  valids = [np.array([True, False, True, True]), np.array([False, True, True, False])]
  one = rng.normal(size=(5, 3)).astype(np.float32)
  prev = {'encoder': {'w': np.broadcast_to(one, (N, 5, 3)).copy()}}
  alpha = 0.1
  servers = {'mean': rules.mean(weighting, info), 'fednova': fednova.server(info, weighting),
             'feddyn': feddyn.server(info, alpha, weighting)}
  states = {k: s.init(prev) for k, s in servers.items()}
  want = {k: prev['encoder']['w'].copy() for k in servers}
  h = np.zeros((5, 3), np.float32)
  for rnd, valid in enumerate(valids):
    w = (examples if weighting == 'examples' else np.ones(N, np.float32)) * valid
    w = w / w.sum()
    for name, server in servers.items():
      start = {'encoder': {'w': want[name]}}
      local = _round(np.random.default_rng(rnd), start, valid)
      x = ServerInputs(prev=start, local=local, num_examples=jnp.asarray(examples),
                       num_steps=jnp.asarray(steps * valid), client_ids=jnp.arange(N),
                       round=jnp.int32(rnd), row_valid=jnp.asarray(valid))
      new, states[name], _ = jax.jit(server.apply)(states[name], x)
      theta = want[name][0]
      deltas = local['encoder']['w'] - start['encoder']['w']
      if name == 'mean':
        ref = theta + np.tensordot(w, deltas, 1)
      elif name == 'fednova':  # θ + τ_eff Σ w_k Δ_k/τ_k over the participants
        tau = steps * valid
        ref = theta + np.sum(w * tau) * np.tensordot(w / np.maximum(tau, 1), deltas, 1)
      else:  # Acar et al. Alg. 1: h -= α (1/m) Σ_P Δ_k; θ = mean_P θ_k − h/α
        h = h - alpha * np.tensordot(w, deltas, 1) * valid.sum() / N
        ref = theta + np.tensordot(w, deltas, 1) - h / alpha
      np.testing.assert_allclose(new['encoder']['w'], np.broadcast_to(ref, (N, 5, 3)),
                                 rtol=1e-5, atol=1e-6)
      want[name] = np.asarray(new['encoder']['w'])


def test_fedga_moves_the_weights_of_returning_participants_only():
  """FedGA over 3 rounds of 4 clients: a gap is measured when a client takes part
  again (the loss of the model it is sent now minus its last trained loss), the
  others' gaps are 0, the mean is over the participants weighted by their a_k."""
  import dataclasses
  from fedjax_mtl.algorithms import fedga
  from fedjax_mtl.algorithms.plugin_math import fedga_step
  info = dataclasses.replace(_info(), num_participants=2)
  server = fedga.server(info, step_size=0.2)
  rng = np.random.default_rng(3)
  valids = [np.array([True, True, False, False]), np.array([False, True, True, False]),
            np.array([True, True, False, True])]
  prev = {'encoder': {'w': np.broadcast_to(rng.normal(size=(2, 3)), (N, 2, 3))
                      .astype(np.float32).copy()}}
  state = server.init(prev)
  a, last, seen = np.full(N, 0.25), np.zeros(N), np.zeros(N, bool)
  for rnd, valid in enumerate(valids):
    first = rng.uniform(1, 2, N).astype(np.float32)
    end = rng.uniform(0, 1, N).astype(np.float32)
    local = _round(np.random.default_rng(10 + rnd), prev, valid)
    x = ServerInputs(prev=prev, local=local, num_examples=jnp.ones(N), num_steps=jnp.asarray(
        2 * valid, jnp.int32), client_ids=jnp.arange(N), round=jnp.int32(rnd),
        first_loss=jnp.asarray(first), last_loss=jnp.asarray(end), row_valid=jnp.asarray(valid))
    new, state, logs = jax.jit(server.apply)(state, x)
    # NumPy: FedDG-GA's update on the measured gaps only.
    gaps = np.where(valid & seen, first - last, 0.)
    if (valid & seen).any():
      d = float(fedga_step(rnd - 1, info.num_rounds, 0.2))
      a = np.clip(a + d / N * gaps / np.abs(gaps).max(), 0, 1)
      a = a / a.sum()
    w = a * valid / (a * valid).sum()
    ref = np.tensordot(w, local['encoder']['w'], 1)
    np.testing.assert_allclose(logs['fedga_weights'], a, rtol=1e-6)
    np.testing.assert_allclose(new['encoder']['w'], np.broadcast_to(ref, (N, 2, 3)), rtol=1e-5,
                               atol=1e-6)
    last, seen = np.where(valid, end, last), seen | valid
    prev = {'encoder': {'w': np.asarray(new['encoder']['w'])}}
  assert not np.allclose(a, 0.25)  # rounds 2 and 3 measured gaps (clients 0, 1)
  np.testing.assert_allclose(state.shared['last_loss'], last, rtol=1e-6)


def test_grouped_rules_read_their_groups_participants():
  """grouped(fedavg) by examples and grouped(fednova), groups {c0, c1} and {c2, c3}
  (two datasets): each group's mean over its own participants, weighted by their
  examples (FedNova: and normalised by their steps); a group with no participant
  keeps its rows' starts as their mean (zero update)."""
  import dataclasses
  from fedjax_mtl.algorithms import get_algorithm
  import ml_collections
  keys = (('p', 't'), ('p', 't'), ('q', 't'), ('q', 't'))
  info = dataclasses.replace(_info(), client_keys=keys, decoder_keys=keys, num_participants=2)
  examples = np.array([10., 30., 20., 60.], np.float32)
  steps = np.array([2, 4, 1, 3], np.int32)
  cfg = ml_collections.ConfigDict({'fedavg': {'weighting': 'examples'},
                                   'grouped': {'by': 'dataset'}})
  rng = np.random.default_rng(4)
  starts = rng.normal(size=(2, 3)).astype(np.float32)  # one start per group
  prev = {'encoder': {'w': starts[[0, 0, 1, 1]]}}
  for valid in (np.array([True, True, False, True]), np.array([False, False, True, True])):
    local = _round(rng, prev, valid)
    x = ServerInputs(prev=prev, local=local, num_examples=jnp.asarray(examples),
                     num_steps=jnp.asarray(steps * valid), client_ids=jnp.arange(N),
                     round=jnp.int32(0), row_valid=jnp.asarray(valid))
    for spec in ('grouped(fedavg)', 'grouped(fednova)'):
      server = get_algorithm(spec, info, cfg).server
      new, _, _ = jax.jit(server.apply)(server.init(prev), x)
      for g in ([0, 1], [2, 3]):
        on = [c for c in g if valid[c]]
        if not on:
          np.testing.assert_array_equal(np.asarray(new['encoder']['w'])[g],
                                        prev['encoder']['w'][g])
          continue
        d = local['encoder']['w'][on] - prev['encoder']['w'][on]
        w = examples[on] / examples[on].sum()
        upd = np.tensordot(w, d, 1)
        if spec == 'grouped(fednova)':  # τ_eff Σ w_k Δ_k / τ_k
          upd = np.sum(w * steps[on]) * np.tensordot(w / steps[on], d, 1)
        np.testing.assert_allclose(np.asarray(new['encoder']['w'])[g],
                                   np.broadcast_to(prev['encoder']['w'][g[0]] + upd, (2, 3)),
                                   rtol=1e-5, atol=1e-6)
    prev = {'encoder': {'w': np.asarray(new['encoder']['w'])}}


def test_averaged_batch_norm_statistics_are_the_participants_mean():
  """MaT-FL's and NTKFedAvg's averaged encoder statistics (`rounds.make_stats_fn`):
  with the round's participants, every row gets the participants' mean (as the
  parameters), not the mean over clients whose statistics did not move."""
  import types
  groups = [types.SimpleNamespace(num_real=3, num_pad=1, client_ids=(0, 2, 4)),
            types.SimpleNamespace(num_real=2, num_pad=0, client_ids=(1, 3))]
  exp = types.SimpleNamespace(algorithm=types.SimpleNamespace(average_stats=True),
                              fed=types.SimpleNamespace(groups=groups, num_clients=5))
  fn = rounds.make_stats_fn(exp)
  rng = np.random.default_rng(5)
  s0, s1 = rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(2, 3)).astype(np.float32)
  client = {0: s0[0], 2: s0[1], 4: s0[2], 1: s1[0], 3: s1[1]}
  stats = lambda: [{'encoder': {'mean': jnp.asarray(s0)}}, {'encoder': {'mean': jnp.asarray(s1)}}]
  valid = np.array([True, False, True, True, False])
  for args, members in (((), range(5)), ((jnp.asarray(valid),), (0, 2, 3))):
    out = fn(stats(), *args)
    want = np.mean([client[c] for c in members], 0)
    for part, rows in zip(out, (4, 2)):
      np.testing.assert_allclose(part['encoder']['mean'], np.broadcast_to(want, (rows, 3)),
                                 rtol=1e-6)


def test_ntkfedavg_moves_the_model_by_the_participants_task_vectors():
  """NTKFedAvg's server: θ = c + α · mean over the participants of s_k (θ_k − c)
  (s_k = −1 for a negated client), every row."""
  from fedjax_mtl.algorithms import ntkfedavg
  server = ntkfedavg.server(alpha=2.0, negate=(3,))
  rng = np.random.default_rng(6)
  c = rng.normal(size=(5, 3)).astype(np.float32)
  prev = {'encoder': {'w': np.broadcast_to(c, (N, 5, 3)).copy()}}
  valid = np.array([True, False, True, True])
  local = _round(rng, prev, valid)
  x = ServerInputs(prev=prev, local=local, num_examples=jnp.ones(N), num_steps=jnp.asarray(
      2 * valid, jnp.int32), client_ids=jnp.arange(N), round=jnp.int32(0),
      row_valid=jnp.asarray(valid))
  new, _, logs = jax.jit(server.apply)(server.init(prev), x)
  tau = local['encoder']['w'] - c
  want = c + 2.0 * (tau[0] + tau[2] - tau[3]) / 3
  np.testing.assert_allclose(new['encoder']['w'], np.broadcast_to(want, (N, 5, 3)), rtol=1e-5,
                             atol=1e-6)
  assert int(logs['ntk_negated_rows']) == 1


def test_pcgrad_projects_the_participants_off_each_other_only():
  """pcgrad(mean) with two of four clients sitting out: each participant's update is
  projected (NumPy PCGrad) off the other participants' updates it conflicts with, in
  their order within the round's permutation; the mean is over the participants."""
  from fedjax_mtl.algorithms import enhance, plugin_math
  info = _info()
  server = enhance.pcgrad(rules.mean('uniform', info), info, seed=3)
  prev = {'encoder': {'w': np.zeros((N, 6), np.float32)}}
  valid = np.array([True, False, True, True])
  # Three participants whose updates conflict pairwise; the others' uploads are their start.
  deltas = np.array([[1., 0, 0, 1, 0, 0], [5, 5, 5, 5, 5, 5], [-1, 1, 0, 0, 1, 0],
                     [0, -1, 1, -1, 0, 1]], np.float32)
  local = {'encoder': {'w': np.where(valid[:, None], deltas, 0.)}}
  x = ServerInputs(prev=prev, local=local, num_examples=jnp.ones(N), num_steps=jnp.ones(N, jnp.int32),
                   client_ids=jnp.arange(N), round=jnp.int32(2), row_valid=jnp.asarray(valid))
  new, _, logs = jax.jit(server.apply)(server.init(prev), x)
  order = np.asarray(plugin_math.pcgrad_order(
      jax.random.fold_in(jax.random.PRNGKey(3), 2), N))
  out = []
  for i in np.flatnonzero(valid):
    g = deltas[i].astype(np.float64)
    for j in order[i]:
      if j != i and valid[j] and g @ deltas[j] < 0:
        g = g - (g @ deltas[j]) / (deltas[j] @ deltas[j]) * deltas[j]
    out.append(g)
  want = np.mean(out, axis=0)
  assert sum(g @ deltas[j] < 0 for g in deltas[valid] for j in np.flatnonzero(valid)) >= 2
  np.testing.assert_allclose(new['encoder']['w'], np.broadcast_to(want, (N, 6)), atol=1e-5)
  # The clients that sat out keep their own (zero) row of coefficients' off-diagonal.
  coef = np.asarray(logs['pcgrad_coefficients'])
  np.testing.assert_array_equal(coef[1], np.eye(N)[1])
  assert np.all(coef[valid][:, 1] == 0)


@pytest.mark.parametrize('mode', ['hard', 'soft'])
def test_matfl_groups_the_participants_alone(mode):
  """MaT-FL's grouping with two of six clients sitting out: the participants' encoders
  are grouped (clustered or cosine-weighted) as if the others did not exist, and the
  clients that sat out keep theirs."""
  from fedjax_mtl.algorithms import matfl
  n = 6
  info = fed_info(n, tuple(range(n)))
  server = matfl.grouping(mode, 2, 0.5, info)
  rng = np.random.default_rng(3)
  local = {'encoder': {'w': rng.normal(size=(n, 8)).astype(np.float32)}}
  valid = np.array([True, True, False, True, False, True])
  x = ServerInputs(prev=local, local=local, num_examples=jnp.ones(n),
                   num_steps=jnp.ones(n, jnp.int32), client_ids=jnp.arange(n),
                   round=jnp.int32(0), row_valid=jnp.asarray(valid))
  new, _, _ = jax.jit(server.apply)(ServerState(), x)
  sub_info = fed_info(4, tuple(range(4)))
  sub = {'encoder': {'w': local['encoder']['w'][valid]}}
  alone, _, _ = jax.jit(matfl.grouping(mode, 2, 0.5, sub_info).apply)(
      ServerState(), ServerInputs(prev=sub, local=sub, num_examples=jnp.ones(4),
                                  num_steps=jnp.ones(4, jnp.int32), client_ids=jnp.arange(4),
                                  round=jnp.int32(0)))
  got = np.asarray(new['encoder']['w'])
  np.testing.assert_allclose(got[valid], alone['encoder']['w'], rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(got[~valid], local['encoder']['w'][~valid])
  assert not np.allclose(got[valid], local['encoder']['w'][valid])  # the rows were mixed


def test_server_momentum_and_fedsta_follow_the_participants():
  """FedAvgM: m ← μm + (mean_P − θ) and θ ← θ + lr·m on every row (all rows hold the
  global model); FedSTA's shared body is the participants' mean."""
  from fedjax_mtl.algorithms import fedsta
  rng = np.random.default_rng(4)
  info = _info()
  theta = rng.normal(size=(3, 2)).astype(np.float32)
  prev = {'encoder': {'w': np.broadcast_to(theta, (N, 3, 2)).copy()}}
  valid = np.array([True, True, False, True])
  local = _round(rng, prev, valid)
  x = ServerInputs(prev=prev, local=local, num_examples=jnp.ones(N),
                   num_steps=jnp.ones(N, jnp.int32), client_ids=jnp.arange(N),
                   round=jnp.int32(1), row_valid=jnp.asarray(valid))
  mean_p = local['encoder']['w'][valid].mean(0)
  server = rules.with_server_momentum(rules.mean('uniform', info), 0.9, 0.5)
  st = server.init(prev)
  m0 = rng.normal(size=(N, 3, 2)).astype(np.float32) * 0 + rng.normal(size=(3, 2)).astype(
      np.float32)  # one (global) momentum, kept per row
  st = st._replace(rows={'encoder': {'inner': {}, 'momentum': {'w': m0}}})
  new, st, _ = jax.jit(server.apply)(st, x)
  m = 0.9 * m0 + (mean_p - theta)
  np.testing.assert_allclose(st.rows['encoder']['momentum']['w'], m, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new['encoder']['w'], theta + 0.5 * m, rtol=1e-5, atol=1e-6)
  body, _, _ = jax.jit(fedsta.shared_body().apply)(ServerState(), x)
  np.testing.assert_allclose(body['encoder']['w'], np.broadcast_to(mean_p, (N, 3, 2)),
                             rtol=1e-5, atol=1e-6)


def test_fedamp_cloud_models_mix_the_participants_models():
  from fedjax_mtl.algorithms import fedamp
  rng = np.random.default_rng(3)
  info = _info()
  w = {'encoder': {'w': 0.3 * rng.normal(size=(N, 4, 2)).astype(np.float32)}}
  valid = np.array([True, False, True, True])
  server = fedamp.cloud_models(1.0, 1.0, info)
  x = ServerInputs(prev=w, local=w, num_examples=jnp.ones(N), num_steps=jnp.ones(N, jnp.int32),
                   client_ids=jnp.arange(N), round=jnp.int32(1), row_valid=jnp.asarray(valid))
  st0 = server.init(w)
  old_u = jax.tree.map(lambda v: v + 1.0, st0.rows['encoder']['center'])
  st0 = st0._replace(rows={'encoder': {'center': old_u}})
  _, st, _ = jax.jit(server.apply)(st0, x)
  np.testing.assert_array_equal(st.rows['encoder']['center']['w'][~valid],
                                old_u['w'][~valid])  # sat out: keeps its u
  flat = w['encoder']['w'].reshape(N, -1).astype(np.float64)
  for i in np.flatnonzero(valid):  # PFLlib: u_i = w_i + Σ_{j∈P, j≠i} ξ_ij (w_j − w_i)
    u = flat[i].copy()
    for j in np.flatnonzero(valid):
      if j != i:
        u += np.exp(-np.sum((flat[i] - flat[j]) ** 2)) * (flat[j] - flat[i])
    np.testing.assert_allclose(np.asarray(st.rows['encoder']['center']['w'][i]).ravel(), u,
                               rtol=1e-5, atol=1e-6)


@pytest.fixture(scope='module')
def smoke():
  """The smoke FedAvg federation (4 PASCAL single-task clients, 1 NYUD multi-task) and
  its round-0 state, with half the clients a round."""
  cfg = tiny_config('fedavg', participation=0.5, num_rounds=2)
  eng = dense.DenseEngine(experiment.build(cfg), cfg)
  eng.open(0)
  return eng, eng.init_state()


def test_a_round_trains_the_participants_and_leaves_the_others(smoke):
  eng, state = smoke
  exp = eng.exp
  full = dense.programs(exp)
  rows = eng.sampler.rows(1)
  assert sum(len(r) for r in rows) == 3 and len(rows[0]) in (2, 3)
  data = eng.source.train
  before = jax.device_get(state)
  starts = [gs.params for gs in state.groups]
  for g, spec in enumerate(exp.fed.groups):
    if not len(rows[g]):
      continue
    args = (state.groups[g], starts[g], data[spec.dataset]['train'], state.round, state.rng,
            rounds.num_rounds(exp))
    part, m = full.sampled_train_fns[g](*args, eng.put_rows(rows[g]))
    every, m_all = full.train_fns[g](*args)
    on = np.zeros(spec.num_total, bool)
    on[rows[g]] = True
    for got, ref, old in zip(jax.tree.leaves(jax.device_get(part)),
                             jax.tree.leaves(jax.device_get(every)),
                             jax.tree.leaves(before.groups[g])):
      np.testing.assert_array_equal(got[~on], old[~on])  # untouched, bit for bit
      # A participant's row is its row of the full round (other batch shapes: rounding).
      np.testing.assert_allclose(got[on], ref[on], rtol=2e-5, atol=2e-6)
    assert (np.asarray(m['steps'])[~on] == 0).all()
    np.testing.assert_array_equal(np.asarray(m['steps'])[on], np.asarray(m_all['steps'])[on])


def test_fedavg_gives_every_client_the_participants_mean(smoke):
  eng, state = smoke
  exp = eng.exp
  mask = eng.sampler.mask(1)
  # The participants' trained encoders, by the round's own trainers.
  rows = [eng.put_rows(r) for r in eng.sampler.rows(1)]
  trained = [fn(gs, gs.params, eng.source.train[spec.dataset]['train'], state.round, state.rng,
                rounds.num_rounds(exp), r)[0].params if r.shape[0] else gs.params
             for fn, gs, spec, r in zip(dense.programs(exp).sampled_train_fns, state.groups,
                                        exp.fed.groups, rows)]
  want = jax.tree.map(lambda x: np.asarray(x)[mask].mean(0),
                      jax.device_get(experiment.views(exp, trained, 'encoder')))
  before = jax.device_get(state)
  new, out = eng.run_round(state, 1)  # (donates the state's round and key: the last user)
  enc = jax.device_get(experiment.views(exp, [gs.params for gs in new.groups], 'encoder'))
  for got, ref in zip(jax.tree.leaves(enc), jax.tree.leaves(want)):
    np.testing.assert_allclose(got, np.broadcast_to(ref, got.shape), rtol=1e-5, atol=1e-6)
  # Non-participants' batch-norm statistics and optimizer states did not move.
  for g, spec in enumerate(exp.fed.groups):
    off = ~mask[np.asarray(spec.client_ids)]
    for a, b in zip(jax.tree.leaves((new.groups[g].batch_stats, new.groups[g].opt_state)),
                    jax.tree.leaves((before.groups[g].batch_stats,
                                     before.groups[g].opt_state))):
      np.testing.assert_array_equal(np.asarray(a)[:spec.num_real][off],
                                    np.asarray(b)[:spec.num_real][off])
  steps = np.concatenate([np.asarray(m['steps'])[:g.num_real]
                          for m, g in zip(out['train'], exp.fed.groups)])
  assert (steps[~mask] == 0).all() and (steps[mask] > 0).all()
  # The round's rows: train rows and traffic of the participants only.
  rows = eng.round_rows(1, jax.device_get(out))
  names = {r['client'] for r in rows if r['type'] == 'train'}
  assert names == {c.name for c, on in zip(exp.fed.clients, mask) if on}
  comm = [r for r in rows if r['type'] == 'comm'][0]
  assert [b > 0 for b in comm['up_bytes']] == mask.tolist()


def test_resume_draws_the_same_clients_and_matches(tmp_path):
  # FedHCA2: its α/β momentum and Ã^(r-1) of the clients that sat out must survive too.
  assert_resumes_bitwise(tiny_config('hca2', participation=0.5, num_rounds=3), tmp_path)


@pytest.mark.parametrize('over,message', [
    ({'participation': 0.0}, 'participation=0.0 is out of range'),
    ({'participation': 7}, r'participation=7(\.0)? is out of range; valid: a fraction in \(0, 1\] or '
                           'a number of clients from 2 to 5'),
    ({'participation': 0.5, 'algorithm': 'grouped(hca2)'},
     r'grouped\(...\) over hca2 has no partial-participation rule'),
    ({'participation_weighting': 'size'}, 'participation_weighting'),
    ({'stragglers': 1.0}, 'stragglers'),
    ({'straggler_steps': 0.0}, 'straggler_steps'),
    ({'participation': 0.5, 'algorithm': 'many'},
     "participation=0.5 is the dense engine's; the many-task setting samples"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, over, message):
  from conftest import override
  if over.get('algorithm') == 'many':
    from test_manytask import tiny
    cfg = tiny('fedavg')
  else:
    cfg = tiny_config(over.get('algorithm', 'fedavg'))
  override(cfg, **{k: v for k, v in over.items() if k != 'algorithm'})
  with pytest.raises((ConfigError, ValueError), match=message):
    train.train_and_evaluate(cfg, str(tmp_path / 'wd'))
  assert not os.path.exists(tmp_path / 'wd') or not os.listdir(tmp_path / 'wd')


@pytest.mark.parametrize('homo', [None, (0, 0, 1, 1, 1)])
def test_fedhca2_over_participants_is_fedhca2_of_the_participants(homo):
  """Two rounds of FedHCA2 on 5 clients (one decoder each) with clients 1 and 3 sitting
  round 1 out and client 0 round 2: the participants' rows, α, β and Ũ are those of
  FedHCA2 run on the participants alone (their α, β and Ã^(r-1) carried over); the
  others keep their rows, α, β and momentum. With homo runs (0, 0 | 1, 1, 1): the
  run's mean over its participants."""
  import ml_collections
  from fedjax_mtl.algorithms import get_algorithm, hca2
  from fedjax_mtl.models.decoder import DECODER_LAYERS
  n = 5
  rng = np.random.default_rng(1)

  def info(ids, m=0):
    hg = tuple(homo[i] for i in ids) if homo else tuple(range(len(ids)))
    return FedInfo(num_clients=len(ids), num_decoders=len(ids),
                   decoder_client=tuple(range(len(ids))),
                   decoder_names=tuple(f'd{i}' for i in ids),
                   client_names=tuple(f'c{i}' for i in ids), homo_groups=hg,
                   decoder_layers=DECODER_LAYERS, num_participants=m)

  cfg = ml_collections.ConfigDict({'hca2': hca2.default_config()})
  cfg.hca2.update({'alpha_init': 0.4, 'beta_init': 0.3, 'homo': homo is not None})
  tree = lambda lead: {'a': rng.normal(size=(lead, 6, 3)).astype(np.float32),
                       'b': rng.normal(size=(lead, 4)).astype(np.float32)}
  dec = lambda lead: {f'linear_{i}': {'kernel': rng.normal(size=(lead, 3, 2)).astype(
      np.float32)} for i in range(4)} | {
      'fuse_conv': {'kernel': rng.normal(size=(lead, 4, 2)).astype(np.float32)},
      'fuse_bn': {'scale': rng.normal(size=(lead, 2)).astype(np.float32)}}
  prev = {'encoder': tree(n), 'decoder': dec(n)}
  full = get_algorithm('hca2', info(range(n), m=3), cfg).server
  st = full.init(prev)
  rounds_valid = [np.array([True, False, True, False, True]),
                  np.array([False, True, True, True, False])]
  for rnd, valid in enumerate(rounds_valid):
    ids = np.flatnonzero(valid)
    upd = {r: jax.tree.map(lambda p: np.where(valid.reshape((-1,) + (1,) * (p.ndim - 1)),
                                              0.1 * rng.normal(size=p.shape), 0.)
                           .astype(np.float32), v) for r, v in prev.items()}
    local = jax.tree.map(np.add, prev, upd)
    x = lambda p, l, k, v=None: ServerInputs(
        prev=p, local=l, num_examples=jnp.ones((k,)), num_steps=jnp.ones((k,), jnp.int32),
        client_ids=jnp.arange(k), round=jnp.int32(rnd), row_valid=v)
    new, st2, logs = jax.jit(full.apply)(st, x(prev, local, n, jnp.asarray(valid)))
    assert all(np.isfinite(np.asarray(v)).all() for v in logs.values()), logs
    # The participants' own federation, with their slice of the hyper state.
    sub = get_algorithm('hca2', info(ids), cfg).server
    take = lambda t: jax.tree.map(lambda a: np.asarray(a)[ids], t)
    sub_st = sub.init(take(prev))
    enc_sh, dec_sh = st.shared['encoder'], st.shared['decoder']
    sub_st = sub_st._replace(shared={
        'encoder': {'alpha': take(enc_sh['alpha']),
                    'alpha_opt': jax.tree.map(lambda a: np.asarray(a)[ids] if np.ndim(a) else a,
                                              enc_sh['alpha_opt']),
                    'prev_u': enc_sh['prev_u']},
        'decoder': {'beta': take(dec_sh['beta']),
                    'beta_opt': jax.tree.map(lambda a: np.asarray(a)[ids] if np.ndim(a) else a,
                                             dec_sh['beta_opt']),
                    'prev_a': take(dec_sh['prev_a'])}})
    want, want_st, _ = jax.jit(sub.apply)(sub_st, x(take(prev), take(local), len(ids)))
    for r in ('encoder', 'decoder'):
      for g, w, p in zip(jax.tree.leaves(new[r]), jax.tree.leaves(want[r]),
                         jax.tree.leaves(prev[r])):
        np.testing.assert_allclose(np.asarray(g)[ids], w, rtol=2e-5, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(g)[~valid], np.asarray(p)[~valid])
    got_sh, want_sh = st2.shared, want_st.shared
    np.testing.assert_allclose(got_sh['encoder']['alpha'][ids], want_sh['encoder']['alpha'],
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(got_sh['encoder']['alpha'][~valid],
                                  enc_sh['alpha'][~valid])
    np.testing.assert_allclose(got_sh['decoder']['beta'][ids], want_sh['decoder']['beta'],
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(got_sh['decoder']['beta'][~valid], dec_sh['beta'][~valid])
    for g, w in zip(jax.tree.leaves(got_sh['encoder']['prev_u']),
                    jax.tree.leaves(want_sh['encoder']['prev_u'])):
      np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-7)
    for g, old in zip(jax.tree.leaves(got_sh['decoder']['prev_a']),
                      jax.tree.leaves(dec_sh['prev_a'])):
      np.testing.assert_array_equal(np.asarray(g)[~valid], np.asarray(old)[~valid])
    prev, st = jax.device_get(new), st2


def test_stragglers_complete_their_share_of_the_local_steps(smoke):
  eng, state = smoke
  exp = eng.exp
  g, spec = 0, exp.fed.groups[0]
  args = (state.groups[g], state.groups[g].params, eng.source.train[spec.dataset]['train'],
          state.round, state.rng, rounds.num_rounds(exp))
  full = dense.programs(exp).train_fns[g]
  base, m = full(*args)
  frac = np.ones(spec.num_total, np.float32)
  frac[1] = 0.4
  late, m_late = full(*args, jnp.asarray(frac))
  steps, steps_late = np.asarray(m['steps']), np.asarray(m_late['steps'])
  assert steps_late[1] == np.ceil(0.4 * steps[1]) < steps[1]
  np.testing.assert_array_equal(np.delete(steps_late, 1), np.delete(steps, 1))
  for a, b in zip(jax.tree.leaves(jax.device_get(late.params)),
                  jax.tree.leaves(jax.device_get(base.params))):
    # (another program: XLA may fuse and round differently)
    np.testing.assert_allclose(np.delete(a, 1, 0), np.delete(b, 1, 0), rtol=2e-5, atol=2e-6)
  assert any(not np.array_equal(a[1], b[1]) for a, b in zip(
      jax.tree.leaves(jax.device_get(late.params)), jax.tree.leaves(jax.device_get(base.params))))


def test_stragglers_are_drawn_per_round_from_the_seed():
  from conftest import override
  cfg = override(tiny_config('fedavg'), stragglers=0.3, straggler_steps=0.25)
  s = participation.Sampler(cfg, experiment.build(cfg).fed)
  rows = [np.arange(40)]
  draws = np.stack([s.step_fracs(r, rows)[0] for r in range(1, 51)])
  assert set(np.unique(draws)) == {0.25, 1.0}
  np.testing.assert_array_equal(draws[3], s.step_fracs(4, rows)[0])  # stateless
  late = (draws < 1).mean()
  assert abs(late - 0.3) < 4 * np.sqrt(0.3 * 0.7 / draws.size)
