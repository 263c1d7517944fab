"""Tests for the mmseg-style Swin backbone (tiny models; swin_t only via eval_shape)."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf

from fedjax_mtl.models import convert, decoder, swin
from fedjax_mtl.experiment import KEEP_REMAT_ON_CPU

# XLA:CPU compile time dominates these tests; LLVM -O0 compiles ~3x faster and
# does not change results. Every test jits (eager op-by-op compiles are slower).
_jit = functools.partial(jax.jit, compiler_options={'xla_backend_optimization_level': 0})

NANO = swin.swin_nano()
# One stage, two blocks (W-MSA then SW-MSA): cheap to compile for train/remat/bf16.
SMALL = dict(embed_dim=8, depths=(2,), num_heads=(2,), window_size=4, drop_path_rate=0.9)
SMALL_MODEL = swin.SwinTransformer(**SMALL)


def _random_params(model: swin.SwinTransformer, seed: int = 0) -> dict:
  """Random (not init) params so LayerNorm scales, biases and the bias table all matter."""
  rng = np.random.default_rng(seed)

  def fill(path, s):
    name = jax.tree_util.keystr(path)
    if 'scale' in name:
      v = 1.0 + 0.1 * rng.standard_normal(s.shape)
    elif 'relative_position_bias_table' in name:
      v = rng.standard_normal(s.shape)
    else:
      v = 0.2 * rng.standard_normal(s.shape)
    return jnp.asarray(v, jnp.float32)

  return jax.tree_util.tree_map_with_path(fill, swin.param_shapes(model))


_nano_eval = _jit(lambda p, x: NANO.apply({'params': p}, x, train=False))


# ---------------------------------------------------------------------------
# Shapes and parameter count
# ---------------------------------------------------------------------------


def _out_shapes(model, shape):
  x = jax.ShapeDtypeStruct(shape, jnp.float32)
  outs, variables = jax.eval_shape(
    lambda x: model.init_with_output(jax.random.key(0), x, train=False), x
  )
  return [o.shape for o in outs], variables


@pytest.mark.parametrize(
  'hw, expected',
  [
    ((64, 64), [(16, 16), (8, 8), (4, 4), (2, 2)]),
    ((56, 72), [(14, 18), (7, 9), (4, 5), (2, 3)]),  # odd sizes: ceil like the reference
    ((54, 70), [(14, 18), (7, 9), (4, 5), (2, 3)]),  # patch padding
  ],
)
def test_nano_output_shapes(hw, expected):
  shapes, _ = _out_shapes(NANO, (2, *hw, 3))
  assert NANO.dims == (16, 32, 64, 128)
  assert shapes == [(2, h, w, c) for (h, w), c in zip(expected, NANO.dims)]


@pytest.mark.parametrize(
  'hw, expected',
  [((512, 512), [(128, 128), (64, 64), (32, 32), (16, 16)]),
   ((448, 576), [(112, 144), (56, 72), (28, 36), (14, 18)])],
)
def test_swin_t_output_shapes(hw, expected):
  model = swin.swin_t()
  shapes, _ = _out_shapes(model, (1, *hw, 3))
  assert model.dims == (96, 192, 384, 768)
  assert shapes == [(1, h, w, c) for (h, w), c in zip(expected, model.dims)]


def test_swin_t_param_count():
  params = swin.param_shapes(swin.swin_t())
  assert convert.count_params(params) == 27_520_698
  assert {p.dtype for p in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
  # A few mmseg shapes: qkv of stage 0, the 4C->2C reduction, the bias table.
  blk = params['stages_0']['blocks_0']
  assert blk['attn']['qkv']['kernel'].shape == (96, 288)
  assert blk['attn']['relative_position_bias_table'].shape == (169, 3)
  assert params['stages_0']['downsample']['reduction']['kernel'].shape == (384, 192)
  assert params['patch_embed']['proj']['kernel'].shape == (4, 4, 3, 96)


# ---------------------------------------------------------------------------
# Static tables
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('w', [2, 4, 7])
def test_relative_position_index(w):
  n = w * w
  expected = np.zeros((n, n), np.int64)
  for a in range(n):
    for b in range(n):
      dy, dx = a // w - b // w, a % w - b % w
      expected[a, b] = (dy + w - 1) * (2 * w - 1) + (dx + w - 1)
  np.testing.assert_array_equal(swin.relative_position_index(w), expected)


@pytest.mark.parametrize('hp, wp, w', [(8, 12, 4), (14, 21, 7), (7, 7, 7)])
def test_shifted_window_mask(hp, wp, w):
  s = w // 2

  def region(i, size):  # the three bands of the shifted (rolled) map
    return 0 if i < size - w else (1 if i < size - s else 2)

  n = w * w
  nw_w = wp // w
  expected = np.zeros((hp // w * nw_w, n, n), np.float32)
  for win in range(expected.shape[0]):
    r0, c0 = (win // nw_w) * w, (win % nw_w) * w
    labels = [region(r0 + t // w, hp) * 3 + region(c0 + t % w, wp) for t in range(n)]
    for a in range(n):
      for b in range(n):
        expected[win, a, b] = 0.0 if labels[a] == labels[b] else -100.0
  np.testing.assert_array_equal(swin.shifted_window_mask(hp, wp, w, s), expected)


# ---------------------------------------------------------------------------
# Numerical match with a literal NumPy port of the mmseg/FedHCA2 forward
# ---------------------------------------------------------------------------


def _ln(x, sd, name):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + 1e-5) * sd[name + '.weight'] + sd[name + '.bias']


def _linear(x, sd, name):
  y = x @ sd[name + '.weight'].T
  return y + sd[name + '.bias'] if name + '.bias' in sd else y


def _ref_rel_index(w):
  # mmseg's WindowMSA.double_step_seq construction, then flip(1).
  seq = (np.arange(0, (2 * w - 1) * w, 2 * w - 1)[:, None] + np.arange(w)[None]).reshape(1, -1)
  return (seq + seq.T)[:, ::-1]


def _ref_partition(x, w):  # (B, H, W, C) -> (B*nW, w, w, C)
  b, h, wd, c = x.shape
  return x.reshape(b, h // w, w, wd // w, w, c).transpose(0, 1, 3, 2, 4, 5).reshape(-1, w, w, c)


def _ref_shift_window_msa(x, hw, sd, pre, heads, w, shift):
  b, _, c = x.shape
  h, wd = hw
  x = x.reshape(b, h, wd, c)
  pad_r, pad_b = (w - wd % w) % w, (w - h % w) % w
  x = np.pad(x, ((0, 0), (0, pad_b), (0, pad_r), (0, 0)))
  hp, wp = x.shape[1:3]
  mask = None
  if shift:
    x = np.roll(x, (-shift, -shift), axis=(1, 2))
    img = np.zeros((1, hp, wp, 1))
    cnt = 0
    for hs in (slice(0, -w), slice(-w, -shift), slice(-shift, None)):
      for ws in (slice(0, -w), slice(-w, -shift), slice(-shift, None)):
        img[:, hs, ws, :] = cnt
        cnt += 1
    mw = _ref_partition(img, w).reshape(-1, w * w)
    mask = mw[:, None, :] - mw[:, :, None]
    mask = np.where(mask != 0, -100.0, 0.0)
  win = _ref_partition(x, w).reshape(-1, w * w, c)
  bn, n, _ = win.shape
  qkv = _linear(win, sd, pre + '.qkv').reshape(bn, n, 3, heads, c // heads).transpose(2, 0, 3, 1, 4)
  q, k, v = qkv[0] * (c // heads) ** -0.5, qkv[1], qkv[2]
  attn = q @ k.transpose(0, 1, 3, 2)
  table = sd[pre + '.relative_position_bias_table']
  attn = attn + table[_ref_rel_index(w).reshape(-1)].reshape(n, n, -1).transpose(2, 0, 1)[None]
  if mask is not None:
    nw = mask.shape[0]
    attn = (attn.reshape(bn // nw, nw, heads, n, n) + mask[None, :, None]).reshape(-1, heads, n, n)
  attn = np.exp(attn - attn.max(-1, keepdims=True))
  attn = attn / attn.sum(-1, keepdims=True)
  out = _linear((attn @ v).transpose(0, 2, 1, 3).reshape(bn, n, c), sd, pre + '.proj')
  out = out.reshape(b, hp // w, wp // w, w, w, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, hp, wp, c)
  if shift:
    out = np.roll(out, (shift, shift), axis=(1, 2))
  return out[:, :h, :wd, :].reshape(b, h * wd, c)


def _ref_patch_merging(x, hw, sd, pre):
  b, _, c = x.shape
  h, w = hw
  x = x.reshape(b, h, w, c).transpose(0, 3, 1, 2)  # NCHW
  x = np.pad(x, ((0, 0), (0, 0), (0, h % 2), (0, w % 2)))
  h2, w2 = x.shape[2] // 2, x.shape[3] // 2
  cols = np.zeros((b, c, 2, 2, h2 * w2))  # nn.Unfold(2, stride 2): rows are (c, ki, kj)
  for ki in range(2):
    for kj in range(2):
      cols[:, :, ki, kj] = x[:, :, ki::2, kj::2].reshape(b, c, -1)
  x = cols.reshape(b, 4 * c, -1).transpose(0, 2, 1)
  x = _ln(x, sd, pre + '.norm')
  return _linear(x, sd, pre + '.reduction'), (h2, w2)


def _reference_forward(sd, model, img):
  """NumPy (float64) port of FedHCA2 models/swin.py SwinTransformer.forward, NCHW in."""
  sd = {k: np.asarray(v, np.float64) for k, v in sd.items()}
  p, w = model.patch_size, model.window_size
  x = img.transpose(0, 3, 1, 2).astype(np.float64)
  b, _, h, wd = x.shape
  x = np.pad(x, ((0, 0), (0, 0), (0, (p - h % p) % p), (0, (p - wd % p) % p)))
  hp, wp = x.shape[2] // p, x.shape[3] // p
  k = sd['patch_embed.projection.weight']
  patches = x.reshape(b, 3, hp, p, wp, p)
  x = np.einsum('bihkwl,oikl->bhwo', patches, k) + sd['patch_embed.projection.bias']
  x = _ln(x.reshape(b, hp * wp, -1), sd, 'patch_embed.norm')
  hw = (hp, wp)
  outs = []
  for i, depth in enumerate(model.depths):
    for j in range(depth):
      pre = f'stages.{i}.blocks.{j}'
      shift = w // 2 if j % 2 else 0
      x = x + _ref_shift_window_msa(
        _ln(x, sd, pre + '.norm1'), hw, sd, pre + '.attn.w_msa', model.num_heads[i], w, shift
      )
      y = _linear(_ln(x, sd, pre + '.norm2'), sd, pre + '.ffn.layers.0.0')
      y = 0.5 * y * (1.0 + erf(y / np.sqrt(2.0)))
      x = x + _linear(y, sd, pre + '.ffn.layers.1')
    outs.append(_ln(x, sd, f'norm{i}').reshape(b, *hw, -1))
    if i < len(model.depths) - 1:
      x, hw = _ref_patch_merging(x, hw, sd, f'stages.{i}.downsample')
  return outs


def test_matches_numpy_reference():
  params = _random_params(NANO)
  sd = convert.to_state_dict(params, 'mmseg')
  img = np.random.default_rng(1).standard_normal((2, 54, 70, 3)).astype(np.float32)
  got = _nano_eval(params, jnp.asarray(img))
  want = _reference_forward(sd, NANO, img)
  for g, r in zip(got, want):
    assert g.shape == r.shape
    np.testing.assert_allclose(np.asarray(g), r, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------
# Determinism, stochastic depth, remat, bf16, padding
# ---------------------------------------------------------------------------


def test_eval_is_deterministic():
  params = _random_params(NANO, seed=2)
  x = jnp.asarray(np.random.default_rng(3).standard_normal((2, 54, 70, 3)), jnp.float32)
  a = _nano_eval(params, x)  # same shapes as above: reuses the compiled forward
  b = _nano_eval(params, x)
  for u, v in zip(a, b):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


def _small_setup(**overrides):
  model = swin.SwinTransformer(**{**SMALL, **overrides})
  params = _random_params(model, seed=4)
  x = jnp.asarray(np.random.default_rng(5).standard_normal((8, 16, 16, 3)), jnp.float32)
  return model, params, x


def _jit_apply(model):
  """Jitted apply(params, x, rng, train)."""
  return _jit(
    lambda p, x, r, train: model.apply({'params': p}, x, train=train, rngs={'dropout': r}),
    static_argnums=3,
  )


_small_fwd = _jit_apply(SMALL_MODEL)


# XLA:CPU expands jax.checkpoint's optimization barriers before CSE, which then
# folds the recomputation back into the forward pass; keeping the pass off makes
# the remat step really recompute, as on GPU/TPU.
_KEEP_REMAT = {'xla_backend_optimization_level': 0, **KEEP_REMAT_ON_CPU}


@functools.cache
def _small_train_step(remat: bool):
  """Compiled value_and_grad of a train=True forward; shared by the drop-path and remat tests."""
  model = swin.SwinTransformer(**SMALL, remat=remat)

  def loss(p, x, r):
    outs = model.apply({'params': p}, x, train=True, rngs={'dropout': r})
    return sum(jnp.sum(o**2) for o in outs), outs

  _, params, x = _small_setup()
  return jax.jit(jax.value_and_grad(loss, has_aux=True)).lower(
    params, x, jax.random.key(0)).compile(compiler_options=_KEEP_REMAT)


def test_drop_path_uses_dropout_rng():
  model, params, x = _small_setup()
  step = _small_train_step(False)
  a = step(params, x, jax.random.key(0))[0][1][0]
  b = step(params, x, jax.random.key(0))[0][1][0]
  c = step(params, x, jax.random.key(1))[0][1][0]
  ev1 = _small_fwd(params, x, jax.random.key(0), False)[0]
  ev2 = _small_fwd(params, x, jax.random.key(1), False)[0]
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert not np.allclose(np.asarray(a), np.asarray(c))
  assert not np.allclose(np.asarray(a), np.asarray(ev1))
  np.testing.assert_array_equal(np.asarray(ev1), np.asarray(ev2))  # eval ignores the rng
  with pytest.raises(Exception, match='dropout'):
    jax.eval_shape(lambda p: model.apply({'params': p}, x, train=True), params)


def test_drop_path_is_per_sample_and_rescaled():
  class Probe(nn.Module):
    @nn.compact
    def __call__(self, x):
      return swin.drop_path(self, x, 0.25, True)

  x = jnp.ones((4000, 3, 2))
  probe = _jit(lambda x, r: Probe().apply({}, x, rngs={'dropout': r}))
  y = np.asarray(probe(x, jax.random.key(0)))
  per_sample = y.reshape(4000, -1)
  assert np.all(per_sample == per_sample[:, :1])  # one draw per sample
  kept = per_sample[:, 0] > 0
  np.testing.assert_allclose(per_sample[kept], 1 / 0.75, rtol=1e-6)  # rescaled by 1/keep
  assert abs(kept.mean() - 0.75) < 0.03
  np.testing.assert_array_equal(np.asarray(probe(x, jax.random.key(0))), y)


def test_remat_matches_plain():
  _, params, x = _small_setup()
  rng = jax.random.key(3)
  plain, remat = _small_train_step(False), _small_train_step(True)
  assert remat.as_text().count('opt-barrier') > plain.as_text().count('opt-barrier')
  assert (remat.memory_analysis().temp_size_in_bytes
          < plain.memory_analysis().temp_size_in_bytes)
  (l1, o1), g1 = plain(params, x, rng)
  (l2, o2), g2 = remat(params, x, rng)  # same drop-path masks in the recomputation
  np.testing.assert_allclose(np.asarray(o1[0]), np.asarray(o2[0]), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(float(l1), float(l2), rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5), g1, g2)


def test_bf16_compute_keeps_float32_params():
  _, params, x = _small_setup()
  model16 = swin.SwinTransformer(**{**SMALL, 'dtype': jnp.bfloat16})
  shapes = swin.param_shapes(model16)
  assert {p.dtype for p in jax.tree.leaves(shapes)} == {jnp.dtype(jnp.float32)}
  key = jax.random.key(0)
  out16 = _jit_apply(model16)(params, x, key, False)[0]
  out32 = _small_fwd(params, x, key, False)[0]  # eval: drop_path_rate is irrelevant
  assert out16.dtype == jnp.bfloat16
  assert np.all(np.isfinite(np.asarray(out16, np.float32)))
  err = np.abs(np.asarray(out16, np.float32) - np.asarray(out32))
  assert err.mean() < 0.05 * np.abs(np.asarray(out32)).mean()

  def grads(model):
    def loss(p):
      outs = model.apply({'params': p}, x, train=False)
      return sum(jnp.sum(o.astype(jnp.float32) ** 2) for o in outs)
    return jax.tree.leaves(_jit(jax.grad(loss))(params))

  g16, g32 = grads(model16), grads(SMALL_MODEL)
  assert {g.dtype for g in g16} == {jnp.dtype(jnp.float32)}
  flat16, flat32 = (np.concatenate([np.ravel(g) for g in gs]) for gs in (g16, g32))
  assert np.linalg.norm(flat16 - flat32) < 0.05 * np.linalg.norm(flat32)


def test_layer_norm_float32_statistics_and_gradient():
  rng = np.random.default_rng(6)
  # A large common offset: single-pass (E[x^2] - E[x]^2) or bf16 statistics lose it.
  x = (1000.0 + rng.standard_normal((3, 5, 16))).astype(np.float32)
  g, b = 1 + 0.1 * rng.standard_normal(16), 0.1 * rng.standard_normal(16)
  x64 = np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64)
  want = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5) * g + b
  args = [jnp.asarray(v, jnp.float32) for v in (g, b)]
  got = _jit(swin.layer_norm)(jnp.asarray(x, jnp.bfloat16), *args)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)

  def reference(x, g, b):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b

  w = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
  xs = jnp.asarray(rng.standard_normal(x.shape) * 3 + 1, jnp.float32)
  grad = lambda f: _jit(jax.grad(lambda *a: jnp.sum(f(*a) * w), argnums=(0, 1, 2)))(xs, *args)
  for u, v in zip(grad(swin.layer_norm), grad(reference)):
    np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-5, atol=1e-5)


def test_softmax_and_gelu_match_reference_derivatives():
  rng = np.random.default_rng(7)
  x = jnp.asarray(rng.standard_normal((6, 49)) * 4, jnp.float32)
  w = jnp.asarray(rng.standard_normal((6, 49)), jnp.float32)
  for ours, ref in ((swin.softmax, lambda v: jax.nn.softmax(v, axis=-1)),
                    (swin.gelu, lambda v: jax.nn.gelu(v, approximate=False))):
    np.testing.assert_allclose(np.asarray(_jit(ours)(x)), np.asarray(ref(x)), rtol=1e-5, atol=1e-6)
    g1, g2 = (_jit(jax.grad(lambda v, f=f: jnp.sum(f(v) * w)))(x) for f in (ours, ref))
    np.testing.assert_allclose(np.asarray(g1), np.asarray(g2), rtol=1e-5, atol=1e-5)


def _lowered_text(model, hw):
  params = swin.param_shapes(model)
  x = jax.ShapeDtypeStruct((1, *hw, 3), jnp.float32)
  return _jit(lambda p, x: model.apply({'params': p}, x, train=False)).lower(params, x).as_text()


def test_no_padding_when_window_aligned():
  # window 4: 128x128 -> maps 32, 16, 8, 4 (all aligned) -> no pad op at all.
  assert 'stablehlo.pad' not in _lowered_text(NANO, (128, 128))
  # 64x64 -> last map 2x2 is padded up to one 4x4 window, like the reference.
  assert 'stablehlo.pad' in _lowered_text(NANO, (64, 64))


def test_factories_accept_overrides():
  m = swin.swin_t(drop_path_rate=0.3, remat=True, dtype=jnp.bfloat16)
  assert (m.embed_dim, m.depths, m.num_heads, m.window_size) == (96, (2, 2, 6, 2), (3, 6, 12, 24), 7)
  assert m.drop_path_rate == 0.3 and m.remat and m.dtype == jnp.bfloat16
  assert swin.swin_s().depths == (2, 2, 18, 2)
  assert (swin.swin_b().embed_dim, swin.swin_b().num_heads) == (128, (4, 8, 16, 32))
  assert swin.swin_micro().dims == (32, 64, 128, 256)
  assert swin.get_model('swin_nano').dims == (16, 32, 64, 128)
  with pytest.raises(ValueError, match='unknown Swin model'):
    swin.get_model('swin_xl')


# ---------------------------------------------------------------------------
# Decoder and head: exact algebraic rewrites vs the layer-by-layer reference
# ---------------------------------------------------------------------------


def _perturbed(variables, seed):
  rng = np.random.default_rng(seed)
  return jax.tree.map(
    lambda v: v + 0.2 * rng.standard_normal(v.shape).astype(np.float32), variables)


def test_head_matches_layer_by_layer_reference():
  x = np.random.default_rng(8).standard_normal((2, 3, 5, 16)).astype(np.float32)
  head = decoder.Head(16, 5)
  p = _perturbed(head.init(jax.random.key(0), x), 9)['params']
  assert {k: v['kernel'].shape for k, v in p.items()} == {
    'up_0': (16, 2, 2, 8), 'up_1': (8, 2, 2, 4), 'out': (4, 5)}

  def conv_transpose(v, layer):  # PyTorch ConvTranspose2d(k=2, s=2), NHWC
    y = np.einsum('bhwc,cijf->bhiwjf', v, np.asarray(layer['kernel'], np.float64))
    b, h, _, w, _, f = y.shape
    return y.reshape(b, 2 * h, 2 * w, f) + np.asarray(layer['bias'])

  y = conv_transpose(conv_transpose(x.astype(np.float64), p['up_0']), p['up_1'])
  want = y @ np.asarray(p['out']['kernel'], np.float64) + np.asarray(p['out']['bias'])
  got = _jit(head.apply)({'params': p}, x)
  assert got.shape == (2, 12, 20, 5) and got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


def test_decoder_matches_concat_reference():
  rng = np.random.default_rng(10)
  feats = [rng.standard_normal((2, 8 // 2**s, 12 // 2**s, 8 * 2**s)).astype(np.float32)
           for s in range(4)]
  dec = decoder.Decoder(8)
  v = _perturbed(dec.init(jax.random.key(0), feats), 11)
  v['batch_stats']['fuse_bn']['var'] = jnp.abs(v['batch_stats']['fuse_bn']['var']) + 0.5
  p, stats = v['params'], v['batch_stats']['fuse_bn']
  ups = []
  for s, f in enumerate(feats):
    y = f @ np.asarray(p[f'linear_{s}']['kernel']) + np.asarray(p[f'linear_{s}']['bias'])
    ups.append(np.asarray(jax.image.resize(y, (2, 8, 12, 8), 'linear')))  # half-pixel, like torch
  y = np.concatenate(ups, -1) @ np.asarray(p['fuse_conv']['kernel'])
  y = y + np.asarray(p['fuse_conv']['bias'])
  y = (y - stats['mean']) / np.sqrt(stats['var'] + 1e-5)
  y = y * p['fuse_bn']['scale'] + p['fuse_bn']['bias']
  want = np.where(y > 0, y, 0.01 * y)
  got = _jit(dec.apply)(v, feats)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)
