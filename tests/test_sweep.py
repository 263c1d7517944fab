"""Sweeps (`config.sweep`): replicas of the whole federation in one compiled program.

Each replica trains what the separate run of its seed and values trains (within the
bound of `agreement`, the one the 4-device test uses), a sweep resumes bitwise, each
replica's records are those of a separate run, and bad sweeps are one line.
"""

import json
import os
import shutil

import jax
import numpy as np
import pytest

import agreement
from conftest import tiny_config

from fedjax_mtl import experiment, fields, report, rounds, sweep, train, validate
from fedjax_mtl.engines import build as build_engine
from fedjax_mtl.errors import ConfigError

SWEEP = 'optim.lr=0.002,0.02;seed=1'  # 2 replicas, both of another seed than the config's


def sweep_config(**kw):
  c = tiny_config('fedprox', num_rounds=2, eval_every=2, **agreement.SGD, **kw)
  c.sweep = SWEEP
  return c


@pytest.fixture(scope='module')
def swept(tmp_path_factory):
  wd = str(tmp_path_factory.mktemp('sweep') / 'wd')
  return wd, train.train_and_evaluate(sweep_config(), wd)


def parse(text: str):
  return sweep.parse(text, validate.fields_table())


def replica_params(state, r: int) -> list:
  return [jax.tree.map(lambda x: x[r], gs.params) for gs in state.groups]


def test_parse_is_a_product_with_the_first_axis_slowest():
  s = parse('optim.lr=0.002,0.02;seed=0,1')
  assert s.size == 4 and s.names == ('optim.lr', 'seed')
  assert s.points == [{'optim.lr': 0.002, 'seed': 0}, {'optim.lr': 0.002, 'seed': 1},
                      {'optim.lr': 0.02, 'seed': 0}, {'optim.lr': 0.02, 'seed': 1}]
  assert s.label(3) == 'optim.lr=0.02,seed=1'
  c = s.config_of(sweep_config(), 3)
  assert (c.optim.lr, c.seed, c.sweep) == (0.02, 1, '')
  assert parse('') is None and parse('fedprox.mu=0.1').seed(c, 0) == 1


@pytest.mark.parametrize('text, expected', [
    ('seed', "sweep axis 'seed' is not name=v1,v2,..."),
    ('model.encoder=a,b', "sweep field 'model.encoder' is structural"),
    ('scenario=x', "sweep field 'scenario' is structural"),
    ('optim.lrr=0.1', "sweep field 'optim.lrr' is not a config field; sweepable fields: seed,"),
    ('optim.lr=-1', 'sweep value -1 of optim.lr is out of range; valid range: lr > 0'),
    ('seed=0.5', "sweep value '0.5' of seed is not an integer"),
    ('optim.lr=abc', "sweep value 'abc' of optim.lr is not a number"),
    ('seed=0,1;seed=2', "sweep names 'seed' twice"),
    ('seed=1,1', "sweep repeats a value of 'seed'"),
])
def test_a_bad_sweep_is_one_line_before_anything_runs(text, expected):
  c = sweep_config()
  c.sweep = text
  with pytest.raises(ConfigError) as e:
    validate.check_config(c)
  assert expected in str(e.value) and '\n' not in str(e.value)
  if 'structural' in expected:  # the line lists what may be swept
    assert 'seed, ' in str(e.value) and 'optim.lr' in str(e.value)


def test_settings_a_sweep_cannot_hold_are_refused():
  c = sweep_config()
  c.data.source = 'real'
  with pytest.raises(ConfigError, match="in-memory synthetic data"):
    validate.check_config(c)


