"""ViT (AugReg layout), CLIP image tower and LoRA: layout, NumPy reference, counts, merging.

Parameter dicts are built here from the checkpoint key names and shapes written
out by hand (not from the module), filled with seeded random values so every
parameter matters; the reference forward passes are plain float64 NumPy.
ViT-B sizes are checked with ``jax.eval_shape`` only.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.special import erf

from fedjax_mtl.errors import ConfigError
from fedjax_mtl.models import vit

# XLA:CPU compile time dominates; LLVM -O0 compiles faster and does not change results.
_jit = functools.partial(jax.jit, compiler_options={'xla_backend_optimization_level': 0})

VIT = vit.vit_tiny_test(num_classes=5)
VIT_LORA = vit.vit_tiny_test(num_classes=5, lora_rank=4, lora_alpha=8.0)  # scale 2
CLIP_LORA = vit.clip_tiny_test(lora_rank=2, lora_alpha=3.0)  # scale 1.5
D, DEPTH, HEADS, MLP, PATCH, SIZE = 32, 2, 2, 64, 8, 32
TOKENS = 1 + (SIZE // PATCH) ** 2


# ---------------------------------------------------------------------------
# Checkpoint layouts written out by hand, random fills, NumPy references
# ---------------------------------------------------------------------------


def _attn_shapes(pre, names, rank):
  hd = D // HEADS
  s = {}
  for n in names[:3]:
    s[f'{pre}/{n}/kernel'], s[f'{pre}/{n}/bias'] = (D, HEADS, hd), (HEADS, hd)
  s[f'{pre}/{names[3]}/kernel'], s[f'{pre}/{names[3]}/bias'] = (HEADS, hd, D), (D,)
  if rank:
    for n in (names[0], names[2]):  # query and value
      s[f'{pre}/{n}/lora_a'], s[f'{pre}/{n}/lora_b'] = (D, rank), (rank, HEADS, hd)
  return s


def _augreg_shapes(rank=0, classes=5):
  """The vit_jax / AugReg .npz keys of the tiny ViT."""
  s = {'embedding/kernel': (PATCH, PATCH, 3, D), 'embedding/bias': (D,), 'cls': (1, 1, D),
       'Transformer/posembed_input/pos_embedding': (1, TOKENS, D),
       'Transformer/encoder_norm/scale': (D,), 'Transformer/encoder_norm/bias': (D,),
       'head/kernel': (D, classes), 'head/bias': (classes,)}
  for i in range(DEPTH):
    b = f'Transformer/encoderblock_{i}'
    for ln in ('LayerNorm_0', 'LayerNorm_2'):
      s[f'{b}/{ln}/scale'], s[f'{b}/{ln}/bias'] = (D,), (D,)
    s.update(_attn_shapes(f'{b}/MultiHeadDotProductAttention_1',
                          ('query', 'key', 'value', 'out'), rank))
    s[f'{b}/MlpBlock_3/Dense_0/kernel'], s[f'{b}/MlpBlock_3/Dense_0/bias'] = (D, MLP), (MLP,)
    s[f'{b}/MlpBlock_3/Dense_1/kernel'], s[f'{b}/MlpBlock_3/Dense_1/bias'] = (MLP, D), (D,)
  return s


def _clip_shapes(rank=0, embed=16):
  """The documented Flax names of the tiny CLIP tower."""
  s = {'conv1/kernel': (PATCH, PATCH, 3, D), 'class_embedding': (D,),
       'positional_embedding': (TOKENS, D), 'proj': (D, embed)}
  for ln in ('ln_pre', 'ln_post'):
    s[f'{ln}/scale'], s[f'{ln}/bias'] = (D,), (D,)
  for i in range(DEPTH):
    b = f'transformer/resblocks_{i}'
    for ln in ('ln_1', 'ln_2'):
      s[f'{b}/{ln}/scale'], s[f'{b}/{ln}/bias'] = (D,), (D,)
    s.update(_attn_shapes(f'{b}/attn', ('q_proj', 'k_proj', 'v_proj', 'out_proj'), rank))
    s[f'{b}/mlp/c_fc/kernel'], s[f'{b}/mlp/c_fc/bias'] = (D, MLP), (MLP,)
    s[f'{b}/mlp/c_proj/kernel'], s[f'{b}/mlp/c_proj/bias'] = (MLP, D), (D,)
  return s


def _random(shapes, seed):
  """Seeded random float32 values; LayerNorm scales near 1, everything else ~0.2 N(0, 1)."""
  rng = np.random.default_rng(seed)
  return {k: (1.0 + 0.1 * rng.standard_normal(s) if k.endswith('/scale')
              else 0.2 * rng.standard_normal(s)).astype(np.float32)
          for k, s in sorted(shapes.items())}


def _tree(flat):
  return vit.unflatten_params({k: jnp.asarray(v) for k, v in flat.items()})


def _shape_dict(model):
  return {k: tuple(v.shape) for k, v in vit.flatten_params(vit.param_shapes(model)).items()}


def _ln(x, p, name, eps):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p[f'{name}/scale'] + p[f'{name}/bias']


def _patch_conv(img, kernel):
  """Stride-p, p x p convolution, one output position at a time; row-major tokens."""
  p = kernel.shape[0]
  n = img.shape[1] // p
  return np.stack([np.einsum('bpqc,pqcd->bd', img[:, i * p:(i + 1) * p, j * p:(j + 1) * p], kernel)
                   for i in range(n) for j in range(n)], axis=1)


def _ref_attention(x, p, pre, names, lora_scale):
  def proj(n):
    y = np.einsum('bnd,dhk->bnhk', x, p[f'{pre}/{n}/kernel']) + p[f'{pre}/{n}/bias']
    if f'{pre}/{n}/lora_a' in p:  # W x + b + (alpha / r) B A x
      y = y + lora_scale * np.einsum('bnr,rhk->bnhk', x @ p[f'{pre}/{n}/lora_a'],
                                     p[f'{pre}/{n}/lora_b'])
    return y

  q, k, v = (proj(n) for n in names[:3])
  logits = np.einsum('bqhk,bmhk->bhqm', q, k) / np.sqrt(q.shape[-1])
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  o = np.einsum('bhqm,bmhk->bqhk', w, v)
  return np.einsum('bqhk,hkd->bqd', o, p[f'{pre}/{names[3]}/kernel']) + p[f'{pre}/{names[3]}/bias']


def _ref_vit(flat, img, lora_scale=1.0):
  """vit_jax forward (exact GELU) in float64: (CLS feature after encoder_norm, logits)."""
  p = {k: np.asarray(v, np.float64) for k, v in flat.items()}
  x = _patch_conv(img.astype(np.float64), p['embedding/kernel']) + p['embedding/bias']
  cls = np.broadcast_to(p['cls'], (x.shape[0], 1, D))
  x = np.concatenate([cls, x], 1) + p['Transformer/posembed_input/pos_embedding']
  for i in range(DEPTH):
    b = f'Transformer/encoderblock_{i}'
    x = x + _ref_attention(_ln(x, p, f'{b}/LayerNorm_0', 1e-6), p,
                           f'{b}/MultiHeadDotProductAttention_1',
                           ('query', 'key', 'value', 'out'), lora_scale)
    y = _ln(x, p, f'{b}/LayerNorm_2', 1e-6) @ p[f'{b}/MlpBlock_3/Dense_0/kernel']
    y = y + p[f'{b}/MlpBlock_3/Dense_0/bias']
    y = 0.5 * y * (1.0 + erf(y / np.sqrt(2.0)))
    x = x + y @ p[f'{b}/MlpBlock_3/Dense_1/kernel'] + p[f'{b}/MlpBlock_3/Dense_1/bias']
  feat = _ln(x, p, 'Transformer/encoder_norm', 1e-6)[:, 0]
  return feat, feat @ p['head/kernel'] + p['head/bias']


def _ref_clip(flat, img, lora_scale=1.0):
  """OpenAI CLIP VisionTransformer.forward (QuickGELU, eps 1e-5) in float64."""
  p = {k: np.asarray(v, np.float64) for k, v in flat.items()}
  x = _patch_conv(img.astype(np.float64), p['conv1/kernel'])  # conv1 has no bias
  cls = np.broadcast_to(p['class_embedding'], (x.shape[0], 1, D))
  x = np.concatenate([cls, x], 1) + p['positional_embedding']
  x = _ln(x, p, 'ln_pre', 1e-5)
  for i in range(DEPTH):
    b = f'transformer/resblocks_{i}'
    x = x + _ref_attention(_ln(x, p, f'{b}/ln_1', 1e-5), p, f'{b}/attn',
                           ('q_proj', 'k_proj', 'v_proj', 'out_proj'), lora_scale)
    y = _ln(x, p, f'{b}/ln_2', 1e-5) @ p[f'{b}/mlp/c_fc/kernel'] + p[f'{b}/mlp/c_fc/bias']
    y = y / (1.0 + np.exp(-1.702 * y))
    x = x + y @ p[f'{b}/mlp/c_proj/kernel'] + p[f'{b}/mlp/c_proj/bias']
  return _ln(x[:, 0], p, 'ln_post', 1e-5) @ p['proj']


@functools.cache
def _fwd(model):
  return _jit(lambda p, x: model.apply({'params': p}, x))


def _images(seed, n=2):
  return np.random.default_rng(seed).standard_normal((n, SIZE, SIZE, 3)).astype(np.float32)


# ---------------------------------------------------------------------------
# Layout and numerics
# ---------------------------------------------------------------------------


def test_layouts_match_checkpoint_keys():
  assert _shape_dict(VIT) == _augreg_shapes()
  assert _shape_dict(VIT_LORA) == _augreg_shapes(rank=4)
  assert _shape_dict(vit.vit_tiny_test()) == {
    k: v for k, v in _augreg_shapes().items() if not k.startswith('head/')}
  assert _shape_dict(CLIP_LORA) == _clip_shapes(rank=2)


def test_vit_matches_numpy_reference():
  flat = _random(_augreg_shapes(), 0)
  img = _images(1)
  feat, logits = _fwd(VIT)(_tree(flat), jnp.asarray(img))
  want_feat, want_logits = _ref_vit(flat, img)
  assert feat.shape == (2, D) and logits.shape == (2, 5)
  np.testing.assert_allclose(np.asarray(feat), want_feat, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(np.asarray(logits), want_logits, rtol=1e-4, atol=1e-4)


def test_clip_with_lora_matches_numpy_reference():
  flat = _random(_clip_shapes(rank=2), 2)  # random A and B: the adapter path matters
  img = _images(3)
  emb, logits = _fwd(CLIP_LORA)(_tree(flat), jnp.asarray(img))
  assert logits is None and emb.shape == (2, 16)
  np.testing.assert_allclose(np.asarray(emb), _ref_clip(flat, img, lora_scale=1.5),
                             rtol=1e-4, atol=1e-4)


def test_parameter_counts_of_base_models():
  counts = lambda m: vit.count_params_by_label(vit.param_shapes(m))
  assert counts(vit.vit_b32()) == {'backbone': 87_455_232, 'adapter': 0, 'head': 0}
  assert counts(vit.vit_b32(lora_rank=16, num_classes=10)) == {
    'backbone': 87_455_232, 'adapter': 589_824, 'head': 7_690}
  clip = vit.get_model('ViT-B-32-quickgelu', lora_rank=16)
  assert vit.count_adapter_params(vit.param_shapes(clip)) == 589_824
  assert counts(clip)['backbone'] == 87_849_216  # OpenAI CLIP ViT-B/32 visual
  assert counts(vit.vit_b16())['backbone'] == 85_798_656  # timm vit_base_patch16_224 minus fc


# ---------------------------------------------------------------------------
# LoRA
# ---------------------------------------------------------------------------


@functools.cache
def _lora_init(seed):
  x = jnp.zeros((1, SIZE, SIZE, 3), jnp.float32)
  return _jit(VIT_LORA.init)(jax.random.key(seed), x)['params']


def _with_backbone(lora_params, plain_flat):
  """The adapters (and nothing else) of ``lora_params`` on the backbone/head ``plain_flat``."""
  flat = {k: v for k, v in vit.flatten_params(lora_params).items()
          if k.endswith(('lora_a', 'lora_b'))}
  return _tree({**plain_flat, **flat})


def test_zero_b_gives_the_frozen_output_bitwise():
  plain = _random(_augreg_shapes(), 4)
  params = _with_backbone(_lora_init(0), plain)
  assert all(not np.any(np.asarray(v)) for k, v in vit.flatten_params(params).items()
             if k.endswith('lora_b'))
  x = jnp.asarray(_images(5))
  got, want = _fwd(VIT_LORA)(params, x), _fwd(VIT)(_tree(plain), x)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_merged_apply_matches_unmerged():
  plain = _random(_augreg_shapes(), 6)
  lora = {k: v for k, v in _random(_augreg_shapes(rank=4), 7).items()
          if k.endswith(('lora_a', 'lora_b'))}  # B != 0
  params = _tree({**plain, **lora})
  x = jnp.asarray(_images(8))
  got = _jit(functools.partial(vit.apply_merged, VIT_LORA))(params, x)
  want = _fwd(VIT_LORA)(params, x)
  assert not np.allclose(np.asarray(want[0]), np.asarray(_fwd(VIT)(_tree(plain), x)[0]))
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
  assert not vit.count_adapter_params(vit.merge_lora(params, 2.0))
  np.testing.assert_allclose(np.asarray(_ref_vit({**plain, **lora}, np.asarray(x), 2.0)[0]),
                             np.asarray(want[0]), rtol=1e-4, atol=1e-4)

  # Stacked trees (a leading client axis) merge client by client.
  other = jax.tree.map(lambda v: 0.5 * v, params)
  stacked = vit.merge_lora(jax.tree.map(lambda a, b: jnp.stack([a, b]), params, other), 2.0)
  for i, tree in enumerate((params, other)):
    jax.tree.map(lambda s, m: np.testing.assert_allclose(s[i], m, rtol=1e-6, atol=1e-6),
                 stacked, vit.merge_lora(tree, 2.0))


def test_param_labels_cover_every_leaf():
  for model in (VIT_LORA, CLIP_LORA.clone(num_classes=3)):
    shapes = vit.param_shapes(model)
    labels = vit.param_labels(shapes)
    assert jax.tree.structure(labels) == jax.tree.structure(shapes)
    flat = vit.flatten_params(labels)
    assert set(flat.values()) == set(vit.LABELS)
    for key, label in flat.items():
      want = ('adapter' if key.rsplit('/', 1)[-1] in ('lora_a', 'lora_b')
              else 'head' if key.startswith('head/') else 'backbone')
      assert label == want, key
  # Usable as an optax.multi_transform label tree: only adapters and head move.
  params = _lora_init(0)
  tx = optax.multi_transform({'backbone': optax.set_to_zero(), 'adapter': optax.sgd(1.0),
                              'head': optax.sgd(1.0)}, vit.param_labels)
  ones = jax.tree.map(jnp.ones_like, params)
  updates, _ = tx.update(ones, tx.init(params), params)
  moved = {k: bool(np.any(np.asarray(u))) for k, u in vit.flatten_params(updates).items()}
  assert moved == {k: lab != 'backbone' for k, lab in vit.flatten_params(
    vit.param_labels(params)).items()}


def test_adapter_a_is_shared_across_client_keys():
  p0, p1 = _lora_init(0), _lora_init(1)
  f0, f1 = vit.flatten_params(p0), vit.flatten_params(p1)
  a_keys = [k for k in f0 if k.endswith('lora_a')]
  assert len(a_keys) == 2 * DEPTH
  for k in a_keys:
    np.testing.assert_array_equal(np.asarray(f0[k]), np.asarray(f1[k]))
    a = np.asarray(f0[k])
    assert np.abs(a).max() <= 1 / np.sqrt(D) and np.abs(a).max() > 0.8 / np.sqrt(D)
  assert len({np.asarray(f0[k]).tobytes() for k in a_keys}) == len(a_keys)  # per block and q/v
  assert not np.array_equal(np.asarray(f0['embedding/kernel']), np.asarray(f1['embedding/kernel']))

  # Adding adapters to a loaded backbone gives the init's adapters; another seed other A's.
  backbone = vit.unflatten_params({k: v for k, v in f0.items() if 'lora' not in k})
  again = vit.flatten_params(vit.add_adapters(backbone, rank=4, seed=0))
  assert again.keys() == f0.keys()
  for k in f0:
    np.testing.assert_array_equal(np.asarray(again[k]), np.asarray(f0[k]))
  reseeded = vit.flatten_params(vit.add_adapters(backbone, rank=4, seed=1))
  assert not np.array_equal(np.asarray(reseeded[a_keys[0]]), np.asarray(f0[a_keys[0]]))


# ---------------------------------------------------------------------------
# Loading and errors
# ---------------------------------------------------------------------------


def test_npz_round_trip(tmp_path):
  flat = _random(_augreg_shapes(), 9)
  np.savez(tmp_path / 'augreg.npz', **flat)
  loaded = vit.load_npz(str(tmp_path / 'augreg.npz'))
  assert vit.flatten_params(loaded).keys() == flat.keys()
  x = jnp.asarray(_images(10))
  for g, w in zip(_fwd(VIT)(loaded, x), _fwd(VIT)(_tree(flat), x)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_errors():
  with pytest.raises(ValueError, match='expected 32x32 images'):
    jax.eval_shape(lambda x: VIT.init(jax.random.key(0), x),
                   jax.ShapeDtypeStruct((1, 64, 64, 3), jnp.float32))
  with pytest.raises(ConfigError, match="unknown ViT model 'vit_h14'; valid choices: 'vit_b32'"):
    vit.get_model('vit_h14')
  with pytest.raises(ValueError, match='lora_rank must be >= 0'):
    vit.param_shapes(vit.vit_tiny_test(lora_rank=-1))
  # CLIP towers are named as OpenCLIP names them; the name says the activation.
  assert vit.get_model('ViT-B-32-256').image_size == 256
  assert [vit.activation(vit.get_model(m)) for m in vit.OPENCLIP_MODELS] == [
      'gelu', 'quick_gelu', 'gelu']
  with pytest.raises(TypeError, match='quick_gelu'):  # no silent default activation
    vit.clip_vit_b32()
