"""Result tables with Δm, strict-JSON metrics, metric-curve and hyper-weight plots,
the TensorBoard sink."""

import glob
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from fedjax_mtl import report, sinks
from fedjax_mtl.errors import ConfigError


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
  assert report.plot_metric_curves([r for r in rows if r['type'] != 'train'], '.') is None
  assert report.plot_hyperweights([r for r in rows if r['type'] != 'agg'], '.') == []


def test_compare_reads_finished_runs_and_writes_delta_m_over_seeds(tmp_path):
  from fedjax_mtl import compare
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
  from fedjax_mtl import compare
  root = os.path.dirname(os.path.dirname(__file__))
  cfg = compare.load_config(os.path.join(root, 'configs/hca2.py') + ':smoke '
                            'hca2.decoder_agg=none hca2.ca_c=0.2 num_rounds=5 hca2.homo=false')
  assert (cfg.hca2.decoder_agg, cfg.hca2.ca_c, cfg.num_rounds, cfg.hca2.homo) == (
      'none', 0.2, 5, False)
  assert cfg.data.resolution['pascal'] == (32, 32)


def _strict(line):
  def refuse(token):
    raise ValueError(f'non-strict JSON token {token}')
  return json.loads(line, parse_constant=refuse)


def test_jsonl_is_strict_json_with_null_for_non_finite_values(tmp_path):
  path = str(tmp_path / 'metrics.jsonl')
  rows = [{'round': 1, 'type': 'train', 'client': 'c', 'task': 'x', 'loss': float('nan'),
           'steps': np.int64(5)},
          {'round': 1, 'type': 'eval', 'client': 'c', 'task': 'x', 'metric': 'mIoU',
           'value': np.float32('inf')},
          {'round': 2, 'type': 'agg', 'alpha': np.array([0.5, np.nan], np.float32),
           'beta': [[0.1, -float('inf')], [np.float64(0.25), None]], 'rate': np.float32(0.5),
           'flag': np.bool_(True)}]
  report.append_jsonl(path, rows)
  text = open(path).read()
  assert 'NaN' not in text and 'Infinity' not in text
  lines = [_strict(line) for line in text.splitlines()]
  assert lines == report.read_jsonl(path)
  train, ev, agg = lines
  assert train['loss'] is None and train['steps'] == 5 and type(train['steps']) is int
  assert ev['value'] is None
  assert agg['alpha'] == [0.5, None] and agg['beta'] == [[0.1, None], [0.25, None]]
  assert agg['rate'] == 0.5 and agg['flag'] is True
  # A file from before (bare NaN tokens) comes back strict when a resume truncates it.
  with open(path, 'a') as f:
    f.write(json.dumps({'round': 2, 'type': 'train', 'loss': float('nan')}) + '\n')
    f.write(json.dumps({'round': 3, 'type': 'train', 'loss': 1.0}) + '\n')
  report.truncate_jsonl(path, 2)
  again = [_strict(line) for line in open(path).read().splitlines()]
  assert [r['round'] for r in again] == [1, 1, 2, 2] and again[-1]['loss'] is None


def test_results_table_shows_dash_for_missing_values_and_no_delta_m(tmp_path):
  local = _rows([40., 20., 50., 0.5])
  for bad in (None, float('nan'), float('inf')):
    fed = _rows([44., bad, 45., 0.6])
    md, csv_text = report.results_table('fedavg', fed, local)
    row = md.splitlines()[2].split(' | ')
    assert row[2] == '–' and row[1] == '44.00' and md.splitlines()[2].endswith('| – |')
    cells = csv_text.splitlines()[1].split(',')
    assert cells[2] == '' and cells[-1] == '' and float(cells[1]) == 44.
    # A missing value in the reference also leaves Δm empty; local's own Δm too.
    assert report.results_table('fedavg', local, fed)[1].splitlines()[1].endswith(',')
    assert report.results_table('local', fed)[0].splitlines()[2].endswith('| – |')
  # Written and read back through metrics.jsonl, NaN is None and gives the same table.
  path = str(tmp_path / 'm.jsonl')
  report.append_jsonl(path, [{'round': 1, 'type': 'eval', **r}
                             for r in _rows([44., float('nan'), 45., 0.6])])
  assert report.results_table('fedavg', report.final_eval_rows(path), local)[1] == (
      report.results_table('fedavg', _rows([44., None, 45., 0.6]), local)[1])


P_TASKS = ('semseg', 'human_parts', 'normals', 'edge', 'sal')
N_TASKS = ('depth', 'edge', 'normals', 'semseg')
LAYERS = ['linear_0', 'linear_1', 'linear_2', 'linear_3', 'fuse_conv', 'fuse_bn']


