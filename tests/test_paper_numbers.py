"""Internal consistency of fedjax_mtl.paper_numbers, the papers' result tables typed in.

The papers themselves are not read here (they are not on CI): the typed numbers are checked
against each other. Every printed Δm is recomputed from the typed metrics with FedHCA2's
formula (fedjax_mtl.metrics.delta_m) and must agree within what the printed roundings
explain; values the papers print in several tables must agree; a few values, checked by hand
against the papers' text, are asserted explicitly.
"""

from __future__ import annotations

import re
from decimal import Decimal

import numpy as np
import pytest

from fedjax_mtl import paper_numbers
from fedjax_mtl.metrics.delta_m import delta_m

TABLES = paper_numbers.TABLES

EXPECTED_TABLES = (
    'fedhca2_tab1', 'fedhca2_tab2', 'fedhca2_tab3', 'fedhca2_tab4', 'fedhca2_tab5',
    'fedhca2_supp_tab1_1c', 'fedhca2_supp_tab1_2c', 'fedhca2_supp_tab1_4c',
    'fedhca2_supp_tab2', 'fedhca2_supp_tab3', 'fedhca2_supp_tab4', 'fedhca2_supp_tab5',
    'fedhca2_supp_tab6', 'fedhca2_supp_tab7', 'fedhca2_supp_tab8',
    'feddea_tab1', 'feddea_tab2', 'feddea_tab3_nyud', 'feddea_tab3_pascal', 'feddea_tab4',
    'feddea_tab5_nyud', 'feddea_tab5_pascal', 'feddea_tab6',
    'matu_tab1', 'matu_tab2',
    'ntk_tab1',
)

# Tables whose Δm is relative to a Local row the table itself does not print (FedHCA2's
# hyper-parameter sweeps): table -> (table printing the reference, its row).
EXTERNAL_REFERENCE = {
    'fedhca2_supp_tab4': ('fedhca2_tab1', 'Local'),
    'fedhca2_supp_tab5': ('fedhca2_tab2', 'Local'),
    'fedhca2_supp_tab6': ('fedhca2_tab1', 'Local'),
    'fedhca2_supp_tab7': ('fedhca2_tab1', 'Local'),
    'fedhca2_supp_tab8': ('fedhca2_tab2', 'Local'),
}

# FedDEA's Tables 3 and 5: each '<base> +<module>' row's Δ is relative to the row '<base>'.
PER_BASE_REFERENCE = (
    'feddea_tab3_nyud', 'feddea_tab3_pascal', 'feddea_tab5_nyud', 'feddea_tab5_pascal',
)

# Tables left out of the Δm check because the paper computes their Δm differently from the
# columns shown: none (every printed Δm of the four papers follows FedHCA2's formula over
# the table's own columns).
DELTA_M_EXCLUDED: dict[str, str] = {}

# Single rows whose printed Δm disagrees with the printed metrics far beyond rounding. Every
# value of these rows was checked against the papers' text: these are the papers' own slips
# (see each table's notes), not typos here. test_known_paper_slips_still_disagree keeps this
# list honest.
PAPER_DELTA_M_SLIPS = {
    ('fedhca2_supp_tab1_4c', 'FedProx'): 'printed -24.04, metrics give -23.89',
    ('fedhca2_supp_tab1_4c', 'FedPer'): 'printed -2.96, metrics give -1.83 (edge 76.00?)',
    ('feddea_tab3_pascal', 'Moon +PCGrad'): "printed -2.80, Moon's base row gives +19.28",
    ('feddea_tab3_pascal', 'Moon +HEAL'): "printed -1.30, Moon's base row gives +21.53",
    ('feddea_tab3_pascal', 'Moon +DEA(Ours)'): "printed +2.84, Moon's base row gives +27.97",
    ('feddea_tab5_nyud', 'FedNova +HEAL'): 'printed +6.16%, metrics give +11.13',
    ('feddea_tab5_nyud', 'FedNova +DEA'): 'printed +23.39%, metrics give +30.74',
}

