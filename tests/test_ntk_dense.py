"""NTKFedAvg's benchmark A in the dense engine (spec §1.2, §2.6): DeepLab heads on a
dilated ResNet, the linearised client with batch norm in inference mode, MaT-FL's
optimiser, the averaged batch-norm statistics of its FedAvg, and MaT-FL's metrics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import override
from fedjax_mtl import config_doc, experiment, local_training, report, rounds, train
from fedjax_mtl.engines import dense as dense_engine
from fedjax_mtl.algorithms import base
from fedjax_mtl.metrics import dense
from fedjax_mtl.models import deeplab, resnet
from fedjax_mtl.tasks import IGNORE


def _smoke(**kw):
  c = config_doc.load_config('configs/ntkfedavg.py:smoke')
  c.progress = False
  c.tasks = 'semseg,sal'
  return override(c, **kw)


def test_torch_amsgrad_with_l2_decay_matches_a_numpy_reference():
  """`optim.name='adam_amsgrad'` is torch.optim.Adam(amsgrad=True, weight_decay=wd):
  wd·p added to the gradient, the running max of the raw second moment, bias
  corrections after the max."""
  cfg = _smoke().optim
  tx = local_training.make_optimizer(cfg)
  lr, wd, b1, b2, eps = 1e-2, cfg.weight_decay, cfg.b1, cfg.b2, cfg.eps
  rng = np.random.default_rng(0)
  p = rng.normal(size=5).astype(np.float32)
  grads = [rng.normal(size=5).astype(np.float32) * s for s in (3., .1, .1, 2., .01)]
  m = v = vmax = np.zeros(5)
  ref = p.astype(np.float64)
  params, state = jnp.asarray(p), tx.init(jnp.asarray(p))
  for t, g in enumerate(grads, 1):
    gt = g + wd * ref
    m = b1 * m + (1 - b1) * gt
    v = b2 * v + (1 - b2) * gt * gt
    vmax = np.maximum(vmax, v)
    ref = ref - lr / (1 - b1**t) * m / (np.sqrt(vmax) / np.sqrt(1 - b2**t) + eps)
    upd, state = tx.update(jnp.asarray(g), state, params)
    params = params - lr * upd
  np.testing.assert_allclose(np.asarray(params), ref, rtol=1e-5, atol=1e-6)


def test_round_decay_schedule_and_the_fresh_optimizer_each_round():
  cfg = _smoke().optim
  lrs = local_training.step_lrs(jnp.zeros(4, jnp.int32), jnp.asarray(3), cfg, 10)
  np.testing.assert_allclose(np.asarray(lrs), cfg.lr * 0.99**3, rtol=1e-6)
  tx = local_training.make_optimizer(cfg)
  params = {'w': jnp.ones((2, 3))}
  used = jax.vmap(lambda p: tx.update(p, tx.init(p), p)[1])(params)
  fresh = local_training.fresh_opt_state(tx, cfg, used, params)
  assert all(float(jnp.abs(x).sum()) == 0 for x in jax.tree.leaves(fresh))
  cfg.reset_each_round = False
  assert local_training.fresh_opt_state(tx, cfg, used, params) is used


def test_saliency_miou_is_the_best_threshold_of_the_per_image_jaccard():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(3, 6, 5, 2)).astype(np.float32)
  labels = (rng.random((3, 6, 5)) < .4).astype(np.uint8)
  labels[0, :2] = IGNORE
  labels[2] = IGNORE  # a padding image: no valid pixel, not counted
  st = jax.device_get(dense.task_stats('sal', jnp.asarray(logits), jnp.asarray(labels), 2,
                                       'mIoU'))
  prob = np.exp(logits[..., 1]) / np.exp(logits).sum(-1)
  per = []
  for t in np.linspace(0.2, 0.9, 15):
    js = []
    for i in range(2):
      valid = labels[i] != IGNORE
      pred, gt = (prob[i] >= t) & valid, (labels[i] == 1) & valid
      union = (pred | gt).sum()
      js.append((pred & gt).sum() / union if union else 1.)
    per.append(np.mean(js))
  assert st['images'] == 2
  assert dense.finalize('sal', st) == pytest.approx(100 * max(per), rel=1e-6)
  # FedHCA2's protocol is unchanged.
  assert 'tp' in dense.task_stats('sal', jnp.asarray(logits), jnp.asarray(labels), 2)


def test_parts_miou_skips_images_without_parts():
  """Images without people carry only ignore labels (the datasets' AddIgnoreRegions),
  so they add nothing to the pooled confusion: MaT-FL's skipping of such images."""
  rng = np.random.default_rng(2)
  logits = jnp.asarray(rng.normal(size=(2, 4, 4, 7)).astype(np.float32))
  labels = rng.integers(0, 7, (2, 4, 4)).astype(np.uint8)
  with_empty = labels.copy()
  with_empty[1] = IGNORE
  one = dense.task_stats('human_parts', logits[:1], jnp.asarray(labels[:1]), 7)
  two = dense.task_stats('human_parts', logits, jnp.asarray(with_empty), 7)
  np.testing.assert_array_equal(one['confusion'], two['confusion'])


def test_linearised_dense_forward_at_its_point_is_the_inference_model():
  """f_lin(x; c) = f(x; c), with batch norm on the running statistics, and the output is
  affine in the backbone: f_lin(c + 2δ) − f_lin(c) = 2 (f_lin(c + δ) − f_lin(c))."""
  net = deeplab.DeepLabNet(resnet.resnet18_os8(width=4), (3,), train=False, head_width=8)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 32, 32, 3))
  v = net.init(jax.random.PRNGKey(1), x)
  stats = jax.tree.map(lambda s: s * 1.5, v['batch_stats'])  # not the init statistics
  apply = lambda p, bs, img, key: net.apply({'params': p, 'batch_stats': bs}, img)
  c = v['params']
  plain = jax.jit(apply, static_argnums=3)(c, stats, x, None)
  lin = jax.jit(lambda p: base.linearized_forward(apply, p, c, stats, x, None))
  np.testing.assert_allclose(lin(c)[0], plain[0], rtol=1e-5, atol=1e-5)
  delta = jax.tree.map(lambda a: 1e-2 * a, c)
  move = lambda a: {k: (jax.tree.map(lambda u, d: u + a * d, c[k], delta[k])
                        if k == 'encoder' else c[k]) for k in c}
  d1 = lin(move(1.))[0] - lin(c)[0]
  d2 = lin(move(2.))[0] - lin(c)[0]
  np.testing.assert_allclose(d2, 2 * d1, rtol=1e-3, atol=1e-5)
  assert float(jnp.abs(d1).max()) > 0


