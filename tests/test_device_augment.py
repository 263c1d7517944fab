"""Device-side augmentation (`data.device_augment`) against the host transforms.

Bit-exact on fixed parameters (scale + crop + flip with bilinear image, nearest
labels, depth / scale, normals x negated; photometric distortion with OpenCV's
8-bit HSV; ignore regions; placement in the train canvas; the cat_max_ratio
candidate selection); statistical on the parameter draws (fixed seeds:
deterministic, with a margin that a wrong distribution does not pass); and an
engine run with `data.augment='device'` that resumes bitwise.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from conftest import tiny_config
from fake_datasets import make_pascal
from fedjax_mtl import experiment, sources
from fedjax_mtl.engines.dense import DenseEngine
from fedjax_mtl.data import cache as cache_lib
from fedjax_mtl.data import device_augment as DA
from fedjax_mtl.data import real
from fedjax_mtl.data import transforms as T
from fedjax_mtl.errors import ConfigError

H, W = 40, 56  # raw canvas (largest image)
SIZE = (32, 48)  # train crop: smaller than the canvas, larger than downscaled images
CFG = DA.AugmentConfig(SIZE)
KEYS = ('semseg', 'human_parts', 'sal', 'edge', 'normals', 'depth')
SIZES = [(40, 56), (40, 56), (23, 31), (12, 9), (40, 17), (31, 56), (2, 5), (0, 0)]


def x64(fn):
  """Call the jitted `fn` under x64 (device_augment computes taps in float64)."""
  def call(*args):
    with jax.enable_x64(True):
      return jax.device_get(fn(*args))
  return call


class Scripted:
  """np.random.Generator stand-in: returns the given draws, counts integer draws."""

  def __init__(self, uniform=(), integers=(), random=()):
    self.u, self.i, self.r = list(uniform), list(integers), list(random)
    self.num_integers = 0

  def uniform(self, lo, hi):
    v = self.u.pop(0)
    assert lo <= v < hi
    return v

  def integers(self, lo, hi):
    v = self.i.pop(0)
    assert lo <= v < hi, (lo, v, hi)
    self.num_integers += 1
    return v

  def random(self):
    return self.r.pop(0)


def _sample(rng, h, w):
  """A sample with every label kind: few classes, parts without humans, ignored and
  zero normals, missing and ignored depth."""
  seg = rng.integers(0, 3, (h, w)).astype(np.uint8) * 7
  seg[rng.random((h, w)) < 0.1] = 255
  parts = np.zeros((h, w), np.uint8)
  parts[:3, :3] = rng.integers(1, 7)
  parts[rng.random((h, w)) < 0.2] = 255
  n = rng.normal(size=(h, w, 3)).astype(np.float32)
  n /= np.linalg.norm(n, axis=-1, keepdims=True)
  n[rng.random((h, w)) < 0.1] = 255
  n[rng.random((h, w)) < 0.1] = 0
  d = rng.uniform(0.1, 9.9, (h, w)).astype(np.float32)
  d[rng.random((h, w)) < 0.1] = 0
  d[rng.random((h, w)) < 0.1] = 255
  return {'image': rng.integers(0, 256, (h, w, 3), dtype=np.uint8), 'semseg': seg,
          'human_parts': parts, 'sal': (rng.random((h, w)) < 0.5).astype(np.uint8),
          'edge': (rng.random((h, w)) < 0.1).astype(np.uint8), 'normals': n, 'depth': d}


def _bits(a):
  """Arrays compared bit for bit (float -0.0 != 0.0)."""
  a = np.asarray(a)
  return a.view(np.uint32) if a.dtype == np.float32 else a


def _raw_batch(samples):
  fields = real._raw_fields(KEYS, (H, W))
  out = {k: np.full((len(samples),) + shape, fill, dtype) for k, (shape, dtype, fill) in
         fields.items() if k != 'aug_id'}
  for b, smp in enumerate(samples):
    if smp['image'].size:
      real.place_raw(out, (b,), smp)
  return out


def _photo_params(rng, n):
  """Photometric draws covering every branch combination."""
  on = lambda: rng.random(n) < 0.5
  return DA.Photometric(
      contrast_first=on(), brightness_on=on(), brightness=rng.uniform(-32, 32, n),
      contrast_on=on(), contrast=rng.uniform(0.5, 1.5, n), saturation_on=on(),
      saturation=rng.uniform(0.5, 1.5, n), hue_on=on(),
      hue=rng.integers(-18, 18, n).astype(np.int32))


def _photo_script(p, i):
  """The host's draw sequence of `photometric_distortion` for draws p[i]."""
  coin = lambda b: 0.1 if b else 0.9
  cf = bool(p.contrast_first[i])
  u, r, ints = [], [coin(cf), coin(p.brightness_on[i])], []
  if p.brightness_on[i]:
    u.append(float(p.brightness[i]))
  if cf:
    r.append(coin(p.contrast_on[i]))
    if p.contrast_on[i]:
      u.append(float(p.contrast[i]))
  r.append(coin(p.saturation_on[i]))
  if p.saturation_on[i]:
    u.append(float(p.saturation[i]))
  r.append(coin(p.hue_on[i]))
  if p.hue_on[i]:
    ints.append(int(p.hue[i]))
  if not cf:
    r.append(coin(p.contrast_on[i]))
    if p.contrast_on[i]:
      u.append(float(p.contrast[i]))
  return u, ints, r


