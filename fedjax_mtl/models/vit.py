"""Vision Transformers for classification (AugReg ViT, CLIP image tower) with LoRA.

Two backbones share one pre-LN encoder block; only names, norms and the
activation differ.

**ViT** (:class:`VisionTransformer`, ``vit_b32``, ``vit_b16``): the parameter tree
is the one of ``google-research/vision_transformer`` (``vit_jax``), the layout of
the public AugReg ``.npz`` checkpoints, so a checkpoint loads by splitting its
``'/'``-separated keys (:func:`load_npz`)::

  embedding/{kernel [p, p, 3, D], bias [D]}       patch conv, stride p
  cls [1, 1, D]
  Transformer/posembed_input/pos_embedding [1, 1 + N, D]
  Transformer/encoderblock_{i}/LayerNorm_0/{scale, bias}
  Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1/{query, key, value}/
      {kernel [D, H, D/H], bias [H, D/H]}
  Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1/out/
      {kernel [H, D/H, D], bias [D]}
  Transformer/encoderblock_{i}/LayerNorm_2/{scale, bias}
  Transformer/encoderblock_{i}/MlpBlock_3/Dense_{0,1}/{kernel, bias}
  Transformer/encoder_norm/{scale, bias}
  head/{kernel [D, C], bias [C]}                   only when ``num_classes`` is set

LayerNorm eps 1e-6, exact (erf) GELU, the [CLS] token after ``encoder_norm`` is
the feature. (``vit_jax`` itself uses flax's default tanh-approximate
``nn.gelu``; ``approximate_gelu=True`` reproduces it bit for bit, the default
follows timm/HF, which run the same checkpoints with the exact GELU.)

**CLIP image tower** (:class:`CLIPVisionTower`, ``ViT-B-32``): OpenAI CLIP /
OpenCLIP ``VisionTransformer`` semantics (conv1 without bias, class and
positional embeddings, ``ln_pre``, pre-LN residual blocks, ``ln_post`` on the
class token, ``@ proj`` without bias; LayerNorm eps 1e-5). Flax names and the
mapping from an OpenCLIP ``visual.*`` state dict (``H`` heads, ``hd = D/H``)::

  conv1/kernel [p, p, 3, D]        conv1.weight [D, 3, p, p].transpose(2, 3, 1, 0)
  class_embedding [D]              class_embedding
  positional_embedding [1 + N, D]  positional_embedding
  ln_pre/{scale, bias}             ln_pre.{weight, bias}
  transformer/resblocks_{i}/
    ln_1, ln_2/{scale, bias}       transformer.resblocks.{i}.ln_{1,2}.{weight, bias}
    attn/{q,k,v}_proj/kernel       attn.in_proj_weight [3D, D] split in 3 (q, k, v),
        [D, H, hd]                   each .T.reshape(D, H, hd)
    attn/{q,k,v}_proj/bias [H, hd] attn.in_proj_bias split in 3, each .reshape(H, hd)
    attn/out_proj/kernel [H, hd, D] attn.out_proj.weight.T.reshape(H, hd, D)
    attn/out_proj/bias [D]         attn.out_proj.bias
    mlp/{c_fc, c_proj}/kernel      mlp.{c_fc, c_proj}.weight.T
    mlp/{c_fc, c_proj}/bias        mlp.{c_fc, c_proj}.bias
  ln_post/{scale, bias}            ln_post.{weight, bias}
  proj [D, E]                      proj (already [D, E]: CLIP computes x @ proj)

The q/k/v projections are kept separate (PyTorch fuses them in ``in_proj``) so
LoRA on q and v is a plain per-projection adapter. The activation is part of the
model's name, spelled as OpenCLIP does (``OPENCLIP_MODELS``): QuickGELU
(``x * sigmoid(1.702 x)``) for ``ViT-B-32-quickgelu`` (the OpenAI weights), the
exact GELU for ``ViT-B-32`` and ``ViT-B-32-256`` (DataComp, NTKFedAvg's backbone).
State dicts do not record it; converted ``.npz`` files do (``__meta__/activation``,
checked on loading: :func:`check_activation`). The tower returns the projected
(not normalised) embedding; zero-shot heads normalise it.

**LoRA** (MaTU spec §4): with ``lora_rank = r > 0`` the query and value
projections of every block get ``y = W x + b + (alpha / r) B A x``
(``alpha = r`` by default; no dropout). The adapter leaves sit next to the
kernel they adapt: ``.../query/{lora_a [D, r], lora_b [r, H, hd]}`` (CLIP:
``q_proj``/``v_proj``). ``A`` is Kaiming-uniform as PyTorch's
``kaiming_uniform_(a=sqrt(5))`` (``U(-1/sqrt(D), 1/sqrt(D))``) drawn from
``lora_seed`` and the block/target only, never from the init rng, so every
client initialised with its own key gets the same ``A``; ``B = 0``, so a fresh
adapter leaves the frozen model's output bitwise unchanged.
:func:`param_labels` tells backbone, adapters and heads apart (for
``optax.multi_transform`` and the engine's label trees), :func:`merge_lora`
folds adapters into the kernels for evaluation (:func:`apply_merged`), and
:func:`add_adapters` adds fresh adapters to a loaded backbone.

The input resolution is fixed by ``image_size`` (the position embedding's
length); a checkpoint at another resolution needs its position embedding
resized before loading.

Mixed precision like :mod:`fedjax_mtl.models.swin`: parameters float32,
``dtype`` is the compute dtype of matmuls; residual stream, LayerNorm
statistics and softmax stay float32.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl.errors import ConfigError, check_choice
from fedjax_mtl.models.swin import LayerNorm, gelu, matmul, softmax

Dtype = Any
Params = Any

LABELS = ('backbone', 'adapter', 'head')
ADAPTER_LEAVES = ('lora_a', 'lora_b')
HEAD_NAME = 'head'
# Projection name -> target id folded into A's key (q and v of both layouts).
LORA_TARGETS = {'query': 0, 'value': 1, 'q_proj': 0, 'v_proj': 1}
_BLOCK_RE = re.compile(r'^(?:encoderblock|resblocks)_(\d+)$')

_xavier = nn.initializers.xavier_uniform()
_lecun = nn.initializers.lecun_normal()


class Layout(NamedTuple):
  """Submodule names of one encoder block (``vit_jax`` or OpenCLIP flavour)."""

  ln_1: str
  attn: str
  q: str
  k: str
  v: str
  out: str
  ln_2: str
  mlp: str
  fc_1: str
  fc_2: str


AUGREG = Layout('LayerNorm_0', 'MultiHeadDotProductAttention_1', 'query', 'key', 'value', 'out',
                'LayerNorm_2', 'MlpBlock_3', 'Dense_0', 'Dense_1')
OPENCLIP = Layout('ln_1', 'attn', 'q_proj', 'k_proj', 'v_proj', 'out_proj',
                  'ln_2', 'mlp', 'c_fc', 'c_proj')
ACTIVATIONS = ('gelu', 'gelu_tanh', 'quick_gelu')


# ---------------------------------------------------------------------------
# LoRA initialisation
# ---------------------------------------------------------------------------


def lora_a_init(seed: int, block: int, target: str, shape: tuple[int, int]) -> jax.Array:
  """LoRA ``A`` [fan_in, r] ~ U(+-1/sqrt(fan_in)), a function of (seed, block, target) only."""
  check_choice('LoRA target', target, LORA_TARGETS)
  key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), block), LORA_TARGETS[target])
  bound = 1.0 / np.sqrt(shape[0])  # kaiming_uniform_(a=sqrt(5)) on torch's [r, fan_in] weight
  return jax.random.uniform(key, shape, jnp.float32, -bound, bound)


# ---------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------


class HeadsProj(nn.Module):
  """Dense ``D -> (H, hd)`` (kernel [D, H, hd], bias [H, hd]) with an optional LoRA adapter."""

  num_heads: int
  head_dim: int
  lora_rank: int = 0
  lora_scale: float = 1.0
  lora_seed: int = 0
  block: int = 0
  target: str = 'query'
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    d, h, hd = x.shape[-1], self.num_heads, self.head_dim
    kernel = self.param('kernel', lambda k, s: _xavier(k, (d, h * hd)).reshape(s), (d, h, hd))
    bias = self.param('bias', nn.initializers.zeros, (h, hd), jnp.float32)
    x = x.astype(self.dtype)
    y = matmul(x, kernel.reshape(d, h * hd).astype(self.dtype))
    y = y + bias.reshape(-1).astype(self.dtype)
    if self.lora_rank:
      r = self.lora_rank
      a = self.param('lora_a', lambda _, s: lora_a_init(self.lora_seed, self.block, self.target, s),
                     (d, r))
      b = self.param('lora_b', nn.initializers.zeros, (r, h, hd), jnp.float32)
      delta = matmul(matmul(x, a.astype(self.dtype)), b.reshape(r, h * hd).astype(self.dtype))
      if self.lora_scale != 1.0:
        delta = delta * jnp.asarray(self.lora_scale, self.dtype)
      y = y + delta  # after the bias: with B = 0 the output is bitwise the frozen one
    return y.reshape(*x.shape[:-1], h, hd)


class HeadsOut(nn.Module):
  """Dense ``(H, hd) -> D`` (kernel [H, hd, D], bias [D])."""

  features: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    h, hd, d = x.shape[-2], x.shape[-1], self.features
    kernel = self.param('kernel', lambda k, s: _xavier(k, (h * hd, d)).reshape(s), (h, hd, d))
    bias = self.param('bias', nn.initializers.zeros, (d,), jnp.float32)
    x = x.reshape(*x.shape[:-2], h * hd).astype(self.dtype)
    return matmul(x, kernel.reshape(h * hd, d).astype(self.dtype)) + bias.astype(self.dtype)


class Attention(nn.Module):
  """Multi-head self-attention; LoRA on the query and value projections."""

  layout: Layout
  num_heads: int
  block: int = 0
  lora_rank: int = 0
  lora_scale: float = 1.0
  lora_seed: int = 0
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    d, heads, names = x.shape[-1], self.num_heads, self.layout
    if d % heads:
      raise ValueError(f'width {d} is not divisible by {heads} heads')
    hd = d // heads

    def proj(name, rank):
      return HeadsProj(heads, hd, rank, self.lora_scale, self.lora_seed, self.block, name,
                       self.dtype, name=name)(x)

    q = proj(names.q, self.lora_rank)
    k = proj(names.k, 0)
    v = proj(names.v, self.lora_rank)
    q = q * jnp.asarray(hd**-0.5, self.dtype)
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k, preferred_element_type=jnp.float32)
    attn = softmax(logits).astype(self.dtype)
    out = jnp.einsum('bhqk,bkhd->bqhd', attn, v)
    return HeadsOut(d, self.dtype, name=names.out)(out)


class _Dense(nn.Module):
  features: int
  dtype: Dtype = jnp.float32
  kernel_init: Callable = _xavier

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.param('kernel', self.kernel_init, (x.shape[-1], self.features), jnp.float32)
    bias = self.param('bias', nn.initializers.zeros, (self.features,), jnp.float32)
    return matmul(x.astype(self.dtype), kernel.astype(self.dtype)) + bias.astype(self.dtype)


def _activation(name: str, x: jax.Array) -> jax.Array:
  if name == 'gelu':
    return gelu(x)
  if name == 'gelu_tanh':
    return jax.nn.gelu(x, approximate=True)
  return x * jax.nn.sigmoid(1.702 * x)


class Mlp(nn.Module):
  """Dense -> activation -> Dense."""

  layout: Layout
  hidden: int
  activation: str = 'gelu'
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    d = x.shape[-1]
    y = _Dense(self.hidden, self.dtype, name=self.layout.fc_1)(x)
    y = _activation(self.activation, y)
    return _Dense(d, self.dtype, name=self.layout.fc_2)(y)


class EncoderBlock(nn.Module):
  """Pre-LN block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

  layout: Layout
  num_heads: int
  mlp_dim: int
  epsilon: float
  activation: str = 'gelu'
  block: int = 0
  lora_rank: int = 0
  lora_scale: float = 1.0
  lora_seed: int = 0
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    names = self.layout
    y = LayerNorm(self.dtype, self.epsilon, True, name=names.ln_1)(x)
    y = Attention(names, self.num_heads, self.block, self.lora_rank, self.lora_scale,
                  self.lora_seed, self.dtype, name=names.attn)(y)
    x = x + y.astype(jnp.float32)
    y = LayerNorm(self.dtype, self.epsilon, True, name=names.ln_2)(x)
    y = Mlp(names, self.mlp_dim, self.activation, self.dtype, name=names.mlp)(y)
    return x + y.astype(jnp.float32)


