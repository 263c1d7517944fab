"""The federated engine end to end on the tiny synthetic scenario.

Covers: local training (masked padding steps, per-client task ids, the lr
schedule), gather/scatter of the stacked encoder/decoder views, the local and
fedavg rules inside a jitted round, evaluation, the workdir outputs, bitwise
resumption (the 4-device run: test_multihost.py).
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
import agreement
from fedjax_mtl import experiment, federation, local_training, rounds, sources, train
from fedjax_mtl.engines.dense import DenseEngine
from fedjax_mtl.engines.dense import zero_accs as dense_zero_accs
from fedjax_mtl.report import read_jsonl


def _np(tree):
  return jax.tree.map(np.asarray, jax.device_get(tree))


def _real_views(exp, state):
  """(encoders [N], decoders [K], heads per real client) of a state, as NumPy."""
  params = [gs.params for gs in state.groups]
  enc = experiment.views(exp, params, 'encoder')
  dec = experiment.views(exp, params, 'decoder')
  heads = [{k: jax.tree.map(lambda x, n=g.num_real: x[:n], v)
            for k, v in p.items() if k.startswith('head_')}
           for p, g in zip(params, exp.fed.groups)]
  return _np(enc), _np(dec), _np(heads)


@pytest.fixture(scope='module')
def fedavg_run(tmp_path_factory):
  wd = str(tmp_path_factory.mktemp('fedavg'))
  out = train.train_and_evaluate(tiny_config('fedavg'), wd)
  return wd, out


def test_epoch_lr_matches_timm_cosine_with_warmup():
  class O:
    lr, warmup_lr_init, min_lr, warmup_epochs = 1e-4, 1.25e-7, 1.25e-6, 5
  total = 100

  def ref(t):  # timm CosineLRScheduler(t_initial=total-warm, warmup_prefix=True)
    if t < O.warmup_epochs:
      return O.warmup_lr_init + t * (O.lr - O.warmup_lr_init) / O.warmup_epochs
    tc = t - O.warmup_epochs
    ti = total - O.warmup_epochs
    return O.min_lr + 0.5 * (O.lr - O.min_lr) * (1 + np.cos(np.pi * tc / ti))

  epochs = np.arange(total)
  got = np.asarray(local_training.epoch_lr(jnp.asarray(epochs), O, total))
  # Stepped after each epoch: epoch k trains at the value for t = max(k-1, 0).
  want = np.array([ref(max(k - 1, 0)) for k in epochs])
  np.testing.assert_allclose(got, want, rtol=1e-5)
  assert got[0] == got[1] == pytest.approx(O.warmup_lr_init)


def test_batch_plan_shuffles_each_epoch_and_masks_padding():
  row = jnp.asarray(np.r_[np.arange(10, 20), np.zeros(6, int)])  # 10 real of 16
  idx, mask = local_training.batch_plan(row, jnp.int32(10), jax.random.PRNGKey(0), 2, 4)
  idx, mask = np.asarray(idx), np.asarray(mask)
  assert idx.shape == (8, 4) and mask.tolist() == [1, 1, 0, 0] * 2
  e0, e1 = idx[:2].ravel(), idx[4:6].ravel()
  assert set(e0) <= set(range(10, 20)) and len(set(e0)) == 8
  assert set(e1) <= set(range(10, 20)) and len(set(e1)) == 8
  assert not np.array_equal(e0, e1)
  # The many-task engine keeps the short last batch, filled from the epoch's start:
  # ceil(10 / 4) real steps, the same permutations.
  fidx, fmask = local_training.batch_plan(row, jnp.int32(10), jax.random.PRNGKey(0), 2, 4,
                                 fill_last=True)
  fidx, fmask = np.asarray(fidx), np.asarray(fmask)
  assert fidx.shape == (8, 4) and fmask.tolist() == [1, 1, 1, 0] * 2
  np.testing.assert_array_equal(fidx[:2], idx[:2])
  first = fidx[:3].ravel()
  assert sorted(first[:10]) == list(range(10, 20))
  np.testing.assert_array_equal(first[10:], first[:2])


def test_group_trainer_freezes_padding_steps_and_padding_clients():
  cfg = tiny_config('local')
  exp = experiment.build(cfg)
  state = experiment.init_state(exp)
  train_data, _ = sources.device_data(exp)
  g = 0
  spec = exp.fed.groups[g]
  trainer = jax.jit(local_training.make_group_trainer(spec, exp.models_train[g], exp.tx, cfg.optim,
                                             cfg.batch_size, cfg.num_rounds, exp.algorithm,
                                             exp.labels[g]))
  gstate = jax.tree.map(lambda x: x, state.groups[g])
  before = _np(gstate)
  # Round 3: past the warm-up, so every real step changes the parameters.
  new, metrics = trainer(gstate, train_data[spec.dataset]['train'], jnp.int32(2),
                         jax.random.PRNGKey(1))
  new, metrics = _np(new), _np(metrics)
  want_steps = spec.local_epochs * (spec.counts // cfg.batch_size)
  np.testing.assert_array_equal(metrics['steps'], want_steps)
  # The human_parts client has fewer images, so it ran masked padding steps.
  assert len(set(want_steps[:spec.num_real].tolist())) > 1
  # Adam's step counter counts only real steps.
  counts = [x for x in jax.tree.leaves(new.opt_state) if x.dtype == np.int32]
  np.testing.assert_array_equal(counts[0], want_steps)
  for j in range(spec.num_real):
    for name in ('encoder', 'decoders', 'head_0'):
      a = jax.tree.leaves(before.params[name])
      b = jax.tree.leaves(new.params[name])
      assert any(not np.array_equal(x[j], y[j]) for x, y in zip(a, b)), (j, name)
  # Each client's loss is the loss of its own task (slot 0 holds different tasks).
  assert np.all(np.isfinite(metrics['loss'])) and np.unique(metrics['loss']).size > 1
  # `max_steps_per_round`: every real client stops after that many steps.
  capped = jax.jit(local_training.make_group_trainer(
      spec, exp.models_train[g], exp.tx, cfg.optim, cfg.batch_size, cfg.num_rounds,
      exp.algorithm, exp.labels[g], max_steps=3))
  one, m3 = capped(jax.tree.map(jnp.copy, state.groups[g]), train_data[spec.dataset]['train'],
                   jnp.int32(2), jax.random.PRNGKey(1))
  np.testing.assert_array_equal(_np(m3)['steps'][:spec.num_real], 3)
  counts = [x for x in jax.tree.leaves(_np(one).opt_state) if x.dtype == np.int32]
  np.testing.assert_array_equal(counts[0][:spec.num_real], 3)
  cfg_capped = tiny_config('local', max_steps_per_round=3)
  assert rounds.group_steps(experiment.build(cfg_capped)) == [3] * len(exp.fed.groups)
  # `max_parallel_clients`: the clients in sequential batches of 2 (lax.map) train as
  # the one vmapped step does, up to float reassociation (SGD: Adam's normalisation
  # would turn reassociation noise in near-zero gradients into lr-sized steps).
  sgd = tiny_config('local', **agreement.SGD)
  exp = experiment.build(sgd)
  state = experiment.init_state(exp)
  train_data, _ = sources.device_data(exp)
  runs = []
  for k in (0, 2):
    tr = jax.jit(local_training.make_group_trainer(
        spec, exp.models_train[g], exp.tx, sgd.optim, sgd.batch_size, sgd.num_rounds,
        exp.algorithm, exp.labels[g], max_parallel=k))
    runs.append(_np(tr(jax.tree.map(jnp.copy, state.groups[g]),
                       train_data[spec.dataset]['train'], jnp.int32(2), jax.random.PRNGKey(1))))
  (vm, vm_m), (lm, lm_m) = runs
  np.testing.assert_array_equal(lm_m['steps'], vm_m['steps'])
  np.testing.assert_allclose(lm_m['loss'], vm_m['loss'], rtol=1e-5, atol=1e-6)
  for a, b in zip(jax.tree.leaves(lm.params), jax.tree.leaves(vm.params)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  # The batches write their clients back into the donated group state: XLA's
  # temporaries are the batch's working memory (linear in the batch size), with no
  # second copy of the group's state (the 4c PASCAL group of 20 Swin-T clients holds
  # 6 GiB). Intercept of temp(k) = a + k b: a = 2 temp(1) - temp(2).
  temp = {}
  for k in (1, 2):
    tr = jax.jit(local_training.make_group_trainer(
        spec, exp.models_train[g], exp.tx, sgd.optim, sgd.batch_size, sgd.num_rounds,
        exp.algorithm, exp.labels[g], max_parallel=k), donate_argnums=0)
    compiled = tr.lower(state.groups[g], train_data[spec.dataset]['train'], jnp.int32(2),
                        jax.random.PRNGKey(1)).compile()
    temp[k] = compiled.memory_analysis().temp_size_in_bytes
  group_bytes = sum(x.nbytes for x in jax.tree.leaves(state.groups[g]))
  assert 2 * temp[1] - temp[2] < group_bytes, (temp, group_bytes)


def test_evaluation_in_client_batches_matches_the_vmapped_one():
  """`max_parallel_clients` also bounds the evaluation: the group's clients scored in
  sequential batches give the vmapped scores, and XLA's temporaries shrink with the
  batch (the 4c PASCAL group's evaluation asked for 13.7 GB vmapped, 3.2 GB at 1)."""
  from fedjax_mtl import evaluation
  cfg = tiny_config('hca2')
  exp = experiment.build(cfg)
  state = experiment.init_state(exp)
  _, test = sources.device_data(exp)
  g = max(range(len(exp.fed.groups)), key=lambda i: exp.fed.groups[i].num_total)
  spec = exp.fed.groups[g]
  assert spec.num_total == 4 and evaluation.edge_holders(spec)  # k = 3 leaves a remainder
  params, stats = rounds.eval_variables(exp, state.groups[g])
  outs, temp = {}, {}
  for k in (0, 1, 3):
    ev = jax.jit(evaluation.make_group_evaluator(spec, exp.models_eval[g], edge_probs=True,
                                                 max_parallel=k))
    outs[k] = _np(ev(params, stats, test[spec.dataset]))
    temp[k] = ev.lower(params, stats, test[spec.dataset]).compile().memory_analysis(
        ).temp_size_in_bytes
  for k in (1, 3):
    for a, b in zip(jax.tree.leaves(outs[k]), jax.tree.leaves(outs[0])):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert temp[1] < temp[3] < temp[0], temp


def test_client_loop_keeps_one_copy_of_the_adamw_moments():
  """The streamed chunk trainer at one step per chunk, looping over the clients
  (`max_parallel_clients`): the update of each client's AdamW moments is written
  into the donated group state, with no copy of the group's moments in XLA's
  temporaries (without `map_clients`' barrier and its compile option XLA fused the
  moments' update into both in-place writes and copied every moment: 4.4 GB for
  the 4c PASCAL group of 20 Swin-T clients). Intercept of temp(k) = a + k b."""
  cfg = tiny_config('hca2', max_parallel_clients=1)
  assert cfg.optim.name == 'adamw'
  exp = experiment.build(cfg)
  state = experiment.init_state(exp, abstract=True)
  g = 0
  spec, gs = exp.fed.groups[g], state.groups[g]
  n, arrays = spec.num_total, exp.data[spec.dataset]['train']
  idx = np.zeros((n, 1, cfg.batch_size), np.int32)
  chunk = {'x': {k: arrays[k][idx] for k in ('image',) + spec.tasks_used},
           'mask': np.ones((n, 1), bool), 'epoch': np.zeros((1,), np.int32),
           'step': np.zeros((1,), np.int32)}
  acc = dense_zero_accs(spec, n)
  temp = {}
  for k in (1, 2):
    tr = jax.jit(local_training.make_chunk_trainer(
        spec, exp.models_train[g], exp.tx, cfg.optim, cfg.num_rounds, exp.algorithm,
        exp.labels[g], max_parallel=k), donate_argnums=(0, 2),
        compiler_options=experiment.train_compiler_options(cfg))
    compiled = tr.lower(gs, gs.params, acc, chunk, jax.random.PRNGKey(0), jnp.int32(1)).compile()
    temp[k] = compiled.memory_analysis().temp_size_in_bytes
  moments = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(gs.opt_state))
  assert 2 * temp[1] - temp[2] < moments / 4, (temp, moments)


