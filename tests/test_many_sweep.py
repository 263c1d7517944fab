"""Many-task sweeps (`engines/many_replicas.py`): a sweep's replicas, each with its own
seed, client split and traced values, in one program; each trains what its separate
run trains, resumes bitwise, writes a separate run's records; bad sweeps are one line."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from test_manytask import tiny

from fedjax_mtl import compare, report, train, validate
from fedjax_mtl.engines import build as build_engine
from fedjax_mtl.errors import ConfigError

SWEEP = 'optim.lr=0.002,0.02;seed+split_seed=0,1'  # 4 replicas, 2 client splits


def sweep_config(algorithm='matu', sweep=SWEEP, **over):
  c = tiny(algorithm, checkpoint_every=1, **over)
  c.many.tasks_per_client = 2  # every split: 12 pairs, 6 slots a round
  c.sweep = sweep
  return c


@pytest.fixture(scope='module')
def swept(tmp_path_factory):
  wd = str(tmp_path_factory.mktemp('many_sweep') / 'wd')
  return wd, train.train_and_evaluate(sweep_config(), wd)


def separate(config, wd):
  return train.train_and_evaluate(config, wd)


def leaves_of(state, r=None):
  return [np.asarray(x) if r is None else np.asarray(x)[r] for x in jax.tree.leaves(state)]


def worst_gap(a, b) -> float:
  """The largest |a − b| over the float leaves, in units of the largest |a|."""
  fa = [(x, y) for x, y in zip(a, b) if x.dtype.kind == 'f']
  scale = max(float(np.abs(x).max()) for x, _ in fa)
  return max(float(np.abs(x - y).max()) for x, y in fa) / scale


def test_zipped_axes_take_their_values_together():
  s = validate.sweep_of(sweep_config())
  assert s.size == 4 and s.names == ('optim.lr', 'seed', 'split_seed')
  assert s.points[3] == {'optim.lr': 0.02, 'seed': 1, 'split_seed': 1}
  assert s.label(3) == 'optim.lr=0.02,seed=1,split_seed=1'
  assert s.label(3, seed=False) == 'optim.lr=0.02' and s.traced_names == ('optim.lr',)
  c = s.config_of(sweep_config(), 3)
  assert (c.seed, c.split_seed, c.optim.lr, c.sweep) == (1, 1, 0.02, '')


def test_each_replica_trains_what_its_separate_run_trains(swept, tmp_path):
  """MaTU (its server reads each pair's client and task, and the initialisation)
  with the other split, seed and learning rate than the config's: the final
  state agrees with the separate run's to float32 rounding; the replica of the
  same split and seed but the other lr is far from it."""
  _, out = swept
  c = sweep_config()
  s = validate.sweep_of(c)
  sep = separate(s.config_of(c, 3), str(tmp_path / 'sep'))
  want = leaves_of(sep['state'])
  gap = worst_gap(want, leaves_of(out['state'], 3))
  print(f'replica 3: worst state gap {gap:.1e} of the largest entry')
  assert gap < 1e-4
  assert worst_gap(want, leaves_of(out['state'], 1)) > 100 * max(gap, 1e-6)  # lr 0.002
  ints = [(x, y) for x, y in zip(want, leaves_of(out['state'], 3)) if x.dtype.kind != 'f']
  assert all((x == y).all() for x, y in ints)  # round, RNG
  mine = {(e['task'], e['metric']): e['value'] for e in out['eval'] if e['replica'] == 3}
  theirs = {(e['task'], e['metric']): e['value'] for e in sep['eval']}
  assert mine.keys() == theirs.keys()
  np.testing.assert_allclose([mine[k] for k in theirs], list(theirs.values()), atol=1e-3)
  # The train rows (pairs, steps) are the separate run's: its own split's schedule.
  trained = lambda rows: sorted((x['round'], x['client'], x['task'], x['steps'])
                                for x in rows if x['type'] == 'train')
  rows = report.read_jsonl(os.path.join(swept[0], 'metrics.jsonl'))
  assert trained([x for x in rows if x.get('replica') == 3]) == trained(
      report.read_jsonl(str(tmp_path / 'sep' / 'metrics.jsonl')))
  assert trained([x for x in rows if x.get('replica') == 2]) != trained(
      [x for x in rows if x.get('replica') == 3])  # the two splits differ


def test_linearised_clients_and_evaluation_b_in_a_sweep(tmp_path):
  """NTKFedAvg (linearised clients around the initialisation of each replica's
  seed, a backbone of each seed, evaluation B), the replicas vmapped (the MaTU
  sweep runs them one at a time, a CPU's default): replica 1 against its separate
  run."""
  c = sweep_config('ntkfedavg', sweep='seed+split_seed=0,1', num_rounds=1,
                   **{'many.parallel_replicas': 2})
  c.ntkfedavg.point = 'pretrained'
  assert build_engine(c).parallel == 2  # (a CPU's default: 1)
  out = train.train_and_evaluate(c, str(tmp_path / 'sweep'))
  s = validate.sweep_of(c)
  sep = separate(s.config_of(c, 1), str(tmp_path / 'sep'))
  assert worst_gap(leaves_of(sep['state']), leaves_of(out['state'], 1)) < 1e-4
  mine = {(e['task'], e['metric']): e['value'] for e in out['eval'] if e['replica'] == 1}
  theirs = {(e['task'], e['metric']): e['value'] for e in sep['eval']}
  assert any(m.endswith('_linear') for _, m in theirs) and mine.keys() == theirs.keys()
  np.testing.assert_allclose([mine[k] for k in theirs], list(theirs.values()), atol=1e-3)


def test_a_many_task_sweep_resumes_bitwise(swept, tmp_path):
  wd, out = swept
  mine = str(tmp_path / 'wd')
  shutil.copytree(wd, mine, ignore=shutil.ignore_patterns('.lock'))
  shutil.rmtree(os.path.join(mine, 'checkpoints', '2'))
  resumed = train.train_and_evaluate(sweep_config(), mine)
  for a, b in zip(leaves_of(resumed['state']), leaves_of(out['state'])):
    np.testing.assert_array_equal(a, b)
  assert (report.read_jsonl(os.path.join(mine, 'metrics.jsonl'))
          == report.read_jsonl(os.path.join(wd, 'metrics.jsonl')))


def test_each_replica_has_the_records_of_a_separate_run(swept):
  wd, _ = swept
  s = validate.sweep_of(sweep_config())
  rows = report.read_jsonl(os.path.join(wd, 'metrics.jsonl'))
  assert rows[0] == {'round': 0, 'type': 'meta', 'replicas': [s.label(r) for r in range(4)]}
  for r in range(4):
    sub = os.path.join(wd, 'replicas', s.label(r))
    assert {'metrics.jsonl', 'config.json', 'results.md', 'results.csv', 'curves.png'} <= set(
        os.listdir(sub))
    assert report.read_jsonl(os.path.join(sub, 'metrics.jsonl')) == [
        {k: v for k, v in x.items() if k != 'replica'} for x in rows if x.get('replica') == r]
    saved = json.load(open(os.path.join(sub, 'config.json')))
    assert (saved['seed'], saved['split_seed'], saved['optim']['lr'], saved['sweep']) == (
        s.points[r]['seed'], s.points[r]['split_seed'], s.points[r]['optim.lr'], '')
  table = open(os.path.join(wd, 'results.md')).read().splitlines()
  assert [line.split(' | ')[0] for line in table[2:]] == ['| optim.lr=0.002', '| optim.lr=0.02']
  assert all(' ± ' in line for line in table[2:])  # two seeds per point


@pytest.mark.parametrize('over, expected', [
    (dict(sweep='seed+split_seed=0,1', tasks_per_client=0),
     'config.sweep: replicas with their own client splits (split_seed) need a fixed number '
     'of tasks per client'),
    (dict(feed='round'), "many-task sweep's replicas read the training set from the device"),
    (dict(max_steps_per_round=2), 'max_steps_per_round (a rehearsal cap) does not run'),
])
def test_what_a_many_task_sweep_cannot_hold_is_one_line(over, expected):
  c = sweep_config(sweep=over.pop('sweep', SWEEP))
  for k, v in over.items():
    if k in c.many:
      c.many[k] = v
    else:
      c[k] = v
  with pytest.raises(ConfigError) as e:
    validate.check_config(c)
  assert expected in str(e.value) and '\n' not in str(e.value)


def test_a_seed_only_sweep_of_one_split_needs_no_fixed_allocation():
  c = sweep_config(sweep='seed=0,1')
  c.many.tasks_per_client = 0  # Dirichlet allocation, one split for both replicas
  assert build_engine(c).num_replicas == 2


def test_compare_runs_many_task_seeds_as_replicas_where_the_split_allows(tmp_path):
  plan = compare.plan_runs(['m=configs/matu.py many.tasks_per_client=2',
                            'd=configs/matu.py many.zeta_t=0.5'], [0, 1], str(tmp_path),
                           replicas=True)  # d: each split draws its clients' task counts
  assert [(r.name, r.seeds) for r in plan] == [('m', (0, 1)), ('d', ()), ('d', ())]
  assert plan[0].config.sweep == 'seed+split_seed=0,1'
  assert [os.path.basename(wd) for _, wd in compare.run_dirs(plan[0])] == [
      'seed=0,split_seed=0', 'seed=1,split_seed=1']
