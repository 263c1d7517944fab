"""The training augmentation of `transforms.py` as jitted JAX ops (``data.augment='device'``).

The host path (`data.real.TrainChunks` with the transforms of
`transforms.train_transforms`) costs 20-30 ms of one CPU core per 512x512
image; here the host only decodes and batches, and the accelerator augments.
Inputs are what the cache ships, un-augmented: a sample's uint8 image and
labels at the top-left of a fixed canvas (the dataset's largest image: up to
500x500 for PASCAL-Context, 480x640 for NYUD-v2) with its true (height, width).
Outputs are what the host path gives the engine: the train-size canvas with the
uint8 image, its 'box' (top, left, height, width) and labels padded with 255,
after ignore regions; normalisation stays in `local.normalize_image`.

Two parts, as in the host path:
  * `draw_params(key, ...)`: the random parameters (scale, crop offsets with
    the cat_max_ratio retry, flip, photometric decisions and values), drawn
    from a `jax.random` key with the host path's distributions;
  * `apply_params(...)`: the deterministic rest. Given the same parameters it
    reproduces `transforms.random_scale_crop_flip` -> `photometric_distortion`
    -> `add_ignore_regions` -> `real.place` bit for bit.

Exactness: the resampling taps are computed in float64 as transforms.py (and
OpenCV) computes them, so these functions trace under `jax.enable_x64(True)`
(`make_chunk_augmenter`'s function enables it itself; the heavy ops stay uint8 /
int32 / float32). Where NumPy rounds every operation, XLA contracts a * b + c
into one FMA, rewrites 1 / (a / b) into b / a and a / broadcast(b) into
a * (1 / b); values that must keep NumPy's rounding pass through `_opaque` (an
integer XOR with a zero that only runtime values reveal), and depth is divided
in float64 (correctly rounded to float32 either way). Taps, labels and the
bilinear image then equal the host's bit for bit, not only to ~1e-5
(tests/test_device_augment.py, on the CPU backend).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fedjax_mtl.data import transforms as T

IGNORE = T.IGNORE
RAW_KEYS = ('size', 'aug_id')  # per raw sample: true (H, W); (client, epoch, position)

f32, f64, i32 = jnp.float32, jnp.float64, jnp.int32
Sample = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class AugmentConfig:
  """Static settings of the train augmentation (defaults: `transforms.train_transforms`)."""
  size: tuple[int, int]  # train crop / output canvas (H, W)
  min_scale: float = 0.5
  max_scale: float = 2.0
  cat_max_ratio: float = 0.75
  max_retries: int = 10
  flip_p: float = 0.5
  photometric: bool = True
  brightness_delta: float = 32
  contrast_range: tuple[float, float] = (0.5, 1.5)
  saturation_range: tuple[float, float] = (0.5, 1.5)
  hue_delta: int = 18


def config_from_transforms(transforms: Sequence[Any]) -> AugmentConfig:
  """The `AugmentConfig` of a host train transform list (fused `train_transforms`)."""
  geo = [t for t in transforms if isinstance(t, T.RandomScaleCropFlip)]
  if len(geo) != 1 or any(isinstance(t, (T.RandomScale, T.RandomCrop, T.RandomHorizontalFlip))
                          for t in transforms):
    raise ValueError('device augmentation mirrors train_transforms(size, fused=True): one '
                     'RandomScaleCropFlip, optionally PhotoMetricDistortion')
  kw = dict(geo[0].kw)
  photo = [t for t in transforms if isinstance(t, T.PhotoMetricDistortion)]
  kw['photometric'] = bool(photo)
  if photo:
    kw.update(photo[0].kw)
  return AugmentConfig(**kw)


class Geometry(NamedTuple):
  """Scale, the accepted crop offsets in the rescaled image, and the flip bit."""
  scale: jax.Array  # float64 []
  top: jax.Array  # int32 []
  left: jax.Array  # int32 []
  flip: jax.Array  # bool []


class Photometric(NamedTuple):
  """mmseg PhotoMetricDistortion's decisions and values (used where *_on is True)."""
  contrast_first: jax.Array  # bool
  brightness_on: jax.Array  # bool
  brightness: jax.Array  # float64 delta in [-brightness_delta, brightness_delta)
  contrast_on: jax.Array  # bool
  contrast: jax.Array  # float64 alpha
  saturation_on: jax.Array  # bool
  saturation: jax.Array  # float64 alpha
  hue_on: jax.Array  # bool
  hue: jax.Array  # int32 in [-hue_delta, hue_delta - 1]


