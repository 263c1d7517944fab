"""The run loop, one for every setting (FedHCA2 Alg. 1 for any algorithm):

    engine = build(config)            dense or many-task (`engines/`)
    state  = round 0, or the newest checkpoint
    for each round: local training -> aggregation     (`engine.run_round`)
                    -> evaluation                     (`engine.evaluate`)
                    -> metrics.jsonl / checkpoint     (`workdir.Workdir`)
    -> plots and result tables                        (`engine.write_reports`)

The loop knows only the `engines.Engine` interface; the workdir's files are
`workdir.Workdir`'s. One host transfer per round (its outputs, for logging).
"""

from __future__ import annotations

import time

import jax
import numpy as np

from fedjax_mtl import distributed, engines, experiment, preempt, progress, report, validate
from fedjax_mtl import workdir as workdir_lib
from fedjax_mtl.checkpoint import Checkpointer
from fedjax_mtl.errors import DivergedError


def train_and_evaluate(config, workdir: str, stop_after: int | None = None) -> dict:
  """Run (or resume) the federated experiment in `workdir`; returns final metrics.

  `stop_after` ends the run after that many completed rounds, as an interruption
  would (used to test resumption).

  Multi-process runs (`distributed`): every process calls this with the same config
  and workdir (a shared filesystem); only process 0 writes metrics, reports and
  progress, and every process saves its shards of the checkpoints.

  The run holds the workdir's lock (`fedjax_mtl.workdir`; process 0 for all) from
  before it reads the workdir to its end: another run there raises WorkdirLocked.
  SIGTERM or SIGINT during a round ends the run after that round with its checkpoint
  saved: `preempt.Stopped` (`fedjax_mtl.preempt`).
  """
  validate.check_run(config, workdir)  # `setting` among them
  distributed.initialize(config)  # before JAX's backends (a no-op for one process)
  with workdir_lib.primary_lock(workdir):  # one writer: before the workdir is read
    workdir_lib.check_config(config, workdir)
    return run(engines.build(config), workdir, stop_after)


def every_and_last(total: int, every: int) -> set[int]:
  """The rounds 1..`total` that evaluate (or checkpoint) every `every` rounds: the
  multiples of `every` and the last round."""
  return {r for r in range(1, total + 1) if r % every == 0 or r == total}


