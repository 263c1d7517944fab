"""Synthetic benchmark: formats, determinism, cross-task consistency, domain shift."""

import numpy as np
import pytest

from fedjax_mtl import tasks
from fedjax_mtl.data import synthetic
from fedjax_mtl.errors import ConfigError

N = 200
RES = (64, 64)
PERSON = 15


@pytest.fixture(scope='module', params=synthetic.VERSIONS, ids=lambda v: f'v{v}')
def version(request):
  """Every test of the scenes' labels holds for each version (`data.synthetic_version`)."""
  return request.param


@pytest.fixture(scope='module')
def pascal(version):
  return synthetic.generate('pascal', 'train', N, RES, seed=0, version=version)


@pytest.fixture(scope='module')
def nyud(version):
  return synthetic.generate('nyud', 'train', N, RES, seed=0, version=version)


@pytest.fixture(scope='module')
def data(pascal, nyud):
  return {'pascal': pascal, 'nyud': nyud}


DOMAINS = ('pascal', 'nyud')


# ----------------------------------------------------------------------------
# Formats


@pytest.mark.parametrize('domain', DOMAINS)
def test_keys_shapes_and_dtypes(data, domain):
  x = data[domain]
  assert set(x) == {'image'} | set(tasks.DATASETS[domain].tasks)
  assert x['image'].shape == (N,) + RES + (3,) and x['image'].dtype == np.uint8
  assert x['normals'].shape == (N,) + RES + (3,) and x['normals'].dtype == np.float32
  for k in ('semseg', 'edge', 'human_parts', 'sal'):
    if k in x:
      assert x[k].shape == (N,) + RES and x[k].dtype == np.uint8, k
  if 'depth' in x:
    assert x['depth'].shape == (N,) + RES and x['depth'].dtype == np.float32


@pytest.mark.parametrize('domain', DOMAINS)
def test_label_value_ranges(data, domain):
  x = data[domain]
  info = tasks.DATASETS[domain]
  sem = x['semseg']
  assert sem.max() < info.semseg_classes  # fully labelled, no ignore
  assert set(np.unique(x['edge'])) <= {0, 1}
  if domain == 'pascal':
    assert set(np.unique(x['sal'])) <= {0, 1}
    hp = x['human_parts']
    assert set(np.unique(hp)) <= set(range(info.channels('human_parts'))) | {255}
  if domain == 'nyud':
    d = x['depth']
    assert np.all(np.isfinite(d))
    # metres, valid for the RMSE metric (0 < gt < 80), no ignore markers
    assert d.min() > 0. and d.max() < 80.
  # The image uses a good part of the uint8 range.
  assert x['image'].max() > 150 and x['image'].min() < 60


@pytest.mark.parametrize('domain', DOMAINS)
def test_normals_are_unit_and_face_the_camera(data, domain):
  n = data[domain]['normals']
  assert np.all(n != 255)  # every pixel is a rendered surface: nothing ignored
  assert np.all(np.abs(n) <= 1.)
  np.testing.assert_allclose(np.linalg.norm(n, axis=-1), 1., atol=1e-5)
  assert n[..., 2].min() >= -1e-6  # visible surfaces point towards the viewer


def test_human_parts_all_ignore_exactly_when_no_person_is_visible(pascal):
  hp, sem = pascal['human_parts'], pascal['semseg']
  ignored = np.all(hp == 255, axis=(1, 2))
  partial = np.any(hp == 255, axis=(1, 2)) & ~ignored
  assert not partial.any()  # per image: all-255 or fully labelled
  visible = np.any(sem == PERSON, axis=(1, 2))
  np.testing.assert_array_equal(~ignored, visible)
  # Both kinds occur, so the parts task has data and the human filter bites.
  assert 0.1 * N < visible.sum() < 0.9 * N
  # Part labels 1..6 sit exactly on person pixels, background 0 elsewhere.
  lab = hp[visible]
  np.testing.assert_array_equal((lab > 0), sem[visible] == PERSON)
  assert set(np.unique(lab[lab > 0])) == set(range(1, 7))


