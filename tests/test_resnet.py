"""ResNet-18 encoder: torchvision layout, BN behaviour, dilation, and the torchvision converter.

The torchvision state dict is built here with NumPy from torchvision's names
and shapes (no torch, no download); the reference forward is plain NumPy in
float64 with PyTorch's conv/BN/maxpool semantics.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_mtl.errors import ConfigError
from fedjax_mtl.models import ENCODERS, convert, convert_resnet, get_encoder, resnet
from fedjax_mtl.models.multitask import MultiTaskNet

_jit = functools.partial(jax.jit, compiler_options={'xla_backend_optimization_level': 0})
RESNET18_PARAMS = 11_176_512  # torchvision resnet18 without fc (11,689,512 - 513,000)


# ---------------------------------------------------------------------------
# torchvision-layout state dict and NumPy reference forward
# ---------------------------------------------------------------------------


def _torchvision_resnet18_shapes() -> dict[str, tuple[int, ...]]:
  """Every entry of torchvision's resnet18().state_dict() with its shape."""
  shapes: dict[str, tuple[int, ...]] = {'conv1.weight': (64, 3, 7, 7)}

  def bn(prefix, c):
    for leaf in ('weight', 'bias', 'running_mean', 'running_var'):
      shapes[f'{prefix}.{leaf}'] = (c,)
    shapes[f'{prefix}.num_batches_tracked'] = ()

  bn('bn1', 64)
  cin = 64
  for i, c in enumerate((64, 128, 256, 512), start=1):
    for b in range(2):
      p = f'layer{i}.{b}'
      shapes[f'{p}.conv1.weight'] = (c, cin, 3, 3)
      bn(f'{p}.bn1', c)
      shapes[f'{p}.conv2.weight'] = (c, c, 3, 3)
      bn(f'{p}.bn2', c)
      if b == 0 and i > 1:
        shapes[f'{p}.downsample.0.weight'] = (c, cin, 1, 1)
        bn(f'{p}.downsample.1', c)
      cin = c
  shapes['fc.weight'], shapes['fc.bias'] = (1000, 512), (1000,)
  return shapes


@functools.cache
def _torch_sd(seed: int = 0) -> dict[str, np.ndarray]:
  """Seeded random torchvision resnet18 state dict (He-scaled convs, varied BN stats)."""
  rng = np.random.default_rng(seed)
  sd = {}
  for k, s in _torchvision_resnet18_shapes().items():
    if k.endswith('num_batches_tracked'):
      sd[k] = np.asarray(7, np.int64)
    elif k.endswith('running_var'):
      sd[k] = rng.uniform(0.5, 1.5, s).astype(np.float32)
    elif k.endswith(('running_mean', '.bias')):
      sd[k] = (0.1 * rng.standard_normal(s)).astype(np.float32)
    elif len(s) == 4:
      sd[k] = (rng.standard_normal(s) * np.sqrt(2.0 / np.prod(s[1:]))).astype(np.float32)
    elif len(s) == 1:  # BN weight
      sd[k] = rng.uniform(0.5, 1.5, s).astype(np.float32)
    else:  # fc.weight
      sd[k] = rng.standard_normal(s).astype(np.float32)
  return sd


def _np_conv(x, w, stride=1, pad=0, dil=1):
  """PyTorch Conv2d (no bias) on NHWC float64 `x` with OIHW `w`, by shifted einsums."""
  x = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  _, _, kh, kw = w.shape
  ho = (x.shape[1] - dil * (kh - 1) - 1) // stride + 1
  wo = (x.shape[2] - dil * (kw - 1) - 1) // stride + 1
  out = 0.0
  for a in range(kh):
    for b in range(kw):
      patch = x[:, a * dil:a * dil + stride * (ho - 1) + 1:stride,
                b * dil:b * dil + stride * (wo - 1) + 1:stride]
      out = out + np.einsum('nhwi,oi->nhwo', patch, w[:, :, a, b].astype(np.float64))
  return out


def _np_bn(x, sd, p):
  """Eval-mode BatchNorm2d with the running statistics."""
  g = lambda leaf: sd[f'{p}.{leaf}'].astype(np.float64)
  return (x - g('running_mean')) / np.sqrt(g('running_var') + 1e-5) * g('weight') + g('bias')


def _np_maxpool(x):
  """MaxPool2d(3, stride 2, padding 1): padding never wins the max."""
  x = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-np.inf)
  ho, wo = (x.shape[1] - 3) // 2 + 1, (x.shape[2] - 3) // 2 + 1
  return np.max([x[:, a:a + 2 * ho - 1:2, b:b + 2 * wo - 1:2]
                 for a in range(3) for b in range(3)], axis=0)


