"""ViT / CLIP checkpoint conversion, zero-shot heads and their scripts (no download, no torch).

State dicts are written out here by key name and shape, as timm and OpenCLIP
name them, and filled with seeded random values. The converted Flax models are
checked against float64 NumPy forward passes in PyTorch semantics (fused qkv,
(out, in) Linear weights, OIHW convs), and the AugReg layout against a
hand-made AugReg dict of the same weights.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import types
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf

from fedjax_mtl.data import zeroshot_templates as zt
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.models import convert_vit as cv
from fedjax_mtl.models import vit, zeroshot

_jit = functools.partial(jax.jit, compiler_options={'xla_backend_optimization_level': 0})
D, DEPTH, HEADS, MLP, PATCH, SIZE, EMBED, CLASSES = 32, 2, 2, 64, 8, 32, 16, 5
HD = D // HEADS
TOKENS = 1 + (SIZE // PATCH) ** 2
VIT = vit.vit_tiny_test(num_classes=CLASSES)
CLIP = vit.clip_tiny_test()
SCRIPTS = os.path.join(os.path.dirname(__file__), '..', 'scripts')


# ---------------------------------------------------------------------------
# State dicts by hand, NumPy references
# ---------------------------------------------------------------------------


def _block_shapes(prefix, names, qkv):
  """One pre-LN block: names = (norm1, norm2, proj, fc1, fc2) in the checkpoint's naming."""
  n1, n2, proj, fc1, fc2 = names
  w, b = qkv
  return {f'{prefix}.{n1}.weight': (D,), f'{prefix}.{n1}.bias': (D,),
          f'{prefix}.{n2}.weight': (D,), f'{prefix}.{n2}.bias': (D,),
          f'{prefix}.{w}': (3 * D, D), f'{prefix}.{b}': (3 * D,),
          f'{prefix}.{proj}.weight': (D, D), f'{prefix}.{proj}.bias': (D,),
          f'{prefix}.{fc1}.weight': (MLP, D), f'{prefix}.{fc1}.bias': (MLP,),
          f'{prefix}.{fc2}.weight': (D, MLP), f'{prefix}.{fc2}.bias': (D,)}


def _timm_shapes(head=True):
  s = {'cls_token': (1, 1, D), 'pos_embed': (1, TOKENS, D),
       'patch_embed.proj.weight': (D, 3, PATCH, PATCH), 'patch_embed.proj.bias': (D,),
       'norm.weight': (D,), 'norm.bias': (D,)}
  if head:
    s.update({'head.weight': (CLASSES, D), 'head.bias': (CLASSES,)})
  for i in range(DEPTH):
    s.update(_block_shapes(f'blocks.{i}', ('norm1', 'norm2', 'attn.proj', 'mlp.fc1', 'mlp.fc2'),
                           ('attn.qkv.weight', 'attn.qkv.bias')))
  return s


def _openclip_shapes():
  s = {'class_embedding': (D,), 'positional_embedding': (TOKENS, D),
       'conv1.weight': (D, 3, PATCH, PATCH), 'ln_pre.weight': (D,), 'ln_pre.bias': (D,),
       'ln_post.weight': (D,), 'ln_post.bias': (D,), 'proj': (D, EMBED)}
  for i in range(DEPTH):
    s.update(_block_shapes(f'transformer.resblocks.{i}',
                           ('ln_1', 'ln_2', 'attn.out_proj', 'mlp.c_fc', 'mlp.c_proj'),
                           ('attn.in_proj_weight', 'attn.in_proj_bias')))
  return s


def _random(shapes, seed):
  """Seeded float32 values; LayerNorm weights near 1, everything else ~0.2 N(0, 1)."""
  rng = np.random.default_rng(seed)
  norm = ('norm', 'ln_')
  return {k: (1.0 + 0.1 * rng.standard_normal(s) if k.endswith('.weight') and len(s) == 1
              and any(n in k for n in norm) else 0.2 * rng.standard_normal(s)).astype(np.float32)
          for k, s in sorted(shapes.items())}


TEXT_TOWER = {  # what a whole OpenCLIP model's state dict holds besides the image tower
  'token_embedding.weight': (49, 16), 'positional_embedding': (7, 16),
  'transformer.resblocks.0.attn.in_proj_weight': (48, 16), 'ln_final.weight': (16,),
  'ln_final.bias': (16,), 'text_projection': (16, EMBED), 'logit_scale': (),
}


def _ln(x, w, b, eps):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * w + b


