"""The papers' tables with ours beside them (`scripts/paper_tables.py`).

    # run a table's methods and seeds (scripts/compare.py with the table's runs;
    # a run another table under --runs finished with the same config is copied)
    python scripts/paper_tables.py --run=fedhca2_tab1 --runs=runs/paper
    # keep each run's final metrics in docs/paper_tables/raw/<table>.csv (small)
    python scripts/paper_tables.py --collect=fedhca2_tab1 --runs=runs/paper
    # every table with kept results, in the paper's layout: docs/paper_tables.md
    python scripts/paper_tables.py
    python scripts/paper_tables.py --list      # the tables and their commands

A table's layout (`LAYOUTS`) names, per row of the paper's table
(`fedjax_mtl.paper_numbers`, typed in from the papers), the method of ours and its
config (a `scripts/compare.py --run`), the row Δm is taken against, and the seeds.
The rendering puts, per column, our mean ± std over the seeds beside the paper's
number, then Δm (ours, per seed against the reference row's run of the same seed,
over the table's columns, as the paper's printed Δm is over its columns), then the
rank agreement of the rows: Kendall's τ between the paper's ranking and ours (by
Δm, or by the table's `rank_by` column) and the pairs of rows whose order flips.

Our metric for a paper column '<dataset>/<task> <metric>' is the mean over our
clients of that dataset holding that task (client names begin with the dataset:
`pascal_st_semseg_0`, `nyud_mt_mt_0`); for a many-task column '<task> accuracy' it
is that task's accuracy, for 'avg accuracy' the mean over our tasks (the stand-in
benchmarks have other tasks than the papers': only the mean compares).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re

import numpy as np

from fedjax_mtl import paper_numbers
from fedjax_mtl.errors import ConfigError

RAW_DIR = os.path.join('docs', 'paper_tables', 'raw')
SEEDS = (0, 1, 2)


@dataclasses.dataclass(frozen=True)
class Layout:
  """How one paper table is made of our runs."""
  table: str  # `paper_numbers` name
  runs: dict[str, tuple[str, str]]  # paper row -> (our method name, compare.py config spec)
  reference: str  # the paper row Δm is against ('' : none)
  pairs: dict[str, str] = dataclasses.field(default_factory=dict)  # row -> its own reference
  rank_by: str = 'delta_m'  # 'delta_m' or a column key to rank the rows by
  note: str = ''  # what differs from the paper's setting
  # rows of `runs` the paper's table does not print (e.g. the Local run that Supp. Tabs.
  # 4-8's Δm is against, printed in Tabs. 1 and 2)
  unprinted: tuple[str, ...] = ()

  def run_args(self) -> list[str]:
    """`scripts/compare.py`'s `--run` values of this table: NAME=SPEC."""
    return [f'{name}={spec}' for name, spec in self.runs.values()]

  def compare_args(self, out: str, seeds: tuple[int, ...] = SEEDS) -> list[str]:
    """`scripts/compare.py`'s arguments that run this table into `out`."""
    args = [f'--out={out}', '--seeds=' + ','.join(map(str, seeds))]
    if self.reference:
      args.append(f'--reference={self.runs[self.reference][0]}')
    for run in self.run_args():
      args += ['--run', run]
    for row, ref in self.pairs.items():
      args += ['--pair', f'{self.runs[row][0]}={self.runs[ref][0]}']
    return args


def _hca2(variant: str = 'bench', extra: str = '') -> dict[str, tuple[str, str]]:
  """FedHCA2 Tab. 1's methods on `configs/<m>.py:<variant>` with `extra` overrides."""
  x = f' {extra}' if extra else ''
  return {'Local': ('local', f'configs/local.py:{variant}{x}'),
          'FedAvg': ('fedavg', f'configs/fedavg.py:{variant}{x}'),
          'FedProx': ('fedprox', f'configs/fedprox.py:{variant}{x}'),
          'FedPer': ('fedper', f'configs/fedper.py:{variant}{x}'),
          'Ditto': ('ditto', f'configs/ditto.py:{variant}{x}'),
          'FedAMP': ('fedamp', f'configs/fedamp.py:{variant}{x}'),
          'MaT-FL': ('matfl', f'configs/matfl.py:{variant}{x}'),
          'FedHCA2': ('fedhca2', f'configs/hca2.py:{variant}{x}')}


