"""The round loop (FedHCA2 Alg. 1 for any algorithm):

    build the experiment -> round-0 state (or the newest checkpoint)
    for each round: local training -> aggregation     (the feed: one compiled round
                                                       in memory, chunks when streamed)
                    -> evaluation -> logging / checkpoint

Building lives in `experiment.py`, the round's pure functions in `rounds.py`,
the data sources in `feeds.py`, the typed state in `state.py`. Host transfers
happen once per round (logging).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl import (distributed, evaluate, experiment, feeds, preempt, progress, report, rounds,
                        validate)
from fedjax_mtl import workdir as workdir_lib
from fedjax_mtl.algorithms.base import unified_mode
from fedjax_mtl.checkpoint import Checkpointer
from fedjax_mtl.errors import ConfigError, DivergedError
from fedjax_mtl.experiment import (Experiment, build, init_state,  # noqa: F401
                                   train_compiler_options)
from fedjax_mtl.feeds import Feed, evaluates_linear
from fedjax_mtl.state import FedState


def run_eval(exp: Experiment, state: FedState, feed: Feed, linear: bool = False) -> list[dict]:
  """Metrics rows (client, task, metric, value) of the models the clients evaluate:
  one pass over each test split; an edge client's test loss is replaced by its
  odsF (host-side matching of the same pass's edge maps). `linear`: of the linear
  models the clients trained in (`feeds.evaluates_linear`; edge as its loss)."""
  stats, edges = feed.eval_outputs(state, linear)
  rows = []
  for spec, st, ods in zip(exp.fed.groups, stats, edges):
    group_rows = evaluate.finalize_group(spec, st, exp.fed.clients)
    if ods is not None:
      by_client = {r['client']: r for r in ods}
      group_rows = [by_client.get(r['client'], r) if r['task'] == 'edge' else r
                    for r in group_rows]
    rows += group_rows
  return rows


def _train_rows(exp: Experiment, rnd: int, metrics) -> list[dict]:
  rows = []
  for spec, m in zip(exp.fed.groups, metrics):
    for j, cid in enumerate(spec.client_ids):
      c = exp.fed.clients[cid]
      for s, t in enumerate(c.tasks):
        rows.append({'round': rnd, 'type': 'train', 'client': c.name, 'dataset': c.dataset,
                     'task': t, 'loss': float(m['loss'][j, s]), 'steps': int(m['steps'][j])})
  return rows


def _agg_rows(rnd: int, logs: dict) -> list[dict]:
  if not logs:
    return []
  return [{'round': rnd, 'type': 'agg',
           **{k: np.asarray(v).tolist() for k, v in logs.items()}}]


def _meta_row(exp: Experiment) -> dict:
  """Round-0 row naming the clients, decoders and decoder layers (for plots)."""
  from fedjax_mtl.models.decoder import DECODER_LAYERS
  return {'round': 0, 'type': 'meta', 'clients': [c.name for c in exp.fed.clients],
          'decoders': list(exp.fed.decoder_names), 'decoder_layers': list(DECODER_LAYERS)}


def divergence(exp: Experiment, rnd: int, health: dict) -> str | None:
  """One line naming what went non-finite in round `rnd` (host copy of the round's
  `health` flags, see `rounds.health`), or None when everything is finite."""
  fed = exp.fed

  def clients(kind):
    named = []
    for spec, ok in zip(fed.groups, health[kind]):
      for j, cid in enumerate(spec.client_ids):
        c = fed.clients[cid]
        bad = ([t for s, t in enumerate(c.tasks) if not ok[j, s]] if kind == 'loss'
               else [] if ok[j] else list(c.tasks))
        if bad:
          named.append(f'{c.name} ({", ".join(bad)})')
    return named

  for kind, what in (('loss', 'training loss'), ('params', 'parameters after local training'),
                     ('agg', 'aggregated parameters')):
    named = clients(kind)
    if named:
      return f'round {rnd}: non-finite {what} of client {"; ".join(named)}'
  if not bool(health['server']):
    return f'round {rnd}: non-finite server state or aggregation weights ({exp.config.algorithm})'
  return None


def _summary(rnd: int, total: int, dt: float, train_rows, eval_rows) -> str:
  loss = np.mean([r['loss'] for r in train_rows])
  line = f'round {rnd}/{total} {dt:6.2f}s | train loss {loss:.4f}'
  if eval_rows:
    by = {}
    for r in eval_rows:
      by.setdefault((r['dataset'], r['task'], r['metric']), []).append(r['value'])
    line += ' | eval ' + ' '.join(f'{d}/{t} {m} {np.mean(v):.2f}' for (d, t, m), v in by.items())
  return line


def method_label(config) -> str:
  """The method's name in result tables: the algorithm, and FedDEA's unified-model
  decision (spec feddea §6 A1) when the run uses one."""
  mode = unified_mode(config)
  return config.algorithm if mode == 'none' else f'{config.algorithm} [unified={mode}]'


def train_and_evaluate(config, workdir: str, stop_after: int | None = None) -> dict:
  """Run (or resume) the federated experiment in `workdir`; returns final metrics.

  `stop_after` ends the process after that many completed rounds, as an
  interruption would (used to test resumption).

  Multi-process runs (`distributed`): every process calls this with the same config
  and workdir (a shared filesystem); only process 0 writes metrics, reports and
  progress, and every process saves its shards of the checkpoints.

  The run holds the workdir's lock (`fedjax_mtl.workdir`; process 0 for all) from
  before it reads the workdir to its end: another run there raises WorkdirLocked.
  SIGTERM or SIGINT during a round ends the run after that round with its checkpoint
  saved: `preempt.Stopped` (`fedjax_mtl.preempt`).
  """
  if config.get('setting', 'dense') == 'many_task':
    if distributed.settings(config) is not None:
      raise ConfigError("multi-process runs (distributed.*, JAX_COORDINATOR_ADDRESS) take "
                        "setting='dense' only; run the many-task setting as one process")
    from fedjax_mtl.manytask import run
    return run.train_and_evaluate(config, workdir, stop_after)
  validate.check_run(config, workdir)
  distributed.initialize(config)  # before JAX's backends (a no-op for one process)
  with workdir_lib.primary_lock(workdir):  # one writer: before the workdir is read
    workdir_lib.check_config(config, workdir)
    return _train_and_evaluate(config, workdir, stop_after)


def _train_and_evaluate(config, workdir: str, stop_after: int | None) -> dict:
  primary = distributed.is_primary()
  exp = build(config)
  ckpt_dir = os.path.join(workdir, 'checkpoints')
  start = Checkpointer.latest_in(ckpt_dir) or 0
  feed = feeds.make_feed(exp, start)  # opens every data source before anything is written
  metrics_path = os.path.join(workdir, 'metrics.jsonl')
  timing_path = os.path.join(workdir, 'timing.jsonl')
  abstract = init_state(exp, abstract=True)
  total = config.num_rounds
  ckpt = Checkpointer(ckpt_dir) if start else None
  state = None
  try:
    if start:  # restored before compiling: a checkpoint of another model fails in seconds
      restored, state = ckpt.restore_latest(abstract)  # newer unreadable steps are set aside
      if restored != start:  # a streamed feed must start from the restored round
        feed.close()
        start, feed = restored, feeds.make_feed(exp, restored)
    # A finished run only restores its last state and rewrites its reports: no program runs.
    jobs = feed.programs(abstract) if start < total else []
    if not start and not config.model.get('pretrained_path'):
      jobs += experiment.init_program(exp).jobs(jnp.asarray(config.seed, jnp.uint32))
    eval_rounds = {r for r in range(1, total + 1) if r % config.eval_every == 0 or r == total}
    # Every eval record of a unified-model run carries its A1 decision.
    record = {} if unified_mode(config) == 'none' else {'unified': unified_mode(config)}
    prog = progress.Progress(f'{config.algorithm} {exp.fed.num_clients} clients', total, start,
                             eval_rounds, sum(rounds.group_steps(exp)),
                             enabled=bool(config.progress) and primary, summaries=primary)
    prog.compiling([name for name, _, _ in jobs], jax.config.jax_compilation_cache_dir)
    compile_s = experiment.compile_programs(jobs)
    prog.compiled(compile_s)
    if not start:
      state = init_state(exp)  # may still fail (pretrained weights' shapes)
    distributed.barrier('compiled')  # every process compiled its programs
  except BaseException:
    feed.close()
    if ckpt is not None:
      ckpt.close()
    raise
  os.makedirs(workdir, exist_ok=True)  # the first write
  if ckpt is None:
    ckpt = Checkpointer(ckpt_dir)
  if primary:  # process 0 writes the run's files
    if start:
      report.truncate_jsonl(metrics_path, start)
      if os.path.exists(timing_path):
        report.truncate_jsonl(timing_path, start)
    else:
      # A fresh start: rows left by an attempt that never reached a checkpoint go.
      report.atomic_write(metrics_path, '')
      report.atomic_write(timing_path, '')
      report.append_jsonl(metrics_path, [_meta_row(exp)])
    report.append_jsonl(timing_path, [{'round': start, 'compile_s': compile_s}])
    report.atomic_write(os.path.join(workdir, 'config.json'),
                        config.to_json_best_effort(indent=2))
  sink = None
  if config.get('tensorboard', False) and primary:
    from fedjax_mtl import sinks  # optional extra
    sink = sinks.TensorBoardSink(os.path.join(workdir, 'tensorboard'),
                                 purge_step=start + 1 if start else None)
    sink.write([r for r in report.read_jsonl(metrics_path) if r.get('type') == 'meta'])
  eval_rows: list[dict] = []
  linear_eval = evaluates_linear(exp)
  diverged = stopped = None
  try:
    with prog, preempt.Signals(start) as signals:
      for rnd in range(start + 1, total + 1):
        prog.round_start(rnd)
        state, out = feed.run_round(state, rnd, prog.step_callback())  # training -> aggregation
        out = distributed.host_get(out)  # the one host transfer per round
        diverged = divergence(exp, rnd, out['health'])
        if diverged:  # the round is not committed: no rows, no checkpoint
          break
        rows = _train_rows(exp, rnd, out['train']) + _agg_rows(rnd, out['agg'])
        eval_rows = []
        if rnd in eval_rounds:
          eval_rows = [{'round': rnd, 'type': 'eval', **r, **record}
                       for r in run_eval(exp, state, feed)]
          if linear_eval:  # NTKFedAvg's evaluation B, beside the model itself (A)
            eval_rows += [{'round': rnd, 'type': 'eval_linear', **r, **record}
                          for r in run_eval(exp, state, feed, linear=True)]
        if primary:
          report.append_jsonl(metrics_path, rows + eval_rows)
        if sink is not None:
          sink.write(rows + eval_rows)
        # SIGTERM / SIGINT: this round is saved and the run stops (every process at the
        # same round); in the last round the run just finishes.
        stop = signals.stop_after(rnd) if rnd < total else None
        if rnd % config.checkpoint_every == 0 or rnd == total or stop:
          ckpt.save(rnd, state)
        dt = prog.round_seconds()
        prog.round_end(rnd, dt, bool(eval_rows), _summary(
            rnd, total, dt, [r for r in rows if r['type'] == 'train'], eval_rows))
        # Wall times go to their own file: metrics.jsonl stays identical across resumes.
        if primary:
          report.append_jsonl(timing_path, [{'round': rnd, 'seconds': dt,
                                             'eval': bool(eval_rows)}])
        if stop:
          stopped = preempt.Stopped(rnd, stop)
          break
        if stop_after is not None and rnd >= stop_after:
          return {'state': state, 'eval': eval_rows, 'interrupted': True}
  finally:
    ckpt.close()  # waits for the last save
    feed.close()
    if sink is not None:
      sink.close()
  if stopped:
    raise stopped  # after the checkpoint is committed
  if diverged:
    newest = Checkpointer.latest_in(ckpt_dir)
    raise DivergedError(f'{diverged}; the round was not saved (newest checkpoint: '
                        f'{f"round {newest}" if newest else "none"}); lower optim.lr '
                        'or check the data')
  distributed.barrier('metrics written')  # process 0's rows are on disk
  all_rows = report.read_jsonl(metrics_path)
  final = [r for r in all_rows if r['type'] == 'eval' and r['round'] == total]
  if not primary:
    return {'state': state, 'eval': final, 'interrupted': False}
  report.plot_metric_curves(all_rows, workdir)
  report.plot_hyperweights(all_rows, workdir)
  ref_dir = config.get('delta_m_reference', '')
  ref = report.final_eval_rows(os.path.join(ref_dir, 'metrics.jsonl')) if ref_dir else None
  md, csv_text = report.results_table(method_label(config), final, ref)
  report.atomic_write(os.path.join(workdir, 'results.md'), md)
  report.atomic_write(os.path.join(workdir, 'results.csv'), csv_text)
  return {'state': state, 'eval': final, 'interrupted': False}