def test_model_remat_reaches_the_encoder_and_survives_compilation():
  cfg = tiny_config('local', **{'model.remat': True})
  exp = experiment.build(cfg)
  assert exp.encoder.remat
  if jax.default_backend() == 'cpu':
    assert experiment.train_compiler_options(cfg) == {
        'xla_disable_hlo_passes': 'cse_barrier_expander'}
  assert experiment.train_compiler_options(tiny_config('local')) is None
  # `model.kwargs.remat` (which the encoder receives) decides, also for the options.
  via_kwargs = tiny_config('local', **{'model.kwargs': {'depths': (1, 0, 0, 0), 'remat': True}})
  assert (experiment.train_compiler_options(via_kwargs) is not None) == (jax.default_backend() == 'cpu')
  state = experiment.init_state(exp)
  train_data, _ = sources.device_data(exp)
  # The remat barriers are still in the compiled group trainer: the
  # recomputation was not merged back into the forward pass.
  spec = exp.fed.groups[0]
  text = rounds.make_train_fns(exp)[0].lower(
      state.groups[0], state.groups[0].params, train_data[spec.dataset]['train'], state.round,
      state.rng, rounds.num_rounds(exp)).compile().as_text()
  assert 'opt-barrier' in text


def test_gather_scatter_roundtrip_and_layout():
  exp = experiment.build(tiny_config('local'))
  state = experiment.init_state(exp)
  params = [gs.params for gs in state.groups]
  enc = experiment.views(exp, params, 'encoder')
  dec = experiment.views(exp, params, 'decoder')
  n, k = exp.fed.num_clients, exp.fed.num_decoders
  assert n == 5 and k == 4 + 3
  assert all(x.shape[0] == n for x in jax.tree.leaves(enc))
  assert all(x.shape[0] == k for x in jax.tree.leaves(dec))
  # Mark every decoder and encoder with its stacked index and scatter it back.
  enc_m = jax.tree.map(lambda x: jnp.broadcast_to(
      jnp.arange(n, dtype=x.dtype).reshape((n,) + (1,) * (x.ndim - 1)), x.shape), enc)
  dec_m = jax.tree.map(lambda x: jnp.broadcast_to(
      jnp.arange(k, dtype=x.dtype).reshape((k,) + (1,) * (x.ndim - 1)), x.shape), dec)
  out = [federation.merge_view(p, v) for p, v in zip(
      params, federation.scatter_rows(enc_m, exp.fed, 'encoder', [{'encoder': p['encoder']}
                                                                  for p in params]))]
  out = [federation.merge_view(p, v) for p, v in zip(
      out, federation.scatter_rows(dec_m, exp.fed, 'decoder', [{'decoders': p['decoders']}
                                                               for p in out]))]
  mt = exp.fed.groups[1]
  leaf = jax.tree.leaves(out[1]['decoders'])[0]
  # The MT client's 3 decoder slots are decoders 4..6 in client-major order.
  np.testing.assert_array_equal(np.asarray(leaf[0]).reshape(3, -1)[:, 0], [4, 5, 6])
  assert exp.fed.decoder_client == (0, 1, 2, 3, 4, 4, 4) and mt.num_real == 1
  back_e = experiment.views(exp, out, 'encoder')
  back_d = experiment.views(exp, out, 'decoder')
  for a, b in zip(jax.tree.leaves(back_e) + jax.tree.leaves(back_d),
                  jax.tree.leaves(enc_m) + jax.tree.leaves(dec_m)):
    np.testing.assert_array_equal(a, b)


