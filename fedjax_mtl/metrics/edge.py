"""Edge detection odsF in NumPy/SciPy: a Python replacement for the MATLAB SEISM pipeline.

FedHCA² (and InvPT / TaskPrompter / MTI-Net before it) scores edges with the MATLAB
fork ``innovator-zero/seism``. Per image, that pipeline does:

1. ``nms_process.m``: ``x = png / 255``; ``E = convTri(x, 1)``; orientation ``O`` from the
   second derivatives of ``convTri(E, 4)``; ``E = edgesNmsMex(E, O, r=4, s=5, m=1.01)``;
   save ``uint8(E * 255)`` as a PNG.
2. For each threshold t in 0.01, 0.02, ..., 0.99 (``parameters.txt``):
   ``read_one_png`` binarises ``png / 255 >= t``; ``edgesEvalImg`` thins the binary map
   with ``bwmorph(.., 'thin', Inf)`` and runs BSDS ``correspondPixels`` against the ground
   truth with ``maxDist`` (0.0075 PASCAL-Context, 0.011 NYUD-v2, as a fraction of the
   image diagonal). This gives cntR, sumR, cntP, sumP per image and threshold.
3. ``gather_measure.m``: counts are summed over the dataset; P = cntP/sumP, R = cntR/sumR,
   F = 2PR/(P+R) per threshold; ODS = the max F over thresholds (no interpolation
   between thresholds, unlike BSDS ``collect_eval_bdry``). ``general_ois.m``: OIS takes
   each image's best threshold and pools the counts at those thresholds.

This module implements every step, vectorised, in NumPy/SciPy:

* ``nms``: Piotr Dollár's ``edgesNmsMex`` exactly as written in C (bilinear interpolation
  with the same clamping, the ``e * m < e0`` test at offsets ±1..±r along the normal,
  and the linear ramp to zero over the ``s`` border pixels), with ``convTri`` (triangle
  filter, 'symmetric' padding) and ``gradient2`` (central differences, one-sided at the
  border). Float32 like MATLAB ``single``.
* ``thin``: ``bwmorph(.., 'thin', Inf)``, i.e. the parallel two-subiteration thinning of
  Lam, Lee & Suen (1992, p. 879, conditions G1, G2, G3 / G3'), iterated to convergence.
* ``correspond_pixels``: a one-to-one matching of boundary pixels within the tolerance
  (see its docstring for how it relates to BSDS's min-cost assignment).
* ``EdgeODSAccumulator``: the dataset-level pooling, ODS and OIS.

Known, deliberate differences to the MATLAB tool chain (all small):
* BSDS ``correspondPixels`` solves a min-cost assignment whose outlier edges are a
  random sparse subset; the counts it returns are those of a maximum-cardinality
  matching (an extra match always saves ``outlierCost - dist > 0``). The accumulator
  therefore computes an exact maximum matching (Dinic max-flow; deterministic).
* PNG round-trips are emulated by ``quantize=True`` (floor to 1/255 for the saved
  prediction, round for the saved NMS output), but nothing else of MATLAB's I/O.
* Ignore pixels (gt == 255) and padding (``valid_mask``) do not exist in SEISM; here the
  map is cropped to the bounding box of ``valid_mask`` (the maxDist diagonal is the
  crop's) and ignore pixels are removed from both prediction and ground truth.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import scipy.ndimage as ndi
import scipy.sparse as sp
from scipy.sparse import csgraph

from fedjax_mtl.hostmem import host_cores  # noqa: F401  (exported: the odsF pool's default)

__all__ = [
    "PASCAL_MAX_DIST",
    "NYUD_MAX_DIST",
    "default_thresholds",
    "conv_tri",
    "edge_orientation",
    "nms",
    "thin",
    "correspond_pixels",
    "image_counts",
    "ods_from_counts",
    "EdgeODSAccumulator",
    "CountsPool",
    "host_cores",
]

PASCAL_MAX_DIST = 0.0075
NYUD_MAX_DIST = 0.011

# edgesNmsMex arguments used by innovator-zero/seism nms_process.m (Dollár's own
# edgesDetect uses r=1; HED/RCF scripts use r=2 or 4).
NMS_RADIUS = 4
NMS_BORDER = 5
NMS_MULTIPLIER = 1.01
NMS_PRESMOOTH = 1  # convTri(x, 1) before the orientation and the NMS
ORIENT_SMOOTH = 4  # convTri(E, 4) for the orientation


def default_thresholds(num_thresholds: int = 99) -> np.ndarray:
    """Returns linspace(1/(T+1), 1-1/(T+1), T) as k/(T+1) (0.01..0.99 for T=99, as SEISM)."""
    k = np.arange(1, num_thresholds + 1, dtype=np.float64)
    # k/(T+1) is the correctly rounded double of the decimal SEISM parses ("0.07").
    return k / (num_thresholds + 1)


# ----------------------------------------------------------------------------- NMS


def conv_tri(image: np.ndarray, r: float) -> np.ndarray:
    """Returns Dollár's convTri: a separable triangle filter of radius r, 'symmetric' padding."""
    if r == 0:
        return np.array(image, copy=True)
    if r <= 1:
        # convTri1: [1 p 1]/(2+p) approximates a triangle of fractional radius.
        p = 12.0 / r / (r + 2.0) - 2.0
        f = np.array([1.0, p, 1.0]) / (2.0 + p)
    else:
        if r != int(r):
            raise ValueError(f"conv_tri: radius > 1 must be an integer, got {r}")
        ri = int(r)
        f = np.concatenate([np.arange(1, ri + 2), np.arange(ri, 0, -1)]).astype(np.float64) / (ri + 1) ** 2
    # scipy 'reflect' (d c b a | a b c d) is MATLAB padarray 'symmetric'.
    out = ndi.convolve1d(image, f, axis=0, mode="reflect")
    return ndi.convolve1d(out, f, axis=1, mode="reflect")


