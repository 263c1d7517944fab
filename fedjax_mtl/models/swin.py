"""Swin Transformer backbone (mmsegmentation flavour) in Flax linen.

Behaviour follows the mmseg-style Swin used by FedHCA2 (``innovator-zero/FedHCA2``
``models/swin.py``, copied from mmseg v0.x), so its UperNet-ADE20K checkpoints
load directly (see :mod:`fedjax_mtl.models.convert`):

* Patch embedding: the image is zero-padded on the bottom/right to a multiple of
  the patch size, then a ``patch x patch`` stride-``patch`` conv and a LayerNorm.
* Every block pads its (normed) feature map with zeros on the bottom/right to a
  multiple of the window size, attends, and crops back. Padded tokens are *not*
  masked out (they act as keys with ``k = qkv bias``), exactly like the
  reference. Unlike the original Microsoft Swin, a stage whose map is smaller
  than or equal to the window is **not** special-cased: the window stays at
  ``window_size`` (the map is padded up to it) and odd blocks still shift by
  ``window_size // 2`` with the usual mask. E.g. Swin-T at 224x224 pads its 7x7
  last stage to one 7x7 window and still shifts; at 512x512 the 16x16 last
  stage is padded to 21x21 (3x3 windows).
* Patch merging gathers each 2x2 neighbourhood in ``nn.Unfold`` order
  (channel index ``c * 4 + ki * 2 + kj``), zero-padding odd sizes on the
  bottom/right first, then LayerNorm(4C) and Linear(4C -> 2C, no bias).
* Outputs: the four stage outputs (before patch merging), each through its own
  LayerNorm ``norm{i}``, at strides 4, 8, 16, 32 (ceil division for sizes that
  are not multiples), NHWC.

Mixed precision: parameters are always float32; ``dtype`` is the compute dtype
of matmuls, LayerNorm outputs and attention. The residual stream, LayerNorm
statistics, attention logits/softmax and the stochastic-depth rescale stay in
float32, mirroring ``torch.autocast`` (which keeps the residual adds, layer
norms and softmax in float32).

Speed (exact rewrites of the reference, identical up to float rounding):
per-token layers (qkv, proj, MLP, norms) run on real tokens only, never on
window padding; every Dense is one 2-D matmul (:func:`matmul`); the window
layout costs one copy in and one out per block; GELU uses ``erf``; LayerNorm
and softmax have hand-written derivatives that keep only what they need.

Memory: ``remat=True`` rematerialises every block (``nn.remat`` of
:class:`SwinBlock`): the backward pass keeps only each block's input and
recomputes the block's forward, about one extra encoder forward pass. Per block
beats per stage (which holds a whole stage's activations while recomputing it)
and a save-the-matmuls policy (which keeps half the activations). Swin-T with a
decoder/head at 512x512, batch 8: 5.2 GiB of activations kept for the backward
pass, 0.98 GiB with remat (``scripts/bench.py --only=swin_memory``). XLA:CPU
drops the optimisation barriers remat relies on, and CSE then folds the
recomputation back into the forward pass, unless compiled with
``compiler_options={'xla_disable_hlo_passes': 'cse_barrier_expander'}`` (the
engine does this whenever the encoder rematerialises: ``train.KEEP_REMAT_ON_CPU``);
GPU and TPU keep them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Dtype = Any

# PyTorch nn.LayerNorm default epsilon (flax defaults to 1e-6).
LN_EPS = 1e-5
# Init matching the reference's ``_init_weights``: trunc_normal(std=.02) for
# Linear weights and the relative position bias table, zero biases.
_dense_init = nn.initializers.truncated_normal(stddev=0.02)
# PyTorch's default Conv2d init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
_conv_init = nn.initializers.variance_scaling(1.0 / 3.0, 'fan_in', 'uniform')


def _torch_bias_init(fan_in: int) -> Callable[..., jax.Array]:
  """PyTorch's default conv bias init U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
  bound = 1.0 / np.sqrt(fan_in)

  def init(key: jax.Array, shape: Sequence[int], dtype: Dtype = jnp.float32) -> jax.Array:
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


# ---------------------------------------------------------------------------
# Static (NumPy) helpers: computed once at trace time, embedded as constants.
# ---------------------------------------------------------------------------