def _conv_tokens(img, weight):
  """Stride-p conv with an OIHW weight on NHWC images -> row-major tokens [B, N, D]."""
  b, n = img.shape[0], img.shape[1] // PATCH
  patches = img.reshape(b, n, PATCH, n, PATCH, 3)  # b, i, p, j, q, c
  return np.einsum('bipjqc,dcpq->bijd', patches, weight).reshape(b, n * n, -1)


def _torch_attention(x, w_in, b_in, w_out, b_out):
  """nn.MultiheadAttention / timm Attention: fused in-projection, heads contiguous per q/k/v."""
  b, n, _ = x.shape
  qkv = (x @ w_in.T + b_in).reshape(b, n, 3, HEADS, HD)
  q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
  logits = np.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(HD)
  a = np.exp(logits - logits.max(-1, keepdims=True))
  a /= a.sum(-1, keepdims=True)
  return np.einsum('bhqk,bkhd->bqhd', a, v).reshape(b, n, D) @ w_out.T + b_out


def _ref_timm(sd, img):
  """timm ViT forward in float64: (normed [CLS] feature, head logits)."""
  p = {k: np.asarray(v, np.float64) for k, v in sd.items()}
  x = _conv_tokens(img.astype(np.float64), p['patch_embed.proj.weight'])
  x = x + p['patch_embed.proj.bias']
  x = np.concatenate([np.broadcast_to(p['cls_token'], (len(x), 1, D)), x], 1) + p['pos_embed']
  for i in range(DEPTH):
    t = lambda n: p[f'blocks.{i}.{n}']  # noqa: E731
    y = _ln(x, t('norm1.weight'), t('norm1.bias'), 1e-6)
    x = x + _torch_attention(y, t('attn.qkv.weight'), t('attn.qkv.bias'), t('attn.proj.weight'),
                             t('attn.proj.bias'))
    y = _ln(x, t('norm2.weight'), t('norm2.bias'), 1e-6) @ t('mlp.fc1.weight').T + t('mlp.fc1.bias')
    y = 0.5 * y * (1 + erf(y / np.sqrt(2)))
    x = x + y @ t('mlp.fc2.weight').T + t('mlp.fc2.bias')
  feat = _ln(x[:, 0], p['norm.weight'], p['norm.bias'], 1e-6)
  return feat, feat @ p['head.weight'].T + p['head.bias']


def _ref_openclip(sd, img, quick_gelu=True):
  """OpenCLIP image tower forward in float64 (QuickGELU, or the exact GELU); ``sd`` without
  the ``visual.`` prefix."""
  p = {k: np.asarray(v, np.float64) for k, v in sd.items()}
  x = _conv_tokens(img.astype(np.float64), p['conv1.weight'])
  x = np.concatenate([np.broadcast_to(p['class_embedding'], (len(x), 1, D)), x], 1)
  x = _ln(x + p['positional_embedding'], p['ln_pre.weight'], p['ln_pre.bias'], 1e-5)
  for i in range(DEPTH):
    t = lambda n: p[f'transformer.resblocks.{i}.{n}']  # noqa: E731
    y = _ln(x, t('ln_1.weight'), t('ln_1.bias'), 1e-5)
    x = x + _torch_attention(y, t('attn.in_proj_weight'), t('attn.in_proj_bias'),
                             t('attn.out_proj.weight'), t('attn.out_proj.bias'))
    y = _ln(x, t('ln_2.weight'), t('ln_2.bias'), 1e-5) @ t('mlp.c_fc.weight').T + t('mlp.c_fc.bias')
    y = y / (1 + np.exp(-1.702 * y)) if quick_gelu else 0.5 * y * (1 + erf(y / np.sqrt(2)))
    x = x + y @ t('mlp.c_proj.weight').T + t('mlp.c_proj.bias')
  return _ln(x[:, 0], p['ln_post.weight'], p['ln_post.bias'], 1e-5) @ p['proj']


