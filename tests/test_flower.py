"""The Flower adapter (fedjax_mtl/flower): the smoke FedHCA2 run's messages (5 clients,
2 rounds, computed in process: `simulate.in_process`) aggregate the same parameters
as the engine's own rounds (real data: tests/test_real_engine.py; Flower's
simulation engine and a deployment carry the same messages:
tests/test_flower_deploy.py); so do, in process, a many-task FedAvg and a MaTU run
(`test_manytask.tiny`: 6 clients, 4 tasks, half the clients a round), a quantised,
clipped and noised FedHCA2 run with participation and stragglers, and a FedHCA2 run
whose clients sparsify their own updates; a client whose config differs refuses the
run naming the fields; what the adapter cannot run is refused before Ray starts.
"""

import copy
import os

import jax
import numpy as np
import pytest

import agreement
from conftest import override, tiny_config
from fedjax_mtl import comm as comm_lib
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.flower import codec, many_task, runtime, simulate
from fedjax_mtl.report import read_jsonl
from test_multihost import ROOT


def config():
  from multihost_worker import config as worker_config
  return worker_config('hca2')  # smoke FedHCA2, 2 rounds, SGD (agreement.py)


@pytest.fixture(scope='module')
def flower_run(tmp_path_factory):
  """The smoke FedHCA2 run's messages computed in process (`simulate.in_process`);
  their transport through Flower's simulation engine is the Ray test's, through a
  deployment test_flower_deploy.py's."""
  wd = str(tmp_path_factory.mktemp('flower') / 'wd')
  return simulate.in_process(config(), wd), wd


def test_flower_rounds_aggregate_what_the_engine_aggregates(flower_run, reference_run):
  strategy, wd = flower_run
  ref = reference_run(config())  # the engine's run of the same config (shared, conftest)
  roles = ref.exp.algorithm.shared_roles
  got = agreement.flat_views(strategy.views)
  assert {k.split('[')[0] for k in got} == set(roles) == {'encoder', 'decoder'}
  # Each client trains as a group of one: its row of the engine's vmapped group, with the
  # same batches, keys and learning rates, in other matmul shapes (XLA:CPU sums in
  # another order): the aggregated rows agree to rounding, and a server that mixed up
  # rows or averaged over too many would not.
  print(agreement.assert_agree(got, agreement.select(ref.final, roles),
                               agreement.select(ref.init, roles), 5, 8))
  # The run's rows: the engine's format, losses as in the engine's rounds.
  rows = read_jsonl(os.path.join(wd, 'metrics.jsonl'))
  ref = read_jsonl(os.path.join(ref.workdir, 'metrics.jsonl'))
  key = lambda r: (r['round'], r['type'], r.get('client'), r.get('task'), r.get('metric'))
  assert sorted(map(key, rows)) == sorted(map(key, ref))
  loss = lambda rs: [r['loss'] for r in sorted(rs, key=key) if r['type'] == 'train']
  np.testing.assert_allclose(loss(rows), loss(ref), rtol=1e-4)
  alpha = lambda rs: [r['alpha'] for r in rs if r['type'] == 'agg']
  np.testing.assert_allclose(alpha(rows), alpha(ref), rtol=1e-4, atol=1e-6)
  # Thresholded metrics (mIoU, odsF, maxF) flip with a near-tied pixel; depth RMSE does not.
  ev = lambda rs: sorted((r for r in rs if r['type'] == 'eval' and r['metric'] == 'RMSE'),
                         key=key)
  assert ev(ref)
  np.testing.assert_allclose([r['value'] for r in ev(rows)], [r['value'] for r in ev(ref)],
                             rtol=1e-4)
  # Bytes per client: the messages' (values and .npy headers) against the engine's account.
  comm = lambda rs: [r for r in sorted(rs, key=key) if r['type'] == 'comm']
  assert len(comm(rows)) == len(comm(ref)) == 2
  for got_row, want_row in zip(comm(rows), comm(ref)):
    for k in ('up_bytes', 'down_bytes'):
      headers = np.subtract(got_row[k], want_row[k])
      assert (headers >= 0).all() and (headers <= 0.05 * np.asarray(want_row[k])).all(), k
  assert '(Flower)' in open(os.path.join(wd, 'results.md')).read()
  # Where the time went, per round.
  assert [t['round'] for t in strategy.timing] == [1, 2]
  assert all(len(t['client_train']) == 5 for t in strategy.timing)
  print(strategy.timing)