# Printed Δm have two decimals: half a unit of the last digit.
DELTA_M_HALF_ULP = 0.005

DENSE_KEY = re.compile(
    r'^(pascal|nyud)/(semseg|human_parts|sal|normals|edge|depth) (mIoU|maxF|mErr|odsF|RMSE)$')
MANY_TASK_KEY = re.compile(r'^[a-z0-9]+ accuracy$|^bitrate$')


def _decimals(value: float) -> int:
  return max(0, -Decimal(repr(value)).as_tuple().exponent)


def _half_ulps(table: paper_numbers.PaperTable) -> dict[str, float]:
  """Half a unit of each column's last printed digit.

  Floats drop trailing zeros (72.00 -> 72.0), so a column's decimals are the most any of its
  values shows (every column of these tables prints one number of decimals).
  """
  out = {}
  for j, column in enumerate(table.columns):
    decimals = max(_decimals(v[j]) for v in table.rows.values() if v[j] is not None)
    out[column.key] = 0.5 * 10.0**-decimals
  return out


def _reference(table: paper_numbers.PaperTable, row: str):
  """Returns (the table printing the row Δm of `row` is relative to, that row's name)."""
  if table.reference is not None:
    return table, table.reference
  if table.name in EXTERNAL_REFERENCE:
    other, ref_row = EXTERNAL_REFERENCE[table.name]
    return paper_numbers.get(other), ref_row
  if table.name in PER_BASE_REFERENCE:
    return table, row.split(' +')[0]
  raise AssertionError(f'{table.name}: no reference for its Δm')


def _recompute(table: paper_numbers.PaperTable, row: str) -> tuple[float, float]:
  """Returns (Δm of `row` recomputed from the typed metrics, the rounding tolerance).

  The tolerance is the first-order worst case of the printed roundings: every metric M and
  reference R is off by up to half a unit of its last digit (h_M, h_R), which moves the
  term (M - R)/R by up to h_M/R + |M| h_R/R^2, and the printed Δm by up to 0.005.
  """
  ref_table, ref_row = _reference(table, row)
  method, ref = table.row(row), ref_table.row(ref_row)
  assert set(method) == set(ref), (table.name, row)
  lower = {c.key: c.lower_better for c in table.columns}
  recomputed = delta_m(method, ref, lower)
  h_m, h_r = _half_ulps(table), _half_ulps(ref_table)
  spread = sum(h_m[k] / abs(ref[k]) + abs(method[k]) * h_r[k] / ref[k]**2 for k in method)
  return recomputed, 100.0 * spread / len(method) + DELTA_M_HALF_ULP + 1e-9


def _delta_m_cases():
  for name, table in TABLES.items():
    if table.delta_m and name not in DELTA_M_EXCLUDED:
      for row in table.delta_m:
        if (name, row) not in PAPER_DELTA_M_SLIPS:
          yield pytest.param(name, row, id=f'{name}:{row}')


def test_the_expected_tables_are_there():
  assert tuple(TABLES) == EXPECTED_TABLES
  assert all(name == table.name for name, table in TABLES.items())
  assert len(set(TABLES)) == len(TABLES)


