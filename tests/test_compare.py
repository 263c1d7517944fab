"""scripts/compare.py: finished runs are reused only for the config asked for; bad
--run specs and changed configs stop it with one `error:` line (exit code 2).

Finished runs are faked (config.json, results.csv, metrics.jsonl) and training is
replaced by a recorder, so nothing here trains.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'scripts'))

import compare  # noqa: E402
from fedjax_mtl import train  # noqa: E402

LOCAL = 'configs/local.py:smoke'
FEDAVG = 'configs/fedavg.py:smoke'


def eval_rows(value: float) -> list[dict]:
  return [{'round': 2, 'type': 'eval', 'client': 'c0', 'dataset': 'pascal', 'task': t,
           'metric': m, 'value': value * k}
          for t, m, k in (('semseg', 'mIoU', 1.), ('depth', 'RMSE', .01))]


def fake_run(wd, spec: str, seed: int = 0, value: float = 40., finished: bool = True):
  """A run folder as train_and_evaluate leaves it, for the config compare builds."""
  cfg = compare.load_config(spec)
  cfg.seed, cfg.progress = seed, False
  os.makedirs(wd, exist_ok=True)
  with open(os.path.join(wd, 'config.json'), 'w') as f:
    f.write(cfg.to_json_best_effort(indent=2))
  rows = [{'round': 1, 'type': 'train', 'client': 'c0', 'task': 'semseg', 'loss': 1.}]
  rows += eval_rows(value)
  with open(os.path.join(wd, 'metrics.jsonl'), 'w') as f:
    f.write(''.join(json.dumps(r) + '\n' for r in rows))
  if finished:
    with open(os.path.join(wd, 'results.csv'), 'w') as f:
      f.write('client,task,metric,value\n')




@pytest.fixture
def trained(monkeypatch):
  """Replaces training: records (config, workdir) and leaves a finished run."""
  calls = []

  def fake_train(config, workdir, stop_after=None):
    calls.append((config, workdir))
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
      f.write(config.to_json_best_effort(indent=2))
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
      f.write(''.join(json.dumps(r) + '\n' for r in eval_rows(50.)))
    with open(os.path.join(workdir, 'results.csv'), 'w') as f:
      f.write('done\n')
    return {}

  monkeypatch.setattr(train, 'train_and_evaluate', fake_train)
  return calls


def run_compare(out, *runs, extra=()):
  args = ['--out', str(out), '--xla_cache_dir', 'none', *extra]
  for r in runs:
    args += ['--run', r]
  return compare.main(args)


def test_finished_runs_of_the_same_config_are_reused(tmp_path, trained):
  fake_run(tmp_path / 'local' / 'seed0', LOCAL, value=40.)
  fake_run(tmp_path / 'fedavg' / 'seed0', FEDAVG, value=44.)
  results = run_compare(tmp_path, f'local={LOCAL}', f'fedavg={FEDAVG}')
  assert trained == []
  assert results['fedavg'][0]['c0/semseg mIoU'] == 44.
  assert (tmp_path / 'comparison.csv').read_text().splitlines()[2].startswith('fedavg,44.0,')


def test_unfinished_and_missing_runs_are_run(tmp_path, trained):
  fake_run(tmp_path / 'local' / 'seed0', LOCAL, finished=False)  # interrupted: resumes
  run_compare(tmp_path, f'local={LOCAL}', f'fedavg={FEDAVG}')
  assert [wd for _, wd in trained] == [str(tmp_path / 'local' / 'seed0'),
                                      str(tmp_path / 'fedavg' / 'seed0')]
  assert trained[1][0].algorithm == 'fedavg' and trained[1][0].seed == 0
  assert not trained[1][0].progress


def test_a_changed_config_is_refused_before_anything_runs(tmp_path, trained, capsys):
  fake_run(tmp_path / 'fedavg' / 'seed1', FEDAVG, seed=1)
  before = snapshot(tmp_path)
  with pytest.raises(SystemExit) as e:
    # local (first) would run, fedavg seed 1 finished with 3 rounds: both refused.
    run_compare(tmp_path, f'local={LOCAL}', f'fedavg={FEDAVG} num_rounds=5 optim.lr=0.5',
                extra=['--seeds', '0,1'])
  assert e.value.code == 2
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and err[0].startswith('error: '), err
  assert os.path.join(str(tmp_path), 'fedavg', 'seed1') in err[0]
  assert '(fields: num_rounds, optim)' in err[0] and '--rerun_changed' in err[0]
  assert trained == [] and snapshot(tmp_path) == before


def test_rerun_changed_moves_the_old_run_aside_and_runs_again(tmp_path, trained, capsys):
  wd = tmp_path / 'fedavg' / 'seed0'
  fake_run(wd, FEDAVG, value=44.)
  old = snapshot(wd)
  results = run_compare(tmp_path, f'fedavg={FEDAVG} num_rounds=5', extra=['--rerun_changed'])
  assert [w for _, w in trained] == [str(wd)] and trained[0][0].num_rounds == 5
  assert snapshot(str(wd) + '.replaced-1') == old
  assert results['fedavg'][0]['c0/semseg mIoU'] == 50.  # the new run's
  assert 'config changed (fields: num_rounds)' in capsys.readouterr().out
  # The same request again reuses the new run; another change keeps both old runs.
  run_compare(tmp_path, f'fedavg={FEDAVG} num_rounds=5', extra=['--rerun_changed'])
  assert len(trained) == 1
  run_compare(tmp_path, f'fedavg={FEDAVG} num_rounds=6', extra=['--rerun_changed'])
  assert len(trained) == 2 and snapshot(str(wd) + '.replaced-1') == old
  assert json.load(open(str(wd) + '.replaced-2/config.json'))["num_rounds"] == 5


def test_fields_a_resumed_run_may_change_do_not_count(tmp_path, trained):
  fake_run(tmp_path / 'fedavg' / 'seed0', FEDAVG)
  run_compare(tmp_path, f'fedavg={FEDAVG} eval_every=1 checkpoint_every=1')
  assert trained == []


def _no_get_config(tmp_path):
  (tmp_path / 'nocfg.py').write_text('X = 1\n')
  return f'm={tmp_path / "nocfg.py"}'


def _raising_file(tmp_path):
  (tmp_path / 'bad.py').write_text('import no_such_module_here\n')
  return f'm={tmp_path / "bad.py"}'


@pytest.mark.parametrize('run, expected', [
    ('fedavg', r"--run 'fedavg': expected NAME=CONFIG\[:ARG\]"),
    ('=configs/fedavg.py', r"--run '=configs/fedavg.py': expected NAME=CONFIG"),
    ('m=', r"--run 'm=': expected NAME=CONFIG"),
    ('m=configs/nope.py', r"--run m: config file 'configs/nope.py' does not exist"),
    (_no_get_config, r"--run m: config file '.*nocfg.py' defines no get_config\(arg\)"),
    (_raising_file, r"--run m: cannot load config file '.*bad.py': ModuleNotFoundError: No mod"),
    ('m=configs/fedavg.py:nosuch', r"--run m: cannot load config 'configs/fedavg.py:nosuch': "
                                   r"ValueError: unknown config variant 'nosuch'; valid"),
    (f'm={FEDAVG} num_round=3', r"unknown config field 'num_round'; did you mean num_rounds"),
    (f'm={FEDAVG} optim.zzz=3', r"unknown config field 'optim.zzz'; fields of optim: .*lr"),
    (f'm={FEDAVG} optim.lrr=3', r"unknown config field 'optim.lrr'; did you mean optim.lr\?"),
    (f'm={FEDAVG} optm.lr=3', r"unknown config field 'optm.lr'; did you mean optim.lr"),
    (f'm={FEDAVG} zzz.qqq=3', r"unknown config field 'zzz.qqq'; top-level fields: .*num_rounds"),
    (f'm={FEDAVG} num_rounds', r"--run m: override 'num_rounds': expected field=value"),
    (f'm={FEDAVG} num_rounds=abc', r'num_rounds=abc: not a Python literal; expected int like '
                                   r'the default \d+'),
    (f'm={FEDAVG} num_rounds=2.5', r'num_rounds=2.5: expected int like the default'),
    (f'm={FEDAVG} optim.lr=[1]', r'optim.lr=\[1\]: expected float like the default'),
    (f'm={FEDAVG} progress=maybe', r'progress=maybe: expected true or false'),
])
def test_bad_run_spec_is_one_error_line(tmp_path, trained, capsys, run, expected):
  if callable(run):
    run = run(tmp_path)
  with pytest.raises(SystemExit) as e:
    run_compare(tmp_path / 'out', run)
  assert e.value.code == 2
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and err[0].startswith('error: '), err
  assert re.search(expected, err[0]), err[0]
  assert trained == [] and not (tmp_path / 'out').exists()


def test_bad_seeds_and_a_name_given_twice(tmp_path, trained, capsys):
  for extra, runs, expected in [
      (['--seeds', '0,x'], [f'm={FEDAVG}'], '--seeds=0,x: expected comma-separated integers'),
      ([], [f'm={FEDAVG}', f'm={LOCAL}'], "--run 'm' is given twice")]:
    with pytest.raises(SystemExit) as e:
      run_compare(tmp_path, *runs, extra=extra)
    err = capsys.readouterr().err.splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith(f'error: {expected}'), err


def test_valid_overrides_are_typed_like_the_defaults():
  cfg = compare.load_config(f'{FEDAVG} num_rounds=5 optim.lr=1e-2 progress=no '
                            'data.resolution.pascal=(8,8) scenario=pascal_st_nyud_mt_1c')
  assert (cfg.num_rounds, cfg.optim.lr, cfg.progress) == (5, 0.01, False)
  assert cfg.data.resolution.pascal == (8, 8) and cfg.scenario == 'pascal_st_nyud_mt_1c'


def test_command_line_error_has_no_traceback(tmp_path):
  r = subprocess.run([sys.executable, 'scripts/compare.py', '--out', str(tmp_path),
                      '--run', 'm=configs/nope.py'], cwd=ROOT, capture_output=True, text=True)
  assert r.returncode == 2
  assert r.stderr.strip().splitlines() == [
      "error: --run m: config file 'configs/nope.py' does not exist; e.g. --config=configs/hca2.py"]


def test_pairs_give_a_method_its_own_delta_m_reference():
  cols = lambda v: {'c0/semseg mIoU': v, 'c0/depth RMSE': 1.0}
  results = {'base': [cols(40.)], 'base+dea': [cols(44.)], 'other': [cols(20.)]}
  md, csv_text = compare.comparison_table(results, 'other', pairs={'base+dea': 'base'})
  rows = {line.split('|')[1].strip(): line for line in md.splitlines()[2:]}
  assert '5.00 (base)' in rows['base+dea']  # (44/40 - 1) / 2 tasks
  assert '50.00 (other)' in rows['base']
  assert ',5.0' in csv_text.splitlines()[2]


def test_a_pair_naming_an_unknown_run_is_one_error_line(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    compare.main(['--out', str(tmp_path), '--run', f'a={FEDAVG}', '--pair', 'a=b'])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == ["error: --pair 'a=b': expected NAME=REF with both names given by --run; runs: a"]
