"""The engine on real-format data: caches of fake dataset trees, streamed chunks, resume."""

from __future__ import annotations

import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import agreement
from conftest import tiny_config
from fake_datasets import make_nyud, make_pascal
from fedjax_mtl import experiment, local_training, scenarios, sources, train
from fedjax_mtl import rounds as rounds_lib
from fedjax_mtl.engines import dense
from fedjax_mtl.data import cache as cache_lib
from fedjax_mtl.data import real
from fedjax_mtl.data import transforms as T
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.flower import simulate
from fedjax_mtl.report import read_jsonl

P_TRAIN = [f'2008_{i:06d}' for i in range(1, 21)]
N_TRAIN = [f'{i:04d}' for i in range(1, 7)]


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  base = str(tmp_path_factory.mktemp('real'))
  make_pascal(os.path.join(base, 'PASCALContext'), ids=P_TRAIN, num_val=5)
  make_nyud(os.path.join(base, 'NYUDv2'), ids=N_TRAIN)
  for d, raw in real.DATASET_DIRS.items():
    for split in ('train', 'val'):
      cache_lib.prepare(d, os.path.join(base, raw), split,
                        os.path.join(base, 'cache', f'{d}_{split}'), verbose=False)
  return base


def real_config(data_dir, **overrides):
  # Fake images are 40x48 (PASCAL) and 32x40 (NYUD): evaluation pads to these.
  kw = {'data.source': 'real', 'data.data_dir': data_dir,
        'data.resolution': {'pascal': (64, 64), 'nyud': (32, 64)},
        'batch_size': 2, 'eval_batch_size': 2, 'num_rounds': 2,
        **agreement.SGD}  # runs compared across programs train with SGD (agreement.py)
  return tiny_config('hca2', **{**kw, **overrides})


def _params(state):
  return jax.tree.map(np.asarray, [gs.params for gs in state.groups])


@pytest.fixture(scope='module')
def full_run(data_dir, tmp_path_factory):
  """The engine's streamed run of `real_config`: (result, workdir)."""
  wd = tmp_path_factory.mktemp('full')
  return train.train_and_evaluate(real_config(data_dir), str(wd)), wd