def _gradient2(image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Returns (Gx, Gy) like Dollár's gradient2 (= MATLAB gradient): central, one-sided at borders."""
    gy, gx = np.gradient(image)
    return gx, gy


def edge_orientation(edge: np.ndarray, smooth: int = ORIENT_SMOOTH) -> np.ndarray:
    """Returns O = mod(atan(Oyy*sign(-Oxy)/(Oxx+1e-5)), pi), the edge normal angle of edgesDetect."""
    ox, oy = _gradient2(conv_tri(edge, smooth))
    oxx, _ = _gradient2(ox)
    oxy, oyy = _gradient2(oy)
    with np.errstate(divide="ignore", invalid="ignore"):
        o = np.arctan(oyy * np.sign(-oxy) / (oxx + np.float32(1e-5)))
    # 0/0 (Oyy*sign(-Oxy) == 0 and Oxx == -1e-5) is NaN; MATLAB then reads undefined memory
    # in edgesNmsMex. Use 0 (compare along x), which is what a zero numerator gives elsewhere.
    return np.nan_to_num(np.mod(o, np.pi), nan=0.0).astype(np.float32)


def _nms_core(e0: np.ndarray, o: np.ndarray, r: int, s: int, m: float) -> np.ndarray:
    """Returns edgesNmsMex(E0, O, r, s, m) (Dollár's C code, vectorised over pixels)."""
    h, w = e0.shape
    out = e0.copy()
    ys, xs = np.nonzero(e0)
    if ys.size and r > 0:
        e = e0[ys, xs] * np.float32(m)
        coso = np.cos(o[ys, xs]).astype(np.float32)
        sino = np.sin(o[ys, xs]).astype(np.float32)
        xf = xs.astype(np.float32)
        yf = ys.astype(np.float32)
        active = np.arange(ys.size)  # pixels not yet suppressed (the C loop breaks at the first hit)
        for d in range(-r, r + 1):
            if d == 0 or active.size == 0:
                continue
            # interp(): clamp to [0, w-1.001] so that x0+1 stays inside, then bilinear.
            x = np.clip(xf[active] + np.float32(d) * coso[active], np.float32(0.0), np.float32(w - 1.001))
            y = np.clip(yf[active] + np.float32(d) * sino[active], np.float32(0.0), np.float32(h - 1.001))
            x0 = x.astype(np.int64)
            y0 = y.astype(np.int64)
            dx0 = x - x0
            dy0 = y - y0
            dx1 = np.float32(1.0) - dx0
            dy1 = np.float32(1.0) - dy0
            v = (
                e0[y0, x0] * dx1 * dy1
                + e0[y0, x0 + 1] * dx0 * dy1
                + e0[y0 + 1, x0] * dx1 * dy0
                + e0[y0 + 1, x0 + 1] * dx0 * dy0
            )
            hit = e[active] < v
            out[ys[active[hit]], xs[active[hit]]] = 0
            active = active[~hit]
    # Suppress noisy estimates near the image boundary: weight x/s for the s outer pixels.
    s = min(s, w // 2)
    s = min(s, h // 2)
    if s > 0:
        ramp = np.arange(s, dtype=np.float32) / np.float32(s)
        wx = np.ones(w, dtype=np.float32)
        wx[:s] = ramp
        wx[w - s :] = ramp[::-1]
        wy = np.ones(h, dtype=np.float32)
        wy[:s] = ramp
        wy[h - s :] = ramp[::-1]
        out *= wy[:, None]
        out *= wx[None, :]
    return out


def nms(
    edge_prob: np.ndarray,
    r: int = NMS_RADIUS,
    s: int = NMS_BORDER,
    m: float = NMS_MULTIPLIER,
    presmooth: float = NMS_PRESMOOTH,
) -> np.ndarray:
    """Returns the NMS-thinned edge map of seism's nms_process.m (convTri, orientation, edgesNmsMex).

    Steps, all in float32 as MATLAB ``single``:
      E = convTri(edge_prob, presmooth)                  (skipped if presmooth == 0)
      O = mod(atan(Oyy*sign(-Oxy)/(Oxx+1e-5)), pi)       from gradient2 of convTri(E, 4)
      a pixel with E > 0 is zeroed if m*E < E(p + d*(cos O, sin O)) for any d in ±1..±r
      (bilinear interpolation, coordinates clamped to [0, size-1.001]);
      finally the s outer rows/columns are multiplied by a ramp 0, 1/s, ..., (s-1)/s.
    Note (inherited from edgesNms): where Oxy == 0 exactly (e.g. a perfectly horizontal,
    x-invariant line) O is 0 and the comparison runs along the line, so such a line is not
    thinned here; ``thin`` (bwmorph) later reduces it to one pixel, as in SEISM.
    """
    e = np.asarray(edge_prob, dtype=np.float32)
    if e.ndim != 2:
        raise ValueError(f"nms expects a 2-D map, got shape {e.shape}")
    if min(e.shape) < 2:
        # gradient2 and the bilinear interpolation need two pixels along each axis.
        return e.copy()
    if presmooth:
        e = conv_tri(e, presmooth).astype(np.float32)
    o = edge_orientation(e)
    return _nms_core(e, o, int(r), int(s), float(m))


# ------------------------------------------------------------------------ thinning


def _thin_luts() -> tuple[np.ndarray, np.ndarray]:
    """Returns the deletion tables of the two Lam-Lee-Suen subiterations over 8-neighbour codes."""
    # Bit k of the code is neighbour x_{k+1}: E, NE, N, NW, W, SW, S, SE (counter-clockwise).
    codes = np.arange(256)
    b = [((codes >> k) & 1).astype(bool) for k in range(8)]
    crossing = sum((~b[i]) & (b[i + 1] | b[(i + 2) % 8]) for i in (0, 2, 4, 6))  # X_H(p)
    n1 = sum(b[k] | b[k + 1] for k in (0, 2, 4, 6))
    n2 = sum(b[k + 1] | b[(k + 2) % 8] for k in (0, 2, 4, 6))
    nmin = np.minimum(n1, n2)
    g12 = (crossing == 1) & (nmin >= 2) & (nmin <= 3)
    g3 = ~((b[1] | b[2] | ~b[7]) & b[0])
    g3p = ~((b[5] | b[6] | ~b[3]) & b[4])
    return g12 & g3, g12 & g3p


_THIN_LUT1, _THIN_LUT2 = _thin_luts()
_THIN_WEIGHTS = np.array([1, 2, 4, 8, 16, 32, 64, 128], dtype=np.int32)


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """Returns the sorted distinct values of an int array (np.unique's hash path is slow here)."""
    a = np.sort(a)
    return a[np.concatenate(([True], a[1:] != a[:-1]))] if a.size else a


def _thin_flat(pad: np.ndarray, idx: np.ndarray, width: int, max_iter: int | None = None) -> np.ndarray:
    """Thins the foreground pixels idx of the zero-bordered flat image pad in place; returns survivors."""
    offsets = np.array([1, 1 - width, -width, -width - 1, -1, width - 1, width, width + 1], dtype=np.int64)
    luts = (_THIN_LUT1, _THIN_LUT2)
    # A pixel's verdict under a table only changes when its neighbourhood changes, so after
    # the first pass each subiteration re-evaluates only the neighbours of recent deletions.
    # This gives exactly the result of evaluating every pixel in every subiteration.
    pending = [idx, idx]  # per table: fg pixels whose neighbourhood changed since its last pass
    is_all = [True, True]  # pending[k] is still the full initial set (skip the union)
    it = 0
    while (pending[0].size or pending[1].size) and (max_iter is None or it < max_iter):
        it += 1
        for k, lut in enumerate(luts):
            cand = pending[k]
            cand = cand[pad[cand] == 1]
            code = pad[cand[:, None] + offsets[None, :]].astype(np.int32) @ _THIN_WEIGHTS
            dele = cand[lut[code]]
            pad[dele] = 0  # parallel subiteration: all verdicts came from the same state
            nb = (dele[:, None] + offsets[None, :]).ravel()
            nb = _sorted_unique(nb[pad[nb] == 1])
            pending[k], is_all[k] = nb, False
            if not is_all[1 - k] and nb.size:
                pending[1 - k] = _sorted_unique(np.concatenate([pending[1 - k], nb]))
    return idx[pad[idx] == 1]


def thin(bmap: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """Returns bwmorph(bmap, 'thin', Inf): Lam-Lee-Suen parallel thinning until convergence."""
    b = np.asarray(bmap).astype(bool)
    if b.ndim != 2:
        raise ValueError(f"thin expects a 2-D map, got shape {b.shape}")
    h, w = b.shape
    pad = np.zeros((h + 2, w + 2), dtype=np.uint8)
    pad[1:-1, 1:-1] = b
    flat = pad.reshape(-1)
    idx = np.flatnonzero(flat)
    _thin_flat(flat, idx, w + 2, max_iter)
    return pad[1:-1, 1:-1].astype(bool)


# ------------------------------------------------------------------------ matching


def _disk_offsets(radius: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns integer offsets (dy, dx) with dy^2+dx^2 <= radius^2 and their lengths."""
    ri = int(math.ceil(radius))
    dy, dx = np.mgrid[-ri : ri + 1, -ri : ri + 1]
    d2 = (dy * dy + dx * dx).astype(np.float64)
    keep = d2 <= radius * radius  # BSDS: skip if d2 > maxDist^2
    return dy[keep], dx[keep], np.sqrt(d2[keep])


def _candidate_pairs(
    a_yx: tuple[np.ndarray, np.ndarray],
    b_yx: tuple[np.ndarray, np.ndarray],
    shape: tuple[int, int],
    radius: float,
    chunk_elems: int = 1 << 22,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns all pairs (i, j, dist) of points a_i, b_j at distance <= radius on the pixel grid."""
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64))
    na, nb = a_yx[0].size, b_yx[0].size
    if na == 0 or nb == 0 or radius < 0:
        return empty
    swap = na > nb  # iterate over the smaller set, look the other one up in an id image
    (qy, qx), (ty, tx) = (b_yx, a_yx) if swap else (a_yx, b_yx)
    dy, dx, dist = _disk_offsets(radius)
    ri = int(math.ceil(radius))
    h, w = shape
    pw = w + 2 * ri
    ids = np.full((h + 2 * ri) * pw, -1, dtype=np.int64)
    ids[(ty + ri) * pw + (tx + ri)] = np.arange(ty.size)
    q_flat = (qy + ri) * pw + (qx + ri)
    off = dy * pw + dx
    step = max(1, chunk_elems // max(1, off.size))
    qi_all, ti_all, d_all = [], [], []
    for start in range(0, q_flat.size, step):
        hits = ids[q_flat[start : start + step, None] + off[None, :]]
        qi, k = np.nonzero(hits >= 0)
        qi_all.append(qi + start)
        ti_all.append(hits[qi, k])
        d_all.append(dist[k])
    qi, ti, d = np.concatenate(qi_all), np.concatenate(ti_all), np.concatenate(d_all)
    return (ti, qi, d) if swap else (qi, ti, d)


def _max_flow_matching(
    pi: np.ndarray, gj: np.ndarray, n_pred: int, n_gt: int, sources: np.ndarray | None = None, pairs: bool = False
) -> int | np.ndarray:
    """Returns the maximum matching size of edges (pi, gj) (or, with pairs=True, per-pred gt index or -1).

    Solved as a unit-capacity max-flow source -> pred -> gt -> sink with Dinic's algorithm.
    scipy's ``maximum_bipartite_matching`` (Hopcroft-Karp) is not used: its DFS never marks
    dead ends (scipy issue gh-26147) and takes seconds to minutes on the layered graphs that
    two nearby boundary curves form; Dinic stays at milliseconds on the same graphs.
    ``sources`` restricts the pred nodes that may be matched (default: all).
    """
    if pi.size == 0 or n_pred == 0 or n_gt == 0:
        return np.full(n_pred, -1, dtype=np.int64) if pairs else 0
    src = np.arange(n_pred) if sources is None else sources
    n = n_pred + n_gt + 2
    s, t = n - 2, n - 1
    rows = np.concatenate([pi, n_pred + np.arange(n_gt), np.full(src.size, s)])
    cols = np.concatenate([n_pred + gj, np.full(n_gt, t), src])
    graph = sp.csr_array((np.ones(rows.size, dtype=np.int32), (rows, cols)), shape=(n, n))
    res = csgraph.maximum_flow(graph, s, t, method="dinic")
    if not pairs:
        return int(res.flow_value)
    flow = res.flow.tocoo()
    sel = (flow.data > 0) & (flow.row < n_pred) & (flow.col >= n_pred) & (flow.col < n_pred + n_gt)
    match = np.full(n_pred, -1, dtype=np.int64)
    match[flow.row[sel]] = flow.col[sel] - n_pred
    return match


def _min_cost(pi: np.ndarray, gj: np.ndarray, dist: np.ndarray, n_pred: int, n_gt: int) -> np.ndarray:
    """Returns, per predicted node, the matched gt node or -1 for the max-cardinality, min-distance matching."""
    if pi.size == 0:
        return np.full(n_pred, -1, dtype=np.int64)
    # Square assignment with outlier nodes, as BSDS: left = pred + gt-outliers, right = gt +
    # pred-outliers. A pred (gt) pixel left unmatched takes its own outlier at cost `oc`;
    # for every real edge (i, j) the outliers of j and i may pair at cost 1, so any matching
    # of real pixels extends to a perfect one. With real edges costing dist + 1, a matching M
    # costs sum(dist) + 2|M| + (n_pred + n_gt - 2|M|) oc; oc exceeds any possible distance
    # saving, so the optimum is a maximum matching of minimum total distance (lexicographic).
    n = n_pred + n_gt
    maxd = float(dist.max()) if dist.size else 0.0
    oc = 2.0 + (maxd + 2.0) * (min(n_pred, n_gt) + 1)
    ar_p = np.arange(n_pred)
    ar_g = np.arange(n_gt)
    rows = np.concatenate([pi, ar_p, n_pred + ar_g, n_pred + gj])
    cols = np.concatenate([gj, n_gt + ar_p, ar_g, n_gt + pi])
    w = np.concatenate([dist + 1.0, np.full(n_pred, oc), np.full(n_gt, oc), np.ones(pi.size)])
    graph = sp.csr_array((w, (rows, cols)), shape=(n, n))
    # Duplicate (row, col) entries cannot occur: real edges are unique pixel pairs.
    r, c = csgraph.min_weight_full_bipartite_matching(graph)
    match = np.full(n, -1, dtype=np.int64)
    match[r] = c
    match = match[:n_pred]
    match[match >= n_gt] = -1
    return match


def correspond_pixels(
    pred_bin: np.ndarray,
    gt_bin: np.ndarray,
    max_dist: float,
    method: str = "max_cardinality",
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (match_pred, match_gt): a one-to-one pixel correspondence within max_dist * diagonal.

    Candidate pairs are all (pred, gt) pixel pairs with Euclidean distance <= max_dist *
    sqrt(H^2 + W^2) (BSDS ``correspondPixels`` convention, inclusive). ``method``:
      * "max_cardinality" (default): a maximum matching (Dinic max-flow). BSDS solves a
        min-cost assignment in which an unmatched pixel costs 100*maxDist and a match costs
        its distance (<= maxDist), so every extra match pays off and its matched counts are
        the maximum cardinality (up to pathological cases where dropping one match saves
        more than 99*maxDist of total distance, and its random sparse outlier edges).
        Which pixels pair up among equally large matchings is arbitrary here.
      * "min_cost": among maximum matchings, one of minimum total distance, solved exactly
        with ``min_weight_full_bipartite_matching`` (LAPJVsp) on a graph with outlier
        nodes; closest to BSDS pixel by pixel, slower, and its internal feasibility check
        uses scipy's Hopcroft-Karp (gh-26147), so avoid it on large dense maps.
    """
    pred_bin = np.asarray(pred_bin).astype(bool)
    gt_bin = np.asarray(gt_bin).astype(bool)
    if pred_bin.shape != gt_bin.shape or pred_bin.ndim != 2:
        raise ValueError(f"correspond_pixels: shapes differ or are not 2-D: {pred_bin.shape}, {gt_bin.shape}")
    h, w = pred_bin.shape
    radius = max_dist * math.hypot(h, w)
    p_yx = np.nonzero(pred_bin)
    g_yx = np.nonzero(gt_bin)
    pi, gj, dist = _candidate_pairs(p_yx, g_yx, (h, w), radius)
    n_pred, n_gt = p_yx[0].size, g_yx[0].size
    if method == "min_cost":
        match = _min_cost(pi, gj, dist, n_pred, n_gt)
    elif method == "max_cardinality":
        match = _max_flow_matching(pi, gj, n_pred, n_gt, pairs=True)
    else:
        raise ValueError(f"unknown matching method {method!r}")
    matched = match >= 0
    match_pred = np.zeros((h, w), dtype=bool)
    match_gt = np.zeros((h, w), dtype=bool)
    match_pred[p_yx[0][matched], p_yx[1][matched]] = True
    match_gt[g_yx[0][match[matched]], g_yx[1][match[matched]]] = True
    return match_pred, match_gt


# ------------------------------------------------------------------- per image


def _crop_to_valid(
    pred: np.ndarray, gt: np.ndarray, valid_mask: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Crops pred/gt to the bounding box of valid_mask; returns (pred, gt, ignore)."""
    ignore = gt == 255
    if valid_mask is None:
        return pred, gt, ignore
    valid = np.asarray(valid_mask).astype(bool)
    if valid.shape != gt.shape:
        raise ValueError(f"valid_mask shape {valid.shape} != gt shape {gt.shape}")
    rows = np.flatnonzero(valid.any(axis=1))
    cols = np.flatnonzero(valid.any(axis=0))
    if rows.size == 0:
        z = np.zeros((0, 0))
        return z, z, np.zeros((0, 0), dtype=bool)
    sl = (slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1))
    return pred[sl], gt[sl], ignore[sl] | ~valid[sl]


def image_counts(
    pred: np.ndarray,
    gt: np.ndarray,
    max_dist: float,
    thresholds: np.ndarray,
    valid_mask: np.ndarray | None = None,
    apply_nms: bool = True,
    apply_thin: bool = True,
    quantize: bool = True,
    nms_kwargs: dict[str, Any] | None = None,
) -> np.ndarray:
    """Returns int64 [T, 4] counts (cntR, sumR, cntP, sumP) of one image at each threshold."""
    thresholds = np.asarray(thresholds, dtype=np.float64)
    pred = np.asarray(pred, dtype=np.float64)
    gt = np.asarray(gt)
    if pred.shape != gt.shape or pred.ndim != 2:
        raise ValueError(f"image_counts: pred {pred.shape} and gt {gt.shape} must be equal 2-D shapes")
    pred, gt, ignore = _crop_to_valid(pred, gt, valid_mask)
    if pred.size == 0:
        return np.zeros((thresholds.size, 4), dtype=np.int64)
    h, w = pred.shape
    e = np.nan_to_num(np.clip(pred, 0.0, 1.0))
    if quantize:
        # test.py saves sigmoid*255 as uint8 PNG (truncation); nms_process reads png/255.
        e = np.floor(e * 255.0) / 255.0
    if apply_nms:
        e = nms(e, **(nms_kwargs or {})).astype(np.float64)
        if quantize:
            # nms_process writes uint8(E*255): MATLAB rounds to nearest.
            e = np.floor(e * 255.0 + 0.5) / 255.0
    e[ignore] = 0.0
    gt_edge = (gt >= 0.5) & ~ignore

    # Distinct binary maps: the sets {e >= t} are nested, so equal sizes mean equal maps.
    eps = np.finfo(np.float64).eps
    thr = np.maximum(thresholds, eps)  # edgesEvalImg: E >= max(eps, thr)
    cand = e >= thr.min()
    p_yx = np.nonzero(cand)
    vals = e[p_yx]
    n_on = np.count_nonzero(vals[None, :] >= thr[:, None], axis=1) if vals.size else np.zeros(thr.size, int)
    _, first, inverse = np.unique(n_on, return_index=True, return_inverse=True)
    uthr = thr[first]  # one representative threshold per distinct map
    n_maps = uthr.size

    # All maps are thinned together: a stack of zero-bordered slices, one per distinct map
    # (neighbour offsets never leave a slice), so the Python loop runs per thinning pass.
    wp = w + 2
    slice_size = (h + 2) * wp
    pad_of = (p_yx[0] + 1) * wp + (p_yx[1] + 1)  # padded in-slice index of each candidate
    on = vals[None, :] >= uthr[:, None]  # [maps, candidates]
    map_id, cand_id = np.nonzero(on)
    stack = np.zeros(n_maps * slice_size, dtype=np.uint8)
    idx = map_id * slice_size + pad_of[cand_id]
    stack[idx] = 1
    if apply_thin and idx.size:
        idx = _thin_flat(stack, idx, wp)
    sum_p = np.bincount(idx // slice_size, minlength=n_maps)

    # Candidate pairs once per image, between every pixel of the lowest-threshold map and
    # every gt pixel; each map then keeps the pairs whose pred pixel survived.
    g_yx = np.nonzero(gt_edge)
    radius = max_dist * math.hypot(h, w)
    pi, gj, _ = _candidate_pairs(p_yx, g_yx, (h, w), radius)
    n_match = np.zeros(n_maps, dtype=np.int64)
    if pi.size:
        used, pi = np.unique(pi, return_inverse=True)  # only matchable pred pixels are nodes
        node_alive = stack.reshape(n_maps, slice_size)[:, pad_of[used]].astype(bool)  # [maps, nodes]
        n_match = _batched_matching(node_alive, pi, gj, g_yx[0].size)
    per_map = np.stack([n_match, np.zeros_like(n_match), n_match, sum_p], axis=1)
    counts = per_map[inverse]
    counts[:, 1] = int(gt_edge.sum())  # sumR: gt pixels, independent of the threshold
    # cntR = cntP = the matching size: with a single ground truth and a one-to-one matching,
    # matched gt pixels and matched predicted pixels are the same pairs.
    return counts


def _batched_matching(
    node_alive: np.ndarray, pi: np.ndarray, gj: np.ndarray, n_gt: int, max_edges: int = 1 << 20
) -> np.ndarray:
    """Returns the maximum matching size of each map's subgraph; maps are solved as disjoint copies."""
    n_maps, n_pred = node_alive.shape
    out = np.zeros(n_maps, dtype=np.int64)
    keep = node_alive[:, pi]  # [maps, edges]
    per_map_edges = keep.sum(axis=1)
    start = 0
    while start < n_maps:
        # One max-flow call per group of maps (scipy's per-call overhead dominates small images).
        stop = start + 1
        budget = int(per_map_edges[start])
        while stop < n_maps and budget + per_map_edges[stop] <= max_edges:
            budget += int(per_map_edges[stop])
            stop += 1
        k = stop - start
        m_id, e_id = np.nonzero(keep[start:stop])
        src_m, src_i = np.nonzero(node_alive[start:stop])
        if e_id.size:
            n1, n2 = k * n_pred, k * n_gt
            n = n1 + n2 + 2
            s_node, t_node = n - 2, n - 1
            gt_nodes = np.arange(n2)
            rows = np.concatenate([m_id * n_pred + pi[e_id], n1 + gt_nodes, np.full(src_m.size, s_node)])
            cols = np.concatenate([n1 + m_id * n_gt + gj[e_id], np.full(n2, t_node), src_m * n_pred + src_i])
            graph = sp.csr_array((np.ones(rows.size, dtype=np.int32), (rows, cols)), shape=(n, n))
            flow = csgraph.maximum_flow(graph, s_node, t_node, method="dinic").flow
            # Flow leaving the source, per copy, is that copy's matching size.
            lo, hi = flow.indptr[s_node], flow.indptr[s_node + 1]
            dst, val = flow.indices[lo:hi], flow.data[lo:hi]
            pos = val > 0
            out[start:stop] = np.bincount(dst[pos] // n_pred, weights=val[pos], minlength=k).astype(np.int64)
        start = stop
    return out


# ---------------------------------------------------------------------- pooling


def _prf(cnt_r: np.ndarray, sum_r: np.ndarray, cnt_p: np.ndarray, sum_p: np.ndarray):
    """Returns (precision, recall, F) with SEISM gather_measure's conventions for empty sets."""
    cnt_r, sum_r, cnt_p, sum_p = (np.asarray(a, dtype=np.float64) for a in (cnt_r, sum_r, cnt_p, sum_p))
    rec = np.zeros_like(sum_r)
    prec = np.zeros_like(sum_r)
    no_gt = (sum_r == 0) & (cnt_p == 0)
    rec[no_gt], prec[no_gt] = 1.0, 0.0
    no_pred = (sum_p == 0) & (cnt_r == 0)
    rec[no_pred], prec[no_pred] = 0.0, 1.0
    ok = (sum_p != 0) & (cnt_r != 0)
    rec[ok] = cnt_r[ok] / sum_r[ok]
    prec[ok] = cnt_p[ok] / sum_p[ok]
    denom = prec + rec
    f = np.where(denom > 0, 2.0 * prec * rec / np.where(denom > 0, denom, 1.0), 0.0)
    return prec, rec, f


def ods_from_counts(counts: np.ndarray, thresholds: np.ndarray) -> dict[str, float]:
    """Returns ODS (odsF, threshold, precision, recall) from pooled [T, 4] counts."""
    counts = np.asarray(counts)
    prec, rec, f = _prf(counts[:, 0], counts[:, 1], counts[:, 2], counts[:, 3])
    best = int(np.argmax(f))  # first maximum, as MATLAB max
    return {
        "odsF": float(f[best]),
        "threshold": float(np.asarray(thresholds)[best]),
        "precision": float(prec[best]),
        "recall": float(rec[best]),
    }


def _image_counts_star(args: tuple) -> np.ndarray:
    """Unpacks arguments for executor.map."""
    return image_counts(*args[:3], **args[3])


def _counts_of_jobs(jobs: list) -> list[np.ndarray]:
    """[T, 4] counts of each job (a pool task: one or a few images)."""
    return [_image_counts_star(job) for job in jobs]


def _watch_parent(parent: int) -> None:
    """Ends this worker when the process that started it is gone (the worker ignores
    SIGTERM and SIGINT, so nothing else would end an orphan)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _worker_init() -> None:
    """A pool worker ignores SIGINT and SIGTERM: on a signal to the process group the
    run finishes its round, this evaluation included (`fedjax_mtl.preempt`), and shuts
    the pool down itself; a watchdog ends the worker if its parent dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()


@contextlib.contextmanager
def _main_hidden():
    """`__main__` without its file and spec while workers start: 'spawn' would import
    the caller's script (or module) in every worker, which re-runs an unguarded script's
    top level; the workers need only this module."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


class CountsPool:
    """A persistent process pool scoring images for `EdgeODSAccumulator`s.

    One pool serves any number of accumulators (all edge clients of an evaluation,
    every evaluation of a run): `submit` hands it a list of images and returns a
    Future of their counts at once, so the caller (the evaluation loop) goes on while
    the workers match pixels. At most `max_pending` tasks wait or run at a time
    (`submit` blocks beyond that): the images of a test split the host has not
    scored yet do not pile up in memory.

    `workers`: processes (0 = every core of this host, `host_cores`). They start
    as the first tasks come, each from a fresh interpreter ('spawn': a process holding
    JAX/XLA threads must not fork; and no forkserver, which a SIGTERM to the process
    group would end while the run still finishes its round), and end with `close()`
    (or the `with` block).
    """

    def __init__(self, workers: int = 0, max_pending: int | None = None) -> None:
        self.workers = int(workers) if workers and workers > 0 else host_cores()
        self.max_pending = int(max_pending or 4 * self.workers)
        self._slots = threading.BoundedSemaphore(self.max_pending)
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None

    def submit(self, jobs: list) -> concurrent.futures.Future:
        """A Future of `_counts_of_jobs(jobs)`; blocks while `max_pending` tasks are out."""
        if self._executor is None:
            ctx = multiprocessing.get_context("spawn")
            self._executor = concurrent.futures.ProcessPoolExecutor(
                self.workers, mp_context=ctx, initializer=_worker_init
            )
        self._slots.acquire()
        try:
            with _main_hidden():  # a worker started here does not import the caller's script
                fut = self._executor.submit(_counts_of_jobs, jobs)
        except BaseException:
            self._slots.release()
            raise
        fut.add_done_callback(lambda _: self._slots.release())
        return fut

    def close(self) -> None:
        """Ends the workers (tasks not started yet are cancelled)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def __enter__(self) -> CountsPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class EdgeODSAccumulator:
    """Accumulates per-threshold boundary counts over a dataset; finalize() gives ODS/OIS F in [0, 1].

    With a `pool` (`CountsPool`, shared and closed by its owner) or `num_workers` > 1
    (a pool of its own, kept across updates until `close()`), `update`/`update_many`
    only submit the images and return; the counts are collected when read (`counts`,
    `finalize`, `wait`). The sums are of integers, so the result is the serial one,
    bit for bit, whatever the order in which the workers finish.
    """

    def __init__(
        self,
        max_dist: float = PASCAL_MAX_DIST,
        num_thresholds: int = 99,
        thresholds: Sequence[float] | None = None,
        apply_nms: bool = True,
        apply_thin: bool = True,
        quantize: bool = True,
        nms_kwargs: dict[str, Any] | None = None,
        num_workers: int = 0,
        pool: CountsPool | None = None,
    ) -> None:
        """Configures the evaluation; defaults reproduce the FedHCA² SEISM setting for PASCAL-Context."""
        self.max_dist = float(max_dist)
        self.thresholds = (
            np.asarray(thresholds, dtype=np.float64) if thresholds is not None else default_thresholds(num_thresholds)
        )
        if self.thresholds.ndim != 1 or self.thresholds.size == 0:
            raise ValueError("thresholds must be a non-empty 1-D sequence")
        self.options = dict(
            apply_nms=apply_nms, apply_thin=apply_thin, quantize=quantize, nms_kwargs=dict(nms_kwargs or {})
        )
        self.num_workers = int(num_workers)
        self.pool = pool
        self._own_pool = pool is None and self.num_workers > 1
        self._pending: list[concurrent.futures.Future] = []
        self.reset()

    def reset(self) -> None:
        """Clears all accumulated counts (and drops images still being scored)."""
        for fut in self._pending:
            fut.cancel()
        self._pending = []
        t = self.thresholds.size
        self._counts = np.zeros((t, 4), dtype=np.int64)  # columns: cntR, sumR, cntP, sumP
        self._ois_counts = np.zeros(4, dtype=np.int64)
        self._num_images = 0

    def wait(self) -> None:
        """Adds the counts of every submitted image (blocks until they are scored)."""
        while self._pending:
            fut = self._pending.pop(0)
            for c in fut.result():
                self._add(c)

    @property
    def counts(self) -> np.ndarray:
        """Pooled [T, 4] counts (cntR, sumR, cntP, sumP) of every image added."""
        self.wait()
        return self._counts

    @property
    def ois_counts(self) -> np.ndarray:
        """Pooled [4] counts at each image's best threshold."""
        self.wait()
        return self._ois_counts

    @property
    def num_images(self) -> int:
        self.wait()
        return self._num_images

    def close(self) -> None:
        """Ends the pool this accumulator started (`num_workers` > 1) after collecting."""
        self.wait()
        if self._own_pool and self.pool is not None:
            self.pool.close()
            self.pool = None

    def _add(self, c: np.ndarray) -> None:
        """Adds one image's [T, 4] counts to the ODS pool and its best threshold to the OIS pool."""
        self._counts += c
        _, _, f = _prf(c[:, 0], c[:, 1], c[:, 2], c[:, 3])
        self._ois_counts += c[int(np.argmax(f))]
        self._num_images += 1

    def update(self, pred: np.ndarray, gt: np.ndarray, valid_mask: np.ndarray | None = None) -> None:
        """Adds one image [H, W] or a batch [B, H, W] of edge probabilities and 0/1/255 ground truths."""
        pred = np.asarray(pred)
        gt = np.asarray(gt)
        if pred.ndim == 2:
            self.update_many([pred], [gt], None if valid_mask is None else [valid_mask])
        elif pred.ndim == 3:
            masks = None if valid_mask is None else list(np.asarray(valid_mask))
            self.update_many(list(pred), list(gt), masks)
        else:
            raise ValueError(f"pred must be [H, W] or [B, H, W], got {pred.shape}")

    def update_many(
        self,
        preds: Iterable[np.ndarray],
        gts: Iterable[np.ndarray],
        valid_masks: Iterable[np.ndarray | None] | None = None,
    ) -> None:
        """Adds many images (sizes may differ); with a pool they are only submitted."""
        preds, gts = list(preds), list(gts)
        masks = [None] * len(preds) if valid_masks is None else list(valid_masks)
        if not (len(preds) == len(gts) == len(masks)):
            raise ValueError("preds, gts and valid_masks must have the same length")
        if self._own_pool and self.pool is None:
            self.pool = CountsPool(self.num_workers)
        # A pool reads the images when it sends them to a worker, maybe after the caller
        # reused its buffers: it gets copies.
        own = np.array if self.pool is not None else np.asarray
        jobs = [
            (own(p), own(g), self.max_dist, dict(self.options, thresholds=self.thresholds,
                                                  valid_mask=None if m is None else own(m)))
            for p, g, m in zip(preds, gts, masks)
        ]
        if self.pool is not None:
            # About four tasks per worker for a large call; one image each for a batch.
            chunk = max(1, -(-len(jobs) // (4 * self.pool.workers)))
            for lo in range(0, len(jobs), chunk):
                self._pending.append(self.pool.submit(jobs[lo : lo + chunk]))
        else:
            for job in jobs:
                self._add(_image_counts_star(job))

    def merge(self, other: EdgeODSAccumulator) -> None:
        """Adds the counts of another accumulator with the same thresholds (e.g. from another shard)."""
        if not np.array_equal(self.thresholds, other.thresholds):
            raise ValueError("cannot merge accumulators with different thresholds")
        self.wait()
        other.wait()
        self._counts += other._counts
        self._ois_counts += other._ois_counts
        self._num_images += other._num_images

    def curves(self) -> dict[str, np.ndarray]:
        """Returns the pooled precision, recall and F at every threshold."""
        prec, rec, f = _prf(*self.counts.T)
        return {"threshold": self.thresholds.copy(), "precision": prec, "recall": rec, "F": f}

    def finalize(self) -> dict[str, float | int]:
        """Returns odsF, its threshold/precision/recall and oisF (all in [0, 1]; ×100 is the caller's)."""
        out = ods_from_counts(self.counts, self.thresholds)
        p, r, f = _prf(*self.ois_counts[:, None])
        out.update(
            oisF=float(f[0]), ois_precision=float(p[0]), ois_recall=float(r[0]), num_images=self.num_images
        )
        return out
