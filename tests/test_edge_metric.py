"""Edge odsF (SEISM replacement): NMS, thinning, one-to-one matching and dataset pooling."""

import math

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from fedjax_mtl.metrics import edge as E


def _ods(pred, gt, max_dist=E.PASCAL_MAX_DIST, valid_mask=None, **kw):
    acc = E.EdgeODSAccumulator(max_dist=max_dist, **kw)
    acc.update(pred, gt, valid_mask)
    return acc.finalize()


def _vertical_line(h=100, w=100, col=50):
    g = np.zeros((h, w), np.uint8)
    g[10 : h - 10, col] = 1
    return g


def _shapes(size=128):
    g = np.zeros((size, size), np.uint8)
    g[20:100, 30] = 1
    g[20, 30:90] = 1
    g[100, 30:91] = 1
    g[20:101, 90] = 1
    for i in range(40):
        g[40 + i, 45 + i // 2] = 1
    return g


# ----------------------------------------------------------------------- pooling


def test_default_thresholds_match_seism():
    t = E.default_thresholds(99)
    np.testing.assert_allclose(t, np.linspace(0.01, 0.99, 99), atol=1e-15)
    assert t[6] == 0.07 and t[19] == 0.2  # the doubles SEISM parses from "0.07", "0.20"


def test_perfect_prediction_full_pipeline():
    g = np.zeros((128, 128), np.uint8)
    g[15:110, 20] = 1  # vertical line
    for i in range(60):
        g[30 + i, 40 + i // 2] = 1  # slanted line
    yy, xx = np.mgrid[:128, :128]
    g[np.abs(np.hypot(yy - 64, xx - 90) - 15) < 0.5] = 1  # circle
    r = _ods(g.astype(np.float64), g)
    assert r["odsF"] == 1.0 and r["precision"] == 1.0 and r["recall"] == 1.0
    assert r["oisF"] == 1.0


def test_perfect_prediction_without_nms_and_with_corners():
    g = _shapes()
    assert _ods(g.astype(np.float64), g, apply_nms=False, apply_thin=False)["odsF"] == 1.0
    # Through NMS, line ends and junctions lose a pixel or two, as with edgesNmsMex.
    assert _ods(g.astype(np.float64), g)["odsF"] > 0.98


@pytest.mark.parametrize("axis", [0, 1])
def test_shift_inside_and_outside_tolerance(axis):
    g = _vertical_line()
    best = 1.0
    if axis == 0:
        # Horizontal line: edgesNms leaves the 3-px presmoothed band (its Oxy == 0 case) and
        # bwmorph thin shortens the band's skeleton by one pixel at each end: 78/80 pixels.
        g = g.T.copy()
        best = 2 * (78 / 80) / (1 + 78 / 80)
    max_dist = 0.03  # 0.03 * hypot(100, 100) = 4.24 px
    for k in range(0, 5):
        r = _ods(np.roll(g, k, axis=axis).astype(np.float64), g, max_dist)
        assert r["odsF"] == pytest.approx(best), k
    for k in (5, 7):
        assert _ods(np.roll(g, k, axis=axis).astype(np.float64), g, max_dist)["odsF"] == 0.0, k


def test_empty_prediction_and_empty_gt_no_nan():
    g = _vertical_line()
    empty = np.zeros_like(g, dtype=np.float64)
    for pred, gt in [(empty, g), (g.astype(np.float64), np.zeros_like(g)), (empty, np.zeros_like(g))]:
        r = _ods(pred, gt)
        assert r["odsF"] == 0.0 and r["oisF"] == 0.0
        assert all(math.isfinite(v) for v in r.values())
    acc = E.EdgeODSAccumulator()
    r = acc.finalize()  # nothing accumulated at all
    assert r["odsF"] == 0.0 and r["num_images"] == 0
    curves = acc.curves()
    assert np.all(np.isfinite(curves["F"]))


def test_empty_gt_image_only_costs_precision():
    g = _vertical_line()
    acc = E.EdgeODSAccumulator(max_dist=0.03)
    acc.update(g.astype(np.float64), g)
    acc.update(g.astype(np.float64), np.zeros_like(g))  # all predictions are false positives
    r = acc.finalize()
    assert r["recall"] == 1.0 and r["precision"] == pytest.approx(0.5)
    assert r["odsF"] == pytest.approx(2 / 3)
    # OIS: an image without gt has F = 0 at every threshold and, as in SEISM general_ois
    # (first maximum), contributes its lowest-threshold counts.
    assert 0.6 < r["oisF"] <= 2 / 3


def test_hand_computed_small_case():
    g = np.zeros((20, 20), np.uint8)
    g[10, 8:11] = 1  # 3-pixel gt line
    p = np.zeros((20, 20))
    p[10, 8:10] = 1.0  # hits two of them
    p[2, 2] = 1.0  # one false positive far away
    c = E.image_counts(p, g, 0.05, E.default_thresholds(9), apply_nms=False, apply_thin=False)
    np.testing.assert_array_equal(c, np.tile([2, 3, 2, 3], (9, 1)))
    r = _ods(p, g, 0.05, apply_nms=False, apply_thin=False)
    assert r["precision"] == pytest.approx(2 / 3) and r["recall"] == pytest.approx(2 / 3)
    assert r["odsF"] == pytest.approx(2 / 3)


def test_probabilities_select_threshold():
    g = np.zeros((20, 20), np.uint8)
    g[10, 5:15] = 1
    p = np.zeros((20, 20))
    p[10, 5:15] = 0.8
    p[3, 3:8] = 0.3  # weak false positives: dropped above threshold 0.3
    r = _ods(p, g, 0.05, apply_nms=False, apply_thin=False, quantize=False)
    assert r["odsF"] == 1.0 and 0.3 < r["threshold"] <= 0.8
    c = E.image_counts(p, g, 0.05, np.array([0.2, 0.5, 0.9]), apply_nms=False, apply_thin=False, quantize=False)
    np.testing.assert_array_equal(c, [[10, 10, 10, 15], [10, 10, 10, 10], [0, 10, 0, 0]])


def test_matching_is_one_to_one():
    g = np.zeros((30, 30), np.uint8)
    g[15, 15] = 1
    p = np.zeros((30, 30))
    p[15, 15] = p[15, 16] = 1.0  # two predictions next to a single gt pixel
    c = E.image_counts(p, g, 0.05, np.array([0.5]), apply_nms=False, apply_thin=False)
    np.testing.assert_array_equal(c, [[1, 1, 1, 2]])
    for method in ("max_cardinality", "min_cost"):
        mp, mg = E.correspond_pixels(p > 0, g > 0, 0.05, method=method)
        assert mp.sum() == 1 and mg.sum() == 1
    mp, _ = E.correspond_pixels(p > 0, g > 0, 0.05, method="min_cost")
    assert mp[15, 15]  # the closer one


def test_tolerance_is_relative_to_diagonal_and_inclusive():
    g = np.zeros((30, 40), np.uint8)  # diagonal 50 px
    g[15, 10] = 1
    p = np.zeros((30, 40), bool)
    p[15, 13] = True  # 3 px away
    assert E.correspond_pixels(p, g, 3 / 50)[0].sum() == 1  # d <= maxDist counts
    assert E.correspond_pixels(p, g, 2.9 / 50)[0].sum() == 0


def test_matching_equals_reference_assignment():
    rng = np.random.default_rng(0)
    for trial in range(6):
        p = rng.random((24, 24)) < 0.15
        g = rng.random((24, 24)) < 0.1
        md = 0.03 + 0.02 * trial  # 1.0 .. 5.1 px
        radius = md * math.hypot(24, 24)
        py, px = np.nonzero(p)
        gy, gx = np.nonzero(g)
        d = np.hypot(py[:, None] - gy[None, :], px[:, None] - gx[None, :])
        # Dense reference: matches cost 0, non-edges 1, so min cost = n - max matching.
        cost = np.where(d <= radius, 0.0, 1.0)
        r, c = linear_sum_assignment(cost)
        expected = int((cost[r, c] == 0).sum())
        for method in ("max_cardinality", "min_cost"):
            mp, mg = E.correspond_pixels(p, g, md, method=method)
            assert mp.sum() == mg.sum() == expected, (trial, method)
            assert not (mp & ~p).any() and not (mg & ~g).any()
        # min_cost: minimum total distance among maximum matchings.
        big = 1e3
        cost_d = np.where(d <= radius, d, big)
        r, c = linear_sum_assignment(cost_d)
        ok = cost_d[r, c] < big
        mp, mg = E.correspond_pixels(p, g, md, method="min_cost")
        pairs = E._candidate_pairs((py, px), (gy, gx), p.shape, radius)
        match = E._min_cost(*pairs, py.size, gy.size)
        got = d[np.flatnonzero(match >= 0), match[match >= 0]].sum()
        assert got == pytest.approx(cost_d[r, c][ok].sum(), abs=1e-9)


def test_batched_counts_equal_per_threshold_reference():
    rng = np.random.default_rng(1)
    yy, xx = np.mgrid[:48, :48]
    g = (np.abs(np.hypot(yy - 24, xx - 20) - 12) < 0.5).astype(np.uint8)
    g[5:40, 40] = 1
    pred = np.clip(0.9 * np.exp(-((np.hypot(yy - 25, xx - 21) - 12) ** 2) / 3) + 0.4 * rng.random((48, 48)), 0, 1)
    thr = np.array([0.05, 0.2, 0.4, 0.6, 0.8])
    counts = E.image_counts(pred, g, 0.05, thr)
    e = E.nms(np.floor(pred * 255) / 255)
    e = np.floor(e * 255 + 0.5) / 255
    for k, t in enumerate(thr):
        b = E.thin(e >= t)
        mp, mg = E.correspond_pixels(b, g, 0.05)
        np.testing.assert_array_equal(counts[k], [mg.sum(), g.sum(), mp.sum(), b.sum()])


def test_valid_mask_crop_and_ignore_label():
    g = _shapes(128)
    p = g.astype(np.float64)
    base = E.image_counts(p, g, E.PASCAL_MAX_DIST, E.default_thresholds(9))
    # Pad as the data pipeline does: gt 255 outside, prediction garbage outside.
    gp = np.full((150, 160), 255, np.uint8)
    gp[10:138, 15:143] = g
    pp = np.ones((150, 160))
    pp[10:138, 15:143] = p
    valid = gp != 255
    padded = E.image_counts(pp, gp, E.PASCAL_MAX_DIST, E.default_thresholds(9), valid_mask=valid)
    np.testing.assert_array_equal(padded, base)
    # Ignore pixels inside the image: neither gt nor prediction there counts.
    gi = g.copy()
    gi[:, :60] = 255
    c = E.image_counts(p, gi, E.PASCAL_MAX_DIST, E.default_thresholds(9), apply_nms=False, apply_thin=False)
    n_right = int(g[:, 60:].sum())
    np.testing.assert_array_equal(c[:, 1], n_right)
    np.testing.assert_array_equal(c[:, 3], n_right)


def test_larger_tolerance_never_lowers_f_and_ois_at_least_ods():
    rng = np.random.default_rng(2)
    preds, gts = [], []
    for _ in range(3):
        g = np.zeros((64, 64), np.uint8)
        g[8:56, rng.integers(10, 54)] = 1
        p = np.roll(g, int(rng.integers(-2, 3)), axis=1) * rng.uniform(0.3, 1.0) + 0.2 * rng.random((64, 64))
        preds.append(p)
        gts.append(g)
    f = []
    for md in (0.0075, 0.02, 0.04):
        acc = E.EdgeODSAccumulator(max_dist=md)
        acc.update(np.stack(preds), np.stack(gts))
        r = acc.finalize()
        assert r["oisF"] >= r["odsF"] - 1e-12 and r["num_images"] == 3
        f.append(r["odsF"])
    assert f[0] <= f[1] <= f[2]


def test_merge_and_parallel_match_sequential():
    g = _vertical_line(64, 64, 30)
    preds = [np.roll(g, k, axis=1) * 0.9 for k in range(4)]
    seq = E.EdgeODSAccumulator(max_dist=0.03)
    for p in preds:
        seq.update(p, g)
    a, b = E.EdgeODSAccumulator(max_dist=0.03), E.EdgeODSAccumulator(max_dist=0.03)
    a.update_many(preds[:2], [g, g])
    b.update_many(preds[2:], [g, g])
    a.merge(b)
    np.testing.assert_array_equal(a.counts, seq.counts)
    assert a.finalize() == seq.finalize()
    par = E.EdgeODSAccumulator(max_dist=0.03, num_workers=2)
    par.update_many(preds, [g] * 4)
    np.testing.assert_array_equal(par.counts, seq.counts)
    par.close()


# --------------------------------------------------------------------- NMS/thin


def _blurred_band(n=40):
    band = np.zeros((n, n), np.float32)
    band[:, 18:23] = [0.3, 0.6, 1.0, 0.6, 0.3]  # 5 px wide, peak at column 20
    return band


def test_nms_thins_blurred_vertical_line_to_one_pixel():
    out = E.nms(_blurred_band())
    inner = out[6:-6]  # away from the s=5 border ramp
    assert np.all((inner > 0).sum(axis=1) == 1)
    assert np.all(np.argmax(inner, axis=1) == 20)


def test_nms_thins_blurred_diagonal_line():
    yy, xx = np.mgrid[:40, :40]
    band = np.clip(1 - np.abs(yy - xx) / np.sqrt(2) / 2.5, 0, 1).astype(np.float32)
    out = E.nms(band)
    inner = out[6:-6]
    assert np.all((inner > 0).sum(axis=1) == 1)
    assert np.all(np.nonzero(inner)[1] == np.arange(6, 34))


def test_nms_border_ramp_and_small_inputs():
    out = E.nms(np.ones((20, 20), np.float32), r=1, presmooth=0)
    assert np.all(out[0] == 0) and np.all(out[:, -1] == 0)
    np.testing.assert_allclose(out[10, :5], [0, 0.2, 0.4, 0.6, 0.8], rtol=1e-6)
    assert E.nms(np.ones((1, 5))).shape == (1, 5)


def test_horizontal_band_is_thinned_by_bwmorph_thin():
    band = _blurred_band().T
    assert np.all(E.thin(band > 0)[3:-3].sum(axis=0)[3:-3] == 1)


def test_thin_properties():
    line = np.zeros((20, 20), bool)
    line[5, 3:17] = True
    np.testing.assert_array_equal(E.thin(line), line)  # already thin: unchanged, ends kept
    thick = np.zeros((20, 20), bool)
    thick[5:7, 3:17] = True  # 2-px thick
    t = E.thin(thick)
    assert t.sum() >= 12 and np.all(t.sum(axis=0)[4:16] == 1)
    blob = np.zeros((30, 30), bool)
    blob[5:25, 8:22] = True
    t = E.thin(blob)
    np.testing.assert_array_equal(E.thin(t), t)  # converged
    assert 0 < t.sum() < 40


def _naive_thin(b):
    """Full-image parallel thinning with the same tables (every pixel, every subiteration)."""
    import scipy.ndimage as ndi

    weights = np.array([[8, 4, 2], [16, 0, 1], [32, 64, 128]])  # NW N NE / W . E / SW S SE
    b = b.astype(np.uint8).copy()
    while True:
        before = b.sum()
        for lut in (E._THIN_LUT1, E._THIN_LUT2):
            code = ndi.correlate(b.astype(np.int32), weights, mode="constant")
            b[lut[code] & (b == 1)] = 0
        if b.sum() == before:
            return b.astype(bool)


def test_thin_matches_full_evaluation_reference():
    rng = np.random.default_rng(3)
    for density in (0.2, 0.5, 0.8):
        b = rng.random((40, 50)) < density
        np.testing.assert_array_equal(E.thin(b), _naive_thin(b))
