"""Communication accounting (fedjax_mtl/comm.py): the bytes each client sends and
receives, from shapes, against a hand count of the shared rows, the wrappers'
encodings, the Flower adapter's real messages (FedAvg, FedPer) and a run's rows."""

import os

import jax
import numpy as np
import pytest

from conftest import override, tiny_config
from fedjax_mtl import comm, experiment
from fedjax_mtl.algorithms.base import role_view


def _hand_count(exp, roles, skip=frozenset()):
  """Per client: the shared entries, counted from the round-0 params leaf by leaf."""
  from fedjax_mtl.algorithms.plugin_math import path_names
  state = experiment.init_state(exp, abstract=True)
  out = np.zeros(exp.fed.num_clients, np.int64)
  for gs, lab, spec in zip(state.groups, exp.labels, exp.fed.groups):
    for role in roles:
      view = role_view(gs.params, lab, role) or {}
      for path, x in jax.tree_util.tree_leaves_with_path(view):
        if path_names(path)[:-1] in skip:
          continue
        for cid in spec.client_ids:
          out[cid] += int(np.prod(x.shape[1:]))  # one client's row (decoders: every slot)
  return out


@pytest.mark.parametrize('algorithm,roles', [
    ('fedavg', ('encoder', 'decoder')), ('fedper', ('encoder',)), ('local', ())])
def test_a_client_sends_and_receives_its_shared_rows(algorithm, roles):
  exp = experiment.build(tiny_config(algorithm))
  acc = comm.account(exp)
  want = 4 * _hand_count(exp, roles)  # float32
  np.testing.assert_array_equal(acc.up, want)
  np.testing.assert_array_equal(acc.down, want)
  if roles:
    assert (want > 0).all()


def test_fedbn_leaves_its_batch_norms_out():
  exp = experiment.build(tiny_config('fedbn'))
  avg = experiment.build(tiny_config('fedavg'))
  bn = 4 * (_hand_count(avg, ('encoder', 'decoder'))
            - _hand_count(exp, ('encoder', 'decoder'), exp.algorithm.local_modules))
  assert (bn > 0).all()
  np.testing.assert_array_equal(comm.account(avg).up - comm.account(exp).up, bn)


def test_wrappers_change_what_is_uploaded():
  sizes = comm.Sizes(entries=np.array([1000, 64]), value_bits=np.array([32, 32]),
                     tensors=np.array([5, 2]))
  cfg = tiny_config('fedavg')
  plain = comm.upload_bits(sizes, 'fedavg', cfg)
  np.testing.assert_array_equal(plain, [32000, 2048])
  np.testing.assert_array_equal(comm.upload_bits(sizes, 'momentum(fedavg)', cfg), plain)
  # FedDEA at rho = 0.25: k = 250 and 16 values; positions as the smaller of a bitmap
  # (1000, 64 bits) and 32-bit indices (8000, 512 bits).
  dea = tiny_config('dea(fedavg)', **{'dea.rho': 0.25})
  np.testing.assert_array_equal(comm.upload_bits(sizes, 'dea(fedavg)', dea),
                                [250 * 32 + 1000, 16 * 32 + 64])
  # rho = 0.01: k = 10 and max(0, 1) = 1: indices are smaller than the bitmap.
  dea = override(dea, **{'dea.rho': 0.01})
  np.testing.assert_array_equal(comm.upload_bits(sizes, 'dea(fedavg)', dea),
                                [10 * 32 + 320, 1 * 32 + 32])
  np.testing.assert_array_equal(comm.upload_bits(sizes, 'dea(fedavg)',
                                                 override(dea, **{'dea.rho': 1.0})), plain)
  # Top-10 % of the entries at 8 bits each: k = 100 and 6 values, a bitmap each, and a
  # float32 scale per tensor.
  both = tiny_config('sparsify(quantize(fedavg))', **{'sparsify.fraction': 0.1,
                                                      'quantize.bits': 8})
  np.testing.assert_array_equal(comm.upload_bits(sizes, 'sparsify(quantize(fedavg))', both),
                                [100 * 8 + 1000 + 5 * 32, 6 * 8 + 64 + 2 * 32])
  np.testing.assert_array_equal(comm.upload_bits(sizes, 'quantize(fedavg)', both),
                                [1000 * 8 + 5 * 32, 64 * 8 + 2 * 32])


