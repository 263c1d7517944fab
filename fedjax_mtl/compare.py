"""Run several methods on one scenario with the same seeds; write a comparison table.

    python scripts/compare.py --out=runs/compare --seeds=0,1 \\
        --run local=configs/local.py --run fedavg=configs/fedavg.py \\
        --run fedhca2=configs/hca2.py \\
        --run "enc-only=configs/hca2.py hca2.decoder_agg=none"

Each `--run` is `NAME=CONFIG[:ARG] [field=value ...]` (overrides as dotted
config fields). A dense method's seeds on the synthetic data run as one sweep's
replicas (`config.sweep='seed=0,1'`: one compiled program for all seeds) in
OUT/NAME/seeds<S,...>, each seed's run in its replicas/seed=<S> sub-workdir;
with --no-replicas (and for the many-task setting or real data) each seed is
its own run in OUT/NAME/seed<S>. A finished run of the same config
is read back, not redone; an interrupted one resumes; a folder holding a run of
another config stops the script before anything runs, unless --rerun_changed
moves it aside. The table has one row per method, one column per client task
(final round, mean ± std over seeds), Δm against the run named by --reference
(default `local`; `--pair NAME=REF` sets another reference for one method, e.g.
each +DEA row against its base) and the median seconds per round (rounds after
the first, without evaluation; a sweep's divided by its replicas), written to
OUT/comparison.md and .csv.

When every run is of the many-task setting (`setting='many_task'`, e.g.
`configs/fedavg.py:mini8`), the table is MaTU's Table 1/2 (spec matu §5) instead:

    python scripts/compare.py --out=runs/table1 --seeds=0,1,2 --reference=individual \\
        --run "individual=configs/local.py:mini8 many.num_clients=8 many.class_split=iid" \\
        --run fedavg=configs/fedavg.py:mini8 --run matu=configs/matu.py

one column per task (top-1 accuracy % of the last evaluated round, mean ± std over
seeds), `avg` (the mean over tasks), `normalised avg` (per seed the mean over tasks
of 100·acc / acc of the --reference run of the same seed; the reference row is
100.0), `bits/task` (mean over rounds and seeds of the uploaded bits per task; '–'
for none, e.g. Individual) and the median seconds per round. There a seed sets the
client split as well (`split_seed = seed`); a dense run keeps its `split_seed`.
Many-task and dense runs cannot share one call; --pair is for Δm only.
"""

# The logic of scripts/compare.py, the command line above (also `python -m
# fedjax_mtl.compare`); scripts/rho_sweep.py, ntk_table1.py, ntk_unlearning.py and
# fedjax_mtl.matu_figures plan and run their sweeps with plan_runs and execute.

from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import io
import os
import sys
from typing import Any, NamedTuple

import numpy as np

from fedjax_mtl import comm, report
# Many-task results (read by the sweep scripts as compare.<name>).
from fedjax_mtl.report import bits_per_task, final_accuracy, format_bits, many_task_table
from fedjax_mtl import workdir as workdir_lib
from fedjax_mtl.errors import ConfigError


def _parse_value(raw: str, old, field: str):
  """`raw` as a value of the type of the field's current value `old`."""
  if isinstance(old, str):
    return raw
  if isinstance(old, bool):
    words = {'1': True, 'true': True, 'yes': True, '0': False, 'false': False, 'no': False}
    if raw.lower() not in words:
      raise ConfigError(f'{field}={raw}: expected true or false like the default {old}')
    return words[raw.lower()]
  try:
    value = ast.literal_eval(raw)
  except (ValueError, SyntaxError):
    if old is None:
      return raw  # a None default takes any value; unquoted words are strings
    raise ConfigError(f'{field}={raw}: not a Python literal; expected '
                      f'{type(old).__name__} like the default {old!r}') from None
  if old is None:
    return value
  if isinstance(old, int) and isinstance(value, float) and not value.is_integer():
    raise ConfigError(f'{field}={raw}: expected int like the default {old!r}')
  try:
    return type(old)(value)
  except (TypeError, ValueError):
    raise ConfigError(f'{field}={raw}: expected {type(old).__name__} '
                      f'like the default {old!r}') from None


