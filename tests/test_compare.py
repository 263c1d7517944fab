"""scripts/compare.py (fedjax_mtl.compare): finished runs are reused only for the
config asked for; bad --run specs and changed configs stop it with one `error:` line
(exit code 2).

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
from fedjax_mtl import compare, report, validate
from fedjax_mtl import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOCAL = 'configs/local.py:smoke'
FEDAVG = 'configs/fedavg.py:smoke'
LOCAL8 = 'configs/local.py:mini8'  # the many-task setting
FEDAVG8 = 'configs/fedavg.py:mini8'


def eval_rows(value: float) -> list[dict]:
  return [{'round': 2, 'type': 'eval', 'client': 'c0', 'dataset': 'pascal', 'task': t,
           'metric': m, 'value': value * k}
          for t, m, k in (('semseg', 'mIoU', 1.), ('depth', 'RMSE', .01))]


def many_rows(acc: dict, bits=(0., 0.)) -> list[dict]:
  """metrics.jsonl rows of a many-task run: per round an agg row with `bits`; an early
  evaluation the table must not use, then the last one with accuracies `acc`."""
  rows = []
  for rnd, b in enumerate(bits, 1):
    rows += [{'round': rnd, 'type': 'train', 'client': 'client0', 'task': 'mnist', 'loss': 1.},
             {'round': rnd, 'type': 'agg', 'upload_bits': 2 * b, 'bits_per_task': b}]
  for rnd, scale in ((1, .5), (len(bits), 1.)):
    rows += [{'round': rnd, 'type': 'eval', 'task': t, 'metric': m, 'value': v}
             for t, a in acc.items()
             for m, v in (('accuracy', a * scale), ('loss', 9.))]
  return rows


def fake_run(wd, spec: str, seed: int = 0, value: float = 40., finished: bool = True,
             rows: list | None = None):
  """A run folder as train_and_evaluate leaves it, for the config compare builds."""
  cfg = compare.load_config(spec)
  cfg.seed, cfg.progress = seed, False
  if compare.is_many_task(cfg):
    cfg.split_seed = seed
  os.makedirs(wd, exist_ok=True)
  with open(os.path.join(wd, 'config.json'), 'w') as f:
    f.write(cfg.to_json_best_effort(indent=2))
  if rows is None:
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
    rows = (many_rows({'mnist': 50.}) if compare.is_many_task(config) else eval_rows(50.))
    subs = [workdir]
    if config.get('sweep'):  # a sweep's replicas: seed s scores 50 + s
      subs = [os.path.join(workdir, 'replicas', f'seed={s}')
              for s in config.sweep.partition('=')[2].split(',')]
    for sub in subs:
      os.makedirs(sub, exist_ok=True)
      bump = float(sub.rpartition('=')[2]) if sub != workdir else 0.
      with open(os.path.join(sub, 'metrics.jsonl'), 'w') as f:
        f.write(''.join(json.dumps({**r, 'value': r['value'] + bump} if 'value' in r else r)
                        + '\n' for r in rows))
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
                extra=['--seeds', '0,1', '--no-replicas'])
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


def test_a_dense_methods_seeds_run_as_one_sweep_unless_no_replicas(tmp_path, trained, capsys):
  results = run_compare(tmp_path / 'r', f'fedavg={FEDAVG}', extra=['--seeds', '0,1'])
  [(cfg, wd)] = trained
  assert wd == str(tmp_path / 'r' / 'fedavg' / 'seeds0,1') and cfg.sweep == 'seed=0,1'
  assert [r['c0/semseg mIoU'] for r in results['fedavg']] == [50., 51.]  # per replica
  assert 'fedavg seeds 0,1 (one program)' in capsys.readouterr().out
  run_compare(tmp_path / 'r', f'fedavg={FEDAVG}', extra=['--seeds', '0,1'])
  assert len(trained) == 1  # the finished sweep is reused
  run_compare(tmp_path / 'n', f'fedavg={FEDAVG}', extra=['--seeds', '0,1', '--no-replicas'])
  # Many-task: a Dirichlet allocation (its task counts drawn per split) one run per
  # seed; one task per client (mini8's default) a sweep of seed+split_seed.
  run_compare(tmp_path / 'm', f'fedavg={FEDAVG8} many.zeta_t=0.5', extra=['--seeds', '0,1'])
  assert [w for _, w in trained[1:]] == [str(tmp_path / d / 'fedavg' / f'seed{s}')
                                         for d in 'nm' for s in (0, 1)]
  assert all(not c.get('sweep', '') for c, _ in trained[1:])
  run_compare(tmp_path / 'k', f'fedavg={FEDAVG8}', extra=['--seeds', '0,1'])
  assert trained[-1][1] == str(tmp_path / 'k' / 'fedavg' / 'seeds0,1')
  assert trained[-1][0].sweep == 'seed+split_seed=0,1'


def test_a_method_a_sweep_cannot_hold_runs_one_process_per_seed(tmp_path, trained):
  run_compare(tmp_path, f'fedavg={FEDAVG} data.source=real', extra=['--seeds', '0,1'])
  assert [wd for _, wd in trained] == [str(tmp_path / 'fedavg' / 'seed0'),
                                      str(tmp_path / 'fedavg' / 'seed1')]
  assert all(not c.get('sweep') and c.data.source == 'real' for c, _ in trained)


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
  md, csv_text = report.comparison_table(results, 'other', pairs={'base+dea': 'base'})
  rows = {line.split('|')[1].strip(): line for line in md.splitlines()[2:]}
  assert '5.00 (base)' in rows['base+dea']  # (44/40 - 1) / 2 tasks
  assert '50.00 (other)' in rows['base']
  assert ',5.0' in csv_text.splitlines()[2]


def test_runs_of_different_scenarios_compare_on_their_shared_client_tasks():
  """FedHCA2 Tab. 4: single-task clients alone (ST) and with a multi-task client
  (ST+MT); Δm over the tasks both have, said below the table."""
  st = {'nyud_st_semseg_0/semseg mIoU': 30., 'nyud_st_depth_1/depth RMSE': 1.0}
  st_mt = {'nyud_st_semseg_0/semseg mIoU': 33., 'nyud_st_depth_1/depth RMSE': 0.9,
           'pascal_mt_mt_0/semseg mIoU': 20.}
  md, csv_text = report.comparison_table({'st_local': [st], 'st_mt': [st_mt]}, 'st_local')
  lines = md.splitlines()
  assert lines[0].count('↑') + lines[0].count('↓') == 4  # 3 columns and Δm
  assert lines[2].split(' | ')[3] == '–'  # st_local has no multi-task client
  assert '10.00' in lines[3]  # (33/30 - 1 + 1 - 0.9/1.0) / 2
  assert lines[-1] == 'Δm of st_mt: over the 2 client tasks it shares with st_local.'
  assert float(csv_text.splitlines()[2].split(',')[-1]) == pytest.approx(10.)


def test_a_pair_naming_an_unknown_run_is_one_error_line(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    compare.main(['--out', str(tmp_path), '--run', f'a={FEDAVG}', '--pair', 'a=b'])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == ["error: --pair 'a=b': expected NAME=REF with both names given by --run; runs: a"]


# -- the many-task table (MaTU's Table 1/2, spec matu §5) ---------------------------

# individual: the reference; fedavg's accuracy is per seed 60% and 80% of it.
ACC = {('individual', 0): {'mnist': 80., 'svhn': 60.},
       ('individual', 1): {'mnist': 90., 'svhn': 70.},
       ('fedavg', 0): {'mnist': 60., 'svhn': 27.},
       ('fedavg', 1): {'mnist': 72., 'svhn': 56.}}
BITS = {0: (140e3, 150e3), 1: (150e3, 151.6e3)}  # fedavg: mean 145 k and 150.8 k


def test_many_task_table_by_hand(tmp_path, trained):
  for (name, seed), acc in ACC.items():
    spec, bits = (LOCAL8, (0., 0.)) if name == 'individual' else (FEDAVG8, BITS[seed])
    fake_run(tmp_path / name / f'seed{seed}', spec, seed=seed, rows=many_rows(acc, bits))
  results = run_compare(tmp_path, f'individual={LOCAL8}', f'fedavg={FEDAVG8}',
                        extra=['--seeds', '0,1', '--reference', 'individual'])
  assert trained == []  # the fakes are the runs compare asks for, split_seed included
  assert results['fedavg'] == [ACC['fedavg', 0], ACC['fedavg', 1]]
  md = (tmp_path / 'comparison.md').read_text().splitlines()
  assert md[0] == ('| method | mnist ↑ | svhn ↑ | avg ↑ | normalised avg (% of individual) ↑ '
                   '| bits/task ↓ | s/round |')
  cells = {line.split('|')[1].strip(): [c.strip() for c in line.split('|')[2:-2]]
           for line in md[2:]}
  assert cells['individual'] == ['85.00 ± 5.00', '65.00 ± 5.00', '75.00 ± 5.00', '100.0', '–']
  # avg: 43.5 and 64 per seed; normalised: (75 + 45) / 2 = 60 and (80 + 80) / 2 = 80
  # against the same seed's individual run; bits: (145 k + 150.8 k) / 2.
  assert cells['fedavg'] == ['66.00 ± 6.00', '41.50 ± 14.50', '53.75 ± 10.25', '70.0 ± 10.0',
                             '147.9 k']
  rows = (tmp_path / 'comparison.csv').read_text().splitlines()
  assert rows[0] == 'method,mnist,svhn,avg,normalised_avg,bits_per_task,seconds_per_round'
  assert rows[1].startswith('individual,85.0,65.0,75.0,100.0,0.0,')
  assert rows[2].startswith('fedavg,66.0,41.5,53.75,70.0,147900.0,')


def test_many_task_table_without_the_reference():
  results = {'fedavg': [{'mnist': 50., 'svhn': 70.}]}
  md, csv_text = compare.many_task_table(results, 'individual', {'fedavg': [6.32e6]})
  assert md.splitlines()[2] == '| fedavg | 50.00 | 70.00 | 60.00 | – | 6.32 M |'
  assert csv_text.splitlines()[1] == 'fedavg,50.0,70.0,60.0,nan,6320000.0'


@pytest.mark.parametrize('bits, text', [(0., '–'), (float('nan'), '–'), (512., '512'),
                                        (147_900., '147.9 k'), (6_320_000., '6.32 M')])
def test_bits_are_written_in_k_or_m(bits, text):
  assert compare.format_bits(bits) == text


def test_many_task_and_dense_runs_do_not_mix(tmp_path, trained, capsys):
  for runs, extra, expected in [
      ([f'fedavg={FEDAVG8}', f'local={LOCAL}', f'ind={LOCAL8}'], [],
       'error: many-task runs (fedavg, ind) and dense runs (local) make different tables; '
       'compare each setting in its own call'),
      ([f'fedavg={FEDAVG8}', f'ind={LOCAL8}'], ['--pair', 'fedavg=ind'],
       'error: --pair sets Δm references; the many-task table has no Δm')]:
    with pytest.raises(SystemExit) as e:
      run_compare(tmp_path / 'out', *runs, extra=extra)
    err = capsys.readouterr().err.splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith(expected), err
  assert trained == [] and not (tmp_path / 'out').exists()


def test_the_seed_sets_the_split_of_many_task_runs_only(tmp_path, trained):
  run_compare(tmp_path / 'many', f'fedavg={FEDAVG8}', extra=['--seeds', '3,4', '--no-replicas'])
  run_compare(tmp_path / 'dense', f'fedavg={FEDAVG} split_seed=7', extra=['--seeds', '3'])
  assert [(c.seed, c.split_seed) for c, _ in trained] == [(3, 3), (4, 4), (3, 7)]
  run_compare(tmp_path / 'sweep', f'fedavg={FEDAVG8}', extra=['--seeds', '3,4'])
  s = validate.sweep_of(trained[-1][0])  # as replicas: each its own split too
  assert [(p['seed'], p['split_seed']) for p in s.points] == [(3, 3), (4, 4)]


def _comm_run(values: dict[int, float], up: int) -> list[dict]:
  """A dense run's rows: per round an eval of c0/semseg and a comm row (2 clients)."""
  rows = []
  for rnd, v in values.items():
    rows.append({'round': rnd, 'type': 'eval', 'client': 'c0', 'task': 'semseg',
                 'metric': 'mIoU', 'value': v})
    rows.append({'round': rnd, 'type': 'comm', 'up_bytes': [up, up], 'down_bytes': [up, up],
                 'up_mb': 2 * up / 1e6, 'down_mb': 2 * up / 1e6})
  return rows