def test_fedavg_round_shares_encoder_and_decoders_but_not_heads(fedavg_run):
  _, out = fedavg_run
  exp = experiment.build(tiny_config('fedavg'))
  enc, dec, heads = _real_views(exp, out['state'])
  for x in jax.tree.leaves(enc) + jax.tree.leaves(dec):
    np.testing.assert_allclose(x, np.broadcast_to(x.mean(0), x.shape), rtol=1e-6, atol=1e-7)
  h = jax.tree.leaves(heads[0]['head_0'])[0]
  assert not np.allclose(h[0], h[1])
  # Batch-norm statistics stay local: they differ between clients.
  bs = jax.tree.leaves(_np(out['state'].groups[0].batch_stats))[0]
  assert not np.allclose(bs[0], bs[1])


def test_fedavg_aggregation_is_the_uniform_mean_of_local_models():
  exp = experiment.build(tiny_config('fedavg'))
  state = experiment.init_state(exp)
  engine = DenseEngine(exp)
  engine.open(0)
  train_data = engine.source.train
  cfg = exp.config
  trained = []
  for g, spec in enumerate(exp.fed.groups):
    tr = jax.jit(local_training.make_group_trainer(spec, exp.models_train[g], exp.tx, cfg.optim,
                                          cfg.batch_size, cfg.num_rounds, exp.algorithm,
                                          exp.labels[g]))
    key = jax.random.fold_in(jax.random.fold_in(state.rng, 0), g)
    trained.append(tr(state.groups[g], train_data[spec.dataset]['train'],
                      jnp.int32(0), key)[0].params)
  enc_local = _np(experiment.views(exp, trained, 'encoder'))
  dec_local = _np(experiment.views(exp, trained, 'decoder'))
  new_state, _ = engine.run_round(state, 1)
  enc, dec, _ = _real_views(exp, new_state)
  for got, loc in zip(jax.tree.leaves(enc) + jax.tree.leaves(dec),
                      jax.tree.leaves(enc_local) + jax.tree.leaves(dec_local)):
    np.testing.assert_allclose(got[0], loc.astype(np.float64).mean(0), rtol=2e-5, atol=1e-6)