def _patchify(x: jax.Array, patch: int, image_size: int) -> jax.Array:
  """(B, S, S, C) -> (B, (S/p)^2, p*p*C) in the conv kernel's (p, q, c) order, row-major patches."""
  b, h, w, c = x.shape
  if (h, w) != (image_size, image_size):
    raise ValueError(f'expected {image_size}x{image_size} images (the position embedding is '
                     f'fixed at build time; set image_size); got {h}x{w}')
  if image_size % patch:
    raise ValueError(f'image_size {image_size} is not a multiple of the patch size {patch}')
  n = image_size // patch
  x = x.reshape(b, n, patch, n, patch, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(b, n * n, patch * patch * c)


class _PatchConv(nn.Module):
  """Stride-p, p x p conv (kernel [p, p, C, D]) as one matmul on the patches."""

  features: int
  patch: int
  use_bias: bool = True
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, patches: jax.Array) -> jax.Array:
    p, c = self.patch, patches.shape[-1] // self.patch**2
    kernel = self.param('kernel', _lecun, (p, p, c, self.features), jnp.float32)
    y = matmul(patches.astype(self.dtype),
               kernel.reshape(p * p * c, self.features).astype(self.dtype))
    if self.use_bias:
      y = y + self.param('bias', nn.initializers.zeros, (self.features,),
                         jnp.float32).astype(self.dtype)
    return y