def load_config(spec: str):
  """`configs/x.py[:arg] field=value ...` -> ConfigDict; ConfigError (one line) when
  the file, its get_config, a field name or a value is wrong."""
  if not spec.split():
    raise ConfigError('empty config spec; expected CONFIG[:ARG] [field=value ...]')
  from fedjax_mtl import config_doc
  path, *overrides = spec.split()
  cfg = config_doc.load_config(path)
  for item in overrides:
    key, eq, raw = item.partition('=')
    if not eq or not key:
      raise ConfigError(f'override {item!r}: expected field=value')
    node, last = config_doc.field_parent(cfg, key)
    node[last] = _parse_value(raw, node[last], key)
  return cfg


def is_many_task(cfg) -> bool:
  """Whether a config runs the many-task classification setting (fedjax_mtl/manytask)."""
  return cfg.get('setting', '') == 'many_task'


def table_setting(plan: list) -> bool:
  """Whether the planned runs make the many-task table; ConfigError (one line) naming
  the runs of each setting when both are given."""
  many = {r.name: is_many_task(r.config) for r in plan}
  if len(set(many.values())) > 1:
    names = lambda flag: ', '.join(n for n, m in many.items() if m == flag)
    raise ConfigError(f'many-task runs ({names(True)}) and dense runs ({names(False)}) make '
                      'different tables; compare each setting in its own call')
  return any(many.values())


class Run(NamedTuple):
  """One method and seed of the comparison (or all its seeds as a sweep's replicas),
  planned before anything runs."""
  name: str
  spec: str
  seed: int  # the first of `seeds` for a sweep
  workdir: str
  config: Any
  action: str  # 'reuse' (finished, same config), 'run' (new or resumed) or 'replace'
  diffs: list  # config fields in which the run already in `workdir` differs
  seeds: tuple = ()  # the replicas' seeds when the run is a sweep (`config.sweep`)


def run_dirs(run: Run) -> list[tuple[int, str]]:
  """(seed, workdir) of each seed a planned run holds: its own, or its replicas'
  sub-workdirs (`engines.replicas`)."""
  if not run.seeds:
    return [(run.seed, run.workdir)]
  from fedjax_mtl import validate
  s = validate.sweep_of(run.config)
  return [(s.seed(run.config, r), os.path.join(run.workdir, 'replicas', s.label(r)))
          for r in range(s.size)]


def _seed_config(spec: str, seed: int):
  """The config of `spec` for one seed of the comparison (many-task: the client split
  too), without a progress bar."""
  cfg = load_config(spec)
  cfg.seed, cfg.progress = seed, False
  if is_many_task(cfg):  # the seed sets the many-task client split too
    cfg.split_seed = seed
  return cfg


def _as_replicas(cfg, seeds: list[int]):
  """`cfg` (the first seed's) running `seeds` as one sweep's replicas
  (`config.sweep='seed=...'`; many-task: `'seed+split_seed=...'`, as `_seed_config`
  seeds the client split), or None where a sweep cannot hold them (one seed, real
  dense data, a many-task allocation drawn per split)."""
  from fedjax_mtl import sweep, validate
  if len(seeds) < 2 or cfg.get('sweep', ''):
    return None
  c = cfg.copy_and_resolve_references()
  c.sweep = (('seed+split_seed=' if is_many_task(cfg) else 'seed=')
             + ','.join(map(str, seeds)))
  try:
    sweep.check(c, validate.sweep_of(c))
  except ConfigError:
    return None
  return c


def _aside(wd: str) -> str:
  """A free `<wd>.replaced-<n>` for a run folder that another config's run replaces."""
  n = 1
  while os.path.exists(f'{wd}.replaced-{n}'):
    n += 1
  return f'{wd}.replaced-{n}'


def _finished_per_seed(configs: list[tuple[int, Any]], folder: str) -> bool:
  """Whether `folder` holds a finished run of each (seed, config), one per seed
  (`--no-replicas`' layout, or an older comparison's): those are read back, not run
  again as a sweep."""
  return all(os.path.exists(os.path.join(folder, f'seed{seed}', 'results.csv'))
             and not workdir_lib.config_diffs(cfg, os.path.join(folder, f'seed{seed}'))
             for seed, cfg in configs)


