"""A small ConvNeXt-style encoder with the Swin interface (4 stages, strides 4..32).

For CPU runs and tests. Every op is a matmul or an elementwise op, so the model
vmaps over clients into batched matmuls (XLA:CPU runs vmapped convolutions as
slow grouped convolutions): the non-overlapping patch embedding (4x4/4) and
downsampling (2x2/2) convs are space-to-depth + Dense, and the 3x3 depthwise
conv is a sum of 9 shifted, per-channel-scaled copies. Each stage output gets
its own LayerNorm like Swin's norm0..norm3. No BatchNorm in the encoder.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


def space_to_depth(x: jax.Array, k: int) -> jax.Array:
  """[B,H,W,C] -> [B,H/k,W/k,k*k*C] with (kh, kw, c) channel order (pads bottom/right)."""
  b, h, w, c = x.shape
  ph, pw = (-h) % k, (-w) % k
  if ph or pw:
    x = jnp.pad(x, ((0, 0), (0, ph), (0, pw), (0, 0)))
    h, w = h + ph, w + pw
  x = x.reshape(b, h // k, k, w // k, k, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(b, h // k, w // k, k * k * c)


class DepthwiseConv3x3(nn.Module):
  """Depthwise 3x3 'SAME' conv as 9 shifted per-channel multiply-adds."""
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    c = x.shape[-1]
    kernel = self.param('kernel', nn.initializers.lecun_normal(), (3, 3, c), jnp.float32)
    bias = self.param('bias', nn.initializers.zeros, (c,), jnp.float32)
    h, w = x.shape[1:3]
    xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    y = sum(xp[:, i:i + h, j:j + w] * kernel[i, j].astype(self.dtype)
            for i in range(3) for j in range(3))
    return y + bias.astype(self.dtype)


class _Block(nn.Module):
  dim: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    y = DepthwiseConv3x3(self.dtype, name='dwconv')(x)
    y = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, name='norm')(y)
    y = nn.Dense(4 * self.dim, dtype=self.dtype, name='fc1')(y)
    y = nn.gelu(y, approximate=False)
    y = nn.Dense(self.dim, dtype=self.dtype, name='fc2')(y)
    return x + y


class ConvEncoder(nn.Module):
  """Four-stage conv encoder returning NHWC features at strides 4, 8, 16, 32."""
  embed_dim: int = 16
  depths: tuple[int, ...] = (1, 1, 1, 1)
  remat: bool = False
  dtype: jnp.dtype = jnp.float32

  @property
  def dims(self) -> tuple[int, ...]:
    return tuple(self.embed_dim * 2**i for i in range(4))

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> list[jax.Array]:
    del train  # no stochastic layers
    block = nn.remat(_Block) if self.remat else _Block
    x = nn.Dense(self.embed_dim, dtype=self.dtype, name='patch_embed')(
        space_to_depth(x.astype(self.dtype), 4))
    x = nn.LayerNorm(epsilon=1e-5, dtype=self.dtype, name='patch_norm')(x)
    outs = []
    for s, dim in enumerate(self.dims):
      if s > 0:
        x = nn.Dense(dim, dtype=self.dtype, name=f'down_{s}')(space_to_depth(x, 2))
      for b in range(self.depths[s]):
        x = block(dim, self.dtype, name=f'stage_{s}_block_{b}')(x)
      outs.append(nn.LayerNorm(epsilon=1e-5, dtype=self.dtype, name=f'norm{s}')(x))
    return outs


def conv_micro(**kw) -> ConvEncoder:
  """Tiny conv encoder (embed 16, one block per stage) for CPU runs and tests."""
  return ConvEncoder(**{'embed_dim': 16, 'depths': (1, 1, 1, 1), **kw})


def conv_small(**kw) -> ConvEncoder:
  """Small conv encoder (embed 32, depths 1,1,2,1)."""
  return ConvEncoder(**{'embed_dim': 32, 'depths': (1, 1, 2, 1), **kw})