def _head(x: jax.Array, num_classes: int | None) -> jax.Array | None:
  """Zero-initialised linear classifier named ``head`` (``vit_jax``'s init), or None."""
  if num_classes is None:
    return None
  return _Dense(num_classes, jnp.float32, nn.initializers.zeros, name=HEAD_NAME)(x)


class Encoder(nn.Module):
  """``depth`` encoder blocks named ``{prefix}_{i}``.

  With ``vit_jax=True`` also ``vit_jax``'s ``posembed_input`` (added first) and
  ``encoder_norm``, and the output is the normed [CLS] token; otherwise all
  tokens are returned.
  """

  layout: Layout
  prefix: str
  depth: int
  num_heads: int
  mlp_dim: int
  epsilon: float
  activation: str = 'gelu'
  vit_jax: bool = False
  lora_rank: int = 0
  lora_scale: float = 1.0
  lora_seed: int = 0
  remat: bool = False
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    check_choice('activation', self.activation, ACTIVATIONS)
    if self.vit_jax:
      x = x + _PosEmbed(x.shape[1], x.shape[2], name='posembed_input')()
    block_cls = nn.remat(EncoderBlock) if self.remat else EncoderBlock
    for i in range(self.depth):
      x = block_cls(self.layout, self.num_heads, self.mlp_dim, self.epsilon, self.activation, i,
                    self.lora_rank, self.lora_scale, self.lora_seed, self.dtype,
                    name=f'{self.prefix}_{i}')(x)
    if self.vit_jax:
      # LayerNorm is per token: norming only [CLS] equals vit_jax's norm-then-take.
      x = LayerNorm(jnp.float32, self.epsilon, True, name='encoder_norm')(x[:, 0])
    return x