def _geometry_params(rng, sizes, cfg=CFG):
  """Scale (with the edge cases 1.0 and the extremes), valid crop offsets, flip."""
  n = len(sizes)
  s = rng.uniform(cfg.min_scale, cfg.max_scale, n)
  s[1], s[2], s[3] = 1.0, cfg.min_scale, np.nextafter(cfg.max_scale, 0)
  tops, lefts = [], []
  for (h, w), si in zip(sizes, s):
    nh, nw = (max(int(h * si), 1), max(int(w * si), 1)) if h else (1, 1)
    tops.append(rng.integers(0, max(nh - cfg.size[0], 0) + 1))
    lefts.append(rng.integers(0, max(nw - cfg.size[1], 0) + 1))
  return DA.Geometry(s, np.array(tops, np.int32), np.array(lefts, np.int32),
                     rng.random(n) < 0.5)


@pytest.fixture(scope='module')
def cases():
  rng = np.random.default_rng(0)
  sizes = SIZES * 3
  samples = [_sample(rng, h, w) for h, w in sizes]
  params = DA.Params(_geometry_params(rng, sizes), _photo_params(rng, len(sizes)))
  return samples, sizes, params


@pytest.fixture(scope='module')
def apply_fn():
  return x64(jax.jit(jax.vmap(lambda raw, hw, p: DA.apply_params(raw, hw, p, CFG))))


def test_apply_params_equals_host_path(cases, apply_fn):
  """Scale/crop/flip -> photometric -> ignore regions -> place, on fixed draws."""
  samples, sizes, p = cases
  raw = _raw_batch(samples)
  got = apply_fn({k: raw[k] for k in ('image',) + KEYS}, raw['size'], p)
  # The host path without retries (the crop offsets are given).
  ts = real.engine_transforms(T.train_transforms(SIZE, cat_max_ratio=1.0))
  fields = real._fields(KEYS, SIZE)
  want = {k: np.full((len(samples),) + shape, fill, dtype) for k, (shape, dtype, fill) in
          fields.items()}
  g = p.geometry
  for b, smp in enumerate(samples):
    if not smp['image'].size:
      continue  # padding: the canvas fill
    u, ints, r = _photo_script(p.photometric, b)
    rng = Scripted(uniform=[float(g.scale[b])] + u,
                   integers=[int(g.top[b]), int(g.left[b])] + ints,
                   random=[0.1 if g.flip[b] else 0.9] + r)
    real.place(want, (b,), T.apply_transforms(smp, ts, rng))
    assert not (rng.u or rng.i or rng.r)
  assert set(got) == set(want)
  for k in want:
    assert got[k].dtype == want[k].dtype, k
    np.testing.assert_array_equal(_bits(got[k]), _bits(want[k]), err_msg=k)
  # The cases cover what they should: crops, padding, flips, all-ignore parts.
  assert (want['box'][:, 2] == SIZE[0]).any() and (want['box'][:, 2] < SIZE[0]).any()
  assert g.flip.any() and not g.flip.all()
  hp = want['human_parts'][want['box'][:, 2] > 0]
  assert (hp == 255).all(axis=(1, 2)).any() and not (hp == 255).all(axis=(1, 2)).all()