@pytest.mark.parametrize('name', EXPECTED_TABLES)
def test_table_is_well_formed(name):
  table = TABLES[name]
  assert table.paper in ('FedHCA2', 'FedDEA', 'MaTU', 'NTKFedAvg')
  assert table.table and table.caption and '\n' not in table.caption
  assert re.fullmatch(r'\d{3}_[0-9a-f]{16}\.txt', table.source)
  assert table.columns and table.rows
  keys = table.keys
  assert len(set(keys)) == len(keys), f'duplicate column keys in {name}'
  for column in table.columns:
    assert column.label
    if table.paper == 'MaTU':
      assert MANY_TASK_KEY.match(column.key), column.key
      assert column.lower_better == (column.key == 'bitrate')
    elif table.paper == 'NTKFedAvg':
      assert column.key.startswith('pascal/') and column.key.endswith(' mIoU')
      assert not column.lower_better
    else:
      assert DENSE_KEY.match(column.key), column.key
      assert column.lower_better == column.key.endswith((' mErr', ' RMSE')), column.key
  for row, values in table.rows.items():
    assert row and row == row.strip()
    assert isinstance(values, tuple)
    assert len(values) == len(table.columns), f'{name}:{row} has {len(values)} values'
    assert any(v is not None for v in values)
    for v in values:
      assert v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)), (row, v)
  if table.delta_m is not None:
    assert table.delta_m and set(table.delta_m) <= set(table.rows)
    assert list(table.delta_m) == [r for r in table.rows if r in table.delta_m]  # row order
  if table.reference is not None:
    assert table.delta_m is not None and table.reference in table.rows


def test_get_returns_tables_and_names_valid_choices_for_unknown():
  assert paper_numbers.get('fedhca2_tab1') is TABLES['fedhca2_tab1']
  with pytest.raises(KeyError, match='fedhca2_tab1') as info:
    paper_numbers.get('fedhca2_tab9')
  message = str(info.value)
  assert 'fedhca2_tab9' in message and 'valid' in message
  assert all(name in message for name in EXPECTED_TABLES)


def test_every_delta_m_is_checked_or_excluded_on_purpose():
  for name, table in TABLES.items():
    routes = [table.reference is not None, name in EXTERNAL_REFERENCE,
              name in PER_BASE_REFERENCE, name in DELTA_M_EXCLUDED]
    if table.delta_m:
      assert sum(routes) == 1, f'{name}: Δm checked {sum(routes)} ways'
    else:
      assert not any(routes), name
  for name, row in PAPER_DELTA_M_SLIPS:
    assert row in TABLES[name].delta_m


@pytest.mark.parametrize('name,row', list(_delta_m_cases()))
def test_printed_delta_m_matches_the_typed_metrics(name, row):
  table = TABLES[name]
  recomputed, tolerance = _recompute(table, row)
  assert tolerance < 0.1  # rounding never explains more; a typo moves Δm further
  printed = table.delta_m[row]
  assert abs(recomputed - printed) <= tolerance, (
      f'{name}:{row}: Δm recomputed {recomputed:.4f}, printed {printed} '
      f'(rounding explains {tolerance:.4f})')


@pytest.mark.parametrize('name,row', sorted(PAPER_DELTA_M_SLIPS))
def test_known_paper_slips_still_disagree(name, row):
  table = TABLES[name]
  recomputed, tolerance = _recompute(table, row)
  assert abs(recomputed - table.delta_m[row]) > 3 * tolerance


def test_reference_rows_print_zero_delta_m():
  for table in TABLES.values():
    if table.reference is not None and table.reference in table.delta_m:
      assert table.delta_m[table.reference] == 0.0, table.name