def _np_block(x, sd, p, stride, dil1, dil2):
  relu = lambda v: np.maximum(v, 0.0)
  y = relu(_np_bn(_np_conv(x, sd[f'{p}.conv1.weight'], stride, dil1, dil1), sd, f'{p}.bn1'))
  y = _np_bn(_np_conv(y, sd[f'{p}.conv2.weight'], 1, dil2, dil2), sd, f'{p}.bn2')
  if f'{p}.downsample.0.weight' in sd:
    x = _np_bn(_np_conv(x, sd[f'{p}.downsample.0.weight'], stride), sd, f'{p}.downsample.1')
  return relu(y + x)


def _np_resnet18(x, sd, dilate=(False, False, False)):
  """torchvision resnet18 stages (eval mode); `dilate` is replace_stride_with_dilation."""
  x = _np_maxpool(np.maximum(_np_bn(_np_conv(x, sd['conv1.weight'], 2, 3), sd, 'bn1'), 0))
  outs, dilation = [], 1
  for i in range(1, 5):
    stride, previous = (1 if i == 1 else 2), dilation
    if i > 1 and dilate[i - 2]:
      dilation, stride = dilation * stride, 1
    x = _np_block(x, sd, f'layer{i}.0', stride, previous, dilation)
    x = _np_block(x, sd, f'layer{i}.1', 1, dilation, dilation)
    outs.append(x)
  return outs


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------


def _init(model, size=64, train=False):
  return jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, size, size, 3)),
                                           train=train))


def test_registered_and_param_count():
  assert ENCODERS['resnet18'] is resnet.resnet18
  variables = _init(get_encoder('resnet18'))
  assert convert.count_params(variables['params']) == RESNET18_PARAMS
  # Same count as the torchvision names built independently here.
  sd_shapes = _torchvision_resnet18_shapes()
  n = sum(int(np.prod(s)) for k, s in sd_shapes.items()
          if not k.startswith('fc.') and not k.endswith(('running_mean', 'running_var',
                                                         'num_batches_tracked')))
  assert n == RESNET18_PARAMS
  # The dilated variant has exactly the same parameters (a checkpoint fits both).
  os8 = _init(get_encoder('resnet18_os8'))
  assert jax.tree.map(lambda s: s.shape, os8) == jax.tree.map(lambda s: s.shape, variables)


@pytest.mark.parametrize('name,strides', [('resnet18', (4, 8, 16, 32)),
                                          ('resnet18_os8', (4, 8, 8, 8))])
