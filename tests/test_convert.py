"""Tests for Swin checkpoint conversion (synthetic state dicts; no torch needed)."""

from __future__ import annotations

import functools
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_mtl.models import convert, swin

_jit = functools.partial(jax.jit, compiler_options={'xla_backend_optimization_level': 0})
NANO = swin.swin_nano()
C0 = NANO.embed_dim  # stage-0 channels (input of the first patch merging)


@functools.cache
def _nano_shapes():
  return swin.param_shapes(NANO)


def _random_params(seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(np.float32), _nano_shapes())


def _mmseg_sd(seed: int = 0) -> dict[str, np.ndarray]:
  return convert.to_state_dict(_random_params(seed), 'mmseg')


def _assert_trees_equal(a, b):
  fa, fb = convert.flatten_tree(a), convert.flatten_tree(b)
  assert fa.keys() == fb.keys()
  for k in fa:
    np.testing.assert_array_equal(np.asarray(fa[k]), np.asarray(fb[k]), err_msg=str(k))


def test_mmseg_names_and_layouts():
  sd = _mmseg_sd()
  expect = {
    'patch_embed.projection.weight': (C0, 3, 4, 4),  # OIHW
    'patch_embed.norm.weight': (C0,),
    'stages.0.blocks.0.norm1.weight': (C0,),
    'stages.0.blocks.0.attn.w_msa.qkv.weight': (3 * C0, C0),  # (out, in)
    'stages.0.blocks.0.attn.w_msa.qkv.bias': (3 * C0,),
    'stages.0.blocks.0.attn.w_msa.proj.weight': (C0, C0),
    'stages.0.blocks.0.attn.w_msa.relative_position_bias_table': (49, 1),
    'stages.0.blocks.0.ffn.layers.0.0.weight': (4 * C0, C0),
    'stages.0.blocks.0.ffn.layers.1.weight': (C0, 4 * C0),
    'stages.0.downsample.norm.weight': (4 * C0,),
    'stages.0.downsample.reduction.weight': (2 * C0, 4 * C0),
    'norm3.bias': (8 * C0,),
  }
  for k, shape in expect.items():
    assert sd[k].shape == shape, k
  assert 'stages.3.downsample.reduction.weight' not in sd
  assert not any(k.endswith('reduction.bias') for k in sd)
  params = _random_params()
  np.testing.assert_array_equal(
    sd['stages.0.blocks.0.attn.w_msa.qkv.weight'], params['stages_0']['blocks_0']['attn']['qkv']['kernel'].T
  )
  np.testing.assert_array_equal(
    sd['patch_embed.projection.weight'], params['patch_embed']['proj']['kernel'].transpose(3, 2, 0, 1)
  )


def test_mmseg_round_trip_with_prefixes_and_buffers():
  params = _random_params()
  sd = convert.to_state_dict(params, 'mmseg')
  ckpt = {'backbone.' + k: v for k, v in sd.items()}
  # What a real mmseg UperNet checkpoint also holds: buffers and non-backbone heads.
  ckpt['backbone.stages.0.blocks.0.attn.w_msa.relative_position_index'] = np.zeros((49, 49), np.int64)
  ckpt['decode_head.conv_seg.weight'] = np.zeros((150, 512, 1, 1), np.float32)
  ckpt['auxiliary_head.conv_seg.bias'] = np.zeros((150,), np.float32)
  assert convert.detect_source([k[len('backbone.'):] for k in ckpt if k.startswith('backbone.')]) == 'mmseg'
  out = convert.convert_state_dict(ckpt, 'swin_nano')
  _assert_trees_equal(out, params)
  back = convert.to_state_dict(out)
  assert back.keys() == sd.keys()
  for k in sd:
    np.testing.assert_array_equal(back[k], sd[k])
  # Also accepts the model object and a fp16 checkpoint (cast to float32).
  half = {k: v.astype(np.float16) for k, v in sd.items()}
  out16 = convert.convert_state_dict(half, NANO, source='mmseg')
  assert out16['norm0']['scale'].dtype == np.float32


@pytest.mark.parametrize('naming, down_key', [('swin', 'layers.0.downsample.reduction.weight'),
                        ('timm', 'layers.1.downsample.reduction.weight')])
