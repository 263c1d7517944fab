"""The Flower adapter (fedjax_mtl/flower): the smoke FedHCA2 run in Flower's simulation
engine (5 clients, 2 rounds, ClientApps in 2 Ray workers) aggregates the same
parameters as the engine's own rounds (real data: tests/test_real_engine.py); a client whose config differs refuses the run
naming the fields; what the adapter cannot run is refused before Ray starts.
"""

import os

import jax
import numpy as np
import pytest

import agreement
from conftest import tiny_config
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.flower import codec, runtime, simulate
from fedjax_mtl.report import read_jsonl
from test_multihost import ROOT


def config():
  from multihost_worker import config as worker_config
  return worker_config('hca2')  # smoke FedHCA2, 2 rounds, SGD (agreement.py)


@pytest.fixture(scope='module')
def flower_run(tmp_path_factory):
  wd = str(tmp_path_factory.mktemp('flower') / 'wd')
  return simulate.simulate(config(), wd, num_workers=2), wd


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
    simulate.simulate(config(), str(tmp_path / 'wd'), num_workers=1, client_config=other)
  assert not (tmp_path / 'wd').exists()


def _ntk_plain():
  from conftest import override
  from fedjax_mtl.config_doc import load_config
  return override(load_config(os.path.join(ROOT, 'configs/ntkfedavg.py:smoke')),
                  **{'ntkfedavg.linearize': False})


@pytest.mark.parametrize('make,message', [
    (lambda: tiny_config('fedacg'), r"'fedacg' is not supported by the Flower adapter: .*lookahead"),
    (_ntk_plain, r"'ntkfedavg' is not supported .*batch-norm running statistics"),
    (lambda: tiny_config('hca2', setting='many_task'), r"runs setting='dense'"),
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

