"""NTKFedAvg's linearised client forward and its server (NTKFedAvg spec §2, §8):
at θ = c the linearised output is the model's; it is exactly affine in θ; its
gradient at c is the model's; the server is c + α · the uniform mean of the
(sign-flipped) task vectors; FedAvg and NTKFedAvg differ only in the forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import override
from fedjax_mtl.algorithms import base, ntkfedavg
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.manytask import model as model_lib
from fedjax_mtl.manytask import run as run_lib
from test_manytask import _round1, tiny


@pytest.fixture(scope='module')
def vit():
  run = run_lib.build_run(tiny())
  forward = model_lib.make_forward(run.model, np.asarray(run.setting.num_classes))
  images = jnp.asarray(run.data.train[0][0][:6])
  apply = lambda p, bs, x, key: forward(run.backbone, p, x, 0)
  key = jax.random.PRNGKey(3)
  c = {k: v + 0.05 * jax.random.normal(jax.random.fold_in(key, i), v.shape)
       for i, (k, v) in enumerate(sorted(run.trainable.items()))}
  return apply, c, images


def _dir(c, seed, heads=True):
  """A random direction over the params (zero on the heads with heads=False)."""
  return {k: (0.05 if heads or not base.is_head_key(k) else 0.)
          * jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(seed), i), v.shape)
          for i, (k, v) in enumerate(sorted(c.items()))}


def test_linearised_forward_at_c_is_the_model_and_affine(vit):
  apply, c, x = vit
  lin = jax.jit(lambda p: base.linearized_forward(apply, p, c, None, x, None))
  plain = apply(c, None, x, None)
  np.testing.assert_allclose(lin(c), plain, rtol=1e-5, atol=1e-5)
  # Affine in the backbone (the heads stay non-linear, spec §2.6).
  d1, d2 = _dir(c, 1, heads=False), _dir(c, 2, heads=False)
  at = lambda a, b: lin(jax.tree.map(lambda c0, u, v: c0 + a * u + b * v, c, d1, d2))
  f0, f1, f2 = at(0., 0.), at(1., 0.), at(0., 1.)
  # Exactly affine: f(c + a d1 + b d2) = f(c) + a (f(c+d1) - f(c)) + b (f(c+d2) - f(c)).
  keep = plain > -1e8  # the task's own classes (the others are masked constants)
  want = f0 + 2.5 * (f1 - f0) - 1.5 * (f2 - f0)
  np.testing.assert_allclose(np.asarray(at(2.5, -1.5))[keep], np.asarray(want)[keep],
                             rtol=1e-4, atol=1e-4)
  # The heads enter as they are: moving only them gives the model itself at (c_b, θ_h).
  h = jax.tree.map(lambda c0, u, v: c0 + u - v, c, _dir(c, 3), _dir(c, 3, heads=False))
  np.testing.assert_allclose(lin(h), apply(h, None, x, None), rtol=1e-5, atol=1e-5)
  # ... while the model itself is not affine along the same line.
  g = lambda a, b: apply(jax.tree.map(lambda c0, u, v: c0 + a * u + b * v, c, d1, d2), None, x,
                         None)
  gw = g(0., 0.) + 2.5 * (g(1., 0.) - g(0., 0.)) - 1.5 * (g(0., 1.) - g(0., 0.))
  assert np.abs(np.asarray(g(2.5, -1.5) - gw)[keep]).max() > 1e-4


def test_one_round_from_theta0_is_averaged_linearised_task_addition(vit):
  """Invariant (iv) of spec §8: one round linearised at θ_0 gives the server model
  θ_0 + α·(1/K)Σ τ_k (`server`), and the linear model there is the average of the K
  linearised task additions θ_0 + α·τ_k: f(θ_0) + α J(1/K)Σ τ_k."""
  apply, c, x = vit
  lin = jax.jit(lambda p: base.linearized_forward(apply, p, c, None, x, None))
  taus = [_dir(c, 10 + k, heads=False) for k in range(3)]
  alpha = 0.7
  prev = jax.tree.map(lambda a: jnp.stack([a] * 3), c)
  local = jax.tree.map(lambda a, *t: jnp.stack([a + u for u in t]), c, *taus)
  x_in = base.ServerInputs(prev={'encoder': prev}, local={'encoder': local},
                           num_examples=jnp.ones(3), num_steps=jnp.ones(3, jnp.int32),
                           client_ids=jnp.arange(3), round=jnp.int32(0))
  new, _, _ = ntkfedavg.server(alpha, ()).apply(base.ServerState(), x_in)
  theta1 = jax.tree.map(lambda r: r[0], new['encoder'])
  keep = apply(c, None, x, None) > -1e8
  added = np.mean([np.asarray(lin(jax.tree.map(lambda a, u: a + alpha * u, c, t)))
                   for t in taus], 0)
  np.testing.assert_allclose(np.asarray(lin(theta1))[keep], added[keep], rtol=1e-4, atol=1e-4)


def test_linearised_gradient_at_c_is_the_models(vit):
  apply, c, x = vit
  labels = jnp.arange(x.shape[0]) % 4
  loss = lambda logits: model_lib.cross_entropy(logits, labels)
  g_lin = jax.grad(lambda p: loss(base.linearized_forward(apply, p, c, None, x, None)))(c)
  g = jax.grad(lambda p: loss(apply(p, None, x, None)))(c)
  for k in g:
    np.testing.assert_allclose(g_lin[k], g[k], rtol=1e-4, atol=1e-6)


def test_server_is_start_plus_alpha_mean_of_signed_task_vectors():
  rng = np.random.default_rng(0)
  start = rng.standard_normal((3, 2)).astype(np.float32)
  prev = np.broadcast_to(start, (5, 3, 2))
  local = prev + rng.standard_normal((5, 3, 2)).astype(np.float32)
  clients = np.array([0, 0, 1, 2, -1], np.int32)  # two pairs of client 0, a padding row
  valid = clients >= 0
  x = base.ServerInputs(prev={'encoder': {'w': jnp.asarray(prev)}},
                        local={'encoder': {'w': jnp.asarray(local)}},
                        num_examples=jnp.ones(5), num_steps=jnp.ones(5, jnp.int32),
                        client_ids=jnp.asarray(clients), round=jnp.int32(0),
                        row_valid=jnp.asarray(valid))
  out, state, logs = ntkfedavg.server(0.5, (1,)).apply(base.ServerState(), x)
  s = np.where(clients == 1, -1., 1.)
  want = start + 0.5 * sum(s[i] * (local[i] - start) for i in range(4)) / 4
  for row in np.asarray(out['encoder']['w']):
    np.testing.assert_allclose(row, want, rtol=1e-5, atol=1e-6)
  assert state == base.ServerState() and int(logs['ntk_negated_rows']) == 1


def _ntk(**over):
  cfg = tiny('ntkfedavg')
  cfg.ntkfedavg = ntkfedavg.default_config()
  return override(cfg, **over)


def test_without_linearisation_the_round_is_the_uniform_mean_of_the_local_round():
  """FedAvg and NTKFedAvg differ only in the forward: with the plain forward, the
  round's adapters are start + α · the uniform mean of the Local round's task
  vectors (client 1 negated); with the linearised one they differ."""
  loc, _ = _round1(run_lib.build_run(tiny('local')))
  run = run_lib.build_run(_ntk(**{'ntkfedavg.linearize': False, 'ntkfedavg.negate': '1',
                              'ntkfedavg.server_lr': 0.5}))
  st = run.setting
  slots = st.schedule[0]
  real = slots < st.num_pairs
  clients = np.where(real, st.pairs[np.minimum(slots, st.num_pairs - 1), 0], -1)
  assert (clients == 1).any() or True
  new, _ = _round1(run)
  s = np.where(clients == 1, -1., 1.)[real]
  for k, v in new.shared.items():
    trained = np.asarray(loc.pair_rows[k])[slots][real].astype(np.float64)
    start = np.asarray(run.trainable[k], np.float64)
    want = start + 0.5 * np.tensordot(s, trained - start, (0, 0)) / real.sum()
    np.testing.assert_allclose(v, want, rtol=1e-4, atol=1e-6)
  lin, out = _round1(run_lib.build_run(_ntk()))
  assert all(np.isfinite(np.asarray(v)).all() for v in lin.shared.values())
  # The heads start at zero; linearising them too would freeze the adapters (J_c = 0).
  assert all(not np.allclose(lin.shared[k], run.trainable[k]) for k in lin.shared
             if k.endswith('lora_b'))
  assert any(not np.allclose(lin.shared[k], new.shared[k]) for k in new.shared)


@pytest.mark.parametrize('over,message', [
    ({'ntkfedavg.negate': '1,x'}, "ntkfedavg.negate entry 'x' is not a client id"),
    ({'ntkfedavg.negate': '9'}, 'names client 9, which does not exist; valid ids: 0..5'),
    ({'ntkfedavg.server_lr': 0.0}, 'ntkfedavg.server_lr=0.0 is out of range'),
    ({'ntkfedavg.point': 'init'}, "unknown ntkfedavg.point 'init'; valid choices"),
])
def test_bad_input_is_one_line(tmp_path, over, message):
  from fedjax_mtl import train
  with pytest.raises(ConfigError) as e:
    train.train_and_evaluate(_ntk(**over), str(tmp_path / 'w'))
  assert message in str(e.value) and '\n' not in str(e.value)
  assert not (tmp_path / 'w').exists()


def test_forward_mode_layer_norm_matches_the_custom_backward_one():
  """The ViTs' LayerNorm (`layer_norm_jvp`, forward mode works) gives the values and
  gradients of the memory-saving `layer_norm` the Swin encoder uses."""
  from fedjax_mtl.models import swin
  k = jax.random.split(jax.random.PRNGKey(0), 4)
  x = jax.random.normal(k[0], (3, 5, 16))
  scale, bias = 1 + 0.1 * jax.random.normal(k[1], (16,)), jax.random.normal(k[2], (16,))
  g = jax.random.normal(k[3], (3, 5, 16))
  ref = jax.grad(lambda *a: jnp.sum(swin.layer_norm(*a) * g), argnums=(0, 1, 2))(x, scale, bias)
  got = jax.grad(lambda *a: jnp.sum(swin.layer_norm_jvp(*a) * g), argnums=(0, 1, 2))(x, scale,
                                                                                       bias)
  np.testing.assert_allclose(swin.layer_norm_jvp(x, scale, bias),
                             swin.layer_norm(x, scale, bias), rtol=1e-6, atol=1e-6)
  for a, b in zip(got, ref):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  # Forward mode against finite differences.
  d = 0.1 * jax.random.normal(k[3], x.shape)
  _, tangent = jax.jvp(lambda y: swin.layer_norm_jvp(y, scale, bias), (x,), (d,))
  fd = (swin.layer_norm_jvp(x + 1e-3 * d, scale, bias)
        - swin.layer_norm_jvp(x - 1e-3 * d, scale, bias)) / 2e-3
  np.testing.assert_allclose(tangent, fd, rtol=2e-2, atol=2e-3)


def test_alpha_sweep_is_the_linear_model_along_the_line(vit):
  """One linearize + one JVP give the linear model (evaluation B) at c + α·τ for a whole
  α grid, with and without a frozen non-linear head; at α = 0 it is the model at c."""
  apply4, c, x = vit
  apply = lambda p, x: apply4(p, None, x, None)
  tau = _dir(c, 4)
  alphas = jnp.array([0., 0.25, 1., 3.])
  head = lambda z: jax.nn.log_softmax(jnp.maximum(z, -1e4), -1)  # a non-linear frozen head
  sweep = jax.jit(lambda c, t: ntkfedavg.alpha_sweep(apply, c, t, x, alphas, head))(c, tau)
  assert sweep.shape == (4,) + apply(c, x).shape
  for i, a in enumerate(np.asarray(alphas)):
    theta = jax.tree.map(lambda c0, t: c0 + a * t, c, tau)
    want = head(jnp.maximum(ntkfedavg.linear_outputs(apply, c, theta, x), -1e4))
    np.testing.assert_allclose(sweep[i], want, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(sweep[0], head(apply(c, x)), rtol=1e-5, atol=1e-5)
  # The linear model differs from the non-linear one away from c.
  far = jax.tree.map(lambda c0, t: c0 + 3. * t, c, tau)
  keep = np.asarray(apply(c, x)) > -1e8
  assert np.abs(np.asarray(ntkfedavg.linear_outputs(apply, c, far, x) - apply(far, x))[keep]
                ).max() > 1e-4


def test_evaluation_b_is_logged_and_is_the_model_at_its_linearisation_point(tmp_path):
  """A linearised NTKFedAvg run logs the linear model (evaluation B) beside the model
  (A) at every evaluation; evaluated with c = the current server model, B is A."""
  from fedjax_mtl import train
  from fedjax_mtl.report import read_jsonl
  cfg = _ntk(**{'num_rounds': 1, 'optim.lr': 0.05})
  out = train.train_and_evaluate(cfg, str(tmp_path / 'w'))
  rows = [r for r in read_jsonl(str(tmp_path / 'w' / 'metrics.jsonl')) if r['type'] == 'eval']
  metrics = {r['metric'] for r in rows}
  assert metrics == {'accuracy', 'loss', 'accuracy_linear', 'loss_linear'}
  a = {r['task']: r['value'] for r in rows if r['metric'] == 'loss'}
  b = {r['task']: r['value'] for r in rows if r['metric'] == 'loss_linear'}
  assert a.keys() == b.keys() and any(abs(a[t] - b[t]) > 1e-3 for t in a)
  run = run_lib.build_run(cfg)
  test = run_lib.concat_split(run.data.test)
  state = out['state']
  same = run_lib.evaluate(run, state, test, start=state.shared)
  get = lambda m: np.array([r['value'] for r in same if r['metric'] == m])
  np.testing.assert_allclose(get('loss_linear'), get('loss'), rtol=1e-4)
  np.testing.assert_allclose(get('accuracy_linear'), get('accuracy'))
  # FedAvg (the plain forward) logs no evaluation B.
  assert run_lib.build_run(_ntk(**{'ntkfedavg.linearize': False})).eval_linear_fn is None


def test_config_benchmark_b_gives_one_client_per_task():
  from fedjax_mtl import config_doc
  from fedjax_mtl.manytask.setting import benchmark_tasks
  for variant in (':mini8', ':smoke,benchmark=clip', ':paper,benchmark=clip', ':benchmark=clip'):
    c = config_doc.load_config(f'configs/ntkfedavg.py{variant}')
    groups = c.many.client_tasks.split(';')
    assert c.setting == 'many_task' and c.algorithm == 'ntkfedavg'
    assert c.many.num_clients == len(groups)
    assert set(groups) <= set(benchmark_tasks(c.many.benchmark)) and len(set(groups)) == len(groups)
    assert c.many.participation == 1.0 and c.ntkfedavg.server_lr == 1.0
  with pytest.raises(ValueError, match='takes benchmark=, not table='):
    config_doc.load_config('configs/ntkfedavg.py:paper,table=1')
  with pytest.raises(ValueError, match="unknown benchmark 'imagenet'"):
    config_doc.load_config('configs/ntkfedavg.py:benchmark=imagenet')
  local = config_doc.load_config('configs/ntkfedavg.py:paper,benchmark=clip,work=local')
  epochs = dict(item.split('=') for item in local.many.task_epochs.split(','))
  assert set(epochs) == set(local.many.client_tasks.split(';'))
  assert (epochs['dtd'], epochs['gtsrb'], epochs['svhn']) == ('76', '11', '4')
  assert config_doc.load_config('configs/ntkfedavg.py:mini8,work=local').many.local_epochs == 5


def test_config_benchmark_a_is_the_dense_matfl_setting():
  from fedjax_mtl import config_doc, scenarios
  for variant, scenario in (('', 'pascal_st'), (':smoke', 'pascal_st'),
                            (':paper', 'pascal_st'), (':clients_per_task=2', 'pascal_st_2c'),
                            (':paper,benchmark=pascal,clients_per_task=2', 'pascal_st_2c')):
    c = config_doc.load_config(f'configs/ntkfedavg.py{variant}')
    assert c.setting == 'dense' and c.scenario == scenario, variant
    assert (c.model.encoder, c.model.decoder) == ('resnet18_os8', 'deeplab')
    assert (c.optim.name, c.optim.schedule, c.optim.reset_each_round) == (
        'adam_amsgrad', 'round_decay', True)
    assert c.sal_metric == 'mIoU' and c.batch_size == (8 if 'smoke' in variant else 16)
  paper = config_doc.load_config('configs/ntkfedavg.py:paper')
  assert paper.data.source == 'real' and paper.data.resolution['pascal'] == (512, 512)
  assert paper.optim.lr == 1e-4 and paper.local_epochs['pascal'] == 10
  assert config_doc.load_config('configs/ntkfedavg.py:paper,work=local').local_epochs[
      'pascal'] == 50
  # 2 clients per task: even disjoint splits of one permutation, 2 per task
  c = config_doc.load_config('configs/ntkfedavg.py:clients_per_task=2')
  clients = scenarios.build_clients(c, {'pascal': 200})
  assert [cl.tasks[0] for cl in clients] == [t for t in scenarios.P_TASKS for _ in range(2)]
  idx = np.concatenate([cl.draw_indices for cl in clients])
  assert sorted(idx) == list(range(200)) and {len(cl.draw_indices) for cl in clients} == {20}
  for bad, msg in (('clients_per_task=3', 'unknown clients_per_task'),
                   ('work=heavy', 'unknown work'), ('mini8,benchmark=pascal', 'benchmark B')):
    with pytest.raises(ValueError, match=msg):
      config_doc.load_config(f'configs/ntkfedavg.py:{bad}')


def test_unlearning_script_reads_target_and_other_curves(tmp_path, monkeypatch):
  import os
  import sys
  monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))), 'scripts'))
  sys.modules.pop('ntk_unlearning', None)
  import ntk_unlearning
  from fedjax_mtl import report
  rows = [{'round': r, 'type': 'eval', 'task': t, 'metric': m, 'value': v}
          for r, (d, o) in enumerate([(40., 50.), (5., 48.), (0.5, 47.)], start=1)
          for t, m, v in (('digits', 'accuracy', d), ('shapes', 'accuracy', o),
                          ('colors', 'accuracy', o + 2), ('digits', 'accuracy_linear', d + 1),
                          ('digits', 'loss', 9.))]
  report.append_jsonl(str(tmp_path / 'metrics.jsonl'), rows)
  c = ntk_unlearning.curves(str(tmp_path), 'digits')
  assert c['target'] == {1: 40., 2: 5., 3: 0.5} and c['others'] == {1: 51., 2: 49., 3: 48.}
  assert c['target_linear'][3] == 1.5 and 'others_linear' not in c
  assert ntk_unlearning.first_round_at_most(c['target']) == 3
  assert ntk_unlearning.first_round_at_most(c['target_linear']) is None
  text = ntk_unlearning.write({'ntkfedavg': [c]}, 'digits', str(tmp_path))
  assert 'digits ≤ 1 % first at round 3' in text and (tmp_path / 'unlearning.png').exists()
  assert '| ntkfedavg | 3 | 0.5 | 1.5 | 48.0 | – |' in text


def test_zero_shot_head_is_applied_after_the_linearised_embedding(tmp_path):
  """Benchmark B (spec §1.3): the CLIP tower's embedding is linearised and the frozen
  zero-shot head normalises it afterwards. Evaluation B equals exp(scale) ·
  normalize(g(c) + J_c (θ − c)) @ W computed here from one `jax.jvp` of the tower."""
  from fedjax_mtl.data import image_preprocess
  from fedjax_mtl.models import zeroshot
  rng = np.random.default_rng(0)
  heads = {'digits': rng.standard_normal((16, 10)), 'shapes': rng.standard_normal((16, 6))}
  path = str(tmp_path / 'heads.npz')
  zeroshot.save_heads(path, heads, logit_scale=np.log(50.))
  run = run_lib.build_run(_ntk(**{'many.tasks': 'digits,shapes', 'many.model': 'clip_tiny_test',
                              'many.resolution': 32, 'many.heads': path}))
  state = run_lib.init_state(run)
  c = dict(state.shared)
  theta = {k: v + 0.3 * jax.random.normal(jax.random.PRNGKey(i), v.shape)
           for i, (k, v) in enumerate(sorted(c.items()))}
  state = state.replace(shared=theta)
  test = run_lib.concat_split(run.data.test)
  rows = run_lib.evaluate(run, state, test, start=c)
  for t, task in enumerate(('digits', 'shapes')):
    images, labels = run.data.test[t]
    x = image_preprocess.normalize(images, 'clip')
    emb = lambda p: run.model.apply({'params': model_lib.merge(run.backbone, p)}, x)[0]
    z0, dz = jax.jvp(emb, (c,), (jax.tree.map(jnp.subtract, theta, c),))
    z = np.asarray(z0 + dz, np.float64)
    logits = 50. * (z / np.linalg.norm(z, axis=1, keepdims=True)) @ heads[task]
    logp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - logits.max(1, keepdims=True)
    want = -logp[np.arange(len(labels)), labels].mean()
    got = next(r['value'] for r in rows if r['task'] == task and r['metric'] == 'loss_linear')
    np.testing.assert_allclose(got, want, rtol=2e-4)


def test_pretrained_linearisation_point_is_the_origin_every_round():
  """`ntkfedavg.point='pretrained'` linearises around θ_0 every round (spec §2.3's
  ablation); clients still start from the server model. Round 1 starts at θ_0, so
  both points give the same round; from round 2 on they differ."""
  from fedjax_mtl.manytask.feed import RoundFeed
  runs = [run_lib.build_run(_ntk(**{'ntkfedavg.point': p, 'optim.lr': 0.05}))
          for p in ('server', 'pretrained')]
  states = []
  for run in runs:
    images, labels, _ = run_lib.concat_split(run.data.train)
    feed = RoundFeed(run.setting, images, labels, 'device')
    state = run_lib.init_state(run)
    out = []
    for r in range(2):
      state, _ = run.round_fn(state, run.backbone, jnp.asarray(run.setting.schedule[r]), *feed(r))
      out.append(jax.tree.map(np.asarray, state.shared))
    states.append(out)
  (s1, s2), (p1, p2) = states
  for k in s1:
    np.testing.assert_array_equal(s1[k], p1[k])
  assert any(not np.allclose(s2[k], p2[k]) for k in s2)


def test_task_epochs_give_each_tasks_pairs_their_own_local_epochs():
  """many.task_epochs (the per-dataset "local work" epochs of spec §4): a task's pairs
  run its epochs, the others many.local_epochs; the extra steps are masked."""
  from fedjax_mtl.manytask import engine, setting as setting_lib
  idx, mask = engine._plan(jnp.arange(10), jnp.asarray(5), jax.random.PRNGKey(0), 3, 4, 0, 2,
                           jnp.asarray(2))
  assert idx.shape == (12, 2) and np.asarray(mask).tolist() == [1, 1, 1, 0] * 2 + [0] * 4
  cfg = tiny('ntkfedavg')
  cfg.many.task_epochs = 'shapes=3'
  run = run_lib.build_run(cfg)
  epochs = setting_lib.task_epochs(cfg.many, run.setting.tasks)
  assert epochs.tolist() == [3 if t == 'shapes' else 1 for t in run.setting.tasks]
  _, out = _round1(run)
  out = jax.device_get(out)
  seen = set()
  for p, steps, real in zip(run.setting.schedule[0], out['steps'], out['real']):
    if real:
      task = run.setting.tasks[run.setting.pairs[p][1]]
      per_epoch = -(-int(run.setting.pair_counts[p]) // cfg.batch_size)
      assert steps == per_epoch * (3 if task == 'shapes' else 1), task
      seen.add(task)
  assert 'shapes' in seen and len(seen) > 1
  for bad, msg in (('mnist=5', "names task 'mnist'"), ('shapes=0', 'is not task=EPOCHS'),
                   ('shapes', 'is not task=EPOCHS')):
    cfg.many.task_epochs = bad
    with pytest.raises(ConfigError, match=msg):
      run_lib.check(cfg)


def test_in_run_alpha_tuning_picks_the_best_step_on_held_out_data():
  """ntkfedavg.tune_alpha (spec A.3): the server holds out part of each task's training
  set, and after each round steps c + α·τ̄ with the α of the grid whose linear model is
  most accurate there; the logged accuracies are those of `linear_outputs` at each α."""
  from fedjax_mtl.manytask import setting as setting_lib
  over = {'ntkfedavg.tune_alpha': True, 'ntkfedavg.alpha_grid': '0.5,1,3',
          'ntkfedavg.val_fraction': 0.15, 'many.num_train': 240}
  run = run_lib.build_run(_ntk(**over))
  plain = run_lib.build_run(_ntk(**{'many.num_train': 240}))
  held = np.diff(np.append(np.asarray(run.val[2]), run.val[1].shape[0]))
  for (_, y), (_, y0), k in zip(run.data.train, plain.data.train, held):
    assert k == int(0.15 * len(y0)) and len(y) + k == len(y0)  # out of the clients' data
  state = run_lib.init_state(run)
  start = jax.tree.map(jnp.copy, state.shared)
  state, _ = _round1(run)
  new, log = run_lib.tune_alpha(run, state, start)
  assert log['alpha'] in (0.5, 1.0, 3.0) and len(log['alpha_val_accuracy']) == 3
  assert log['alpha'] == [0.5, 1., 3.][int(np.argmax(log['alpha_val_accuracy']))]
  tau = jax.tree.map(jnp.subtract, state.shared, start)
  jax.tree.map(lambda n, c, t: np.testing.assert_allclose(n, c + log['alpha'] * t, rtol=1e-5,
                                                          atol=1e-6), new.shared, start, tau)
  # Each α's accuracy is the linear model's at c + α·τ̄ (evaluation B's program).
  from fedjax_mtl.manytask import engine
  reference = engine.make_eval(run.setting, run.model, held, 16, linear=True)
  got = []
  for a in (0.5, 1., 3.):
    at = state.replace(shared=jax.tree.map(lambda c, t: c + a * t, start, tau))
    right, _ = jax.device_get(reference(at, start, run.backbone, jnp.asarray(run.eval_pairs),
                                        *run.val))
    got.append(float(np.mean(100. * right / held[run.setting.pairs[run.eval_pairs, 1]])))
  np.testing.assert_allclose(log['alpha_val_accuracy'], got, atol=1e-4)
  assert max(got) > 0
  with pytest.raises(ConfigError, match='leave ntkfedavg.server_lr at 1'):
    run_lib.build_run(_ntk(**over, **{'ntkfedavg.server_lr': 2.}))
  with pytest.raises(ConfigError, match="alpha_grid entry 'x'"):
    run_lib.build_run(_ntk(**{**over, 'ntkfedavg.alpha_grid': '1,x'}))
  with pytest.raises(ConfigError, match='needs ntkfedavg.linearize=True'):
    run_lib.build_run(_ntk(**over, **{'ntkfedavg.linearize': False}))