def _augreg_from_timm(sd):
  """The same weights in the vit_jax / AugReg .npz layout, key by key."""
  a = {'cls': sd['cls_token'], 'Transformer/posembed_input/pos_embedding': sd['pos_embed'],
       'embedding/kernel': sd['patch_embed.proj.weight'].transpose(2, 3, 1, 0),
       'embedding/bias': sd['patch_embed.proj.bias'],
       'Transformer/encoder_norm/scale': sd['norm.weight'],
       'Transformer/encoder_norm/bias': sd['norm.bias'],
       'head/kernel': sd['head.weight'].T, 'head/bias': sd['head.bias']}
  for i in range(DEPTH):
    t, b = f'blocks.{i}.', f'Transformer/encoderblock_{i}/'
    mha = b + 'MultiHeadDotProductAttention_1/'
    for ln, norm in (('LayerNorm_0', 'norm1'), ('LayerNorm_2', 'norm2')):
      a[f'{b}{ln}/scale'], a[f'{b}{ln}/bias'] = sd[f'{t}{norm}.weight'], sd[f'{t}{norm}.bias']
    for j, name in enumerate(('query', 'key', 'value')):
      rows = slice(j * D, (j + 1) * D)
      a[f'{mha}{name}/kernel'] = sd[t + 'attn.qkv.weight'][rows].T.reshape(D, HEADS, HD)
      a[f'{mha}{name}/bias'] = sd[t + 'attn.qkv.bias'][rows].reshape(HEADS, HD)
    a[mha + 'out/kernel'] = sd[t + 'attn.proj.weight'].T.reshape(HEADS, HD, D)
    a[mha + 'out/bias'] = sd[t + 'attn.proj.bias']
    for dense, fc in (('Dense_0', 'fc1'), ('Dense_1', 'fc2')):
      a[f'{b}MlpBlock_3/{dense}/kernel'] = sd[f'{t}mlp.{fc}.weight'].T
      a[f'{b}MlpBlock_3/{dense}/bias'] = sd[f'{t}mlp.{fc}.bias']
  return a


@functools.cache
def _fwd(model):
  return _jit(lambda p, x: model.apply({'params': p}, x))


def _images(seed=0, n=2):
  return np.random.default_rng(seed).uniform(-1, 1, (n, SIZE, SIZE, 3)).astype(np.float32)


def _assert_close(got, want, rel=1e-4):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  assert got.shape == want.shape
  assert np.abs(got - want).max() <= rel * np.abs(want).max(), np.abs(got - want).max()


def _assert_trees_equal(a, b):
  fa, fb = vit.flatten_params(a), vit.flatten_params(b)
  assert fa.keys() == fb.keys()
  for k in fa:
    np.testing.assert_array_equal(np.asarray(fa[k]), np.asarray(fb[k]), err_msg=k)


def _error(fn, *args, **kwargs) -> str:
  """The message of the ConfigError ``fn`` raises; it must be one line."""
  with pytest.raises(ConfigError) as err:
    fn(*args, **kwargs)
  msg = str(err.value)
  assert '\n' not in msg
  return msg


# ---------------------------------------------------------------------------
# Conversion against NumPy references and across layouts
# ---------------------------------------------------------------------------


def test_timm_matches_numpy_reference():
  sd = _random(_timm_shapes(), 0)
  img = _images()
  feat_ref, logits_ref = _ref_timm(sd, img)
  params = cv.convert_timm(sd, VIT, keep_head=True)
  feat, logits = _fwd(VIT)(params, img)
  _assert_close(feat, feat_ref)
  _assert_close(logits, logits_ref)
  # Backbone only (the default): no head, adapters added on top leave the output unchanged.
  backbone = cv.convert_timm(sd, 'vit_tiny_test')
  assert 'head' not in backbone and backbone['embedding']['kernel'].dtype == np.float32
  lora = vit.vit_tiny_test(num_classes=CLASSES, lora_rank=2)
  tree = vit.add_adapters(dict(backbone, head=params['head']), rank=2)
  assert vit.count_adapter_params(tree) > 0
  feat_lora, _ = _fwd(lora)(tree, img)
  _assert_close(feat_lora, feat_ref)


def test_augreg_layout_equals_timm_layout():
  sd = _random(_timm_shapes(), 1)
  augreg = _augreg_from_timm(sd)
  _assert_trees_equal(cv.convert_augreg(augreg, VIT, keep_head=True),
                      cv.convert_timm(sd, VIT, keep_head=True))
  # IN-21k style: a pre_logits layer and a 21k head are ignored for the backbone ...
  augreg['pre_logits/kernel'] = np.zeros((D, D), np.float32)
  augreg['pre_logits/bias'] = np.zeros((D,), np.float32)
  augreg['head/kernel'] = np.zeros((D, 21843), np.float32)
  augreg['head/bias'] = np.zeros((21843,), np.float32)
  backbone = cv.convert_augreg(augreg, vit.vit_tiny_test(lora_rank=4))
  _assert_trees_equal(backbone, cv.convert_timm(sd, 'vit_tiny_test'))
  # ... but that head cannot be kept (it classifies pre_logits, not the [CLS] feature).
  assert 'pre-logits' in _error(cv.convert_augreg, augreg, VIT, keep_head=True)


