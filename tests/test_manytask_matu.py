"""The many-task setting, continued: MaTU in the round (against matu_math and its
reductions), its bits, configs and bad input; the allocations of Figs. 5-6; the
round feed. (A second file so that pytest-xdist's per-file scheduling spreads the
many-task tests over both workers.)"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import override
from fedjax_mtl import train
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.manytask import run as run_lib
from test_manytask import _round1, tiny


@pytest.fixture(scope='module')
def fedavg_run():
  return run_lib.build_run(tiny())


@pytest.fixture(scope='module')
def local_round1():
  return _round1(run_lib.build_run(tiny('local')))


def _matu(**over):
  from fedjax_mtl.algorithms import matu
  cfg = tiny('matu')
  cfg.matu = matu.default_config()
  return override(cfg, **over)


def _flat(rows: dict, keys: list) -> np.ndarray:
  return np.concatenate([np.asarray(rows[k], np.float64).reshape(len(rows[k]), -1)
                         for k in keys], axis=1)


def test_matu_round_is_the_matu_math_of_the_local_round(local_round1):
  """MaTU in the many-task round: the slots' task vectors (the Local round's trained
  adapters minus the shared LoRA init) go through client unification, the stateless
  server and recovery (`matu_math.round_update`, tested against a NumPy oracle in
  test_matu_math.py), segmented by the slots' clients; each real slot keeps
  init + its recovered vector, heads are averaged per task, the server keeps nothing."""
  from fedjax_mtl.algorithms import matu_math
  run = run_lib.build_run(_matu())
  st = run.setting
  assert {w for k, w in run.where.items() if run.roles[k] != 'head'} == {'pair'}
  assert {w for k, w in run.where.items() if run.roles[k] == 'head'} == {'task'}
  slots = st.schedule[0]
  real = slots < st.num_pairs
  assert not real.all() and len(set(st.pairs[slots[real], 0])) < real.sum()  # padding, k_n > 1
  loc, _ = local_round1
  new, out = _round1(run)
  assert new.server == () and jax.tree.leaves(new.server) == []
  keys = sorted(k for k in run.roles if run.roles[k] != 'head')
  origin = _flat({k: run.trainable[k][None] for k in keys}, keys)
  trained = _flat({k: np.asarray(loc.pair_rows[k])[slots] for k in keys}, keys)
  clients = np.where(real, st.pairs[np.minimum(slots, st.num_pairs - 1), 0], -1)
  group = np.array([np.flatnonzero(clients == c)[0] if c >= 0 else i
                    for i, c in enumerate(clients)])
  rec, logs = matu_math.round_update(
      jnp.asarray(trained - origin, jnp.float32), jnp.asarray(group, jnp.int32),
      jnp.asarray(st.pair_task[slots]), jnp.asarray(st.pair_counts[slots], jnp.float32),
      jnp.asarray(real), st.num_tasks, rho=0.4, eps=0.5, kappa=3)
  got = _flat({k: np.asarray(new.pair_rows[k])[slots] for k in keys}, keys)
  np.testing.assert_allclose(got[real], (origin + np.asarray(rec))[real], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out['agg']['matu_similarity'], logs['matu_similarity'], rtol=1e-6)
  # Pairs of clients not sampled this round keep their start (the LoRA init).
  idle = np.setdiff1d(np.arange(st.num_pairs), slots)
  assert len(idle)
  np.testing.assert_array_equal(_flat({k: np.asarray(new.pair_rows[k])[idle] for k in keys},
                                      keys), np.broadcast_to(origin, (len(idle), origin.shape[1])))


def test_matu_single_task_clients_without_cross_task_is_per_task_fedavg():
  """Spec §2.6: with one task per client (k_n = 1: τ_n = τ_n^t, λ = 1), ρ = 0 (m̂ = 1)
  and no cross-task vector, MaTU's round is the examples-weighted mean of each task's
  trained adapters, given to every pair of that task."""
  run = run_lib.build_run(_matu(**{'many.zeta_t': 0.0, 'many.num_clients': 6,
                               'many.participation': 1.0, 'matu.rho': 0.0,
                               'matu.cross': 'none'}))
  st = run.setting
  slots = st.schedule[0]
  assert all(len(st.allocation.tasks_of(c)) == 1 for c in range(6))
  loc, _ = _round1(run_lib.build_run(tiny('local', **{'many.zeta_t': 0.0, 'many.num_clients': 6,
                                                  'many.participation': 1.0})))
  new, _ = _round1(run)
  w = st.pair_counts[slots].astype(np.float64)
  tasks = st.pair_task[slots]
  for k, r in run.roles.items():
    if r == 'head':
      continue
    trained = np.asarray(loc.pair_rows[k])[slots].astype(np.float64)
    for t in range(st.num_tasks):
      sel = tasks == t
      want = np.tensordot(w[sel] / w[sel].sum(), trained[sel], (0, 0))
      for row in np.asarray(new.pair_rows[k])[slots[sel]]:
        np.testing.assert_allclose(row, want, rtol=1e-4, atol=1e-6)


def test_matu_bits_count_one_unified_vector_per_client():
  """Spec §7 item 14: a client with k tasks uploads 32d + k(d + 32) bits (32d when
  k = 1), shared by its k pairs; plus each pair's head columns in float32."""
  run = run_lib.build_run(_matu())
  d = sum(int(np.prod(v.shape)) for k, v in run.trainable.items() if run.roles[k] != 'head')
  heads = {k: v for k, v in run.trainable.items() if run.roles[k] == 'head'}
  bits = run_lib.upload_bits(run)
  a = run.setting.allocation
  for p, (c, t) in enumerate(run.setting.pairs):
    k = len(a.tasks_of(c))
    head = 32 * sum(int(np.prod(v.shape[:-1])) * run.setting.num_classes[t]
                    for v in heads.values())
    want = (32 * d + (k * (d + 32) if k > 1 else 0)) / k + head
    assert bits[p] == pytest.approx(want)
  assert bits[-1] == 0