def test_a_client_with_another_config_refuses_the_run_naming_the_fields(tmp_path):
  other = config()
  other.optim.lr = 5e-3
  other.seed = 7
  with pytest.raises(ConfigError, match=r'clients refused the run: client \d: its config '
                     r"differs from the server's in optim\.lr, seed"):
    simulate.in_process(config(), str(tmp_path / 'wd'), client_config=other)
  assert not (tmp_path / 'wd').exists()


def many_config(algorithm: str):
  """`test_manytask.tiny(algorithm)` for 2 rounds under SGD (agreement.py)."""
  from test_manytask import tiny
  cfg = tiny(algorithm, num_rounds=2, **agreement.SGD)
  if algorithm == 'matu':
    from fedjax_mtl.algorithms import matu
    cfg.matu = matu.default_config()
  return cfg


@pytest.mark.parametrize('algorithm', ['fedavg', 'matu'])
def test_many_task_flower_runs_train_what_the_engine_trains(algorithm, tmp_path):
  """One Flower node per many-task client: each trains its slots with the engine's
  per-slot trainer (same samples and keys, one slot at a time instead of one vmap),
  the server stacks the uploads in slot order and runs the engine's aggregation.
  The messages' contents are computed in process (`simulate.in_process`); Flower's
  transport of them is the dense runs' (Ray and a deployment:
  test_flower_deploy.py)."""
  from fedjax_mtl import train
  from fedjax_mtl.manytask import run as run_lib
  cfg = many_config(algorithm)
  wd = str(tmp_path / 'flower')
  strategy = simulate.in_process(cfg, wd)
  want_out = train.train_and_evaluate(cfg, str(tmp_path / 'engine'))
  init = agreement.many_task_rows(run_lib.init_state(run_lib.build_run(cfg)))
  # A server that weighed the dummy slots in (every update shrunk by 5/8) fails the
  # bound many times over on every leaf training moved beyond rounding.
  print(algorithm, agreement.assert_many_task_agree(
      agreement.many_task_rows(strategy.state), agreement.many_task_rows(want_out['state']),
      init))
  # metrics.jsonl: the engine's rows (train per real pair, agg with the upload bits,
  # eval per task), losses as the engine's.
  rows = read_jsonl(os.path.join(wd, 'metrics.jsonl'))
  ref = read_jsonl(os.path.join(tmp_path, 'engine', 'metrics.jsonl'))
  key = lambda r: (r['round'], r['type'], r.get('client'), r.get('task'), r.get('metric'))
  assert sorted(map(key, rows)) == sorted(map(key, ref))
  pick = lambda rs, t, f: [r[f] for r in sorted(rs, key=key) if r['type'] == t]
  np.testing.assert_allclose(pick(rows, 'train', 'loss'), pick(ref, 'train', 'loss'), rtol=1e-4)
  assert pick(rows, 'train', 'steps') == pick(ref, 'train', 'steps')
  assert pick(rows, 'agg', 'upload_bits') == pick(ref, 'agg', 'upload_bits')
  ev = [r for r in rows if r['type'] == 'eval' and r['round'] == cfg.num_rounds]
  assert [(r['task'], r['metric']) for r in ev] == [
      (r['task'], r['metric']) for r in want_out['eval']]
  losses = [i for i, r in enumerate(ev) if r['metric'] == 'loss']
  np.testing.assert_allclose([ev[i]['value'] for i in losses],
                             [want_out['eval'][i]['value'] for i in losses], rtol=1e-4)
  assert os.path.exists(os.path.join(wd, 'results.md'))
  st = strategy.run.setting
  assert [len(t['client_train']) for t in strategy.timing] == [
      len(set(st.pairs[p, 0] for p in st.schedule[r] if p < st.num_pairs)) for r in range(2)]