def test_openclip_matches_numpy_reference():
  tower = _random(_openclip_shapes(), 2)
  img = _images(1)
  want = _ref_openclip(tower, img)
  full = {'visual.' + k: v for k, v in tower.items()}
  full.update(_random(TEXT_TOWER, 3))  # the text tower is ignored
  params = cv.convert_openclip(full, 'clip_tiny_test', activation='quick_gelu')
  emb, logits = _fwd(CLIP)(params, img)
  assert logits is None
  _assert_close(emb, want)
  # The same tower without the prefix, and behind DistributedDataParallel's 'module.'.
  _assert_trees_equal(cv.convert_openclip(tower, CLIP, activation='quick_gelu'), params)
  _assert_trees_equal(cv.convert_openclip({'module.' + k: v for k, v in full.items()}, CLIP,
                                          activation='quick_gelu'), params)


def test_an_openclip_checkpoint_loads_only_into_its_own_activation(tmp_path):
  # Exact-GELU weights (OpenCLIP 'ViT-B-32', not '-quickgelu'): a state dict does not say
  # which activation it was trained with, and the QuickGELU tower would run it 'fine'.
  tower = {'visual.' + k: v for k, v in _random(_openclip_shapes(), 13).items()}
  np.savez(tmp_path / 'clip.npz', **tower)
  img = _images(13)
  want = _ref_openclip({k[len('visual.'):]: v for k, v in tower.items()}, img, quick_gelu=False)
  gelu = vit.clip_tiny_test(quick_gelu=False)
  _assert_close(_fwd(gelu)(cv.load_vit(tmp_path / 'clip.npz', gelu, activation='gelu'), img)[0],
                want)
  wrong = _fwd(CLIP)(cv.convert_openclip(tower, CLIP, activation='quick_gelu'), img)[0]
  assert np.abs(np.asarray(wrong) - want).max() > 1e-2 * np.abs(want).max()  # what went unseen
  # Nothing said: one line asking for the OpenCLIP name or the activation.
  msg = _error(cv.load_vit, tmp_path / 'clip.npz', CLIP)
  assert msg.startswith('an OpenCLIP state dict does not record its activation')
  assert "'ViT-B-32-quickgelu'" in msg and "activation='gelu'" in msg
  # Said, but not the model's: one line naming both.
  msg = _error(cv.load_vit, tmp_path / 'clip.npz', CLIP, activation='gelu')
  assert "activation 'gelu'" in msg and "uses 'quick_gelu'" in msg
  # OpenCLIP's names say it; the check comes before any array is read.
  msg = _error(cv.convert_openclip, tower, 'ViT-B-32-quickgelu', activation='gelu')
  assert "uses 'quick_gelu'; use model 'ViT-B-32'" in msg
  assert 'does not match' in _error(cv.convert_openclip, tower, 'ViT-B-32')  # shapes, not the act
  # A converted file records the activation and the model; loading checks them.
  cv.save_npz(cv.convert_openclip(tower, gelu, activation='gelu'), tmp_path / 'gelu.npz',
              model=gelu)
  assert vit.npz_meta(str(tmp_path / 'gelu.npz'))['activation'] == 'gelu'
  _assert_close(_fwd(gelu)(cv.load_vit(tmp_path / 'gelu.npz', gelu), img)[0], want)
  msg = _error(cv.load_vit, tmp_path / 'gelu.npz', CLIP)
  assert msg.startswith("the augreg checkpoint holds weights trained with activation 'gelu' "
                        '(CLIPVisionTower(')
  assert "uses 'quick_gelu'" in msg
  assert 'records' in _error(cv.load_vit, tmp_path / 'gelu.npz', gelu, activation='quick_gelu')
  # A converted CLIP file from before activations were recorded: said again, or refused.
  cv.save_npz(cv.convert_openclip(tower, gelu, activation='gelu'), tmp_path / 'old.npz')
  assert 'convert the checkpoint again' in _error(cv.load_vit, tmp_path / 'old.npz', gelu)
  _assert_trees_equal(cv.load_vit(tmp_path / 'old.npz', gelu, activation='gelu'),
                      cv.load_vit(tmp_path / 'gelu.npz', gelu))


