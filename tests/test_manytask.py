"""The many-task classification setting (fedjax_mtl/manytask): tables, storage, the
round against the algorithms' definitions, resume, and bad input."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_resumes_bitwise, override
from fedjax_mtl import train
from fedjax_mtl.manytask import allocation
from fedjax_mtl.defaults import base_config
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.manytask import engine, pretrain
from fedjax_mtl.manytask import model as model_lib
from fedjax_mtl.manytask import run as run_lib


def tiny(algorithm='fedavg', **over):
  """4 mini8 tasks at 16x16, 6 clients with overlapping tasks, half of them per round."""
  c = base_config('mini8', algorithm)
  if algorithm == 'fedprox':
    from fedjax_mtl.algorithms.fedprox import default_config
    c.fedprox = default_config()
  c.progress = False
  c.num_rounds = 2
  c.eval_every = 1
  c.batch_size = 8
  c.eval_batch_size = 16
  m = c.many
  m.tasks = 'digits,digits_perm,shapes,colors'
  m.num_clients = 6
  m.zeta_t = 0.5
  m.participation = 0.5
  m.model = 'vit_micro'
  m.resolution = 16
  m.lora_rank = 2
  m.num_train = 48
  m.num_test = 20
  m.pretrained = ''
  return override(c, **over)


@pytest.fixture(scope='module')
def fedavg_run():
  return run_lib.build_run(tiny())


@pytest.fixture(scope='module')
def local_round1():
  """(state, outputs) of round 1 under Local: the slots' trained rows, from the same
  start and data order as every algorithm's round 1 on `tiny()`."""
  return _round1(run_lib.build_run(tiny('local')))


def test_schedule_is_fixed_size_and_lists_every_participant_pair(fedavg_run):
  st = fedavg_run.setting
  m = st.num_pairs
  assert st.schedule.shape == (2, st.num_slots) and (st.schedule == m).any()  # padded
  for r in range(2):
    clients = allocation.sample_participants(6, 0.5, r, 0)
    np.testing.assert_array_equal(st.participants[r], clients)
    want = [i for i, (c, _) in enumerate(st.pairs) if c in clients]
    assert sorted(st.schedule[r][st.schedule[r] < m].tolist()) == want
  # Pairs are the allocation's (client, task) cells, with their sample counts.
  a = st.allocation
  assert [tuple(p) for p in st.pairs] == [(c, t) for c in range(6) for t in a.tasks_of(c)]
  assert st.counts.tolist() == [len(a.indices[c][t]) for c, t in st.pairs]
  assert st.counts.sum() == 4 * 48  # the pairs of a task share its training set


def test_storage_follows_the_algorithm_roles():
  trainable = {'Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/lora_a': 0,
               'Transformer/encoderblock_1/MultiHeadDotProductAttention_1/value/lora_b': 0,
               'head/kernel': 0}
  roles = model_lib.roles(trainable)
  assert list(roles.values()) == ['encoder', 'decoder', 'head']
  from fedjax_mtl import algorithms
  from fedjax_mtl.manytask.run import slot_info
  info = slot_info(run_lib.build_run(tiny()).setting, tiny())
  got = {name: list(engine.storage(algorithms.get_algorithm(name, info, tiny(name)),
                                   roles).values())
         for name in ('fedavg', 'fedprox', 'fedper', 'local')}
  assert got == {'fedavg': ['global', 'global', 'task'], 'fedprox': ['global', 'global', 'task'],
                 'fedper': ['global', 'pair', 'pair'], 'local': ['pair', 'pair', 'pair']}


def init_state_of(run):
  from fedjax_mtl.manytask.run import init_state
  return init_state(run)


def _round1(run):
  from fedjax_mtl.manytask.feed import RoundFeed
  from fedjax_mtl.manytask.run import concat_split, init_state
  images, labels, _ = concat_split(run.data.train)
  state = init_state(run)
  slots = jnp.asarray(run.setting.schedule[0])
  return run.round_fn(state, run.backbone, slots,
                      *RoundFeed(run.setting, images, labels, 'device')(0))