def test_local_rule_keeps_every_client_its_own_model():
  exp = experiment.build(tiny_config('local'))
  state = experiment.init_state(exp)
  engine = DenseEngine(exp)
  engine.open(0)
  state, _ = engine.run_round(state, 1)
  state, _ = engine.run_round(state, 2)
  enc, dec, _ = _real_views(exp, state)
  for x in jax.tree.leaves(enc):
    assert len({x[i].tobytes() for i in range(x.shape[0])}) == x.shape[0]


def test_workdir_outputs(fedavg_run):
  wd, out = fedavg_run
  cfg = tiny_config('fedavg')
  assert json.load(open(os.path.join(wd, 'config.json')))['algorithm'] == 'fedavg'
  rows = read_jsonl(os.path.join(wd, 'metrics.jsonl'))
  train_rows = [r for r in rows if r['type'] == 'train']
  eval_rows = [r for r in rows if r['type'] == 'eval']
  # One train row per (round, client, task): 4 ST + 3 MT tasks.
  assert len(train_rows) == cfg.num_rounds * 7
  assert sorted({r['round'] for r in eval_rows}) == [2, 3]
  metrics = {(r['task'], r['metric']) for r in eval_rows}
  assert {('semseg', 'mIoU'), ('human_parts', 'mIoU'), ('sal', 'maxF'),
          ('depth', 'RMSE'), ('edge', 'odsF')} <= metrics
  assert all(0 <= r['value'] <= 100 for r in eval_rows if r['metric'] == 'odsF')
  assert all(np.isfinite(r['value']) for r in eval_rows)
  md = open(os.path.join(wd, 'results.md')).read()
  csv = open(os.path.join(wd, 'results.csv')).read().splitlines()
  assert md.startswith('| method |') and 'nyud_mt_mt_0/depth RMSE' in md
  assert len(csv) == 2 and csv[1].startswith('fedavg,') and len(csv[1].split(',')) == 9 and csv[0].endswith(',delta_m')
  assert out['eval'] == [r for r in eval_rows if r['round'] == 3]
  assert os.path.getsize(os.path.join(wd, 'curves.png')) > 5000