def test_stage_shapes_and_strides(name, strides):
  model = get_encoder(name)
  assert model.dims == (64, 128, 256, 512)
  variables = _init(model)
  outs = jax.eval_shape(lambda v: model.apply(v, jnp.zeros((2, 64, 64, 3))), variables)
  assert [o.shape for o in outs] == [(2, 64 // s, 64 // s, c)
                                     for s, c in zip(strides, model.dims)]


def test_output_stride_16_and_bad_values():
  model = resnet.resnet18(output_stride=16)
  outs = jax.eval_shape(lambda v: model.apply(v, jnp.zeros((1, 64, 64, 3))), _init(model))
  assert [o.shape[1] for o in outs] == [16, 8, 4, 4]
  with pytest.raises(ConfigError, match='output_stride'):
    _init(resnet.resnet18(output_stride=4))
  with pytest.raises(ConfigError, match='stage_sizes'):
    _init(resnet.ResNet(stage_sizes=(2, 0, 2, 2)))


def _small(**kw):
  return resnet.resnet18(width=8, **kw)


def _fresh_variables(model, seed=0):
  """He-normal kernels and fresh BN state (scale 1, bias 0, mean 0, var 1) with NumPy:
  executing `model.init` on CPU compiles one RNG kernel per shape (seconds)."""
  rng = np.random.default_rng(seed)
  def fill(path, s):
    leaf = path[-1].key
    if leaf == 'kernel':
      return (rng.standard_normal(s.shape) * np.sqrt(2 / np.prod(s.shape[:-1]))).astype(np.float32)
    return (np.ones if leaf in ('scale', 'var') else np.zeros)(s.shape, np.float32)
  return jax.tree_util.tree_map_with_path(fill, _init(model, 32))


def test_batchnorm_train_updates_running_stats_eval_uses_them():
  model = _small()
  x = jax.random.normal(jax.random.key(1), (2, 32, 32, 3))
  v = _fresh_variables(model)
  assert set(v) == {'params', 'batch_stats'}
  apply = _jit(lambda v, train: model.apply(v, x, train=train, mutable=['batch_stats']),
               static_argnums=1)
  tr_old, new = apply(v, True)
  # bn1 running stats move by PyTorch momentum 0.1 towards conv1's (biased) batch statistics.
  k = np.asarray(v['params']['conv1']['kernel'], np.float64).transpose(3, 2, 0, 1)
  y = _np_conv(np.asarray(x, np.float64), k, 2, 3)
  bs = new['batch_stats']['bn1']
  np.testing.assert_allclose(bs['mean'], 0.1 * y.mean((0, 1, 2)), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(bs['var'], 0.9 + 0.1 * y.var((0, 1, 2)), rtol=1e-4, atol=1e-6)
  # Eval mode leaves the running stats alone and normalises with them, not the batch's.
  ev_old, same = apply(v, False)
  jax.tree.map(np.testing.assert_array_equal, same['batch_stats'], v['batch_stats'])
  ev_new, _ = apply({**v, 'batch_stats': new['batch_stats']}, False)
  assert not np.allclose(ev_old[3], ev_new[3])
  assert not np.allclose(tr_old[0], ev_old[0])
  # Train mode ignores the running stats: same output whatever they hold.
  tr_new, _ = apply({**v, 'batch_stats': new['batch_stats']}, True)
  jax.tree.map(np.testing.assert_array_equal, tr_old, tr_new)


def test_remat_same_outputs_and_grads():
  x = jax.random.normal(jax.random.key(2), (2, 32, 32, 3))
  tiny = lambda **kw: resnet.ResNet(stage_sizes=(1, 1, 1, 1), width=8, **kw)
  v = _fresh_variables(tiny())

  def loss(params, model):
    outs, new = model.apply({'params': params, 'batch_stats': v['batch_stats']}, x,
                            train=True, mutable=['batch_stats'])
    return sum(jnp.mean(o**2) for o in outs), new

  traced = lambda model: str(jax.make_jaxpr(lambda p: loss(p, model))(v['params']))
  assert 'remat' in traced(tiny(remat=True)) and 'remat' not in traced(tiny())
  grad = _jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
  (l0, s0), g0 = grad(v['params'], tiny())
  (l1, s1), g1 = grad(v['params'], tiny(remat=True))
  np.testing.assert_allclose(l0, l1, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g0, g1)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), s0, s1)


@pytest.mark.parametrize('name', ['resnet18', 'resnet18_os8'])
def test_fedhca2_decoders_on_resnet_stages(name):
  """The task decoders take the stages at any strides and return full-size maps."""
  net = MultiTaskNet(ENCODERS[name](width=8), head_channels=(3, 1), train=True)
  x = jnp.zeros((2, 32, 32, 3))
  v = jax.eval_shape(lambda: net.init(jax.random.key(0), x))
  assert set(v['batch_stats']) == {'encoder', 'decoders'}
  outs, new = jax.eval_shape(lambda v: net.apply(v, x, mutable=['batch_stats']), v)
  assert [o.shape for o in outs] == [(2, 32, 32, 3), (2, 32, 32, 1)]
  assert jax.tree.map(lambda s: s.shape, new) == jax.tree.map(lambda s: s.shape,
                                                              {'batch_stats': v['batch_stats']})


# ---------------------------------------------------------------------------
# Converter
# ---------------------------------------------------------------------------


def test_converted_tree_matches_model_and_round_trips():
  sd = _torch_sd()
  params, stats = convert_resnet.resnet_params_from_torch(sd)
  want = _init(resnet.resnet18())
  shape = lambda t: jax.tree.map(np.shape, t)
  assert shape(params) == shape(want['params'])
  assert shape(stats) == shape(want['batch_stats'])
  np.testing.assert_array_equal(params['layer2_0']['downsample_0']['kernel'],
                                sd['layer2.0.downsample.0.weight'].transpose(2, 3, 1, 0))
  np.testing.assert_array_equal(stats['layer3_1']['bn2']['var'], sd['layer3.1.bn2.running_var'])
  np.testing.assert_array_equal(params['bn1']['scale'], sd['bn1.weight'])
  back = convert_resnet.resnet_state_dict_from_flax(params, stats)
  kept = {k for k in sd if not k.startswith('fc.') and not k.endswith('num_batches_tracked')}
  assert set(back) == kept
  for k in kept:
    np.testing.assert_array_equal(back[k], sd[k], err_msg=k)


