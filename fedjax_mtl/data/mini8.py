"""mini8: an offline many-task classification benchmark of eight procedural tasks.

A stand-in for the 8-task model-merging benchmark (MaTU spec §7, "mini-8"):
no download, NumPy only, deterministic in (task, split, num, seed, resolution).
Images are RGB [n, R, R, 3] (R = 32 by default), uint8 in 0..255, or float32 in
[0, 1] with ``dtype=np.float32`` (the uint8 image / 255). Labels are int32 in
0..C-1, exactly balanced (counts differ by at most one), in random order.

Tasks (``TASKS`` order; C = number of classes):

================  ==  ==========================================================
task              C   what it is
================  ==  ==========================================================
digits            10  MNIST-like: a digit drawn from a hand-made 5x7 bitmap font,
                      grey on a dark background, with scale, aspect, rotation,
                      stroke-width and position jitter, a stray pen stroke in
                      half of the images, and pixel noise.
digits_clutter    10  SVHN-like: the same font in a random colour on a coloured,
                      textured background, with partly visible neighbouring
                      digits as distractors; the label is the centre digit.
digits_perm       10  the *same images* as ``digits`` (same split, num, seed),
                      with the inverted label mapping 9 - d.
shapes             6  one filled shape (circle, square, triangle, cross, ring,
                      diamond) of random colour, size, position and a small
                      rotation on a random background.
colors             8  the shapes renderer, but the label is the fill hue in one of
                      eight 45-degree bins (red, orange, yellow, green, cyan,
                      blue, purple, pink) under a random illumination tint, with
                      a smaller distractor shape of another hue.
count_dots         6  1 to 6 dots (label = count - 1) on a jittered 4x4 grid, dot
                      size and colour random per image (brighter than the
                      background).
gratings           8  orientation of a Gabor-windowed sinusoidal grating in eight
                      22.5-degree bins; frequency, phase, window and colour random.
texture_freq       5  spatial frequency band (2, 3.2, 5, 7.5, 11 cycles/image) of
                      a sum of 1-3 full-field gratings of random orientation.
================  ==  ==========================================================

Relatedness structure (what task-vector similarity should find):

- ``RELATED_PAIRS``:
  - (digits, digits_clutter): same label factor (the digit, same font) rendered
    differently; features and label semantics transfer.
  - (shapes, colors) and (gratings, texture_freq): same renderer, different label
    factor; the low-level features transfer, the labels do not.
- ``CONFLICTING_PAIRS``: (digits, digits_perm): identical images, inverted
  labels (a permutation without fixed points), so updates of a shared or
  identically initialised classifier disagree. digits_perm also conflicts, less
  directly, with digits_clutter. With separate, independently initialised
  per-task heads a label permutation can be absorbed by the head, so the
  conflict then shows mainly early in training and in the heads.
- count_dots is related to no other task.

Intended groups (e.g. for conflict-group experiments): glyphs {digits,
digits_clutter, digits_perm}, waves {gratings, texture_freq}, objects {shapes,
colors, count_dots}.

Every task has a fixed train and test split drawn from independent streams
(defaults: ``TRAIN_SIZE`` = 1500 and ``TEST_SIZE`` = 500 per task; ``num``
overrides). A different ``num`` draws a different sample, not a prefix. All
tasks are learnable, none trivially: a tiny patch network trained for 300 Adam
steps on 1500 images reaches about 2.5x (shapes) to 7.5x (colors) chance
accuracy (tests/test_mini8.py); jitter, noise and distractors keep accuracy
below 100%. Frequencies are in cycles per image, so texture_freq's top band
needs R >= 32 to stay below the Nyquist limit.
"""

from __future__ import annotations

import zlib

import numpy as np

from fedjax_mtl.errors import ConfigError, check_choice

TASKS = ('digits', 'digits_clutter', 'digits_perm', 'shapes', 'colors', 'count_dots',
         'gratings', 'texture_freq')
SPLITS = ('train', 'test')
TRAIN_SIZE = 1500
TEST_SIZE = 500
RESOLUTION = 32

RELATED_PAIRS = (('digits', 'digits_clutter'), ('shapes', 'colors'),
                 ('gratings', 'texture_freq'))