def test_swin_and_timm_round_trip(naming, down_key):
  params = _random_params(1)
  sd = convert.to_state_dict(params, naming)
  assert down_key in sd
  assert 'layers.0.blocks.0.attn.qkv.weight' in sd and 'layers.0.blocks.0.mlp.fc1.weight' in sd
  assert 'patch_embed.proj.weight' in sd
  sd['layers.0.blocks.0.attn_mask'] = np.zeros((4, 49, 49), np.float32)  # buffer: skipped
  assert convert.detect_source(sd) == naming
  _assert_trees_equal(convert.convert_state_dict(sd, 'swin_nano'), params)
  # Merge weights really are permuted relative to mmseg (not a silent no-op).
  mm = convert.to_state_dict(params, 'mmseg')
  assert not np.array_equal(sd[down_key], mm['stages.0.downsample.reduction.weight'])


def _layer_norm(v, g, b):
  mu, var = v.mean(-1, keepdims=True), v.var(-1, keepdims=True)
  return (v - mu) / np.sqrt(var + 1e-5) * g + b


def test_patch_merging_channel_order():
  """Original Swin concat order + swin weights == Unfold order + converted weights."""
  rng = np.random.default_rng(2)
  c = C0
  x = rng.standard_normal((1, 2, 2, c)).astype(np.float32)  # one 2x2 neighbourhood
  w = rng.standard_normal((2 * c, 4 * c)).astype(np.float32)  # torch (out, in), concat order
  g = (1 + 0.1 * rng.standard_normal(4 * c)).astype(np.float32)
  b = (0.1 * rng.standard_normal(4 * c)).astype(np.float32)
  # Original Swin: x0 = x[0::2, 0::2], x1 = x[1::2, 0::2], x2 = x[0::2, 1::2], x3 = x[1::2, 1::2].
  v = np.concatenate([x[0, 0, 0], x[0, 1, 0], x[0, 0, 1], x[0, 1, 1]])
  want = _layer_norm(v, g, b) @ w.T

  sd = convert.to_state_dict(_random_params(), 'swin')
  sd['layers.0.downsample.norm.weight'], sd['layers.0.downsample.norm.bias'] = g, b
  sd['layers.0.downsample.reduction.weight'] = w
  down = convert.convert_state_dict(sd, 'swin_nano')['stages_0']['downsample']
  got = _jit(lambda p, x: swin.PatchMerging().apply({'params': p}, x))(down, jnp.asarray(x))
  np.testing.assert_allclose(np.asarray(got)[0, 0, 0], want, rtol=1e-4, atol=1e-4)

  # The same weights in mmseg (Unfold) order applied to nn.Unfold's column: c*4 + ki*2 + kj.
  mm = convert.to_state_dict({'stages_0': {'downsample': down}}, 'mmseg')
  col = x[0].transpose(2, 0, 1).reshape(-1)  # (c, ki, kj) flattened
  ref = _layer_norm(col, mm['stages.0.downsample.norm.weight'], mm['stages.0.downsample.norm.bias'])
  np.testing.assert_allclose(ref @ mm['stages.0.downsample.reduction.weight'].T, want, rtol=1e-4, atol=1e-4)
  np.testing.assert_array_equal(convert.unfold_to_concat_order(convert.concat_to_unfold_order(w)), w)


def test_unknown_and_missing_keys_raise():
  sd = _mmseg_sd()
  sd['stages.0.blocks.0.attn.w_msa.extra.weight'] = np.zeros(3, np.float32)
  del sd['norm1.bias']
  with pytest.raises(ValueError) as err:
    convert.convert_state_dict(sd, 'swin_nano')
  msg = str(err.value)
  assert '\n' not in msg
  assert '1 unknown key(s): stages.0.blocks.0.attn.w_msa.extra.weight' in msg
  assert '1 missing key(s): norm1.bias' in msg

  many = _mmseg_sd()
  many.update({f'junk.{i:02d}': np.zeros(1, np.float32) for i in range(30)})
  with pytest.raises(ValueError, match=r'30 unknown key\(s\): junk\.00, .*\(\+22 more\)'):
    convert.convert_state_dict(many, 'swin_nano')