def test_matu_refuses_the_dense_engine():
  from fedjax_mtl import algorithms
  with pytest.raises(ConfigError, match="'matu' runs in the many-task setting only"):
    algorithms.get_algorithm('matu', algorithms.FedInfo(
        num_clients=2, num_decoders=2, decoder_client=(0, 1), decoder_names=('a', 'b'),
        client_names=('a', 'b'), homo_groups=(1, 1)), None)


def test_fixed_and_grouped_task_allocations():
  """`many.tasks_per_client` (Fig. 5): every client holds exactly k tasks and every task
  is held; `many.client_tasks` (Fig. 6a): client n holds group n mod G."""
  big = {'many.num_train': 64, 'many.class_split': 'iid'}
  st = run_lib.build_run(tiny(**{'many.tasks_per_client': 3, **big})).setting
  a = st.allocation.assignment
  assert (a.sum(1) == 3).all() and a.any(0).all()
  assert sorted(a.sum(0).tolist()) == [4, 4, 5, 5]  # 6 clients x 3 tasks round 4 tasks
  st = run_lib.build_run(tiny(**{'many.client_tasks': 'digits+shapes; digits_perm+colors+digits',
                             **big})).setting
  groups = [[0, 2], [0, 1, 3]]  # benchmark order: digits, digits_perm, shapes, colors
  for c in range(6):
    assert st.allocation.tasks_of(c).tolist() == groups[c % 2]


