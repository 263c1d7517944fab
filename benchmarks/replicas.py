"""Sweeps. `--only=replicas`: the seeds of one config as separate runs against one
sweep's replicas (`config.sweep='seed=...'`, one compiled program), each a cold
`python -m fedjax_mtl.main` process (no compilation cache) one after the other.
`--only=many_replicas`: the same for the many-task setting (MaTU on mini8, each
seed with its own client split). `--only=replica_scaling`: rounds per second and MFU
of sweeps of R = 1, 4, 16 replicas in one process (for an accelerator).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks.common import ROOT


def _run(config: str, workdir: str, extra: list[str]) -> tuple[float, list[dict]]:
  """(wall seconds, timing.jsonl rows) of one cold run."""
  cmd = [sys.executable, '-m', 'fedjax_mtl.main', f'--config={config}', f'--workdir={workdir}',
         '--xla_cache_dir=none', '--config.progress=false', *extra]
  t = time.perf_counter()
  p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
  wall = time.perf_counter() - t
  if p.returncode:
    raise RuntimeError(f'{" ".join(cmd)} failed: {p.stderr[-2000:]}')
  with open(os.path.join(workdir, 'timing.jsonl')) as f:
    return wall, [json.loads(line) for line in f]


def _steady(rows: list[dict]) -> float:
  """Median seconds of the rounds after the first without evaluation."""
  return float(np.median([r['seconds'] for r in rows
                          if r.get('round', 0) > 1 and 'seconds' in r and not r['eval']]))


def _finals(workdir: str) -> dict:
  from fedjax_mtl import report
  return report.final_metrics(workdir)


def _separate_and_sweep(config: str, seeds: tuple[int, ...], seed_args, sweep: str,
                        extra: list[str], compare_finals) -> dict:
  """`seeds` of `config` as separate cold runs (`seed_args(s)`: a run's flags) and as
  one cold sweep (`--config.sweep=<sweep>`), each with `extra` flags: wall and compile
  seconds, steady rounds and the throughput per replica, and `compare_finals(separate
  workdirs, replica workdirs)`'s entries."""
  out: dict = {'config': config, 'replicas': len(seeds)}
  with tempfile.TemporaryDirectory() as tmp:
    walls, single_rounds, sep_dirs = [], [], []
    for s in seeds:
      wd = os.path.join(tmp, f'seed{s}')
      wall, rows = _run(config, wd, [*seed_args(s), *extra])
      walls.append(wall)
      single_rounds.append(_steady(rows))
      sep_dirs.append(wd)
      out.setdefault('separate_compile_s', rows[0]['compile_s'])
    sweep_wd = os.path.join(tmp, 'sweep')
    wall, rows = _run(config, sweep_wd, [f'--config.sweep={sweep}', *extra])
    out['separate_runs_wall_s'] = [round(w, 1) for w in walls]
    out['separate_wall_s'] = round(sum(walls), 1)
    out['sweep_wall_s'] = round(wall, 1)
    out['sweep_over_separate'] = round(wall / sum(walls), 3)
    out['sweep_compile_s'] = rows[0]['compile_s']
    out['single_round_s'] = round(float(np.median(single_rounds)), 3)
    out['sweep_round_s'] = round(_steady(rows), 3)
    out['throughput_per_replica'] = round(
        out['single_round_s'] * len(seeds) / out['sweep_round_s'], 3)
    # A replica's folder is named 'seed=<s>[,...]' (`Sweep.label`).
    by_seed = {int(label.split(',')[0].split('=')[1]): label
               for label in os.listdir(os.path.join(sweep_wd, 'replicas'))}
    replica_dirs = [os.path.join(sweep_wd, 'replicas', by_seed[s]) for s in seeds]
    out.update(compare_finals(sep_dirs, replica_dirs))
  return out


def bench_replicas(config: str = 'configs/hca2.py', seeds: tuple[int, ...] = (0, 1, 2)) -> dict:
  """Wall seconds of `seeds` as separate cold runs (summed) and as one cold sweep; the
  rounds' throughput per replica (a single run's steady round seconds over the
  sweep's divided by R); compile seconds of both; and how far a replica's final
  metrics are from its separate run's, in units of the seeds' spread."""
  def finals(sep_dirs, replica_dirs):
    # Each final metric of a replica against its separate run, in units of that
    # metric's spread (std) over the separate runs' seeds.
    theirs = [_finals(wd) for wd in sep_dirs]
    mine = [_finals(wd) for wd in replica_dirs]
    ratios = {k: max(abs(m[k] - t[k]) for m, t in zip(mine, theirs))
              / max(float(np.std([t[k] for t in theirs])), 1e-12) for k in theirs[0]}
    worst = max(ratios, key=ratios.get)
    return {'final_metric_diff_over_seed_std': {
        'max': round(ratios[worst], 3), 'metric': worst,
        'median': round(float(np.median(list(ratios.values()))), 3)}}

  return _separate_and_sweep(config, seeds, lambda s: [f'--config.seed={s}'],
                             'seed=' + ','.join(map(str, seeds)), [], finals)


def bench_many_replicas(config: str = 'configs/matu.py', seeds: tuple[int, ...] = (0, 1, 2),
                        rounds: int = 0) -> dict:
  """`bench_replicas` for the many-task setting: `seeds` of `config` (each with its own
  client split, `split_seed = seed`, as scripts/compare.py and matu_figures.py run
  them) as separate cold runs and as one cold sweep (`seed+split_seed=...`); a
  replica's final accuracies against its separate run's (`rounds` > 0 overrides the
  config's rounds)."""
  from fedjax_mtl import report

  def finals(sep_dirs, replica_dirs):
    theirs = [report.final_accuracy(wd) for wd in sep_dirs]
    mine = [report.final_accuracy(wd) for wd in replica_dirs]
    return {'final_accuracy_max_abs_diff': round(
        max(abs(m[k] - t[k]) for m, t in zip(mine, theirs) for k in t), 4)}

  return _separate_and_sweep(
      config, seeds, lambda s: [f'--config.seed={s}', f'--config.split_seed={s}'],
      'seed+split_seed=' + ','.join(map(str, seeds)),
      [f'--config.num_rounds={rounds}'] if rounds else [], finals)


# `--only=replica_scaling`: the default config, and its layout at Swin-T 224² (the 1c
# scenario on synthetic scenes, bf16, 4 local steps per round), as sweeps of R seeds.
SCALING_SETUPS = {
    'default': [],
    'swin_t_224': ['model.encoder=swin_t', "data.resolution={'pascal':(224,224),"
                   "'nyud':(224,224)}", 'max_steps_per_round=4', 'model.dtype=bfloat16'],
}


def bench_replica_scaling(rs: tuple[int, ...] = (1, 4, 16), rounds: int = 3,
                          setups: tuple[str, ...] = tuple(SCALING_SETUPS),
                          peak_tflops: float = 0.0, log=print) -> dict:
  """Rounds per second of sweeps of R = `rs` seeds in this process (`rounds` rounds
  after compiling, the first left out), the replicas' throughput against the first
  R, the round's model FLOPs (XLA cost analysis of its trainers and aggregation) and
  MFU where the device's peak is known; each R compiled and run on its own. A CPU
  dry run (rs=(1, 2), setups=('default',)) checks that it works."""
  import gc
  import jax
  from benchmarks.common import peak_flops
  from fedjax_mtl import compare, engines, experiment
  peak = peak_flops(peak_tflops)
  out = {}
  for setup in setups:
    rows = {}
    for r in rs:
      config = compare.load_config(' '.join(
          ['configs/hca2.py', 'progress=False', 'sweep=seed=' + ','.join(map(str, range(r))),
           *SCALING_SETUPS[setup]]))
      engine = engines.build(config)
      engine.open(0)
      try:
        flops = []

        def count(name, compiled):  # the round's programs: trainers and aggregation
          if not name.startswith('evaluate'):
            flops.append(float((compiled.cost_analysis() or {}).get('flops', 0.0)))

        compile_s = sum(experiment.compile_programs(
            engine.programs_to_compile(engine.abstract_state()), count).values())
        flops = sum(flops)
        state = engine.init_state()
        times = []
        for rnd in range(1, rounds + 1):
          t = time.perf_counter()
          state, res = engine.run_round(state, rnd)
          jax.block_until_ready((state, res))
          times.append(time.perf_counter() - t)
      finally:
        engine.close()
      steady = float(np.median(times[1:] if len(times) > 1 else times))
      row = {'round_s': round(steady, 4), 'replica_rounds_per_s': round(r / steady, 3),
             'compile_s': round(compile_s, 1), 'round_tflop': round(flops / 1e12, 4)}
      if peak:
        row['mfu'] = round(flops / steady / peak, 4)
      rows[r] = row
      log(f'replica_scaling {setup} R={r}: {row}')
      del state, engine
      gc.collect()
    first = rows[rs[0]]['replica_rounds_per_s']
    for row in rows.values():
      row['throughput_vs_first'] = round(row['replica_rounds_per_s'] / first, 3)
    out[setup] = rows
  return out