def test_fully_occluded_people_leave_an_all_ignore_parts_map():
  # Regression: a person drawn and then completely hidden by a nearer object
  # used to leave an all-background (0) parts map that counted as "has humans".
  # Small images make full occlusion common enough to hit it (~1% of scenes).
  for seed in range(4):
    x = synthetic.generate('pascal', 'train', 500, (16, 16), seed=seed)
    has_parts = np.any(x['human_parts'] != 255, axis=(1, 2))
    visible = np.any(x['semseg'] == PERSON, axis=(1, 2))
    np.testing.assert_array_equal(has_parts, visible)
    assert np.all(np.any(x['human_parts'][has_parts] > 0, axis=(1, 2)))


def test_no_person_class_in_nyud(nyud):
  # NYUD has no parts task; class 15 is an ordinary object class there.
  assert 'human_parts' not in nyud and 'sal' not in nyud


# ----------------------------------------------------------------------------
# Cross-task consistency


def test_saliency_marks_the_objects(pascal, version):
  # PASCAL background (sky and ground) is class 0. Version 1: every object is
  # salient; version 2: exactly one object per scene, the nearest (its pixels are
  # one class, and it is never behind another object: no larger depth than theirs).
  sal, sem = pascal['sal'] == 1, pascal['semseg']
  frac = sal.mean()
  assert 0.02 < frac < 0.9
  if version == 1:
    np.testing.assert_array_equal(sal, sem != 0)
    return
  assert np.all(sem[sal] != 0)
  for s_img, c_img in zip(sal, sem):
    assert len(np.unique(c_img[s_img])) <= 1
  if version == 2:
    assert np.all(sal.any(axis=(1, 2)))
    return
  # Version 3: the salient object is of a salient class; every scene has one, which a
  # nearer object hides completely in a few.
  kinds = synthetic._classes_v3('pascal')['salient']
  assert np.all(kinds[sem[sal]])
  assert np.any(~kinds[sem[(sem > 0) & ~sal]])  # other objects are of either kind
  assert sal.any(axis=(1, 2)).mean() > 0.9


@pytest.mark.parametrize('domain', DOMAINS)
def test_edges_at_semantic_boundaries(data, domain):
  sem, edge = data[domain]['semseg'], data[domain]['edge'].astype(bool)
  # A class change to the right / below puts an edge on the left / top pixel.
  dx = sem[:, :, :-1] != sem[:, :, 1:]
  dy = sem[:, :-1, :] != sem[:, 1:, :]
  assert dx.any() and dy.any()
  assert np.all(edge[:, :, :-1][dx])
  assert np.all(edge[:, :-1, :][dy])
  assert np.all(edge.any(axis=(1, 2)))  # every scene has some boundary
  assert edge.mean() < 0.25  # ... and edges stay thin


@pytest.mark.parametrize('domain', DOMAINS)
def test_every_edge_separates_different_surfaces(data, domain):
  x = data[domain]
  edge = x['edge'].astype(bool)
  sem, nrm = x['semseg'], x['normals']

  def differs(sl_a, sl_b):
    d = (sem[sl_a] != sem[sl_b]) | np.any(nrm[sl_a] != nrm[sl_b], -1)
    if 'depth' in x:
      d |= x['depth'][sl_a] != x['depth'][sl_b]
    return d

  right = np.zeros_like(edge)
  right[:, :, :-1] = differs(np.s_[:, :, :-1], np.s_[:, :, 1:])
  down = np.zeros_like(edge)
  down[:, :-1, :] = differs(np.s_[:, :-1, :], np.s_[:, 1:, :])
  assert np.all((right | down)[edge])


def test_depth_discontinuities_are_edges(nyud):
  d, edge = nyud['depth'], nyud['edge'].astype(bool)
  jump_x = np.abs(d[:, :, :-1] - d[:, :, 1:]) > 1.0
  jump_y = np.abs(d[:, :-1, :] - d[:, 1:, :]) > 1.0
  assert jump_x.any() and jump_y.any()
  assert np.all(edge[:, :, :-1][jump_x])
  assert np.all(edge[:, :-1, :][jump_y])