def relative_position_index(window_size: int) -> np.ndarray:
  """Index into the ((2w-1)^2, heads) bias table for each (query, key) pair."""
  w = window_size
  coords = np.stack(np.meshgrid(np.arange(w), np.arange(w), indexing='ij'))  # 2,w,w
  coords = coords.reshape(2, -1)  # 2, N (row-major tokens)
  rel = coords[:, :, None] - coords[:, None, :] + (w - 1)  # 2, N, N in [0, 2w-2]
  return (rel[0] * (2 * w - 1) + rel[1]).astype(np.int32)


def shifted_window_mask(height: int, width: int, window_size: int, shift: int) -> np.ndarray:
  """Additive SW-MSA mask (num_windows, N, N): 0 within a region, -100 across.

  ``height``/``width`` are the *padded* map sizes (multiples of the window).
  """
  img = np.zeros((height, width), np.float32)
  slices = (slice(0, -window_size), slice(-window_size, -shift), slice(-shift, None))
  cnt = 0
  for hs in slices:
    for ws in slices:
      img[hs, ws] = cnt
      cnt += 1
  win = _np_window_partition(img[None, :, :, None], window_size)[0, ..., 0]  # nW, N
  diff = win[:, None, :] - win[:, :, None]
  return np.where(diff != 0, -100.0, 0.0).astype(np.float32)


def _np_window_partition(x: np.ndarray, w: int) -> np.ndarray:
  b, h, wd, c = x.shape
  x = x.reshape(b, h // w, w, wd // w, w, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(b, (h // w) * (wd // w), w * w, c)


# Cached per (window, H, W, shift) so repeated blocks/traces reuse one array.
_cached_mask = functools.lru_cache(maxsize=64)(shifted_window_mask)
_cached_index = functools.lru_cache(maxsize=16)(relative_position_index)


@jax.custom_jvp
def softmax(x: jax.Array) -> jax.Array:
  """Softmax over the last axis whose derivative keeps only the output.

  (``jax.nn.softmax`` differentiates through exp/sum/div unless the
  ``jax_softmax_custom_jvp`` flag is set, keeping the unnormalised
  exponentials as an extra logits-sized activation.)
  """
  e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
  return e / jnp.sum(e, axis=-1, keepdims=True)


@softmax.defjvp
def _softmax_jvp(primals: tuple[jax.Array], tangents: tuple[jax.Array]):
  (x,), (dx,) = primals, tangents
  y = softmax(x)
  return y, y * (dx - jnp.sum(y * dx, axis=-1, keepdims=True))


def drop_path(module: nn.Module, x: jax.Array, rate: float, train: bool) -> jax.Array:
  """Per-sample stochastic depth with 1/keep rescale; rng stream 'dropout'."""
  if not train or rate == 0.0:
    return x
  keep = 1.0 - rate
  rng = module.make_rng('dropout')
  mask = jax.random.bernoulli(rng, keep, (x.shape[0],) + (1,) * (x.ndim - 1))
  return x * (mask.astype(x.dtype) / jnp.asarray(keep, x.dtype))


_SQRT_HALF = float(np.sqrt(0.5))


@jax.checkpoint
def gelu(x: jax.Array) -> jax.Array:
  """Exact GELU as PyTorch computes it: ``0.5 * x * (1 + erf(x / sqrt(2)))``.

  ``jax.nn.gelu(approximate=False)`` goes through ``erfc``, which XLA expands
  into exp/select code several times costlier than its ``erf`` polynomial.
  Checkpointed: the backward pass keeps only ``x`` (which the preceding matmul
  produced anyway) and recomputes the derivative, instead of the forward pass
  storing an extra activation-sized derivative for it.
  """
  return 0.5 * x * (1.0 + jax.lax.erf(x * _SQRT_HALF))


# ---------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array,
               eps: float = LN_EPS) -> jax.Array:
  """LayerNorm over the last axis (two-pass variance, like PyTorch), float32 math.

  Returns float32; the backward pass keeps only ``x`` and the per-token
  mean and 1/std, and evaluates the closed-form gradient in one fused pass.
  """
  return _layer_norm_fwd(x, scale, bias, eps)[0]


def _layer_norm_fwd(x, scale, bias, eps):
  x = x.astype(jnp.float32)
  mean = jnp.mean(x, axis=-1, keepdims=True)
  xc = x - mean
  rstd = jax.lax.rsqrt(jnp.mean(xc * xc, axis=-1, keepdims=True) + eps)
  return xc * rstd * scale + bias, (x, mean, rstd, scale)


