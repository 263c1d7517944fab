"""Is every task of a dense benchmark learnable but unsolved? Trivial, ceiling, Local
and FedHCA2 per task, and where Local lies between the first two.

    python scripts/task_band.py --variant=bench --out=runs/band --seeds=0,1,2

For the config variant `--variant` ('' = the default synthetic benchmark) it runs
(or reuses, as scripts/compare.py does) in OUT/<name>/...:

- `local`: `configs/local.py[:variant]`, and `fedhca2`: `configs/hca2.py[:variant]`;
- `ceiling_<dataset>`: one model trained centrally on all of the dataset's tasks
  (`scenario=<dataset>_mt`: one multi-task client) with Local, on `--ceiling_data`
  (10) times the variant's synthetic training images (freshly drawn) for
  `--ceiling_rounds` (1) times its rounds: at the same local epochs, 10x the steps.
  (Ten times the rounds on the same images is not a ceiling: it overfits them.)

The trivial predictor of each task is `fedjax_mtl.trivial`'s (input-independent,
fitted on the training split). Per dataset and task the table gives the four
values (each client's final metric, averaged over the clients holding the task,
then mean ± std over the seeds) and Local's position, 100 (Local − trivial) /
(ceiling − trivial) %, and whether it lies in the band of 30-80 % (learnable in the
budget, with room left for methods to differ). Writes OUT/band.md and OUT/band.csv.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import numpy as np

from fedjax_mtl import compare, report, tasks as tasks_lib
from fedjax_mtl.errors import ConfigError

BAND = (30., 80.)


def task_values(workdir: str) -> dict[str, float]:
  """{'dataset/task': the final metric averaged over the clients holding the task}."""
  out: dict[str, list[float]] = {}
  for r in report.final_eval_rows(os.path.join(workdir, 'metrics.jsonl')):
    if r['task'] == 'edge' and r['metric'] != 'odsF':
      continue  # the edge loss of a non-final evaluation is not the reported metric
    value = float('nan') if r['value'] is None else float(r['value'])
    out.setdefault(f"{r['dataset']}/{r['task']}", []).append(value)
  return {k: float(np.mean(v)) for k, v in out.items()}


def position(trivial: float, ceiling: float, value: float) -> float:
  """100 (value − trivial) / (ceiling − trivial): 0 at the trivial predictor, 100 at the
  ceiling (for lower-is-better metrics too: both differences are negative)."""
  gap = ceiling - trivial
  return float('nan') if gap == 0 else 100. * (value - trivial) / gap


def plan_specs(variant: str, base, rounds_factor: int = 1, data_factor: int = 10) -> list[str]:
  """The --run items of the band's runs (`base`: the variant's Local config, whose
  `tasks`, if it names some, the ceilings keep; the ceilings' rounds and synthetic
  training images as multiples of its own)."""
  arg = f':{variant}' if variant else ''
  rounds = int(base.num_rounds) * rounds_factor
  images = ','.join(f"'{d}':{int(n) * data_factor}" for d, n in base.data.num_train.items())
  chosen = [t.strip() for t in str(base.tasks).split(',') if t.strip()]
  specs = [f'local=configs/local.py{arg}', f'fedhca2=configs/hca2.py{arg}']
  for d, info in tasks_lib.DATASETS.items():
    keep = [t for t in info.tasks if not chosen or t in chosen]
    if keep:
      specs.append(f'ceiling_{d}=configs/local.py{arg} scenario={d}_mt num_rounds={rounds} '
                   f'eval_every={rounds}'
                   + (f' data.num_train={{{images}}}' if data_factor != 1 else '')
                   + (f' tasks={",".join(keep)}' if chosen else ''))
  return specs


def table(trivial: dict[str, float], runs: dict[str, list[dict[str, float]]],
          sal_metric: str = 'maxF') -> tuple[str, str]:
  """(band.md, band.csv) from the trivial values and each run's per-seed task values."""
  head = ['dataset/task', 'metric', 'trivial', 'ceiling', 'Local', 'FedHCA2',
          'Local position (%)', f'in {BAND[0]:.0f}-{BAND[1]:.0f} %']
  md = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  csv = ['dataset,task,metric,trivial,ceiling,local_mean,local_std,fedhca2_mean,fedhca2_std,'
         'local_position']
  for key in sorted(set(trivial) & set(runs['local'][0])):  # the tasks the runs hold
    d, t = key.split('/')
    metric = sal_metric if t == 'sal' else tasks_lib.METRIC_NAMES[t]
    ceil = np.mean([v[key] for v in runs[f'ceiling_{d}']])
    local = [v[key] for v in runs['local']]
    hca2 = [v[key] for v in runs['fedhca2']]
    pos = position(trivial[key], float(ceil), float(np.mean(local)))
    ok = BAND[0] <= pos <= BAND[1]
    arrow = '↓' if t in tasks_lib.LOWER_IS_BETTER else '↑'
    md.append(f'| {key} | {metric}{arrow} | {trivial[key]:.4g} | {ceil:.4g} | '
              f'{report.mean_std(local)} | {report.mean_std(hca2)} | {pos:.0f} | '
              f'{"yes" if ok else "no"} |')
    csv.append(f'{d},{t},{metric},{trivial[key]},{ceil},{np.mean(local)},{np.std(local)},'
               f'{np.mean(hca2)},{np.std(hca2)},{pos}')
  return '\n'.join(md) + '\n', '\n'.join(csv) + '\n'