def _hca2_values(field: str, values: tuple[str, ...], extra: str = '',
                 both: str = '') -> dict[str, tuple[str, str]]:
  """FedHCA2 Supp. Tabs. 4-8: Local, and FedHCA2 at each printed value of `field`
  (`both`: a second field set to the same value) on `:bench` with `extra` overrides."""
  x = f' {extra}' if extra else ''
  runs = {'Local': ('local', f'configs/local.py:bench{x}')}
  for v in values:
    sets = f' {field}={v}' + (f' {both}={v}' if both else '')
    runs[v] = (f"fedhca2_{field.split('.')[-1]}{v}", f'configs/hca2.py:bench{x}{sets}')
  return runs


_BENCH2 = 'scenario=nyud_st_pascal_mt_1c'
_SUPP_NOTE = ("Δm against our Local run on the same scenario (the paper's Δm is against its "
              "Tab. {} Local row, which this table does not print)")


def _without(runs: dict, *rows: str) -> dict:
  return {k: v for k, v in runs.items() if k not in rows}


def _dea(dataset: str) -> dict[str, tuple[str, str]]:
  """FedDEA Tab. 3's rows on `configs/feddea.py:bench,dataset=<dataset>`."""
  cfg = f'configs/feddea.py:bench,dataset={dataset}'
  runs = {}
  for base, name in (('FedAvg', 'fedavg'), ('FedProx', 'fedprox'), ('FedNova', 'fednova'),
                     ('FedDyn', 'feddyn'), ('Moon', 'moon'), ('FedBN', 'fedbn'),
                     ('FedGA', 'fedga'), ('FedACG', 'fedacg')):
    runs[base] = (name, f'{cfg} algorithm={name}')
    runs[f'{base} +PCGrad'] = (f'{name}+pcgrad', f'{cfg} algorithm=pcgrad({name})')
    runs[f'{base} +HEAL'] = (f'{name}+heal', f'{cfg} algorithm=heal({name})')
    runs[f'{base} +DEA(Ours)'] = (f'{name}+dea', f'{cfg} algorithm=dea({name})')
  return runs


def _dea_pairs(runs: dict) -> dict[str, str]:
  return {row: row.split(' ')[0] for row in runs if ' ' in row}