def test_matu_config_variants():
  import importlib.util
  spec = importlib.util.spec_from_file_location(
      'cfg_matu', os.path.join(os.path.dirname(__file__), '..', 'configs', 'matu.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  for arg, zeta in (('paper', 0.0), ('paper,table=1', 0.0), ('paper,table=2', 0.5)):
    c = mod.get_config(arg)
    m = c.many
    assert (c.setting, m.benchmark, m.model, m.resolution, m.lora_rank) == (
        'many_task', 'tfds8', 'vit_b32', 224, 16)
    assert (m.num_clients, c.num_rounds, m.participation, m.zeta_c, m.zeta_t) == (
        30, 100, 0.2, 0.1, zeta)
    assert (m.local_epochs, c.batch_size, c.optim.lr) == (1, 32, 1e-3)
  c = mod.get_config(None)
  assert c.algorithm == 'matu' and c.many.benchmark == 'mini8' and c.matu.combine == 'sum'
  with pytest.raises(ValueError, match="unknown table 'fig9'"):
    mod.get_config('paper,table=fig9')
  c = mod.get_config('paper,table=fig4')
  assert (c.many.benchmark, c.many.num_clients, c.many.zeta_t, c.num_rounds, c.matu.kappa) == (
      'folder30', 30, 0.2, 300, 5)
  c = mod.get_config('paper,table=fig5,k=12')
  assert (c.many.benchmark, c.many.tasks_per_client, c.many.num_clients) == ('folder30', 12, 10)
  c = mod.get_config('mini8,table=fig5,k=4')
  assert (c.many.tasks_per_client, c.many.num_clients, c.many.participation) == (4, 10, 1.0)


def test_matu_fig6_config_groups_from_a_relatedness_file(tmp_path):
  import importlib.util
  import json as json_lib
  spec = importlib.util.spec_from_file_location(
      'cfg_matu', os.path.join(os.path.dirname(__file__), '..', 'configs', 'matu.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  rel = tmp_path / 'relatedness.json'
  rel.write_text(json_lib.dumps({'clusters': [['digits', 'digits_perm', 'digits_clutter'],
                                              ['shapes', 'colors', 'count_dots'],
                                              ['gratings', 'texture_freq']]}))
  c = mod.get_config(f'paper,table=fig6a,conflict=2,relatedness={rel}')
  assert (c.num_rounds, c.many.num_clients, c.many.benchmark) == (300, 10, 'tfds8')
  c = mod.get_config(f'mini8,table=fig6b,conflict=0,relatedness={rel}')
  groups = [g.split('+') for g in c.many.client_tasks.split(';')]
  assert groups == [['digits', 'digits_perm', 'digits_clutter'],
                    ['shapes', 'colors', 'count_dots']]
  assert c.many.tasks.split(',') == sorted(t for g in groups for t in g)
  run_lib.check(c)  # the groups and the task subset agree
  with pytest.raises(ValueError, match='need relatedness='):
    mod.get_config('mini8,table=fig6a,conflict=2')


def test_round_feed_gives_the_device_feed_bitwise(fedavg_run):
  """`many.feed='round'` (only the round's samples on the device, renumbered) trains
  exactly as the whole training set on the device: bitwise the same round."""
  from fedjax_mtl.manytask.feed import RoundFeed
  from fedjax_mtl.manytask.run import concat_split, init_state
  run = fedavg_run
  images, labels, _ = concat_split(run.data.train)
  slots = jnp.asarray(run.setting.schedule[1])
  got = {}
  for mode in ('device', 'round'):
    feed = RoundFeed(run.setting, images, labels, mode)
    got[mode] = jax.device_get(run.round_fn(init_state(run), run.backbone, slots, *feed(1)))
  jax.tree.map(np.testing.assert_array_equal, got['device'], got['round'])
  rows, imgs, _ = feed(1)
  assert imgs.shape[0] == feed.size < len(images)  # a part of the training set
  st = run.setting
  for i, p in enumerate(st.schedule[1]):
    if p < st.num_pairs:
      n = st.counts[p]
      np.testing.assert_array_equal(np.asarray(imgs)[np.asarray(rows)[i, :n]],
                                    images[st.index_table[p, :n]])


@pytest.mark.parametrize('over,message', [
    ({'matu.kappa': 0}, 'matu.kappa=0 is out of range; valid range: kappa >= 1'),
    ({'matu.eps': 1.5}, 'matu.eps=1.5 is out of range'),
    ({'matu.rho': -0.1}, 'matu.rho=-0.1 is out of range'),
    ({'matu.combine': 'mean'}, "valid choices: 'sum', 'avg'"),
    ({'many.client_tasks': 'digits+shapes;+'}, 'task groups must be non-empty'),
])
def test_matu_bad_input_is_one_line_and_writes_nothing(tmp_path, over, message):
  with pytest.raises(ConfigError) as e:
    train.train_and_evaluate(_matu(**over), str(tmp_path / 'w'))
  assert message in str(e.value) and '\n' not in str(e.value)
  assert not (tmp_path / 'w').exists()


def test_matu_divergence_names_the_pair_and_the_sum_combine(tmp_path):
  from fedjax_mtl.errors import DivergedError
  with pytest.raises(DivergedError) as e:
    train.train_and_evaluate(_matu(**{'optim.lr': 3e38}), str(tmp_path / 'w'))
  msg = str(e.value)
  assert 'round 1: non-finite' in msg and "matu.combine='avg'" in msg and '\n' not in msg
  assert 'client' in msg or 'aggregated' in msg