def _layer_norm_bwd(eps, res, g):
  x, mean, rstd, scale = res
  g = g.astype(jnp.float32)
  xhat = (x - mean) * rstd
  gs = g * scale
  dx = rstd * (gs - jnp.mean(gs, axis=-1, keepdims=True)
               - xhat * jnp.mean(gs * xhat, axis=-1, keepdims=True))
  lead = tuple(range(x.ndim - 1))
  return dx, jnp.sum(g * xhat, axis=lead), jnp.sum(g, axis=lead)


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def layer_norm_jvp(x: jax.Array, scale: jax.Array, bias: jax.Array,
                   eps: float = LN_EPS) -> jax.Array:
  """`layer_norm` with a closed-form tangent rule instead of a custom backward, so
  that forward mode works too (`jax.jvp`: NTK-linearised models); reverse mode
  transposes the tangent rule and keeps the normalised input, 1/std and scale."""
  return _layer_norm_fwd(x, scale, bias, eps)[0]


@layer_norm_jvp.defjvp
def _layer_norm_tangent(eps, primals, tangents):
  x, scale, bias = primals
  dx, dscale, dbias = tangents
  y, (_, mean, rstd, _) = _layer_norm_fwd(x, scale, bias, eps)
  xhat = (x.astype(jnp.float32) - mean) * rstd
  dx = dx.astype(jnp.float32)
  dxhat = rstd * (dx - jnp.mean(dx, axis=-1, keepdims=True)
                  - xhat * jnp.mean(dx * xhat, axis=-1, keepdims=True))
  return y, dxhat * scale + xhat * dscale + dbias


class LayerNorm(nn.Module):
  """PyTorch-style LayerNorm (eps 1e-5 unless given) with ``nn.LayerNorm``'s params,
  output in ``dtype``."""

  dtype: Dtype = jnp.float32
  epsilon: float = LN_EPS
  forward_mode: bool = False  # `layer_norm_jvp` (jax.jvp works through it)

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    c = x.shape[-1]
    scale = self.param('scale', nn.initializers.ones, (c,), jnp.float32)
    bias = self.param('bias', nn.initializers.zeros, (c,), jnp.float32)
    fn = layer_norm_jvp if self.forward_mode else layer_norm
    return fn(x, scale, bias, self.epsilon).astype(self.dtype)


