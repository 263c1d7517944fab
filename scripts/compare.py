"""Run several methods on one scenario with the same seeds; write a comparison table.

    python scripts/compare.py --out=runs/compare --seeds=0,1 \\
        --run local=configs/local.py --run fedavg=configs/fedavg.py \\
        --run fedhca2=configs/hca2.py \\
        --run "enc-only=configs/hca2.py hca2.decoder_agg=none"

Each `--run` is `NAME=CONFIG[:ARG] [field=value ...]` (overrides as dotted
config fields). Runs go to OUT/NAME/seed<S> (finished runs are read back, not
redone; interrupted ones resume). The table has one row per method, one column
per client task (final round, mean ± std over seeds), Δm against the run
named by --reference (default `local`) and the median seconds per round
(rounds after the first, without evaluation), written to OUT/comparison.md and .csv.
"""

from __future__ import annotations

import argparse
import ast
import csv
import importlib.util
import io
import os
import sys

import numpy as np

from fedjax_mtl import report
from fedjax_mtl.metrics.delta_m import delta_m

def load_config(spec: str):
  """`configs/x.py[:arg] field=value ...` -> ConfigDict."""
  path, *overrides = spec.split()
  path, _, arg = path.partition(':')
  mod_spec = importlib.util.spec_from_file_location('_cfg', path)
  mod = importlib.util.module_from_spec(mod_spec)
  mod_spec.loader.exec_module(mod)
  cfg = mod.get_config(arg or None)
  for item in overrides:
    key, _, raw = item.partition('=')
    node = cfg
    *parents, last = key.split('.')
    for p in parents:
      node = node[p]
    old = node[last]
    if isinstance(old, str):
      node[last] = raw
    elif isinstance(old, bool):
      node[last] = raw.lower() in ('1', 'true', 'yes')
    else:
      node[last] = type(old)(ast.literal_eval(raw))
  return cfg


def final_metrics(workdir: str) -> dict[str, float]:
  """{'client/task metric': value} of the last evaluated round of a run."""
  rows = report.final_eval_rows(os.path.join(workdir, 'metrics.jsonl'))
  return {f"{r['client']}/{r['task']} {r['metric']}": r['value'] for r in rows}


def _lower(key: str) -> bool:
  """Direction of a 'client/task metric' column."""
  client_task, metric = key.rsplit(' ', 1)
  return report.lower_is_better(client_task.rsplit('/', 1)[-1], metric)


def comparison_table(results: dict[str, list[dict[str, float]]],
                     reference: str, seconds: dict[str, list[float]] | None = None
                     ) -> tuple[str, str]:
  """Markdown and CSV: methods x client tasks (mean ± std over seeds), Δm, then the
  seconds per round when `seconds` (method -> per-seed values) is given."""
  cols = list(next(iter(results.values()))[0])
  ref_runs = results.get(reference)
  md = io.StringIO()
  arrows = [c + ('↓' if _lower(c) else '↑') for c in cols]
  extra = ' s/round |' if seconds else ''
  md.write('| method | ' + ' | '.join(arrows) + ' | Δm (%) ↑ |' + extra + '\n')
  md.write('|---' * (len(cols) + 2 + bool(seconds)) + '|\n')
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(['method'] + cols + ['delta_m'] + (['seconds_per_round'] if seconds else []))

  def fmt(vals):
    vals = np.asarray(vals, np.float64)
    return f'{vals.mean():.2f}' if len(vals) == 1 else f'{vals.mean():.2f} ± {vals.std():.2f}'

  for name, runs in results.items():
    per_col = [[r[c] for r in runs] for c in cols]
    if ref_runs is not None:
      # Δm per seed against the reference run of the same seed.
      dms = [delta_m(r, ref, lower_is_better=_lower) for r, ref in zip(runs, ref_runs)]
    else:
      dms = [float('nan')]
    sec = [f' {np.median(seconds[name]):.2f} |'] if seconds else []
    md.write(f'| {name} | ' + ' | '.join(fmt(v) for v in per_col) + f' | {fmt(dms)} |'
             + ''.join(sec) + '\n')
    w.writerow([name] + [float(np.mean(v)) for v in per_col] + [float(np.mean(dms))]
               + ([float(np.median(seconds[name]))] if seconds else []))
  return md.getvalue(), buf.getvalue()


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--out', required=True)
  p.add_argument('--run', action='append', required=True, help='NAME=CONFIG[:ARG] [k=v ...]')
  p.add_argument('--seeds', default='0', help='comma-separated training seeds')
  p.add_argument('--reference', default='local', help='run name Δm is relative to')
  p.add_argument('--xla_cache_dir', default='~/.cache/fedjax_mtl/xla',
                 help="persistent XLA compilation cache, as fedjax_mtl.main ('none': off); "
                      'seeds after the first reuse the compiled programs')
  a = p.parse_args(argv)
  import jax
  if a.xla_cache_dir != 'none' and not os.environ.get('JAX_COMPILATION_CACHE_DIR'):
    jax.config.update('jax_compilation_cache_dir', os.path.expanduser(a.xla_cache_dir))
  from fedjax_mtl import train  # after argument parsing: imports jax
  seeds = [int(s) for s in a.seeds.split(',')]
  runs = []
  for item in a.run:
    name, _, spec = item.partition('=')
    if not spec:
      p.error(f'--run {item!r}: expected NAME=CONFIG')
    runs.append((name, spec))
  results: dict[str, list[dict[str, float]]] = {}
  seconds: dict[str, list[float]] = {}
  for name, spec in runs:
    for seed in seeds:
      cfg = load_config(spec)
      cfg.seed = seed
      cfg.progress = False
      wd = os.path.join(a.out, name, f'seed{seed}')
      if not os.path.exists(os.path.join(wd, 'results.csv')):
        print(f'== {name} seed {seed}: {spec}', flush=True)
        train.train_and_evaluate(cfg, wd)
      results.setdefault(name, []).append(final_metrics(wd))
      seconds.setdefault(name, []).append(
          report.seconds_per_round(os.path.join(wd, 'timing.jsonl')))
  md, csv_text = comparison_table(results, a.reference, seconds)
  os.makedirs(a.out, exist_ok=True)
  report.atomic_write(os.path.join(a.out, 'comparison.md'), md)
  report.atomic_write(os.path.join(a.out, 'comparison.csv'), csv_text)
  print(md)
  return results


if __name__ == '__main__':
  from fedjax_mtl import hostmem
  hostmem.reuse_freed_memory()  # as fedjax_mtl.main does on CPU-only runs
  main(sys.argv[1:])