def test_round_trips(tmp_path):
  sd = _random(_timm_shapes(), 4)
  back = cv.to_timm(cv.convert_timm(sd, VIT, keep_head=True))
  assert back.keys() == sd.keys()
  for k in sd:
    np.testing.assert_array_equal(back[k], sd[k], err_msg=k)
  assert set(cv.to_timm(cv.convert_timm(sd, VIT))) == set(sd) - {'head.weight', 'head.bias'}

  tower = {'visual.' + k: v for k, v in _random(_openclip_shapes(), 5).items()}
  clip_params = cv.convert_openclip(tower, CLIP, activation='quick_gelu')
  back = cv.to_openclip(clip_params)
  assert back.keys() == tower.keys()
  for k in tower:
    np.testing.assert_array_equal(back[k], tower[k], err_msg=k)
  assert set(cv.to_openclip(clip_params, prefix='')) == {k[len('visual.'):] for k in tower}

  # save_npz -> vit.load_npz and load_vit (detected as the Flax/augreg layout), both towers.
  for params, model in ((cv.convert_timm(sd, VIT, keep_head=True), VIT), (clip_params, CLIP)):
    path = tmp_path / f'{type(model).__name__}.npz'
    cv.save_npz(params, path, model=model)
    assert not any('.tmp' in f for f in os.listdir(tmp_path))
    _assert_trees_equal(vit.load_npz(path), params)
    _assert_trees_equal(cv.load_vit(path, model, keep_head=model is VIT), params)


def test_load_vit_reads_every_layout(tmp_path):
  sd = _random(_timm_shapes(), 6)
  want = cv.convert_timm(sd, VIT, keep_head=True)
  np.savez(tmp_path / 'timm.npz', **sd)
  np.savez(tmp_path / 'augreg.npz', **_augreg_from_timm(sd))
  _assert_trees_equal(cv.load_vit(tmp_path / 'timm.npz', VIT, keep_head=True), want)
  _assert_trees_equal(cv.load_vit(tmp_path / 'augreg.npz', 'vit_tiny_test', source='augreg'),
                      cv.convert_timm(sd, 'vit_tiny_test'))
  tower = {'visual.' + k: v for k, v in _random(_openclip_shapes(), 7).items()}
  np.savez(tmp_path / 'clip.npz', **tower)
  _assert_trees_equal(cv.load_vit(tmp_path / 'clip.npz', CLIP, activation='quick_gelu'),
                      cv.convert_openclip(tower, CLIP, activation='quick_gelu'))
  assert 'no classification head' in _error(cv.load_vit, tmp_path / 'clip.npz', CLIP,
                                            keep_head=True)
  assert 'does not exist' in _error(cv.load_vit, tmp_path / 'nope.npz', CLIP)
  assert 'unknown checkpoint layout' in _error(cv.load_vit, tmp_path / 'clip.npz', CLIP,
                                               source='hf')


def test_safetensors(tmp_path):
  st = pytest.importorskip('safetensors.numpy')  # optional extra: fedjax_mtl[safetensors]
  sd = _random(_timm_shapes(), 8)
  st.save_file(sd, str(tmp_path / 'model.safetensors'))
  _assert_trees_equal(cv.load_vit(tmp_path / 'model.safetensors', VIT, keep_head=True),
                      cv.convert_timm(sd, VIT, keep_head=True))


def test_detect():
  assert cv.detect(_augreg_from_timm(_random(_timm_shapes(), 0))) == 'augreg'
  assert cv.detect(_timm_shapes()) == 'timm'
  assert cv.detect(['module.' + k for k in _timm_shapes()]) == 'timm'
  assert cv.detect(['visual.' + k for k in _openclip_shapes()] + list(TEXT_TOWER)) == 'openclip'
  assert cv.detect(_openclip_shapes()) == 'openclip'
  msg = _error(cv.detect, ['encoder.layer.0.attention.weight'])
  assert 'cannot detect' in msg and 'encoder.layer.0.attention.weight' in msg


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def test_unknown_and_missing_keys_one_line():
  sd = _random(_timm_shapes(head=False), 9)
  sd['blocks.0.attn.extra.weight'] = np.zeros(3, np.float32)
  del sd['norm.bias']
  msg = _error(cv.convert_timm, sd, 'vit_tiny_test')
  assert msg.startswith('timm checkpoint does not match vit_tiny_test: ')
  assert '1 unknown key(s): blocks.0.attn.extra.weight' in msg
  assert '1 missing key(s): norm.bias' in msg

  many = _random(_timm_shapes(head=False), 9)
  many.update({f'junk.{i:02d}': np.zeros(1, np.float32) for i in range(30)})
  assert '30 unknown key(s): junk.00, junk.01' in _error(cv.convert_timm, many, VIT)
  assert '(+22 more)' in _error(cv.convert_timm, many, VIT)

  tower = {'visual.' + k: v for k, v in _random(_openclip_shapes(), 9).items()}
  tower['bogus.weight'] = np.zeros(1, np.float32)  # neither tower: not silently dropped
  del tower['visual.ln_post.bias']
  msg = _error(cv.convert_openclip, tower, CLIP, activation='quick_gelu')
  assert "1 unknown key(s): bogus.weight" in msg and '1 missing key(s): ln_post.bias' in msg

  augreg = _augreg_from_timm(_random(_timm_shapes(), 9))
  del augreg['Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel']
  msg = _error(cv.convert_augreg, augreg, VIT, keep_head=True)
  assert '1 missing key(s): Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel' in msg


