"""Host-side preprocessing of real classification images (TFDS and ImageFolder readers).

Every image goes through the same steps, on the host, once, when a split is read:

1. decode (PIL) and convert to 8-bit RGB: grayscale, palette, alpha and CMYK
   images become 3 channels (``to_rgb``), as torchvision's ``pil_loader`` does;
2. resize to ``resolution`` x ``resolution`` (``resize_image``):
   - ``resize='crop'`` (default): the shorter side to ``resolution`` with the
     longer side ``int(resolution * long / short)``, then a centre crop with
     offsets ``int(round((size - resolution) / 2))``. These are the sizes and
     offsets of torchvision's ``Resize(R)`` + ``CenterCrop(R)``, which is the
     OpenAI CLIP / task-vectors eval transform;
   - ``resize='squash'``: straight to R x R, ignoring the aspect ratio, as the
     Hugging Face ``ViTImageProcessor`` of ``google/vit-base-patch16-224`` (the
     EMR-Merging 30-task setup) does;
   with PIL's ``bicubic`` (CLIP; default) or ``bilinear`` (HF ViT) filter.
   PIL filters are antialiased when shrinking.

The result stays uint8 ``[n, R, R, 3]`` (4x less host memory and transfer than
float32); ``normalize`` turns it into the network input, on the host or on the
device (it accepts NumPy and JAX arrays), with the constants of the checkpoint
in ``NORMALIZATION``.
"""

from __future__ import annotations

import concurrent.futures
import os
import zlib
from typing import Callable, Sequence

import numpy as np

from fedjax_mtl.errors import ConfigError, check_choice

RESIZE_MODES = ('crop', 'squash')
INTERPOLATIONS = ('bicubic', 'bilinear')
# Per-checkpoint input normalisation, (mean, std) of [0, 1] RGB values:
#   augreg    ImageNet-21k ViTs of "How to train your ViT" (AugReg) and HF
#             google/vit-*: 0.5 / 0.5, i.e. inputs in [-1, 1];
#   clip      OpenAI CLIP (and OpenCLIP ViT-B-32-256) image statistics;
#   imagenet  the torchvision ImageNet-1k statistics (ResNets).
NORMALIZATION = {
    'augreg': ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    'clip': ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
    'imagenet': ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}
MIN_RESOLUTION = 8
# Decoding threads: PIL releases the GIL while it decodes and resizes.
MAX_WORKERS = 32


def _pil():
  try:
    from PIL import Image  # pylint: disable=import-outside-toplevel
  except ImportError as e:  # pillow comes with matplotlib, a base dependency
    raise ConfigError('reading image files needs Pillow: pip install pillow') from e
  return Image


def check_options(resolution, interpolation: str, resize: str) -> int:
  """Validate the preprocessing options; returns the resolution as an int."""
  if isinstance(resolution, bool) or not isinstance(resolution, (int, np.integer)):
    raise ConfigError(f'resolution must be an integer, got {resolution!r}')
  if resolution < MIN_RESOLUTION:
    raise ConfigError(f'resolution must be >= {MIN_RESOLUTION}, got {resolution}')
  check_choice('interpolation', interpolation, INTERPOLATIONS)
  check_choice('resize mode', resize, RESIZE_MODES)
  return int(resolution)


def to_rgb(image):
  """A PIL image as 8-bit RGB (grayscale is repeated into 3 channels, alpha dropped)."""
  if image.mode == 'RGB':
    return image
  if image.mode in ('I', 'I;16', 'I;16B', 'I;16L', 'F'):
    # 16/32-bit integer or float grayscale: map the value range to 0..255
    # (float images in [0, 1] or [0, 255]; integer ones 8- or 16-bit).
    a = np.asarray(image, np.float64)
    peak = float(a.max(initial=0.))
    if image.mode == 'F':
      top = 1. if peak <= 1. else 255.
    else:
      top = 65535. if image.mode.startswith('I;16') or peak > 255. else 255.
    a = np.clip(np.round(a * (255. / top)), 0, 255).astype(np.uint8)
    return _pil().fromarray(a).convert('RGB')  # uint8 2-D -> mode 'L'
  return image.convert('RGB')