def run(engine: engines.Engine, path: str, stop_after: int | None = None) -> dict:
  """The rounds of `engine`'s run in the workdir `path` (locked by the caller)."""
  config, primary = engine.config, distributed.is_primary()
  wd = workdir_lib.Workdir(path, primary)
  start = Checkpointer.latest_in(wd.checkpoint_dir) or 0
  total = int(config.num_rounds)
  eval_rounds = every_and_last(total, int(config.eval_every))
  ckpt_rounds = every_and_last(total, int(config.checkpoint_every))
  ckpt, state, background, round0 = None, None, None, None
  try:
    engine.open(start)  # every data source opens before anything is written
    if start:  # restored before compiling: a checkpoint of another model fails in seconds
      abstract = engine.abstract_state()
      ckpt = Checkpointer(wd.checkpoint_dir, like=abstract)
      restored, state = ckpt.restore_latest(abstract)  # newer unreadable steps are set aside
      if restored != start:  # a streamed source must start from the restored round
        start = restored
        engine.open(start)
    # A fresh run's round-0 programs compile (on one core: no LLVM optimisation on a
    # CPU) while the round's programs are traced. A finished run only restores its
    # last state and rewrites its reports: no program runs.
    round0 = experiment.BackgroundCompile(engine.round0_programs() if not start else [])
    jobs = (engine.programs_to_compile(state if start else engine.abstract_state())
            if start < total else [])
    prog = progress.Progress(engine.label, total, start, eval_rounds, engine.steps_per_round,
                             enabled=bool(config.progress) and primary, summaries=primary)
    # The evaluation programs compile in the background when a round runs before
    # the first evaluation (the default run's first is round 4).
    first_eval = min((r for r in eval_rounds if r > start), default=None)
    defer = first_eval is not None and first_eval > start + 1
    later = [j for j in jobs if defer and j[0].startswith('evaluate')]
    now = [j for j in jobs if not (defer and j[0].startswith('evaluate'))]
    prog.compiling([name for name, _, _ in now] + round0.names,
                   jax.config.jax_compilation_cache_dir,
                   background=[name for name, _, _ in later])
    t = round0.started if round0.names else time.perf_counter()
    compile_s = experiment.compile_programs(now, engine.check_compiled)
    compile_s.update(round0.wait())
    prog.compiled(compile_s, time.perf_counter() - t)  # wall: the first start to the last end
    background = experiment.BackgroundCompile(later)
    if not start:
      state = engine.init_state()  # may still fail (pretrained weights' shapes)
    distributed.barrier('compiled')  # every process compiled its programs
  except BaseException:
    for b in (background, round0):
      if b is not None:
        b.close()
    engine.close()
    if ckpt is not None:
      ckpt.close()
    raise
  ckpt = ckpt or Checkpointer(wd.checkpoint_dir, like=state)
  # The reports' plotting library loads while the rounds run (joined when they end).
  plotting = report.import_plotting_in_background() if primary else None
  eval_rows, diverged, stopped = [], None, None
  # SIGTERM / SIGINT are the loop's from before the first write: a signal that comes
  # once anything is written stops the run after its next round, saved.
  signals = preempt.Signals(start).__enter__()
  try:
    wd.begin(config, start, compile_s, engine.meta_rows())  # the first write
    with prog:
      for rnd in range(start + 1, total + 1):
        prog.round_start(rnd)
        state, out = engine.run_round(state, rnd, prog.step_callback())  # train -> aggregate
        out = distributed.host_get(out)  # the one host transfer per round
        diverged = engine.divergence(rnd, out)
        if diverged:  # the round is not committed: no rows, no checkpoint
          break
        rows = engine.round_rows(rnd, out)
        t = time.perf_counter()
        late_compile_s = background.wait() if rnd in eval_rounds else {}
        eval_rows = engine.evaluate(state, rnd) if rnd in eval_rounds else []
        eval_s = time.perf_counter() - t
        wd.log(rows + eval_rows)
        # SIGTERM / SIGINT: this round is saved and the run stops (every process at the
        # same round); in the last round the run just finishes.
        stop = signals.stop_after(rnd) if rnd < total else None
        t = time.perf_counter()
        if rnd in ckpt_rounds or stop:
          ckpt.save(rnd, state)
        save_s = time.perf_counter() - t  # the loop's wait; the write finishes in the background
        dt = prog.round_seconds()
        prog.round_end(rnd, dt, bool(eval_rows), summary(rnd, total, dt, rows, eval_rows,
                                                         engine.eval_summary(eval_rows)))
        # metrics.jsonl stays identical across resumes; timings go to timing.jsonl
        wd.log_time(rnd, dt, bool(eval_rows), eval_s, save_s, late_compile_s)
        if stop:
          stopped = preempt.Stopped(rnd, stop)
          break
        if stop_after is not None and rnd >= stop_after:
          return {'state': state, 'eval': eval_rows, 'interrupted': True}
  finally:
    signals.__exit__(None, None, None)
    if plotting is not None:
      plotting.join()
    background.close()
    ckpt.close()  # waits for the last save
    engine.close()
    wd.close()
  if stopped:
    raise stopped  # after the checkpoint is committed
  if diverged:
    newest = Checkpointer.latest_in(wd.checkpoint_dir)
    raise DivergedError(f'{diverged}; the round was not saved (newest checkpoint: '
                        f'{f"round {newest}" if newest else "none"}); '
                        f'{engine.divergence_hint()}')
  distributed.barrier('metrics written')  # process 0's rows are on disk
  rows = wd.rows()
  final = [r for r in rows if r['type'] == 'eval' and r['round'] == total]
  if primary:
    engine.write_reports(rows, final, path)
  return {'state': state, 'eval': final, 'interrupted': False}


def summary(rnd: int, total: int, dt: float, rows: list[dict], eval_rows: list[dict],
            evaluation: str) -> str:
  """The round's progress line: seconds, mean train loss, the engine's evaluation part."""
  loss = np.mean([r['loss'] for r in rows if r['type'] == 'train'])
  line = f'round {rnd}/{total} {dt:6.2f}s | train loss {loss:.4f}'
  return line + f' | eval {evaluation}' if eval_rows and evaluation else line