def test_fedavg_round_is_the_weighted_mean_of_the_local_round(fedavg_run, local_round1):
  """Round 1 trains the same slots from the same start under FedAvg and Local, so
  FedAvg's adapters are the examples-weighted mean of Local's trained rows, each
  task's head the mean over that task's slots; padding slots weigh nothing."""
  st = fedavg_run.setting
  slots = st.schedule[0]
  real = slots < st.num_pairs
  w = st.pair_counts[slots].astype(np.float64)
  avg, _ = _round1(fedavg_run)
  loc, out = local_round1
  assert out['real'].tolist() == real.tolist() and (out['steps'][real] > 0).all()
  trained = {k: np.asarray(v)[slots] for k, v in loc.pair_rows.items()}
  for k, v in avg.shared.items():
    want = np.tensordot(w / w.sum(), trained[k].astype(np.float64), axes=(0, 0))
    np.testing.assert_allclose(v, want, rtol=1e-5, atol=1e-6)
  tasks = st.pair_task[slots]
  for k, v in avg.task_rows.items():
    for t in range(st.num_tasks):
      sel = (tasks == t) & real
      if sel.any():
        want = np.tensordot(w[sel] / w[sel].sum(), trained[k][sel].astype(np.float64), (0, 0))
        np.testing.assert_allclose(v[t], want, rtol=1e-5, atol=1e-6)
      else:  # no participant held the task: its head is untouched
        np.testing.assert_array_equal(v[t], fedavg_run.trainable[k])


def test_fedprox_with_mu_zero_is_fedavg(fedavg_run):
  # Two programs (FedProx's adds the proximal term, whose gradient is 0 at mu = 0), so
  # XLA may fuse and round them apart: under SGD the same adapters to rounding
  # (agreement.py), which a proximal term that is not zero exceeds.
  import agreement
  sgd = lambda name, **kw: _round1(run_lib.build_run(tiny(name, **kw, **agreement.SGD)))[0]
  rows = lambda s: {k: np.asarray(v, np.float64)[None] for k, v in s.shared.items()}
  a, b, c = (rows(sgd('fedavg')), rows(sgd('fedprox', **{'fedprox.mu': 0.0})),
             rows(sgd('fedprox', **{'fedprox.mu': 10.0})))
  start = rows(init_state_of(fedavg_run))
  print(agreement.assert_within_bound(b, a, start))
  assert agreement.worst(c, a, start) > 10  # mu = 10: 15x the bound here
  # ... and with mu > 0 the adapters move less from the start.
  dist = lambda s: sum(float(np.sum((s[k] - start[k]) ** 2)) for k in s)
  assert dist(c) < dist(a)


def test_local_steps_mode_and_one_task_per_client():
  run = run_lib.build_run(tiny('local', **{'many.local_epochs': 0, 'many.local_steps': 3,
                                       'many.zeta_t': 0.0, 'many.participation': 1.0}))
  st = run.setting
  assert st.allocation.assignment.sum(1).tolist() == [1] * 6
  assert st.num_slots == 6 and (st.schedule < st.num_pairs).all()
  _, out = _round1(run)
  assert out['steps'].tolist() == [3] * 6


def test_run_writes_results_resumes_and_counts_bits(tmp_path):
  cfg = tiny()
  full, part = assert_resumes_bitwise(cfg, tmp_path)
  rows = [json.loads(line) for line in open(part / 'metrics.jsonl')]
  assert [r['round'] for r in rows if r['type'] == 'agg'] == [1, 2]
  agg = [r for r in rows if r['type'] == 'agg'][0]
  run = run_lib.build_run(cfg)
  adapters = sum(int(np.prod(v.shape)) for k, v in run.trainable.items()
                 if run.roles[k] != 'head')
  d = run.trainable['head/kernel'].shape[0]
  st = run.setting
  pairs = st.schedule[0][st.schedule[0] < st.num_pairs]
  want = [32 * (adapters + (d + 1) * st.num_classes[st.pairs[p][1]]) for p in pairs]
  assert agg['upload_bits'] == sum(want) and agg['bits_per_task'] == pytest.approx(np.mean(want))
  # The comm row: each client's pairs' bytes, nothing from clients that sat out.
  comm = [r for r in rows if r['type'] == 'comm'][0]
  per_client = np.zeros(cfg.many.num_clients)
  for p, w in zip(pairs, want):
    per_client[st.pairs[p][0]] += w / 8
  assert comm['up_bytes'] == comm['down_bytes'] == per_client.tolist()
  assert 0 in comm['up_bytes'] and comm['up_mb'] == pytest.approx(sum(want) / 8e6)
  acc = [r for r in full['eval'] if r['metric'] == 'accuracy']
  assert len(acc) == 4 and all(0 <= r['value'] <= 100 for r in acc)
  table = (part / 'results.md').read_text()
  assert 'digits_perm' in table and 'bits/task' in table
  assert (part / 'curves.png').stat().st_size > 0
  # Wall times apart from the metrics: the compile report of the start (round 0: the
  # interrupted attempt saved no checkpoint, so the second one started afresh and
  # dropped its rows), then each round's seconds.
  timing = [json.loads(line) for line in open(part / 'timing.jsonl')]
  assert [(r['round'], 'compile_s' in r) for r in timing] == [(0, True), (1, False),
                                                              (2, False)]
  assert set(timing[0]['compile_s']) == {'round', 'evaluate'}


