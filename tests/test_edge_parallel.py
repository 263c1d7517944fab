"""Edge odsF on a persistent process pool (`metrics.edge.CountsPool`) and at the final
round only (`eval_edge_ods='final'`)."""

import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import tiny_config
from fedjax_mtl import evaluation, validate
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.metrics import edge as E


def _image(rng, h, w):
  """A procedural edge map (rectangles' outlines and a diagonal) and noisy, shifted
  probabilities of it, with a band of ignore pixels."""
  gt = np.zeros((h, w), np.uint8)
  for _ in range(3):
    y0, x0 = rng.integers(0, h // 2), rng.integers(0, w // 2)
    y1, x1 = rng.integers(y0 + 4, h), rng.integers(x0 + 4, w)
    gt[y0:y1, [x0, x1 - 1]] = 1
    gt[[y0, y1 - 1], x0:x1] = 1
  d = np.arange(min(h, w))
  gt[d, d] = 1
  prob = np.roll(gt, int(rng.integers(-2, 3)), axis=int(rng.integers(0, 2))).astype(np.float32)
  prob = np.clip(0.8 * prob + 0.3 * rng.random((h, w)), 0, 1)
  gt[:, -3:] = 255  # ignore pixels (e.g. padding)
  return prob, gt


def test_pool_counts_are_the_serial_counts_bit_for_bit():
  rng = np.random.default_rng(0)
  sizes = [(40, 56), (64, 64), (37, 81), (90, 70), (48, 33), (75, 50)]
  images = [_image(rng, h, w) for h, w in sizes]
  serial = E.EdgeODSAccumulator(max_dist=0.02)
  for p, g in images:
    serial.update(p, g, valid_mask=g != 255)
  with E.CountsPool(2) as pool:
    # Two accumulators share the pool (two edge clients of an evaluation); each is fed
    # batch by batch and collects when read.
    a = E.EdgeODSAccumulator(max_dist=0.02, pool=pool)
    b = E.EdgeODSAccumulator(max_dist=0.02, pool=pool)
    for p, g in images[:3]:
      a.update(p, g, valid_mask=g != 255)
    b.update_many([p for p, _ in images[3:]], [g for _, g in images[3:]],
                  [g != 255 for _, g in images[3:]])
    assert a._pending and b._pending  # submitted, not scored in this process
    a.merge(b)
  np.testing.assert_array_equal(a.counts, serial.counts)
  np.testing.assert_array_equal(a.ois_counts, serial.ois_counts)
  assert a.finalize() == serial.finalize() and a.num_images == len(sizes)
  # An accumulator's own pool (num_workers > 1) lives across updates until close().
  own = E.EdgeODSAccumulator(max_dist=0.02, num_workers=2)
  for p, g in images:
    own.update(p, g, valid_mask=g != 255)
  pool = own.pool
  assert own.finalize() == serial.finalize() and own.pool is pool
  own.close()
  assert own.pool is None


def test_edge_ods_modes_and_the_bad_choice():
  cfg = tiny_config('fedavg')  # 3 rounds
  assert evaluation.edge_ods_mode(cfg) == 'every'
  seen = {}
  for mode in evaluation.EDGE_ODS_MODES:
    cfg.eval_edge_ods = mode
    seen[mode] = [evaluation.scores_edge_ods(cfg, r) for r in (1, 2, 3, None)]
  assert seen == {'every': [True] * 4, 'final': [False, False, True, True],
                  'off': [False] * 4}
  # config.json of a run before the field had three values.
  assert evaluation.edge_ods_mode({'eval_edge_ods': True}) == 'every'
  assert evaluation.edge_ods_mode({'eval_edge_ods': False}) == 'off'
  cfg.eval_edge_ods = 'last'
  with pytest.raises(ConfigError) as e:
    validate.check_config(cfg)
  assert str(e.value) == "unknown eval_edge_ods 'last'; valid choices: 'every', 'final', 'off'"


def test_final_mode_scores_odsf_at_the_final_evaluation_only():
  """The smoke engine (3 rounds) evaluating its round-0 state as rounds 2 and 3 would:
  the edge loss, then odsF, scored on a pool of 2 workers and equal to the serial
  odsF of the same state."""
  from fedjax_mtl import engines
  keys = ('client', 'dataset', 'task', 'metric', 'value')
  engine = engines.build(tiny_config('fedavg', eval_edge_ods='final', eval_ods_workers=2))
  engine.open(0)
  try:
    state = engine.init_state()
    rows = engine.evaluate(state, 2) + engine.evaluate(state, 3)
    assert engine._ods_pool is not None and engine._ods_pool.workers == 2
  finally:
    engine.close()
  assert engine._ods_pool is None
  edge = [(r['round'], r['metric']) for r in rows if r['task'] == 'edge']
  assert edge == [(2, 'loss')] * 2 + [(3, 'odsF')] * 2
  strip = lambda rnd: [{k: r[k] for k in keys} for r in rows if r['round'] == rnd]
  assert [r for r in strip(2) if r['task'] != 'edge'] == [
      r for r in strip(3) if r['task'] != 'edge']
  serial = engines.build(tiny_config('fedavg'))  # 'every', in this process
  serial.open(0)
  try:
    want = serial.metric_rows(state)
  finally:
    serial.close()
  assert strip(3) == [{k: r[k] for k in keys} for r in want]


def test_workers_do_not_rerun_an_unguarded_script(tmp_path):
  # 'spawn' would import the caller's script in each worker: a script without the
  # `if __name__ == '__main__':` guard would run again there (and fail to start them).
  script = tmp_path / 'unguarded.py'
  script.write_text(
      'import numpy as np\n'
      'from fedjax_mtl.metrics import edge\n'
      "print('top level', flush=True)\n"
      'gt = (np.random.default_rng(0).random((40, 50)) > 0.97).astype(np.uint8)\n'
      'pred = np.clip(gt + 0.3 * np.random.default_rng(1).random((40, 50)), 0, 1)\n'
      'serial = edge.EdgeODSAccumulator()\n'
      'serial.update(np.stack([pred] * 4), np.stack([gt] * 4))\n'
      'with edge.CountsPool(2) as pool:\n'
      '  acc = edge.EdgeODSAccumulator(pool=pool)\n'
      '  acc.update(np.stack([pred] * 4), np.stack([gt] * 4))\n'
      '  print(acc.finalize() == serial.finalize())\n')
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                     env=dict(os.environ, PYTHONPATH=root))
  assert r.returncode == 0, r.stderr
  assert r.stdout.split() == ['top', 'level', 'True']