class _PosEmbed(nn.Module):
  tokens: int
  width: int

  @nn.compact
  def __call__(self) -> jax.Array:
    return self.param('pos_embedding', nn.initializers.normal(0.02),
                      (1, self.tokens, self.width), jnp.float32)


class VisionTransformer(nn.Module):
  """ViT in the ``vit_jax``/AugReg layout; returns ``(cls_feature, logits or None)``.

  ``train`` is accepted for interface parity with the other encoders and
  unused (no dropout, no batch norm).
  """

  patch_size: int
  hidden_size: int
  depth: int
  num_heads: int
  mlp_dim: int
  image_size: int = 224
  num_classes: int | None = None
  lora_rank: int = 0
  lora_alpha: float | None = None  # None: alpha = rank (scale 1)
  lora_seed: int = 0
  approximate_gelu: bool = False
  remat: bool = False
  dtype: Dtype = jnp.float32

  @property
  def lora_scale(self) -> float:
    """``alpha / rank`` (1.0 without LoRA or with the default alpha)."""
    return _lora_scale(self.lora_rank, self.lora_alpha)

  @nn.compact
  def __call__(self, images: jax.Array, train: bool = False) -> tuple[jax.Array, jax.Array | None]:
    del train
    d = self.hidden_size
    patches = _patchify(images, self.patch_size, self.image_size)
    x = _PatchConv(d, self.patch_size, True, self.dtype, name='embedding')(patches)
    b = x.shape[0]
    cls = self.param('cls', nn.initializers.zeros, (1, 1, d), jnp.float32)
    x = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, d)), x.astype(jnp.float32)], axis=1)
    x = Encoder(AUGREG, 'encoderblock', self.depth, self.num_heads, self.mlp_dim, 1e-6,
                'gelu_tanh' if self.approximate_gelu else 'gelu', True, self.lora_rank,
                self.lora_scale, self.lora_seed, self.remat, self.dtype, name='Transformer')(x)
    return x, _head(x, self.num_classes)