CONFLICTING_PAIRS = (('digits', 'digits_perm'),)

# task -> (image family, number of classes); tasks of one family share images.
_SPECS = {
    'digits': ('digits', 10),
    'digits_clutter': ('digits_clutter', 10),
    'digits_perm': ('digits', 10),
    'shapes': ('shapes', 6),
    'colors': ('colors', 8),
    'count_dots': ('count_dots', 6),
    'gratings': ('gratings', 8),
    'texture_freq': ('texture_freq', 5),
}
SHAPE_NAMES = ('circle', 'square', 'triangle', 'cross', 'ring', 'diamond')
HUE_NAMES = ('red', 'orange', 'yellow', 'green', 'cyan', 'blue', 'purple', 'pink')
FREQUENCIES = (2., 3.2, 5., 7.5, 11.)  # texture_freq class centres, cycles per image
# Label maps of tasks that relabel another task's images.
_LABEL_MAPS = {'digits_perm': np.arange(9, -1, -1, dtype=np.int32)}

# A hand-made 5x7 bitmap font of the digits 0-9 (rows top to bottom).
_FONT_ROWS = (
    ('.###.', '#...#', '#..##', '#.#.#', '##..#', '#...#', '.###.'),
    ('..#..', '.##..', '..#..', '..#..', '..#..', '..#..', '.###.'),
    ('.###.', '#...#', '....#', '...#.', '..#..', '.#...', '#####'),
    ('#####', '...#.', '..#..', '...#.', '....#', '#...#', '.###.'),
    ('...#.', '..##.', '.#.#.', '#..#.', '#####', '...#.', '...#.'),
    ('#####', '#....', '####.', '....#', '....#', '#...#', '.###.'),
    ('..##.', '.#...', '#....', '####.', '#...#', '#...#', '.###.'),
    ('#####', '....#', '...#.', '..#..', '.#...', '.#...', '.#...'),
    ('.###.', '#...#', '#...#', '.###.', '#...#', '#...#', '.###.'),
    ('.###.', '#...#', '#...#', '.####', '....#', '...#.', '.##..'),
)
FONT = np.array([[[c == '#' for c in row] for row in glyph] for glyph in _FONT_ROWS],
                np.float32)  # [10, 7, 5]


def num_classes(task: str) -> int:
  """Number of classes of `task`."""
  check_choice('mini8 task', task, TASKS)
  return _SPECS[task][1]


def load(task: str, split: str = 'train', num: int | None = None, seed: int = 0, *,
         resolution: int = RESOLUTION, dtype=np.uint8) -> tuple[np.ndarray, np.ndarray]:
  """Images [num, R, R, 3] (uint8, or float32 in [0, 1]) and int32 labels of `task`."""
  check_choice('mini8 task', task, TASKS)
  check_choice('split', split, SPLITS)
  try:
    dtype = np.dtype(dtype)
  except TypeError:
    pass
  check_choice('mini8 dtype', getattr(dtype, 'name', dtype), ('uint8', 'float32'))
  num = (TRAIN_SIZE if split == 'train' else TEST_SIZE) if num is None else int(num)
  if num < 1:
    raise ConfigError(f'mini8 num must be >= 1, got {num}')
  resolution = int(resolution)
  if resolution < 16:
    raise ConfigError(f'mini8 resolution must be >= 16, got {resolution}')
  family, c = _SPECS[task]
  rng = np.random.default_rng([zlib.crc32(f'mini8/{family}/{split}'.encode()), int(seed)])
  labels = rng.permutation(np.arange(num) % c).astype(np.int32)
  image = _RENDERERS[family](rng, labels, resolution)
  image = np.round(np.clip(image, 0., 1.) * 255.).astype(np.uint8)
  if task in _LABEL_MAPS:
    labels = _LABEL_MAPS[task][labels]
  if dtype == np.float32:
    image = image.astype(np.float32) / 255.
  return image, labels


# ----------------------------------------------------------------------------
# Rendering helpers. Coordinates are in [-1, 1] across the image (x right,
# y down); every array is vectorised over the n images.