def plan_runs(run_args: list[str], seeds: list[int], out: str,
              rerun_changed: bool = False, hold: contextlib.ExitStack | None = None,
              replicas: bool = False) -> list[Run]:
  """Every run of the comparison, checked before anything runs: ConfigError (one line)
  for a bad --run, for a folder holding another config's run unless `rerun_changed`,
  or for a run folder in use by another process (WorkdirLocked, naming it). With
  `hold`, each run folder's lock (`fedjax_mtl.workdir`) is taken into it before the
  folder is read, so that no other run enters it while the comparison lasts.

  `replicas`: a method's seeds run as one sweep (`config.sweep='seed=...'`, one
  compiled program; OUT/NAME/seeds<S,...>, a sub-workdir per seed: `run_dirs`) where
  a sweep can hold them (`_as_replicas`) and the seeds have not all finished
  already as separate runs of the same config; else one run per seed."""
  from fedjax_mtl import validate  # imports jax
  plan, names = [], set()
  for item in run_args:
    name, eq, spec = item.partition('=')
    if not eq or not name or not spec.strip():
      raise ConfigError(f'--run {item!r}: expected NAME=CONFIG[:ARG] [field=value ...]')
    if name in names:
      raise ConfigError(f'--run {name!r} is given twice; each method needs its own name')
    names.add(name)
    try:
      configs = [(seed, _seed_config(spec, seed)) for seed in seeds]
      for _, cfg in configs:
        validate.check_config(cfg)
      swept = (_as_replicas(configs[0][1], seeds) if replicas
               and not _finished_per_seed(configs, os.path.join(out, name)) else None)
      if swept is not None:
        validate.check_config(swept)
    except ConfigError as e:
      raise ConfigError(f'--run {name}: {e}') from None
    folders = ([(seeds[0], swept, 'seeds' + ','.join(map(str, seeds)))] if swept is not None
               else [(seed, cfg, f'seed{seed}') for seed, cfg in configs])
    for seed, cfg, folder in folders:
      wd = os.path.join(out, name, folder)
      if hold is not None:
        hold.enter_context(workdir_lib.lock(wd))
      else:
        workdir_lib.check_free(wd)
      diffs = workdir_lib.config_diffs(cfg, wd)
      if diffs and not rerun_changed:
        raise ConfigError(
            f'{wd} holds a run of {name} seed {seed} with another config (fields: '
            f'{", ".join(diffs)}); --rerun_changed moves it aside and runs again')
      finished = os.path.exists(os.path.join(wd, 'results.csv'))
      action = 'replace' if diffs else 'reuse' if finished else 'run'
      plan.append(Run(name, spec, seed, wd, cfg, action, diffs,
                      tuple(seeds) if swept is not None else ()))
  return plan


def add_run_flags(p: argparse.ArgumentParser) -> None:
  """Adds --seeds, --no-replicas, --rerun_changed and --xla_cache_dir to `p` (the flags
  every script that plans runs with plan_runs shares)."""
  p.add_argument('--seeds', default='0',
                 help='comma-separated training seeds (many-task runs: also split_seed, '
                      'the client split)')
  p.add_argument('--no-replicas', dest='no_replicas', action='store_true',
                 help="one run per seed; by default a method's seeds run as one sweep's "
                      'replicas (one compiled program) where the setting allows it (dense '
                      'synthetic data; many-task with a fixed number of tasks per client)')
  p.add_argument('--rerun_changed', action='store_true',
                 help='a run folder holding a run of another config is moved to '
                      '<folder>.replaced-<n> and run again (default: stop with an error)')
  p.add_argument('--xla_cache_dir', default='~/.cache/fedjax_mtl/xla',
                 help="persistent XLA compilation cache, as fedjax_mtl.main ('none': off); "
                      'seeds after the first reuse the compiled programs')