def test_floor_gets_closer_towards_the_bottom(nyud):
  # NYU40 floor = 1 after the -1 shift; the floor plane's depth decreases with y.
  d, sem = nyud['depth'], nyud['semseg']
  both_floor = (sem[:, :-1, :] == 1) & (sem[:, 1:, :] == 1)
  assert both_floor.sum() > 1000
  assert np.all(d[:, 1:, :][both_floor] < d[:, :-1, :][both_floor])
  # Wall (0) and floor (1) exist in every room; the floor faces up (y = -1).
  assert np.all(np.any(sem == 0, axis=(1, 2))) and np.all(np.any(sem == 1, axis=(1, 2)))
  floor_n = nyud['normals'][sem == 1]  # (version 2's bumps leave edge-on planes flat)
  np.testing.assert_allclose(floor_n, np.broadcast_to([0., -1., 0.], floor_n.shape), atol=1e-6)


def test_image_is_shaded_by_the_labels(pascal):
  # The image is rendered from the labels: pixels of the same class under the
  # same normal look alike, pixels of different classes do not (beyond noise).
  img = pascal['image'].astype(np.float64)
  sem = pascal['semseg']
  per_class = [img[sem == c].mean(0) for c in range(1, 21) if np.sum(sem == c) > 200]
  spread = np.std(per_class, axis=0).mean()
  assert spread > 15.


# ----------------------------------------------------------------------------
# Determinism, splits, seeds, resolution, domains


@pytest.mark.parametrize('domain', DOMAINS)
def test_deterministic_in_domain_split_seed(domain):
  a = synthetic.generate(domain, 'train', 12, (32, 32), seed=3)
  b = synthetic.generate(domain, 'train', 12, (32, 32), seed=3)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  c = synthetic.generate(domain, 'train', 12, (32, 32), seed=4)
  t = synthetic.generate(domain, 'test', 12, (32, 32), seed=3)
  for other in (c, t):
    assert not np.array_equal(a['image'], other['image'])
    assert not np.array_equal(a['semseg'], other['semseg'])


@pytest.mark.parametrize('domain', DOMAINS)
def test_threads_do_not_change_the_scenes(domain):
  # Randomness is drawn before the threads render slices of the images: any number
  # of workers gives the same arrays as one, image by image.
  one = synthetic.generate(domain, 'train', 50, (24, 20), seed=2, workers=1)
  for workers in (2, 3):
    many = synthetic.generate(domain, 'train', 50, (24, 20), seed=2, workers=workers)
    assert many.keys() == one.keys()
    for k in one:
      assert many[k].dtype == one[k].dtype
      np.testing.assert_array_equal(many[k], one[k], err_msg=f'{k}, {workers} workers')
  # A prefix of the draws is not a smaller dataset's draws (tex is drawn last, over
  # all images), so slices must come from one draw: 16 images are not the first 16.
  few = synthetic.generate(domain, 'train', 16, (24, 20), seed=2, workers=1)
  assert not np.array_equal(few['image'], one['image'][:16])


def test_train_and_test_images_are_distinct(pascal, version):
  test = synthetic.generate('pascal', 'test', 50, RES, seed=0, version=version)
  train_flat = pascal['image'].reshape(N, -1)
  for img in test['image'].reshape(50, -1):
    assert not np.any(np.all(train_flat == img, axis=1))


@pytest.mark.parametrize('res', [(16, 16), (24, 40), (40, 24)])
def test_resolution_is_configurable(res):
  for domain in DOMAINS:
    x = synthetic.generate(domain, 'test', 3, res, seed=0)
    for k, v in x.items():
      assert v.shape[1:3] == res, (domain, k)


def test_domains_differ_in_statistics(pascal, nyud, version):
  mean_p = pascal['image'].reshape(-1, 3).mean(0)
  mean_n = nyud['image'].reshape(-1, 3).mean(0)
  mean_p_test = synthetic.generate('pascal', 'test', 100, RES, seed=1,
                                   version=version)['image'].reshape(-1, 3).mean(0)
  # Outdoor scenes are bluish (sky), indoor scenes warmer.
  assert mean_p[2] > mean_p[0] and mean_n[0] > mean_n[2]
  between = np.linalg.norm(mean_p - mean_n)
  within = np.linalg.norm(mean_p - mean_p_test)
  assert between > 5 * within and between > 15.
  # Label spaces: PASCAL 21 classes dominated by background 0, NYUD up to 40
  # classes with wall/floor the most common.
  assert pascal['semseg'].max() <= 20 and nyud['semseg'].max() > 20
  hist_n = np.bincount(nyud['semseg'].ravel(), minlength=40)
  assert set(np.argsort(hist_n)[-2:]) == {0, 1}
  assert np.bincount(pascal['semseg'].ravel()).argmax() == 0


