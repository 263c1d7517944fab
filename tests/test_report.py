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