def test_many_task_messages_carry_a_clients_own_slots():
  cfg = many_config('fedavg')
  strategy = many_task.ManyTaskStrategy(cfg)
  st = strategy.run.setting
  contents = strategy.train_contents(1)
  owners = many_task.slot_owners(st, 1)
  assert sorted(contents) == sorted(owners) == sorted(set(st.participants[0]) & set(owners))
  for c, content in contents.items():
    pairs = list(content['config']['pairs'])
    assert pairs == [int(st.schedule[0][j]) for j in owners[c]]
    assert all(st.pairs[p, 0] == c for p in pairs)
  keys = many_task.leaf_keys(strategy.run)
  # FedAvg: the adapters are global (sent once, uploaded), the heads per task (kept).
  assert keys['global'] == keys['upload'] and keys['rows'] == keys['kept']
  assert all(k.startswith('head/') for k in keys['kept'])


def _ntk_tuned():
  from fedjax_mtl.algorithms import ntkfedavg
  cfg = many_config('ntkfedavg')
  cfg.ntkfedavg = ntkfedavg.default_config()
  return override(cfg, **{'ntkfedavg.tune_alpha': True})


def _ntk_plain():
  from fedjax_mtl.config_doc import load_config
  return override(load_config(os.path.join(ROOT, 'configs/ntkfedavg.py:smoke')),
                  **{'ntkfedavg.linearize': False})


@pytest.mark.parametrize('make,message', [
    (lambda: tiny_config('fedacg'), r"'fedacg' is not supported by the Flower adapter: .*lookahead"),
    (_ntk_plain, r"'ntkfedavg' is not supported .*batch-norm running statistics"),
    (lambda: override(many_config('fedavg'), **{'many.heads': 'heads.npz'}),
     r"the Flower adapter trains linear heads; frozen zero-shot heads are not supported"),
    (lambda: _ntk_tuned(), r'ntkfedavg.tune_alpha is not supported by the Flower adapter'),
    (lambda: override(many_config('fedavg'), algorithm='hca2'),
     r"'hca2' does not run in the many-task setting"),
    (lambda: tiny_config('grouped(hca2)', participation=0.5),
     r'grouped\(...\) over hca2 has no partial-participation rule'),
])
def test_what_the_adapter_cannot_run_is_refused_before_ray_starts(make, message):
  with pytest.raises(ConfigError, match=message):
    simulate.simulate(make())


def test_a_workdir_holding_a_run_is_refused(tmp_path):
  (tmp_path / 'metrics.jsonl').write_text('{}\n')
  with pytest.raises(ConfigError, match='already holds a run; Flower runs do not resume'):
    simulate.simulate(config(), str(tmp_path))
  assert (tmp_path / 'metrics.jsonl').read_text() == '{}\n'


def test_records_round_trip_pytrees_and_name_missing_arrays():
  tree = {'a': np.arange(6, dtype=np.float32).reshape(2, 3),
          'b': [np.ones((1,), np.int32), np.zeros((2, 2), np.float16)]}
  back = codec.from_record(codec.to_record(tree), tree)
  for x, y in zip(jax.tree.leaves(tree), jax.tree.leaves(back)):
    assert x.dtype == y.dtype and np.array_equal(x, y)
  with pytest.raises(KeyError, match=r'has no array .*c'):
    codec.from_record(codec.to_record(tree), {**tree, 'c': np.zeros(1)})


def test_config_fields_that_may_differ_between_parties():
  a, b = config(), config()
  b.num_devices = 4  # each party trains on its own devices
  b.data.data_dir = '/elsewhere'
  assert codec.differing_fields(b, codec.shared_fields(a)) == []
  b.local_epochs = {'pascal': 2, 'nyud': 2}
  b.optim.weight_decay = 0.5
  assert codec.differing_fields(b, codec.shared_fields(a)) == ['local_epochs.pascal',
                                                               'optim.weight_decay']


def test_a_client_finds_its_rows_in_the_stacked_views():
  exp = runtime.build(config())
  fed = exp.fed
  for c in range(fed.num_clients):
    assert codec.row_slice(fed, 'encoder', c) == slice(c, c + 1)
    dec = codec.row_slice(fed, 'decoder', c)
    assert [fed.decoder_client[k] for k in range(dec.start, dec.stop)] == \
        [c] * len(fed.clients[c].tasks)
  x = np.arange(2 * 3 * 4).reshape(1, 3, 4, 2)  # one client, 3 task slots
  np.testing.assert_array_equal(codec.group_piece(codec.client_piece(x, 'decoder'), 'decoder'), x)