LAYOUTS: dict[str, Layout] = {
    'fedhca2_tab1': Layout('fedhca2_tab1', _hca2(), 'Local'),
    'fedhca2_tab2': Layout('fedhca2_tab2', _hca2(extra='scenario=nyud_st_pascal_mt_1c'),
                           'Local'),
    'fedhca2_tab3': Layout('fedhca2_tab3', {
        'Local': ('local', 'configs/local.py:bench'),
        '+Enc': ('enc', 'configs/hca2.py:bench hca2.decoder_agg=none'),
        '+Dec': ('dec', 'configs/hca2.py:bench hca2.encoder_agg=none'),
        '+Enc+Dec': ('fedhca2', 'configs/hca2.py:bench')}, 'Local'),
    'fedhca2_tab4': Layout('fedhca2_tab4', {
        'ST+Local': ('st_local', 'configs/local.py:bench scenario=nyud_st'),
        'ST+Ours': ('st_fedhca2', 'configs/hca2.py:bench scenario=nyud_st'),
        'ST+MT+Ours': ('st_mt_fedhca2', 'configs/hca2.py:bench scenario=nyud_st_pascal_mt_1c')},
        'ST+Local', note='ST+MT+Ours: only its NYUD single-task clients count (shared tasks)'),
    'fedhca2_supp_tab2': Layout('fedhca2_supp_tab2', {
        'ST+Local': ('st_local', 'configs/local.py:bench scenario=pascal_st'),
        'ST+Ours': ('st_fedhca2', 'configs/hca2.py:bench scenario=pascal_st'),
        'ST+MT+Ours': ('st_mt_fedhca2', 'configs/hca2.py:bench')},
        'ST+Local', note='ST+MT+Ours: only its PASCAL single-task clients count'),
    'fedhca2_tab5': Layout('fedhca2_tab5', {
        'Local': ('local', 'configs/local.py:bench scenario=mt_only'),
        'Ours': ('fedhca2', 'configs/hca2.py:bench scenario=mt_only')}, 'Local'),
    **{f'fedhca2_supp_tab1_{c}': Layout(
        f'fedhca2_supp_tab1_{c}',
        _without(_hca2(extra=f'scenario=pascal_st_nyud_mt_{c}'), 'Ditto'), 'Local')
       for c in ('1c', '2c', '4c')},
    'fedhca2_supp_tab4': Layout(
        'fedhca2_supp_tab4', _hca2_values('hca2.alpha_init', ('0.01', '0.1', '0.5', '1'),
                                          both='hca2.beta_init'),
        'Local', unprinted=('Local',), note=_SUPP_NOTE.format(1)),
    'fedhca2_supp_tab5': Layout(
        'fedhca2_supp_tab5', _hca2_values('hca2.alpha_init', ('0.01', '0.1', '0.5', '1'),
                                          extra=_BENCH2, both='hca2.beta_init'),
        'Local', unprinted=('Local',), note=_SUPP_NOTE.format(2)),
    'fedhca2_supp_tab6': Layout(
        'fedhca2_supp_tab6', _hca2_values('hca2.hyper_lr', ('0.005', '0.01', '0.05', '0.1')),
        'Local', unprinted=('Local',), note=_SUPP_NOTE.format(1)),
    'fedhca2_supp_tab7': Layout(
        'fedhca2_supp_tab7', _hca2_values('hca2.ca_c', ('0.2', '0.4', '0.6', '0.8')),
        'Local', unprinted=('Local',), note=_SUPP_NOTE.format(1)),
    'fedhca2_supp_tab8': Layout(
        'fedhca2_supp_tab8', _hca2_values('hca2.ca_c', ('0.2', '0.4', '0.6', '0.8'),
                                          extra=_BENCH2),
        'Local', unprinted=('Local',), note=_SUPP_NOTE.format(2)),
    'feddea_tab3_nyud': Layout('feddea_tab3_nyud', _dea('nyud'), '',
                               pairs=_dea_pairs(_dea('nyud'))),
    'feddea_tab3_pascal': Layout('feddea_tab3_pascal', _dea('pascal'), '',
                                 pairs=_dea_pairs(_dea('pascal'))),
    'feddea_tab4': Layout('feddea_tab4', {
        'FedAvg': ('fedavg', 'configs/feddea.py:bench algorithm=fedavg'),
        '+DEA(a)': ('dea_small', 'configs/feddea.py:bench dea.variant=small'),
        '+DEA(b)': ('dea_no_rescale', 'configs/feddea.py:bench dea.rescale=False'),
        '+DEA(c)': ('dea_random', 'configs/feddea.py:bench dea.variant=random'),
        '+DEA': ('fedavg+dea', 'configs/feddea.py:bench')}, 'FedAvg'),
    'matu_tab1': Layout('matu_tab1', {
        'Individual (Centralized)': ('individual', 'configs/local.py:mini8'),
        'FedAvg': ('fedavg', 'configs/fedavg.py:mini8'),
        'NTK-FedAvg': ('ntkfedavg', 'configs/ntkfedavg.py:mini8,benchmark=clip'),
        'FedProx': ('fedprox', 'configs/fedprox.py:mini8'),
        'FedPer': ('fedper', 'configs/fedper.py:mini8'),
        'MaT-FL': ('matfl', 'configs/matfl.py:mini8'),
        'MaTU (Ours)': ('matu', 'configs/matu.py')}, '', rank_by='avg accuracy',
        note="mini8's 8 tasks stand in for the paper's 8: only the mean accuracy compares"),
}


# ---- our results -------------------------------------------------------------------


def _dataset_task_metric(key: str) -> tuple[str, str, str]:
  """'pascal_st_semseg_0/semseg mIoU' -> ('pascal', 'semseg', 'mIoU')."""
  client_task, metric = key.rsplit(' ', 1)
  client, task = client_task.rsplit('/', 1)
  return client.split('_', 1)[0], task, metric