def test_shape_mismatch_names_key_and_shapes():
  sd = _random(_timm_shapes(), 10)
  sd['blocks.1.attn.qkv.weight'] = np.zeros((3 * D, 16), np.float32)
  msg = _error(cv.convert_timm, sd, VIT)
  assert ("shape mismatch for 'blocks.1.attn.qkv.weight': checkpoint (96, 16) vs model (96, 32)"
          in msg)
  # A checkpoint at another resolution: the hint says what to do.
  msg = _error(cv.convert_timm, _random(_timm_shapes(), 10), vit.vit_tiny_test(image_size=48))
  assert "'pos_embed': checkpoint (1, 17, 32) vs model (1, 37, 32)" in msg and 'image_size' in msg
  # The checkpoint's head has another number of classes than the model.
  msg = _error(cv.convert_timm, _random(_timm_shapes(), 10), vit.vit_tiny_test(num_classes=7),
               keep_head=True)
  assert "'head.bias': checkpoint (5,) vs model (7,)" in msg
  tower = _random(_openclip_shapes(), 10)
  tower['proj'] = np.zeros((D, 8), np.float32)
  assert "'proj': checkpoint (32, 8) vs model (32, 16)" in _error(
      cv.convert_openclip, tower, CLIP, activation='quick_gelu')


def test_model_and_option_errors():
  sd = _random(_timm_shapes(), 11)
  assert 'converts to a VisionTransformer' in _error(cv.convert_timm, sd, 'clip_tiny_test')
  tower = _random(_openclip_shapes(), 11)
  assert 'converts to a CLIPVisionTower' in _error(cv.convert_openclip, tower, VIT,
                                                  activation='gelu')
  assert 'num_classes' in _error(cv.convert_timm, sd, 'vit_tiny_test', keep_head=True)
  assert "unknown ViT model 'vit_huge'" in _error(cv.convert_timm, sd, 'vit_huge')
  lora = vit.add_adapters(cv.convert_timm(sd, 'vit_tiny_test'), rank=2)
  assert 'merge_lora' in _error(cv.to_timm, lora)
  assert 'no openclip name' in _error(cv.to_openclip, cv.convert_timm(sd, 'vit_tiny_test'))


# ---------------------------------------------------------------------------
# scripts/convert_vit.py
# ---------------------------------------------------------------------------