def test_shape_mismatch_raises():
  sd = _mmseg_sd()
  sd['stages.1.blocks.0.attn.w_msa.qkv.weight'] = np.zeros((3 * 32, 16), np.float32)
  with pytest.raises(ValueError, match=r'stages\.1\.blocks\.0\.attn\.w_msa\.qkv\.weight.*\(96, 16\).*\(96, 32\)'):
    convert.convert_state_dict(sd, 'swin_nano')
  with pytest.raises(ValueError, match='swin_t'):  # a nano checkpoint is not a swin_t
    convert.convert_state_dict(_mmseg_sd(), 'swin_t')


def test_classification_checkpoint_norms():
  params = _random_params(3)
  sd = convert.to_state_dict(params, 'timm')
  for i in range(4):
    sd.pop(f'norm{i}.weight'), sd.pop(f'norm{i}.bias')
  sd['norm.weight'], sd['norm.bias'] = np.asarray(params['norm3']['scale']), np.asarray(params['norm3']['bias'])
  sd['head.fc.weight'] = np.zeros((10, 128), np.float32)
  sd['head.fc.bias'] = np.zeros((10,), np.float32)
  with pytest.raises(ValueError, match=r'6 missing key\(s\): norm0\.bias'):
    convert.convert_state_dict(sd, 'swin_nano')
  out = convert.convert_state_dict(sd, 'swin_nano', init_missing_norms=True)
  np.testing.assert_array_equal(out['norm0']['scale'], np.ones(16, np.float32))
  np.testing.assert_array_equal(out['norm2']['bias'], np.zeros(64, np.float32))
  np.testing.assert_array_equal(out['norm3']['scale'], params['norm3']['scale'])  # final norm -> norm3
  np.testing.assert_array_equal(out['stages_2']['downsample']['reduction']['kernel'],
                  params['stages_2']['downsample']['reduction']['kernel'])


def test_npz_round_trip_and_load_pretrained(tmp_path):
  params = _random_params(4)
  path = tmp_path / 'nano.npz'
  convert.save_npz_params({'params': params}, path)
  with np.load(path) as f:
    assert 'stages_0/blocks_0/attn/qkv/kernel' in f.files
  _assert_trees_equal(convert.load_npz_params(path), params)
  _assert_trees_equal(convert.load_pretrained(path, 'swin_nano'), params)  # validated flax npz
  # A PyTorch-named state dict stored as .npz goes through conversion.
  sd_path = tmp_path / 'mmseg.npz'
  np.savez(sd_path, **{'backbone.' + k: v for k, v in convert.to_state_dict(params).items()})
  _assert_trees_equal(convert.load_pretrained(sd_path, NANO), params)


def test_cli_writes_npz(tmp_path, capsys):
  params = _random_params(5)
  src = tmp_path / 'ckpt.npz'
  np.savez(src, **convert.to_state_dict(params, 'swin'))
  spec = importlib.util.spec_from_file_location(
    'convert_swin', os.path.join(os.path.dirname(__file__), '..', 'scripts', 'convert_swin.py')
  )
  cli = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(cli)
  out = tmp_path / 'out.npz'
  assert cli.main(['--input', str(src), '--model', 'swin_nano', '--output', str(out)]) == 0
  assert 'swin_nano' in capsys.readouterr().out
  _assert_trees_equal(convert.load_npz_params(out), params)


def test_optional_dependencies_and_bad_extension(tmp_path):
  if importlib.util.find_spec('torch') is None:
    with pytest.raises(ImportError, match=r'pip install "fedjax_mtl\[torch\]"'):
      convert.load_checkpoint(tmp_path / 'x.pth')
  if importlib.util.find_spec('safetensors') is None:
    with pytest.raises(ImportError, match=r'pip install "fedjax_mtl\[safetensors\]"'):
      convert.load_checkpoint(tmp_path / 'x.safetensors')
  with pytest.raises(ValueError, match='unsupported checkpoint extension'):
    convert.load_checkpoint(tmp_path / 'x.h5')
  with pytest.raises(ValueError, match='cannot detect'):
    convert.convert_state_dict({'foo.weight': np.zeros(1)}, 'swin_nano')
