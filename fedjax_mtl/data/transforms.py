"""NumPy train/eval transforms for dense multi-task samples (FedHCA2 / ATRC recipe).

Train order (``train_transforms``), as in the reference ``get_transformations``:
  1. RandomScale U[0.5, 2.0]: bilinear image, nearest labels, depth /= scale.
  2. RandomCrop to the train size, cat_max_ratio 0.75 with <= 10 retries.
  3. RandomHorizontalFlip p=0.5 (normals x negated).
  4. PhotoMetricDistortion (mmseg): brightness, contrast, saturation, hue.
  5. Normalize with ImageNet mean/std.
  6. PadToSize (centred): image 0, labels 255, normals 0, depth 0.
  7. AddIgnoreRegions: normals zero-norm -> 255, depth 0 -> 255, parts without
     part pixels -> all 255.
Padding comes after normalisation (as in the reference) so padded image pixels
are exactly 0 in normalised space and untouched by the colour jitter.
Steps 1-3 run by default as one fused, bit-identical transform
(``RandomScaleCropFlip``) that only resamples the crop window.
Eval (``eval_transforms``): Normalize, PadToSize, AddIgnoreRegions; no resize.

Fidelity to the OpenCV-based reference (checked against opencv-python 5.0, which
is not a dependency): nearest resize, Laplacian and 8-bit RGB->HSV are
bit-exact; bilinear resize agrees to float32 rounding (~1e-5); HSV->RGB matches
OpenCV's vectorised path (truncation), i.e. all but OpenCV's scalar tail pixels.

Samples are dicts of numpy arrays keyed by 'image' (uint8 or float [H,W,3]) and
task names; labels are [H,W] ('normals' [H,W,3]). Functions never modify their
input arrays in place (sources may hand out read-only memory maps). All
randomness comes from the explicit ``np.random.Generator`` argument; the grain
RandomMap wrappers receive one per element from grain, so a pipeline is
deterministic given its seed.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import grain
import numpy as np

IGNORE = 255
# ImageNet statistics (RGB), applied after scaling to [0, 1] as the reference does.
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
TRAIN_SIZES = {'pascal': (512, 512), 'nyud': (448, 576)}  # (H, W)

Sample = dict[str, np.ndarray]
_LABEL_KEYS = frozenset({'semseg', 'human_parts', 'sal', 'edge'})  # uint8, pad 255
_FLOAT_KEYS = frozenset({'normals', 'depth'})  # float, pad 0 -> ignored later
_KNOWN = _LABEL_KEYS | _FLOAT_KEYS | {'image'}


def _check_keys(sample: Mapping[str, np.ndarray]) -> None:
  unknown = [k for k in sample if k not in _KNOWN]
  if unknown:
    # An unknown dense field would silently lose alignment with the image.
    raise KeyError(f'unknown sample fields {unknown}; known: {sorted(_KNOWN)}')


def _is_ignored_normal(n: np.ndarray) -> np.ndarray:
  # Per-channel compares: much faster than np.all(..., axis=-1) over a size-3 axis.
  return (n[..., 0] == IGNORE) & (n[..., 1] == IGNORE) & (n[..., 2] == IGNORE)


def _hw(size: int | Sequence[int]) -> tuple[int, int]:
  if isinstance(size, (int, np.integer)):
    return int(size), int(size)
  h, w = size
  return int(h), int(w)


# --------------------------------------------------------------------------- resizing

def _linear_taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Source indices and weights of OpenCV INTER_LINEAR (half-pixel centres, clamped)."""
  f = (np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5
  i0 = np.floor(f).astype(np.int64)
  w = f - i0
  low = i0 < 0
  i0[low], w[low] = 0, 0.
  high = i0 >= n_in - 1
  i0[high], w[high] = n_in - 1, 0.
  i1 = np.minimum(i0 + 1, n_in - 1)
  return i0, i1, w.astype(np.float32)


def _nearest_taps(n_in: int, n_out: int) -> np.ndarray:
  """Source indices of OpenCV INTER_NEAREST: floor(dst * (1 / (out / in))), clamped."""
  # The double reciprocal is what OpenCV computes; it differs from in/out in rare cases.
  return np.minimum(np.floor(np.arange(n_out) * (1.0 / (n_out / n_in))).astype(np.int64), n_in - 1)


def _bilinear_taps(img: np.ndarray, ty: tuple, tx: tuple) -> np.ndarray:
  """Separable bilinear gather: rows (y0, y1, wy) then columns (x0, x1, wx)."""
  y0, y1, wy = ty
  x0, x1, wx = tx
  # np.take is much faster than fancy indexing; rows are gathered from the
  # (small) source before the float conversion to touch fewer bytes.
  shp = (-1,) + (1,) * (img.ndim - 1)
  rows = np.take(img, y0, axis=0).astype(np.float32)
  rows *= (1 - wy).reshape(shp)
  rows += np.take(img, y1, axis=0).astype(np.float32) * wy.reshape(shp)
  shp = (1, -1) + (1,) * (img.ndim - 2)
  out = np.take(rows, x0, axis=1)
  out *= (1 - wx).reshape(shp)
  out += np.take(rows, x1, axis=1) * wx.reshape(shp)
  return out


def resize_bilinear(img: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
  """float32 bilinear resize (OpenCV INTER_LINEAR semantics, no antialiasing)."""
  return _bilinear_taps(img, _linear_taps(img.shape[0], out_hw[0]), _linear_taps(img.shape[1], out_hw[1]))


def resize_nearest(arr: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
  """Nearest-neighbour resize (OpenCV INTER_NEAREST semantics)."""
  return _take2(arr, _nearest_taps(arr.shape[0], out_hw[0]), _nearest_taps(arr.shape[1], out_hw[1]))


def _take2(arr: np.ndarray, ys: np.ndarray, xs: np.ndarray) -> np.ndarray:
  """arr[ys][:, xs] via np.take (far faster than 2-D fancy indexing)."""
  return np.take(np.take(arr, ys, axis=0), xs, axis=1)


# --------------------------------------------------------------------------- steps

def random_scale(sample: Mapping[str, np.ndarray], rng: np.random.Generator,
                 min_scale: float = 0.5, max_scale: float = 2.0) -> Sample:
  """Rescale by s ~ U[min, max): bilinear image, nearest labels, depth /= s."""
  _check_keys(sample)
  if not 0 <= min_scale <= max_scale:
    raise ValueError(f'bad scale range [{min_scale}, {max_scale}]')
  s = float(min_scale) if min_scale == max_scale else float(rng.uniform(min_scale, max_scale))
  return scale_sample(sample, s)


def scale_sample(sample: Mapping[str, np.ndarray], s: float) -> Sample:
  """Deterministic part of `random_scale`: new size int(H*s) x int(W*s)."""
  out = dict(sample)
  if s == 1.0:
    return out
  h, w = sample['image'].shape[:2]
  new = (int(h * s), int(w * s))
  if min(new) < 1:
    raise ValueError(f'scale {s} makes a {h}x{w} image empty')
  for k, v in sample.items():
    if k == 'image':
      out[k] = resize_bilinear(v, new)  # float32, like the reference's float image
    else:
      out[k] = resize_nearest(v, new)
      if k == 'depth':
        # Depth in metres scales inversely with the zoom; ignore stays 255, missing 0.
        d = out[k]
        out[k] = np.where((d == IGNORE) | (d == 0), d, d / np.float32(s)).astype(np.float32)
  return out


def crop_sample(sample: Mapping[str, np.ndarray], top: int, left: int, size: tuple[int, int]) -> Sample:
  """Crop every field to [top:top+h, left:left+w] (clipped at the image border)."""
  h, w = size
  return {k: v[top:top + h, left:left + w] for k, v in sample.items()}


def random_crop(sample: Mapping[str, np.ndarray], rng: np.random.Generator, size: int | Sequence[int],
                cat_max_ratio: float = 0.75, max_retries: int = 10) -> Sample:
  """Random crop to `size` (smaller images keep their extent; pad later).

  With 'semseg' present and cat_max_ratio < 1, a crop is redrawn (up to
  `max_retries` times, mmseg semantics) until it has >= 2 non-ignore classes and
  the largest one covers < cat_max_ratio of the non-ignore pixels; the last draw
  is used unchecked.
  """
  _check_keys(sample)
  ch, cw = _hw(size)
  h, w = sample['image'].shape[:2]
  max_top, max_left = max(h - ch, 0), max(w - cw, 0)

  def draw() -> tuple[int, int]:
    return int(rng.integers(0, max_top + 1)), int(rng.integers(0, max_left + 1))

  top, left = draw()
  if cat_max_ratio < 1. and 'semseg' in sample:
    seg = sample['semseg']
    for _ in range(max_retries):
      cnt = np.bincount(seg[top:top + ch, left:left + cw].ravel(), minlength=256)[:IGNORE]
      cnt = cnt[cnt > 0]
      if len(cnt) > 1 and cnt.max() / cnt.sum() < cat_max_ratio:
        break
      top, left = draw()
  return crop_sample(sample, top, left, (ch, cw))


def hflip_sample(sample: Mapping[str, np.ndarray]) -> Sample:
  """Mirror every field left-right; valid normals get their x component negated."""
  out = {k: v[:, ::-1].copy() for k, v in sample.items()}
  if 'normals' in out:
    n = out['normals']
    n[..., 0] = np.where(_is_ignored_normal(n), n[..., 0], -n[..., 0])
  return out


def random_hflip(sample: Mapping[str, np.ndarray], rng: np.random.Generator, p: float = 0.5) -> Sample:
  """Horizontal flip with probability p."""
  _check_keys(sample)
  return hflip_sample(sample) if rng.random() < p else dict(sample)


def random_scale_crop_flip(sample: Mapping[str, np.ndarray], rng: np.random.Generator,
                           size: int | Sequence[int], min_scale: float = 0.5, max_scale: float = 2.0,
                           cat_max_ratio: float = 0.75, max_retries: int = 10,
                           flip_p: float = 0.5) -> Sample:
  """`random_scale` -> `random_crop` -> `random_hflip` in one pass, bit-identical.

  Draws the same numbers in the same order from `rng` as the three steps, but
  resamples only the crop window (a 2x upscale of a 500x375 image otherwise
  computes ~3x the pixels that survive the crop) and folds the flip into the
  column taps. This is the default in `train_transforms`.
  """
  _check_keys(sample)
  if not 0 <= min_scale <= max_scale:
    raise ValueError(f'bad scale range [{min_scale}, {max_scale}]')
  s = float(min_scale) if min_scale == max_scale else float(rng.uniform(min_scale, max_scale))
  h, w = sample['image'].shape[:2]
  nh, nw = (h, w) if s == 1.0 else (int(h * s), int(w * s))
  if min(nh, nw) < 1:
    raise ValueError(f'scale {s} makes a {h}x{w} image empty')
  ys, xs = _nearest_taps(h, nh), _nearest_taps(w, nw)
  ch, cw = _hw(size)
  max_top, max_left = max(nh - ch, 0), max(nw - cw, 0)

  def draw() -> tuple[int, int]:
    return int(rng.integers(0, max_top + 1)), int(rng.integers(0, max_left + 1))

  top, left = draw()
  if cat_max_ratio < 1. and 'semseg' in sample:
    seg = sample['semseg']
    for _ in range(max_retries):
      win = _take2(seg, ys[top:top + ch], xs[left:left + cw])
      cnt = np.bincount(win.ravel(), minlength=256)[:IGNORE]
      cnt = cnt[cnt > 0]
      if len(cnt) > 1 and cnt.max() / cnt.sum() < cat_max_ratio:
        break
      top, left = draw()
  flip = rng.random() < flip_p
  rows = slice(top, min(top + ch, nh))
  cols = slice(left, min(left + cw, nw))
  step = -1 if flip else 1
  ys_w, xs_w = ys[rows], xs[cols][::step]
  out = {}
  for k, v in sample.items():
    if k == 'image' and s != 1.0:
      ty = tuple(a[rows] for a in _linear_taps(h, nh))
      tx = tuple(a[cols][::step] for a in _linear_taps(w, nw))
      out[k] = _bilinear_taps(v, ty, tx)
      continue
    a = _take2(v, ys_w, xs_w)
    if k == 'depth' and s != 1.0:
      a = np.where((a == IGNORE) | (a == 0), a, a / np.float32(s)).astype(np.float32)
    if k == 'normals' and flip:
      a[..., 0] = np.where(_is_ignored_normal(a), a[..., 0], -a[..., 0])
    out[k] = a
  return out


# --------------------------------------------------------------------------- colour

def hsv_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """OpenCV 8-bit HSV tables: fixed-point divisors and float32 HSV->RGB factors.

  RGB->HSV uses OpenCV's 12-bit fixed point (sdiv = round(255*2^12/v),
  hdiv = round(180*2^12/(6*diff))). HSV->RGB follows OpenCV's SIMD path: float32
  v * factor(h, s) * 255, truncated; factor (1, 1-s, 1-s*f, 1-s*(1-f)) per
  channel and sector is precomputed per (H, S) with the same float32 operations.
  """
  i = np.arange(1, 256, dtype=np.float64)
  sdiv = np.concatenate([[0], np.rint((255 << 12) / i)]).astype(np.int32)
  hdiv = np.concatenate([[0], np.rint((180 << 12) / (6. * i))]).astype(np.int32)
  f32 = np.float32
  h = np.arange(180, dtype=f32)[:, None] * (f32(6.0) / f32(180))
  s = np.arange(256, dtype=f32)[None, :] * (f32(1.0) / f32(255))
  pre = np.trunc(h)
  frac = h - pre
  sector = np.broadcast_to((pre - f32(6) * np.trunc(pre * (f32(1) / f32(6)))).astype(np.int64), (180, 256))
  one = np.ones((180, 256), f32)
  t0, t1 = one, one * (f32(1) - s)
  t2, t3 = f32(1) - s * frac, f32(1) - s * (f32(1) - frac)
  r = np.choose(sector, [t0, t2, t1, t1, t3, t0])
  g = np.choose(sector, [t3, t0, t0, t2, t1, t1])
  b = np.choose(sector, [t1, t1, t3, t0, t0, t2])
  rgb = np.stack([r, g, b], -1).astype(f32).reshape(-1, 3)  # index h*256 + s
  return sdiv, hdiv, rgb


_SDIV, _HDIV, _RGB_FACTORS = hsv_tables()


def rgb_to_hsv_u8(img: np.ndarray) -> np.ndarray:
  """uint8 RGB -> uint8 HSV, bit-exact with cv2.cvtColor(COLOR_RGB2HSV) (H in [0,180))."""
  # Planar int32 copies: contiguous channel ops are several times faster than strided ones.
  r, g, b = np.moveaxis(img, -1, 0).astype(np.int32)
  v = np.maximum(np.maximum(r, g), b)
  diff = v - np.minimum(np.minimum(r, g), b)
  # Hue sector by which channel is the max (r first, then g, as OpenCV); 0/1
  # integer masks + arithmetic select are several times faster than np.where.
  ir = (v == r).astype(np.int32)
  ig = (v == g).astype(np.int32) * (1 - ir)
  ib = 1 - ir - ig
  hnum = (g - b) * ir + (b - r + 2 * diff) * ig + (r - g + 4 * diff) * ib
  h = (hnum * np.take(_HDIV, diff) + (1 << 11)) >> 12
  h += 180 * (h < 0)
  s = (diff * np.take(_SDIV, v) + (1 << 11)) >> 12
  out = np.empty(img.shape, np.uint8)
  out[..., 0] = h
  out[..., 1] = s
  out[..., 2] = v
  return out


def hsv_to_rgb_u8(hsv: np.ndarray) -> np.ndarray:
  """uint8 HSV (H in [0,180)) -> uint8 RGB, as cv2.cvtColor(COLOR_HSV2RGB)'s SIMD path."""
  idx = np.minimum(hsv[..., 0], 179).astype(np.int32)
  idx *= 256
  idx += hsv[..., 1]
  rgb = np.take(_RGB_FACTORS, idx, axis=0)
  rgb *= hsv[..., 2, None].astype(np.float32) * (np.float32(1.0) / np.float32(255))
  rgb *= np.float32(255)
  return rgb.astype(np.uint8)  # truncation, in [0, 255] by construction


def _affine_u8(x: np.ndarray, alpha: float = 1., beta: float = 0.) -> np.ndarray:
  """mmseg `convert` on uint8: float32 x * alpha + beta, clip, truncate to uint8."""
  # A 256-entry table gives identical values at a fraction of the float passes.
  lut = np.clip(np.arange(256, dtype=np.float32) * np.float32(alpha) + np.float32(beta), 0, 255)
  return np.take(lut.astype(np.uint8), x)


def photometric_distortion(sample: Mapping[str, np.ndarray], rng: np.random.Generator,
                           brightness_delta: float = 32, contrast_range: tuple[float, float] = (0.5, 1.5),
                           saturation_range: tuple[float, float] = (0.5, 1.5),
                           hue_delta: int = 18) -> Sample:
  """mmseg PhotoMetricDistortion: each step with p=0.5, contrast first or last.

  As the FedHCA2 copy: the image is truncated to uint8 first, and it always
  goes through the RGB->HSV->RGB round trip (OpenCV 8-bit semantics, see
  `rgb_to_hsv_u8`), even when neither saturation nor hue is changed; the round
  trip itself shifts colours by <= a few levels.
  """
  out = dict(sample)
  img = np.asarray(sample['image'])
  img = img if img.dtype == np.uint8 else np.clip(img, 0, 255).astype(np.uint8)
  contrast_first = rng.random() < 0.5
  if rng.random() < 0.5:
    img = _affine_u8(img, beta=rng.uniform(-brightness_delta, brightness_delta))
  if contrast_first and rng.random() < 0.5:
    img = _affine_u8(img, alpha=rng.uniform(*contrast_range))
  hsv = rgb_to_hsv_u8(img)
  if rng.random() < 0.5:
    hsv[..., 1] = _affine_u8(hsv[..., 1], alpha=rng.uniform(*saturation_range))
  if rng.random() < 0.5:
    # Integer in [-hue_delta, hue_delta - 1], like random.randint(-18, 17).
    hsv[..., 0] = (hsv[..., 0].astype(np.int32) + int(rng.integers(-hue_delta, hue_delta))) % 180
  img = hsv_to_rgb_u8(hsv)
  if not contrast_first and rng.random() < 0.5:
    img = _affine_u8(img, alpha=rng.uniform(*contrast_range))
  out['image'] = img
  return out


# --------------------------------------------------------------------------- deterministic steps

def normalize(sample: Mapping[str, np.ndarray], mean: np.ndarray = IMAGENET_MEAN,
              std: np.ndarray = IMAGENET_STD) -> Sample:
  """image -> float32 (image / 255 - mean) / std."""
  out = dict(sample)
  x = np.array(sample['image'], np.float32)
  # Two in-place passes instead of three temporaries; equal to the reference up to float rounding.
  x *= (1. / (255. * np.asarray(std, np.float64))).astype(np.float32)
  x -= (np.asarray(mean, np.float64) / np.asarray(std, np.float64)).astype(np.float32)
  out['image'] = x
  return out


def place_centred(canvases: dict[str, np.ndarray], at: tuple, sample: Mapping[str, np.ndarray]
                  ) -> tuple[int, int, int, int]:
  """Write `sample` centred (extra row/col at the bottom/right) into `canvases[key][at]`.

  `canvases['image'][at]` is `[H, W, 3]`; keys the sample lacks are left as
  they are. Returns the box (top, left, height, width) of the sample. Larger
  samples raise: the model needs the exact size.
  """
  th, tw = canvases['image'][at].shape[:2]
  h, w = sample['image'].shape[:2]
  if h > th or w > tw:
    raise ValueError(f'sample of size {h}x{w} is larger than the target size {th}x{tw}; '
                     'crop or resize it first')
  top, left = (th - h) // 2, (tw - w) // 2
  for k, v in sample.items():
    if k in canvases:
      canvases[k][at][top:top + h, left:left + w] = v
  return top, left, h, w


def pad_to_size(sample: Mapping[str, np.ndarray], size: int | Sequence[int]) -> Sample:
  """Centre-pad (extra row/col at the bottom/right) to exactly `size`.

  Fill values: image 0, labels 255, normals 0 and depth 0 (both become ignore in
  `add_ignore_regions`). Larger inputs raise: the model needs the exact size.
  """
  _check_keys(sample)
  th, tw = _hw(size)
  if sample['image'].shape[:2] == (th, tw):
    return dict(sample)
  out = {k: np.full((th, tw) + v.shape[2:], IGNORE if k in _LABEL_KEYS else 0, v.dtype)
         for k, v in sample.items()}
  place_centred(out, (), sample)
  return out


def add_ignore_regions(sample: Mapping[str, np.ndarray]) -> Sample:
  """normals with zero norm -> 255; depth 0 -> 255; parts without part pixels -> all 255."""
  out = dict(sample)
  if 'normals' in sample:
    n = np.asarray(sample['normals'], np.float32)
    zero = (n[..., 0] == 0) & (n[..., 1] == 0) & (n[..., 2] == 0)
    if zero.any():  # copy only when something changes (inputs are never modified)
      n = n.copy()
      n[zero] = IGNORE
    out['normals'] = n
  if 'depth' in sample:
    d = np.asarray(sample['depth'], np.float32)
    out['depth'] = np.where(d == 0, np.float32(IGNORE), d)
  if 'human_parts' in sample:
    hp = sample['human_parts']
    if np.all((hp == 0) | (hp == IGNORE)):
      out['human_parts'] = np.full_like(hp, IGNORE)
  return out


# --------------------------------------------------------------------------- grain wrappers

class RandomScale(grain.transforms.RandomMap):
  """grain RandomMap for `random_scale`."""

  def __init__(self, min_scale: float = 0.5, max_scale: float = 2.0):
    self.min_scale, self.max_scale = min_scale, max_scale

  def random_map(self, element: Sample, rng: np.random.Generator) -> Sample:
    return random_scale(element, rng, self.min_scale, self.max_scale)


class RandomCrop(grain.transforms.RandomMap):
  """grain RandomMap for `random_crop`."""

  def __init__(self, size: int | Sequence[int], cat_max_ratio: float = 0.75, max_retries: int = 10):
    self.size, self.cat_max_ratio, self.max_retries = _hw(size), cat_max_ratio, max_retries

  def random_map(self, element: Sample, rng: np.random.Generator) -> Sample:
    return random_crop(element, rng, self.size, self.cat_max_ratio, self.max_retries)


class RandomHorizontalFlip(grain.transforms.RandomMap):
  """grain RandomMap for `random_hflip`."""

  def __init__(self, p: float = 0.5):
    self.p = p

  def random_map(self, element: Sample, rng: np.random.Generator) -> Sample:
    return random_hflip(element, rng, self.p)


class RandomScaleCropFlip(grain.transforms.RandomMap):
  """grain RandomMap for the fused `random_scale_crop_flip` (default train geometry)."""

  def __init__(self, size: int | Sequence[int], min_scale: float = 0.5, max_scale: float = 2.0,
               cat_max_ratio: float = 0.75, max_retries: int = 10, flip_p: float = 0.5):
    self.kw = dict(size=_hw(size), min_scale=min_scale, max_scale=max_scale,
                   cat_max_ratio=cat_max_ratio, max_retries=max_retries, flip_p=flip_p)

  def random_map(self, element: Sample, rng: np.random.Generator) -> Sample:
    return random_scale_crop_flip(element, rng, **self.kw)


class PhotoMetricDistortion(grain.transforms.RandomMap):
  """grain RandomMap for `photometric_distortion`."""

  def __init__(self, brightness_delta: float = 32, contrast_range=(0.5, 1.5),
               saturation_range=(0.5, 1.5), hue_delta: int = 18):
    self.kw = dict(brightness_delta=brightness_delta, contrast_range=tuple(contrast_range),
                   saturation_range=tuple(saturation_range), hue_delta=hue_delta)

  def random_map(self, element: Sample, rng: np.random.Generator) -> Sample:
    return photometric_distortion(element, rng, **self.kw)


class Normalize(grain.transforms.Map):
  """grain Map for `normalize`."""

  def map(self, element: Sample) -> Sample:
    return normalize(element)


class PadToSize(grain.transforms.Map):
  """grain Map for `pad_to_size`."""

  def __init__(self, size: int | Sequence[int]):
    self.size = _hw(size)

  def map(self, element: Sample) -> Sample:
    return pad_to_size(element, self.size)


class AddIgnoreRegions(grain.transforms.Map):
  """grain Map for `add_ignore_regions`."""

  def map(self, element: Sample) -> Sample:
    return add_ignore_regions(element)


def train_transforms(size: int | Sequence[int], *, min_scale: float = 0.5, max_scale: float = 2.0,
                     cat_max_ratio: float = 0.75, flip_p: float = 0.5, photometric: bool = True,
                     fused: bool = True) -> list[grain.transforms.Transformation]:
  """The paper's training augmentation, in order, for crop `size` (H, W).

  fused=True uses RandomScaleCropFlip (same semantics, faster); False uses the
  three separate steps (each then draws from its own grain random stream).
  """
  if fused:
    ts: list = [RandomScaleCropFlip(size, min_scale, max_scale, cat_max_ratio, flip_p=flip_p)]
  else:
    ts = [RandomScale(min_scale, max_scale), RandomCrop(size, cat_max_ratio), RandomHorizontalFlip(flip_p)]
  if photometric:
    ts.append(PhotoMetricDistortion())
  return ts + [Normalize(), PadToSize(size), AddIgnoreRegions()]


def eval_transforms(size: int | Sequence[int]) -> list[grain.transforms.Transformation]:
  """Evaluation preprocessing: normalise, pad to `size`, ignore regions (no resize)."""
  return [Normalize(), PadToSize(size), AddIgnoreRegions()]


def apply_transforms(sample: Mapping[str, np.ndarray], transforms: Sequence[grain.transforms.Transformation],
                     rng: np.random.Generator | None = None) -> Sample:
  """Apply a transform list eagerly (outside grain), sharing one generator."""
  out = dict(sample)
  for t in transforms:
    if isinstance(t, grain.transforms.RandomMap):
      if rng is None:
        raise ValueError(f'{type(t).__name__} needs an rng')
      out = t.random_map(out, rng)
    elif isinstance(t, grain.transforms.Map):
      out = t.map(out)
    else:
      out = t(out)
  return out