def resize_image(image, resolution: int, interpolation: str = 'bicubic',
                 resize: str = 'crop') -> np.ndarray:
  """An RGB PIL image -> uint8 [R, R, 3] (module docstring, step 2)."""
  Image = _pil()
  resample = {'bicubic': Image.Resampling.BICUBIC,
              'bilinear': Image.Resampling.BILINEAR}[interpolation]
  r = resolution
  w, h = image.size
  if resize == 'squash':
    if (w, h) != (r, r):
      image = image.resize((r, r), resample)
    return np.asarray(image, np.uint8)
  if w <= h:
    nw, nh = r, int(r * h / w)
  else:
    nw, nh = int(r * w / h), r
  if (nw, nh) != (w, h):
    image = image.resize((nw, nh), resample)
  top = int(round((nh - r) / 2.))
  left = int(round((nw - r) / 2.))
  return np.asarray(image.crop((left, top, left + r, top + r)), np.uint8)


def open_image(source):
  """Decode encoded image bytes or an image file path into a loaded PIL image."""
  Image = _pil()
  if isinstance(source, (bytes, bytearray, memoryview)):
    import io  # pylint: disable=import-outside-toplevel
    with Image.open(io.BytesIO(bytes(source))) as im:
      im.load()
      return im
  with Image.open(source) as im:
    im.load()
    return im


def preprocess(source, resolution: int, interpolation: str = 'bicubic',
               resize: str = 'crop') -> np.ndarray:
  """Encoded bytes, a path or a PIL image -> uint8 [R, R, 3] RGB."""
  image = source if hasattr(source, 'mode') else open_image(source)
  return resize_image(to_rgb(image), resolution, interpolation, resize)


def num_workers() -> int:
  """Threads used to decode images: the host's cores, at most MAX_WORKERS."""
  return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


def preprocess_into(out: np.ndarray, positions: Sequence[int], sources: Sequence,
                    fn: Callable[[object], np.ndarray],
                    pool: concurrent.futures.Executor | None = None) -> None:
  """`out[positions[i]] = fn(sources[i])` for all i, in `pool` threads when given."""
  if pool is None:
    for p, s in zip(positions, sources):
      out[p] = fn(s)
    return
  for p, image in zip(positions, pool.map(fn, sources)):
    out[p] = image


def subsample(n: int, num: int | None, seed: int, key: str, what: str) -> np.ndarray:
  """Indices into a split of `n` examples: all of them in stored order when `num`

  is None, else `num` distinct ones in random order, drawn from
  ``np.random.default_rng([crc32(key), seed])`` (a different `num` draws a
  different sample, not a prefix; the same arguments give the same sample).
  """
  if num is None:
    return np.arange(n, dtype=np.int64)
  if isinstance(num, bool) or not isinstance(num, (int, np.integer)) or num < 1:
    raise ConfigError(f'num must be a positive integer or None, got {num!r}')
  if num > n:
    raise ConfigError(f'{what} has {n} examples, fewer than num={num}')
  rng = np.random.default_rng([zlib.crc32(key.encode()), int(seed)])
  return rng.permutation(n)[:int(num)].astype(np.int64)


def check_dtype(dtype) -> np.dtype:
  """uint8 or float32 (the output types of the loaders, as ``mini8.load``)."""
  try:
    dtype = np.dtype(dtype)
  except TypeError:
    raise ConfigError(f'image dtype must be uint8 or float32, got {dtype!r}') from None
  check_choice('image dtype', dtype.name, ('uint8', 'float32'))
  return dtype


def as_dtype(images: np.ndarray, dtype: np.dtype) -> np.ndarray:
  """uint8 images as they are, or float32 in [0, 1] (the uint8 image / 255)."""
  return images.astype(np.float32) / np.float32(255.) if dtype == np.float32 else images


def normalize(images, checkpoint: str = 'augreg'):
  """uint8 RGB ``[..., 3]`` (0..255) -> float32 ``(x / 255 - mean) / std``.

  Float inputs are taken to be in [0, 1] already (as mini8's float32 images).
  Works on NumPy arrays and on JAX arrays (also inside ``jit``), so images can
  stay uint8 until they are on the device.
  """
  check_choice('normalization', checkpoint, NORMALIZATION)
  mean, std = (np.asarray(v, np.float32) for v in NORMALIZATION[checkpoint])
  is_int = np.issubdtype(np.dtype(images.dtype), np.integer)
  scale = (1. / 255. if is_int else 1.) / std
  return images.astype(np.float32) * scale.astype(np.float32) - (mean / std).astype(np.float32)
