"""NTKFedAvg's federated unlearning (spec §3.1): one client's task vector negated every round.

    python scripts/ntk_unlearning.py --out=runs/unlearning --target=digits --rounds=10

Runs (or reuses) `configs/ntkfedavg.py` (one client per task, every client every
round) with the target task's client negated (`ntkfedavg.negate`), for each
method of --methods:

- `ntkfedavg`: the linearised clients (NTKFedAvg's unlearning);
- `fedavg`: the plain forward with the same server and negation
  (`ntkfedavg.linearize=false`), the paper's FedAvg comparison;
- `ntkfedavg_keep`: NTKFedAvg without negation, the accuracy to compare against;
- `fedavg_keep` (not in the default --methods): FedAvg without negation, so that
  `--methods=ntkfedavg_keep,fedavg_keep` draws the two methods' per-round accuracy
  curves.

A method's seeds run as one sweep's replicas (one compiled program,
`engines/many_replicas.py`) in OUT/<method>/seeds<S,...>, or with --no-replicas
one run per seed in OUT/<method>/seed<S> (a finished run of the same config is
reused, as scripts/compare.py does). Every round's evaluation gives the target
task's accuracy and the mean accuracy of the other tasks. Linearised runs also
have the linear model's accuracies (evaluation B), drawn dashed.

The script writes OUT/unlearning.png and OUT/unlearning.md: the accuracies per
round and the first round at which the target's accuracy is at most 1 % (the
paper: within 4–5 rounds under NTKFedAvg, never under FedAvg).
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
    'ntkfedavg': 'configs/ntkfedavg.py{variant} ntkfedavg.negate={client}',
    'fedavg': 'configs/ntkfedavg.py{variant} ntkfedavg.negate={client} ntkfedavg.linearize=false',
    'ntkfedavg_keep': 'configs/ntkfedavg.py{variant}',
    'fedavg_keep': 'configs/ntkfedavg.py{variant} ntkfedavg.linearize=false',
}


def curves(workdir: str, target: str) -> dict[str, dict[int, float]]:
  """{'target', 'others'(, '_linear' twins): {round: accuracy %}} of one run."""
  rows = [r for r in report.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
          if r.get('type') == 'eval' and r['metric'].startswith('accuracy')]
  out: dict[str, dict[int, list]] = {}
  for r in rows:
    suffix = r['metric'][len('accuracy'):]
    key = ('target' if r['task'] == target else 'others') + suffix
    out.setdefault(key, {}).setdefault(r['round'], []).append(r['value'])
  return {k: {rnd: float(np.mean(v)) for rnd, v in sorted(d.items())} for k, d in out.items()}


def first_round_at_most(curve: dict[int, float], level: float = 1.0) -> int | None:
  return next((r for r, v in sorted(curve.items()) if v <= level), None)


def write(results: dict[str, list[dict]], target: str, out: str) -> str:
  """OUT/unlearning.png and .md from {method: [curves per seed]}; returns the table."""
  from matplotlib.figure import Figure
  from matplotlib.ticker import MaxNLocator
  mean = lambda runs, key: ({r: float(np.mean([c[key][r] for c in runs])) for r in runs[0][key]}
                            if all(key in c for c in runs) else None)
  fig = Figure(figsize=(10, 3.8), layout='constrained')
  axes = fig.subplots(1, 2)
  lines = ['| method | round | ' + f'{target} (model) | {target} (linear model) | '
           'others (model) | others (linear model) |', '|---|---|---|---|---|---|']
  summary = []
  for i, (method, runs) in enumerate(results.items()):
    colour = f'C{i}'
    for ax, part in zip(axes, ('target', 'others')):
      for suffix, ls in (('', '-'), ('_linear', '--')):
        c = mean(runs, part + suffix)
        if c:
          ax.plot(list(c), list(c.values()), color=colour, ls=ls, marker='o', ms=3,
                  label=method + (' (linear model)' if suffix else ''))
    t, tl, o, ol = (mean(runs, k) for k in ('target', 'target_linear', 'others',
                                            'others_linear'))
    fmt = lambda c, r: f'{c[r]:.1f}' if c and r in c else '–'
    for r in t:
      lines.append(f'| {method} | {r} | {fmt(t, r)} | {fmt(tl, r)} | {fmt(o, r)} | '
                   f'{fmt(ol, r)} |')
    first = first_round_at_most(t)
    summary.append(f'- {method} ({len(runs)} seed{"s" if len(runs) > 1 else ""}): {target} '
                   f'≤ 1 % first at round {first if first else "– (never)"}; final {target} '
                   f'{t[max(t)]:.1f} %, others {o[max(o)]:.1f} %')
  negated = any(not m.endswith('_keep') for m in results)  # *_keep runs negate nothing
  axes[0].set_title(f'{target}{" (negated client)" if negated else ""}: accuracy %', fontsize=10)
  axes[1].set_title('mean of the other tasks: accuracy %', fontsize=10)
  for ax in axes:
    ax.set_xlabel('round')
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
  axes[1].legend(fontsize=8, frameon=False)
  fig.savefig(os.path.join(out, 'unlearning.png'), dpi=120)
  text = '\n'.join(summary) + '\n\n' + '\n'.join(lines) + '\n'
  report.atomic_write(os.path.join(out, 'unlearning.md'), text)
  return text


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--out', required=True,
                 help='folder of the runs (OUT/<method>/seed<S>) and of unlearning.png / .md')
  p.add_argument('--target', default='digits',
                 help="the task whose client is negated (mini8's MNIST analogue 'digits'; "
                      "'mnist' with --variant=paper) (default: %(default)s)")
  p.add_argument('--methods', default='ntkfedavg,fedavg,ntkfedavg_keep',
                 help='comma-separated of: ' + ', '.join(METHODS) + ' (default: %(default)s)')
  p.add_argument('--rounds', type=int, default=10,
                 help='communication rounds of every run (default: %(default)s)')
  p.add_argument('--seeds', default='0', help='comma-separated seeds (default: %(default)s)')
  p.add_argument('--variant', default='mini8',
                 help="configs/ntkfedavg.py variant of benchmark B: mini8, smoke or paper "
                      '(default: %(default)s)')
  p.add_argument('--set', default='',
                 help="extra 'field=value ...' overrides for every run, e.g. "
                      "'many.local_epochs=3' (local work)")
  p.add_argument('--finished_only', action='store_true',
                 help='plot the runs that have finished; run nothing')
  p.add_argument('--no-replicas', dest='no_replicas', action='store_true',
                 help="one run per seed; by default a method's seeds run as one sweep's "
                      'replicas (one compiled program)')
  a = p.parse_args(argv)
  from fedjax_mtl.manytask.setting import benchmark_tasks
  from fedjax_mtl import config_doc
  variant = f':{a.variant or "mini8"},benchmark=clip'  # the many-task benchmark B
  base = config_doc.load_config(f'configs/ntkfedavg.py{variant}')
  groups = base.many.client_tasks.split(';')
  if a.target not in groups:
    raise ConfigError(f'--target {a.target!r} is not a task of configs/ntkfedavg.py{variant}; '
                      'valid choices: ' + ', '.join(benchmark_tasks(base.many.benchmark)))
  methods = [m.strip() for m in a.methods.split(',') if m.strip()]
  for m in methods:
    if m not in METHODS:
      raise ConfigError(f'--methods entry {m!r} is unknown; valid choices: ' + ', '.join(METHODS))
  client = groups.index(a.target)
  runs = [f'{m}=' + METHODS[m].format(variant=variant, client=client)
          + f' num_rounds={a.rounds} {a.set}'.rstrip() for m in methods]
  seeds = [int(s) for s in a.seeds.split(',')]
  # Everything is checked before anything runs.
  plan = compare.plan_runs(runs, seeds, a.out, replicas=not a.no_replicas)
  results: dict[str, list[dict]] = {}
  for run in plan:
    if a.finished_only and run.action != 'reuse':
      continue
    compare.execute(run)
    results.setdefault(run.name, []).extend(curves(wd, a.target)
                                            for _, wd in compare.run_dirs(run))
  if results:
    print(write(results, a.target, a.out))
  return results


if __name__ == '__main__':
  main()