@pytest.mark.parametrize('dilated', [False, True])
def test_converted_forward_matches_numpy_reference(dilated):
  sd = _torch_sd()
  params, stats = convert_resnet.resnet_params_from_torch(sd)
  model = resnet.resnet18_os8() if dilated else resnet.resnet18()
  x = np.random.default_rng(3).standard_normal((2, 32, 32, 3))
  outs = jax.jit(lambda v, x: model.apply(v, x, train=False))(
      {'params': params, 'batch_stats': stats}, jnp.asarray(x, jnp.float32))
  ref = _np_resnet18(x, sd, (False, True, True) if dilated else (False, False, False))
  for s, (o, r) in enumerate(zip(outs, ref)):
    assert o.shape == r.shape, s
    scale = np.abs(r).max()
    np.testing.assert_allclose(np.asarray(o) / scale, r / scale, atol=1e-5, err_msg=f'stage {s}')


def test_converter_errors():
  sd = dict(_torch_sd())
  with pytest.raises(ConfigError, match=r"1 missing key\(s\): layer1\.1\.bn2\.running_var"):
    convert_resnet.resnet_params_from_torch(
        {k: v for k, v in sd.items() if k != 'layer1.1.bn2.running_var'})
  with pytest.raises(ConfigError, match=r"unexpected key\(s\): layer1\.0\.conv3\.weight"):
    convert_resnet.resnet_params_from_torch({**sd, 'layer1.0.conv3.weight': sd['conv1.weight']})
  with pytest.raises(ConfigError, match=r"shape mismatch for 'layer2\.0\.conv1\.weight': "
                     r"checkpoint \(128, 64, 1, 1\) vs model \(128, 64, 3, 3\)"):
    convert_resnet.resnet_params_from_torch(
        {**sd, 'layer2.0.conv1.weight': sd['layer2.0.downsample.0.weight']})
  # A DataParallel prefix is dropped; classifier and counters are ignored.
  wrapped = {'module.' + k: v for k, v in sd.items() if not k.startswith('fc.')}
  p, _ = convert_resnet.resnet_params_from_torch(wrapped)
  np.testing.assert_array_equal(p['conv1']['kernel'], sd['conv1.weight'].transpose(2, 3, 1, 0))


def test_load_checkpoint_file(tmp_path):
  sd = _torch_sd()
  path = tmp_path / 'rn18.npz'
  np.savez(path, **sd)
  params, stats = convert_resnet.load_resnet_checkpoint(path)
  np.testing.assert_array_equal(stats['bn1']['mean'], sd['bn1.running_mean'])
  assert convert.count_params(params) == RESNET18_PARAMS
  with pytest.raises(ConfigError, match='does not exist'):
    convert_resnet.load_resnet_checkpoint(tmp_path / 'missing.pth')


def test_pretrained_path_loads_params_and_running_statistics(tmp_path):
  """`model.pretrained_path` for a ResNet: the engine's loader returns the converted
  params and batch-norm statistics, checked against the client's encoder shapes."""
  from fedjax_mtl import experiment
  sd = _torch_sd()
  path = tmp_path / 'rn18.npz'
  np.savez(path, **sd)
  model = resnet.resnet18()
  like = _init(model)
  enc = experiment.load_pretrained_encoder(str(path), model, like)
  np.testing.assert_array_equal(enc['batch_stats']['bn1']['var'], sd['bn1.running_var'])
  np.testing.assert_array_equal(enc['params']['conv1']['kernel'],
                                sd['conv1.weight'].transpose(2, 3, 1, 0))
  with pytest.raises(ConfigError, match='do not match model'):
    other = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[:-1] + (x.shape[-1] + 1,),
                                                        x.dtype), like)
    experiment.load_pretrained_encoder(str(path), model, other)


# ---------------------------------------------------------------------------
# DeepLab-v3 head (NTKFedAvg benchmark A, MaT-FL's per-client decoder)
# ---------------------------------------------------------------------------


def _torchvision_deeplab_head_shapes(cin: int, n_out: int) -> dict[str, tuple[int, ...]]:
  """Parameter shapes of torchvision's DeepLabHead(cin, n_out) (ASPP rates 12/24/36)."""
  shapes = {'0.convs.0.0.weight': (256, cin, 1, 1)}
  for i in (1, 2, 3):
    shapes[f'0.convs.{i}.0.weight'] = (256, cin, 3, 3)
  shapes['0.convs.4.1.weight'] = (256, cin, 1, 1)
  shapes['0.project.0.weight'] = (256, 5 * 256, 1, 1)
  shapes['1.weight'] = (256, 256, 3, 3)
  shapes['4.weight'], shapes['4.bias'] = (n_out, 256, 1, 1), (n_out,)
  for bn in ('0.convs.0.1', '0.convs.1.1', '0.convs.2.1', '0.convs.3.1', '0.convs.4.2',
             '0.project.1', '2'):
    shapes[f'{bn}.weight'] = shapes[f'{bn}.bias'] = (256,)
  return shapes