def test_traffic_columns_and_the_delta_m_against_megabytes_curve(tmp_path):
  from fedjax_mtl import comm
  rows = {'local': [_comm_run({1: 10., 2: 20.}, 0), _comm_run({1: 10., 2: 40.}, 0)],
          'fedavg': [_comm_run({1: 11., 2: 22.}, 250_000), _comm_run({1: 12., 2: 40.}, 250_000)]}
  curves = compare.traffic_curves(rows, 'local')
  # 1 MB a round (2 clients x 250 kB up and down); Δm per seed, then the mean.
  assert curves['fedavg'][0] == pytest.approx([1.0, 2.0])
  assert curves['fedavg'][1] == pytest.approx([(10 + 20) / 2, (10 + 0) / 2])
  assert curves['local'][1] == pytest.approx([0.0, 0.0])
  traffic = {m: [comm.totals(r) for r in rs] for m, rs in rows.items()}
  results = {m: [{'c0/semseg mIoU': r[-2]['value']} for r in rs] for m, rs in rows.items()}
  md, csv_text = report.comparison_table(results, 'local', traffic=traffic)
  assert md.splitlines()[0].endswith('| MB/round | total MB |')
  assert md.splitlines()[3].endswith('| 1.000 | 2.000 |')
  assert csv_text.splitlines()[2].endswith(',1.0,2.0')
  assert report.plot_traffic(curves, str(tmp_path)) == str(tmp_path / 'comparison_traffic.png')
  # A DP run's privacy spent: the last round's ε, '–' for the others.
  dp_rows = rows['fedavg'][0] + [{'round': 2, 'type': 'agg', 'dp_epsilon': 7.5},
                                 {'round': 1, 'type': 'agg', 'dp_epsilon': 5.0}]
  eps = {'local': compare.privacy_spent(rows['local']),
         'fedavg': compare.privacy_spent([dp_rows])}
  assert eps == {'local': None, 'fedavg': 7.5}
  md, csv_text = report.comparison_table(results, 'local', epsilons=eps)
  assert md.splitlines()[0].endswith('| ε |') and md.splitlines()[2].endswith('| – |')
  assert md.splitlines()[3].endswith('| 7.5 |') and csv_text.splitlines()[2].endswith(',7.5')


def test_many_task_accuracy_against_megabytes():
  comm_row = lambda rnd, b: {'round': rnd, 'type': 'comm', 'up_bytes': [b], 'down_bytes': [b],
                             'up_mb': b / 1e6, 'down_mb': b / 1e6}
  run = lambda scale: [comm_row(1, 500_000), comm_row(2, 500_000)] + many_rows(
      {'mnist': 40. * scale, 'svhn': 60. * scale})
  curves = compare.accuracy_curves({'fedavg': [run(1.), run(0.5)]})
  # Evaluated at rounds 1 (half the final accuracy) and 2; 1 MB a round.
  assert curves['fedavg'][0] == pytest.approx([1.0, 2.0])
  assert curves['fedavg'][1] == pytest.approx([0.5 * 50 * 0.75, 50 * 0.75])