def matmul(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """``x @ kernel`` over the last axis of ``x``, as one 2-D matmul.

  XLA:CPU turns the weight gradient of an N-D ``dot_general`` (several
  non-contracted leading axes) into a matmul fed by a transposed copy of the
  output gradient; with the leading axes flattened first it is a plain
  ``(M, C)^T (M, F)`` matmul. Flattening is free (a bitcast).
  """
  y = jnp.dot(x.reshape(-1, x.shape[-1]), kernel)
  return y.reshape(*x.shape[:-1], kernel.shape[-1])


class DenseParams(nn.Module):
  """The params of a Dense layer (``kernel``, ``bias``; same init as the reference)."""

  features: int
  use_bias: bool = True

  @nn.compact
  def __call__(self, in_features: int) -> tuple[jax.Array, jax.Array | None]:
    kernel = self.param('kernel', _dense_init, (in_features, self.features), jnp.float32)
    if not self.use_bias:
      return kernel, None
    return kernel, self.param('bias', nn.initializers.zeros, (self.features,), jnp.float32)


def dense(x: jax.Array, features: int, dtype: Dtype, name: str,
          use_bias: bool = True) -> jax.Array:
  """``nn.Dense`` (same params and ``dtype`` semantics) via :func:`matmul`."""
  kernel, bias = DenseParams(features, use_bias, name=name)(x.shape[-1])
  y = matmul(x.astype(dtype), kernel.astype(dtype))
  return y if bias is None else y + bias.astype(dtype)


class WindowAttention(nn.Module):
  """(Shifted-)window multi-head self-attention with relative position bias.

  Exact rewrite of the reference (pad -> roll -> partition -> qkv -> attention
  -> proj -> reverse -> roll back -> crop) that does per-token work on real
  tokens only. Padded tokens are zeros, so their q/k/v are exactly the qkv
  bias: the unpadded map is projected, zero-padded, rolled and partitioned,
  and the bias is added in the window layout (so its gradient is reduced from
  the windowed gradient without another copy). ``proj`` runs after the crop.
  Pad, roll, window partition and head split form one copy into the
  (B * windows * heads, N, head_dim) layout of the batched attention matmuls;
  the inverse copy (with roll back and crop) feeds ``proj``.
  """

  dim: int
  num_heads: int
  window_size: int
  shift_size: int = 0
  qkv_bias: bool = True
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    b, h, w, c = x.shape
    if c != self.dim or c % self.num_heads:
      raise ValueError(
          f'got {c} channels; expected dim={self.dim} divisible by {self.num_heads} heads')
    ws, shift = self.window_size, self.shift_size
    heads, hd = self.num_heads, c // self.num_heads
    n = ws * ws
    pad_b, pad_r = (-h) % ws, (-w) % ws
    hp, wp = h + pad_b, w + pad_r
    nh, nw = hp // ws, wp // ws

    kernel, qkv_bias = DenseParams(3 * c, self.qkv_bias, name='qkv')(c)
    qkv = matmul(x.astype(self.dtype), kernel.astype(self.dtype))  # real tokens only
    if pad_b or pad_r:
      qkv = jnp.pad(qkv, ((0, 0), (0, pad_b), (0, pad_r), (0, 0)))
    if shift:
      qkv = jnp.roll(qkv, (-shift, -shift), axis=(1, 2))
    # (B, nh, ws, nw, ws, 3, heads, hd) -> (3, B, nh, nw, heads, ws, ws, hd).
    qkv = qkv.reshape(b, nh, ws, nw, ws, 3, heads, hd).transpose(5, 0, 1, 3, 6, 2, 4, 7)
    if qkv_bias is not None:
      qkv = qkv + qkv_bias.astype(self.dtype).reshape(3, 1, 1, 1, heads, 1, 1, hd)
    qkv = qkv.reshape(3, b * nh * nw * heads, n, hd)
    q = qkv[0] * jnp.asarray(hd**-0.5, self.dtype)
    k, v = qkv[1], qkv[2]
    # float32 logits/softmax, like torch.autocast does for softmax.
    logits = jnp.einsum('bnd,bmd->bnm', q, k, preferred_element_type=jnp.float32)

    table = self.param(
      'relative_position_bias_table',
      _dense_init,
      ((2 * ws - 1) ** 2, heads),
      jnp.float32,
    )
    # One tiny gather on the parameter per block, shared by all windows.
    bias = table[_cached_index(ws).reshape(-1)].reshape(n, n, heads).transpose(2, 0, 1)
    if shift:
      bias = bias + _cached_mask(hp, wp, ws, shift)[:, None]  # NumPy constant (nW, 1, N, N)
    logits = logits.reshape(b, nh * nw, heads, n, n) + bias
    attn = softmax(logits).astype(self.dtype)
    out = jnp.einsum('bnm,bmd->bnd', attn.reshape(-1, n, n), v)

    # (B, nh, nw, heads, ws, ws, hd) -> (B, Hp, Wp, C), heads-major channels.
    out = out.reshape(b, nh, nw, heads, ws, ws, hd).transpose(0, 1, 4, 2, 5, 3, 6)
    out = out.reshape(b, hp, wp, c)
    if shift:
      out = jnp.roll(out, (shift, shift), axis=(1, 2))
    if pad_b or pad_r:
      out = out[:, :h, :w, :]
    return dense(out, c, self.dtype, 'proj')


class Mlp(nn.Module):
  """Linear -> exact (erf) GELU -> Linear."""

  hidden: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    c = x.shape[-1]
    x = dense(x, self.hidden, self.dtype, 'fc1')
    x = gelu(x)
    return dense(x, c, self.dtype, 'fc2')


class SwinBlock(nn.Module):
  """Pre-norm Swin block: x + DP(attn(LN(x))); x + DP(mlp(LN(x)))."""

  dim: int
  num_heads: int
  window_size: int
  shift_size: int
  mlp_ratio: float = 4.0
  qkv_bias: bool = True
  drop_path_rate: float = 0.0
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    y = LayerNorm(self.dtype, name='norm1')(x)
    y = WindowAttention(
      self.dim, self.num_heads, self.window_size, self.shift_size, self.qkv_bias,
      self.dtype, name='attn',
    )(y)
    x = x + drop_path(self, y.astype(x.dtype), self.drop_path_rate, train)
    y = LayerNorm(self.dtype, name='norm2')(x)
    y = Mlp(int(self.dim * self.mlp_ratio), self.dtype, name='mlp')(y)
    return x + drop_path(self, y.astype(x.dtype), self.drop_path_rate, train)


class PatchMerging(nn.Module):
  """2x2 neighbourhood (nn.Unfold channel order) -> LN(4C) -> Linear(4C->2C)."""

  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    b, h, w, c = x.shape
    if h % 2 or w % 2:
      x = jnp.pad(x, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)))
      h, w = h + h % 2, w + w % 2
    # (b, h/2, ki, w/2, kj, c) -> (b, h/2, w/2, c, ki, kj): index c*4 + ki*2 + kj.
    x = x.reshape(b, h // 2, 2, w // 2, 2, c).transpose(0, 1, 3, 5, 2, 4)
    x = x.reshape(b, h // 2, w // 2, 4 * c)
    x = LayerNorm(self.dtype, name='norm')(x)
    return dense(x, 2 * c, self.dtype, 'reduction', use_bias=False)


class PatchConv(nn.Module):
  """Non-overlapping patch conv as space-to-depth + matmul (kernel HWIO like nn.Conv)."""

  features: int
  patch_size: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    b, h, w, c = x.shape
    p = self.patch_size
    kernel = self.param('kernel', _conv_init, (p, p, c, self.features), jnp.float32)
    bias = self.param('bias', _torch_bias_init(p * p * c), (self.features,), jnp.float32)
    # (b, h/p, p, w/p, p, c) -> (b, h/p, w/p, p * p * c) in the kernel's (p, q, c) order.
    x = x.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
    x = x.reshape(b, h // p, w // p, p * p * c).astype(self.dtype)
    y = matmul(x, kernel.reshape(p * p * c, self.features).astype(self.dtype))
    return y + bias.astype(self.dtype)


class PatchEmbed(nn.Module):
  """Pad to a multiple of the patch size, patchify conv, LayerNorm."""

  embed_dim: int
  patch_size: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    _, h, w, _ = x.shape
    p = self.patch_size
    pad_b, pad_r = (-h) % p, (-w) % p
    if pad_b or pad_r:
      x = jnp.pad(x, ((0, 0), (0, pad_b), (0, pad_r), (0, 0)))
    x = PatchConv(self.embed_dim, p, self.dtype, name='proj')(x)
    return LayerNorm(self.dtype, name='norm')(x)


class SwinStage(nn.Module):
  """Blocks of one stage; returns (stage output, patch-merged output or None)."""

  dim: int
  depth: int
  num_heads: int
  window_size: int
  mlp_ratio: float
  qkv_bias: bool
  drop_path_rates: tuple[float, ...]
  downsample: bool
  remat: bool = False
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> tuple[jax.Array, jax.Array | None]:
    # static_argnums counts `self` as 0, so `train` is argument 2.
    block_cls = nn.remat(SwinBlock, static_argnums=(2,)) if self.remat else SwinBlock
    for i in range(self.depth):
      x = block_cls(
        dim=self.dim,
        num_heads=self.num_heads,
        window_size=self.window_size,
        shift_size=0 if i % 2 == 0 else self.window_size // 2,
        mlp_ratio=self.mlp_ratio,
        qkv_bias=self.qkv_bias,
        drop_path_rate=self.drop_path_rates[i],
        dtype=self.dtype,
        name=f'blocks_{i}',
      )(x, train)
    down = PatchMerging(self.dtype, name='downsample')(x) if self.downsample else None
    if down is not None:
      down = down.astype(jnp.float32)  # keep the residual stream in float32
    return x, down


class SwinTransformer(nn.Module):
  """mmseg-style Swin backbone returning 4 normed NHWC maps at strides 4..32.

  ``dims`` is a read-only *property* giving the output channels (C, 2C, 4C, 8C).
  """

  embed_dim: int
  depths: tuple[int, ...]
  num_heads: tuple[int, ...]
  window_size: int = 7
  patch_size: int = 4
  mlp_ratio: float = 4.0
  qkv_bias: bool = True
  drop_path_rate: float = 0.1
  remat: bool = False
  dtype: Dtype = jnp.float32

  @property
  def dims(self) -> tuple[int, ...]:
    """Channels of the returned feature maps, one per stage."""
    return tuple(self.embed_dim * 2**i for i in range(len(self.depths)))

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> list[jax.Array]:
    num_stages = len(self.depths)
    if len(self.num_heads) != num_stages:
      raise ValueError(f'depths {self.depths} and num_heads {self.num_heads} differ in length')
    # Linear stochastic-depth schedule over all blocks (torch.linspace).
    dpr = np.linspace(0.0, self.drop_path_rate, sum(self.depths)).tolist()

    x = PatchEmbed(self.embed_dim, self.patch_size, self.dtype, name='patch_embed')(x)
    x = x.astype(jnp.float32)  # residual stream in float32 (see module doc)
    outs = []
    start = 0
    for i in range(num_stages):
      out, x = SwinStage(
        dim=self.dims[i],
        depth=self.depths[i],
        num_heads=self.num_heads[i],
        window_size=self.window_size,
        mlp_ratio=self.mlp_ratio,
        qkv_bias=self.qkv_bias,
        drop_path_rates=tuple(dpr[start:start + self.depths[i]]),
        downsample=i < num_stages - 1,
        remat=self.remat,
        dtype=self.dtype,
        name=f'stages_{i}',
      )(x, train)
      start += self.depths[i]
      outs.append(LayerNorm(self.dtype, name=f'norm{i}')(out))
    return outs


# ---------------------------------------------------------------------------
# Factories
# ---------------------------------------------------------------------------


def swin_t(**kwargs: Any) -> SwinTransformer:
  """Swin-T (embed 96, depths 2-2-6-2; 27,520,698 params incl. norm0..3)."""
  cfg = dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))
  return SwinTransformer(**{**cfg, **kwargs})


def swin_s(**kwargs: Any) -> SwinTransformer:
  """Swin-S (embed 96, depths 2-2-18-2)."""
  cfg = dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24))
  return SwinTransformer(**{**cfg, **kwargs})