def paper_column_value(ours: dict[str, float], column: str) -> float:
  """Our value of a paper column (module docstring) from one run's final metrics
  ({'client/task metric': value}, or {'<task> accuracy': value} many-task); NaN
  where none of ours matches."""
  if column == 'avg accuracy':
    acc = [v for k, v in ours.items() if k.endswith(' accuracy')]
    return float(np.mean(acc)) if acc else float('nan')
  if column in ours:
    return float(ours[column])
  if '/' not in column:
    return float('nan')
  want = (*column.split(' ', 1)[0].split('/'), column.rsplit(' ', 1)[-1])
  vals = [v for k, v in ours.items() if '/' in k and _dataset_task_metric(k) == want]
  return float(np.mean(vals)) if vals else float('nan')


def _delta_m(row: list[float], ref: list[float], lower: list[bool]) -> float:
  """FedHCA2's Δm (%) over the columns both have."""
  terms = [(-1. if lo else 1.) * (a - b) / b for a, b, lo in zip(row, ref, lower)
           if np.isfinite(a) and np.isfinite(b) and b != 0]
  return 100. * float(np.mean(terms)) if terms else float('nan')


def run_finals(workdir: str) -> dict[str, float]:
  """One finished run's final metrics: {'client/task metric': value} (dense) or
  {'<task> accuracy': value} (many-task)."""
  from fedjax_mtl import report
  rows = report.final_eval_rows(os.path.join(workdir, 'metrics.jsonl'))
  out = {}
  for r in rows:
    value = float('nan') if r['value'] is None else float(r['value'])
    if 'client' in r:
      out[f"{r['client']}/{r['task']} {r['metric']}"] = value
    elif r['metric'] == 'accuracy':
      out[f"{r['task']} accuracy"] = value
  return out


def _link_or_copy(src: str, dst: str) -> None:
  """A hard link to `src` at `dst` (a finished run's files are not written again:
  its checkpoints take no second copy of the disk), a copy where linking fails."""
  import shutil
  try:
    os.link(src, dst)
  except OSError:
    shutil.copy2(src, dst)


def borrow_runs(layout: Layout, runs_root: str, table: str,
                seeds: tuple[int, ...] = SEEDS) -> list[tuple[str, str]]:
  """Copies into `runs_root`/`table` each run of `layout` not yet started there that
  another table under `runs_root` has finished with the same config, under any
  method name (e.g. Tab. 1's Local and FedHCA2 are Tab. 3's, Supp. Tab. 1 1c is Tab.
  1 without Ditto): `scripts/compare.py` then reuses the copy, as it reuses a
  finished run of its own (same config: `workdir.config_diffs` finds no field that
  differs; runs are deterministic in their config, so the copy is the run it would
  make; its files are hard links where the disk allows). Returns (copied folder,
  its source)."""
  import glob
  import shutil
  from fedjax_mtl import compare
  from fedjax_mtl import workdir as workdir_lib
  out = os.path.join(runs_root, table)
  copied = []
  for run in compare.plan_runs(layout.run_args(), list(seeds), out, replicas=True):
    if os.path.exists(run.workdir):
      continue
    leaf = os.path.basename(run.workdir)  # seeds0,1,2 (a sweep) or seed<S>
    for src in sorted(glob.glob(os.path.join(glob.escape(runs_root), '*', '*', leaf))):
      if (os.path.dirname(os.path.dirname(src)) != out
          and os.path.exists(os.path.join(src, 'results.csv'))
          and os.path.exists(os.path.join(src, 'config.json'))
          and not workdir_lib.config_diffs(run.config, src)):
        shutil.copytree(src, run.workdir, ignore=shutil.ignore_patterns('.lock'),
                        copy_function=_link_or_copy)
        copied.append((run.workdir, src))
        break
  return copied