def test_geometry_bilinear_is_bit_exact(cases):
  """The float32 bilinear image before truncation equals the host's (no FMA, same taps)."""
  samples, sizes, p = cases
  raw = _raw_batch(samples)
  geo = x64(jax.jit(jax.vmap(lambda im, hw, g: DA.apply_geometry({'image': im}, hw, g, CFG)[0])))
  got = geo(raw['image'], raw['size'], p.geometry)
  g = p.geometry
  for b, smp in enumerate(samples):
    if not smp['image'].size:
      continue
    rng = Scripted(uniform=[float(g.scale[b])], integers=[int(g.top[b]), int(g.left[b])],
                   random=[0.1 if g.flip[b] else 0.9])
    out = T.random_scale_crop_flip({'image': smp['image']}, rng, SIZE, cat_max_ratio=1.0)
    t, l, h, w = got['box'][b]
    np.testing.assert_array_equal(_bits(got['image'][b, t:t + h, l:l + w]),
                                  _bits(out['image'].astype(np.float32)))


def test_taps_match_opencv_semantics_exhaustively():
  """Nearest (OpenCV's double reciprocal) and bilinear taps for every size pair <= 48 x 96."""
  n_in, n_out = 48, 96

  def taps(a, b):
    dst = jnp.arange(n_out, dtype=jnp.int32)
    zero = DA.runtime_zero(jnp.stack([a, b]))
    return (DA.nearest_taps(a, b, dst, zero),) + DA.linear_taps(a, b, dst, zero)

  f = x64(jax.jit(jax.vmap(jax.vmap(taps, (None, 0)), (0, None))))
  got = f(jnp.arange(1, n_in + 1, dtype=jnp.int32), jnp.arange(1, n_out + 1, dtype=jnp.int32))
  want = [np.zeros_like(g) for g in got]
  valid = np.arange(n_out)[None, None, :] < np.arange(1, n_out + 1)[None, :, None]
  for a in range(1, n_in + 1):
    for b in range(1, n_out + 1):
      for w, t in zip(want, (T._nearest_taps(a, b),) + T._linear_taps(a, b)):
        w[a - 1, b - 1, :b] = t
  for g, w in zip(got, want):
    bad = np.argwhere((g != w) & valid)
    assert not len(bad), f'first mismatch at (n_in, n_out, dst) = {bad[0] + [1, 1, 0]}'


def test_photometric_equals_host_on_every_branch():
  rng = np.random.default_rng(1)
  n = 64  # 2^6 branch combinations, each about once
  p = _photo_params(rng, n)
  grid = np.arange(0, 256, 5, dtype=np.uint8)  # a grid of colours plus noise images
  colours = np.stack(np.meshgrid(grid, grid, grid, indexing='ij'), -1).reshape(-1, 3)
  img = colours[rng.permutation(len(colours))[:n * 24 * 32]].reshape(n, 24, 32, 3)
  got = x64(jax.jit(jax.vmap(DA.apply_photometric)))(img, p)
  for i in range(n):
    u, ints, r = _photo_script(p, i)
    want = T.photometric_distortion({'image': img[i]}, Scripted(u, ints, r))['image']
    np.testing.assert_array_equal(got[i], want, err_msg=str(i))
  # The HSV round trip alone, on the full colour grid (bit-exact with OpenCV's 8-bit path).
  hsv = x64(jax.jit(lambda x: DA.hsv_to_rgb_u8(*DA.rgb_to_hsv_u8(x))))(colours)
  np.testing.assert_array_equal(hsv, T.hsv_to_rgb_u8(T.rgb_to_hsv_u8(colours)))