def _chromaticity_gap(x) -> float:
  """The smallest distance between two object classes' mean chromaticity (colour with
  the brightness divided out: shading does not move it)."""
  img = x['image'].astype(np.float64)
  chrom = img / np.maximum(img.sum(-1, keepdims=True), 1.)
  sem = x['semseg']
  means = np.array([chrom[sem == c].mean(0) for c in range(1, 21) if np.any(sem == c)])
  d = np.linalg.norm(means[:, None] - means[None], axis=-1) + np.eye(len(means))
  return float(d.min())


def test_version_2_bumps_tilt_normals_in_the_tangent_plane():
  # n' = normalise(n + gx t1 + gy t2) turns n by atan(|g|) when that stays within 0.95
  # of n's elevation towards the camera, by atan(0.95 tan(elevation)) when not.
  rng = np.random.default_rng(0)
  n = rng.normal(size=(2, 3, 50, 3))
  n[..., 2] = np.abs(n[..., 2])
  n /= np.linalg.norm(n, axis=-1, keepdims=True)
  gx, gy = rng.normal(size=(2, 2, 3, 50)) * 0.5
  out = synthetic._bumped(n.astype(np.float32), gx, gy)
  turn = np.arccos(np.clip(np.sum(out * n, -1), -1., 1.))
  elev = np.arcsin(n[..., 2])
  want = np.minimum(np.arctan(np.hypot(gx, gy)), np.arctan(0.95 * np.tan(elev)))
  np.testing.assert_allclose(turn, want, atol=1e-5)  # float32 output
  assert np.all(out[..., 2] >= 0.)
  np.testing.assert_allclose(np.linalg.norm(out, axis=-1), 1., atol=1e-6)


def test_version_2_tells_classes_apart_by_appearance():
  # Version 2 gives every class its own hue (golden-ratio spread) and stripes; version
  # 1's random colours put some classes' hues within 0.02 of each other.
  v1 = synthetic.generate('pascal', 'train', N, RES, seed=0, version=1)
  v2 = synthetic.generate('pascal', 'train', N, RES, seed=0, version=2)
  assert _chromaticity_gap(v2) > 0.04 > _chromaticity_gap(v1)
  # Each class's texture: with the noise and bumps left out, brightness still varies
  # along an object's stripes, twice as much as across version 1's shaded plain ones.
  def within_objects(version):
    draw = synthetic._draw if version == 1 else synthetic._draw_v2
    d = draw('pascal', np.random.default_rng(0), 50, *RES)
    d['tex'] = np.zeros_like(d['tex'])
    if version == 2:
      d['bump_slope'] = np.zeros_like(d['bump_slope'])
    x = synthetic._render('pascal', d, *RES, version=version)
    img, sem = x['image'].astype(np.float64).sum(-1), x['semseg']
    same = (sem[:, :, 1:] == sem[:, :, :-1]) & (sem[:, :, 1:] > 0)
    return np.abs(np.diff(img, axis=2))[same].mean()

  assert within_objects(2) > 2 * within_objects(1)  # 33 vs 14 (v1: small shaded objects)


def _v3_render(domain, n=60, **zeroed):
  d = synthetic._draw_v3(domain, np.random.default_rng(1), n, *RES)
  for k in zeroed:
    d[k] = np.zeros_like(d[k]) if zeroed[k] is None else np.full_like(d[k], zeroed[k])
  return d, synthetic._render(domain, d, *RES, version=3)


@pytest.mark.parametrize('domain', DOMAINS)
def test_version_3_strokes_paint_the_image_only(domain):
  # The painted strokes are no boundary of anything: without them the labels are
  # the same, edges included, and the images differ only on the strokes' pixels.
  _, x = _v3_render(domain)
  _, bare = _v3_render(domain, stroke_width=-5.)
  for k in x:
    if k != 'image':
      np.testing.assert_array_equal(x[k], bare[k], err_msg=k)
  changed = np.any(x['image'] != bare['image'], -1).mean()
  assert 0.02 < changed < 0.2