def finished_runs(layout: Layout, out: str) -> list[tuple[str, int, str]]:
  """(method, seed, workdir) of every finished run of `layout` under `out`
  (`scripts/compare.py`'s folders: NAME/seed<S>, or NAME/seeds.../replicas/<label>)."""
  runs = []
  for name, _ in layout.runs.values():
    folder = os.path.join(out, name)
    if not os.path.isdir(folder):
      continue
    dirs = []
    for d in sorted(os.listdir(folder)):
      if re.fullmatch(r'seed\d+', d):
        dirs.append((int(d[4:]), os.path.join(folder, d)))
      elif d.startswith('seeds') and os.path.isdir(os.path.join(folder, d, 'replicas')):
        for label in sorted(os.listdir(os.path.join(folder, d, 'replicas'))):
          m = re.match(r'seed=(\d+)', label)
          if m:
            dirs.append((int(m.group(1)), os.path.join(folder, d, 'replicas', label)))
    runs += [(name, seed, wd) for seed, wd in dirs
             if os.path.exists(os.path.join(wd, 'results.csv'))]  # (else not finished)
  return runs


def collect(layout: Layout, out: str) -> list[list]:
  """[method, seed, key, value] rows of every finished run of `layout` under `out`."""
  rows = []
  for name, seed, wd in finished_runs(layout, out):
    rows += [[name, seed, k, v] for k, v in sorted(run_finals(wd).items())]
  return rows


def scene_versions(layout: Layout, out: str) -> list[int]:
  """The synthetic scene versions (`data.synthetic_version`) of `layout`'s finished
  dense runs under `out` (none for many-task runs)."""
  seen = set()
  for _, _, wd in finished_runs(layout, out):
    with open(os.path.join(wd, 'config.json')) as f:
      cfg = json.load(f)
    data = cfg.get('data', {})
    if cfg.get('setting', 'dense') == 'dense' and data.get('source', 'synthetic') == 'synthetic':
      seen.add(int(data.get('synthetic_version', 1)))
  return sorted(seen)


def bench_version() -> int:
  """The scene version `:bench` draws now."""
  from fedjax_mtl import defaults
  return int(defaults.base_config('bench').data.synthetic_version)


def write_meta(table: str, versions: list[int], raw_dir: str = RAW_DIR) -> str:
  """Keeps beside the raw CSV the scene versions its runs drew (`read_meta`)."""
  from fedjax_mtl import report
  path = os.path.join(raw_dir, f'{table}.meta.json')
  report.atomic_write(path, json.dumps({'synthetic_version': versions}) + '\n')
  return path


def read_meta(table: str, raw_dir: str = RAW_DIR) -> dict:
  path = os.path.join(raw_dir, f'{table}.meta.json')
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def write_raw(table: str, rows: list[list], raw_dir: str = RAW_DIR) -> str:
  os.makedirs(raw_dir, exist_ok=True)
  path = os.path.join(raw_dir, f'{table}.csv')
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(['method', 'seed', 'key', 'value'])
  w.writerows(rows)
  from fedjax_mtl import report
  report.atomic_write(path, buf.getvalue())
  return path


def read_raw(path: str) -> dict[str, dict[int, dict[str, float]]]:
  """{method: {seed: {key: value}}} of a raw CSV (`write_raw`)."""
  out: dict[str, dict[int, dict[str, float]]] = {}
  with open(path, newline='') as f:
    for r in csv.DictReader(f):
      out.setdefault(r['method'], {}).setdefault(int(r['seed']), {})[r['key']] = float(
          r['value'])
  return out


# ---- the comparison ----------------------------------------------------------------


def kendall(paper: list[float], ours: list[float]) -> float:
  """Kendall's τ-b between two rankings' scores (NaN for fewer than 2 rows)."""
  if len(paper) < 2:
    return float('nan')
  from scipy import stats
  return float(stats.kendalltau(paper, ours).statistic)


def flips(names: list[str], paper: list[float], ours: list[float]) -> list[tuple[str, str]]:
  """Pairs (a, b) the paper puts a above b (higher score) and ours b above a."""
  out = []
  for i in range(len(names)):
    for j in range(len(names)):
      if paper[i] > paper[j] and ours[i] < ours[j]:
        out.append((names[i], names[j]))
  return out


