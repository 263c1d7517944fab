"""scripts/matu_figures.py (fedjax_mtl.matu_figures): the sweep's overrides, its table
and plot, and bad input (nothing trains here)."""

import pytest

from fedjax_mtl import compare
from fedjax_mtl import matu_figures


def test_point_overrides():
  assert matu_figures.point_overrides('fig5', 4, None, 10) == 'many.tasks_per_client=4'
  clusters = [['digits', 'digits_perm', 'digits_clutter'], ['shapes', 'colors', 'count_dots'],
              ['gratings', 'texture_freq']]
  o = matu_figures.point_overrides('fig6', 0, clusters, 10)
  assert o == ('many.client_tasks=digits+digits_perm+digits_clutter;shapes+colors+count_dots '
               'many.tasks=colors,count_dots,digits,digits_clutter,digits_perm,shapes')
  # The overrides load as config fields (compare's spec syntax).
  cfg = compare.load_config(f'{matu_figures.METHODS["matu"]} {o}')
  assert cfg.many.client_tasks.count(';') == 1


def test_write_table_and_plot(tmp_path):
  results = {'matu': {2: (80.0, 2.0, 0.04, 40.0), 4: (75.0, 1.0, 0.05, 38.0)},
             'fedavg': {2: (70.0, 3.0, 0.07, 35.0), 4: (60.0, 2.0, 0.14, 30.0)}}
  matu_figures.write('fig5', [2, 4], results, str(tmp_path), seeds=3)
  md = (tmp_path / 'fig5.md').read_text()
  assert '| matu | 80.0 ± 2.0 % · 0.040 MB | 75.0 ± 1.0 % · 0.050 MB |' in md
  (tmp_path / 'one').mkdir()
  matu_figures.write('fig5', [2, 4], results, str(tmp_path / 'one'), seeds=1)  # no spread
  assert '| matu | 80.0 % · 0.040 MB | 75.0 % · 0.050 MB |' in (tmp_path / 'one' / 'fig5.md'
                                                                  ).read_text()
  assert (tmp_path / 'fig5.png').stat().st_size > 1000
  assert 'fedavg,4,60.0,2.0,0.14,30.0' in (tmp_path / 'fig5.csv').read_text()


@pytest.mark.parametrize('args,message', [
    (['--figure=fig5', '--values=2', '--methods=matu,nosuch'], "unknown method 'nosuch'"),
    (['--figure=fig6', '--values=0'], 'is not a file; run scripts/task_relatedness.py'),
    (['--figure=fig5', '--values=two'], 'comma-separated integers'),
])
def test_bad_input_is_one_line(tmp_path, capsys, args, message):
  with pytest.raises(SystemExit) as e:
    matu_figures.main(args + [f'--out={tmp_path / "out"}'])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith('error: ') and message in err and '\n' not in err
  assert not (tmp_path / 'out').exists()