def test_participation_stragglers_compression_and_dp_run_as_in_the_engine(
    tmp_path, reference_run):
  """The Flower run trains the clients the engine's run draws (3 of 5 a round), with
  the same stragglers' step shares; each client quantises its own update and sends
  the codes (the engine's codes: the same uniforms), and the server decodes them, clips
  and adds noise as the engine's does; the rows log the same steps, traffic per
  participant and privacy spent. Computed in process (`simulate.in_process`: the
  messages' contents without Flower's transport; the transport is test_flower_deploy.py's)."""
  algorithm = 'quantize(dp(hca2))'
  extra = {'participation': 0.6, 'stragglers': 0.5, 'dp.noise_multiplier': 0.5,
           'dp.noise': 'row', 'quantize.bits': 4, 'quantize.log_error': True}
  cfg = tiny_config(algorithm, num_rounds=2, checkpoint_every=2, **agreement.SGD, **extra)
  strategy = simulate.in_process(cfg, str(tmp_path / 'flower'))
  ref = agreement.run_reference(cfg, str(tmp_path / 'engine'))
  roles = ref.exp.algorithm.shared_roles
  got, want, init = (agreement.flat_views(strategy.views), agreement.select(ref.final, roles),
                     agreement.select(ref.init, roles))
  print(agreement.assert_agree(got, want, init, 5, 8))  # a row mix-up fails the bound
  rows = read_jsonl(str(tmp_path / 'flower' / 'metrics.jsonl'))
  want = read_jsonl(os.path.join(ref.workdir, 'metrics.jsonl'))
  pick = lambda rs, t: sorted(((r['round'], r.get('client'), r.get('task'), r.get('steps'))
                               for r in rs if r['type'] == t), key=str)
  assert pick(rows, 'train') == pick(want, 'train')  # the same clients, the same steps
  trained = {(r['round'], r['client']) for r in rows if r['type'] == 'train'}
  assert all(len({c for rn, c in trained if rn == rnd}) == 3 for rnd in (1, 2))
  # A straggler took fewer steps than in a full round.
  full = read_jsonl(os.path.join(reference_run(config()).workdir, 'metrics.jsonl'))
  steps = lambda rs: {(r['round'], r['client']): r['steps'] for r in rs if r['type'] == 'train'}
  assert any(steps(rows)[k] < steps(full)[k] for k in steps(rows))
  comm = lambda rs: [np.asarray(r['up_bytes']) for r in rs if r['type'] == 'comm']
  assert [(c > 0).tolist() for c in comm(rows)] == [(c > 0).tolist() for c in comm(want)]
  # The clients sent codes, 4 bits a value instead of 32: the engine's account plus
  # each array's .npy header (two arrays a leaf: codes, scales).
  dense = comm_lib.account(ref.exp, override(copy.deepcopy(cfg), algorithm='fedavg')).up
  for got_up, want_up in zip(comm(rows), comm(want)):
    on = want_up > 0
    assert (got_up[on] >= want_up[on]).all() and (got_up[on] < 0.3 * dense[on]).all()
  agg = lambda rs, k: [r.get(k) for r in rs if r['type'] == 'agg']
  assert agg(rows, 'dp_epsilon') == agg(want, 'dp_epsilon')
  assert agg(rows, 'dp_epsilon')[-1] > 0
  np.testing.assert_allclose(agg(rows, 'quant_rel_error'), agg(want, 'quant_rel_error'),
                             rtol=1e-3, atol=1e-6)