@pytest.mark.parametrize('domain', DOMAINS)
def test_version_3_apparent_size_is_the_class_size_over_distance(domain):
  # Depth needs the class: an object's apparent height times its distance is its
  # class's physical size (up to the 0.85-1.15 jitter and the 0.5 clip).
  d = synthetic._draw_v3(domain, np.random.default_rng(0), 400, *RES)
  size = synthetic._classes_v3(domain)['size']
  z_min = 3. if domain == 'pascal' else 1.5
  for j in range(d['obj_classes'].shape[1]):
    ry, z0, cls = d[f'ry{j}'], d[f'z0{j}'], d['obj_classes'][:, j]
    ok = ry < 0.5
    ratio = ry[ok] * z0[ok] / (synthetic._V3['near_size'] * z_min * size[cls[ok]])
    assert ratio.min() > 0.85 - 1e-9 and ratio.max() < 1.15 + 1e-9
  assert size.max() / size[size < 1].min() > 2.


@pytest.mark.parametrize('domain', DOMAINS)
def test_version_3_normals_follow_the_class_shape(domain):
  # Without bumps: a convex class's normals turn right on its right half, a concave
  # one's left; a cylinder's have no vertical part; a plane's are one direction.
  _, x = _v3_render(domain, 120, bump_slope=None)
  attrs = synthetic._classes_v3(domain)
  sem, nrm = x['semseg'], x['normals']
  cols = np.broadcast_to(np.arange(RES[1]), sem.shape)
  seen = {0: [], 1: [], 2: [], 3: []}
  for i in range(len(sem)):
    for c in np.unique(sem[i]):
      m = sem[i] == c
      if c < (1 if domain == 'pascal' else 2) or m.sum() < 60:
        continue
      right = cols[i][m] > np.median(cols[i][m])
      nx = nrm[i][m][:, 0]
      seen[attrs['shape'][c]].append((nx[right].mean() - nx[~right].mean(),
                                      np.abs(nrm[i][m][:, 1]).max(), nrm[i][m].std(0).max()))
  conv, conc, cyl, plane = (np.array(seen[k]) for k in range(4))
  assert min(map(len, seen.values())) >= 3
  # (all but a few partly hidden ones, whose visible part may be one side)
  assert np.mean(conv[:, 0] > 0.1) > 0.9 and np.mean(conc[:, 0] < -0.1) > 0.9
  assert np.all(cyl[:, 1] < 1e-4) and np.all(plane[:, 2] < 1e-4)  # float32 rounding


@pytest.mark.parametrize('domain', DOMAINS)
def test_version_4_decals_paint_the_image_only(domain):
  # Version 4 draws version 3's scenes and paints patches over them: every label is
  # version 3's, bit for bit, and the images differ only inside the patches (not on
  # PASCAL's sky), where an object's colour and another's stripes show.
  v3 = synthetic.generate(domain, 'train', 60, RES, seed=2, version=3)
  v4 = synthetic.generate(domain, 'train', 60, RES, seed=2, version=4)
  for k in v3:
    if k != 'image':
      np.testing.assert_array_equal(v3[k], v4[k], err_msg=k)
  d = synthetic._draw_v4(domain, synthetic._rng(domain, 'train', 2), 60, *RES)
  yy, xx = np.meshgrid((np.arange(RES[0]) + .5) / RES[0], (np.arange(RES[1]) + .5) / RES[1],
                       indexing='ij')
  (cy, cx), (ry, rx) = (np.moveaxis(d[k], -1, 0)[..., None, None]
                        for k in ('decal_centre', 'decal_radii'))
  patch = np.any(((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 < 1., axis=1)
  changed = np.any(v3['image'] != v4['image'], -1)
  assert not np.any(changed & ~patch)
  assert 0.5 < changed.sum() / patch.sum() <= 1.
  if domain == 'pascal':
    sky = (v3['semseg'] == 0) & (yy[None] < d['horizon'])
    assert not np.any(changed & sky)


def test_unknown_domain_or_split_raises_config_error():
  with pytest.raises(ConfigError, match="'pascal'"):
    synthetic.generate('cityscapes', 'train', 2)
  with pytest.raises(ConfigError, match="'test'"):
    synthetic.generate('pascal', 'val', 2)
  with pytest.raises(ConfigError, match='synthetic version'):
    synthetic.generate('pascal', 'train', 2, version=max(synthetic.VERSIONS) + 1)