def test_crop_selection_equals_host_retry_loop():
  """The first accepted of max_retries candidates, else the last, with the host's test."""
  rng = np.random.default_rng(2)
  n, r = 96, CFG.max_retries
  sizes = [SIZES[i % 6] for i in range(n)]
  segs, scales, tops, lefts, want = [], [], [], [], []
  for k, (h, w) in enumerate(sizes):
    seg = np.full((h, w), 3, np.uint8)  # a block of a second class: borderline windows
    r0, c0 = rng.integers(0, h), rng.integers(0, w)
    seg[r0:r0 + rng.integers(1, h + 1), c0:c0 + rng.integers(1, w + 1)] = 5
    seg[rng.random((h, w)) < 0.05 * (k % 3)] = 255
    if k % 7 == 0:
      seg[:] = 3  # one class: every window fails
    s = 1.0 if k % 5 == 0 else rng.uniform(0.5, 2.0)
    nh, nw = (int(h * s), int(w * s))
    t = rng.integers(0, max(nh - SIZE[0], 0) + 1, r + 1)
    l = rng.integers(0, max(nw - SIZE[1], 0) + 1, r + 1)
    script = Scripted(uniform=[s], integers=[v for pair in zip(t, l) for v in pair],
                      random=[0.9])
    T.random_scale_crop_flip({'image': np.zeros((h, w, 3), np.uint8), 'semseg': seg}, script,
                             SIZE)
    want.append(script.num_integers // 2 - 1)
    segs.append(seg)
    scales.append(s)
    tops.append(t)
    lefts.append(l)
  raw = _raw_batch([{'image': np.zeros(sg.shape + (3,), np.uint8), 'semseg': sg}
                    for sg in segs])

  def select(seg, hw, s, t, l):
    nhw = DA.scaled_size(hw, s)
    return DA.select_crop(seg, hw, nhw, t, l, CFG, DA.runtime_zero(hw))

  got = x64(jax.jit(jax.vmap(select)))(raw['semseg'], raw['size'], np.array(scales),
                                      np.array(tops, np.int32), np.array(lefts, np.int32))
  np.testing.assert_array_equal(got, want)
  assert 0 in want and r in want and len(set(want)) > 3  # first, last and retries in between


# --------------------------------------------------------------------------- distributions

N_DRAWS = 4000


@pytest.fixture(scope='module')
def draws():
  """Device draws for one 40x56 sample whose windows all pass at every scale (stripes of
  two classes, 3 pixels wide), so the kept crop is the first candidate."""
  seg = np.where(np.arange(W) // 3 % 2 == 0, 1, 2).astype(np.uint8)[None].repeat(H, 0)
  keys = jax.vmap(lambda i: DA.sample_key(0, jnp.stack([i, i // 7, i % 7])))(
      jnp.arange(N_DRAWS))
  f = x64(jax.jit(jax.vmap(lambda k: DA.draw_params(k, jnp.asarray(seg), jnp.array([H, W]),
                                                    CFG))))
  return f(keys)


def _ks(x, lo, hi):
  return stats.kstest(np.asarray(x, np.float64), stats.uniform(lo, hi - lo).cdf).pvalue


def _binom(hits, n, p=0.5):
  return stats.binomtest(int(np.sum(hits)), n, p).pvalue


def test_scale_flip_and_photometric_draws_follow_the_host_distributions(draws):
  g, p = draws
  n = N_DRAWS
  # Scale ~ U[0.5, 2) (host: rng.uniform); a shifted range is rejected.
  assert _ks(g.scale, 0.5, 2.0) > 1e-3 and _ks(g.scale, 0.6, 2.0) < 1e-6
  assert g.scale.dtype == np.float64 and g.scale.min() >= 0.5 and g.scale.max() < 2.0
  # Flip and every photometric step with p = 0.5, independently.
  for bits in (g.flip, p.contrast_first, p.brightness_on, p.contrast_on, p.saturation_on,
               p.hue_on):
    assert _binom(bits, n) > 1e-3 and _binom(bits, n, 0.4) < 1e-6
  assert _binom(p.contrast_first & p.contrast_on, n, 0.25) > 1e-3
  assert _ks(p.brightness, -32, 32) > 1e-3 and _ks(p.brightness, -32, 40) < 1e-6
  assert _ks(p.contrast, 0.5, 1.5) > 1e-3 and _ks(p.saturation, 0.5, 1.5) > 1e-3
  # Hue: integers -18..17 (random.randint(-18, 17)), uniform.
  counts = np.bincount(p.hue + 18, minlength=37)
  assert counts[36] == 0 and p.hue.min() == -18
  assert stats.chisquare(counts[:36]).pvalue > 1e-3
  # Crop offsets: uniform over the valid range of the drawn scale.
  nh = np.floor(H * g.scale).astype(int)
  span = np.maximum(nh - SIZE[0], 0) + 1
  assert (g.top < span).all() and (g.top >= 0).all()
  big = span > 8
  assert _ks((g.top[big] + 0.5) / span[big], 0, 1) > 1e-3


def test_retry_distribution_matches_host_where_most_windows_fail():
  """Only crops at left = 0 pass (9 offsets, p = 1/9): the kept left is 0 with
  probability 1 - (8/9)^11 (10 checked draws + 1 unchecked), else uniform."""
  cfg = DA.AugmentConfig(SIZE, min_scale=1.0, max_scale=1.0)
  seg = np.ones((H, W), np.uint8)
  seg[:, :13] = 2  # left = L keeps 13 - L columns of class 2: ratio (35 + L) / 48
  coords = np.stack(np.meshgrid(np.arange(H), np.arange(W), indexing='ij'), -1)
  image = np.concatenate([coords, np.zeros((H, W, 1))], -1).astype(np.uint8)
  rng = np.random.default_rng(3)
  host = []
  for _ in range(1000):
    out = T.random_scale_crop_flip({'image': image, 'semseg': seg}, rng, SIZE, 1.0, 1.0,
                                   flip_p=0.0)
    host.append(int(out['image'][0, 0, 1]))
  n_dev = 1500
  keys = jax.vmap(lambda i: DA.sample_key(1, jnp.stack([i, 0, 0])))(jnp.arange(n_dev))
  dev = x64(jax.jit(jax.vmap(lambda k: DA.draw_params(k, jnp.asarray(seg), jnp.array([H, W]),
                                                      cfg).geometry)))(keys)
  p0 = 1 - (8 / 9) ** 11
  expected = np.array([p0] + [(1 - p0) / 8] * 8)
  for lefts, n in ((np.array(host), 1000), (dev.left, n_dev)):
    counts = np.bincount(lefts, minlength=9)
    assert len(counts) == 9
    assert stats.chisquare(counts, expected * n).pvalue > 1e-3
    # A loop with 5 retries (or no retry) would keep left = 0 far less often.
    assert stats.binomtest(int(counts[0]), n, 1 - (8 / 9) ** 6).pvalue < 1e-6
  # Host and device agree with each other (two-sample test on the counts).
  table = np.stack([np.bincount(host, minlength=9), np.bincount(dev.left, minlength=9)])
  assert stats.chi2_contingency(table).pvalue > 1e-3
  # The top offset stays uniform (every top passes alike).
  assert stats.chisquare(np.bincount(dev.top, minlength=9)).pvalue > 1e-3


def test_sample_keys_are_a_function_of_seed_client_epoch_position():
  ids = jnp.array([[3, 1, 5], [3, 1, 5], [3, 2, 5], [4, 1, 5], [3, 1, 6]], jnp.int32)
  keys = np.asarray(jax.vmap(lambda i: DA.sample_key(0, i))(ids))
  assert (keys[0] == keys[1]).all()
  assert len({tuple(k) for k in keys}) == 4
  assert not (np.asarray(DA.sample_key(1, ids[0])) == keys[0]).all()


# --------------------------------------------------------------------------- engine

P_TRAIN = [f'2008_{i:06d}' for i in range(1, 13)]


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  base = str(tmp_path_factory.mktemp('real_device_aug'))
  make_pascal(os.path.join(base, 'PASCALContext'), ids=P_TRAIN, num_val=2)
  for split in ('train', 'val'):
    cache_lib.prepare('pascal', os.path.join(base, 'PASCALContext'), split,
                      os.path.join(base, 'cache', f'pascal_{split}'), verbose=False)
  return base


def _config(data_dir, **overrides):
  # One group of three PASCAL clients (semseg with its crop retry, parts, normals);
  # fake images are 40x48, cropped to 32x40.
  kw = {'data.source': 'real', 'data.data_dir': data_dir, 'data.augment': 'device',
        'data.resolution': {'pascal': (40, 48), 'nyud': (32, 40)}, 'scenario': 'pascal_st',
        'tasks': 'semseg,human_parts,normals', 'batch_size': 2, 'num_rounds': 2}
  return tiny_config('fedavg', **{**kw, **overrides})


def test_engine_trains_and_resumes_bitwise_with_device_augment(data_dir):
  cfg = _config(data_dir)
  exp = experiment.build(cfg)
  engine = DenseEngine(exp)
  engine.open(0)
  chunks = engine.source.train_chunks
  assert chunks.augment == 'device' and chunks.raw_size_of == {'pascal': (40, 48)}
  # One chunk through the augmenter: the host path's fields, shapes and conventions.
  el = chunks[0]
  spec = chunks.specs[int(el['group'])]
  assert el['x/image'].shape[3:] == (40, 48, 3) and el['x/size'].shape[3:] == (2,)
  out = jax.device_get(engine.programs.augmenters[0](engine.source.on_device(el)['x']))
  host = real.TrainChunks(chunks.specs, chunks.sources, 2, chunks.size_of, chunks.seed,
                          chunks.transforms_of)[0]
  assert set(out) == {k[2:] for k in host if k.startswith('x/')}
  for k, v in out.items():
    assert v.shape == host[f'x/{k}'].shape and v.dtype == host[f'x/{k}'].dtype, k
  m = el['mask']
  assert (out['box'][~m] == 0).all() and (out['box'][m][:, 2:] > 0).all()
  for key in spec.keys:
    assert (out[key][~m] == 255).all()
  assert set(np.unique(out['semseg'][m])) <= set(np.unique(el['x/semseg'][m])) | {255}
  # Two rounds; then round 2 again from the round-1 state with a feed that starts
  # at round 2 (as a resumed run opens it): bitwise equal.
  state = experiment.init_state(exp)
  start = jax.device_get([gs.params for gs in state.groups])
  state, _ = engine.run_round(state, 1)
  saved, shardings = jax.device_get(state), jax.tree.map(lambda a: a.sharding, state)
  state, out2 = engine.run_round(state, 2)
  engine.open(1)  # as a resumed run opens its source
  resumed, out2b = engine.run_round(jax.device_put(saved, shardings), 2)
  engine.close()
  params = lambda st: jax.device_get([gs.params for gs in st.groups])
  jax.tree.map(np.testing.assert_array_equal, params(state), params(resumed))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(out2), jax.device_get(out2b))
  assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(start),
                                                      jax.tree.leaves(params(state))))
  assert np.isfinite(np.asarray(jax.device_get(out2)['train'][0]['loss'])).all()
  assert engine.programs.augmenters[0].jitted._cache_size() == 1  # traced once for all chunks
  # The default stays 'host'; an unknown mode is one ConfigError line, before any run.
  assert tiny_config('fedavg').data.augment == 'host'
  with pytest.raises(ConfigError, match="unknown data.augment 'gpu'; valid choices: 'host', "
                                        "'device'"):
    sources.make_source(experiment.build(_config(data_dir, **{'data.augment': 'gpu'})))