def test_clients_sparsify_their_own_updates_and_keep_their_residuals(tmp_path):
  """`sparsify(hca2)` over 2 rounds with 3 of 5 clients a round: each client sends the
  top 5 % of Δ + e with their positions and keeps e itself (`compress.encode_sparse`),
  and the server adds what it receives: the rows the engine's run makes (error
  feedback over rounds included: a residual dropped or kept at the server fails the
  bound), the clients' kept shares and residual norms as the engine logs them, and
  uploads of about the engine's account (values and positions), well below dense."""
  cfg = tiny_config('sparsify(hca2)', num_rounds=2, checkpoint_every=2, participation=0.6,
                    **agreement.SGD, **{'sparsify.fraction': 0.05})
  strategy = simulate.in_process(cfg, str(tmp_path / 'flower'))
  ref = agreement.run_reference(cfg, str(tmp_path / 'engine'))
  roles = ref.exp.algorithm.shared_roles
  got, want, init = (agreement.flat_views(strategy.views), agreement.select(ref.final, roles),
                     agreement.select(ref.init, roles))
  print(agreement.assert_agree(got, want, init, 5, 8))
  # The server keeps no residual of its own; what it sends down has none.
  assert all(not np.any(x) for r in strategy.rows.values()
             for x in jax.tree.leaves(r['residual']))
  assert 'residual' not in str(list(strategy.client_content(0, 1)['server_rows'].keys()))
  rows = read_jsonl(str(tmp_path / 'flower' / 'metrics.jsonl'))
  want = read_jsonl(os.path.join(ref.workdir, 'metrics.jsonl'))
  agg = lambda rs, k: np.asarray([r[k] for r in rs if r['type'] == 'agg'])
  on = agg(want, 'sparse_kept') > 0
  assert on.sum() == 6  # 3 clients a round
  assert (on[0] & on[1]).any()  # a client that trains twice sends its residual back in
  np.testing.assert_allclose(agg(rows, 'sparse_kept')[on], agg(want, 'sparse_kept')[on],
                             rtol=1e-6)
  np.testing.assert_allclose(agg(rows, 'sparse_residual_norm')[on],
                             agg(want, 'sparse_residual_norm')[on], rtol=1e-3)
  comm = lambda rs: [np.asarray(r['up_bytes']) for r in rs if r['type'] == 'comm']
  dense = comm_lib.account(ref.exp, override(copy.deepcopy(cfg), algorithm='fedavg')).up
  for got_up, want_up in zip(comm(rows), comm(want)):
    sent = want_up > 0
    assert ((got_up > 0) == sent).all()
    # values + positions (+ .npy headers, two arrays a leaf) against the account
    assert (np.abs(got_up[sent] - want_up[sent]) <= 0.1 * want_up[sent] + 20_000).all()
    assert (got_up[sent] < 0.2 * dense[sent]).all()


def test_an_error_the_superlink_writes_for_a_lost_node_names_its_client():
  """A SuperNode that stops reporting gets an error reply written by the SuperLink
  (source: the SuperLink's node id, 1 here, which is also a client's number): the
  line names the client the lost message was for, and it is not also called silent."""
  from types import SimpleNamespace as NS
  from fedjax_mtl.flower import nodes
  strategy = type('Bare', (nodes.NodeStrategy,), dict.fromkeys(
      ['aggregate_evaluate', 'aggregate_train', 'configure_evaluate', 'configure_train'],
      None))(config(), 3, timeout=30)
  strategy.nodes = {0: 101, 1: 102, 2: 103}  # client -> node id
  sent = [NS(metadata=NS(message_id=f'm{c}', dst_node_id=n)) for c, n in strategy.nodes.items()]
  strategy.sending(sent)
  ok = lambda c: NS(metadata=NS(src_node_id=100 + c + 1, reply_to_message_id=f'm{c}'),
                    has_error=lambda: False)
  lost = NS(metadata=NS(src_node_id=1, reply_to_message_id='m2'), has_error=lambda: True,
            error=NS(reason='Error: Node Unavailable - The destination node failed to '
                     'report a heartbeat.'))
  with pytest.raises(ConfigError) as e:
    strategy.replies([ok(0), ok(1), lost], 'round 1')
  assert str(e.value) == ('round 1 failed: client 2: Error: Node Unavailable - The '
                          'destination node failed to report a heartbeat.')
  with pytest.raises(ConfigError, match=r'^round 1 failed: no reply within 30 s from '
                     r'client\(s\) 2$'):
    strategy.replies([ok(0), ok(1)], 'round 1')
  assert sorted(strategy.replies([ok(0), ok(1)], 'round 1', expected=[0, 1])) == [0, 1]
