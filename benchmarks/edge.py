"""Edge odsF on the host at full PASCAL-Context size (`--only=odsf`).

`fedjax_mtl.metrics.edge` scores each test image of an edge client on the host (NMS,
thinning, one-to-one matching within maxDist at 99 thresholds). This measures, on
500x375 probability maps (PASCAL maxDist 0.0075) made from a procedural ground truth
(object outlines) and a noisy, blurred, shifted detector output:

* the serial cost per image (`image_counts` in this process);
* the throughput of the engine's path (`CountsPool`, `EdgeODSAccumulator(pool=...)` fed
  batch by batch, counts collected at the end) with 1, 2, 4, ... and all of the host's
  cores as workers, its counts checked against the serial ones (bit for bit), and the
  time it extrapolates to for PASCAL-Context's 5,105 test images per edge client.

One JSON line per setting; the summary keys are printed by `benchmarks/__main__.py`.
"""

from __future__ import annotations

import json
import time

import numpy as np
import scipy.ndimage as ndi

from benchmarks.common import jsonl_log

PASCAL_HW = (375, 500)  # PASCAL-Context images are at most 500 px wide; 500x375 is common
PASCAL_TEST_IMAGES = 5105
BATCH = 8  # the paper configs' eval_batch_size


def pascal_like_image(seed: int, hw: tuple[int, int] = PASCAL_HW) -> tuple[np.ndarray, np.ndarray]:
  """(edge probabilities float32 [H, W], ground truth uint8 [H, W]): the outlines of
  random overlapping ellipses (about 2 % edge pixels), and a detector's output of them:
  blurred, shifted by up to 2 px, partly missed, over textured background noise (odsF
  about 0.79, as a trained model's; the cost grows with the false positives: a cleaner
  output, odsF 0.89, took about 0.4 s per image where this takes 0.9 s)."""
  rng = np.random.default_rng(seed)
  h, w = hw
  yy, xx = np.mgrid[:h, :w].astype(np.float32)
  labels = np.zeros((h, w), np.int32)
  for k in range(1, 16):
    cy, cx = rng.uniform(0, h), rng.uniform(0, w)
    ry, rx = rng.uniform(15, h / 3), rng.uniform(15, w / 3)
    t = rng.uniform(0, np.pi)
    u = ((yy - cy) * np.cos(t) + (xx - cx) * np.sin(t)) / ry
    v = (-(yy - cy) * np.sin(t) + (xx - cx) * np.cos(t)) / rx
    labels[u * u + v * v <= 1] = k
  gt = np.zeros((h, w), np.uint8)
  gt[:, :-1] |= labels[:, :-1] != labels[:, 1:]
  gt[:-1, :] |= labels[:-1, :] != labels[1:, :]
  shifted = np.roll(gt, (int(rng.integers(-2, 3)), int(rng.integers(-2, 3))), axis=(0, 1))
  kept = ndi.gaussian_filter(rng.random((h, w)), 8) > 0.46  # about a fifth of edges missed
  edges = ndi.gaussian_filter(shifted * kept.astype(np.float32), 1.5)
  edges /= max(float(edges.max()), 1e-6)
  texture = ndi.gaussian_filter(rng.random((h, w)).astype(np.float32), 2)
  texture = (texture - texture.min()) / max(float(np.ptp(texture)), 1e-6)
  prob = np.clip(0.85 * edges + 0.9 * texture ** 3 + 0.05 * rng.random((h, w)), 0, 1)
  return prob.astype(np.float32), gt


def worker_counts(cores: int) -> list[int]:
  """1, 2, 4, ... below `cores`, and `cores`."""
  out, w = [], 1
  while w < cores:
    out.append(w)
    w *= 2
  return out + [cores]


def bench_odsf(distinct: int = 8, per_worker: int = 6, log=print) -> dict:
  """Serial seconds per image, then the pool's throughput per worker count (see the
  module docstring); returns the summary figures."""
  from fedjax_mtl import tasks
  from fedjax_mtl.metrics import edge as E
  max_dist = tasks.DATASETS['pascal'].edge_max_dist
  assert max_dist == E.PASCAL_MAX_DIST
  images = [pascal_like_image(i) for i in range(distinct)]
  acc = E.EdgeODSAccumulator(max_dist=max_dist)
  per_image, times = [], []
  for p, g in images:  # serial, in this process: the engine with eval_ods_workers=1
    t0 = time.perf_counter()
    c = E.image_counts(p, g, max_dist, acc.thresholds, valid_mask=g != 255, **acc.options)
    times.append(time.perf_counter() - t0)
    per_image.append(c)
  serial_s = float(np.mean(times))
  cores = E.host_cores()
  edge_px = float(np.mean([g.mean() for _, g in images]))
  log(json.dumps({'bench': 'odsf', 'mode': 'serial', 'hw': list(PASCAL_HW), 'images': distinct,
                  'edge_pixels': round(edge_px, 4),
                  'odsF': round(E.ods_from_counts(sum(per_image), acc.thresholds)['odsF'], 4),
                  'seconds_per_image': round(serial_s, 4),
                  'min_s': round(min(times), 4), 'max_s': round(max(times), 4),
                  'pascal_test_s': round(PASCAL_TEST_IMAGES * serial_s, 1)}))
  out = {'serial_s_per_image': serial_s, 'host_cores': cores,
         'serial_pascal_test_s': PASCAL_TEST_IMAGES * serial_s}
  for w in worker_counts(cores):
    n = max(BATCH, per_worker * w)
    order = [i % distinct for i in range(n)]
    want = sum(per_image[i] for i in order)
    with E.CountsPool(w) as pool:
      t0 = time.perf_counter()  # the workers' start (once per run in the engine)
      for f in [pool.submit([]) for _ in range(w)]:
        f.result()
      start_s = time.perf_counter() - t0
      acc = E.EdgeODSAccumulator(max_dist=max_dist, pool=pool)
      t0 = time.perf_counter()
      for lo in range(0, n, BATCH):  # as EdgeScores.update: one call per test batch
        idx = order[lo:lo + BATCH]
        gts = np.stack([images[i][1] for i in idx])
        acc.update(np.stack([images[i][0] for i in idx]), gts, valid_mask=gts != 255)
      submit_s = time.perf_counter() - t0
      counts = acc.counts  # collects
      seconds = time.perf_counter() - t0
    same = bool(np.array_equal(counts, want))
    rate = n / seconds
    log(json.dumps({'bench': 'odsf', 'mode': 'pool', 'workers': w, 'images': n,
                    'pool_start_s': round(start_s, 3), 'submit_s': round(submit_s, 3),
                    'seconds': round(seconds, 3), 'images_per_s': round(rate, 3),
                    'speedup_vs_serial': round(rate * serial_s, 2),
                    'pascal_test_s': round(PASCAL_TEST_IMAGES / rate, 1),
                    'counts_equal_serial': same}))
    out[f'pool{w}_images_per_s'] = rate
    out[f'pool{w}_pascal_test_s'] = PASCAL_TEST_IMAGES / rate
    out[f'pool{w}_start_s'] = start_s
    out[f'pool{w}_equal_serial'] = same
  return out


def bench(a) -> dict:
  """`--only=odsf` with the benchmark flags `a` (`--json`: the lines also to <json>.jsonl)."""
  return bench_odsf(log=jsonl_log(a.json))