def _grid(res: int) -> tuple[np.ndarray, np.ndarray]:
  c = ((np.arange(res, dtype=np.float32) + .5) / res) * 2. - 1.
  yy, xx = np.meshgrid(c, c, indexing='ij')
  return yy[None], xx[None]  # [1, R, R]


def _col(a) -> np.ndarray:
  """[n] -> [n, 1, 1] for broadcasting against [n, R, R]."""
  return np.asarray(a, np.float32)[:, None, None]


def _local(yy, xx, cy, cx, angle, sy, sx):
  """Pixel coordinates in each object's frame: centred, rotated by `angle`, scaled."""
  dx, dy = xx - _col(cx), yy - _col(cy)
  ca, sa = _col(np.cos(angle)), _col(np.sin(angle))
  return (-sa * dx + ca * dy) / _col(sy), (ca * dx + sa * dy) / _col(sx)  # v, u


def _hsv_to_rgb(h, s, v) -> np.ndarray:
  """Vectorised HSV (h in [0, 1)) -> RGB in [0, 1], shape [..., 3]."""
  h6 = (np.asarray(h) % 1.) * 6.
  k = (np.array([5., 3., 1.]) + h6[..., None]) % 6.
  return v[..., None] - v[..., None] * s[..., None] * np.clip(np.minimum(k, 4. - k), 0., 1.)


