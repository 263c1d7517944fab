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