def _script(name):
  spec = importlib.util.spec_from_file_location(name, os.path.join(SCRIPTS, f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _error_line(capsys) -> str:
  err = capsys.readouterr().err
  assert err.startswith('error: ') and err.count('\n') == 1, err
  return err


def test_cli_writes_loadable_file_and_refuses_bad_input(tmp_path, capsys):
  cli = _script('convert_vit')
  sd = _random(_timm_shapes(), 12)
  src, out = tmp_path / 'timm.npz', tmp_path / 'out.npz'
  np.savez(src, **sd)
  assert cli.main(['--src', str(src), '--model', 'vit_tiny_test', '--out', str(out)]) == 0
  printed = capsys.readouterr().out
  count = cv.count_params(cv.convert_timm(sd, 'vit_tiny_test'))
  assert f'{count:,} params' in printed and 'vit_tiny_test' in printed
  _assert_trees_equal(vit.load_npz(out), cv.convert_timm(sd, 'vit_tiny_test'))
  before = out.read_bytes()

  # An existing output is kept; --force replaces it (here with the head kept).
  assert cli.main(['--src', str(src), '--model', 'vit_tiny_test', '--out', str(out)]) == 2
  assert 'exists; pass --force' in _error_line(capsys)
  assert out.read_bytes() == before
  assert cli.main(['--src', str(src), '--model', 'vit_tiny_test', '--out', str(out),
                   '--num-classes', str(CLASSES), '--force']) == 0
  capsys.readouterr()
  _assert_trees_equal(vit.load_npz(out), cv.convert_timm(sd, VIT, keep_head=True))

  bad = dict(sd)
  del bad['norm.weight']
  np.savez(tmp_path / 'bad.npz', **bad)
  (tmp_path / 'garbage.npz').write_bytes(b'not a checkpoint')
  (tmp_path / 'model.h5').write_bytes(b'')
  new = tmp_path / 'new.npz'
  cases = [
    (['--src', str(tmp_path / 'bad.npz'), '--model', 'vit_tiny_test'],
     '1 missing key(s): norm.weight'),
    (['--src', str(src), '--model', 'clip_tiny_test'], 'converts to a VisionTransformer'),
    (['--src', str(src), '--model', 'vit_nope'], "unknown ViT model 'vit_nope'"),
    (['--src', str(tmp_path / 'missing.npz'), '--model', 'vit_tiny_test'], 'does not exist'),
    (['--src', str(tmp_path / 'garbage.npz'), '--model', 'vit_tiny_test'],
     'cannot read checkpoint'),
    (['--src', str(tmp_path / 'model.h5'), '--model', 'vit_tiny_test'],
     "unsupported checkpoint extension '.h5'"),
  ]
  for argv, text in cases:
    assert cli.main(argv + ['--out', str(new)]) == 2, argv
    assert text in _error_line(capsys)
    assert not new.exists()
  assert cli.main(['--src', str(src), '--model', 'vit_tiny_test', '--out', str(tmp_path / 'x')]
                  ) == 2
  assert 'must end in .npz' in _error_line(capsys)
  assert sorted(os.listdir(tmp_path)) == ['bad.npz', 'garbage.npz', 'model.h5', 'out.npz',
                                         'timm.npz']

  # An OpenCLIP state dict: the activation is said (here with --activation), and recorded.
  np.savez(tmp_path / 'clip.npz', **{'visual.' + k: v
                                     for k, v in _random(_openclip_shapes(), 12).items()})
  argv = ['--src', str(tmp_path / 'clip.npz'), '--model', 'clip_tiny_test', '--out', str(new)]
  assert cli.main(argv) == 2
  assert 'does not record its activation' in _error_line(capsys) and not new.exists()
  assert cli.main(argv + ['--activation', 'quick_gelu']) == 0
  assert vit.npz_meta(str(new)) == {'activation': 'quick_gelu', 'model': 'clip_tiny_test'}


# ---------------------------------------------------------------------------
# Zero-shot heads
# ---------------------------------------------------------------------------


def test_class_names_and_templates():
  assert set(zt.CLASSNAMES) == set(zt.TEMPLATES) == set(zt.NUM_CLASSES) == set(zt.TASKS)
  for task in zt.TASKS:
    names = zt.CLASSNAMES[task]
    assert len(names) == len(set(names)) == zt.NUM_CLASSES[task], task
    assert all(name and name == name.strip() and '_' not in name for name in names), task
    assert all(t.count('{}') == 1 for t in zt.TEMPLATES[task]), task
  assert zt.CLASSNAMES['MNIST'] == tuple('0123456789')
  assert zt.CLASSNAMES['Cars'][0] == 'AM General Hummer SUV 2000'
  assert zt.CLASSNAMES['Cars'][-1] == 'smart fortwo Convertible 2012'
  assert zt.CLASSNAMES['SUN397'][:2] == ('abbey', 'airplane cabin')
  assert zt.CLASSNAMES['SUN397'][-1] == 'youth hostel'
  assert zt.CLASSNAMES['EuroSAT'][-1] == 'lake or sea'
  assert len(zt.TEMPLATES['RESISC45']) == 18
  assert zt.TEMPLATES['RESISC45'][1] == 'aerial imagery of {}.'
  assert zt.prompts('GTSRB', 'stop')[0] == 'a zoomed in photo of a "stop" traffic sign.'


def _fake_encoder(dim=EMBED):
  """Deterministic stand-in text tower: a pseudo-random vector per prompt."""
  def encode(prompts):
    return np.stack([np.random.default_rng(zlib.crc32(p.encode())).standard_normal(dim)
                     for p in prompts]).astype(np.float32)
  return encode


def test_class_weights_save_and_load_heads(tmp_path):
  encode = _fake_encoder()
  w = zeroshot.class_weights(encode, ['cat', 'dog', 'owl'], ['a {}.', 'the {}!'])
  assert w.shape == (EMBED, 3) and w.dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(w, axis=0), 1, rtol=1e-6)
  e = encode(['a dog.', 'the dog!']).astype(np.float64)
  e /= np.linalg.norm(e, axis=1, keepdims=True)
  np.testing.assert_allclose(w[:, 1], e.mean(0) / np.linalg.norm(e.mean(0)), rtol=1e-6)

  heads = {'EuroSAT': w, 'MNIST': np.ones((EMBED, 10), np.float32)}
  path = tmp_path / 'heads.npz'
  zeroshot.save_heads(path, heads, logit_scale=np.log(100.0), model='ViT-B-32-256')
  got = zeroshot.load_heads(path, ['EuroSAT', 'mnist'])
  assert list(got) == ['EuroSAT', 'mnist']
  np.testing.assert_array_equal(got['EuroSAT'], w)
  assert set(zeroshot.load_heads(path)) == {'EuroSAT', 'MNIST'}
  np.testing.assert_allclose(zeroshot.load_heads(path, ['EuroSAT'], scaled=True)['EuroSAT'],
                             100 * w, rtol=1e-5)
  assert zeroshot.load_logit_scale(path) == pytest.approx(np.log(100.0))

  feats = jnp.asarray(np.random.default_rng(0).standard_normal((4, EMBED)), jnp.float32)
  logits = zeroshot.zeroshot_logits(feats, jnp.asarray(w), np.log(100.0))
  z = np.asarray(feats) / np.linalg.norm(np.asarray(feats), axis=1, keepdims=True)
  np.testing.assert_allclose(np.asarray(logits), 100 * z @ w, rtol=1e-4, atol=1e-5)

  msg = _error(zeroshot.load_heads, path, ['EuroSAT', 'DTD', 'SVHN'])
  assert 'no head for DTD, SVHN' in msg and 'EuroSAT, MNIST' in msg
  assert 'does not exist' in _error(zeroshot.load_heads, tmp_path / 'none.npz', ['DTD'])
  assert 'expected [E, C]' in _error(zeroshot.save_heads, tmp_path / 'bad.npz',
                                     {'DTD': np.ones(3)}, 1.0)


def test_zeroshot_heads_script(tmp_path, capsys, monkeypatch):
  script = _script('zeroshot_heads')
  out = tmp_path / 'heads.npz'
  # Without OpenCLIP: one error line, nothing written.
  monkeypatch.setitem(sys.modules, 'open_clip', None)
  assert script.main(['--out', str(out)]) == 2
  assert 'pip install torch open_clip_torch' in _error_line(capsys)
  assert script.main(['--out', str(out), '--tasks', 'ImageNet']) == 2
  assert "unknown task 'ImageNet'" in _error_line(capsys)
  assert not out.exists()

  # With stand-ins for open_clip and torch: every task's head, shaped [E, C].
  encode = _fake_encoder()

  class Tensor:
    def __init__(self, x):
      self.x = x

    def float(self):
      return self

    def cpu(self):
      return self

    def numpy(self):
      return self.x

  class Tokens(list):
    def to(self, device):
      return self

  model = types.SimpleNamespace(eval=lambda: None, encode_text=lambda t: Tensor(encode(list(t))),
                                logit_scale=types.SimpleNamespace(item=lambda: 4.6))
  monkeypatch.setitem(sys.modules, 'open_clip', types.SimpleNamespace(
      create_model_and_transforms=lambda name, pretrained, device: (model, None, None),
      get_tokenizer=lambda name: Tokens))
  monkeypatch.setitem(sys.modules, 'torch', types.SimpleNamespace(no_grad=contextlib.nullcontext))
  assert script.main(['--out', str(out)]) == 0
  assert 'wrote' in capsys.readouterr().out
  heads = zeroshot.load_heads(out, zt.TASKS)
  assert {t: h.shape for t, h in heads.items()} == {t: (EMBED, zt.NUM_CLASSES[t]) for t in zt.TASKS}
  np.testing.assert_allclose(
      heads['SVHN'][:, 3], zeroshot.class_weights(encode, ['3'], zt.TEMPLATES['SVHN'])[:, 0])
  assert zeroshot.load_logit_scale(out) == pytest.approx(4.6)
  assert script.main(['--out', str(out), '--tasks', 'MNIST']) == 2  # exists, no --force
  assert 'pass --force' in _error_line(capsys)