def test_run_reports_progress_and_writes_tensorboard_like_a_dense_run(tmp_path, capsys):
  """The one run loop: the many-task setting shows the dense setting's compile report
  and round lines, and writes the same rows to TensorBoard."""
  from test_report import _events
  cfg = tiny(progress=True, tensorboard=True)
  train.train_and_evaluate(cfg, str(tmp_path))
  captured = capsys.readouterr()
  err = captured.out + captured.err
  assert 'compiling 2 programs (round, evaluate)' in err and 'compiled in ' in err
  assert 'round 1/2 ' in err and '| train loss ' in err
  assert ' | eval mean accuracy ' in err
  events = _events(str(tmp_path / 'tensorboard'))
  rows = [json.loads(line) for line in open(tmp_path / 'metrics.jsonl')]
  acc = {(r['round'], r['task']): r['value'] for r in rows
         if r['type'] == 'eval' and r['metric'] == 'accuracy'}
  got = {(step, tag.split('/')[1]): v for tag, step, v in events
         if tag.startswith('eval/') and tag.endswith('/accuracy')}
  assert got == pytest.approx(acc) and len(got) == 8
  assert {tag for tag, _, _ in events if tag.startswith('agg/')} >= {'agg/upload_bits',
                                                                    'agg/bits_per_task'}
  train_tags = {tag for tag, _, _ in events if tag.startswith('train/')}
  assert train_tags == {f"train/{r['client']}/{r['task']}/loss" for r in rows
                        if r['type'] == 'train'}


def test_individual_reference_gives_normalised_accuracy(tmp_path):
  ind = tiny('local', **{'many.num_clients': 4, 'many.zeta_t': 0.0,
                         'many.class_split': 'iid', 'many.participation': 1.0})
  train.train_and_evaluate(ind, str(tmp_path / 'ind'))
  run = run_lib.build_run(ind)
  assert run.setting.counts.tolist() == [48] * 4  # each task's whole training set
  cfg = tiny(**{'many.individual_reference': str(tmp_path / 'ind')})
  train.train_and_evaluate(cfg, str(tmp_path / 'fed'))
  assert 'normalised %' in (tmp_path / 'fed' / 'results.md').read_text()


def test_warmup_backbone_is_cached_and_reused(tmp_path):
  cfg = tiny(**{'many.pretrained': 'warmup', 'many.warmup_steps': 3,
                'many.cache_dir': str(tmp_path)})
  a = run_lib.build_run(cfg)
  path = pretrain.warmup_path(cfg.many)
  assert os.path.exists(path)
  mtime = os.path.getmtime(path)
  b = run_lib.build_run(cfg)
  assert os.path.getmtime(path) == mtime
  jax.tree.map(np.testing.assert_array_equal, a.backbone, b.backbone)
  rand = run_lib.build_run(tiny())
  assert not np.array_equal(a.backbone['embedding']['kernel'], rand.backbone['embedding']['kernel'])