def test_real_run_resumes_bitwise_and_reports_every_task(data_dir, full_run, tmp_path):
  cfg = real_config(data_dir)
  full, full_wd = full_run
  rows = [json.loads(l) for l in open(full_wd / 'metrics.jsonl')]
  evals = {(r['client'], r['task']) for r in rows if r['type'] == 'eval' and r['round'] == 2}
  exp = experiment.build(cfg)
  assert evals == {(c.name, t) for c in exp.fed.clients for t in c.tasks}
  assert all(np.isfinite(r['value']) for r in rows if r['type'] == 'eval')
  train_rows = [r for r in rows if r['type'] == 'train']
  assert all(np.isfinite(r['loss']) and r['steps'] > 0 for r in train_rows)
  # Steps per client follow its image count (only images with humans for parts).
  for c in exp.fed.clients:
    steps = {r['steps'] for r in train_rows if r['client'] == c.name}
    assert steps == {c.local_epochs * (c.num_train // cfg.batch_size)}
  # Chunk trainers and the aggregation were traced once each.
  programs = dense.programs(exp)
  assert all(f._cache_size() == 1 for f in programs.chunk_fns + [programs.agg_fn_streamed])
  # Interrupt after round 1, resume with other reader settings: same result.
  part = str(tmp_path / 'part')
  out = train.train_and_evaluate(cfg, part, stop_after=1)
  assert out['interrupted']
  cfg.data.threads = 0
  resumed = train.train_and_evaluate(cfg, part)
  jax.tree.map(np.testing.assert_array_equal, _params(full['state']), _params(resumed['state']))
  assert ([r for r in full['eval']] == [r for r in resumed['eval']])


def test_flower_clients_train_their_own_streamed_rows_as_the_engine(data_dir, full_run, tmp_path):
  # The clients' and the server's message contents, without Flower's transport
  # (simulate.in_process): each client streams the chunks of its own row from its own
  # images; the aggregated rows match the engine's streamed run.
  cfg = real_config(data_dir)
  engine, engine_wd = full_run
  strategy = simulate.in_process(cfg, str(tmp_path / 'flower'))
  exp = experiment.build(cfg)
  roles = exp.algorithm.shared_roles
  want = agreement.model_rows(exp, [gs.params for gs in engine['state'].groups], roles)
  init = agreement.model_rows(exp, [gs.params for gs in experiment.init_state(exp).groups],
                              roles)
  agreement.assert_agree(agreement.flat_views(strategy.views), want, init,
                         exp.fed.num_clients, exp.fed.num_clients + 3)
  rows = read_jsonl(str(tmp_path / 'flower' / 'metrics.jsonl'))
  ref = read_jsonl(str(engine_wd / 'metrics.jsonl'))
  key = lambda r: (r['round'], r['type'], r.get('client'), r.get('task'), r.get('metric'))
  assert sorted(map(key, rows)) == sorted(map(key, ref))
  steps = lambda rs: [r['steps'] for r in sorted(rs, key=key) if r['type'] == 'train']
  assert steps(rows) == steps(ref)


def test_parts_client_keeps_images_with_humans(data_dir):
  cfg = real_config(data_dir)
  exp = experiment.build(cfg)
  flags = np.asarray(cache_lib.read_meta(os.path.join(data_dir, 'cache', 'pascal_train'))
                     ['has_human_parts'], bool)
  parts = [c for c in exp.fed.clients if c.tasks == ('human_parts',)]
  assert parts and all(flags[c.train_indices].all() for c in parts)
  assert all(not flags[np.setdiff1d(c.draw_indices, c.train_indices)].any() for c in parts)
  others = [c for c in exp.fed.clients if c.dataset == 'pascal' and c not in parts]
  assert all(np.array_equal(np.sort(c.draw_indices), c.train_indices) for c in others)


def test_a_process_reads_only_its_rows_of_each_chunk(data_dir):
  # A multi-process run's feed (`TrainChunks.rows`, from distributed.local_rows): the
  # same samples as the one-process chunk's rows, and nothing of the other clients.
  exp = experiment.build(real_config(data_dir))
  chunks = sources.make_source(exp).train_chunks
  rows = [slice(1, 3) if s.num_total > 2 else slice(0, 1) for s in chunks.specs]
  mine = real.TrainChunks(chunks.specs, chunks.sources, 2, chunks.size_of, chunks.seed,
                          chunks.transforms_of, rows=rows)
  seen = set()
  for i in range(chunks.offset(1), chunks.offset(2)):
    full, part = chunks[i], mine[i]
    g = int(full['group'])
    seen.add(g)
    for k in full:
      if k.startswith('x/') or k == 'mask':
        np.testing.assert_array_equal(part[k], full[k][rows[g]], err_msg=k)
      else:
        np.testing.assert_array_equal(part[k], full[k], err_msg=k)
  assert seen == set(range(len(chunks.specs)))


def test_train_chunks_are_deterministic_and_masked(data_dir):
  exp = experiment.build(real_config(data_dir))
  chunks = sources.make_source(exp).train_chunks
  assert len(chunks) == 2 * chunks.per_round
  el = chunks[chunks.offset(1)]
  again = real.TrainChunks(chunks.specs, chunks.sources, 2, chunks.size_of, chunks.seed,
                           chunks.transforms_of)[chunks.offset(1)]
  for k in el:
    np.testing.assert_array_equal(el[k], again[k])
  threaded = list(real.iterate(chunks, chunks.offset(1), threads=2))
  in_workers = list(real.iterate(chunks, chunks.offset(1), workers=2))
  assert len(threaded) == len(in_workers) == chunks.per_round
  for a, b in zip(threaded, in_workers):
    assert set(a) == set(b)
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  for k in el:
    np.testing.assert_array_equal(el[k], threaded[0][k])
  # Rounds differ (new epoch orders and augmentations); shapes and masks agree.
  first = chunks[0]
  assert not np.array_equal(first['x/image'], el['x/image'])
  for g, spec in enumerate(chunks.specs):
    mask = np.concatenate([chunks[i]['mask'] for i in range(chunks.per_round)
                           if chunks.table[i][1] == g], axis=1)
    s_per = spec.steps_per_epoch
    for j in range(spec.num_total):
      want = np.zeros(mask.shape[1], bool)
      if j < len(spec.counts):
        for e in range(spec.epochs):
          want[e * s_per:e * s_per + spec.counts[j] // spec.batch_size] = True
      np.testing.assert_array_equal(mask[j], want)
  # Masked steps carry ignore labels and empty boxes only.
  assert first['x/image'].dtype == np.uint8
  spec0 = chunks.specs[int(first['group'])]
  for key in spec0.keys:
    assert np.all(first[f'x/{key}'][~first['mask']] == 255)
  assert np.all(first['x/box'][~first['mask']] == 0)



def test_feed_workers_fit_their_prefetched_chunks_in_the_memory_budget(data_dir, caplog):
  source = sources.make_source(experiment.build(real_config(data_dir)))
  chunks = source.train_chunks
  # element_bytes is the largest element's size, as the feed writes it.
  sizes = [sum(v.nbytes for k, v in chunks[i].items() if k.startswith('x/'))
           for i in range(chunks.per_round)]
  assert chunks.element_bytes() == max(sizes)
  assert source.capped_workers(4, 0.) == 4  # a quarter of this host's memory holds them
  e = chunks.element_bytes()
  assert real.feed_workers(8, e, 3 * e * 5) == 5
  assert real.feed_workers(8, e, 3 * e * 5 - 1) == 4
  assert real.feed_workers(8, e, 1) == 1  # at least one worker
  assert real.feed_workers(0, e, 1) == 0  # threads stay threads
  with caplog.at_level('WARNING'):
    assert source.capped_workers(4, 3 * 2 * e / 2**30) == 2
  assert 'feed: 4 workers would hold' in caplog.text and 'using 2' in caplog.text

def test_device_normalisation_equals_reference_normalise_then_pad():
  """uint8 canvas + box, normalised on device == host Normalize -> PadToSize."""
  rng = np.random.default_rng(0)
  size = (24, 30)
  samples = [{'image': rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
              'semseg': rng.integers(0, 21, (h, w)).astype(np.uint8),
              'depth': rng.uniform(0, 5, (h, w)).astype(np.float32)}
             for h, w in ((24, 30), (17, 30), (9, 13))]
  fields = real._fields(('semseg', 'depth'), size)
  canvas = {k: np.full((3,) + shape, fill, dtype) for k, (shape, dtype, fill) in fields.items()}
  for b, smp in enumerate(samples):
    real.place(canvas, (b,), T.add_ignore_regions(smp))
  got = np.asarray(local_training.normalize_image(jnp.asarray(canvas['image']),
                                         jnp.asarray(canvas['box'])))
  for b, smp in enumerate(samples):
    want = T.apply_transforms(smp, T.eval_transforms(size))
    np.testing.assert_allclose(got[b], want['image'], rtol=0, atol=2e-6)
    for k in ('semseg', 'depth'):
      np.testing.assert_array_equal(canvas[k][b], want[k])


def test_chunk_trainer_matches_in_memory_trainer():
  """Streaming the in-memory plan chunk by chunk gives the in-memory trainer's result:
  the same steps in another program (a scan over chunks of 3 steps), so under SGD the
  same state to rounding (agreement.py)."""
  cfg = tiny_config('local', **agreement.SGD)
  exp = experiment.build(cfg)
  state = experiment.init_state(exp)
  train_data, _ = sources.device_data(exp)
  g, rnd, key = 0, 2, jax.random.PRNGKey(3)
  spec = exp.fed.groups[g]
  group_trainer = jax.jit(local_training.make_group_trainer(
      spec, exp.models_train[g], exp.tx, cfg.optim, cfg.batch_size, cfg.num_rounds,
      exp.algorithm, exp.labels[g]))
  want, want_m = group_trainer(state.groups[g], train_data[spec.dataset]['train'],
                               jnp.int32(rnd), key)
  # The in-memory plan (same keys as inside the trainer), fed as chunks of 3 steps.
  keys = jax.vmap(lambda c: jax.random.fold_in(key, c))(jnp.arange(spec.num_total))
  idx, mask = jax.vmap(lambda r, c, k: local_training.batch_plan(
      r, c, jax.random.fold_in(k, 0), spec.local_epochs, cfg.batch_size))(
          jnp.asarray(spec.index_table), jnp.asarray(spec.counts), keys)
  idx, mask = np.asarray(idx), np.asarray(mask)
  arrays = exp.data[spec.dataset]['train']
  total = idx.shape[1]
  s_per = total // spec.local_epochs
  chunk_trainer = jax.jit(local_training.make_chunk_trainer(spec, exp.models_train[g], exp.tx,
                                                   cfg.optim, cfg.num_rounds, exp.algorithm,
                                                   exp.labels[g]))
  gs = state.groups[g]
  start = gs.params
  acc = {'loss_sum': jnp.zeros((spec.num_total, spec.num_slots)),
         'steps': jnp.zeros((spec.num_total,), jnp.int32),
         'first_loss': jnp.zeros((spec.num_total,)), 'last_loss': jnp.zeros((spec.num_total,))}
  t_len = 3
  for t0 in range(0, total, t_len):
    steps = np.arange(t0, t0 + t_len)
    valid = steps < total
    steps_c = np.minimum(steps, total - 1)
    chunk = {'x': {k: arrays[k][idx[:, steps_c]] for k in ('image',) + spec.tasks_used},
             'mask': mask[:, steps_c] & valid,
             'epoch': (rnd * spec.local_epochs + steps_c // s_per).astype(np.int32),
             'step': steps.astype(np.int32)}
    gs, acc = chunk_trainer(gs, start, acc, chunk, key, jnp.int32(rnd))
  got_loss = acc['loss_sum'] / jnp.maximum(acc['steps'], 1)[:, None]
  np.testing.assert_array_equal(np.asarray(acc['steps']), np.asarray(want_m['steps']))
  np.testing.assert_allclose(np.asarray(got_loss), np.asarray(want_m['loss']), rtol=1e-5)
  for k in ('first_loss', 'last_loss'):  # FedGA's losses: the same steps either way
    np.testing.assert_allclose(np.asarray(acc[k]), np.asarray(want_m[k]), rtol=1e-5)
  assert np.all(np.asarray(want_m['first_loss'])[:spec.num_real] > 0)
  # Params, batch-norm statistics and the momentum buffers, each client's row against
  # how far the round moved it.
  flat = lambda s: {**agreement.flat_tree('params', s.params),
                    **agreement.flat_tree('batch_stats', s.batch_stats),
                    **agreement.flat_tree('momentum', s.opt_state)}
  print(agreement.assert_within_bound(flat(gs), flat(want), flat(state.groups[g])))
  assert jax.tree.structure(gs) == jax.tree.structure(want)


def test_real_data_errors(data_dir, tmp_path, monkeypatch):
  monkeypatch.delenv(real.ENV_DATA_DIR, raising=False)
  with pytest.raises(ConfigError, match='needs a data dir'):
    experiment.build(real_config(''))
  with pytest.raises(ConfigError, match='does not exist'):
    experiment.build(real_config(str(tmp_path / 'nope')))
  # The environment variable stands in for data.data_dir.
  monkeypatch.setenv(real.ENV_DATA_DIR, data_dir)
  assert real.resolve_data_dir(real_config('')) == data_dir
  empty = tmp_path / 'empty'
  empty.mkdir()
  with pytest.raises(ConfigError, match='prepare_data.py --dataset nyud'):
    experiment.build(real_config(str(empty)))
  with pytest.raises(ConfigError, match='exceed data.resolution'):
    sources.make_source(experiment.build(real_config(data_dir, **{
        'data.resolution': {'pascal': (32, 32), 'nyud': (32, 64)}})))


def _config_module(name):
  spec = importlib.util.spec_from_file_location(
      f'cfg_{name}', os.path.join(os.path.dirname(__file__), '..', 'configs', f'{name}.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


@pytest.mark.parametrize('scenario', sorted(scenarios.LAYOUTS))
def test_paper_configs_for_every_layout(scenario):
  names = sorted(f[:-3] for f in os.listdir(os.path.join(os.path.dirname(__file__), '..',
                                                         'configs')) if f.endswith('.py'))
  # Every algorithm has a paper variant; MaTU's is of the many-task setting and
  # NTKFedAvg's is its own (benchmark A, tests/test_ntk_dense.py, or B).
  assert len(names) == 19 and {'matu', 'ntkfedavg'} <= set(names)
  for name in names:
    if name in ('matu', 'ntkfedavg'):
      continue
    c = _config_module(name).get_config(f'paper,scenario={scenario}')
    assert c.algorithm == {'feddea': 'dea(fedavg)'}.get(name, name)
    assert c.scenario == scenario and c.data.source == 'real'
    assert c.model.encoder == 'swin_t' and c.num_rounds == 100 and c.batch_size == 8
    assert tuple(c.data.resolution['pascal']) == (512, 512)
    assert tuple(c.data.resolution['nyud']) == (448, 576)


def test_ntkfedavg_benchmark_a_on_real_data_logs_evaluation_b(data_dir, tmp_path):
  """configs/ntkfedavg.py on the real-data (streamed) feed: the linearised DeepLab
  clients train, and evaluation B (type eval_linear) is logged beside A."""
  from conftest import override
  from fedjax_mtl import config_doc, report
  c = override(config_doc.load_config('configs/ntkfedavg.py:smoke'), **{
      'data.source': 'real', 'data.data_dir': data_dir, 'tasks': 'semseg,sal',
      'data.resolution': {'pascal': (64, 64)}, 'batch_size': 2, 'eval_batch_size': 2,
      'num_rounds': 1, 'progress': False})
  out = train.train_and_evaluate(c, str(tmp_path / 'wd'))
  rows = report.read_jsonl(str(tmp_path / 'wd' / 'metrics.jsonl'))
  lin = [r for r in rows if r['type'] == 'eval_linear']
  key = lambda r: (r['client'], r['task'], r['metric'])
  assert sorted(map(key, lin)) == sorted(map(key, out['eval'])) and len(lin) == 2
  assert all(np.isfinite(r['value']) for r in lin + out['eval'])
  assert {r['metric'] for r in lin} == {'mIoU'}


def test_evaluate_command_reproduces_the_final_evaluation(data_dir, full_run, tmp_path):
  # `python -m fedjax_mtl.evaluate` on the saved run: the config rebuilt from config.json,
  # the newest checkpoint restored, every client and task (edge by odsF) evaluated
  # without training: the rows the run logged at its final round.
  from fedjax_mtl import evaluate
  _, wd = full_run
  logged = [r for r in read_jsonl(str(wd / 'metrics.jsonl'))
            if r['type'] == 'eval' and r['round'] == 2]
  rows, out = evaluate.evaluate_checkpoint(str(wd), out=str(tmp_path / 'ev'))
  assert out == str(tmp_path / 'ev')
  assert rows == logged and any(r['metric'] == 'odsF' for r in rows)
  assert read_jsonl(os.path.join(out, 'eval.jsonl')) == rows
  table = open(os.path.join(out, 'results.md')).read()
  assert all(r['client'] in table for r in rows)
  # An earlier saved round evaluates too; its rows are round 1's model, not round 2's.
  earlier, _ = evaluate.evaluate_checkpoint(str(wd), round_=1, out=str(tmp_path / 'ev1'))
  assert {r['round'] for r in earlier} == {1} and earlier != rows
  # Bad input: one line, nothing written.
  before = sorted(os.listdir(wd))
  for args, message in (
      ([f'--workdir={wd}', '--round=7'], 'round 7 was not saved'),
      ([f'--workdir={tmp_path / "none"}'], 'holds no run'),
      ([f'--workdir={wd}', '--split=train'], "valid choices: 'test'")):
    with pytest.raises(ConfigError, match=message):
      a = dict(arg[2:].split('=', 1) for arg in args)
      evaluate.evaluate_checkpoint(a['workdir'], int(a.get('round', 0)), a.get('split', 'test'),
                                   str(tmp_path / 'never'))
  assert sorted(os.listdir(wd)) == before and not (tmp_path / 'never').exists()
  # A checkpoint of another config (the run's checkpoints under another scenario's
  # config.json) is refused by the restore, before anything is written.
  other = tmp_path / 'other'
  other.mkdir()
  os.symlink(wd / 'checkpoints', other / 'checkpoints')
  cfg = json.load(open(wd / 'config.json'))
  cfg['tasks'] = 'semseg,depth'
  (other / 'config.json').write_text(json.dumps(cfg))
  (other / 'metrics.jsonl').write_text('')
  with pytest.raises(ConfigError, match='does not match the config'):
    evaluate.evaluate_checkpoint(str(other), out=str(tmp_path / 'never'))
  assert not (tmp_path / 'never').exists()


def test_max_steps_per_round_caps_the_streamed_round(data_dir):
  # Each client stops after `max_steps_per_round` steps: the feed holds only those.
  cfg = real_config(data_dir, max_steps_per_round=1)
  exp = experiment.build(cfg)
  specs = [sources.group_feed_spec(exp, g) for g in exp.fed.groups]
  assert [(s.num_steps, s.num_chunks, s.chunk_steps) for s in specs] == [(1, 1, 1)] * len(specs)
  chunks, _ = sources.streamed_sources(exp)
  assert len(chunks) == cfg.num_rounds * len(specs)
  for i in range(len(chunks)):
    el = chunks[i]
    g = int(el['group'])
    assert el['mask'].shape[1] == 1
    assert el['mask'][:exp.fed.groups[g].num_real].all()
  assert rounds_lib.group_steps(exp) == [1] * len(specs)


def test_participation_and_stragglers_on_the_streamed_feed(data_dir, tmp_path):
  """The streamed feed masks what the in-memory trainers skip: a client that sits a
  round out has no real step (nothing of it is read), a straggler its first
  ⌈share · steps⌉ real steps; a one-round run leaves every part of the clients that
  sat out as it was (FedHCA2 keeps their rows)."""
  from fedjax_mtl import participation
  cfg = real_config(data_dir, participation=0.5, stragglers=0.5, straggler_steps=0.5,
                    num_rounds=1)
  exp = experiment.build(cfg)
  chunks = sources.make_source(exp).train_chunks
  plain = real.TrainChunks(chunks.specs, chunks.sources, 1, chunks.size_of, chunks.seed,
                           chunks.transforms_of)
  shares = participation.Sampler(cfg, exp.fed).step_shares(1)
  assert any((s == 0).any() for s in shares) and any((s == 0.5).any() for s in shares)
  for g, spec in enumerate(chunks.specs):
    idx = [i for i in range(chunks.per_round) if chunks.table[i][1] == g]
    got = np.concatenate([chunks[i]['mask'] for i in idx], axis=1)
    full = np.concatenate([plain[i]['mask'] for i in idx], axis=1)
    for j in range(len(spec.client_ids)):
      keep = int(np.ceil(shares[g][j] * full[j].sum()))
      want = full[j] & (np.cumsum(full[j]) <= keep)  # its first `keep` real steps
      np.testing.assert_array_equal(got[j], want)
  init = jax.device_get(experiment.init_state(exp))
  state = train.train_and_evaluate(cfg, str(tmp_path / 'engine'))['state']
  off = ~participation.Sampler(cfg, exp.fed).mask(1)
  for g, spec in enumerate(exp.fed.groups):
    rows = np.flatnonzero(off[np.asarray(spec.client_ids)])
    for a, b in zip(jax.tree.leaves(jax.device_get(state.groups[g].params)),
                    jax.tree.leaves(init.groups[g].params)):
      np.testing.assert_array_equal(np.asarray(a)[rows], np.asarray(b)[rows])
  # Flower clients stream the same masked chunks (the round's participants only, each
  # straggler its step share from the train message): the same steps, the same rows.
  strategy = simulate.in_process(cfg, str(tmp_path / 'flower'))
  roles = exp.algorithm.shared_roles
  agreement.assert_agree(
      agreement.flat_views(strategy.views),
      agreement.model_rows(exp, [gs.params for gs in state.groups], roles),
      agreement.model_rows(exp, [gs.params for gs in init.groups], roles),
      exp.fed.num_clients, exp.fed.num_clients + 3)
  steps = lambda wd: sorted((r['client'], r['task'], r['steps']) for r in read_jsonl(
      str(tmp_path / wd / 'metrics.jsonl')) if r['type'] == 'train')
  assert steps('flower') == steps('engine')
