"""scripts/rehearse.py's input checks and the config a saved run rebuilds from
(`workdir.saved_config`, which `python -m fedjax_mtl.evaluate` reads). The rehearsal
itself runs the real pipeline at paper shapes (BENCHMARKS.md); its pieces are the
engine's, tested elsewhere (`test_real_engine.py`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fedjax_mtl import workdir
from fedjax_mtl.defaults import add_blocks, base_config
from fedjax_mtl.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rehearse(*args):
  return subprocess.run([sys.executable, os.path.join(ROOT, 'scripts', 'rehearse.py'), *args],
                        capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_rehearse_refuses_bad_input_with_one_line_and_writes_nothing(tmp_path):
  out = tmp_path / 'out'
  data = tmp_path / 'data'
  data.mkdir()
  cases = [
      ([f'--data_dir={tmp_path / "none"}'], 'does not exist; write a format-true copy'),
      ([f'--data_dir={data}', '--rounds=2'], '--rounds=2: the rehearsal needs 3'),
      ([f'--data_dir={data}', '--bogus=1'], "unknown argument '--bogus=1'"),
      ([f'--data_dir={data}', '--config.no_such_field=1'], 'no_such_field'),
      # A data dir without the datasets or their caches.
      ([f'--data_dir={data}'], 'NYUDv2 does not exist'),
  ]
  for extra, message in cases:
    r = _rehearse('--config=configs/hca2.py:paper', f'--out={out}', *extra)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith('error: '), r.stderr
    assert message in lines[0], lines[0]
    assert not out.exists() or not os.listdir(out / 'workdir' if (out / 'workdir').exists()
                                              else out)


@pytest.mark.parametrize('arg,algorithm', [(None, 'hca2'), ('paper', 'dea(fedavg)'),
                                           ('paper,scenario=nyud_st', 'ditto'),
                                           ('mini8', 'matu'), ('paper,table=2', 'matfl'),
                                           ('smoke', 'momentum(fedavg)')])
def test_a_saved_config_rebuilds_field_for_field(tmp_path, arg, algorithm):
  c = base_config(arg, 'fedavg' if '(' in algorithm else algorithm)
  c.algorithm = algorithm
  add_blocks(c, algorithm)
  c.max_steps_per_round = 5
  (tmp_path / 'config.json').write_text(c.to_json_best_effort(indent=2))
  rebuilt = workdir.saved_config(str(tmp_path))
  assert json.loads(rebuilt.to_json_best_effort()) == json.loads(c.to_json_best_effort())
  assert workdir.config_diffs(rebuilt, str(tmp_path)) == []


def test_a_saved_config_that_does_not_rebuild_is_refused(tmp_path):
  with pytest.raises(ConfigError, match='holds no run'):
    workdir.saved_config(str(tmp_path))
  c = json.loads(base_config().to_json_best_effort())
  c['algorithm'] = 'no_such_rule'
  (tmp_path / 'config.json').write_text(json.dumps(c))
  with pytest.raises(ConfigError, match='cannot rebuild the config'):
    workdir.saved_config(str(tmp_path))
  c = json.loads(base_config().to_json_best_effort())
  c['optim']['no_such_field'] = 1
  (tmp_path / 'config.json').write_text(json.dumps(c))
  with pytest.raises(ConfigError, match='cannot rebuild the config'):
    workdir.saved_config(str(tmp_path))
  # Older runs wrote eval_edge_ods as a boolean.
  c = json.loads(base_config().to_json_best_effort())
  c['eval_edge_ods'] = False
  (tmp_path / 'config.json').write_text(json.dumps(c))
  assert workdir.saved_config(str(tmp_path)).eval_edge_ods == 'off'


def test_a_many_task_rehearsal_runs_kills_resumes_and_extrapolates(tmp_path):
  """The whole rehearsal of a small many-task config (mini8 is procedural: no data dir
  is read): SIGTERM after round 1, resume to round 3, timed rounds, the figures and the
  extrapolation to the config's full run."""
  out = tmp_path / 'out'
  data = tmp_path / 'data'
  data.mkdir()
  r = _rehearse('--config=configs/matu.py:smoke', f'--data_dir={data}', f'--out={out}',
                '--steps=2', '--config.many.num_test=16')
  assert r.returncode == 0, r.stderr[-3000:]
  f = json.loads((out / 'rehearsal.json').read_text())
  assert f['fresh']['stopped'].startswith('stopped at round 1 on SIGTERM')
  rows = [json.loads(line) for line in (out / 'workdir' / 'timing.jsonl').read_text().splitlines()]
  assert [r['round'] for r in rows if 'seconds' in r] == [1, 2, 3]
  m, ex = f['many'], f['extrapolated']
  # mini8 is not a --fraction copy: the full run holds the examples this one does.
  assert m['train_scale'] == m['test_scale'] == 1.0
  assert m['steps_per_round'] == 2 and m['full_steps_per_round'] >= 2
  assert f['step_s']['round'] > 0 and ex['wall_hours'] > 0
  assert ex['evaluations'] >= 1 and ex['checkpoints'] >= 1
  assert f['checkpoint_bytes'] > 0
  assert f['table_row'].startswith('| configs/matu.py:smoke |')
