"""FedHCA2 task decoder (6 parameterised layers) and prediction head.

Decoder: per-stage Linear(C_s -> C) -> bilinear upsample to H/4 -> concat ->
1x1 conv -> BatchNorm -> LeakyReLU(0.01). Head: two stride-2 2x2 transposed
convs and a 1x1 conv, no nonlinearity, output at the input resolution.

For speed on CPU and GPU, the fixed-size bilinear upsampling is two small
interpolation matmuls (exactly PyTorch's align_corners=False), and each stride-2
2x2 transposed conv is one matmul to 4*C' channels followed by depth-to-space;
both are exact rewrites of the reference ops.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

# Forward order of the decoder's parameterised layers L1..L6 (spec: L6 nearest the head).
DECODER_LAYERS = ('linear_0', 'linear_1', 'linear_2', 'linear_3', 'fuse_conv', 'fuse_bn')


def interp_matrix(out_size: int, in_size: int) -> np.ndarray:
  """[out, in] bilinear weights of PyTorch interpolate(align_corners=False)."""
  m = np.zeros((out_size, in_size), np.float32)
  scale = in_size / out_size
  for o in range(out_size):
    src = max((o + 0.5) * scale - 0.5, 0.0)
    i0 = min(int(np.floor(src)), in_size - 1)
    i1 = min(i0 + 1, in_size - 1)
    w1 = src - i0
    m[o, i0] += 1.0 - w1
    m[o, i1] += w1
  return m


def resize_bilinear(x: jax.Array, size: tuple[int, int]) -> jax.Array:
  """Bilinear resize of NHWC `x` to `size` (align_corners=False) by two matmuls."""
  h, w = x.shape[1:3]
  if (h, w) == tuple(size):
    return x
  mh = jnp.asarray(interp_matrix(size[0], h), x.dtype)
  mw = jnp.asarray(interp_matrix(size[1], w), x.dtype)
  return jnp.einsum('ih,bhwc,jw->bijc', mh, x, mw)


class ConvTranspose2x2(nn.Module):
  """ConvTranspose2d(k=2, s=2) as one matmul plus depth-to-space (exact)."""
  features: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    c = x.shape[-1]
    kernel = self.param('kernel', nn.initializers.lecun_normal(), (c, 2, 2, self.features))
    bias = self.param('bias', nn.initializers.zeros, (self.features,))
    y = jnp.einsum('bhwc,cijd->bhiwjd', x.astype(self.dtype), kernel.astype(self.dtype))
    b, h, _, w, _, d = y.shape
    return y.reshape(b, 2 * h, 2 * w, d) + bias.astype(self.dtype)


class Decoder(nn.Module):
  """All-MLP fuse decoder over the 4 encoder stages; output C x H/4 x W/4."""
  dim: int
  train: bool = False
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, feats: Sequence[jax.Array]) -> jax.Array:
    size = feats[0].shape[1:3]
    ups = []
    for s, f in enumerate(feats):
      y = nn.Dense(self.dim, dtype=self.dtype, name=f'linear_{s}')(f)
      ups.append(resize_bilinear(y, size))
    y = jnp.concatenate(ups, axis=-1)
    y = nn.Dense(self.dim, dtype=self.dtype, name='fuse_conv')(y)  # 1x1 conv
    y = nn.BatchNorm(use_running_average=not self.train, momentum=0.9, epsilon=1e-5,
                     dtype=jnp.float32, name='fuse_bn')(y.astype(jnp.float32))
    return nn.leaky_relu(y, 0.01).astype(self.dtype)


class Head(nn.Module):
  """Prediction head: 2x (2x2 stride-2 transposed conv) then 1x1 conv, no activation."""
  dim: int
  out_channels: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = ConvTranspose2x2(self.dim // 2, self.dtype, name='up_0')(x)
    x = ConvTranspose2x2(self.dim // 4, self.dtype, name='up_1')(x)
    return nn.Dense(self.out_channels, dtype=self.dtype, name='out')(x).astype(jnp.float32)