class CLIPVisionTower(nn.Module):
  """CLIP image encoder (OpenCLIP semantics); returns ``(embedding [B, E], logits or None)``."""

  patch_size: int
  width: int
  depth: int
  num_heads: int
  mlp_dim: int
  output_dim: int
  image_size: int = 224
  quick_gelu: bool = True
  num_classes: int | None = None
  lora_rank: int = 0
  lora_alpha: float | None = None
  lora_seed: int = 0
  remat: bool = False
  dtype: Dtype = jnp.float32

  @property
  def lora_scale(self) -> float:
    """``alpha / rank`` (1.0 without LoRA or with the default alpha)."""
    return _lora_scale(self.lora_rank, self.lora_alpha)

  @nn.compact
  def __call__(self, images: jax.Array, train: bool = False) -> tuple[jax.Array, jax.Array | None]:
    del train
    d = self.width
    std = d**-0.5  # OpenAI CLIP's init of the embeddings and proj
    patches = _patchify(images, self.patch_size, self.image_size)
    x = _PatchConv(d, self.patch_size, False, self.dtype, name='conv1')(patches)
    b, n = x.shape[:2]
    cls = self.param('class_embedding', nn.initializers.normal(std), (d,), jnp.float32)
    pos = self.param('positional_embedding', nn.initializers.normal(std), (n + 1, d), jnp.float32)
    x = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, d)), x.astype(jnp.float32)], axis=1) + pos
    x = LayerNorm(jnp.float32, 1e-5, True, name='ln_pre')(x)
    x = Encoder(OPENCLIP, 'resblocks', self.depth, self.num_heads, self.mlp_dim, 1e-5,
                'quick_gelu' if self.quick_gelu else 'gelu', False, self.lora_rank,
                self.lora_scale, self.lora_seed, self.remat, self.dtype, name='transformer')(x)
    x = LayerNorm(self.dtype, 1e-5, True, name='ln_post')(x[:, 0])
    proj = self.param('proj', nn.initializers.normal(std), (d, self.output_dim), jnp.float32)
    x = matmul(x, proj.astype(self.dtype)).astype(jnp.float32)
    return x, _head(x, self.num_classes)


def _lora_scale(rank: int, alpha: float | None) -> float:
  if rank < 0:
    raise ValueError(f'lora_rank must be >= 0 (0: no LoRA); got {rank}')
  if not rank or alpha is None:
    return 1.0
  return float(alpha) / rank


# ---------------------------------------------------------------------------
# Factories
# ---------------------------------------------------------------------------


def vit_b32(**kwargs: Any) -> VisionTransformer:
  """ViT-B/32 at 224 (87,455,232 backbone params; AugReg / IN-21k checkpoints)."""
  cfg = dict(patch_size=32, hidden_size=768, depth=12, num_heads=12, mlp_dim=3072)
  return VisionTransformer(**{**cfg, **kwargs})