def use_xla_cache(cache_dir: str) -> None:
  """The persistent compilation cache (unless 'none' or set by the environment)."""
  import jax
  if cache_dir != 'none' and not os.environ.get('JAX_COMPILATION_CACHE_DIR'):
    jax.config.update('jax_compilation_cache_dir', os.path.expanduser(cache_dir))


def execute(run: Run) -> None:
  """Bring one planned run to its end: a finished run of the same config is left as
  it is, an interrupted one resumes, another config's run is moved aside first."""
  from fedjax_mtl import train
  if run.action == 'replace':
    old = _aside(run.workdir)
    with workdir_lib.lock(run.workdir):  # its lock file stays: the folder stays held
      os.mkdir(old)
      for name in os.listdir(run.workdir):
        if name != workdir_lib.LOCK_FILE:
          os.rename(os.path.join(run.workdir, name), os.path.join(old, name))
    print(f'== {run.name} {_seeds_text(run)}: config changed (fields: '
          f'{", ".join(run.diffs)}); the old run is now {old}', flush=True)
  if run.action != 'reuse':
    print(f'== {run.name} {_seeds_text(run)}: {run.spec}', flush=True)
    train.train_and_evaluate(run.config, run.workdir)


def _seeds_text(run: Run) -> str:
  if run.seeds:
    return 'seeds ' + ','.join(map(str, run.seeds)) + ' (one program)'
  return f'seed {run.seed}'


def main(argv: list[str] | None = None) -> dict:
  """The command line (`scripts/compare.py`): parses `argv`, runs the comparison and
  returns {method: [final metrics per seed]}; bad input exits with code 2 after one
  `error:` line on stderr."""
  p = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--out', required=True, help='output folder: OUT/NAME/seeds<S,...> or '
                 'OUT/NAME/seed<S> per run, '
                 'OUT/comparison.md and OUT/comparison.csv')
  p.add_argument('--run', action='append', required=True,
                 help='one method: NAME=CONFIG[:ARG] [field=value ...] (repeat per method)')
  p.add_argument('--reference', default='local',
                 help='run name Δm (many-task: the normalised accuracy) is relative to')
  p.add_argument('--pair', action='append', default=[],
                 help='NAME=REF: Δm of run NAME against run REF instead of --reference '
                      '(repeat; e.g. fedavg+dea=fedavg)')
  add_run_flags(p)
  a = p.parse_args(argv)
  try:
    return _compare(a)
  except ConfigError as e:
    print('error: ' + ' '.join(str(e).split()), file=sys.stderr)
    raise SystemExit(2) from None


def _compare(a: argparse.Namespace) -> dict:
  """main() after argument parsing; ConfigError for bad input."""
  try:
    seeds = [int(s) for s in a.seeds.split(',')]
  except ValueError:
    raise ConfigError(f'--seeds={a.seeds}: expected comma-separated integers, e.g. 0,1') from None
  use_xla_cache(a.xla_cache_dir)
  pairs = {}
  names = {item.partition('=')[0] for item in a.run}
  for item in a.pair:
    name, eq, ref = item.partition('=')
    if not eq or name not in names or ref not in names:
      raise ConfigError(f'--pair {item!r}: expected NAME=REF with both names given by --run; '
                        'runs: ' + ', '.join(sorted(names)))
    pairs[name] = ref
  with contextlib.ExitStack() as hold:  # every run folder's lock, for the whole comparison
    return _run_plan(a, pairs, plan_runs(a.run, seeds, a.out, a.rerun_changed, hold,
                                         replicas=not a.no_replicas))


