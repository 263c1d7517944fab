"""scripts/paper_tables.py (fedjax_mtl/paper_tables.py): every table's runs plan, our
numbers beside the paper's, Δm over the table's columns, the rank agreement, and the
kept raw results."""

import json
import os

import numpy as np
import pytest

from fedjax_mtl import compare, paper_numbers, paper_tables


@pytest.mark.parametrize('name', list(paper_tables.LAYOUTS))
def test_a_layout_covers_its_paper_table_and_its_runs_plan(name, tmp_path):
  lay = paper_tables.LAYOUTS[name]
  tab = paper_numbers.get(lay.table)
  # every printed row has its run, nothing more but the reference rows it does not print
  assert set(lay.runs) - set(lay.unprinted) == set(tab.rows)
  assert set(lay.unprinted) <= set(lay.runs) and not set(lay.unprinted) & set(tab.rows)
  assert not lay.reference or lay.reference in lay.runs
  assert set(lay.pairs) <= set(lay.runs) and set(lay.pairs.values()) <= set(lay.runs)
  assert lay.rank_by == 'delta_m' or lay.rank_by in tab.keys
  specs = [f'{n}={spec}' for n, spec in lay.runs.values()]
  assert len({n for n, _ in lay.runs.values()}) == len(specs)
  # The configs load and validate (what --run would start), before anything runs.
  plan = compare.plan_runs(specs, [0], str(tmp_path))
  assert [r.name for r in plan] == [n for n, _ in lay.runs.values()]


def test_a_paper_column_is_the_mean_over_our_clients_of_its_dataset_and_task():
  ours = {'pascal_st_semseg_0/semseg mIoU': 40., 'pascal_st_semseg_1/semseg mIoU': 50.,
          'nyud_mt_mt_0/semseg mIoU': 7., 'pascal_mt_mt_0/normals mErr': 20.}
  assert paper_tables.paper_column_value(ours, 'pascal/semseg mIoU') == 45.
  assert paper_tables.paper_column_value(ours, 'nyud/semseg mIoU') == 7.
  assert paper_tables.paper_column_value(ours, 'pascal/normals mErr') == 20.
  assert np.isnan(paper_tables.paper_column_value(ours, 'nyud/depth RMSE'))
  acc = {'digits accuracy': 60., 'shapes accuracy': 80.}
  assert paper_tables.paper_column_value(acc, 'avg accuracy') == 70.
  assert np.isnan(paper_tables.paper_column_value(acc, 'mnist accuracy'))


def _as_ours(tab, row, scale=1.):
  """Results of ours equal to the paper's row (a 1c run: one client per column)."""
  client = {'pascal': 'pascal_st_{}_0', 'nyud': 'nyud_mt_mt_0'}
  out = {}
  for key, v in zip(tab.keys, tab.rows[row]):
    ds_task, metric = key.split(' ')
    ds, task = ds_task.split('/')
    out[f'{client[ds].format(task)}/{task} {metric}'] = v * scale
  return out


def test_our_numbers_equal_to_the_papers_give_its_delta_m_and_full_agreement():
  lay = paper_tables.LAYOUTS['fedhca2_tab3']
  tab = paper_numbers.get('fedhca2_tab3')
  results = {name: {s: _as_ours(tab, row) for s in (0, 1)} for row, (name, _) in lay.runs.items()}
  c = paper_tables.compare_table(lay, results)
  for row, dm in c['delta_m'].items():  # the printed Δm, within its rounding
    assert dm == pytest.approx([tab.delta_m[row]] * 2, abs=0.01)
  assert c['tau'] == pytest.approx(1.) and c['flips'] == []
  # Ours with +Enc and +Dec swapped: one pair flips, τ drops.
  results['enc'], results['dec'] = results['dec'], results['enc']
  c = paper_tables.compare_table(lay, results)
  assert c['flips'] == [('+Enc', '+Dec')] and c['tau'] < 1.
  md = paper_tables.render(lay, results)
  assert '| +Enc+Dec | 57.55 ± 0.00 | 57.55 |' in md
  assert 'Kendall τ = 0.67; pairs that flip: +Enc > +Dec in the paper, < ours.' in md
  assert paper_tables.render(lay, None).rstrip().endswith('_Not run yet._')