@pytest.mark.parametrize('over,message', [
    ({'algorithm': 'hca2'},
     "valid choices: 'fedavg', 'fedprox', 'fedper', 'local', 'matfl', 'matu'"),
    ({'many.tasks_per_client': 5}, 'tasks per client must be an integer in 1..4'),
    ({'many.tasks_per_client': 2, 'many.client_tasks': 'digits'}, 'give one'),
    ({'many.client_tasks': 'digits+shapes;digits+mnist'}, "many.client_tasks entry 'mnist'"),
    ({'many.client_tasks': 'digits+shapes;colors'}, 'leaves tasks digits_perm to no client'),
    ({'many.tasks': 'digits,mnist'}, "many.tasks entry 'mnist'"),
    ({'many.zeta_t': -1.0}, 'many.zeta_t'),
    ({'many.participation': 0.0}, 'many.participation'),
    ({'many.participation': 1.5}, 'many.participation'),
    ({'many.local_steps': 4}, 'set exactly one of them'),
    ({'many.zeta_t': 0.0, 'many.num_clients': 3}, 'num_clients >= 4'),
    ({'many.pretrained': 'missing.npz'}, 'is not a file'),
    ({'fedavg.weighting': 'uniform'}, "fedavg.weighting='examples'"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, over, message):
  cfg = override(tiny(), **over)
  with pytest.raises(ConfigError) as e:
    train.train_and_evaluate(cfg, str(tmp_path / 'w'))
  assert message in str(e.value) and '\n' not in str(e.value)
  assert not (tmp_path / 'w').exists()


def test_backbone_of_another_model_is_refused(tmp_path):
  from fedjax_mtl.models import vit
  other = model_lib.make_model(tiny(**{'many.model': 'vit_tiny_test'}).many, 10)
  backbone, _ = model_lib.split(jax.device_get(vit.init_params(other, jax.random.PRNGKey(0))))
  path = tmp_path / 'b.npz'
  np.savez(path, **{k: np.asarray(v) for k, v in vit.flatten_params(backbone).items()})
  with pytest.raises(ConfigError, match='does not fit model') as e:
    run_lib.build_run(tiny(**{'many.pretrained': str(path)}))
  assert '\n' not in str(e.value)


def test_a_clip_backbone_loads_only_into_the_activation_it_was_trained_with(tmp_path):
  from fedjax_mtl.manytask import pretrain
  from fedjax_mtl.models import convert_vit, vit
  cfg = tiny(**{'many.model': 'clip_tiny_test', 'many.resolution': 32}).many
  like = vit.init_params(vit.clip_tiny_test(), jax.random.PRNGKey(0))
  gelu = vit.clip_tiny_test(quick_gelu=False)  # exact-GELU weights (OpenCLIP 'ViT-B-32')
  convert_vit.save_npz(jax.device_get(like), tmp_path / 'gelu.npz', model=gelu)
  cfg.pretrained = str(tmp_path / 'gelu.npz')
  with pytest.raises(ConfigError, match=r"activation 'gelu' .* model 'clip_tiny_test' uses "
                     r"'quick_gelu'") as e:
    pretrain.load_backbone(cfg, like)
  assert '\n' not in str(e.value)
  convert_vit.save_npz(jax.device_get(like), tmp_path / 'quick.npz', model='clip_tiny_test')
  cfg.pretrained = str(tmp_path / 'quick.npz')
  assert jax.tree.structure(pretrain.load_backbone(cfg, like)) == jax.tree.structure(like)
  np.savez(tmp_path / 'bare.npz', **vit.flatten_params(jax.device_get(like)))  # nothing recorded
  cfg.pretrained = str(tmp_path / 'bare.npz')
  with pytest.raises(ConfigError, match='does not record the activation'):
    pretrain.load_backbone(cfg, like)


def test_classification_tasks_in_the_task_registry():
  from fedjax_mtl import tasks
  mini = tasks.classification_tasks('mini8')
  from fedjax_mtl.data import mini8
  assert [t.name for t in mini] == list(mini8.TASKS)
  assert [t.num_classes for t in tasks.classification_tasks('tfds8')] == [397, 196, 45, 10, 10,
                                                                          43, 10, 47]
  assert {(t.loss, t.metric) for t in mini} == {('cross_entropy', 'accuracy')}
  with pytest.raises(ConfigError, match="valid choices: 'mini8', 'tfds8'"):
    tasks.classification_tasks('imagenet')


def test_frozen_zero_shot_heads(tmp_path):
  """A CLIP tower with the frozen heads of scripts/zeroshot_heads.py: nothing but the
  adapters trains or is uploaded, and at round 0 (B = 0) the evaluation is the
  zero-shot classifier of the frozen model, exp(scale) * normalize(emb) @ W."""
  from fedjax_mtl.manytask.run import concat_split, init_state
  from fedjax_mtl.data import image_preprocess
  from fedjax_mtl.models import zeroshot
  tasks = ('digits', 'shapes')
  rng = np.random.default_rng(0)
  heads = {'digits': rng.standard_normal((16, 10)), 'shapes': rng.standard_normal((16, 6)),
           'colors': rng.standard_normal((16, 8))}
  path = str(tmp_path / 'heads.npz')
  zeroshot.save_heads(path, heads, logit_scale=np.log(50.))
  cfg = tiny(**{'many.tasks': ','.join(tasks), 'many.model': 'clip_tiny_test',
                'many.resolution': 32, 'many.heads': path})
  run = run_lib.build_run(cfg)
  assert set(run.roles.values()) == {'encoder', 'decoder'}  # no head parameters
  state = init_state(run)
  test = jax.device_put(concat_split(run.data.test))
  right, _ = run.eval_fn(state, run.backbone, jnp.asarray(run.eval_pairs), *test)
  params = model_lib.merge(run.backbone, run.trainable)
  for t, task in enumerate(tasks):
    images, labels = run.data.test[t]
    emb, _ = run.model.apply({'params': params}, image_preprocess.normalize(images, 'clip'))
    emb = np.asarray(emb, np.float64)
    logits = 50. * (emb / np.linalg.norm(emb, axis=1, keepdims=True)) @ heads[task]
    want = int(np.sum(np.argmax(logits, 1) == labels))
    got = np.asarray(right)[run.setting.pairs[run.eval_pairs, 1] == t]
    assert got.tolist() == [want] * len(got)
  _, out = _round1(run)
  assert np.isfinite(out['loss']).all()
  with pytest.raises(ConfigError, match='needs a CLIP tower'):
    run_lib.build_run(override(cfg.copy_and_resolve_references(), **{'many.model': 'vit_micro'}))
  zeroshot.save_heads(path, {'digits': heads['digits']}, logit_scale=0.)
  with pytest.raises(ConfigError, match="no head for shapes"):
    run_lib.build_run(cfg)


@pytest.mark.parametrize('mode', ['hard', 'soft'])
def test_matfl_grouping_ignores_padding_rows(mode):
  """MaT-FL's grouping with invalid rows = the grouping of the valid rows alone;
  an invalid row keeps itself and joins no group."""
  from fedjax_mtl.algorithms import matfl_math as mm
  rng = np.random.default_rng(3)
  rows = {'a': jnp.asarray(rng.standard_normal((7, 5, 3)), jnp.float32),
          'b': jnp.asarray(rng.standard_normal((7, 4)), jnp.float32)}
  valid = np.array([1, 1, 0, 1, 1, 0, 1], bool)
  w, aux = mm.group_weights(rows, mode, 2, 0.0, jnp.asarray(valid))
  sub = jax.tree.map(lambda x: x[valid], rows)
  w_sub, aux_sub = mm.group_weights(sub, mode, 2, 0.0)
  np.testing.assert_allclose(np.asarray(w)[np.ix_(valid, valid)], w_sub, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(w)[~valid], np.eye(7)[~valid])
  np.testing.assert_array_equal(np.asarray(w)[np.ix_(valid, ~valid)], 0.)
  labels = np.asarray(aux['labels'])
  assert (labels[~valid] == -1).all()
  np.testing.assert_array_equal(labels[valid], aux_sub['labels'])


def test_matfl_round_groups_the_pairs_of_the_local_round(local_round1):
  """MaT-FL in the many-task round: every leaf per pair; each real slot's adapters
  become its group's mix of the slots' trained adapters (those of the Local round
  from the same start), the padding slot joins no group."""
  from fedjax_mtl.algorithms import matfl, matfl_math as mm
  cfg = tiny('matfl')
  cfg.matfl = matfl.default_config()
  run = run_lib.build_run(cfg)
  assert set(run.where.values()) == {'pair'}
  st = run.setting
  slots = st.schedule[0]
  real = slots < st.num_pairs
  assert not real.all()  # the test needs a padding slot
  loc, _ = local_round1
  grouped, out = _round1(run)
  enc = [k for k, r in run.roles.items() if r == 'encoder']
  trained = {k: jnp.asarray(np.asarray(loc.pair_rows[k])[slots]) for k in enc}
  w, _ = mm.group_weights(trained, 'hard', 2, 0.0, jnp.asarray(real))
  mixed = mm.mix(w, trained)
  for k in enc:
    np.testing.assert_allclose(np.asarray(grouped.pair_rows[k])[slots[real]],
                               np.asarray(mixed[k])[real], rtol=1e-5, atol=1e-6)
  assert np.asarray(out['agg']['matfl_encoder_labels'])[~real].tolist() == [-1] * (~real).sum()


def test_max_steps_per_round_keeps_each_slots_first_steps():
  # A slot's plan capped at `max_steps` is the first `max_steps` steps of its plan
  # (epochs or fixed steps); the round's program then runs only those.
  row, key = jnp.arange(40, dtype=jnp.int32), jax.random.PRNGKey(3)
  for epochs, steps in ((2, 0), (0, 7)):
    full = engine._plan(row, jnp.int32(37), key, epochs, 5, steps, 8)
    capped = engine._plan(row, jnp.int32(37), key, epochs, 5, steps, 8, max_steps=3)
    for a, b in zip(full, capped):
      np.testing.assert_array_equal(np.asarray(a)[:3], np.asarray(b))
    assert capped[0].shape == (3, 8)


def test_evaluation_skips_the_batches_past_each_tasks_test_split(fedavg_run, local_round1):
  """Tasks with test splits of different sizes: the counts, accuracy and loss do not
  depend on the evaluation batch (batches past a task's split are skipped, a real
  branch), and they are those of the task's own examples only."""
  from fedjax_mtl.manytask.run import concat_split
  run = fedavg_run
  state, _ = local_round1
  keep = [20, 7, 13, 1]  # examples kept per task
  test = [(x[:k], y[:k]) for (x, y), k in zip(run.data.test, keep)]
  pairs = jnp.asarray(run.eval_pairs)
  got = {}
  for batch in (4, 32):  # 5 batches for the largest split, or one for all
    fn = engine.make_eval(run.setting, run.model, np.asarray(keep), batch)
    got[batch] = jax.device_get(fn(state, run.backbone, pairs, *concat_split(test)))
  np.testing.assert_array_equal(got[4][0], got[32][0])
  np.testing.assert_allclose(got[4][1], got[32][1], rtol=1e-5)
  tasks = run.setting.pairs[run.eval_pairs, 1]
  assert (got[4][0] <= np.asarray(keep)[tasks]).all() and got[4][0].max() > 0
  # The 1-example task's loss is that example's: the same as with the other
  # tasks' splits cut to one example too (their extra examples never enter it).
  one = [(x[:1], y[:1]) for x, y in test]
  fn = engine.make_eval(run.setting, run.model, np.ones(4, int), 4)
  right1, loss1 = jax.device_get(fn(state, run.backbone, pairs, *concat_split(one)))
  last = tasks == 3
  np.testing.assert_allclose(loss1[last], got[4][1][last], rtol=1e-5)


def test_slots_trained_k_at_a_time_give_the_vmapped_round(fedavg_run):
  # max_parallel_clients = 2 over the round's slots (an odd count leaves a remainder
  # batch): the same round as every slot in one vmap, up to float reassociation.
  st = fedavg_run.setting
  assert st.num_slots > 2
  batched = run_lib.build_run(tiny(max_parallel_clients=2))
  (a, out_a), (b, out_b) = _round1(fedavg_run), _round1(batched)
  for x, y in zip(jax.tree.leaves((a, out_a)), jax.tree.leaves((b, out_b))):
    np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32),
                               rtol=2e-5, atol=2e-6)