def vit_b16(**kwargs: Any) -> VisionTransformer:
  """ViT-B/16 at 224 (85,798,656 backbone params)."""
  cfg = dict(patch_size=16, hidden_size=768, depth=12, num_heads=12, mlp_dim=3072)
  return VisionTransformer(**{**cfg, **kwargs})


def vit_small(**kwargs: Any) -> VisionTransformer:
  """MaTU spec's stand-in "small" ViT: 32x32 input, patch 4, width 192, depth 6, 3 heads."""
  cfg = dict(patch_size=4, hidden_size=192, depth=6, num_heads=3, mlp_dim=768, image_size=32)
  return VisionTransformer(**{**cfg, **kwargs})


def vit_micro(**kwargs: Any) -> VisionTransformer:
  """MaTU spec's CI-sized "micro" ViT: 16x16 input, patch 4, width 64, depth 2, 2 heads."""
  cfg = dict(patch_size=4, hidden_size=64, depth=2, num_heads=2, mlp_dim=256, image_size=16)
  return VisionTransformer(**{**cfg, **kwargs})


def vit_tiny_test(**kwargs: Any) -> VisionTransformer:
  """Unit-test ViT: 32x32 input, patch 8, width 32, depth 2, 2 heads, MLP 64."""
  cfg = dict(patch_size=8, hidden_size=32, depth=2, num_heads=2, mlp_dim=64, image_size=32)
  return VisionTransformer(**{**cfg, **kwargs})


def clip_vit_b32(*, quick_gelu: bool, **kwargs: Any) -> CLIPVisionTower:
  """CLIP ViT-B/32 image tower at 224 (87,849,216 params). ``quick_gelu`` must be said:
  True for the OpenAI weights and OpenCLIP's ``-quickgelu`` models, False for OpenCLIP
  models trained with the exact GELU (``MODELS`` names them as OpenCLIP does)."""
  cfg = dict(patch_size=32, width=768, depth=12, num_heads=12, mlp_dim=3072, output_dim=512)
  return CLIPVisionTower(**{**cfg, 'quick_gelu': quick_gelu, **kwargs})


def clip_tiny_test(**kwargs: Any) -> CLIPVisionTower:
  """Unit-test CLIP tower: 32x32 input, patch 8, width 32, depth 2, 2 heads, embed 16
  (QuickGELU unless ``quick_gelu=False``)."""
  cfg = dict(patch_size=8, width=32, depth=2, num_heads=2, mlp_dim=64, output_dim=16,
             image_size=32)
  return CLIPVisionTower(**{**cfg, **kwargs})


# CLIP towers by their OpenCLIP model names, which say the activation: OpenCLIP spells
# QuickGELU models '-quickgelu' (the OpenAI weights are 'ViT-B-32-quickgelu'); a state
# dict does not record it (`convert_vit.load_vit`).
OPENCLIP_MODELS: dict[str, Callable[..., CLIPVisionTower]] = {
  'ViT-B-32': functools.partial(clip_vit_b32, quick_gelu=False),
  'ViT-B-32-quickgelu': functools.partial(clip_vit_b32, quick_gelu=True),
  # NTKFedAvg's CLIP (DataComp, 256 px)
  'ViT-B-32-256': functools.partial(clip_vit_b32, quick_gelu=False, image_size=256),
}

MODELS: dict[str, Callable[..., nn.Module]] = {
  'vit_b32': vit_b32,
  'vit_b16': vit_b16,
  'vit_small': vit_small,
  'vit_micro': vit_micro,
  'vit_tiny_test': vit_tiny_test,
  **OPENCLIP_MODELS,
  'clip_tiny_test': clip_tiny_test,
}


def activation(model: nn.Module) -> str:
  """The MLP activation of a ViT or CLIP tower, one of ``ACTIVATIONS``."""
  if isinstance(model, CLIPVisionTower):
    return 'quick_gelu' if model.quick_gelu else 'gelu'
  return 'gelu_tanh' if model.approximate_gelu else 'gelu'