def _run_rows(copies, rounds=4, gaps=True):
  """metrics.jsonl rows of a pascal_st_nyud_mt_<copies>c run, with tiny variations around
  3.048 / 0.1 (which draw an offset text on default axes) and None gaps."""
  clients = [(f'pascal_st_{t}_{i * copies + j}', 'pascal', (t,))
             for i, t in enumerate(P_TASKS) for j in range(copies)]
  clients += [(f'nyud_mt_mt_{j}', 'nyud', N_TASKS) for j in range(copies)]
  decoders = [f'{c}/{t}' for c, _, ts in clients for t in ts]
  rows = [{'round': 0, 'type': 'meta', 'clients': [c for c, _, _ in clients],
           'decoders': decoders, 'decoder_layers': LAYERS}]
  for r in range(1, rounds + 1):
    gap = gaps and r == 2
    rows += [{'round': r, 'type': 'train', 'client': c, 'dataset': d, 'task': t,
              'loss': None if gap else 3.048 + 1e-5 * r, 'steps': 5}
             for c, d, ts in clients for t in ts]
    alpha = [0.1 + 1e-6 * (r + i) for i in range(len(clients))]
    beta = [[0.1 + 1e-6 * (r * k + l) for l in range(len(LAYERS))] for k in range(len(decoders))]
    if gap:
      alpha[0], beta[1][2] = None, None
    rows.append({'round': r, 'type': 'agg', 'alpha': alpha, 'beta': beta})
    rows += [{'round': r, 'type': 'eval', 'client': c, 'dataset': d, 'task': t, 'metric': 'm',
              'value': None if gap else 20. + 1e-4 * r}
             for c, d, ts in clients for t in ts]
  return rows, clients, decoders


def _written(tmp_path, rows):
  path = str(tmp_path / 'metrics.jsonl')
  report.append_jsonl(path, rows)
  return path


def _check_axes(ax, ylabel_start):
  assert ax.get_ylabel().startswith(ylabel_start), ax.get_ylabel()
  assert ax.yaxis.get_offset_text().get_text() == ''
  assert ax.xaxis.get_offset_text().get_text() == ''


def _legend_labels(fig_or_sub):
  (legend,) = fig_or_sub.legends
  return [t.get_text() for t in legend.get_texts()]


@pytest.mark.parametrize('copies', [1, 4])
def test_plots_are_labelled_without_offset_text_at_1c_and_4c(tmp_path, copies):
  rows, clients, decoders = _run_rows(copies)
  rows = report.read_jsonl(_written(tmp_path, rows))  # through the strict file, Nones and all
  fig = report.curves_figure(rows)
  fig.draw_without_rendering()
  panels = fig.subfigs
  assert len(panels) == 10 and sum(p.get_visible() for p in panels) == 9  # (dataset, task)s
  for sub in panels[:9]:
    loss_ax, metric_ax = sub.axes
    _check_axes(loss_ax, 'train loss')
    _check_axes(metric_ax, 'test m')
    assert metric_ax.get_xlabel() == 'round'
    assert len(loss_ax.lines) == len(metric_ax.lines) == copies
    assert len(_legend_labels(sub)) == copies
    colours = {tuple(l.get_color()) + (l.get_linestyle(),) for l in loss_ax.lines}
    assert len(colours) == copies
  assert _legend_labels(panels[0]) == [c for c, _, _ in clients[:copies]]
  assert _legend_labels(panels[-2]) == [f'nyud_mt_mt_{j}' for j in range(copies)]
  figs = report.hyperweight_figures(rows)
  for f in figs.values():
    f.draw_without_rendering()
  (ax,) = figs['alpha'].axes
  _check_axes(ax, 'α')
  assert len(ax.lines) == len(clients) and _legend_labels(figs['alpha']) == [c for c, _, _ in clients]
  beta_axes = [a for a in figs['beta'].axes if a.get_visible()]
  assert [a.get_title() for a in beta_axes] == LAYERS
  for a in beta_axes:
    assert a.yaxis.get_offset_text().get_text() == '' and len(a.lines) == len(decoders)
  _check_axes(beta_axes[0], 'β')
  assert _legend_labels(figs['beta']) == decoders
  styles = {tuple(l.get_color()) + (l.get_linestyle(),) for l in beta_axes[0].lines}
  assert len(styles) == len(decoders)  # no two decoders look alike (36 at 4c)
  # Every legend lies outside the plotting areas.
  for f, axes in [(figs['alpha'], [ax]), (figs['beta'], beta_axes)] + [
      (sub, sub.axes) for sub in panels[:9]]:
    box = f.legends[0].get_window_extent()
    assert not any(box.overlaps(a.get_window_extent()) for a in axes)