def compare_table(layout: Layout, results: dict[str, dict[int, dict[str, float]]]) -> dict:
  """Per paper row: our per-seed column values and Δm, the paper's; the ranking's τ
  and flips. `results`: {our method: {seed: final metrics}} (`read_raw`)."""
  tab = paper_numbers.get(layout.table)
  cols = tab.keys
  lower = [c.lower_better for c in tab.columns]
  ours: dict[str, dict[int, list[float]]] = {}
  for row, (name, _) in layout.runs.items():
    if name in results:
      ours[row] = {s: [paper_column_value(m, c) for c in cols]
                   for s, m in results[name].items()}
  dms: dict[str, list[float]] = {}
  for row, per_seed in ours.items():
    ref = layout.pairs.get(row, layout.reference)
    if ref and ref in ours:
      dms[row] = [_delta_m(v, ours[ref][s], lower) for s, v in sorted(per_seed.items())
                  if s in ours[ref]]
  paper_dm = tab.delta_m or {}
  # The rows both rank: by Δm, or by the rank_by column (higher is better).
  if layout.rank_by == 'delta_m':
    names = [r for r in ours if r in dms and r in paper_dm and paper_dm[r] is not None]
    p_score = [paper_dm[r] for r in names]
    o_score = [float(np.mean(dms[r])) for r in names]
  else:
    i = cols.index(layout.rank_by)
    names = [r for r in ours if tab.rows[r][i] is not None]
    p_score = [tab.rows[r][i] for r in names]
    o_score = [float(np.mean([v[i] for v in ours[r].values()])) for r in names]
  return {'columns': cols, 'ours': ours, 'delta_m': dms, 'names': names,
          'tau': kendall(p_score, o_score), 'flips': flips(names, p_score, o_score)}


def _fmt(v: float | None, digits: int = 2) -> str:
  return '–' if v is None or not np.isfinite(v) else f'{v:.{digits}f}'


def _mean_std(vals: list[float], digits: int = 2) -> str:
  a = np.asarray(vals, np.float64)
  if not len(a) or not np.isfinite(a).all():
    return '–'
  return f'{a.mean():.{digits}f}' + (f' ± {a.std():.{digits}f}' if len(a) > 1 else '')


def render(layout: Layout, results: dict[str, dict[int, dict[str, float]]] | None,
           runs_dir: str = 'runs/paper', versions: list[int] | None = None,
           current: int | None = None) -> str:
  """One table's markdown section: ours beside the paper's, τ and flips; without
  `results`, the table's command only. `versions`: the scene versions the kept runs
  drew, said below the table, with a warning where they are not `current` (the
  version `:bench` draws now)."""
  tab = paper_numbers.get(layout.table)
  head = f'### {tab.paper} {tab.table}: {layout.table}\n\n{tab.caption}\n\n'
  cmd = (f'python scripts/paper_tables.py --run={layout.table} --runs={runs_dir} && '
         f'python scripts/paper_tables.py --collect={layout.table} --runs={runs_dir}')
  head += f'Made with `{cmd}`.' + (f' {layout.note}.' if layout.note else '') + '\n\n'
  if not results:
    return head + '_Not run yet._\n'
  c = compare_table(layout, results)
  seeds = sorted({s for per in c['ours'].values() for s in per})
  digits = lambda key: 4 if key.endswith('RMSE') or key.startswith('pascal/sal mIoU') else 2
  cols = c['columns']
  md = ['| row | ' + ' | '.join(f'{k} ours | paper' for k in cols) + ' | Δm ours | paper |',
        '|' + '---|' * (2 * len(cols) + 3)]
  printed = list(tab.rows.items())
  printed += [(row, (None,) * len(cols)) for row in layout.unprinted]
  for row, paper_vals in printed:
    mine = c['ours'].get(row)
    cells = []
    for i, key in enumerate(cols):
      ours_txt = _mean_std([v[i] for v in mine.values()], digits(key)) if mine else '–'
      cells += [ours_txt, _fmt(paper_vals[i], digits(key))]
    dm = c['delta_m'].get(row)
    pdm = (tab.delta_m or {}).get(row)
    cells += [_mean_std(dm) if dm else '–', _fmt(pdm)]
    md.append(f'| {row} | ' + ' | '.join(cells) + ' |')
  by = 'Δm' if layout.rank_by == 'delta_m' else layout.rank_by
  flips_txt = ', '.join(f'{a} > {b} in the paper, < ours' for a, b in c['flips']) or 'none'
  tail = (f'\nSeeds: {", ".join(map(str, seeds))} (mean ± std). Rank agreement by {by} over '
          f'{len(c["names"])} rows: Kendall τ = {_fmt(c["tau"])}; pairs that flip: '
          f'{flips_txt}.\n')
  if versions:
    tail += f'\nScenes: version {", ".join(map(str, versions))} (`data.synthetic_version`).'
    if current is not None and versions != [current]:
      tail += (f' **Stale:** `:bench` now draws version {current}; these numbers are '
               "from the earlier scenes until the table is run again.")
    tail += '\n'
  return head + '\n'.join(md) + '\n' + tail