def get_model(name: str, **kwargs: Any) -> nn.Module:
  """Build a ViT / CLIP tower by name (``vit_b32``, ``ViT-B-32``, ...)."""
  check_choice('ViT model', name, MODELS)
  return MODELS[name](**kwargs)


def param_shapes(model: nn.Module) -> Params:
  """Param ShapeDtypeStruct tree (the ``'params'`` collection) without allocating."""
  x = jax.ShapeDtypeStruct((1, model.image_size, model.image_size, 3), jnp.float32)
  return jax.eval_shape(lambda r, x: model.init(r, x), jax.random.key(0), x)['params']


def init_params(model: nn.Module, rng: jax.Array) -> Params:
  """Initialised params (jitted init; adapters from ``model.lora_seed``, not ``rng``)."""
  x = jnp.zeros((1, model.image_size, model.image_size, 3), jnp.float32)
  return jax.jit(model.init)(rng, x)['params']


# ---------------------------------------------------------------------------
# Parameter trees: labels, LoRA merge, counts, checkpoint I/O
# ---------------------------------------------------------------------------


def block_index(name: str) -> int | None:
  """The block number of a param-tree key (``encoderblock_3``, ``resblocks_3`` -> 3), else None."""
  m = _BLOCK_RE.match(name)
  return int(m.group(1)) if m else None


def _key_name(k: Any) -> str:
  return str(getattr(k, 'key', getattr(k, 'name', k)))


def _label(path: tuple) -> str:
  names = [_key_name(k) for k in path]
  if names and names[-1] in ADAPTER_LEAVES:
    return 'adapter'
  if names and names[0] == HEAD_NAME:
    return 'head'
  return 'backbone'


def param_labels(params: Params) -> Params:
  """Same-structure tree of ``'backbone'`` | ``'adapter'`` | ``'head'`` (stacked trees too)."""
  return jax.tree_util.tree_map_with_path(lambda p, _: _label(p), params)


def count_params_by_label(params: Params) -> dict[str, int]:
  """``{label: number of scalars}`` over the tree as given (a stacked tree counts every client)."""
  counts = dict.fromkeys(LABELS, 0)
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    counts[_label(path)] += int(np.prod(np.shape(leaf)))
  return counts


def count_adapter_params(params: Params) -> int:
  """Number of LoRA scalars (``lora_a`` and ``lora_b`` leaves) in ``params``."""
  return count_params_by_label(params)['adapter']


def merge_lora(params: Params, scale: float = 1.0) -> Params:
  """``params`` without adapters, ``kernel + scale * A @ B`` folded into each adapted kernel.

  ``scale`` is the model's ``lora_scale`` (alpha / r). Works on stacked trees
  (any leading axes shared by kernel, A and B). Apply the result with the same
  model at ``lora_rank=0`` (:func:`apply_merged`).
  """
  if not isinstance(params, Mapping):
    return params
  out = {k: merge_lora(v, scale) for k, v in params.items() if k not in ADAPTER_LEAVES}
  if 'lora_a' in params:
    a, b, kernel = params['lora_a'], params['lora_b'], params['kernel']
    lead = a.ndim - 2
    b_flat = b.reshape(*b.shape[:lead], b.shape[lead], -1)
    delta = jnp.matmul(a, b_flat).reshape(kernel.shape)
    out['kernel'] = (kernel + scale * delta).astype(kernel.dtype)
  return out


def apply_merged(model: nn.Module, params: Params, images: jax.Array) -> Any:
  """Forward pass with the adapters folded into the kernels (one matmul per projection)."""
  plain = model.clone(lora_rank=0, parent=None)
  return plain.apply({'params': merge_lora(params, model.lora_scale)}, images)


def add_adapters(params: Params, rank: int, seed: int = 0) -> Params:
  """Fresh adapters (``A`` from ``seed``, ``B = 0``) on every block's q/v of a backbone tree.

  Gives the same adapters as initialising the model with ``lora_rank=rank,
  lora_seed=seed``, e.g. after :func:`load_npz`. Unstacked trees only.
  """

  def walk(tree, block):
    out = {}
    for k, v in tree.items():
      if isinstance(v, Mapping):
        index = block_index(k)
        v = walk(v, block if index is None else index)
        if k in LORA_TARGETS and block is not None and 'kernel' in v:
          kernel = v['kernel']
          v['lora_a'] = lora_a_init(seed, block, k, (kernel.shape[0], rank))
          v['lora_b'] = jnp.zeros((rank, *kernel.shape[1:]), jnp.float32)
      out[k] = v
    return out

  if rank <= 0:
    raise ValueError(f'rank must be > 0; got {rank}')
  return walk(params, None)