def test_comm_rows_sum_to_the_tables_totals():
  acc = comm.Account(up=np.array([10, 20]), down=np.array([5, 5]))
  rows = [acc.row(1), acc.row(2, participants=np.array([True, False])), {'type': 'eval'}]
  assert rows[1]['up_bytes'] == [10, 0] and rows[1]['down_bytes'] == [5, 0]
  t = comm.totals(rows)
  assert t['rounds'] == 2 and t['up_mb'] == pytest.approx(40 / 1e6)
  assert comm.summary(t).startswith('Communication: 0.000 MB a round')
  assert t['total_mb'] == pytest.approx((40 + 15) / 1e6)
  assert t['mb_per_round'] == pytest.approx((40 + 15) / 2e6)
  assert comm.cumulative_mb(rows) == pytest.approx({1: 40 / 1e6, 2: 55 / 1e6})
  assert comm.totals([{'type': 'eval'}]) is None


@pytest.mark.parametrize('algorithm', ['fedavg', 'fedper'])
def test_the_flower_adapters_messages_carry_what_the_account_says(algorithm):
  """Ray-free: the strategy's round-1 message to each client and that client's reply
  (its local round in its own runtime) carry exactly the accounted values; on the
  wire each array also has its serialisation header (`nodes.nbytes` counts it)."""
  from fedjax_mtl.flower import client as flower_client, nodes, server
  cfg = tiny_config(algorithm, num_rounds=1)
  strategy = server.make_strategy(cfg)
  rt = flower_client.client_runtime(cfg)
  acc = comm.account(strategy.exp)

  def values(content):  # bytes of the arrays' values, and the number of arrays
    arrays = [a for rec in content.array_records.values() for a in rec.values()]
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in arrays), len(arrays)

  for c in range(strategy.exp.fed.num_clients):
    content = strategy.client_content(c, 1)
    _, reply = flower_client.train_reply(rt, c, None, content)
    for msg, want in ((content, acc.down[c]), (reply, acc.up[c])):
      raw, arrays = values(msg)
      assert raw == want
      assert 0 <= nodes.nbytes(msg) - raw <= 256 * arrays  # the .npy headers


@pytest.mark.parametrize('algorithm,over,message', [
    ('dp(fedavg)', {'dp.clip_norm': 0.0}, 'dp.clip_norm'),
    ('dp(fedavg)', {'dp.noise_multiplier': -1.0}, 'dp.noise_multiplier'),
    ('quantize(fedavg)', {'quantize.bits': 17}, 'quantize.bits'),
    ('quantize(fedavg)', {'quantize.bits': 0}, 'quantize.bits'),
    ('sparsify(fedavg)', {'sparsify.fraction': 0.0}, 'sparsify.fraction'),
    ('dp(local)', {}, r"dp\(\) wraps a server rule, but 'local' shares no parameters"),
])
def test_bad_wrapper_input_is_one_error_line_and_writes_nothing(tmp_path, algorithm, over,
                                                                 message):
  from fedjax_mtl import train
  from fedjax_mtl.errors import ConfigError
  cfg = override(tiny_config(algorithm), **over)
  wd = tmp_path / 'wd'
  with pytest.raises(ConfigError, match=message) as err:
    train.train_and_evaluate(cfg, str(wd))
  assert '\n' not in str(err.value)
  assert not wd.exists() or not any(wd.iterdir())


def test_a_dp_run_reports_the_privacy_spent_each_round(tmp_path):
  from fedjax_mtl import train
  from fedjax_mtl.algorithms import dp
  from fedjax_mtl.engines import dense
  from fedjax_mtl.report import read_jsonl
  cfg = override(tiny_config('dp(fedavg)', num_rounds=2), **{'dp.noise_multiplier': 1.0})
  train.train_and_evaluate(cfg, str(tmp_path))
  rows = read_jsonl(str(tmp_path / 'metrics.jsonl'))
  agg = [r for r in rows if r['type'] == 'agg']
  want = dp.epsilons(1.0, 1.0, 2, 1e-5)
  assert [r['dp_epsilon'] for r in agg] == pytest.approx(want)
  assert all(len(r['dp_norm']) == 5 for r in agg)
  table = (tmp_path / 'results.md').read_text()
  assert f'Privacy: (ε, δ) = ({want[-1]:.3g}, 1e-05) after 2 rounds' in table
  # Without noise there is no privacy: ε = ∞ (null in metrics.jsonl).
  no_noise = [{**r, 'dp_epsilon': None} if r['type'] == 'agg' else r for r in rows]
  eng = dense.DenseEngine(experiment.build(cfg), cfg)
  final = [r for r in rows if r['type'] == 'eval' and r['round'] == 2]
  eng.write_reports(no_noise, final, str(tmp_path))
  assert 'Privacy: (ε, δ) = (∞, 1e-05) after 2 rounds' in (tmp_path / 'results.md').read_text()