def test_curves_of_a_run_where_clients_sit_rounds_out():
  """Partial participation: panels follow the evaluation's order (not the first round
  that happened to train a task), a client's train loss has a gap where it sat out,
  and a client that trained in one round only still shows (markers)."""
  ev = lambda rnd, c, t: {'round': rnd, 'type': 'eval', 'client': c, 'dataset': 'pascal',
                          'task': t, 'metric': 'mIoU', 'value': 1.}
  tr = lambda rnd, c, t: {'round': rnd, 'type': 'train', 'client': c, 'dataset': 'pascal',
                          'task': t, 'loss': float(rnd), 'steps': 2}
  rows = [tr(1, 'c1', 'parts'), tr(2, 'c0', 'semseg'), tr(3, 'c1', 'parts'),
          ev(3, 'c0', 'semseg'), ev(3, 'c1', 'parts')]
  fig = report.curves_figure(rows)
  fig.draw_without_rendering()
  assert [sub.axes[0].get_title() or sub._suptitle.get_text() for sub in fig.subfigs] == [
      'pascal · semseg', 'pascal · parts']
  (lone,) = fig.subfigs[0].axes[0].lines
  assert lone.get_marker() == 'o' and np.isfinite(lone.get_ydata()).tolist() == [
      False, True, False]
  (gappy,) = fig.subfigs[1].axes[0].lines
  np.testing.assert_array_equal(gappy.get_ydata(), [1., np.nan, 3.])


def _events(logdir):
  """(tag, step, value) of every scalar in the TFRecord event files under `logdir`."""
  from tensorboardX.proto import event_pb2
  out = []
  for path in sorted(glob.glob(os.path.join(logdir, 'events.out.tfevents.*'))):
    data = open(path, 'rb').read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack('<Q', data[pos:pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
      pos += 12 + length + 4  # length, its crc, the record, its crc
      out += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
  return out


def test_tensorboard_sink_writes_rows_as_scalars(tmp_path):
  meta = {'round': 0, 'type': 'meta', 'clients': ['a', 'b'], 'decoders': ['a/x', 'b/y'],
          'decoder_layers': ['l0', 'l1']}
  sink = sinks.TensorBoardSink(str(tmp_path / 'tb'))
  sink.write([meta])
  sink.write([{'round': 1, 'type': 'train', 'client': 'a', 'dataset': 'd', 'task': 'x',
               'loss': 0.75, 'steps': 3},
              {'round': 1, 'type': 'train', 'client': 'b', 'dataset': 'd', 'task': 'y',
               'loss': float('nan'), 'steps': 3},
              {'round': 1, 'type': 'agg', 'alpha': [0.25, None], 'beta': [[0.5, 0.125], [1., 2.]],
               'ca_conflict_rate': 0.5}])
  sink.write([{'round': 2, 'type': 'eval', 'client': 'b', 'dataset': 'd', 'task': 'y',
               'metric': 'mIoU', 'value': 12.5},
              {'round': 2, 'type': 'eval', 'client': 'a', 'dataset': 'd', 'task': 'x',
               'metric': 'mIoU', 'value': None}])
  sink.close()
  got = {(tag, step): value for tag, step, value in _events(str(tmp_path / 'tb'))}
  assert got == {('train/a/x/loss', 1): 0.75, ('agg/alpha/a', 1): 0.25,
                 ('agg/beta/a/x/l0', 1): 0.5, ('agg/beta/a/x/l1', 1): 0.125,
                 ('agg/beta/b/y/l0', 1): 1., ('agg/beta/b/y/l1', 1): 2.,
                 ('agg/ca_conflict_rate', 1): 0.5, ('eval/b/y/mIoU', 2): 12.5}
  # Without a meta row the weights are named by index.
  assert [t for t, _, _ in sinks.scalars([{'round': 3, 'type': 'agg', 'alpha': [1., 2.]}])] == [
      'agg/alpha/0', 'agg/alpha/1']


def test_tensorboard_sink_without_the_library_is_a_config_error(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, 'tensorboardX', None)  # import now raises ImportError
  with pytest.raises(ConfigError, match=r'pip install "\.\[tensorboard\]"'):
    sinks.TensorBoardSink(str(tmp_path))
  # Importing the package and its report/sink modules never needs the library.
  code = ('import sys; import fedjax_mtl, fedjax_mtl.sinks, fedjax_mtl.report; '
          'sys.exit("tensorboardX" in sys.modules)')
  assert subprocess.run([sys.executable, '-c', code]).returncode == 0