def flatten_params(params: Params, sep: str = '/') -> dict[str, Any]:
  """``{'Transformer/encoder_norm/scale': leaf, ...}``: the ``.npz`` key layout."""
  return {sep.join(_key_name(k) for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}


def unflatten_params(flat: Mapping[str, Any], sep: str = '/') -> dict:
  """Inverse of :func:`flatten_params`: split each key on ``sep`` into nested dicts."""
  tree: dict = {}
  for key, value in flat.items():
    *parents, leaf = key.split(sep)
    node = tree
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return tree


# Keys of a converted ``.npz`` that describe it rather than hold params (strings):
# ``__meta__/activation`` (one of ``ACTIVATIONS``) and ``__meta__/model``.
META_PREFIX = '__meta__/'


def load_npz(path: str) -> dict:
  """A ``vit_jax``/AugReg ``.npz`` checkpoint as a params tree (float32 NumPy leaves),
  without its metadata (:func:`npz_meta`).

  Drop ``'head'`` when fine-tuning with another number of classes.
  """
  with np.load(path) as data:
    return unflatten_params({k: np.asarray(data[k], np.float32) for k in data.files
                             if not k.startswith(META_PREFIX)})


def npz_meta(path: str) -> dict[str, str]:
  """The metadata a converted ``.npz`` records (``{'activation': ..., 'model': ...}``;
  empty for files written without it, e.g. the public AugReg checkpoints)."""
  with np.load(path) as data:
    return {k[len(META_PREFIX):]: str(data[k]) for k in data.files if k.startswith(META_PREFIX)}


def check_activation(model: nn.Module, meta: Mapping[str, str], where: str,
                     model_name: str = '') -> None:
  """ConfigError (one line) unless weights whose metadata is ``meta`` suit ``model``'s
  activation. A CLIP tower needs the activation recorded: its state dicts do not say
  whether they were trained with QuickGELU or the exact GELU."""
  want = activation(model)
  name = model_name or type(model).__name__
  got = meta.get('activation')
  if got is None:
    if isinstance(model, CLIPVisionTower):
      raise ConfigError(f'{where} does not record the activation its CLIP weights were trained '
                        'with; convert the checkpoint again with scripts/convert_vit.py --model '
                        'naming the OpenCLIP model (ViT-B-32: exact GELU; ViT-B-32-quickgelu: '
                        'QuickGELU, the OpenAI weights)')
    return
  if got != want:
    hint = ''
    if isinstance(model, CLIPVisionTower):
      fits = [n for n, f in OPENCLIP_MODELS.items()
              if activation(f()) == got and f().image_size == model.image_size]
      hint = f'; use model {fits[0]!r}' if fits else ''
    raise ConfigError(f'{where} holds weights trained with activation {got!r} '
                      f'({meta.get("model", "model not recorded")}), but model {name} uses '
                      f'{want!r}{hint}')


__all__ = [
  'VisionTransformer', 'CLIPVisionTower', 'EncoderBlock', 'Attention', 'HeadsProj', 'HeadsOut',
  'Mlp', 'Encoder', 'LayerNorm', 'Layout', 'AUGREG', 'OPENCLIP', 'LABELS', 'LORA_TARGETS',
  'vit_b32', 'vit_b16', 'vit_small', 'vit_micro', 'vit_tiny_test',
  'clip_vit_b32', 'clip_tiny_test', 'OPENCLIP_MODELS', 'MODELS', 'get_model', 'activation',
  'param_shapes', 'init_params', 'lora_a_init', 'param_labels', 'count_params_by_label',
  'count_adapter_params', 'merge_lora', 'apply_merged', 'add_adapters',
  'flatten_params', 'unflatten_params', 'load_npz', 'npz_meta', 'check_activation',
  'META_PREFIX',
]