# Rows printed in two tables (the same run): (table, row, table, row); their common columns,
# and Δm where both tables have the same columns, must agree.
SAME_RUN = (
    ('fedhca2_tab1', 'FedHCA2', 'fedhca2_tab3', '+Enc+Dec'),
    ('fedhca2_tab1', 'FedHCA2', 'fedhca2_supp_tab3', 'Swin-T'),
    ('fedhca2_tab1', 'FedHCA2', 'fedhca2_supp_tab4', '0.1'),
    ('fedhca2_tab1', 'FedHCA2', 'fedhca2_supp_tab6', '0.01'),
    ('fedhca2_tab1', 'FedHCA2', 'fedhca2_supp_tab7', '0.4'),
    ('fedhca2_tab1', 'FedHCA2', 'fedhca2_supp_tab2', 'ST+MT+Ours'),
    ('fedhca2_tab1', 'Local', 'fedhca2_tab3', 'Local'),
    ('fedhca2_tab1', 'Local', 'fedhca2_supp_tab2', 'ST+Local'),
    ('fedhca2_tab2', 'FedHCA2', 'fedhca2_tab4', 'ST+MT+Ours'),
    ('fedhca2_tab2', 'FedHCA2', 'fedhca2_supp_tab5', '0.1'),
    ('fedhca2_tab2', 'FedHCA2', 'fedhca2_supp_tab8', '0.4'),
    ('fedhca2_tab2', 'Local', 'fedhca2_tab4', 'ST+Local'),
    ('feddea_tab1', 'FedAVG+DEA(Ours)', 'feddea_tab3_nyud', 'FedAvg +DEA(Ours)'),
    ('feddea_tab1', 'FedAVG+DEA(Ours)', 'feddea_tab4', '+DEA'),
    ('feddea_tab3_nyud', 'FedAvg', 'feddea_tab4', 'FedAvg'),
    ('feddea_tab3_nyud', 'FedAvg +DEA(Ours)', 'feddea_tab4', '+DEA'),
    ('feddea_tab2', 'FedAVG+DEA(Ours)', 'feddea_tab3_pascal', 'FedAvg +DEA(Ours)'),
    ('feddea_tab2', 'FedProx+DEA(Ours)', 'feddea_tab3_pascal', 'FedProx +DEA(Ours)'),
    # Not Table 1's FedProx+DEA(Ours) vs Table 3's NYUD row: the paper prints two runs.
    ('feddea_tab5_nyud', 'FedAvg', 'feddea_tab6', 'FedAvg'),
    ('feddea_tab5_nyud', 'FedAvg +DEA', 'feddea_tab6', '+DEA'),
    ('matu_tab1', 'Individual (Centralized)', 'matu_tab2', 'Individual (Centralized)'),
) + tuple(
    ('fedhca2_tab1', row, 'fedhca2_supp_tab1_1c', row)
    for row in paper_numbers.get('fedhca2_supp_tab1_1c').rows)


@pytest.mark.parametrize('a,row_a,b,row_b', SAME_RUN)
def test_rows_printed_twice_agree(a, row_a, b, row_b):
  ta, tb = TABLES[a], TABLES[b]
  va, vb = ta.row(row_a), tb.row(row_b)
  common = set(va) & set(vb)
  assert common
  assert {k: va[k] for k in common} == {k: vb[k] for k in common}
  if ta.keys == tb.keys and ta.delta_m and tb.delta_m and row_a in ta.delta_m:
    assert ta.delta_m[row_a] == tb.delta_m[row_b]


def test_feddea_prints_two_different_fedprox_dea_runs_on_nyud():
  assert (TABLES['feddea_tab1'].row('FedProx+DEA(Ours)')
          != TABLES['feddea_tab3_nyud'].row('FedProx +DEA(Ours)'))


# MaTU rows whose printed Avg. Acc is not the mean of their printed task accuracies (the
# paper's; the text quotes the printed averages): (table, row) -> mean of the tasks.
MATU_AVG_SLIPS = {
    ('matu_tab1', 'NTK-FedAvg'): 65.27,
    ('matu_tab1', 'FedPer'): 82.36,
    ('matu_tab1', 'MaTU (Ours)'): 84.82,
    ('matu_tab2', 'MaTU (Ours)'): 79.49,
}


@pytest.mark.parametrize('name', ['matu_tab1', 'matu_tab2'])
def test_matu_average_is_the_mean_of_the_tasks(name):
  table = TABLES[name]
  task_keys = [k for k in table.keys if k not in ('avg accuracy', 'bitrate')]
  assert len(task_keys) == 8
  for row in table.rows:
    values = table.row(row)
    mean = float(np.mean([values[k] for k in task_keys]))
    # each printed value is off by at most 0.005, so is their mean; plus the printed average
    if (name, row) in MATU_AVG_SLIPS:
      assert mean == pytest.approx(MATU_AVG_SLIPS[name, row], abs=0.005)
      assert abs(mean - values['avg accuracy']) > 0.01
    else:
      assert abs(mean - values['avg accuracy']) <= 0.01 + 1e-9, (row, mean)