def test_replicas_draw_their_own_participants_and_stragglers(tmp_path):
  """participation=0.6 and stragglers=0.5 over seeds 1 and 2 (FedHCA2): each replica
  trains the clients and steps its own seed draws (masked in the sweep), and replica
  1 ends within the agreement bound of its separate run (which gathers its
  participants) with the same train rows."""
  from fedjax_mtl import participation
  c = tiny_config('hca2', num_rounds=2, eval_every=2, participation=0.6, stragglers=0.5,
                  **agreement.SGD)
  c.sweep = 'seed=1,2'
  out = train.train_and_evaluate(c, str(tmp_path / 'sweep'))
  s = parse(c.sweep)
  rows = report.read_jsonl(str(tmp_path / 'sweep' / 'metrics.jsonl'))
  trained = lambda rs: sorted((x['round'], x['client'], x['task'], x['steps'])
                              for x in rs if x['type'] == 'train')
  exp = experiment.build(s.config_of(c, 1))
  names = [cl.name for cl in exp.fed.clients]
  drawn = []
  for r in range(2):
    sampler = participation.Sampler(c, exp.fed, s.seed(c, r))
    mine = trained([x for x in rows if x.get('replica') == r])
    assert {(rnd, cl) for rnd, cl, _, _ in mine} == {
        (rnd, names[i]) for rnd in (1, 2) for i in np.flatnonzero(sampler.mask(rnd))}
    drawn.append(mine)
  assert drawn[0] != drawn[1]  # each replica its own draws
  config = s.config_of(c, 1)
  init = agreement.model_rows(exp, [gs.params for gs in experiment.init_state(exp).groups])
  sep = train.train_and_evaluate(config, str(tmp_path / 'sep'))
  want = agreement.model_rows(exp, [gs.params for gs in sep['state'].groups])
  got = agreement.model_rows(exp, replica_params(out['state'], 1))
  print(f'replica 1: worst row error {agreement.worst(got, want, init):.2e} of the bound')
  agreement.assert_within_bound(got, want, init)
  assert drawn[1] == trained(report.read_jsonl(str(tmp_path / 'sep' / 'metrics.jsonl')))


# Every traced field, by the algorithm and the program that read it.
TRACED = [('fedprox', 'train', ('optim.lr', 'fedprox.mu')), ('ditto', 'train', ('ditto.lam',)),
          ('hca2', 'aggregate', ('hca2.ca_c',)),
          ('hca2', 'init', tuple(f'hca2.{k}' for k in ('alpha_init', 'beta_init', 'hyper_lr',
                                                      'hyper_momentum', 'hyper_weight_decay')))]


def test_the_traced_fields_are_those_listed():
  assert sorted(sweep.traced_fields(validate.fields_table())) == sorted(
      f for _, _, names in TRACED for f in names)


@pytest.mark.parametrize('algorithm, program, names', TRACED)
def test_every_traced_field_is_read_by_its_program(algorithm, program, names):
  """A traced field the programs do not read would leave every replica at the config's
  value: its scalar must be an input the traced program uses."""
  engine = build_engine(tiny_config(algorithm))
  exp = engine.exp
  if program == 'init':
    init = exp.init_program
    fn = lambda seed: init.states_fn(*init.init_fn(seed), None)
    args = (jax.ShapeDtypeStruct((), np.uint32),)
  elif program == 'train':
    state = experiment.init_state(exp, abstract=True)
    start = rounds.abstract_round_start(exp, [gs.params for gs in state.groups])[0]
    data = jax.eval_shape(lambda: exp.data[exp.fed.groups[0].dataset]['train'])
    fn = rounds.train_bodies(exp)[0]
    args = (state.groups[0], start, data, state.round, state.rng, np.int32(2))
  else:
    engine.open(0)
    try:
      jobs = {name: args for name, _, args in engine.programs_to_compile(engine.abstract_state())}
    finally:
      engine.close()
    fn, args = rounds.agg_body(exp), jobs['aggregate']

  def with_values(values, *a):
    with fields.tracing(dict(zip(names, values))):
      return fn(*a)

  jaxpr = jax.make_jaxpr(with_values)([np.float32(0.5)] * len(names), *args).jaxpr
  used = {id(x) for eqn in jaxpr.eqns for x in eqn.invars} | {id(x) for x in jaxpr.outvars}
  for name, var in zip(names, jaxpr.invars):
    assert id(var) in used, f'{name} is not read by the {program} program'