def _run_plan(a: argparse.Namespace, pairs: dict[str, str], plan: list[Run]) -> dict:
  """Runs the plan and writes the table; returns {method: [final metrics per seed]}."""
  many = table_setting(plan)
  if many and pairs:
    raise ConfigError('--pair sets Δm references; the many-task table has no Δm '
                      '(its normalised accuracy is against --reference)')
  results: dict[str, list[dict[str, float]]] = {}
  seconds: dict[str, list[float]] = {}
  bits: dict[str, list[float]] = {}
  rows: dict[str, list[list[dict]]] = {}  # method -> each seed's metrics.jsonl rows
  for run in plan:
    execute(run)
    # A sweep's round serves all its replicas: the seconds per round of one replica.
    per_round = report.seconds_per_round(os.path.join(run.workdir, 'timing.jsonl'))
    for _, wd in run_dirs(run):
      results.setdefault(run.name, []).append(
          (final_accuracy if many else report.final_metrics)(wd))
      if many:
        bits.setdefault(run.name, []).append(bits_per_task(wd))
      rows.setdefault(run.name, []).append(
          report.read_jsonl(os.path.join(wd, 'metrics.jsonl')))
      seconds.setdefault(run.name, []).append(per_round / max(len(run.seeds), 1))
  traffic = {m: [comm.totals(r) for r in rs] for m, rs in rows.items()} if not many else {}
  md, csv_text = (many_task_table(results, a.reference, bits, seconds) if many
                  else report.comparison_table(results, a.reference, seconds, pairs, traffic,
                                               {m: privacy_spent(rs) for m, rs in rows.items()}))
  report.write_table(a.out, 'comparison', md, csv_text)
  if many:
    report.plot_traffic(accuracy_curves(rows), a.out, ylabel='mean accuracy (%) ↑')
  else:
    report.plot_traffic(traffic_curves(rows, a.reference, pairs), a.out)
  return results


def accuracy_curves(rows: dict[str, list[list[dict]]]) -> dict[str, tuple[list, list]]:
  """Many-task runs: method -> (cumulative MB, mean accuracy over tasks) at each round
  every seed evaluated, both averaged over seeds."""
  out = {}
  for name, runs in rows.items():
    per_seed = []
    for r in runs:
      acc = {}
      for e in r:
        if e.get('type') == 'eval' and e.get('metric') == 'accuracy':
          acc.setdefault(e['round'], []).append(e['value'])
      per_seed.append(({t: float(np.mean(v)) for t, v in acc.items()}, comm.cumulative_mb(r)))
    out[name] = _seed_mean_curve(per_seed)
  return out


def _seed_mean_curve(per_seed: list[tuple[dict, dict]]) -> tuple[list, list]:
  """(cumulative MB, value) at the rounds where every seed has both (per seed:
  ({round: value}, {round: MB})), each averaged over the seeds."""
  common = sorted(set.intersection(*[set(v) & set(mb) for v, mb in per_seed]))
  return ([float(np.mean([mb[t] for _, mb in per_seed])) for t in common],
          [float(np.mean([v[t] for v, _ in per_seed])) for t in common])


def privacy_spent(runs: list[list[dict]]) -> float | None:
  """The largest ε a method's runs report after their last round (`dp(...)` runs'
  agg rows), or None without DP."""
  last = [max((r for r in rows if r.get('type') == 'agg' and 'dp_epsilon' in r),
              key=lambda r: r['round'], default=None) for rows in runs]
  if None in last or not last:
    return None
  # metrics.jsonl writes ε = ∞ (no noise) as null.
  return max(float('inf') if r['dp_epsilon'] is None else r['dp_epsilon'] for r in last)


def traffic_curves(rows: dict[str, list[list[dict]]], reference: str,
                   pairs: dict[str, str] | None = None) -> dict[str, tuple[list, list]]:
  """Method -> (cumulative MB, Δm) at each round every seed evaluated: Δm against the
  reference method's run of the same seed at the same round (`pairs` as in the
  table), both averaged over seeds; methods without a reference run are left out."""
  out = {}
  for name, runs in rows.items():
    ref_runs = rows.get((pairs or {}).get(name, reference))
    if ref_runs is None or any(comm.totals(r) is None for r in runs):
      continue
    out[name] = _seed_mean_curve([(report.delta_m_by_round(r, ref), comm.cumulative_mb(r))
                                  for r, ref in zip(runs, ref_runs)])
  return out


if __name__ == '__main__':
  from fedjax_mtl import cpu_isa, hostmem
  hostmem.reuse_freed_memory()  # as fedjax_mtl.main does on CPU-only runs
  cpu_isa.pin('AVX2')  # the same kernels on every AVX2 host (fedjax_mtl.cpu_isa)
  main(sys.argv[1:])