def test_ntk_drops_from_one_to_two_clients_per_task_quoted_in_the_text():
  # 'a smaller performance drop (13.90%) compared to FedAvg (14.67%)': the local-work rows,
  # the mean of the three columns, all higher-is-better.
  table = TABLES['ntk_tab1']
  for method, drop in (('NTKFedAvg', 13.90), ('FedAvg', 14.67)):
    one = np.mean(table.rows[f'1 / Local Work / {method}'])
    two = np.mean(table.rows[f'2 / Local Work / {method}'])
    assert 100 * (one - two) / one == pytest.approx(drop, abs=0.005)


def test_spot_values_checked_against_the_papers():
  get = paper_numbers.get
  # FedHCA2 Table 1: the FedHCA2 row and the Local baseline.
  assert get('fedhca2_tab1').rows['FedHCA2'][0] == 57.55
  assert get('fedhca2_tab1').value('Local', 'nyud/depth RMSE') == 0.6487
  assert get('fedhca2_tab1').delta_m['FedHCA2'] == 2.18
  assert get('fedhca2_tab1').delta_m['FedAvg'] == -11.76
  # FedHCA2 Table 2, Table 5 and Supp. Table 1 (4C).
  assert get('fedhca2_tab2').value('FedHCA2', 'nyud/depth RMSE') == 0.7018
  assert get('fedhca2_tab2').delta_m['FedHCA2'] == 0.75
  assert get('fedhca2_tab5').value('Ours', 'pascal/human_parts mIoU') == 54.25
  assert get('fedhca2_supp_tab1_4c').delta_m['FedHCA2'] == 6.36
  assert get('fedhca2_supp_tab1_4c').value('FedPer', 'pascal/edge odsF') == 76.00
  # FedDEA Tables 3, 4, 5.
  assert get('feddea_tab3_nyud').value('FedAvg +DEA(Ours)', 'nyud/semseg mIoU') == 30.78
  assert get('feddea_tab3_nyud').delta_m['FedAvg +DEA(Ours)'] == 10.60
  assert get('feddea_tab3_pascal').delta_m['FedProx +DEA(Ours)'] == 12.89
  assert get('feddea_tab3_pascal').value('FedGA', 'pascal/normals mErr') == 87.75
  assert get('feddea_tab4').delta_m['+DEA(a)'] == -101.96
  assert get('feddea_tab5_pascal').value('FedGA +PCGrad', 'pascal/normals mErr') == 111.12
  assert get('feddea_tab5_pascal').delta_m['Moon +PCGrad'] == -120.85
  assert get('feddea_tab2').value('Local(maxF)', 'pascal/sal maxF') == 78.20
  assert get('feddea_tab2').value('Local(maxF)', 'pascal/edge odsF') is None
  # MaTU Tables 1 and 2 (the text quotes 84.32, 82.11, 64.60, 65.13, 67.14 and 79.47).
  tab1, tab2 = get('matu_tab1'), get('matu_tab2')
  assert tab1.value('MaTU (Ours)', 'avg accuracy') == 84.32
  assert tab1.value('FedPer', 'avg accuracy') == 82.11
  assert [tab1.value(m, 'avg accuracy') for m in ('FedAvg', 'NTK-FedAvg', 'FedProx')] == [
      64.60, 65.13, 67.14]
  assert tab1.value('MaTU (Ours)', 'sun397 accuracy') == 71.61
  assert tab1.value('Individual (Centralized)', 'bitrate') is None
  assert tab2.value('MaTU (Ours)', 'avg accuracy') == 79.47
  assert tab2.value('MaTU (Ours)', 'bitrate') == 8.04
  # NTKFedAvg Table 1.
  assert get('ntk_tab1').value('1 / Local Work / NTKFedAvg', 'pascal/semseg mIoU') == 0.2025
  assert get('ntk_tab1').value('2 / Standard / FedAvg', 'pascal/human_parts mIoU') == 0.0959