def test_delta_m_is_over_the_tables_columns_so_scenarios_may_differ():
  """FedHCA2 Tab. 4: the ST+MT run has the PASCAL multi-task client too; only the
  NYUD single-task columns count."""
  lay = paper_tables.LAYOUTS['fedhca2_tab4']
  st = {f'nyud_st_{t}_{i}/{t} {m}': v for i, (t, m, v) in enumerate(
      [('semseg', 'mIoU', 30.), ('depth', 'RMSE', 0.8), ('normals', 'mErr', 20.),
       ('edge', 'odsF', 70.)])}
  better = {k: v * (0.9 if k.split(' ')[1] in ('RMSE', 'mErr') else 1.1) for k, v in st.items()}
  with_mt = {**better, 'pascal_mt_mt_0/semseg mIoU': 1.}
  c = paper_tables.compare_table(lay, {'st_local': {0: st}, 'st_fedhca2': {0: better},
                                       'st_mt_fedhca2': {0: with_mt}})
  assert c['delta_m']['ST+Ours'] == pytest.approx([10.])
  assert c['delta_m']['ST+MT+Ours'] == pytest.approx([10.])


def test_a_swept_value_table_is_against_the_local_run_it_does_not_print():
  """FedHCA2 Supp. Tab. 7 (c): every value's Δm against our Local run, which the
  rendered table adds as its last row (the paper prints its Local in Tab. 1)."""
  lay = paper_tables.LAYOUTS['fedhca2_supp_tab7']
  tab = paper_numbers.get('fedhca2_supp_tab7')
  base = _as_ours(paper_numbers.get('fedhca2_tab1'), 'Local')
  results = {'local': {0: base}}
  for k, row in enumerate(tab.rows):
    results[lay.runs[row][0]] = {0: {key: v * (1.01 + 0.01 * k) for key, v in base.items()}}
  c = paper_tables.compare_table(lay, results)
  assert 'Local' not in c['names'] and len(c['names']) == 4
  # +1 % on every higher-is-better column, -1 % on every lower-is-better one: Δm 0.
  lower = [col.lower_better for col in tab.columns]
  want = 100 * np.mean([-0.01 if lo else 0.01 for lo in lower])
  assert c['delta_m']['0.2'] == pytest.approx([want])
  md = paper_tables.render(lay, results)
  assert md.rstrip().splitlines()[-3].startswith('| Local | ')
  assert "against its Tab. 1 Local row" in md


def _fake_run(wd, rows, version=None):
  os.makedirs(wd, exist_ok=True)
  with open(os.path.join(wd, 'config.json'), 'w') as f:
    json.dump({'num_rounds': 2, 'data': {'synthetic_version': version or 1}}, f)
  with open(os.path.join(wd, 'metrics.jsonl'), 'w') as f:
    for r in rows:
      f.write(json.dumps({'round': 2, 'type': 'eval', **r}) + '\n')
  open(os.path.join(wd, 'results.csv'), 'w').close()


def test_collect_reads_per_seed_runs_and_replicas_and_keeps_them(tmp_path, capsys):
  runs = tmp_path / 'runs' / 'fedhca2_tab5'
  row = lambda v: [{'client': 'pascal_mt_mt_0', 'task': 'semseg', 'metric': 'mIoU', 'value': v}]
  now = paper_tables.bench_version()
  _fake_run(str(runs / 'local' / 'seed0'), row(10.), now)
  _fake_run(str(runs / 'local' / 'seed1'), row(12.), now)
  for s in (0, 1):
    _fake_run(str(runs / 'fedhca2' / 'seeds0,1' / 'replicas' / f'seed={s}'), row(11. + s),
              now)
  os.makedirs(runs / 'fedhca2' / 'seeds0,1' / 'replicas' / 'seed=2')  # unfinished: left out
  raw = str(tmp_path / 'raw')
  text = paper_tables.main(['--collect=fedhca2_tab5', f'--runs={tmp_path / "runs"}',
                            f'--raw={raw}', f'--out={tmp_path / "tables.md"}'])
  got = paper_tables.read_raw(os.path.join(raw, 'fedhca2_tab5.csv'))
  key = 'pascal_mt_mt_0/semseg mIoU'
  assert got == {'local': {0: {key: 10.}, 1: {key: 12.}},
                 'fedhca2': {0: {key: 11.}, 1: {key: 12.}}}
  paper = paper_numbers.get('fedhca2_tab5').rows['Ours'][0]
  assert f'| Ours | 11.50 ± 0.50 | {paper:.2f} |' in text and '| 5.00 ± 5.00 |' in text
  assert (tmp_path / 'tables.md').read_text() == text
  assert '### FedHCA2 Table 1: fedhca2_tab1' in text and '_Not run yet._' in text
  # The scene version the runs drew is kept and said; a table of older scenes is
  # marked stale.
  assert paper_tables.read_meta('fedhca2_tab5', raw) == {'synthetic_version': [now]}
  assert f'Scenes: version {now} (`data.synthetic_version`).\n' in text
  assert '**Stale:**' not in text
  _fake_run(str(runs / 'local' / 'seed1'), row(12.), now - 1)
  text = paper_tables.main(['--collect=fedhca2_tab5', f'--runs={tmp_path / "runs"}',
                            f'--raw={raw}', f'--out={tmp_path / "tables.md"}'])
  assert f'Scenes: version {now - 1}, {now}' in text
  assert f'**Stale:** `:bench` now draws version {now}' in text