def test_fedavg_of_benchmark_a_averages_the_encoder_statistics():
  exp = experiment.build(_smoke(**{'ntkfedavg.linearize': False}))
  prog = dense_engine.programs(exp).stats_fn
  assert prog is not None
  stats = []
  offset = 0
  for g in exp.fed.groups:
    shapes = jax.eval_shape(lambda m=exp.models_train[0]: m.init(
        jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3))))['batch_stats']
    ids = jnp.arange(g.num_total, dtype=jnp.float32) + offset
    offset += g.num_real
    stats.append(jax.tree.map(
        lambda s: ids.reshape((-1,) + (1,) * len(s.shape)) * jnp.ones(s.shape), shapes))
  before = jax.device_get(stats)
  out = jax.device_get(prog(stats))
  mean = (exp.fed.num_clients - 1) / 2  # the ids of the real clients 0..N-1
  for g, b, o in zip(exp.fed.groups, before, out):
    for leaf in jax.tree.leaves(o['encoder']):
      np.testing.assert_allclose(leaf, mean, rtol=1e-6)
    jax.tree.map(np.testing.assert_array_equal, o['head_0'], b['head_0'])  # heads keep theirs
  # The linearised clients keep every client's statistics; no program at all.
  assert dense_engine.programs(experiment.build(_smoke())).stats_fn is None


def test_ntkfedavg_dense_round(tmp_path):
  """One round of benchmark A: the encoder is one shared model again, the frozen heads
  and every batch-norm statistic are where they started, the saliency metric is
  MaT-FL's mIoU."""
  cfg = _smoke(num_rounds=1, eval_every=1)
  exp = experiment.build(cfg)
  init = jax.device_get(experiment.init_state(exp))
  out = train.train_and_evaluate(cfg, str(tmp_path / 'wd'))
  st = jax.device_get(out['state'])
  enc = experiment.views(exp, [g.params for g in st.groups], 'encoder')
  assert all(np.allclose(x, x[:1]) for x in jax.tree.leaves(enc))
  enc0 = experiment.views(exp, [g.params for g in init.groups], 'encoder')
  assert not all(np.allclose(a, b) for a, b in zip(jax.tree.leaves(enc), jax.tree.leaves(enc0)))
  for g0, g1 in zip(init.groups, st.groups):
    jax.tree.map(np.testing.assert_array_equal, g1.params['head_0'], g0.params['head_0'])
    jax.tree.map(np.testing.assert_array_equal, g1.batch_stats, g0.batch_stats)
  metrics = {(r['task'], r['metric']) for r in out['eval']}
  assert metrics == {('semseg', 'mIoU'), ('sal', 'mIoU')}
  assert all(np.isfinite(r['value']) for r in out['eval'])
  # Evaluation B (the linear model around each client's round-start backbone, which
  # its client part keeps) is logged beside A; at its own point it is model A.
  rows = report.read_jsonl(str(tmp_path / 'wd' / 'metrics.jsonl'))
  lin = [r for r in rows if r['type'] == 'eval_linear']
  assert {(r['client'], r['task'], r['metric']) for r in lin} == {
      (r['client'], r['task'], r['metric']) for r in out['eval']}
  assert all(np.isfinite(r['value']) for r in lin)
  state = out['state']
  at_point = state.replace(groups=[g.replace(client={'point': {
      k: v for k, v in g.params.items() if not k.startswith('head_')}}) for g in state.groups])
  engine = dense_engine.DenseEngine(exp)
  engine.open(0)
  a, _ = engine.eval_outputs(at_point)
  b, _ = engine.eval_outputs(at_point, linear=True)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5), a, b)
  b_trained, _ = engine.eval_outputs(state, linear=True)
  assert not all(np.allclose(x, y) for x, y in zip(jax.tree.leaves(b), jax.tree.leaves(b_trained)))


