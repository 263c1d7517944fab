"""Built-in synthetic multi-task benchmark: procedurally generated scenes.

Two domains mirror the real datasets' label spaces:
- ``pascal``: outdoor-like scenes of ellipsoidal objects of 20 classes (class 15,
  "person", has six parts) over a sky/ground background; tasks semseg (21 classes),
  human_parts (7), sal, normals, edge.
- ``nyud``: indoor-like rooms (wall, floor) with box furniture and round objects
  of 38 more classes; tasks semseg (40), depth (metres), normals, edge.

Every label of an image comes from one scene rendered with a z-buffer: the
visible object decides semseg/parts/saliency, the visible surface gives depth
and normals (ellipsoids and planes), and edges sit where the visible instance
changes (semantic and depth discontinuities). The image is shaded from the
same normals, so tasks correlate the way real ones do. Generation is vectorised
over images and deterministic in (domain, split, seed, version).

Versions (`data.synthetic_version`): 1, the default, draws up to 6 small objects
of random class colours per scene, every object salient, one light. 2
(`configs/hca2.py:bench`) draws fewer objects (PASCAL 1-3, NYUD 1-4) whose apparent
size falls with distance (perspective), each class with its own colour (hues
spread by the golden ratio, three brightness levels) and stripe texture (4
orientations x 5 frequencies), so that classes are told apart by appearance as
real ones are; every surface carries a random bump field (its normals tilt, as
its shading shows), the light direction changes from scene to scene (shading no
longer gives the normals by itself), only the nearest object is salient, and the
pixel noise is stronger (sigma 14 instead of 8).

3 (the default config) keeps version 2's appearance and makes every task need
what the segmentation task learns, the class, as real tasks do: each class has a
physical size (the apparent size is size / distance, so depth needs the class), a
surface shape (convex, concave, a vertical cylinder or a plane tilted its own way:
the normals need the class, since a concave surface under one light shades as a
convex one under the opposite light), and half of the object classes are the
salient kind (the salient object is the nearest one of a salient class; every
scene has one). Thin painted strokes over each scene, not boundaries of anything,
make edge detection tell object boundaries from other intensity steps. NYUD's wall
and floor carry tiles of one physical size, so their apparent size gives the
distance. Scenes hold more and nearer objects (PASCAL 2-4, NYUD 2-5; a size-1 object
half the image height at the nearest distance) and more people (a PASCAL object is
one with probability 0.35, not 0.25). NYUD's boxes are the plane-shaped classes
(version 2: any object with probability 0.6).

4 (`:bench`) draws version 3's scenes, label for label, and
paints three patches over every surface of each (not PASCAL's sky): ellipses up to
0.3 image heights across, each with one object class's colour and another's stripes,
shaded as the surface beneath. They are paint, not objects: their outlines are
intensity steps that are not edges, they hide an object's colour where they cross
its boundary, and they change the albedo that the shading of the normals is read
from, so edges and normals, too, need to know what the objects look like.
"""

from __future__ import annotations

import functools
import zlib

import numpy as np

from fedjax_mtl import hostmem
from fedjax_mtl.errors import check_choice
from fedjax_mtl.tasks import IGNORE

DOMAINS = ('pascal', 'nyud')
PERSON = 15  # PASCAL VOC class id of "person"
_MAX_OBJECTS = 6
_MAX_OBJECTS_V2 = {'pascal': 3, 'nyud': 4}
# Version 2's and 3's scene statistics: objects per scene (min, max), the chance that
# a PASCAL object is a person, the apparent size (image heights) of a size-1 object
# at the nearest distance.
_V2 = {'objects': {'pascal': (1, 3), 'nyud': (1, 4)}, 'person': 0.25, 'near_size': 0.4}
_V3 = {'objects': {'pascal': (2, 4), 'nyud': (2, 5)}, 'person': 0.35, 'near_size': 0.5}
_TILE = 0.5  # version 3: NYUD's wall and floor tiles, metres
_BUMPS = 4  # version 2: sinusoids of each scene's bump field
_STROKES = 5  # version 3: painted strokes per scene
_DECALS = 3  # version 4: painted patches per scene
VERSIONS = (1, 2, 3, 4)
VERSION = 1  # the scenes `generate` draws by default (`data.synthetic_version`)


