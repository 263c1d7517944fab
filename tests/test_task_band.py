"""scripts/task_band.py's arithmetic and plan (fedjax_mtl/task_band.py); its runs are
scripts/compare.py's, tested there."""

import math

import pytest

from fedjax_mtl import compare, task_band


def test_position_runs_from_trivial_to_ceiling_for_both_directions():
  assert task_band.position(4., 44., 24.) == pytest.approx(50.)  # mIoU: higher is better
  assert task_band.position(40., 4., 13.) == pytest.approx(75.)  # mErr: lower is better
  assert task_band.position(40., 4., 41.) < 0  # worse than trivial
  assert math.isnan(task_band.position(3., 3., 5.))


def test_table_averages_seeds_and_marks_the_band():
  trivial = {'pascal/semseg': 4., 'nyud/depth': 1.2, 'nyud/semseg': 1.}
  runs = {'local': [{'pascal/semseg': 20., 'nyud/depth': 0.7}, {'pascal/semseg': 30.,
                                                               'nyud/depth': 0.9}],
          'fedhca2': [{'pascal/semseg': 26., 'nyud/depth': 0.8}] * 2,
          'ceiling_pascal': [{'pascal/semseg': 44.}], 'ceiling_nyud': [{'nyud/depth': 0.2}]}
  md, csv = task_band.table(trivial, runs)
  rows = {line.split(',')[0] + '/' + line.split(',')[1]: line.split(',')
          for line in csv.splitlines()[1:]}
  assert set(rows) == {'pascal/semseg', 'nyud/depth'}  # nyud/semseg: no run holds it
  assert float(rows['pascal/semseg'][-1]) == pytest.approx(100. * (25. - 4.) / 40.)
  assert float(rows['nyud/depth'][-1]) == pytest.approx(100. * (1.2 - 0.8) / 1.0)
  assert '| pascal/semseg | mIoU↑ | 4 | 44 | 25.00 ± 5.00 | 26.00 ± 0.00 | 52 | yes |' in md
  assert '| nyud/depth | RMSE↓ |' in md and '| 40 | yes |' in md


def test_plan_runs_the_variant_and_central_ceilings_on_more_data():
  base = compare.load_config('configs/local.py:smoke')
  specs = task_band.plan_specs('smoke', base, 2, 10)
  assert specs[:2] == ['local=configs/local.py:smoke', 'fedhca2=configs/hca2.py:smoke']
  # smoke leaves normals out: the ceilings keep the variant's tasks of their dataset.
  assert specs[2] == ('ceiling_pascal=configs/local.py:smoke scenario=pascal_mt '
                      "num_rounds=6 eval_every=6 data.num_train={'nyud':160,'pascal':800} "
                      'tasks=semseg,human_parts,sal,edge')
  assert specs[3].startswith('ceiling_nyud=configs/local.py:smoke scenario=nyud_mt')
  assert task_band.plan_specs('', compare.load_config('configs/local.py'), 10, 1)[2] == (
      'ceiling_pascal=configs/local.py scenario=pascal_mt num_rounds=80 eval_every=80')
  # Every planned config is valid (scenario, images, task subset).
  plan = compare.plan_runs(specs, [0], '/nonexistent/band')
  assert [r.config.scenario for r in plan][2:] == ['pascal_mt', 'nyud_mt']
  assert plan[2].config.data.num_train['pascal'] == 800