def main(argv: list[str] | None = None) -> str:
  """The command line (`scripts/task_band.py`); returns band.md's text. Bad input
  exits with code 2 after one `error:` line."""
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--variant', default='', help="config variant, e.g. bench ('' = default)")
  p.add_argument('--out', required=True, help='output folder: OUT/<name>/..., OUT/band.md, .csv')
  p.add_argument('--ceiling_data', type=int, default=10,
                 help="the ceilings' synthetic training images as a multiple of the variant's")
  p.add_argument('--ceiling_rounds', type=int, default=1,
                 help="the ceilings' rounds as a multiple of the variant's")
  p.add_argument('--ceiling_seeds', default='',
                 help="the ceilings' seeds ('' = the first of --seeds: a ceiling is one "
                      'reference point, and the longest runs)')
  compare.add_run_flags(p)
  a = p.parse_args(argv)
  try:
    try:
      seeds = [int(s) for s in a.seeds.split(',')]
      ceiling_seeds = ([int(s) for s in a.ceiling_seeds.split(',')] if a.ceiling_seeds
                       else seeds[:1])
    except ValueError:
      raise ConfigError(f'--seeds={a.seeds} / --ceiling_seeds={a.ceiling_seeds}: expected '
                        'comma-separated integers, e.g. 0,1') from None
    if min(a.ceiling_data, a.ceiling_rounds) < 1:
      raise ConfigError(f'--ceiling_data={a.ceiling_data} and --ceiling_rounds='
                        f'{a.ceiling_rounds}: each must be at least 1')
    base = compare.load_config('configs/local.py' + (f':{a.variant}' if a.variant else ''))
    if a.ceiling_data != 1 and base.data.source != 'synthetic':
      raise ConfigError(f'--ceiling_data={a.ceiling_data} draws more synthetic images; '
                        f'data.source={base.data.source!r} has the images it has: use 1')
    from fedjax_mtl import trivial
    compare.use_xla_cache(a.xla_cache_dir)
    with contextlib.ExitStack() as hold:
      specs = plan_specs(a.variant, base, a.ceiling_rounds, a.ceiling_data)
      plan = [run for group, s in ((specs[:2], seeds), (specs[2:], ceiling_seeds))
              for run in compare.plan_runs(group, s, a.out, a.rerun_changed, hold,
                                           replicas=not a.no_replicas)]
      runs: dict[str, list[dict[str, float]]] = {}
      for run in plan:
        compare.execute(run)
        for _, wd in compare.run_dirs(run):
          runs.setdefault(run.name, []).append(task_values(wd))
  except ConfigError as e:
    print('error: ' + ' '.join(str(e).split()), file=sys.stderr)
    raise SystemExit(2) from None
  md, csv = table(trivial.trivial_metrics(base), runs, str(base.get('sal_metric', 'maxF')))
  report.write_table(a.out, 'band', md, csv)
  return md


if __name__ == '__main__':
  from fedjax_mtl import cpu_isa, hostmem
  hostmem.reuse_freed_memory()
  cpu_isa.pin('AVX2')
  main(sys.argv[1:])