def test_each_replica_trains_what_its_separate_run_trains(swept, tmp_path):
  _, out = swept
  r = 1  # lr 0.02 and seed 1: both other than the config's
  s = parse(SWEEP)
  config = s.config_of(sweep_config(), r)
  exp = experiment.build(config)
  init = agreement.model_rows(exp, [gs.params for gs in experiment.init_state(exp).groups])
  sep = train.train_and_evaluate(config, str(tmp_path / 'sep'))
  want = agreement.model_rows(exp, [gs.params for gs in sep['state'].groups])
  got = agreement.model_rows(exp, replica_params(out['state'], r))
  print(f'replica {r}: worst row error {agreement.worst(got, want, init):.2e} of the bound')
  agreement.assert_within_bound(got, want, init)
  wrong = agreement.model_rows(exp, replica_params(out['state'], 0))  # the other lr's
  assert agreement.worst(wrong, want, init) > agreement.FAULT_MARGIN
  mine = {(e['client'], e['task']): e['value'] for e in out['eval'] if e['replica'] == r}
  theirs = {(e['client'], e['task']): e['value'] for e in sep['eval']}
  assert mine.keys() == theirs.keys()
  np.testing.assert_allclose([mine[k] for k in theirs], list(theirs.values()), rtol=1e-4)