def test_table1_script_takes_the_max_over_rounds_of_the_task_mean(tmp_path, monkeypatch, capsys):
  import json
  import os
  import sys
  monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))), 'scripts'))
  import ntk_table1
  specs = ntk_table1.run_specs(['fedavg', 'ntkfedavg', 'dgagg'], ['1', '2'],
                               ['standard', 'local'], '', 'num_rounds=2')
  names = [s.split('=')[0] for s in specs]
  assert len(specs) == 10 and 'dgagg_1c_standard' not in names and 'dgagg_2c_local' in names
  assert specs[0] == ('fedavg_1c_standard=configs/ntkfedavg.py:clients_per_task=1,'
                      'work=standard ntkfedavg.linearize=false num_rounds=2')
  wd = tmp_path / 'run'
  wd.mkdir()
  rows = [  # two semseg clients per task: averaged per round, then the max over rounds
      (1, 'semseg', 'mIoU', 10.), (1, 'semseg', 'mIoU', 20.), (2, 'semseg', 'mIoU', 12.),
      (2, 'semseg', 'mIoU', 14.), (1, 'sal', 'mIoU', 40.), (2, 'sal', 'mIoU', 30.),
      (1, 'human_parts', 'mIoU', 5.), (2, 'human_parts', 'mIoU', 6.), (2, 'edge', 'loss', .1)]
  (wd / 'metrics.jsonl').write_text('\n'.join(json.dumps(
      {'round': r, 'type': 'eval', 'task': t, 'metric': m, 'value': v, 'client': 'c'})
      for r, t, m, v in rows) + '\n')
  c = ntk_table1.curves(str(wd))
  assert c['semseg'] == {1: 15., 2: 13.} and 'edge' not in c
  md, csv = ntk_table1.table({'ntkfedavg_2c_local': [c]})
  assert '| 2 | Local Work | ntkfedavg | 15.00 | 40.00 | 6.00 | 20.33 | 1 |' in md
  with pytest.raises(SystemExit):
    ntk_table1.main(['--out', str(tmp_path / 'out'), '--methods=fedfoo'])
  assert "unknown --methods value 'fedfoo'" in capsys.readouterr().err
  assert not (tmp_path / 'out').exists()


def test_ntkfedprox_adds_the_proximal_term_on_the_backbone_only():
  from fedjax_mtl.errors import ConfigError
  exp = experiment.build(_smoke(**{'ntkfedavg.mu': 1.0}))
  client = exp.algorithm.client
  assert client.forward is base.linearized_forward and client.loss is not None
  labels = exp.labels[0]
  params = jax.tree.map(lambda x: jnp.ones(x.shape[1:]),
                        experiment.init_state(exp, abstract=True).groups[0].params)
  start = jax.tree.map(jnp.zeros_like, params)
  ctx = base.ClientCtx(params=params, start=start, state=(), server_rows={}, labels=labels,
                       batch={})
  n_enc = sum(x.size for x in jax.tree.leaves(params['encoder']))
  assert float(client.loss(ctx)) == pytest.approx(0.5 * n_enc)  # heads are not pulled
  assert experiment.build(_smoke()).algorithm.client.loss is None
  from fedjax_mtl import validate  # the declared range: refused before anything is built
  with pytest.raises(ConfigError, match='ntkfedavg.mu=-1.0 is out of range'):
    validate.check_config(_smoke(**{'ntkfedavg.mu': -1.0}))


@pytest.mark.parametrize('field, value, message', [
    ('algorithm', 'hca2', "algorithm 'hca2' aggregates FedHCA2's task decoders"),
    ('ntkfedavg.negate', '9', 'ntkfedavg.negate names client 9, but the scenario has 2 clients'),
    ('ntkfedavg.point', 'pretrained', "ntkfedavg.point='pretrained' runs in the many-task"),
    ('ntkfedavg.point', 'middle', "unknown ntkfedavg.point 'middle'; valid choices: 'server'"),
    ('ntkfedavg.server_lr', 0., 'ntkfedavg.server_lr=0.0 is out of range'),
])
def test_bad_input_of_benchmark_a_is_refused_before_anything_is_written(tmp_path, field, value,
                                                                         message):
  from fedjax_mtl.errors import ConfigError
  wd = tmp_path / 'wd'
  with pytest.raises(ConfigError, match=message.replace('(', r'\(')):
    train.train_and_evaluate(_smoke(**{field: value}), str(wd))
  assert not wd.exists()
