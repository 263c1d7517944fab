"""DeepLab-v3 head (ASPP) on a dilated ResNet: the dense model of MaT-FL and NTKFedAvg.

NTKFedAvg spec §1.2 (benchmark A, from the MaT-FL code): each client has its own
``DeepLabHead(512, n_out)`` on the last stage of a dilated ResNet-18 (output
stride 8):

- ASPP with 256 channels: a 1x1 conv branch, three 3x3 branches dilated by
  ``rates`` (12, 24, 36), and an image-pooling branch (global mean, 1x1 conv,
  broadcast back); every branch conv-BN-ReLU; the five are concatenated, then
  1x1 conv 256, BN, ReLU, Dropout(0.5);
- 3x3 conv 256 (no bias), BN, ReLU, 1x1 conv to ``n_out`` (with bias);
- the output is upsampled bilinearly (align_corners=False) to the input size.

Names follow torchvision's ``DeepLabHead`` (``aspp_convs_1_0`` is
``0.convs.1.0``, ``conv`` / ``bn`` / ``classifier`` are ``1`` / ``2`` / ``4``).
BatchNorm as :mod:`fedjax_mtl.models.resnet` (PyTorch momentum 0.1, eps 1e-5).
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_mtl.models.decoder import resize_bilinear
from fedjax_mtl.models.resnet import KAIMING_FAN_OUT, batch_norm, conv_layer

ASPP_RATES = (12, 24, 36)


class AtrousConv(nn.Module):
  """A bias-free 3x3 conv dilated by `rate` with padding `rate` (an ASPP branch's conv;
  the parameter is `conv_layer`'s `kernel`, [3, 3, in, out]).

  When the rate reaches the map's height and width, every tap but the centre reads
  only zero padding, so the conv equals the centre tap's 1x1 conv, and is computed
  as that: XLA:CPU convolves over the whole padding otherwise (rate 36 on the 8x8
  map of a 64² input: 12x the time of an undilated 3x3 conv)."""
  features: int
  rate: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.param('kernel', KAIMING_FAN_OUT, (3, 3, x.shape[-1], self.features))
    x, kernel = x.astype(self.dtype), kernel.astype(self.dtype)
    r = self.rate
    if r >= x.shape[1] and r >= x.shape[2]:
      return jnp.einsum('bhwc,cd->bhwd', x, kernel[1, 1])
    return jax.lax.conv_general_dilated(x, kernel, (1, 1), ((r, r), (r, r)),
                                        rhs_dilation=(r, r),
                                        dimension_numbers=('NHWC', 'HWIO', 'NHWC'))


class DeepLabHead(nn.Module):
  """ASPP + 3x3 conv-BN-ReLU + 1x1 classifier on NHWC features; output at `out_size`."""
  out_channels: int
  rates: Sequence[int] = ASPP_RATES
  width: int = 256
  dropout: float = 0.5
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, out_size: tuple[int, int], train: bool = False) -> jax.Array:
    dt, w = self.dtype, self.width
    x = x.astype(dt)
    # conv -> BN -> ReLU; torchvision's ASPPPooling puts the pool at index 0, so its
    # conv and BN are `.1` and `.2`.
    def branch_conv(i, j):
      name = f'aspp_convs_{i}_{j}'
      if 0 < i <= len(self.rates):
        return AtrousConv(w, self.rates[i - 1], dt, name=name)
      return conv_layer(w, 1, 1, 1, dt, name)

    branch = lambda y, i, j=0: nn.relu(batch_norm(train, dt, f'aspp_convs_{i}_{j + 1}')(
        branch_conv(i, j)(y)))
    outs = [branch(x, i) for i in range(len(self.rates) + 1)]
    pooled = jnp.mean(x.astype(jnp.float32), axis=(1, 2), keepdims=True).astype(dt)
    pooled = branch(pooled, len(self.rates) + 1, 1)
    outs.append(jnp.broadcast_to(pooled, outs[0].shape))  # bilinear resize of a 1x1 map
    y = conv_layer(w, 1, 1, 1, dt, 'aspp_project_0')(jnp.concatenate(outs, axis=-1))
    y = nn.relu(batch_norm(train, dt, 'aspp_project_1')(y))
    y = nn.Dropout(self.dropout, deterministic=not train)(y)
    y = nn.relu(batch_norm(train, dt, 'bn')(conv_layer(w, 3, 1, 1, dt, 'conv')(y)))
    y = nn.Conv(self.out_channels, (1, 1), dtype=dt, name='classifier')(y)
    return resize_bilinear(y.astype(jnp.float32), out_size)


class DeepLabNet(nn.Module):
  """Encoder (its last stage) -> one `DeepLabHead` per task in `head_channels`.

  Returns one [B, H, W, c] float32 output per head at the input resolution."""
  encoder: nn.Module
  head_channels: tuple[int, ...]
  train: bool = False
  dtype: jnp.dtype = jnp.float32
  head_width: int = 256  # ASPP channels (256 in the reference)

  @nn.compact
  def __call__(self, x: jax.Array) -> list[jax.Array]:
    feat = self.encoder(x, train=self.train)[-1]
    return [DeepLabHead(c, width=self.head_width, dtype=self.dtype, name=f'head_{s}')(
        feat, x.shape[1:3], self.train) for s, c in enumerate(self.head_channels)]


__all__ = ['ASPP_RATES', 'AtrousConv', 'DeepLabHead', 'DeepLabNet']