class Params(NamedTuple):
  geometry: Geometry
  photometric: Photometric


def _check_x64() -> None:
  if jax.dtypes.canonicalize_dtype(jnp.float64) != jnp.float64:
    raise RuntimeError('device augmentation computes resampling taps in float64 as the host '
                       'path does: trace it under jax.enable_x64(True) (make_chunk_augmenter '
                       'does)')


def runtime_zero(hw: jax.Array) -> jax.Array:
  """0 for every real size (H, W >= 0), but not known to the compiler (see `_opaque`)."""
  return (jnp.asarray(hw)[..., 0] < 0).astype(i32)


def _opaque(x: jax.Array, zero: jax.Array) -> jax.Array:
  """`x`, as a value XLA and LLVM cannot see through: no FMA contraction of the
  product that made it with a following add, no algebraic rewrites across it.
  (`lax.optimization_barrier` does not do this: XLA:CPU drops it before fusion.)"""
  it = jnp.int64 if x.dtype == f64 else i32
  return lax.bitcast_convert_type(lax.bitcast_convert_type(x, it) ^ zero.astype(it), x.dtype)


def _materialize(x):
  """Compute `x` once: keeps XLA from fusing an expensive producer (gathers, the bilinear
  passes) into each of several consumers, which recomputes it per use (5x slower here).
  XLA:CPU drops the barrier unless compiled with `CPU_COMPILER_OPTIONS`."""
  return lax.optimization_barrier(x)


# XLA:CPU's cse_barrier_expander removes optimization barriers before fusion.
CPU_COMPILER_OPTIONS = {'xla_disable_hlo_passes': 'cse_barrier_expander'}


def _div(a: jax.Array, b: jax.Array) -> jax.Array:
  """a / b for a >= 0, correctly rounded: the divisor is tied to `a`, so it is never a
  broadcast that XLA would turn into a multiplication by its reciprocal."""
  a, b = jnp.broadcast_arrays(a, b)
  return a / _opaque(b, (a < 0).astype(i32))


# --------------------------------------------------------------------------- taps

def scaled_size(hw: jax.Array, scale: jax.Array) -> jax.Array:
  """(int(H * s), int(W * s)) in float64, as `scale_sample`."""
  return jnp.floor(hw.astype(f64) * scale).astype(i32)


def nearest_taps(n_in: jax.Array, n_out: jax.Array, dst: jax.Array, zero: jax.Array
                 ) -> jax.Array:
  """OpenCV INTER_NEAREST source index of output index `dst` (`transforms._nearest_taps`).

  `zero`: `runtime_zero(hw)` (a constant 0 lets XLA rewrite the double reciprocal).
  """
  inv = _div(jnp.ones((), f64), _opaque(_div(n_out.astype(f64), n_in.astype(f64)), zero))
  return jnp.minimum(jnp.floor(dst.astype(f64) * inv).astype(i32), n_in - 1)