def test_deeplab_head_matches_torchvision_layout_and_counts():
  from fedjax_mtl.models import deeplab
  head = deeplab.DeepLabHead(21)
  feat = jnp.zeros((1, 8, 8, 512))
  params = jax.eval_shape(lambda: head.init(jax.random.PRNGKey(0), feat, (64, 64)))['params']
  from flax.traverse_util import flatten_dict
  ours = {'/'.join(k): int(np.prod(v.shape)) for k, v in flatten_dict(params).items()}
  ref = _torchvision_deeplab_head_shapes(512, 21)
  assert sum(ours.values()) == sum(int(np.prod(s)) for s in ref.values()) == 4_727_573
  # Every torchvision module has its namesake here ('0.convs.1.0' -> aspp_convs_1_0).
  tv_modules = {k.rsplit('.', 1)[0] for k in ref}
  name = {'0': 'aspp', '1': 'conv', '2': 'bn', '4': 'classifier'}
  expect = {'_'.join([name[m.split('.')[0]], *m.split('.')[1:]]) if m.startswith('0.')
            else name[m] for m in tv_modules}
  assert {k.split('/')[0] for k in ours} == expect


def test_deeplab_head_dilated_branches_and_pooling_on_a_small_map():
  """On a 4x4 map every dilated 3x3 branch (rates >= 12) sees only its centre tap
  through the zero padding, so the head equals one with those branches replaced
  by 1x1 convs of the centre weights; the output is resized to the input size."""
  from fedjax_mtl.models import deeplab
  head = deeplab.DeepLabHead(3, width=8)
  feat = jax.random.normal(jax.random.PRNGKey(1), (2, 4, 4, 16))
  v = head.init(jax.random.PRNGKey(0), feat, (16, 16))
  out = _jit(lambda v, f: head.apply(v, f, (16, 16)))(v, feat)
  assert out.shape == (2, 16, 16, 3) and out.dtype == jnp.float32
  p = jax.tree.map(np.asarray, v['params'])
  bs = jax.tree.map(np.asarray, v['batch_stats'])
  f = np.asarray(feat, np.float64)

  def bn_relu(x, name):
    s, b = p[name]['scale'], p[name]['bias']
    m, var = bs[name]['mean'], bs[name]['var']
    return np.maximum((x - m) / np.sqrt(var + 1e-5) * s + b, 0)

  branches = [bn_relu(f @ p['aspp_convs_0_0']['kernel'][0, 0], 'aspp_convs_0_1')]
  for i in (1, 2, 3):
    branches.append(bn_relu(f @ p[f'aspp_convs_{i}_0']['kernel'][1, 1], f'aspp_convs_{i}_1'))
  pooled = bn_relu(f.mean(axis=(1, 2), keepdims=True) @ p['aspp_convs_4_1']['kernel'][0, 0],
                   'aspp_convs_4_2')
  branches.append(np.broadcast_to(pooled, branches[0].shape))
  y = bn_relu(np.concatenate(branches, -1) @ p['aspp_project_0']['kernel'][0, 0],
              'aspp_project_1')
  k = p['conv']['kernel']
  yp = np.pad(y, ((0, 0), (1, 1), (1, 1), (0, 0)))
  y = sum(yp[:, i:i + 4, j:j + 4] @ k[i, j] for i in range(3) for j in range(3))
  y = bn_relu(y, 'bn') @ p['classifier']['kernel'][0, 0] + p['classifier']['bias']
  from fedjax_mtl.models.decoder import interp_matrix
  m = interp_matrix(16, 4).astype(np.float64)
  ref = np.einsum('ih,bhwc,jw->bijc', m, y, m)
  np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-4, atol=1e-4)


def test_atrous_conv_is_the_padded_dilated_conv_and_its_centre_tap_beyond_the_map():
  from fedjax_mtl.models import deeplab
  from fedjax_mtl.models.resnet import conv_layer
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 8, 8, 5))
  for rate in (2, 7, 8, 36):  # below the map size: a real conv; from 8 up: the centre tap
    ref = conv_layer(4, 3, 1, rate, jnp.float32, 'c')
    v = ref.init(jax.random.PRNGKey(1), x)
    got = deeplab.AtrousConv(4, rate).apply(v, x)
    np.testing.assert_allclose(got, ref.apply(v, x), rtol=1e-5, atol=1e-5, err_msg=str(rate))