def get(name: str) -> Layout:
  if name not in LAYOUTS:
    raise ConfigError(f'unknown table {name!r}; valid choices: ' + ', '.join(LAYOUTS))
  return LAYOUTS[name]


def main(argv: list[str] | None = None) -> str:
  """The command line (`scripts/paper_tables.py`; module docstring)."""
  import argparse
  import sys
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--run', default='', help='run this table (scripts/compare.py into '
                 '--runs/<table>; a run another table under --runs finished with the '
                 'same config is copied, not run again), then stop')
  p.add_argument('--collect', default='', help="keep this table's finished runs' final "
                 'metrics (from --runs/<table>) in --raw/<table>.csv, then render')
  p.add_argument('--runs', default='runs/paper', help='folder of the tables\' runs')
  p.add_argument('--raw', default=RAW_DIR, help='folder of the kept results')
  p.add_argument('--out', default=os.path.join('docs', 'paper_tables.md'),
                 help='the rendered tables')
  p.add_argument('--seeds', default=','.join(map(str, SEEDS)), help='seeds of --run')
  p.add_argument('--list', action='store_true', help='list the tables and their commands')
  a = p.parse_args(argv)
  try:
    if a.list:
      text = '\n'.join(f'{n}: python scripts/compare.py '
                       + ' '.join(_quote(x) for x in lay.compare_args(os.path.join(a.runs, n)))
                       for n, lay in LAYOUTS.items())
      print(text)
      return text
    if a.run:
      from fedjax_mtl import compare
      seeds = tuple(int(s) for s in a.seeds.split(','))
      for dst, src in borrow_runs(get(a.run), a.runs, a.run, seeds):
        print(f'{dst}: the same run as {src} (copied, not run again)')
      compare.main(get(a.run).compare_args(os.path.join(a.runs, a.run), seeds))
      return ''
    if a.collect:
      rows = collect(get(a.collect), os.path.join(a.runs, a.collect))
      if not rows:
        raise ConfigError(f'no finished runs of {a.collect} under '
                          f'{os.path.join(a.runs, a.collect)}; run --run={a.collect} first')
      print(f'kept {len(rows)} values in {write_raw(a.collect, rows, a.raw)}')
      write_meta(a.collect, scene_versions(get(a.collect), os.path.join(a.runs, a.collect)),
                 a.raw)
  except ConfigError as e:
    print('error: ' + ' '.join(str(e).split()), file=sys.stderr)
    raise SystemExit(2) from None
  parts = ['# The papers\' tables beside ours\n',
           'Generated by `python scripts/paper_tables.py` (fedjax_mtl/paper_tables.py) from the '
           f'kept results in `{a.raw}`; the papers\' numbers are typed in '
           '(`fedjax_mtl/paper_numbers.py`, table and row named).\n']
  current = bench_version()
  for name, lay in LAYOUTS.items():  # (each command with the documented runs folder)
    path = os.path.join(a.raw, f'{name}.csv')
    parts.append(render(lay, read_raw(path) if os.path.exists(path) else None,
                        versions=read_meta(name, a.raw).get('synthetic_version'),
                        current=current))
  text = '\n'.join(parts)
  from fedjax_mtl import report
  os.makedirs(os.path.dirname(a.out) or '.', exist_ok=True)
  report.atomic_write(a.out, text)
  print(text)
  return text


def _quote(s: str) -> str:
  return f'"{s}"' if ' ' in s or '(' in s else s



if __name__ == '__main__':
  import sys
  from fedjax_mtl import cpu_isa, hostmem
  hostmem.reuse_freed_memory()
  cpu_isa.pin('AVX2')
  main(sys.argv[1:])
