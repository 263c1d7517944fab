"""ResNet-18 encoder in torchvision's layout, with the encoder interface of Swin.

``resnet18()`` is torchvision's ``resnet18`` without ``avgpool``/``fc``: conv1
7x7/2 + bn1 + ReLU + maxpool 3x3/2, then layer1..layer4 of two BasicBlocks
each (channels 64, 128, 256, 512; a 1x1 conv + BN ``downsample`` where the
shape changes). It returns the four layer outputs (NHWC) at strides 4, 8, 16,
32; the FedHCA2 decoders project each stage with their own Linear.

``output_stride=8`` (``resnet18_os8``) is the dilated ResNet of MaT-FL /
NTK-FedAvg (``ResnetDilated``, dilate_scale 8), the same network as
torchvision's ``replace_stride_with_dilation=[False, True, True]``: layer3
and layer4 drop their stride; their 3x3 convs dilate by 2 and 4, except the
first conv of each, which keeps the previous dilation (1 and 2). Stage strides
are then 4, 8, 8, 8. ``output_stride=16`` dilates layer4 only.

Parameters and their names follow torchvision (``layer2_0/downsample_0`` is
``layer2.0.downsample.0``), so :mod:`fedjax_mtl.models.convert_resnet` maps a
checkpoint one to one. BatchNorm running statistics live in the
``'batch_stats'`` collection: ``train=True`` normalises with the batch's
statistics and updates the running ones (PyTorch momentum 0.1 is Flax
momentum 0.9, eps 1e-5); ``train=False`` uses the running ones. One
difference from PyTorch: Flax updates the running variance with the biased
batch variance (PyTorch: unbiased, a factor n/(n-1) with n = batch x pixels).

On XLA:CPU convolutions vmapped over clients run as slow grouped
convolutions (see :mod:`fedjax_mtl.models.convnet`); this encoder is meant
for accelerators.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_mtl.errors import ConfigError, check_choice

OUTPUT_STRIDES = (8, 16, 32)
BN_MOMENTUM = 0.9  # Flax's decay of the running stats: PyTorch momentum 0.1
BN_EPS = 1e-5
# torchvision's init: kaiming_normal_(mode='fan_out', nonlinearity='relu').
KAIMING_FAN_OUT = nn.initializers.variance_scaling(2.0, 'fan_out', 'normal')


def conv_layer(features: int, kernel: int, stride: int, dilation: int, dtype, name: str) -> nn.Conv:
  """Bias-free conv with PyTorch's symmetric padding `dilation * (kernel // 2)`."""
  pad = dilation * (kernel // 2)
  return nn.Conv(features, (kernel, kernel), strides=stride, padding=((pad, pad), (pad, pad)),
                 kernel_dilation=dilation, use_bias=False, dtype=dtype,
                 kernel_init=KAIMING_FAN_OUT, name=name)


def batch_norm(train: bool, dtype, name: str) -> nn.BatchNorm:
  return nn.BatchNorm(use_running_average=not train, momentum=BN_MOMENTUM, epsilon=BN_EPS,
                      dtype=dtype, name=name)


class BasicBlock(nn.Module):
  """torchvision BasicBlock: two 3x3 conv-BN, identity or 1x1 conv-BN shortcut, ReLU."""
  features: int
  stride: int = 1
  dilation: int = 1  # of conv2
  first_dilation: int = 1  # of conv1 (the previous stage's dilation in a dilated layer)
  downsample: bool = False
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    f, dt = self.features, self.dtype
    y = conv_layer(f, 3, self.stride, self.first_dilation, dt, 'conv1')(x)
    y = nn.relu(batch_norm(train, dt, 'bn1')(y))
    y = conv_layer(f, 3, 1, self.dilation, dt, 'conv2')(y)
    y = batch_norm(train, dt, 'bn2')(y)
    if self.downsample:
      x = conv_layer(f, 1, self.stride, 1, dt, 'downsample_0')(x)
      x = batch_norm(train, dt, 'downsample_1')(x)
    return nn.relu(y + x)


def layer_plan(output_stride: int) -> list[tuple[int, int, int]]:
  """(stride, first-block conv1 dilation, dilation) of layer1..layer4 for `output_stride`."""
  check_choice('ResNet output_stride', output_stride, OUTPUT_STRIDES)
  plan, dilation, stride_so_far = [], 1, 4  # the stem already has stride 4
  for s in range(4):
    stride = 1 if s == 0 else 2
    previous = dilation
    if stride_so_far * stride > output_stride:  # replace the stride with dilation
      dilation, stride = dilation * stride, 1
    stride_so_far *= stride
    plan.append((stride, previous, dilation))
  return plan


class ResNet(nn.Module):
  """ResNet with BasicBlocks returning layer1..layer4 outputs (NHWC) as the 4 stages."""
  stage_sizes: tuple[int, ...] = (2, 2, 2, 2)
  width: int = 64  # channels of conv1 and layer1 (doubling per layer)
  output_stride: int = 32
  remat: bool = False
  dtype: jnp.dtype = jnp.float32

  @property
  def dims(self) -> tuple[int, ...]:
    return tuple(self.width * 2**i for i in range(4))

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> list[jax.Array]:
    if len(self.stage_sizes) != 4 or min(self.stage_sizes) < 1:
      raise ConfigError(f'ResNet stage_sizes={self.stage_sizes!r}: need 4 stages of >= 1 block')
    # `self` is argument 0 of remat's static_argnums, so `train` is argument 2.
    block = nn.remat(BasicBlock, static_argnums=(2,)) if self.remat else BasicBlock
    x = conv_layer(self.width, 7, 2, 1, self.dtype, 'conv1')(x.astype(self.dtype))
    x = nn.relu(batch_norm(train, self.dtype, 'bn1')(x))
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))  # pads with -inf
    outs = []
    in_dim = self.width
    for s, (dim, n, (stride, first_dilation, dilation)) in enumerate(
        zip(self.dims, self.stage_sizes, layer_plan(self.output_stride))):
      for b in range(n):
        x = block(dim, stride if b == 0 else 1, dilation,
                  first_dilation if b == 0 else dilation,
                  b == 0 and (stride != 1 or in_dim != dim), self.dtype,
                  name=f'layer{s + 1}_{b}')(x, train)
      in_dim = dim
      outs.append(x)
    return outs


def resnet18(**kw) -> ResNet:
  """torchvision ResNet-18 encoder (11,176,512 params without fc), stage strides 4..32."""
  return ResNet(**{'stage_sizes': (2, 2, 2, 2), **kw})


def resnet18_os8(**kw) -> ResNet:
  """Dilated ResNet-18 (MaT-FL's ResnetDilated, dilate_scale 8): stage strides 4, 8, 8, 8."""
  return ResNet(**{'stage_sizes': (2, 2, 2, 2), 'output_stride': 8, **kw})


__all__ = ['ResNet', 'BasicBlock', 'resnet18', 'resnet18_os8', 'layer_plan', 'OUTPUT_STRIDES']