def test_resume_is_bitwise_identical_also_past_a_corrupt_newest_checkpoint(
    fedavg_run, tmp_path, capsys):
  wd_full, full = fedavg_run
  cfg = tiny_config('fedavg')
  wd = str(tmp_path / 'resumed')
  part = train.train_and_evaluate(cfg, wd, stop_after=2)
  assert part['interrupted']
  # The newest step (2) loses data: the run says so and resumes from step 1.
  step2 = os.path.join(wd, 'checkpoints', '2')
  files = [os.path.join(r, f) for r, _, fs in os.walk(step2) for f in fs]
  largest = max(files, key=os.path.getsize)
  with open(largest, 'r+b') as f:
    f.truncate(os.path.getsize(largest) // 2)
  capsys.readouterr()
  resumed = train.train_and_evaluate(cfg, wd)
  err = capsys.readouterr().err
  assert f'checkpoint {step2} is unreadable (' in err and 'resuming from step 1' in err
  assert os.path.isdir(step2 + '.unreadable')
  for a, b in zip(jax.tree.leaves(_np(full['state'])), jax.tree.leaves(_np(resumed['state']))):
    np.testing.assert_array_equal(a, b)
  strip = lambda rows: [{k: v for k, v in r.items()} for r in rows]
  assert strip(read_jsonl(os.path.join(wd, 'metrics.jsonl'))) == strip(
      read_jsonl(os.path.join(wd_full, 'metrics.jsonl')))
  assert open(os.path.join(wd, 'results.csv')).read() == open(
      os.path.join(wd_full, 'results.csv')).read()


def test_edge_odsf_is_scored_on_each_edge_clients_own_predictions(fedavg_run):
  from fedjax_mtl.metrics.edge import EdgeODSAccumulator
  from fedjax_mtl import tasks
  _, out = fedavg_run
  exp = experiment.build(tiny_config('fedavg'))
  g = 1  # the NYUD-like multi-task client: edge is one of its slots
  spec = exp.fed.groups[g]
  test = exp.data[spec.dataset]['test']
  gs = out['state'].groups[g]
  outs = exp.models_eval[g].apply(
      {'params': jax.tree.map(lambda x: x[0], gs.params),
       'batch_stats': jax.tree.map(lambda x: x[0], gs.batch_stats)},
      local_training.normalize_image(jnp.asarray(test['image'])))
  slot = exp.fed.clients[spec.client_ids[0]].tasks.index('edge')
  prob = np.asarray(jax.nn.sigmoid(outs[slot][..., 0]))
  acc = EdgeODSAccumulator(max_dist=tasks.DATASETS[spec.dataset].edge_max_dist)
  acc.update(prob, test['edge'], valid_mask=test['edge'] != 255)
  row = [r for r in out['eval'] if r['client'] == exp.fed.clients[spec.client_ids[0]].name
         and r['task'] == 'edge'][0]
  assert row['metric'] == 'odsF'
  np.testing.assert_allclose(row['value'], 100 * acc.finalize()['odsF'], rtol=1e-6)


def test_pretrained_encoder_is_every_clients_round_zero_encoder(tmp_path, monkeypatch):
  """`model.pretrained_path`: the loader gets one client's encoder shapes and its weights
  become every client's round-0 encoder (decoders stay freshly initialised)."""
  path = tmp_path / 'w.npz'
  path.write_bytes(b'')
  seen = {}

  def fake_loader(p, encoder, like):
    seen['path'], seen['like'] = p, like
    return {'params': jax.tree.map(lambda s: jnp.full(s.shape, 0.5, s.dtype), like['params'])}

  monkeypatch.setattr(experiment, 'load_pretrained_encoder', fake_loader)
  exp = experiment.build(tiny_config('fedavg', **{'model.pretrained_path': str(path)}))
  state = experiment.init_state(exp)
  plain = experiment.init_state(experiment.build(tiny_config('fedavg')))
  assert seen['path'] == str(path)
  enc = _np(experiment.views(exp, [g.params for g in state.groups], 'encoder'))
  for leaf, like in zip(jax.tree.leaves(enc), jax.tree.leaves(seen['like']['params'])):
    assert leaf.shape == (exp.fed.num_clients,) + like.shape
    np.testing.assert_array_equal(leaf, 0.5)
  dec = lambda s: _np(experiment.views(exp, [g.params for g in s.groups], 'decoder'))
  jax.tree.map(np.testing.assert_array_equal, dec(state), dec(plain))
