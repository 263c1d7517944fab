"""FedDEA's ρ sweep (spec feddea §4.7 Fig. 4, §6 A2): Δm of dea(<base>) against the
base (ρ = 1, the base bit for bit) for each ρ, over seeds; plotted as rho_sweep.png.

    python scripts/rho_sweep.py --out=runs/feddea --seeds=0,1,2 \\
        --rhos=0.1,0.2,0.25,0.3,0.5,0.7,1.0

Runs go to OUT/rho<ρ>/seeds<S,...> (the seeds of one ρ as one sweep's replicas) or,
with --no-replicas, OUT/rho<ρ>/seed<S> (scripts/compare.py's layout and rules: a finished
run of the same config is read back, an interrupted one resumes, a folder holding
another config's run stops the script unless --rerun_changed). Writes
OUT/rho_sweep.png (Δm mean ± std over seeds against ρ), OUT/rho_sweep.md and .csv
(per ρ: Δm per seed, its mean and std, and the mean `dea_amplification`).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys

import numpy as np

from fedjax_mtl import compare  # planning
from fedjax_mtl import report
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.metrics.delta_m import delta_m


def mean_amplification(workdir: str) -> float:
  """The run's mean `dea_amplification` over rounds and clients (NaN without DEA logs)."""
  rows = [r for r in report.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
          if r.get('type') == 'agg' and r.get('dea_amplification') is not None]
  if not rows:
    return float('nan')
  return float(np.mean([np.mean(r['dea_amplification']) for r in rows]))


def sweep_table(rhos: list[float], dms: dict[float, list[float]],
                amp: dict[float, list[float]]) -> tuple[str, str]:
  """Markdown and CSV of Δm (and the amplification) per ρ."""
  md = io.StringIO()
  md.write('| ρ | Δm (%) vs ρ = 1, mean ± std | Δm per seed | ‖Δ̃‖/‖Δ‖ |\n|---|---|---|---|\n')
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(['rho', 'delta_m_mean', 'delta_m_std', 'delta_m_per_seed', 'amplification'])
  for rho in rhos:
    v = np.asarray(dms[rho])
    a = np.nanmean(amp[rho]) if np.isfinite(amp[rho]).any() else float('nan')
    md.write(f'| {rho:g} | {v.mean():.2f} ± {v.std():.2f} | '
             + ', '.join(f'{x:.2f}' for x in v) + ' | '
             + ('–' if not np.isfinite(a) else f'{a:.2f}') + ' |\n')
    w.writerow([rho, v.mean(), v.std(), ' '.join(f'{x:.4f}' for x in v), a])
  return md.getvalue(), buf.getvalue()


def plot(rhos: list[float], dms: dict[float, list[float]], path: str, title: str) -> str:
  """Δm against ρ: seed mean with ± std error bars, each seed as a dot."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(5.5, 3.6), constrained_layout=True)
  mean = [np.mean(dms[r]) for r in rhos]
  std = [np.std(dms[r]) for r in rhos]
  ax.axhline(0.0, color='0.6', lw=0.8, ls='--')
  ax.errorbar(rhos, mean, yerr=std, marker='o', capsize=3, label='mean ± std over seeds')
  for r in rhos:
    ax.scatter([r] * len(dms[r]), dms[r], s=10, color='0.4', zorder=3)
  ax.scatter([], [], s=10, color='0.4', label='one seed')
  ax.set_xlabel('ρ (fraction of each client update kept)')
  ax.set_ylabel('Δm vs the base (ρ = 1), %')
  ax.set_title(title, fontsize=9)
  ax.ticklabel_format(useOffset=False, style='plain', axis='y')
  ax.legend(fontsize=7)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--out', required=True, help='output folder (runs in OUT/rho<ρ>/...)')
  p.add_argument('--config', default='configs/feddea.py',
                 help='CONFIG[:ARG] [field=value ...] of the DEA runs (its dea.rho is swept)')
  p.add_argument('--rhos', default='0.1,0.2,0.25,0.3,0.5,0.7,1.0',
                 help='comma-separated ρ values; 1.0 (the base) is always added')
  compare.add_run_flags(p)
  a = p.parse_args(argv)
  try:
    return _sweep(a)
  except ConfigError as e:
    print('error: ' + ' '.join(str(e).split()), file=sys.stderr)
    raise SystemExit(2) from None


def _sweep(a: argparse.Namespace) -> dict:
  try:
    rhos = sorted({float(r) for r in a.rhos.split(',')} | {1.0})
    seeds = [int(s) for s in a.seeds.split(',')]
  except ValueError:
    raise ConfigError(f'--rhos={a.rhos} / --seeds={a.seeds}: expected comma-separated '
                      'numbers, e.g. --rhos=0.1,0.5 --seeds=0,1') from None
  bad = [r for r in rhos if not 0 < r <= 1]
  if bad:
    raise ConfigError(f'--rhos: {bad[0]:g} is out of range; valid range: 0 < rho <= 1')
  compare.use_xla_cache(a.xla_cache_dir)
  runs = [f'rho{r:g}={a.config} dea.rho={r}' for r in rhos]
  plan = compare.plan_runs(runs, seeds, a.out, a.rerun_changed, replicas=not a.no_replicas)
  algorithm = plan[0].config.algorithm
  if not algorithm.startswith('dea('):
    raise ConfigError(f'--config runs {algorithm!r}; the sweep needs a dea(...) algorithm')
  finals: dict[float, list[dict]] = {r: [] for r in rhos}
  amp: dict[float, list[float]] = {r: [] for r in rhos}
  for run in plan:
    compare.execute(run)
    rho = float(run.config.dea.rho)
    for _, wd in compare.run_dirs(run):  # the run's seeds (a sweep's replicas)
      finals[rho].append(report.final_metrics(wd))
      amp[rho].append(mean_amplification(wd))
  dms = {r: [delta_m(m, ref, lower_is_better=report.column_lower_is_better)
             for m, ref in zip(finals[r], finals[1.0])] for r in rhos}
  md, csv_text = sweep_table(rhos, dms, amp)
  os.makedirs(a.out, exist_ok=True)
  report.atomic_write(os.path.join(a.out, 'rho_sweep.md'), md)
  report.atomic_write(os.path.join(a.out, 'rho_sweep.csv'), csv_text)
  plot(rhos, dms, os.path.join(a.out, 'rho_sweep.png'),
       f'{algorithm} on {plan[0].config.scenario} ({plan[0].config.unified} unified model), '
       f'{len(seeds)} seed{"s" * (len(seeds) > 1)}')
  print(md)
  return dms


if __name__ == '__main__':
  from fedjax_mtl import cpu_isa, hostmem
  hostmem.reuse_freed_memory()  # as fedjax_mtl.main does on CPU-only runs
  cpu_isa.pin('AVX2')  # the same kernels on every AVX2 host (fedjax_mtl.cpu_isa)
  main(sys.argv[1:])