def _contrasting_colours(rng, n: int, min_gap: float = .3,
                         brighter: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """Random foreground and background RGB colours with a luminance gap >= `min_gap`

  (foreground always the brighter one when `brighter`).
  """
  bg = rng.uniform(0., 1., (n, 3))
  fg = rng.uniform(0., 1., (n, 3))
  lum = np.array([.299, .587, .114])
  gap = (fg - bg) @ lum
  if brighter:
    fg, bg = np.where((gap >= 0)[:, None], fg, bg), np.where((gap >= 0)[:, None], bg, fg)
    gap = np.abs(gap)
  want = np.where(gap >= 0, 1., -1.) * np.maximum(np.abs(gap), min_gap)
  fg = np.clip(fg + (want - gap)[:, None], 0., 1.)
  # Clipping may shrink the gap again; push the background the other way.
  gap = (fg - bg) @ lum
  bg = np.clip(bg - (np.sign(want) * np.maximum(min_gap - np.abs(gap), 0.))[:, None], 0., 1.)
  return fg.astype(np.float32), bg.astype(np.float32)


def _blend(mask, fg, bg) -> np.ndarray:
  """Alpha-composite colour `fg` ([n, 3] or [n, R, R, 3]) over `bg` with mask [n, R, R]."""
  fg, bg = np.asarray(fg, np.float32), np.asarray(bg, np.float32)
  if fg.ndim == 2:
    fg = fg[:, None, None]
  if bg.ndim == 2:
    bg = bg[:, None, None]
  m = np.asarray(mask, np.float32)[..., None]
  return bg + m * (fg - bg)


def _noise(rng, image, sigma, grey: bool = False) -> np.ndarray:
  """Add Gaussian pixel noise (the same in all channels when `grey`)."""
  shape = image.shape[:-1] + (1,) if grey else image.shape
  return image + rng.standard_normal(shape, dtype=np.float32) * np.float32(sigma)


def _smooth_field(rng, n: int, res: int, yy, xx) -> np.ndarray:
  """A random low-frequency scalar field in about [-1, 1] per image: [n, R, R]."""
  out = np.zeros((n, res, res), np.float32)
  for _ in range(3):
    theta = rng.uniform(0., np.pi, n)
    f = rng.uniform(.3, 1.5, n)
    phase = rng.uniform(0., 2 * np.pi, n)
    out += np.cos(np.pi * _col(f) * (xx * _col(np.cos(theta)) + yy * _col(np.sin(theta)))
                  + _col(phase)) / 3.
  return out


# ----------------------------------------------------------------------------
# Glyphs


def _glyph_mask(rng, digits, yy, xx, cy, cx, height, aspect, angle) -> np.ndarray:
  """Soft mask [n, R, R] of the 5x7 font glyphs `digits` placed per image."""
  n = len(digits)
  width = height * 5. / 7. * aspect
  v, u = _local(yy, xx, cy, cx, angle, height / 2., width / 2.)
  # Font-cell coordinates (7 rows x 5 columns), sampled bilinearly with zero padding.
  gy = (v + 1.) * 3.5 - .5
  gx = (u + 1.) * 2.5 - .5
  padded = np.pad(FONT, ((0, 0), (1, 1), (1, 1))).reshape(10, 63)[digits]  # [n, 9 * 7]
  y0 = np.floor(gy)
  x0 = np.floor(gx)
  fy, fx = gy - y0, gx - x0
  # Flat index of (y0, x0) in the padded glyph; out-of-range cells are masked below.
  idx = (np.clip(y0 + 1, 0, 7) * 7 + np.clip(x0 + 1, 0, 5)).astype(np.int32).reshape(n, -1)

  def tap(offset):
    return np.take_along_axis(padded, idx + offset, axis=1).reshape(gy.shape)

  inside = (gy > -1.) & (gy < 7.) & (gx > -1.) & (gx < 5.)
  val = ((1 - fy) * ((1 - fx) * tap(0) + fx * tap(1)) + fy * ((1 - fx) * tap(7) + fx * tap(8)))
  val = np.where(inside, val, 0.)
  # Stroke width: a random threshold on the interpolated bitmap.
  thr = _col(rng.uniform(.3, .55, n))
  return np.clip((val - thr) * 4. + .5, 0., 1.).astype(np.float32)


def _segment_mask(yy, xx, p0, p1, width_px, res) -> np.ndarray:
  """Soft mask [n, R, R] of line segments from points p0 to p1 ([n, 2] as (y, x))."""
  dy, dx = _col(p1[:, 0] - p0[:, 0]), _col(p1[:, 1] - p0[:, 1])
  ry, rx = yy - _col(p0[:, 0]), xx - _col(p0[:, 1])
  t = np.clip((ry * dy + rx * dx) / (dy * dy + dx * dx + 1e-6), 0., 1.)
  dist = np.sqrt((ry - t * dy) ** 2 + (rx - t * dx) ** 2) * np.float32(res / 2.)
  return np.clip(_col(width_px) / 2. - dist + .5, 0., 1.)


def _digits(rng, labels, res):
  n = len(labels)
  yy, xx = _grid(res)
  height = rng.uniform(1.0, 1.5, n)
  mask = _glyph_mask(rng, labels, yy, xx, rng.uniform(-.25, .25, n), rng.uniform(-.3, .3, n),
                     height, rng.uniform(.8, 1.25, n), rng.uniform(-.25, .25, n))
  # A stray pen stroke across half of the images.
  p0 = rng.uniform(-1., 1., (n, 2))
  p1 = p0 + rng.normal(0., .7, (n, 2))
  stroke = _segment_mask(yy, xx, p0, p1, rng.uniform(1., 2., n), res)
  mask = np.maximum(mask, stroke * _col(rng.uniform(size=n) < .5))
  bg = _col(rng.uniform(0., .3, n))
  fg = _col(rng.uniform(.6, 1., n))
  grey = mask * fg + (1. - mask) * bg
  image = np.repeat(grey[..., None], 3, axis=-1)
  return _noise(rng, image, .12, grey=True)


def _digits_clutter(rng, labels, res):
  n = len(labels)
  yy, xx = _grid(res)
  fg, bg = _contrasting_colours(rng, n, .4)
  bg2 = np.clip(bg + rng.uniform(-.15, .15, (n, 3)), 0., 1.)
  t = (_smooth_field(rng, n, res, yy, xx) + 1.) / 2.
  image = _blend(t, bg2, bg)
  height = rng.uniform(1.1, 1.4, n)
  aspect = rng.uniform(.85, 1.15, n)
  angle = rng.uniform(-.15, .15, n)
  cy = rng.uniform(-.1, .1, n)
  cx = rng.uniform(-.1, .1, n)
  mask = _glyph_mask(rng, labels, yy, xx, cy, cx, height, aspect, angle)
  pitch = height * 5. / 7. * aspect * rng.uniform(1.3, 1.6, n)
  for side in (-1., 1.):
    # Neighbouring digits of the same house number, cut by the image border.
    present = rng.uniform(size=n) < .5
    other = rng.integers(0, 10, n)
    m = _glyph_mask(rng, other, yy, xx, cy, cx + side * pitch, height, aspect, angle)
    mask = np.maximum(mask, m * _col(present))
  fg_img = np.clip(fg[:, None, None] + .1 * _smooth_field(rng, n, res, yy, xx)[..., None], 0, 1)
  image = _blend(mask, fg_img, image)
  return _noise(rng, image, .1)


# ----------------------------------------------------------------------------
# Shapes


def _shape_mask(shape, v, u, radius_px) -> np.ndarray:
  """Soft mask of shape ids [n] in object coordinates (v, u); radius in pixels [n]."""
  r = np.sqrt(u * u + v * v)
  au, av = np.abs(u), np.abs(v)
  # Approximate signed distances (positive inside), in object units.
  sdf = np.stack([
      1. - r,                                              # circle
      .82 - np.maximum(au, av),                            # square
      np.minimum(.7 - v, (v + .9) * .45 - au * .9),          # triangle (apex up)
      np.maximum(np.minimum(.3 - au, .95 - av), np.minimum(.3 - av, .95 - au)),  # cross
      np.minimum(r - .5, 1. - r),                          # ring
      (1.05 - au - av) * .7071,                            # diamond
  ], 0)
  d = np.take_along_axis(sdf, np.asarray(shape)[None, :, None, None], 0)[0]
  return np.clip(d * _col(radius_px) + .5, 0., 1.).astype(np.float32)


def _place_shape(rng, shape, yy, xx, res, rmin, rmax) -> np.ndarray:
  """Soft masks of `shape` ids at a random radius in [rmin, rmax], position and tilt."""
  n = len(shape)
  radius = rng.uniform(rmin, rmax, n)
  slack = np.maximum(1. - radius, 0.)
  cy = rng.uniform(-1., 1., n) * slack
  cx = rng.uniform(-1., 1., n) * slack
  angle = rng.uniform(-.35, .35, n)
  v, u = _local(yy, xx, cy, cx, angle, radius, radius)
  return _shape_mask(shape, v, u, radius * res / 2.)


def _shapes(rng, labels, res):
  n = len(labels)
  yy, xx = _grid(res)
  fg, bg = _contrasting_colours(rng, n, .35)
  bg2 = np.clip(bg + rng.uniform(-.1, .1, (n, 3)), 0., 1.)
  image = _blend((_smooth_field(rng, n, res, yy, xx) + 1.) / 2., bg2, bg)
  mask = _place_shape(rng, labels, yy, xx, res, .45, .8)
  image = _blend(mask, fg, image)
  return _noise(rng, image, .08)


def _colors(rng, labels, res):
  n = len(labels)
  yy, xx = _grid(res)
  grey = rng.uniform(.15, .85, n)
  bg = _hsv_to_rgb(rng.uniform(0., 1., n), rng.uniform(0., .2, n), grey)
  image = np.broadcast_to(bg[:, None, None], (n, res, res, 3)).astype(np.float32)
  # A smaller distractor of another hue first, so the main shape covers it.
  dist_hue = (labels + rng.integers(1, 8, n) + rng.uniform(-.3, .3, n)) / 8.
  dist = _hsv_to_rgb(dist_hue, rng.uniform(.5, 1., n), rng.uniform(.5, 1., n))
  dmask = _place_shape(rng, rng.integers(0, 6, n), yy, xx, res, .15, .3)
  image = _blend(dmask * _col(rng.uniform(size=n) < .6), dist, image)
  hue = (labels + rng.uniform(-.27, .27, n)) / 8.
  fg = _hsv_to_rgb(hue, rng.uniform(.55, 1., n), rng.uniform(.55, 1., n))
  mask = _place_shape(rng, rng.integers(0, 6, n), yy, xx, res, .4, .75)
  image = _blend(mask, fg, image)
  tint = rng.uniform(.85, 1.15, (n, 1, 1, 3)).astype(np.float32)  # illumination colour
  return _noise(rng, image * tint, .08)


# ----------------------------------------------------------------------------
# Dots


def _count_dots(rng, labels, res):
  n = len(labels)
  count = labels + 1
  yy, xx = _grid(res)
  fg, bg = _contrasting_colours(rng, n, .4, brighter=True)
  bg2 = np.clip(bg + rng.uniform(-.1, .1, (n, 3)), 0., 1.)
  image = _blend((_smooth_field(rng, n, res, yy, xx) + 1.) / 2., bg2, bg)
  # Choose `count` of the 16 cells of a 4x4 grid per image, without replacement.
  chosen = np.argsort(np.argsort(rng.uniform(size=(n, 16)), axis=1), axis=1) < count[:, None]
  cell = .5  # cell size in [-1, 1] coordinates
  radius = rng.uniform(.13, .16, n).astype(np.float32)  # about 2.1-2.6 px at R = 32
  mask = np.zeros((n, res, res), np.float32)
  for k in range(16):
    jit = np.maximum(cell / 2. - radius - .02, 0.)
    cy = -.75 + cell * (k // 4) + rng.uniform(-1., 1., n) * jit
    cx = -.75 + cell * (k % 4) + rng.uniform(-1., 1., n) * jit
    d = _col(radius) - np.sqrt((yy - _col(cy)) ** 2 + (xx - _col(cx)) ** 2)
    dot = np.clip(d * np.float32(res / 2.) + np.float32(.5), 0., 1.) * _col(chosen[:, k])
    np.maximum(mask, dot, out=mask)
  image = _blend(mask, fg, image)
  return _noise(rng, image, .06)


# ----------------------------------------------------------------------------
# Gratings


def _grating(yy, xx, theta, freq, phase) -> np.ndarray:
  """cos grating of `freq` cycles per image along direction `theta`: [n, R, R]."""
  proj = xx * _col(np.cos(theta)) + yy * _col(np.sin(theta))
  return np.cos(np.pi * _col(freq) * proj + _col(phase)).astype(np.float32)


def _colourise(rng, pattern, n) -> np.ndarray:
  """Map a pattern in about [-1, 1] to RGB along a random colour axis around a random mean."""
  mean = rng.uniform(.3, .7, (n, 3))
  axis = rng.normal(0., 1., (n, 3))
  axis /= np.linalg.norm(axis, axis=1, keepdims=True)
  axis = np.abs(axis) * np.where(rng.uniform(size=(n, 1)) < .5, 1., -1.)  # mostly luminance
  contrast = rng.uniform(.2, .4, (n, 1))
  return (mean[:, None, None] + pattern[..., None] * (axis * contrast)[:, None, None]
          ).astype(np.float32)


def _gratings(rng, labels, res):
  n = len(labels)
  yy, xx = _grid(res)
  theta = (labels + rng.uniform(-.4, .4, n)) * np.pi / 8.
  g = _grating(yy, xx, theta, rng.uniform(2., 6., n), rng.uniform(0., 2 * np.pi, n))
  sigma = rng.uniform(.4, .9, n)
  cy, cx = rng.uniform(-.3, .3, n), rng.uniform(-.3, .3, n)
  env = np.exp(-((yy - _col(cy)) ** 2 + (xx - _col(cx)) ** 2) / (2 * _col(sigma) ** 2))
  return _noise(rng, _colourise(rng, g * env, n), .15)


def _texture_freq(rng, labels, res):
  n = len(labels)
  yy, xx = _grid(res)
  f = np.asarray(FREQUENCIES)[labels] * rng.uniform(.85, 1.15, n)
  pattern = np.zeros((n, res, res), np.float32)
  num = rng.integers(1, 4, n)
  for j in range(3):
    g = _grating(yy, xx, rng.uniform(0., np.pi, n), f * rng.uniform(.95, 1.05, n),
                 rng.uniform(0., 2 * np.pi, n))
    pattern += g * _col(j < num) * _col(rng.uniform(.5, 1., n))
  pattern /= _col(np.sqrt(num))
  return _noise(rng, _colourise(rng, pattern, n), .15)


_RENDERERS = {
    'digits': _digits,
    'digits_clutter': _digits_clutter,
    'shapes': _shapes,
    'colors': _colors,
    'count_dots': _count_dots,
    'gratings': _gratings,
    'texture_freq': _texture_freq,
}
