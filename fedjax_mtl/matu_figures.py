"""MaTU's Figs. 5 and 6 on a many-task benchmark: sweeps of runs, one plot each.

    # Fig. 5: tasks per client k = 2, 4, 8 (every client holds exactly k tasks)
    python scripts/matu_figures.py --figure=fig5 --out=runs/fig5 --values=2,4,8 \\
        --methods=matu,fedavg,matfl --individual=runs/table1/individual

    # Fig. 6a/b: every client holds a group of 3 tasks spanning 1, 2 or 3 of the
    # task clusters of scripts/task_relatedness.py (conflict levels 0, 2, 3)
    python scripts/matu_figures.py --figure=fig6 --out=runs/fig6 --values=0,2,3 \\
        --methods=matu_avg,matu_nocross,matu_avg_uniform,fedavg,fedper \\
        --relatedness=docs/matu/relatedness.json \\
        --individual=runs/table1/individual

Each point is one run per seed of `configs/<method>` on mini8's defaults (10
clients, all every round, 10 rounds) with the swept allocation
(`many.tasks_per_client=k`, or `many.client_tasks` groups). A point's seeds run as
one sweep's replicas (one compiled program, each seed with its own client split:
`engines/many_replicas.py`) in OUT/<value>/<method>/seeds<S,...>, or with
--no-replicas one run per seed in OUT/<value>/<method>/seed<S> (finished runs are
reused, as scripts/compare.py does). Accuracy is normalised
per seed by the Individual run of the same seed (`--individual`: its
seed<S> folders), averaged over the tasks the point's clients hold.
Communication is the mean upload per participating client and round, in MB
(`upload_bits` of metrics.jsonl). Writes OUT/<figure>.png, .md and .csv.

Fig. 6's groups: a conflict level c is the number of task clusters a client's
3 tasks span (0: one cluster, 2: two, 3: three). The groups of a level are
the 3-task sets of that level, taken in a fixed order that covers every task it
can (at most one group per client); tasks no group of the level can hold
(those of a cluster of fewer than 3 tasks at level 0) are left out of that
point (`many.tasks`).
"""

# The logic of scripts/matu_figures.py, the command line above (also `python -m
# fedjax_mtl.matu_figures`); runs are planned and run as fedjax_mtl.compare does.

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from fedjax_mtl import compare
from fedjax_mtl import report
from fedjax_mtl.manytask import allocation
from fedjax_mtl.errors import ConfigError

METHODS = {
    'matu': 'configs/matu.py',
    'matu_avg': 'configs/matu.py matu.combine=avg',
    'matu_nocross': 'configs/matu.py matu.cross=none',
    'matu_uniform': 'configs/matu.py matu.cross=uniform',
    'matu_avg_uniform': 'configs/matu.py matu.combine=avg matu.cross=uniform',
    'fedavg': 'configs/fedavg.py:mini8',
    'fedprox': 'configs/fedprox.py:mini8',
    'fedper': 'configs/fedper.py:mini8',
    'matfl': 'configs/matfl.py:mini8',
}
FIGURES = ('fig5', 'fig6')


def point_overrides(figure: str, value: int, clusters: list[list[str]] | None,
                    num_clients: int) -> str:
  """The config overrides of one point of the sweep."""
  if figure == 'fig5':
    return f'many.tasks_per_client={value}'
  groups = allocation.conflict_groups(clusters, value, num_clients)
  held = sorted({t for g in groups for t in g})
  return f'many.client_tasks={";".join("+".join(g) for g in groups)} many.tasks={",".join(held)}'


def _normalised(workdir: str, individual: str | None, seed: int) -> float:
  """Mean over a run's tasks of 100·acc / acc of the Individual run of the same seed
  (NaN without `individual`)."""
  acc = compare.final_accuracy(workdir)
  if not individual:
    return float('nan')
  ref = compare.final_accuracy(os.path.join(individual, f'seed{seed}'))
  return float(np.mean([100. * a / ref[t] for t, a in acc.items()]))


def _mb_per_client_round(workdir: str, cfg) -> float:
  """A run's mean upload per participating client and round, in MB."""
  rows = [r for r in report.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
          if r.get('type') == 'agg']
  clients = allocation.num_participants(int(cfg.many.num_clients), float(cfg.many.participation))
  return float(np.mean([r['upload_bits'] for r in rows])) / 8e6 / clients


def sweep(figure: str, values: list[int], methods: list[str], seeds: list[int], out: str,
          individual: str | None, clusters, rerun_changed: bool = False,
          finished_only: bool = False, replicas: bool = True) -> dict:
  """Run (or reuse) every point; returns {method: {value: (acc mean, acc std, MB, mean acc)}}.
  `replicas`: a point's seeds as one sweep where it can hold them (`compare.plan_runs`)."""
  plans = {}
  for v in values:  # everything is planned (and checked) before anything runs
    runs = [f'{m}={METHODS[m]} ' + point_overrides(figure, v, clusters, 10) for m in methods]
    plans[v] = compare.plan_runs(runs, seeds, os.path.join(out, str(v)), rerun_changed,
                                 replicas=replicas)
  results = {m: {} for m in methods}
  for v, plan in plans.items():
    per = {}
    for run in plan:
      if finished_only and run.action != 'reuse':
        continue  # --finished_only: plot what has run, leave the missing points out
      compare.execute(run)
      for seed, wd in compare.run_dirs(run):  # its seeds (a sweep's replicas)
        acc = compare.final_accuracy(wd)
        per.setdefault(run.name, []).append((
            _normalised(wd, individual, seed), _mb_per_client_round(wd, run.config),
            float(np.mean(list(acc.values())))))
    for m, vals in per.items():
      a = np.array(vals)
      results[m][v] = (float(a[:, 0].mean()), float(a[:, 0].std()), float(a[:, 1].mean()),
                       float(a[:, 2].mean()))
  return results


