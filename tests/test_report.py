"""Result tables with Δm, metric-curve and hyper-weight plots."""

import os

import numpy as np

from fedjax_mtl import report


def _rows(values):
  tasks = [('c0', 'semseg', 'mIoU'), ('c1', 'normals', 'mErr'), ('c2', 'edge', 'odsF'),
           ('c3', 'depth', 'RMSE')]
  return [{'client': c, 'dataset': 'd', 'task': t, 'metric': m, 'value': v}
          for (c, t, m), v in zip(tasks, values)]


def test_results_table_delta_m_against_local_reference():
  local = _rows([40., 20., 50., 0.5])
  fed = _rows([44., 18., 45., 0.6])
  md, csv_text = report.results_table('fedavg', fed, local)
  want = 100 * np.mean([4 / 40, 2 / 20, -5 / 50, -0.1 / 0.5])
  got = float(csv_text.splitlines()[1].split(',')[-1])
  np.testing.assert_allclose(got, want, rtol=1e-9)
  assert md.splitlines()[0].endswith('| Δm (%)↑ |') and f'{want:.2f}' in md
  assert 'c1/normals mErr↓' in md and 'c2/edge odsF↑' in md
  assert report.results_table('local', local)[1].splitlines()[1].endswith(',0.0')
  assert report.results_table('fedavg', fed)[0].splitlines()[2].endswith('| – |')


def test_plots_written_from_metrics_rows(tmp_path):
  rows = [{'round': 0, 'type': 'meta', 'clients': ['a', 'b'], 'decoders': ['a/x', 'b/y'],
           'decoder_layers': ['l0', 'l1']}]
  for r in (1, 2, 3):
    rows += [{'round': r, 'type': 'train', 'client': c, 'task': 'x', 'loss': 1. / r}
             for c in 'ab']
    rows.append({'round': r, 'type': 'agg', 'alpha': [0.1, 0.1 + r / 100],
                 'beta': [[0.1, 0.1], [0.1, 0.2]]})
  rows += [{'round': 3, 'type': 'eval', 'client': c, 'task': 'x', 'metric': 'mIoU',
            'value': 10.} for c in 'ab']
  assert report.plot_metric_curves(rows, str(tmp_path)).endswith('curves.png')
  written = report.plot_hyperweights(rows, str(tmp_path))
  assert [os.path.basename(p) for p in written] == ['alpha.png', 'beta.png']
  assert all(os.path.getsize(p) > 1000 for p in written)


def test_compare_reads_finished_runs_and_writes_delta_m_over_seeds(tmp_path):
  import json
  import sys
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), 'scripts'))
  import compare
  values = {'local': [[40., 20., 50., 0.5], [42., 21., 52., 0.5]],
            'fedavg': [[44., 18., 45., 0.6], [40., 22., 50., 0.4]]}
  for name, per_seed in values.items():
    for seed, vals in enumerate(per_seed):
      wd = tmp_path / name / f'seed{seed}'
      wd.mkdir(parents=True)
      (wd / 'results.csv').write_text('done\n')  # marks a finished run: not redone
      rows = [{'round': 8, 'type': 'eval', **r} for r in _rows(vals)]
      (wd / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
      # Round 1 compiles and round 3 evaluates: only round 2 counts as steady.
      timing = [{'round': 1, 'seconds': 30.}, {'round': 2, 'seconds': 2. + seed},
                {'round': 3, 'seconds': 9., 'eval': True}]
      (wd / 'timing.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in timing))
  compare.main(['--out', str(tmp_path), '--seeds', '0,1',
                '--run', 'local=configs/local.py', '--run', 'fedavg=configs/fedavg.py'])
  lines = (tmp_path / 'comparison.csv').read_text().splitlines()
  header = lines[0].split(',')
  assert header[-2:] == ['delta_m', 'seconds_per_round']
  assert float(lines[2].split(',')[-1]) == 2.5  # median over seeds of the steady rounds
  dms = [report.results_table('fedavg', _rows(f), _rows(l))[1].splitlines()[1].split(',')[-1]
         for f, l in zip(values['fedavg'], values['local'])]
  np.testing.assert_allclose(float(lines[2].split(',')[-2]), np.mean([float(d) for d in dms]),
                             rtol=1e-9)
  md = (tmp_path / 'comparison.md').read_text()
  assert '| local |' in md and ' ± ' in md and md.splitlines()[0].endswith('Δm (%) ↑ | s/round |')


def test_compare_config_overrides():
  import sys
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), 'scripts'))
  import compare
  root = os.path.dirname(os.path.dirname(__file__))
  cfg = compare.load_config(os.path.join(root, 'configs/hca2.py') + ':smoke '
                            'hca2.decoder_agg=none hca2.ca_c=0.2 num_rounds=5 hca2.homo=false')
  assert (cfg.hca2.decoder_agg, cfg.hca2.ca_c, cfg.num_rounds, cfg.hca2.homo) == (
      'none', 0.2, 5, False)
  assert cfg.data.resolution['pascal'] == (32, 32)
