"""NTKFedAvg's Table 1 (spec §5.2) on benchmark A: the max metric over rounds per task.

    python scripts/ntk_table1.py --out=runs/ntk_table1 --seeds=0

Runs (or reuses) `configs/ntkfedavg.py` for every setting of the table:
clients per task (`--clients_per_task`, 1 and 2) × work per round (`--work`,
standard and local) × method:

- `fedavg`: `ntkfedavg.linearize=false` (the plain forward, train-mode batch norm,
  averaged statistics);
- `ntkfedavg`: the linearised clients;
- `dgagg`: `algorithm=matfl` (MaT-FL's soft grouping, th = 0). As in the paper's
  table, only in the local-work setting;
- `ntkfedavg+heads` (not in the default --methods): the linearised clients with their
  DeepLab heads trained, as FedAvg trains them (`ntkfedavg.freeze_heads=false`, spec
  A2's recommendation; the paper keeps them frozen).

Each run goes to OUT/<method>_<k>c_<work>/seed<S> (a finished run of the same
config is reused, an interrupted one resumes, as scripts/compare.py does).
`--variant=paper` runs the real PASCAL-Context setting; `--set` adds overrides to
every run (e.g. `--set 'tasks=semseg,human_parts,sal'`).

For each run and task the metric is the maximum over the evaluated rounds
(spec §5.1, A14) of the mean over the clients holding the task (A12: 2 clients
per task are averaged); the table gives the mean ± std over seeds for Seg.
(semseg mIoU), Sal. (saliency mIoU, MaT-FL's per-image Jaccard), H. Parts
(human parts mIoU) and their mean, in the paper's layout. Writes OUT/table1.md,
OUT/table1.csv and OUT/table1.png (the per-round metrics of every run, seed 0).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from fedjax_mtl import compare
from fedjax_mtl import report
from fedjax_mtl.errors import ConfigError

METHODS = {
    'fedavg': 'ntkfedavg.linearize=false',
    'ntkfedavg': '',
    'dgagg': 'algorithm=matfl',
    # spec A2's recommended reading: the linearised backbone under trained heads
    'ntkfedavg+heads': 'ntkfedavg.freeze_heads=false',
}
COLUMNS = (('semseg', 'Seg. (mIoU)'), ('sal', 'Sal. (mIoU)'), ('human_parts', 'H. Parts (mIoU)'))
WORK_NAMES = {'standard': 'Standard', 'local': 'Local Work'}


def run_specs(methods, per_task, works, variant: str, extra: str) -> list[str]:
  """`NAME=CONFIG:ARG overrides` of every run of the table (DGAgg in local work only)."""
  out = []
  for k in per_task:
    for w in works:
      for m in methods:
        if m == 'dgagg' and w != 'local':
          continue
        arg = ','.join(filter(None, [variant, f'clients_per_task={k}', f'work={w}']))
        spec = f'{m}_{k}c_{w}=configs/ntkfedavg.py:{arg} {METHODS[m]} {extra}'.strip()
        out.append(' '.join(spec.split()))
  return out


def curves(workdir: str) -> dict[str, dict[int, float]]:
  """{task: {round: metric}}: each evaluated round's metric, averaged over the clients
  holding the task."""
  per: dict[str, dict[int, list]] = {}
  for r in report.read_jsonl(os.path.join(workdir, 'metrics.jsonl')):
    if r.get('type') == 'eval' and r.get('metric') in ('mIoU', 'maxF'):
      per.setdefault(r['task'], {}).setdefault(int(r['round']), []).append(float(r['value']))
  return {t: {rnd: float(np.mean(v)) for rnd, v in sorted(d.items())} for t, d in per.items()}


def table(results: dict[str, list[dict]]) -> tuple[str, str]:
  """(markdown, csv) of the max-over-rounds metrics, one row per run name."""
  head = ['# clients/task', 'work type', 'method'] + [c for _, c in COLUMNS] + ['mean', 'seeds']
  md = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  csv = ['clients_per_task,work,method,' + ','.join(t for t, _ in COLUMNS) + ',mean,seeds']
  for name, per_seed in results.items():
    method, k, work = name.rsplit('_', 2)
    best = np.array([[max(c[t].values()) if c.get(t) else np.nan for t, _ in COLUMNS]
                     for c in per_seed])
    vals = np.concatenate([best, np.nanmean(best, 1, keepdims=True)], 1)
    mean, std = vals.mean(0), vals.std(0)
    fmt = [f'{m:.2f} ± {s:.2f}' if len(per_seed) > 1 else f'{m:.2f}' for m, s in zip(mean, std)]
    md.append('| ' + ' | '.join([k[:-1], WORK_NAMES[work], method] + fmt
                                + [str(len(per_seed))]) + ' |')
    csv.append(','.join([k[:-1], work, method] + [f'{m:.4f}' for m in mean]
                        + [str(len(per_seed))]))
  return '\n'.join(md) + '\n', '\n'.join(csv) + '\n'


def plot(results: dict[str, list[dict]], path: str) -> None:
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, len(COLUMNS), figsize=(5 * len(COLUMNS), 4.6))
  colours = {m: f'C{i}' for i, m in enumerate(METHODS)}  # colour: method
  for ax, (task, label) in zip(axes, COLUMNS):
    for name, per_seed in results.items():
      method, k, work = name.rsplit('_', 2)
      c = per_seed[0].get(task, {})
      if c:  # line: work (dashed standard), marker: clients per task (o 1, s 2)
        ax.plot(list(c), list(c.values()), '--' if work == 'standard' else '-',
                color=colours[method], marker='o' if k == '1c' else 's', ms=3, label=name)
    ax.set(title=label, xlabel='round', ylabel='metric (x100)')
    ax.grid(alpha=.3)
  handles, labels = axes[0].get_legend_handles_labels()
  fig.legend(handles, labels, loc='lower center', ncol=5, fontsize=7)
  fig.suptitle('NTKFedAvg benchmark A: per-round metrics (seed 0); colour: method, '
               'dashed: standard, solid: local work, o: 1 client/task, s: 2')
  fig.tight_layout(rect=(0, 0.12, 1, 1))
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--out', required=True,
                 help='output folder: OUT/<method>_<k>c_<work>/seed<S> per run, OUT/table1.md, '
                      '.csv and .png')
  p.add_argument('--methods', default='fedavg,ntkfedavg,dgagg',
                 help='comma-separated, of: ' + ', '.join(METHODS) + ' (default: %(default)s)')
  p.add_argument('--clients_per_task', default='1,2',
                 help='comma-separated clients per task, of 1, 2 (default: %(default)s)')
  p.add_argument('--work', default='standard,local',
                 help='comma-separated work settings, of standard, local (default: %(default)s)')
  p.add_argument('--variant', default='',
                 help="configs/ntkfedavg.py variant: '' (the synthetic benchmark), smoke or "
                      'paper')
  p.add_argument('--set', default='',
                 help="extra 'field=value ...' overrides for every run")
  p.add_argument('--finished_only', action='store_true',
                 help='run nothing: tabulate the finished runs')
  compare.add_run_flags(p)
  a = p.parse_args(argv)
  try:
    split = lambda s: [x.strip() for x in s.split(',') if x.strip()]
    methods, per_task, works = split(a.methods), split(a.clients_per_task), split(a.work)
    for vals, valid, flag in ((methods, METHODS, '--methods'), (per_task, ('1', '2'),
                              '--clients_per_task'), (works, tuple(WORK_NAMES), '--work')):
      for v in vals:
        if v not in valid:
          raise ConfigError(f'unknown {flag} value {v!r}; valid choices: ' + ', '.join(valid))
    try:
      seeds = [int(s) for s in a.seeds.split(',')]
    except ValueError:
      raise ConfigError('--seeds takes comma-separated integers') from None
    plan = compare.plan_runs(run_specs(methods, per_task, works, a.variant, a.set), seeds,
                             a.out, a.rerun_changed, replicas=not a.no_replicas)
    compare.use_xla_cache(a.xla_cache_dir)
  except ConfigError as e:
    print('error: ' + ' '.join(str(e).split()), file=sys.stderr)
    raise SystemExit(2) from None
  results: dict[str, list[dict]] = {}
  for run in plan:
    if a.finished_only and run.action != 'reuse':
      continue
    compare.execute(run)
    results.setdefault(run.name, []).extend(curves(wd) for _, wd in compare.run_dirs(run))
  os.makedirs(a.out, exist_ok=True)
  md, csv = table(results)
  report.atomic_write(os.path.join(a.out, 'table1.md'), md)
  report.atomic_write(os.path.join(a.out, 'table1.csv'), csv)
  if results:
    plot(results, os.path.join(a.out, 'table1.png'))
  print(md)
  return results


if __name__ == '__main__':
  from fedjax_mtl import cpu_isa, hostmem
  hostmem.reuse_freed_memory()
  cpu_isa.pin('AVX2')
  main(sys.argv[1:])