def test_collecting_a_table_with_no_finished_runs_is_one_line(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    paper_tables.main(['--collect=fedhca2_tab5', f'--runs={tmp_path}', f'--raw={tmp_path}'])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith('error: no finished runs of fedhca2_tab5 under') and err.count('\n') == 1
  with pytest.raises(SystemExit):
    paper_tables.main(['--collect=nosuch', f'--runs={tmp_path}'])
  assert "unknown table 'nosuch'; valid choices: fedhca2_tab1" in capsys.readouterr().err


def test_a_run_another_table_finished_with_the_same_config_is_copied_not_rerun(tmp_path):
  # Tab. 3's Local and FedHCA2 are Tab. 1's runs: --run=fedhca2_tab3 copies them from
  # runs/fedhca2_tab1 (compare.py then reuses the copies). A run of another config
  # under the same name, and a run already started in the table, are left alone.
  from fedjax_mtl import compare
  root = tmp_path / 'runs'
  tab1 = paper_tables.get('fedhca2_tab1')
  plan = {r.name: r for r in compare.plan_runs(tab1.run_args()[:2], list(paper_tables.SEEDS),
                                                str(root / 'fedhca2_tab1'), replicas=True)}
  local, fedavg = plan['local'], plan['fedavg']
  assert os.path.basename(local.workdir) == 'seeds0,1,2'  # the seeds as one sweep
  for run, cfg in ((local, local.config), (fedavg, fedavg.config)):
    os.makedirs(os.path.join(run.workdir, 'replicas', 'seed=0'))
    with open(os.path.join(run.workdir, 'config.json'), 'w') as f:
      f.write(cfg.to_json_best_effort())
    for name in ('results.csv', '.lock', os.path.join('replicas', 'seed=0', 'results.csv')):
      open(os.path.join(run.workdir, name), 'w').close()
  # Tab. 1's 'fedavg' folder renamed 'fedhca2': same name as Tab. 3's, another config.
  os.rename(root / 'fedhca2_tab1' / 'fedavg', root / 'fedhca2_tab1' / 'fedhca2')
  got = paper_tables.borrow_runs(paper_tables.get('fedhca2_tab3'), str(root), 'fedhca2_tab3')
  dst = root / 'fedhca2_tab3' / 'local' / 'seeds0,1,2'
  assert got == [(str(dst), local.workdir)]
  assert os.path.samefile(dst / 'replicas' / 'seed=0' / 'results.csv',  # (a hard link)
                         os.path.join(local.workdir, 'replicas', 'seed=0', 'results.csv'))
  assert not (dst / '.lock').exists()  # (the lock file is the source run's)
  assert not (root / 'fedhca2_tab3' / 'fedhca2').exists()
  # compare.py's own plan now reuses the copy.
  tab3 = paper_tables.get('fedhca2_tab3')
  again = compare.plan_runs(tab3.run_args(), list(paper_tables.SEEDS),
                            str(root / 'fedhca2_tab3'), replicas=True)
  assert {r.name: r.action for r in again} == {'local': 'reuse', 'enc': 'run', 'dec': 'run',
                                               'fedhca2': 'run'}
  assert paper_tables.borrow_runs(tab3, str(root), 'fedhca2_tab3') == []