def _rng(domain: str, split: str, seed: int) -> np.random.Generator:
  return np.random.default_rng([zlib.crc32(f'{domain}/{split}'.encode()), seed])


def _palette(domain: str, num_classes: int) -> np.ndarray:
  # A fixed per-domain colour per class; domains differ in colour statistics.
  rng = np.random.default_rng(zlib.crc32(f'palette/{domain}'.encode()))
  pal = rng.uniform(40, 215, size=(num_classes, 3))
  if domain == 'nyud':
    pal = 0.6 * pal + np.array([60., 40., 20.])  # warmer, lower-contrast indoor light
  return pal


def _ellipsoid(yy, xx, cy, cx, ry, rx):
  """Normalised ellipse coordinates, inside mask and surface height (0..1)."""
  u = (xx - cx[:, None, None]) / rx[:, None, None]
  v = (yy - cy[:, None, None]) / ry[:, None, None]
  r2 = u * u + v * v
  inside = r2 < 1.
  h = np.sqrt(np.clip(1. - r2, 0., 1.))
  return u, v, inside, h


def generate(domain: str, split: str, num_images: int, resolution=(64, 64),
             seed: int = 0, workers: int | None = None,
             version: int = VERSION) -> dict[str, np.ndarray]:
  """Render `num_images` scenes of `domain`; returns image + all task labels.

  Returns uint8 'image' [n,H,W,3] and labels in the real datasets' formats:
  'semseg' uint8, 'human_parts' uint8 (pascal), 'sal' uint8 (pascal),
  'normals' float32 [n,H,W,3], 'edge' uint8, 'depth' float32 metres (nyud).

  Every random number is drawn first, in one order; the scenes are then rendered
  in `workers` threads over slices of the images (default: `hostmem.host_cores()`; NumPy
  releases the GIL in its array loops), so the arrays do not depend on `workers`.
  """
  check_choice('synthetic domain', domain, DOMAINS)
  check_choice('split', split, ('train', 'test'))
  check_choice('synthetic version', version, VERSIONS)
  n = int(num_images)
  H, W = int(resolution[0]), int(resolution[1])
  draw = {1: _draw, 2: _draw_v2, 3: _draw_v3, 4: _draw_v4}[version]
  draws = draw(domain, _rng(domain, split, seed), n, H, W)
  render = functools.partial(_render, version=version)
  workers = max(1, min(int(workers or hostmem.host_cores()), n // 16 or 1))
  if workers == 1:
    return render(domain, draws, H, W)
  import concurrent.futures
  slices = [slice(a[0], a[-1] + 1) for a in np.array_split(np.arange(n), workers)]
  with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix='synthetic') as pool:
    parts = list(pool.map(
        lambda s: render(domain, {k: v[s] for k, v in draws.items()}, H, W), slices))
  return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _draw(domain: str, rng: np.random.Generator, n: int, H: int, W: int) -> dict:
  """Every random number of `n` scenes, per image (leading axis n), in the order
  the renderer has always drawn them (the data is the same as before the split)."""
  d = {}
  if domain == 'pascal':
    d['horizon'] = rng.uniform(0.45, 0.75, size=(n, 1, 1))
    d['n_obj'] = rng.integers(1, _MAX_OBJECTS + 1, size=n)
    obj_classes = rng.integers(1, 21, size=(n, _MAX_OBJECTS))
    # Make people common enough that the parts task has data.
    d['obj_classes'] = np.where(rng.uniform(size=(n, _MAX_OBJECTS)) < 0.25, PERSON,
                                obj_classes)
  else:
    d['floor_line'] = rng.uniform(0.5, 0.7, size=(n, 1, 1))
    d['wall_dist'] = rng.uniform(3., 7., size=(n, 1, 1))
    d['n_obj'] = rng.integers(2, _MAX_OBJECTS + 1, size=n)
    d['obj_classes'] = rng.integers(2, 40, size=(n, _MAX_OBJECTS))
  for j in range(_MAX_OBJECTS):
    d[f'cy{j}'] = rng.uniform(0.2, 0.85, n)
    d[f'cx{j}'] = rng.uniform(0.1, 0.9, n)
    d[f'ry{j}'] = rng.uniform(0.08, 0.3, n)
    d[f'rx{j}'] = rng.uniform(0.06, 0.25, n)
    d[f'z0{j}'] = rng.uniform(1.5, 8. if domain == 'nyud' else 25., n)
    d[f'box{j}'] = rng.uniform(size=n)  # drawn in both domains
  d['tex'] = rng.normal(0., 8., size=(n, H, W, 1))
  return d


def _draw_v2(domain: str, rng: np.random.Generator, n: int, H: int, W: int,
             classes: dict | None = None, params: dict = _V2) -> dict:
  """Every random number of `n` version-2 scenes (`_draw`'s layout): fewer objects
  (PASCAL 1-3, NYUD 1-4) whose apparent size falls with their distance
  (perspective: size ~ 1 / z0), each object's texture phase, and each scene's light
  direction. `classes` (version 3, `_classes_v3`): each class's physical size scales
  its apparent size (version 2: 1 for every class), and the first object of every
  scene is of a salient class (PASCAL: a person, as often as in version 2, or
  another). `params`: the scene statistics (`_V2`, `_V3`)."""
  d = {}
  lo, hi = params['objects'][domain]
  if domain == 'pascal':
    d['horizon'] = rng.uniform(0.45, 0.7, size=(n, 1, 1))
    d['n_obj'] = rng.integers(lo, hi + 1, size=n)
    obj_classes = rng.integers(1, 21, size=(n, hi))
    d['obj_classes'] = np.where(rng.uniform(size=obj_classes.shape) < params['person'],
                                PERSON, obj_classes)
  else:
    d['floor_line'] = rng.uniform(0.55, 0.72, size=(n, 1, 1))
    d['wall_dist'] = rng.uniform(3., 6., size=(n, 1, 1))
    d['n_obj'] = rng.integers(lo, hi + 1, size=n)
    d['obj_classes'] = rng.integers(2, 40, size=(n, hi))
  if classes is not None:  # (a person stays one: people stay as common as in version 2)
    kinds = np.flatnonzero(classes['salient'])
    first = kinds[rng.integers(0, len(kinds), size=n)]
    keep = (d['obj_classes'][:, 0] == PERSON) & (domain == 'pascal')
    d['obj_classes'][:, 0] = np.where(keep, PERSON, first)
  size = None if classes is None else classes['size']
  # Distances: PASCAL 3-9 m, NYUD 1.5-4.5 m (in front of the 3-6 m wall); the size
  # at the nearest distance is about `near_size` (0.4) of the image height.
  z_min, z_max = (3., 9.) if domain == 'pascal' else (1.5, 4.5)
  near = params['near_size'] * z_min
  for j in range(hi):
    d[f'cy{j}'] = rng.uniform(0.3, 0.75, n)
    d[f'cx{j}'] = rng.uniform(0.15, 0.85, n)
    z0 = rng.uniform(z_min, z_max, n)
    d[f'z0{j}'] = z0
    s = 1. if size is None else size[d['obj_classes'][:, j]]
    d[f'ry{j}'] = np.minimum(rng.uniform(0.85, 1.15, n) * near / z0 * s, 0.5)
    d[f'rx{j}'] = np.minimum(rng.uniform(0.6, 1.0, n) * near / z0 * s, 0.4)
    d[f'box{j}'] = rng.uniform(size=n)
    d[f'phase{j}'] = rng.uniform(0., 2. * np.pi, n)
  d['light'] = np.stack([rng.uniform(-0.6, 0.6, n), rng.uniform(-0.2, 0.8, n),
                         rng.uniform(0.5, 1., n)], -1)
  # Bumps on every surface: 4 sinusoids of 2-6 cycles per image, each tilting the
  # normals by up to atan(0.4) (about 22 degrees).
  d['bump_freq'] = rng.uniform(2., 6., size=(n, _BUMPS)) * np.exp(
      1j * rng.uniform(0., 2. * np.pi, size=(n, _BUMPS)))
  d['bump_phase'] = rng.uniform(0., 2. * np.pi, size=(n, _BUMPS))
  d['bump_slope'] = rng.uniform(0., 0.4, size=(n, _BUMPS))
  d['tex'] = rng.normal(0., 14., size=(n, H, W, 1))
  return d


def _object_ids(domain: str) -> tuple[int, int]:
  """(first object class id, number of classes): PASCAL's 0 is the background, NYUD's
  0 and 1 the wall and the floor."""
  return (1, 21) if domain == 'pascal' else (2, 40)


def _stripe_gain(angle, freq, phase, yy, xx):
  """The brightness factor 1 + 0.4 cos(2 pi freq (x cos(angle) + y sin(angle)) + phase)
  of a class's stripe texture (`_stripes`) at the pixels (yy, xx)."""
  coord = xx * np.cos(angle) + yy * np.sin(angle)
  return 1. + 0.4 * np.cos(2. * np.pi * freq * coord + phase)


def _classes_v3(domain: str) -> dict[str, np.ndarray]:
  """Version 3's attributes of each class (arrays over the domain's class ids, fixed
  per domain): `shape` 0 convex ellipsoid, 1 concave dish, 2 vertical cylinder,
  3 plane tilted towards `tilt` (radians in the image plane; NYUD's boxes); `size`
  the physical size (0.55-1.45, evenly spread); `salient` for half of the object
  classes. Background classes (PASCAL 0; NYUD wall 0 and floor 1) are none of
  these; PASCAL's person is a convex, salient, size-1 object (its parts' geometry)."""
  first, num_classes = _object_ids(domain)
  rng = np.random.default_rng(zlib.crc32(f'classes/{domain}'.encode()))
  objects = np.arange(first, num_classes)
  k = len(objects)
  shape = np.zeros(num_classes, np.int32)
  shape[objects] = rng.permutation(np.arange(k) % 4)
  size = np.ones(num_classes)
  size[objects] = rng.permutation(np.linspace(0.55, 1.45, k))
  salient = np.zeros(num_classes, bool)
  salient[objects] = rng.permutation(np.arange(k) % 2 == 0)
  tilt = np.zeros(num_classes)
  tilt[objects] = rng.permutation(np.arange(k) % 8) * np.pi / 4 + np.pi / 8
  if domain == 'pascal':
    shape[PERSON], size[PERSON], salient[PERSON] = 0, 1., True
  return {'shape': shape, 'size': size, 'salient': salient, 'tilt': tilt}


def _draw_v3(domain: str, rng: np.random.Generator, n: int, H: int, W: int) -> dict:
  """Every random number of `n` version-3 scenes: version 2's, with the class sizes
  and salient first objects of `_classes_v3`, then `_STROKES` painted strokes per
  scene (end points, half-width in pixels, grey level)."""
  d = _draw_v2(domain, rng, n, H, W, classes=_classes_v3(domain), params=_V3)
  d['stroke_ends'] = rng.uniform(0.05, 0.95, size=(n, _STROKES, 4))
  d['stroke_width'] = rng.uniform(0.5, 1., size=(n, _STROKES))
  d['stroke_level'] = rng.choice([25., 235.], size=(n, _STROKES))
  return d


def _draw_v4(domain: str, rng: np.random.Generator, n: int, H: int, W: int) -> dict:
  """Every random number of `n` version-4 scenes: version 3's (the same scenes), then
  `_DECALS` painted patches per scene: ellipses (centre, radii in image heights) each
  painted with one object class's colour and another's stripes (`decal_colour`,
  `decal_stripes`: class ids) at its own texture phase."""
  d = _draw_v3(domain, rng, n, H, W)
  first, num_classes = _object_ids(domain)
  shape = (n, _DECALS)
  d['decal_centre'] = rng.uniform(0.1, 0.9, size=shape + (2,))
  d['decal_radii'] = rng.uniform(0.04, 0.15, size=shape + (2,))
  d['decal_colour'] = rng.integers(first, num_classes, size=shape)
  d['decal_stripes'] = rng.integers(first, num_classes, size=shape)
  d['decal_phase'] = rng.uniform(0., 2. * np.pi, size=shape)
  return d


def _decals(d: dict, yy: np.ndarray, xx: np.ndarray, pal: np.ndarray, angle: np.ndarray,
            freq: np.ndarray, base: np.ndarray, surface: np.ndarray) -> np.ndarray:
  """Version 4: `base` (the albedo [n, H, W, 3]) with each scene's decals painted over
  it where `surface` [n, H, W] (the later decal over the earlier): flat paint, not
  objects, so no label changes; the surface's shading still falls on them."""
  e = lambda a: a[:, None, None]
  for k in range(d['decal_colour'].shape[1]):
    (cy, cx), (ry, rx) = d['decal_centre'][:, k].T, d['decal_radii'][:, k].T
    inside = (((yy - e(cy)) / e(ry)) ** 2 + ((xx - e(cx)) / e(rx)) ** 2 < 1.) & surface
    colour, stripes = d['decal_colour'][:, k], d['decal_stripes'][:, k]
    gain = _stripe_gain(e(angle[stripes]), e(freq[stripes]), e(d['decal_phase'][:, k]), yy, xx)
    paint = pal[colour][:, None, None] * gain[..., None]
    base = np.where(inside[..., None], paint, base)
  return base


def _tiles(d: dict, yy: np.ndarray, xx: np.ndarray, inst: np.ndarray) -> np.ndarray:
  """Version 3, NYUD: the brightness factor [n, H, W] of square tiles `_TILE` metres
  wide on the wall and the floor, seen in perspective (one image height per metre at
  1 m, as the objects' sizes): their apparent size gives the wall's distance and the
  floor's depth. 1 elsewhere."""
  wall_dist, floor_line = d['wall_dist'], d['floor_line']
  floor_z = wall_dist * (floor_line + 0.05) / (yy + 0.05)
  z = np.where(inst == 1, floor_z, wall_dist)
  u = (xx - 0.5) * z / _TILE  # metres across, in tiles
  v = np.where(inst == 1, floor_z, yy * wall_dist) / _TILE  # along the floor / up the wall
  grid = np.cos(2. * np.pi * u) * np.cos(2. * np.pi * v)
  return np.where(inst <= 1, 1. + 0.25 * grid, 1.)


def _strokes(d: dict, yy: np.ndarray, xx: np.ndarray, H: int) -> tuple[np.ndarray, np.ndarray]:
  """Coverage [n, H, W] in 0..1 of each scene's painted strokes (segments of
  `stroke_width` pixels' half-width, anti-aliased over one pixel) and their grey
  level [n, H, W] (the last stroke's where they cross)."""
  cover = np.zeros(yy.shape)
  level = np.zeros(yy.shape)
  for k in range(d['stroke_ends'].shape[1]):
    x0, y0, x1, y1 = (d['stroke_ends'][:, k, i][:, None, None] for i in range(4))
    dx, dy = x1 - x0, y1 - y0
    t = np.clip(((xx - x0) * dx + (yy - y0) * dy) / np.maximum(dx * dx + dy * dy, 1e-9), 0., 1.)
    dist = np.hypot(xx - (x0 + t * dx), yy - (y0 + t * dy)) * H  # pixels
    c = np.clip(d['stroke_width'][:, k][:, None, None] + 0.5 - dist, 0., 1.)
    level = np.where(c > 0, d['stroke_level'][:, k][:, None, None], level)
    cover = np.maximum(cover, c)
  return cover, level


def _bump_slopes(d: dict, yy: np.ndarray, xx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(dh/dx, dh/dy) [n, H, W] of each scene's bump field h = sum_k a_k sin(2 pi f_k.(x, y)
  + phi_k), each term's slope amplitude `bump_slope` (so a_k = slope / (2 pi |f_k|))."""
  f = d['bump_freq']  # [n, K] complex: x + iy frequency, cycles per image
  fx, fy = f.real[:, :, None, None], f.imag[:, :, None, None]
  arg = 2. * np.pi * (fx * xx[:, None] + fy * yy[:, None]) + d['bump_phase'][:, :, None, None]
  amp = (d['bump_slope'] / np.abs(f))[:, :, None, None]  # slope / |f| (2 pi cancels)
  c = np.cos(arg) * amp
  return (c * fx).sum(1), (c * fy).sum(1)


def _bumped(normals: np.ndarray, gx: np.ndarray, gy: np.ndarray) -> np.ndarray:
  """`normals` [n, H, W, 3] tilted within each surface's tangent plane by the slopes
  (gx, gy): n' = normalise(n + gx t1 + gy t2), t1 the x axis projected onto the
  plane (the y axis where n is nearly along x), t2 = n x t1; the tilt is atan(|g|),
  limited to 0.95 of the normal's elevation towards the camera (n' still faces it;
  planes seen edge-on, the ground and floor, stay flat)."""
  n = normals.astype(np.float64)
  g = np.hypot(gx, gy)
  nz = np.clip(n[..., 2], 0., 1.)
  tan_e = nz / np.sqrt(np.maximum(1. - nz * nz, 1e-12))
  scale = np.minimum(1., 0.95 * tan_e / np.maximum(g, 1e-12))
  gx, gy = gx * scale, gy * scale
  a = np.where((np.abs(n[..., :1]) < 0.9), np.array([1., 0., 0.]), np.array([0., 1., 0.]))
  t1 = a - np.sum(a * n, -1, keepdims=True) * n
  t1 /= np.linalg.norm(t1, axis=-1, keepdims=True)
  t2 = np.cross(n, t1)
  out = n + gx[..., None] * t1 + gy[..., None] * t2
  return (out / np.linalg.norm(out, axis=-1, keepdims=True)).astype(np.float32)


def _shaped(shape, tilt, u, v, h, rx, ry, z0, bulge, surf, nvec):
  """Version 3: an object's surface depth and (unnormalised) normals [n, H, W(, 3)] by
  its class's `shape` [n] (0 convex: `surf` and `nvec` as given; 1 concave dish:
  the rim nearest, the normals' x and y flipped; 2 vertical cylinder; 3 plane
  tilted towards `tilt` [n], nearer on that side) from the object's ellipse
  coordinates (u, v), its ellipsoid height `h` (`_ellipsoid`'s; only a plane may be a
  box), radii, distance and depth extent `bulge` [n]."""
  e = lambda a: a[:, None, None]
  m = e(np.maximum(np.minimum(rx, ry), 1e-3))
  concave_surf = e(z0) - e(bulge) * (1. - h)
  concave_n = np.stack([-u / e(rx), v / e(ry), h / m], -1)
  hc = np.sqrt(np.clip(1. - u * u, 0., 1.))
  cyl_surf = e(z0) - e(bulge) * hc
  cyl_n = np.stack([u / e(rx), np.zeros_like(u), hc / e(np.maximum(rx, 1e-3))], -1)
  tx, ty = np.cos(tilt), np.sin(tilt)
  plane_surf = e(z0) - 0.5 * e(bulge) * (e(tx) * u + e(ty) * v)
  plane_n = np.broadcast_to(np.stack([-tx, ty, np.full_like(tx, 1.2)], -1)[:, None, None],
                            nvec.shape)
  sel = lambda k: e(shape == k)
  surf = np.select([sel(1), sel(2), sel(3)], [concave_surf, cyl_surf, plane_surf], surf)
  nvec = np.select([sel(1)[..., None], sel(2)[..., None], sel(3)[..., None]],
                   [concave_n, cyl_n, plane_n], nvec)
  return surf, nvec


def _palette_v2(domain: str, num_classes: int) -> np.ndarray:
  """[C, 3] colours of version 2: hues spread by the golden ratio (neighbouring class
  ids far apart on the colour wheel), NYUD's less saturated and warmer."""
  import colorsys
  sat, val = (0.8, 0.9) if domain == 'pascal' else (0.55, 0.8)
  hue = (np.arange(num_classes) * 0.618034 + (0.1 if domain == 'nyud' else 0.)) % 1.
  pal = np.array([colorsys.hsv_to_rgb(h, sat, val) for h in hue]) * 255.
  return pal * (0.7 + 0.15 * (np.arange(num_classes) % 3))[:, None]


def _stripes(domain: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
  """Each class's texture: stripe orientation (radians) and frequency (cycles per
  image height), 4 orientations x 5 frequencies, class 0 (and NYUD's 1) plain."""
  c = np.arange(num_classes)
  angle = (c % 4) * np.pi / 4
  freq = 3. + 2. * ((c // 4) % 5)
  plain = 2 if domain == 'nyud' else 1
  freq[:plain] = 0.
  return angle, freq


def _render(domain: str, d: dict, H: int, W: int, version: int = 1) -> dict[str, np.ndarray]:
  """The images and labels of the scenes drawn in `d` (`_draw`, or `_draw_v2` for
  `version` 2: the same geometry and labels, with version 2's appearance, bumps,
  lights and saliency; `_draw_v3` for 3: version 2's, with each class's surface
  shape, the nearest salient-class object salient, and painted strokes)."""
  n = len(d['n_obj'])
  yy, xx = np.meshgrid((np.arange(H) + .5) / H, (np.arange(W) + .5) / W, indexing='ij')
  yy = np.broadcast_to(yy, (n, H, W))
  xx = np.broadcast_to(xx, (n, H, W))

  sem = np.zeros((n, H, W), np.int32)
  inst = np.zeros((n, H, W), np.int32)
  normals = np.zeros((n, H, W, 3), np.float32)
  n_obj, obj_classes = d['n_obj'], d['obj_classes']
  if domain == 'pascal':
    num_classes = 21
    horizon = d['horizon']
    ground = yy > horizon
    # Sky far away, ground plane getting closer towards the bottom.
    depth = np.where(ground, 3. + 40. * (1. - (yy - horizon) / (1. - horizon + 1e-6)) ** 2, 60.)
    normals[..., 1] = np.where(ground, -1., 0.)
    normals[..., 2] = np.where(ground, 0., 1.)
    inst[:] = np.where(ground, 1, 0)
  else:
    num_classes = 40
    floor_line, wall_dist = d['floor_line'], d['wall_dist']
    floor = yy > floor_line
    depth = np.where(floor, wall_dist * (floor_line + 0.05) / (yy + 0.05), wall_dist)
    sem[:] = np.where(floor, 1, 0)  # NYU40 wall=0, floor=1 after the -1 shift
    inst[:] = np.where(floor, 1, 0)
    normals[..., 1] = np.where(floor, -1., 0.)
    normals[..., 2] = np.where(floor, 0., 1.)
  depth = depth.astype(np.float64)
  parts = np.zeros((n, H, W), np.int32)
  salient = np.zeros((n, H, W), bool)
  phase = np.zeros((n, H, W))  # version 2: the visible object's texture phase
  if version >= 3:
    attrs = _classes_v3(domain)
    shape, tilt = attrs['shape'], attrs['tilt']
    zobj = np.full((n, H, W), np.inf)

  for j in range(obj_classes.shape[1]):
    active = j < n_obj
    cls = obj_classes[:, j]
    cy, cx, ry, rx = d[f'cy{j}'], d[f'cx{j}'], d[f'ry{j}'], d[f'rx{j}']
    is_person = (cls == PERSON) if domain == 'pascal' else np.zeros(n, bool)
    ry = np.where(is_person, np.maximum(ry, 0.18 if version == 1 else 0.26), ry)
    rx = np.where(is_person, np.minimum(rx, ry * 0.5), rx)
    z0 = d[f'z0{j}']
    bulge = np.minimum(rx, ry) * z0  # ellipsoid depth extent, in metres
    u, v, inside, h = _ellipsoid(yy, xx, cy, cx, ry, rx)
    if version >= 3:
      box = (domain == 'nyud') & (shape[cls] == 3)
    else:
      box = (domain == 'nyud') & (d[f'box{j}'] < 0.6)
    if domain == 'nyud':
      inside_box = (np.abs(u) < 0.9) & (np.abs(v) < 0.9)
      inside = np.where(box[:, None, None], inside_box, inside)
      h = np.where(box[:, None, None], 1., h)
    surf = z0[:, None, None] - bulge[:, None, None] * h
    # Ellipsoid normal: gradient of the implicit surface; boxes face the camera.
    nx = u / rx[:, None, None]
    ny = v / ry[:, None, None]
    nz = h / np.maximum(np.minimum(rx, ry), 1e-3)[:, None, None]
    if domain == 'nyud':
      nx = np.where(box[:, None, None], 0., nx)
      ny = np.where(box[:, None, None], 0., ny)
      nz = np.where(box[:, None, None], 1., nz)
    nvec = np.stack([nx, -ny, nz], -1)
    if version >= 3:
      surf, nvec = _shaped(shape[cls], tilt[cls], u, v, h, rx, ry, z0, bulge, surf, nvec)
      # Objects occlude one another by distance (painter's order: a dish's far centre
      # does not show a farther object through it), the background by depth.
      front = np.where(inst >= 2, z0[:, None, None] < zobj, surf < depth)
      draw = inside & active[:, None, None] & front
      zobj = np.where(draw, z0[:, None, None], zobj)
    else:
      draw = inside & active[:, None, None] & (surf < depth)
    nvec /= np.linalg.norm(nvec, axis=-1, keepdims=True) + 1e-12
    depth = np.where(draw, surf, depth)
    sem = np.where(draw, cls[:, None, None], sem)
    inst = np.where(draw, j + 2, inst)
    normals = np.where(draw[..., None], nvec, normals)
    salient = np.where(draw, True, salient)
    if version >= 2:
      phase = np.where(draw, d[f'phase{j}'][:, None, None], phase)
    if domain == 'pascal':
      # Parts by body geometry: head, torso, arms, legs (6 parts + background).
      part = np.select(
          [v < -0.55, (v < 0.15) & (u < -0.45), (v < 0.15) & (u > 0.45), v < 0.15, u < 0.],
          [1, 3, 4, 2, 5], default=6)
      pdraw = draw & is_person[:, None, None]
      parts = np.where(draw, np.where(pdraw, part, 0), parts)

  if version >= 2:
    # Bumps: the bump field's slope tilts every surface's normal.
    normals = _bumped(normals, *_bump_slopes(d, yy, xx))
    # Salient: the nearest (largest-looking) visible object only (version 3: of a
    # salient class).
    ids = np.arange(obj_classes.shape[1])
    seen = np.stack([np.any(inst == j + 2, axis=(1, 2)) for j in ids], 1)
    if version >= 3:
      seen &= attrs['salient'][obj_classes]
    z = np.where(seen & (ids[None] < n_obj[:, None]),
                 np.stack([d[f'z0{j}'] for j in ids], 1), np.inf)
    salient = (inst == (np.argmin(z, 1) + 2)[:, None, None]) & np.isfinite(z.min(1))[:, None, None]

  # Edges where the visible instance changes (semantic + depth discontinuities).
  edge = np.zeros((n, H, W), bool)
  edge[:, :, :-1] |= inst[:, :, :-1] != inst[:, :, 1:]
  edge[:, :-1, :] |= inst[:, :-1, :] != inst[:, 1:, :]

  # Appearance: class colour, Lambertian shading from the normals, texture noise
  # (version 2: and each class's stripes).
  pal = (_palette if version == 1 else _palette_v2)(domain, num_classes)
  base = pal[sem]
  if version >= 2:
    angle, freq = _stripes(domain, num_classes)
    base = base * _stripe_gain(angle[sem], freq[sem], phase, yy, xx)[..., None]
  if version >= 3 and domain == 'nyud':
    base = base * _tiles(d, yy, xx, inst)[..., None]
  if version == 4:  # on every surface but PASCAL's sky
    base = _decals(d, yy, xx, pal, angle, freq, base, inst != 0 if domain == 'pascal' else inst >= 0)
  if domain == 'pascal':
    sky = (yy < 1.) & (inst == 0)
    base = np.where(sky[..., None], np.stack([110 + 80 * yy, 150 + 60 * yy, 230 + 0 * yy], -1), base)
  if version == 1:
    light = np.array([0.3, 0.5, 0.81])
    light /= np.linalg.norm(light)
    lambert = normals @ light
  else:  # each scene's own light direction
    light = d['light'] / np.linalg.norm(d['light'], axis=-1, keepdims=True)
    lambert = np.einsum('nhwc,nc->nhw', normals, light)
  shade = 0.45 + 0.55 * np.clip(lambert, 0., 1.)
  image = base * shade[..., None]
  if version >= 3:
    cover, level = _strokes(d, yy, xx, H)
    image = image + cover[..., None] * (level[..., None] - image)
  image = np.clip(image + d['tex'], 0, 255).astype(np.uint8)

  out = {'image': image, 'semseg': sem.astype(np.uint8),
         'normals': normals.astype(np.float32), 'edge': edge.astype(np.uint8)}
  if domain == 'pascal':
    # A parts map with no visible part pixel (no person, or every person fully
    # occluded) is all-ignore, as AddIgnoreRegions makes it for the real data.
    has_person = np.any(parts > 0, axis=(1, 2))
    out['human_parts'] = np.where(has_person[:, None, None], parts, IGNORE).astype(np.uint8)
    out['sal'] = salient.astype(np.uint8)
  else:
    out['depth'] = depth.astype(np.float32)
  return out