def swin_b(**kwargs: Any) -> SwinTransformer:
  """Swin-B (embed 128, depths 2-2-18-2)."""
  cfg = dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32))
  return SwinTransformer(**{**cfg, **kwargs})


def swin_micro(**kwargs: Any) -> SwinTransformer:
  """Tiny Swin for CPU runs (embed 32, depths 1-1-2-1, window 7)."""
  cfg = dict(embed_dim=32, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8), window_size=7)
  return SwinTransformer(**{**cfg, **kwargs})


def swin_nano(**kwargs: Any) -> SwinTransformer:
  """Smallest Swin for unit tests (embed 16, depths 1-1-1-1, window 4)."""
  cfg = dict(embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2), window_size=4)
  return SwinTransformer(**{**cfg, **kwargs})


MODELS: dict[str, Callable[..., SwinTransformer]] = {
  'swin_t': swin_t,
  'swin_s': swin_s,
  'swin_b': swin_b,
  'swin_micro': swin_micro,
  'swin_nano': swin_nano,
}


def get_model(name: str, **kwargs: Any) -> SwinTransformer:
  """Build a Swin variant by name (``swin_t``, ``swin_s``, ...)."""
  if name not in MODELS:
    raise ValueError(f'unknown Swin model {name!r}; choose from {sorted(MODELS)}')
  return MODELS[name](**kwargs)


@functools.lru_cache(maxsize=32)
def _param_shapes(model: SwinTransformer) -> Any:
  # Param shapes do not depend on the input size; any small image works.
  x = jax.ShapeDtypeStruct((1, 8 * model.patch_size, 8 * model.patch_size, 3), jnp.float32)
  shapes = jax.eval_shape(lambda r, x: model.init(r, x, train=False), jax.random.key(0), x)
  return shapes['params']


def param_shapes(model: SwinTransformer) -> Any:
  """Param ShapeDtypeStruct tree (the ``'params'`` collection) without allocating."""
  # Cached per (hashable) model config; fresh containers so callers may mutate them.
  return jax.tree.map(lambda s: s, _param_shapes(model))


__all__ = [
  'SwinTransformer', 'SwinBlock', 'SwinStage', 'WindowAttention', 'PatchMerging',
  'PatchEmbed', 'Mlp', 'relative_position_index', 'shifted_window_mask',
  'drop_path', 'swin_t', 'swin_s', 'swin_b',
  'swin_micro', 'swin_nano', 'MODELS', 'get_model', 'param_shapes',
]