def test_a_sweep_resumes_bitwise(swept, tmp_path):
  wd, out = swept
  mine = str(tmp_path / 'wd')
  # The sweep as an interruption after round 1 leaves it: its round-1 checkpoint is the
  # newest (an uninterrupted run's round 1 is bitwise the interrupted one's).
  shutil.copytree(wd, mine, ignore=shutil.ignore_patterns('.lock'))
  shutil.rmtree(os.path.join(mine, 'checkpoints', '2'))
  resumed = train.train_and_evaluate(sweep_config(), mine)
  for a, b in zip(jax.tree.leaves(resumed['state']), jax.tree.leaves(out['state'])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  strip = lambda path: [r for r in report.read_jsonl(path)]
  assert strip(os.path.join(mine, 'metrics.jsonl')) == strip(os.path.join(wd, 'metrics.jsonl'))


def test_each_replica_has_the_records_of_a_separate_run(swept):
  wd, out = swept
  s = parse(SWEEP)
  rows = report.read_jsonl(os.path.join(wd, 'metrics.jsonl'))
  assert rows[0]['type'] == 'meta' and rows[0]['replicas'] == [s.label(r) for r in range(2)]
  for r in range(2):
    sub = os.path.join(wd, 'replicas', s.label(r))
    assert {'metrics.jsonl', 'config.json', 'results.md', 'results.csv', 'curves.png'} <= set(
        os.listdir(sub))
    sub_rows = report.read_jsonl(os.path.join(sub, 'metrics.jsonl'))
    assert 'replicas' not in sub_rows[0] and all('replica' not in x for x in sub_rows)
    assert sub_rows[1:] == [{k: v for k, v in x.items() if k != 'replica'}
                            for x in rows if x.get('replica') == r]
    saved = json.load(open(os.path.join(sub, 'config.json')))
    assert (saved['seed'], saved['optim']['lr'], saved['sweep']) == (
        s.seed(None, r), s.points[r]['optim.lr'], '')
  table = open(os.path.join(wd, 'results.md')).read().splitlines()
  assert [line.split(' | ')[0] for line in table[2:]] == ['| optim.lr=0.002', '| optim.lr=0.02']
  assert all(' ± ' not in line for line in table[2:])  # one seed per point


def test_divergence_names_the_replica_and_its_values():
  engine = build_engine(sweep_config())
  fed, n = engine.exp.fed, engine.num_replicas
  health = {'loss': [np.ones((n, g.num_total, g.num_slots), bool) for g in fed.groups],
            'params': [np.ones((n, g.num_total), bool) for g in fed.groups],
            'agg': [np.ones((n, g.num_total), bool) for g in fed.groups],
            'server': np.ones(n, bool)}
  assert engine.divergence(3, {'health': health}) is None
  health['params'][0][1, 1] = False
  c = fed.clients[fed.groups[0].client_ids[1]]
  assert engine.divergence(3, {'health': health}) == (
      f'round 3, replica 1 (optim.lr=0.02,seed=1): non-finite parameters after local '
      f'training of client {c.name} ({c.tasks[0]})')


def test_replicas_that_will_not_fit_are_refused_with_the_largest_r_that_fits(
    tmp_path, monkeypatch):
  from fedjax_mtl.engines import replicas
  engine = build_engine(sweep_config())
  engine.open(0)
  try:
    jobs = engine.programs_to_compile(engine.abstract_state())
    name, fn, args = jobs[0]
    compiled = fn.lower(*args).compile()
    engine.check_compiled(name, compiled)  # this host holds two tiny replicas
    need = (replicas.nbytes(engine.abstract_state()) + replicas.nbytes(
        (engine.source.train, engine.source.test)) + compiled.memory_analysis().temp_size_in_bytes)
    monkeypatch.setattr(replicas, 'device_memory_bytes', lambda d: int(need * 0.8 / 0.9))
    with pytest.raises(ConfigError) as e:
      engine.check_compiled(name, compiled)
  finally:
    engine.close()
  msg = str(e.value)
  assert msg.startswith('config.sweep: 2 replicas need about') and '\n' not in msg
  assert msg.endswith('at most R = 1 fits'), msg


def test_tensorboard_tags_a_replicas_scalars_with_its_label():
  from fedjax_mtl import sinks
  meta = {'clients': ['c0'], 'replicas': ['seed=0', 'seed=1']}
  rows = [{'round': 1, 'type': 'train', 'client': 'c0', 'task': 'sal', 'loss': 1., 'replica': 1},
          {'round': 1, 'type': 'agg', 'alpha': [0.2], 'ca_w': 0.5, 'replica': 0}]
  assert sinks.scalars(rows, meta) == [('seed=1/train/c0/sal/loss', 1., 1),
                                       ('seed=0/agg/alpha/c0', 0.2, 1),
                                       ('seed=0/agg/ca_w', 0.5, 1)]


# The sweep of `swept` on 4 devices: 2 replicas -> a (replicas 2) x (clients 2) mesh.
_FOUR_DEVICES = '''
import sys, jax, numpy as np
import agreement, test_sweep
from fedjax_mtl import experiment, train
config = test_sweep.sweep_config()
out = train.train_and_evaluate(config, sys.argv[2])
exp = experiment.build(config)
leaf = jax.tree.leaves(out['state'].groups[0].params)[0]
rows = {f'{r}:{k}': v for r in range(2) for k, v in agreement.model_rows(
    exp, test_sweep.replica_params(out['state'], r)).items()}
np.savez(sys.argv[1], mesh=str(dict(exp.mesh.shape)), spec=str(leaf.sharding.spec),
         shard=np.asarray(leaf.addressable_shards[0].data.shape), **rows)
'''


def test_on_four_devices_the_replicas_and_the_clients_are_sharded_and_agree(swept, tmp_path):
  import subprocess
  import sys
  here = os.path.dirname(os.path.abspath(__file__))
  env = dict(os.environ, XLA_FLAGS=os.environ.get('XLA_FLAGS', '')
             + ' --xla_force_host_platform_device_count=4')
  r = subprocess.run([sys.executable, '-c', _FOUR_DEVICES, str(tmp_path / 'four.npz'),
                      str(tmp_path / 'wd')], cwd=here, env=env, capture_output=True,
                     text=True, timeout=400)
  assert r.returncode == 0, r.stderr[-3000:]
  got = np.load(tmp_path / 'four.npz')
  assert str(got['mesh']) == "{'replicas': 2, 'clients': 2}"
  assert str(got['spec']) == "P('replicas', 'clients')"
  assert got['shard'][:2].tolist() == [1, 2]  # a device: one replica, 2 of its 4 clients
  _, out = swept
  one = parse(SWEEP).config_of(sweep_config(), 0)  # both replicas start from seed 1's models
  exp = experiment.build(one)
  init = agreement.model_rows(exp, [gs.params for gs in experiment.init_state(exp).groups])
  for rep in range(2):
    want = agreement.model_rows(exp, replica_params(out['state'], rep))
    mine = {k.split(':', 1)[1]: got[k] for k in got.files if k.startswith(f'{rep}:')}
    print(f'replica {rep}: worst row error {agreement.worst(mine, want, init):.2e} of the bound')
    agreement.assert_within_bound(mine, want, init)