def write(figure: str, values: list[int], results: dict, out: str, seeds: int = 1) -> None:
  """Writes OUT/<figure>.png (normalised accuracy and upload against the swept value),
  .md and .csv of `results` (as sweep returns them) over `seeds` seeds."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  xlabel = {'fig5': 'tasks per client k', 'fig6': 'conflict level (clusters spanned)'}[figure]
  fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
  for m, pts in results.items():
    xs = [v for v in values if v in pts]
    a1.errorbar(xs, [pts[v][0] for v in xs], yerr=[pts[v][1] for v in xs], marker='o',
                capsize=3, label=m)
    a2.plot(xs, [pts[v][2] for v in xs], marker='o', label=m)
  a1.set(xlabel=xlabel, ylabel='normalised accuracy (% of Individual)', xticks=values)
  a2.set(xlabel=xlabel, ylabel='upload per client and round (MB)', xticks=values)
  for a in (a1, a2):
    a.grid(alpha=.3)
  a1.legend(fontsize=8)
  fig.suptitle(f'MaTU {figure} on mini8 ' + (f'(mean ± std over {seeds} seeds)' if seeds > 1
                                               else '(one seed)'))
  fig.tight_layout()
  fig.savefig(os.path.join(out, f'{figure}.png'), dpi=110)
  plt.close(fig)
  head = ['method'] + [f'{xlabel} = {v}' for v in values]
  md = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  csv = ['method,value,normalised_mean,normalised_std,mb_per_client_round,mean_accuracy']
  for m, pts in results.items():
    md.append('| ' + ' | '.join([m] + [
        (f'{pts[v][0]:.1f} ± {pts[v][1]:.1f} %' if seeds > 1 else f'{pts[v][0]:.1f} %')
        + f' · {pts[v][2]:.3f} MB' if v in pts else '–'
        for v in values]) + ' |')
    csv += [f'{m},{v},{pts[v][0]},{pts[v][1]},{pts[v][2]},{pts[v][3]}' for v in values
            if v in pts]
  report.atomic_write(os.path.join(out, f'{figure}.md'), '\n'.join(md) + '\n')
  report.atomic_write(os.path.join(out, f'{figure}.csv'), '\n'.join(csv) + '\n')


def main(argv: list[str] | None = None) -> dict:
  """The command line (`scripts/matu_figures.py`): parses `argv`, runs the sweep, writes
  the figure and returns sweep's results; bad input exits with code 2 after one
  `error:` line on stderr."""
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--figure', required=True, choices=FIGURES,
                 help='fig5 (tasks per client) or fig6 (conflict levels)')
  p.add_argument('--out', required=True,
                 help='output folder: OUT/<value>/<method>/seed<S> per run, OUT/<figure>.png, '
                      '.md and .csv')
  p.add_argument('--values', required=True,
                 help='fig5: tasks per client; fig6: conflict levels (0, 2, 3)')
  p.add_argument('--methods', default='matu,fedavg,matfl',
                 help='comma-separated, of: ' + ', '.join(METHODS))
  p.add_argument('--individual', default='',
                 help='folder of the Individual runs (seed<S> inside) for normalised accuracy')
  p.add_argument('--relatedness', default='',
                 help='fig6: relatedness.json of scripts/task_relatedness.py (the clusters)')
  p.add_argument('--finished_only', action='store_true',
                 help='run nothing: tabulate and plot the finished runs, leaving out the '
                      'points (method, value, seed) that have not run')
  compare.add_run_flags(p)
  a = p.parse_args(argv)
  try:
    methods = [m.strip() for m in a.methods.split(',') if m.strip()]
    for m in methods:
      if m not in METHODS:
        raise ConfigError(f'unknown method {m!r}; valid choices: ' + ', '.join(METHODS))
    try:
      values = [int(v) for v in a.values.split(',')]
      seeds = [int(s) for s in a.seeds.split(',')]
    except ValueError:
      raise ConfigError('--values and --seeds take comma-separated integers') from None
    clusters = None
    if a.figure == 'fig6':
      if not os.path.isfile(a.relatedness):
        raise ConfigError(f'--relatedness={a.relatedness!r} is not a file; run '
                          'scripts/task_relatedness.py on an Individual run first')
      with open(a.relatedness) as f:
        rel = json.load(f)
      clusters = rel['clusters']
    if a.individual and not all(os.path.isdir(os.path.join(a.individual, f'seed{s}'))
                                for s in seeds):
      raise ConfigError(f'--individual={a.individual!r} lacks seed folders for seeds {seeds}')
    compare.use_xla_cache(a.xla_cache_dir)
    os.makedirs(a.out, exist_ok=True)
    results = sweep(a.figure, values, methods, seeds, a.out, a.individual or None, clusters,
                    a.rerun_changed, a.finished_only, replicas=not a.no_replicas)
  except ConfigError as e:
    print('error: ' + ' '.join(str(e).split()), file=sys.stderr)
    raise SystemExit(2) from None
  write(a.figure, values, results, a.out, len(seeds))
  print(open(os.path.join(a.out, f'{a.figure}.md')).read())
  return results


if __name__ == '__main__':
  from fedjax_mtl import cpu_isa, hostmem
  hostmem.reuse_freed_memory()
  cpu_isa.pin('AVX2')
  main(sys.argv[1:])