def linear_taps(n_in: jax.Array, n_out: jax.Array, dst: jax.Array, zero: jax.Array
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """OpenCV INTER_LINEAR (i0, i1, float32 weight) of output index `dst` (`_linear_taps`)."""
  ratio = _div(n_in.astype(f64), n_out.astype(f64))
  f = _opaque((dst.astype(f64) + 0.5) * ratio, zero) - 0.5
  fl = jnp.floor(f)
  i0, w = fl.astype(i32), f - fl
  clamp = (i0 < 0) | (i0 >= n_in - 1)
  i0 = jnp.clip(i0, 0, n_in - 1)
  w = jnp.where(clamp, 0., w)
  return i0, jnp.minimum(i0 + 1, n_in - 1), w.astype(f32)


def _lerp(a: jax.Array, b: jax.Array, w: jax.Array, zero: jax.Array) -> jax.Array:
  """a * (1 - w) + b * w with NumPy's roundings (no FMA)."""
  return _opaque(a * (1 - w), zero) + _opaque(b * w, zero)


def _take2(a: jax.Array, ys: jax.Array, xs: jax.Array) -> jax.Array:
  return jnp.take(jnp.take(a, ys, axis=0, mode='clip'), xs, axis=1, mode='clip')


# --------------------------------------------------------------------------- crop

def _class_counts(labels: jax.Array, mask: jax.Array) -> jax.Array:
  """Per-class pixel counts [255] of the uint8 `labels` where `mask` (255 ignored)."""
  cnt = jnp.zeros(256, i32).at[labels.reshape(-1).astype(i32)].add(
      mask.reshape(-1).astype(i32), mode='drop')
  return cnt[:IGNORE]


def _accepts(cnt: jax.Array, cat_max_ratio: float) -> jax.Array:
  """mmseg's test: >= 2 classes and the largest below cat_max_ratio of the labelled pixels."""
  ratio = _div(cnt.max().astype(f64), cnt.sum().astype(f64))
  return ((cnt > 0).sum() > 1) & (ratio < cat_max_ratio)


def crop_accepts(semseg: jax.Array, hw: jax.Array, nhw: jax.Array, top: jax.Array,
                 left: jax.Array, cfg: AugmentConfig, zero: jax.Array) -> jax.Array:
  """Whether the crop at (top, left) of the semseg rescaled to `nhw` passes cat_max_ratio."""
  ch, cw = cfg.size
  rows, cols = top + jnp.arange(ch, dtype=i32), left + jnp.arange(cw, dtype=i32)
  ys = nearest_taps(hw[0], nhw[0], jnp.minimum(rows, nhw[0] - 1), zero)
  xs = nearest_taps(hw[1], nhw[1], jnp.minimum(cols, nhw[1] - 1), zero)
  mask = (rows < nhw[0])[:, None] & (cols < nhw[1])[None, :]
  return _accepts(_class_counts(_take2(semseg, ys, xs), mask), cfg.cat_max_ratio)


def select_crop(semseg: jax.Array | None, hw: jax.Array, nhw: jax.Array, tops: jax.Array,
                lefts: jax.Array, cfg: AugmentConfig, zero: jax.Array,
                valid: jax.Array | bool = True) -> jax.Array:
  """Index of the crop the host path keeps among candidates [max_retries + 1]: the
  first accepted among the first max_retries, else the last (unchecked)."""
  if semseg is None or cfg.cat_max_ratio >= 1.:
    return jnp.int32(0)
  r = cfg.max_retries
  # No window can pass when the whole image has < 2 classes: skip the loop
  # (the host then also ends on the last draw).
  whole = (jnp.arange(semseg.shape[0]) < hw[0])[:, None] & (jnp.arange(semseg.shape[1]) < hw[1])
  hopeless = (_class_counts(semseg, whole) > 0).sum() < 2
  done0 = jnp.logical_not(valid) | hopeless

  def cond(c):
    i, done = c
    return (i < r) & jnp.logical_not(done)

  def body(c):
    i, _ = c
    ok = crop_accepts(semseg, hw, nhw, tops[i], lefts[i], cfg, zero)
    return jnp.where(ok, i, i + 1), ok

  i, _ = lax.while_loop(cond, body, (jnp.int32(0), done0))
  return jnp.where(done0 & valid, r, i)


# --------------------------------------------------------------------------- draws
# All of a sample's randomness comes from one `jax.random.bits` call (one
# threefry; a dozen separate jax.random calls cost seconds of XLA compile).

def _uniform(bits: jax.Array, lo: float, hi: float) -> jax.Array:
  """float64 U[lo, hi) from uint64 bits (53-bit resolution, as np.random's uniform)."""
  u = (bits >> 11).astype(f64) * (1.0 / (1 << 53))
  return jnp.minimum(lo + (hi - lo) * u, np.nextafter(hi, lo)) if hi > lo else jnp.full_like(u, lo)


def _integers(bits: jax.Array, lo, hi) -> jax.Array:
  """int32 uniform in [lo, hi) from the high 32 bits (multiply-shift; bias < (hi-lo)/2^32)."""
  span = (jnp.asarray(hi, jnp.int64) - lo).astype(jnp.uint64)
  return (lo + ((bits >> 32) * span >> 32).astype(jnp.int64)).astype(i32)


PHOTOMETRIC_WORDS = 9  # uint64 words `draw_photometric` consumes


def draw_photometric(bits: jax.Array, cfg: AugmentConfig) -> Photometric:
  """PhotoMetricDistortion's draws from uint64 `bits` [PHOTOMETRIC_WORDS]: each step with
  p = 0.5 (rng.random() < 0.5), contrast first or last, values as np.random draws them."""
  coin = lambda b: _uniform(b, 0., 1.) < 0.5
  bd = float(cfg.brightness_delta)
  return Photometric(
      contrast_first=coin(bits[0]),
      brightness_on=coin(bits[1]), brightness=_uniform(bits[2], -bd, bd),
      contrast_on=coin(bits[3]), contrast=_uniform(bits[4], *cfg.contrast_range),
      saturation_on=coin(bits[5]), saturation=_uniform(bits[6], *cfg.saturation_range),
      hue_on=coin(bits[7]), hue=_integers(bits[8], -cfg.hue_delta, cfg.hue_delta))


def draw_params(key: jax.Array, semseg: jax.Array | None, hw: jax.Array, cfg: AugmentConfig,
                valid: jax.Array | bool = True) -> Params:
  """Random parameters of one sample with the host path's distributions.

  `semseg` is the raw canvas (None: no cat_max_ratio retry, as on the host
  without semseg); `hw` its true (H, W). Scale ~ U[min, max); max_retries + 1
  candidate crops, each offset uniform over the valid range, of which
  `select_crop` keeps the host's choice; flip with p = flip_p.
  """
  _check_x64()
  zero = runtime_zero(hw)
  hw = jnp.maximum(jnp.asarray(hw, i32), 1)
  n = cfg.max_retries + 1
  bits = jax.random.bits(key, (2 + 2 * n + PHOTOMETRIC_WORDS,), jnp.uint64)
  s = _uniform(bits[0], cfg.min_scale, cfg.max_scale)
  nhw = jnp.maximum(scaled_size(hw, s), 1)
  span = jnp.maximum(nhw - jnp.asarray(cfg.size, i32), 0) + 1
  tops = _integers(bits[2:2 + n], 0, span[0])
  lefts = _integers(bits[2 + n:2 + 2 * n], 0, span[1])
  i = select_crop(semseg, hw, nhw, tops, lefts, cfg, zero, valid)
  flip = _uniform(bits[1], 0., 1.) < cfg.flip_p
  return Params(Geometry(s, tops[i], lefts[i], flip),
                draw_photometric(bits[2 + 2 * n:], cfg))


# --------------------------------------------------------------------------- geometry

def apply_geometry(raw: Mapping[str, jax.Array], hw: jax.Array, geo: Geometry,
                   cfg: AugmentConfig) -> tuple[Sample, jax.Array]:
  """Scale, crop, flip and centre in the train canvas (`random_scale_crop_flip` + `place`).

  Returns ({'image': float32 (0 outside), labels (255 outside), 'box'}, inside
  mask [H, W]). Labels are not yet given ignore regions.
  """
  _check_x64()
  ch, cw = cfg.size
  zero = runtime_zero(hw)
  hw = jnp.maximum(jnp.asarray(hw, i32), 1)
  s = geo.scale.astype(f64)
  nhw = jnp.maximum(scaled_size(hw, s), 1)
  vh = jnp.minimum(ch, nhw[0] - geo.top)
  vw = jnp.minimum(cw, nhw[1] - geo.left)
  t0, l0 = (ch - vh) // 2, (cw - vw) // 2
  i = jnp.arange(ch, dtype=i32) - t0
  j = jnp.arange(cw, dtype=i32) - l0
  rows_in, cols_in = (i >= 0) & (i < vh), (j >= 0) & (j < vw)
  jj = jnp.clip(j, 0, vw - 1)
  dst_r = geo.top + jnp.clip(i, 0, vh - 1)
  dst_c = geo.left + jnp.where(geo.flip, vw - 1 - jj, jj)
  inside = rows_in[:, None] & cols_in[None, :]
  ys, xs = nearest_taps(hw[0], nhw[0], dst_r, zero), nearest_taps(hw[1], nhw[1], dst_c, zero)
  out = {}
  for k, v in raw.items():
    if k == 'image':
      y0, y1, wy = linear_taps(hw[0], nhw[0], dst_r, zero)
      x0, x1, wx = linear_taps(hw[1], nhw[1], dst_c, zero)
      rows = _materialize(_lerp(jnp.take(v, y0, axis=0, mode='clip').astype(f32),
                                jnp.take(v, y1, axis=0, mode='clip').astype(f32),
                                wy[:, None, None], zero))
      img = _lerp(jnp.take(rows, x0, axis=1, mode='clip'), jnp.take(rows, x1, axis=1, mode='clip'),
                  wx[None, :, None], zero)
      out[k] = jnp.where(inside[..., None], img, 0.)
      continue
    a = _take2(v, ys, xs)
    if k == 'depth':
      keep = (a == IGNORE) | (a == 0) | (s == 1.0)
      # float32 a / float32(s), correctly rounded even if XLA multiplies by 1/s.
      a = jnp.where(keep, a, (a.astype(f64) / s.astype(f32).astype(f64)).astype(f32))
    elif k == 'normals':
      ign = (a[..., 0] == IGNORE) & (a[..., 1] == IGNORE) & (a[..., 2] == IGNORE)
      a = a.at[..., 0].set(jnp.where(geo.flip & ~ign, -a[..., 0], a[..., 0]))
    out[k] = jnp.where(inside.reshape(inside.shape + (1,) * (a.ndim - 2)), a,
                       jnp.asarray(IGNORE, a.dtype))
  out['box'] = jnp.stack([t0, l0, vh, vw]).astype(i32)
  return out, inside


# --------------------------------------------------------------------------- colour

_HSV_TABLES = None


def _tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  global _HSV_TABLES
  if _HSV_TABLES is None:
    _HSV_TABLES = T.hsv_tables()
  return _HSV_TABLES


def _affine_lut(alpha, beta) -> jax.Array:
  """`transforms._affine_u8`'s table: float32 x * alpha + beta, clipped, truncated."""
  x = jnp.arange(256, dtype=f32) * jnp.asarray(alpha).astype(f32) + jnp.asarray(beta).astype(f32)
  return jnp.clip(x, 0, 255).astype(jnp.uint8)


def _identity_lut() -> jax.Array:
  return jnp.arange(256, dtype=jnp.uint8)


def rgb_to_hsv_u8(img: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """uint8 RGB -> (H, S, V) int32 planes, as `transforms.rgb_to_hsv_u8` (OpenCV 8-bit)."""
  sdiv, hdiv, _ = _tables()
  r, g, b = (img[..., c].astype(i32) for c in range(3))
  v = jnp.maximum(jnp.maximum(r, g), b)
  diff = v - jnp.minimum(jnp.minimum(r, g), b)
  ir = v == r
  ig = (v == g) & ~ir
  hnum = jnp.where(ir, g - b, jnp.where(ig, b - r + 2 * diff, r - g + 4 * diff))
  h = (hnum * jnp.take(jnp.asarray(hdiv), diff) + (1 << 11)) >> 12
  h = h + 180 * (h < 0)
  s = (diff * jnp.take(jnp.asarray(sdiv), v) + (1 << 11)) >> 12
  return h, s, v


def hsv_to_rgb_u8(h: jax.Array, s: jax.Array, v: jax.Array) -> jax.Array:
  """int32 (H, S, V) planes -> uint8 RGB, as `transforms.hsv_to_rgb_u8`."""
  _, _, factors = _tables()
  rgb = jnp.take(jnp.asarray(factors), jnp.minimum(h, 179) * 256 + s, axis=0)
  t = v.astype(f32) * (np.float32(1.0) / np.float32(255))
  rgb = rgb * t[..., None] * np.float32(255)
  return rgb.astype(jnp.uint8)


def apply_photometric(img: jax.Array, p: Photometric) -> jax.Array:
  """`transforms.photometric_distortion` on a uint8 image with the given draws."""
  ident = _identity_lut()
  bright = jnp.where(p.brightness_on, _affine_lut(1., p.brightness), ident)
  contrast = jnp.where(p.contrast_on, _affine_lut(p.contrast, 0.), ident)
  first = jnp.where(p.contrast_first, contrast[bright.astype(i32)], bright)
  h, s, v = _materialize(rgb_to_hsv_u8(jnp.take(first, img.astype(i32))))
  sat = jnp.where(p.saturation_on, _affine_lut(p.saturation, 0.), ident)
  s = jnp.take(sat, s).astype(i32)
  h = jnp.where(p.hue_on, jnp.mod(h + p.hue, 180), h)
  rgb = hsv_to_rgb_u8(h, s, v)
  last = jnp.where(p.contrast_first, ident, contrast)
  return jnp.take(last, rgb.astype(i32))


# --------------------------------------------------------------------------- sample

def apply_params(raw: Mapping[str, jax.Array], hw: jax.Array, params: Params,
                 cfg: AugmentConfig) -> Sample:
  """The engine sample of raw canvas `raw` (true size `hw`) under `params`.

  Equals the host path's scale/crop/flip -> photometric -> add_ignore_regions
  -> `real.place` into the train canvas. Empty samples (hw = 0, the padding of
  masked steps) give the host's fill: image 0, labels 255, box 0.
  """
  hw = jnp.asarray(hw, i32)
  valid = (hw[0] > 0) & (hw[1] > 0)
  out, inside = apply_geometry(raw, hw, params.geometry, cfg)
  inside = inside & valid
  img = _materialize(jnp.clip(out['image'], 0, 255).astype(jnp.uint8))
  if cfg.photometric:
    img = apply_photometric(img, params.photometric)
  out['image'] = jnp.where(inside[..., None], img, jnp.uint8(0))
  out['box'] = jnp.where(valid, out['box'], 0)
  if 'normals' in out:
    n = out['normals']
    zero = (n[..., 0] == 0) & (n[..., 1] == 0) & (n[..., 2] == 0)
    out['normals'] = jnp.where(zero[..., None], jnp.float32(IGNORE), n)
  if 'depth' in out:
    out['depth'] = jnp.where(out['depth'] == 0, jnp.float32(IGNORE), out['depth'])
  if 'human_parts' in out:
    hp = out['human_parts']
    out['human_parts'] = jnp.where(jnp.all((hp == 0) | (hp == IGNORE)), jnp.uint8(IGNORE), hp)
  for k in out:
    if k not in ('image', 'box'):
      m = inside.reshape(inside.shape + (1,) * (out[k].ndim - 2))
      out[k] = jnp.where(m, out[k], jnp.asarray(IGNORE, out[k].dtype))
  return out


def augment_sample(key: jax.Array, raw: Mapping[str, jax.Array], hw: jax.Array,
                   cfg: AugmentConfig) -> Sample:
  """Draw the parameters from `key`, then apply them (one sample)."""
  hw = jnp.asarray(hw, i32)
  valid = (hw[0] > 0) & (hw[1] > 0)
  params = draw_params(key, raw.get('semseg'), hw, cfg, valid)
  return apply_params(raw, hw, params, cfg)


def sample_key(seed: int, aug_id: jax.Array) -> jax.Array:
  """The key of one sample from (data seed, client, absolute epoch, position), as the host
  path's `np.random.default_rng([seed, client, epoch, position])`."""
  key = jax.random.PRNGKey(seed)
  for c in range(3):
    key = jax.random.fold_in(key, aug_id[c])
  return key


def augment_chunk(x: Mapping[str, jax.Array], *, seed: int, cfg: AugmentConfig) -> Sample:
  """Raw batched canvases (leading axes [...], plus 'size' and 'aug_id') -> engine batch."""
  lead = x['size'].shape[:-1]

  def one(smp):
    raw = {k: v for k, v in smp.items() if k not in RAW_KEYS}
    return augment_sample(sample_key(seed, smp['aug_id']), raw, smp['size'], cfg)

  # One vmap over the flattened leading axes (nested vmaps trace several times slower).
  flat = {k: v.reshape((-1,) + v.shape[len(lead):]) for k, v in x.items()}
  out = jax.vmap(one)(flat)
  return {k: v.reshape(lead + v.shape[1:]) for k, v in out.items()}


def make_chunk_augmenter(cfg: AugmentConfig, seed: int, out_shardings: Any = None
                         ) -> Callable[[Mapping[str, jax.Array]], Sample]:
  """`augment(x) -> x` for the engine's chunks: one jitted `augment_chunk`, run under x64."""
  fn = jax.jit(functools.partial(augment_chunk, seed=int(seed), cfg=cfg),
               out_shardings=out_shardings,
               compiler_options=CPU_COMPILER_OPTIONS if jax.default_backend() == 'cpu' else None)

  def augment(x):
    with jax.enable_x64(True):
      return fn(x)

  augment.jitted = fn
  return augment
