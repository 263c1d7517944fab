"""The dense engine: hetero-client dense prediction (FedHCA2's setting, `setting='dense'`).

    build (`experiment.build`: federation, models, algorithm, mesh)
    round: local training of every client group -> aggregation   (`rounds.py`)
           in memory: one jitted call per group, one for the aggregation;
           streamed:  one jitted call per chunk of a group's local steps
    evaluation: per group, pooled test statistics (+ host-side edge odsF)

The data comes from `sources.py` (device arrays or grain chunks); the programs
are built once per experiment (`Programs`, attributes), so every run of one config
in a process (a resume, a notebook, the tests) shares them.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl import (comm, distributed, evaluation, experiment, participation, report, rounds,
                        sources)
from fedjax_mtl.algorithms import dp
from fedjax_mtl.algorithms.base import linearized_forward, unified_mode
from fedjax_mtl.data import device_augment
from fedjax_mtl.experiment import Experiment, per_experiment
from fedjax_mtl.models.decoder import DECODER_LAYERS
from fedjax_mtl.state import FedState

PyTree = Any


def with_sharding(tree: PyTree, sharding) -> PyTree:
  """`tree`'s shapes as ShapeDtypeStructs carrying `sharding`."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


copy_tree = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))


def evaluates_linear(exp: Experiment) -> bool:
  """Whether the run also evaluates the linear model its clients trained in (NTKFedAvg's
  evaluation B in the dense engine: a linearised forward whose client part keeps the
  round's point, `{'point': backbone}`)."""
  c = exp.algorithm.client
  return c.forward is linearized_forward and c.frozen_stats


def zero_metrics(g) -> dict:
  """A group's round metrics when none of its clients trained (host arrays)."""
  n = g.num_total
  return {'loss': np.zeros((n, g.num_slots), np.float32), 'steps': np.zeros((n,), np.int32),
          'first_loss': np.zeros((n,), np.float32), 'last_loss': np.zeros((n,), np.float32)}


def zero_accs(g, n: int) -> dict:
  """A group's training statistics, zero, for `n` of its clients (host arrays)."""
  return {'loss_sum': np.zeros((n, g.num_slots), np.float32), 'steps': np.zeros((n,), np.int32),
          'first_loss': np.zeros((n,), np.float32), 'last_loss': np.zeros((n,), np.float32)}


def group_evaluators(exp: Experiment, linear: bool = False) -> list:
  """Per group: `evaluate(gstate, batches) -> (stats, edge probs)` on the variables the
  algorithm evaluates; `linear`: of the model linearised around each client's point
  (no edge probabilities: the edge row is its loss). The edge probabilities come
  whatever `eval_edge_ods` says: one program serves the evaluations with odsF and
  those without (which fetch none), and every config sharing the experiment
  (`experiment.build` ignores `eval_edge_ods`)."""
  evs = [evaluation.make_group_evaluator(
      g, m, edge_probs=not linear, sal_metric=exp.config.get('sal_metric', 'maxF'),
      linear=linear, max_parallel=int(exp.config.get('max_parallel_clients', 0) or 0))
         for g, m in zip(exp.fed.groups, exp.models_eval)]
  if linear:
    return [lambda gs, b, ev=ev: ev(*rounds.eval_variables(exp, gs), b, gs.client['point'])
            for ev in evs]
  return [lambda gs, b, ev=ev: ev(*rounds.eval_variables(exp, gs), b) for ev in evs]


def make_eval_fn(exp: Experiment, linear: bool = False):
  """One jitted evaluation of every group on its (in-memory) test split."""
  evaluators = group_evaluators(exp, linear)

  def eval_fn(groups, test_batches):
    return [ev(gs, test_batches[spec.dataset])
            for ev, gs, spec in zip(evaluators, groups, exp.fed.groups)]

  return jax.jit(eval_fn)


def make_eval_batch_fns(exp: Experiment, linear: bool = False) -> dict:
  """Per dataset: jitted `(groups, batch, accs) -> (accs, edge probs)` over the groups
  on that dataset (a streamed test split)."""
  evaluators = group_evaluators(exp, linear)
  fns = {}
  for d in sorted({g.dataset for g in exp.fed.groups}):
    members = [i for i, g in enumerate(exp.fed.groups) if g.dataset == d]

    def eval_batch(groups, batch, accs, members=members):
      outs = [evaluators[i](groups[i], jax.tree.map(lambda x: x[None], batch))
              for i in members]
      stats, probs = [o[0] for o in outs], [o[1] for o in outs]
      return (stats if accs is None else jax.tree.map(jnp.add, accs, stats)), probs

    fns[d] = jax.jit(eval_batch)
  return fns


class Programs:
  """The jitted programs of an experiment, each built on first use and kept."""

  def __init__(self, exp: Experiment):
    self.exp = exp

  @functools.cached_property
  def train_fns(self) -> list:
    """Per group: one in-memory round of local training (`rounds.make_train_fns`)."""
    return rounds.make_train_fns(self.exp)

  @functools.cached_property
  def sampled_train_fns(self) -> list:
    """Per group: an in-memory round of some of its clients (`rounds.make_sampled_train_fns`)."""
    return rounds.make_sampled_train_fns(self.exp)

  @functools.cached_property
  def chunk_fns(self) -> list:
    """Per group: local training on one streamed chunk (`rounds.make_chunk_fns`)."""
    return rounds.make_chunk_fns(self.exp)

  @functools.cached_property
  def agg_fn(self):
    """The aggregation after in-memory training (`rounds.make_agg_fn`)."""
    return rounds.make_agg_fn(self.exp)

  @functools.cached_property
  def agg_fn_streamed(self):
    """The aggregation after streamed training (chunk accumulators)."""
    return rounds.make_agg_fn(self.exp, streamed=True)

  @functools.cached_property
  def begin(self):
    """The client part's `begin` on every client, or None (`rounds.make_begin`)."""
    return rounds.make_begin(self.exp)

  @functools.cached_property
  def round_start(self):
    """The round-start copy, or None (`rounds.make_round_start`)."""
    return rounds.make_round_start(self.exp)

  @functools.cached_property
  def stats_fn(self):
    """The batch-norm statistics' average, or None (`rounds.make_stats_fn`)."""
    return rounds.make_stats_fn(self.exp)

  @functools.cached_property
  def eval_fn(self):
    """The in-memory evaluation of every group."""
    return make_eval_fn(self.exp)

  @functools.cached_property
  def eval_fn_linear(self):
    """The in-memory evaluation of the linearised models (`evaluates_linear`)."""
    return make_eval_fn(self.exp, linear=True)

  @functools.cached_property
  def eval_batch_fns(self) -> dict:
    """Per dataset: the streamed evaluation's batch step."""
    return make_eval_batch_fns(self.exp)

  @functools.cached_property
  def eval_batch_fns_linear(self) -> dict:
    """Per dataset: the streamed evaluation's batch step of the linearised models."""
    return make_eval_batch_fns(self.exp, linear=True)

  @functools.cached_property
  def augmenters(self) -> list | None:
    """Per group: `device_augment.augment_chunk` keyed by (data.seed, client, epoch,
    position) like the host path (`data.augment='device'`), or None."""
    if sources.augment_mode(self.exp) != 'device':
      return None
    chunks = sources.device_chunks(self.exp)
    by_dataset = {d: device_augment.make_chunk_augmenter(
        device_augment.config_from_transforms(ts), chunks.seed, self.exp.client_sharding)
        for d, ts in chunks.transforms_of.items()}
    return [by_dataset[spec.dataset] for spec in chunks.specs]


programs = per_experiment(Programs)  # programs(exp): the experiment's Programs


def _score(members: list, scores: list, probs: list, gt) -> None:
  """Host-side odsF of one test batch for the groups `members` (`probs` per member)."""
  for i, p in zip(members, probs):
    if scores[i] is not None:
      scores[i].update(distributed.host_get(p)[0], gt)


class DenseEngine:
  """The dense setting's rounds, evaluation and records (the run loop in `train.py`
  drives it through the `engines.Engine` interface)."""

  def __init__(self, exp: Experiment, config=None):
    # `config`: the run's, when it differs from the experiment's in fields that do not
    # change what the rounds compute (`experiment.build` shares one experiment then).
    config = self.config = exp.config if config is None else config
    self.exp = exp
    self.programs = programs(self.exp)
    self.source = None
    self._ods_pool = None  # the odsF worker processes, started by the first odsF scoring
    self.label = f'{config.algorithm} {self.exp.fed.num_clients} clients'
    self.steps_per_round = sum(rounds.group_steps(self.exp))
    self.linear = evaluates_linear(self.exp)  # also evaluates the linearised models
    participation.check_supported(config, self.exp.fed.num_clients)
    self.sampler = participation.Sampler(config, self.exp.fed)
    # Every eval record of a unified-model run carries its A1 decision.
    mode = unified_mode(config)
    self.record = {} if mode == 'none' else {'unified': mode}

  # ---- state and data ---------------------------------------------------------------

  def open(self, start: int) -> None:
    """Open the data source for rounds after `start` (a missing cache fails here)."""
    self.close()
    self.source = sources.make_source(self.exp, start, self.config)

  def close(self) -> None:
    """Release the data source's workers and threads, and the odsF worker processes."""
    if self.source is not None:
      self.source.close()
      self.source = None
    if self._ods_pool is not None:
      self._ods_pool.close()
      self._ods_pool = None

  def abstract_state(self) -> FedState:
    """The round-0 state's shapes and shardings (what a checkpoint restores into)."""
    return experiment.init_state(self.exp, abstract=True)

  def init_state(self) -> FedState:
    """The round-0 state on the mesh."""
    return experiment.init_state(self.exp)

  def round0_programs(self) -> list[tuple[str, Any, tuple]]:
    """The init programs (`experiment.InitProgram.jobs`; none for a pretrained
    encoder: its states program takes the loaded weights)."""
    if self.config.model.get('pretrained_path'):
      return []
    return self.exp.init_program.jobs(jnp.asarray(self.config.seed, jnp.uint32))

  def programs_to_compile(self, state: FedState) -> list[tuple[str, Any, tuple]]:
    """(name, jitted, example args) of the programs a round and an evaluation call
    (`experiment.compile_programs`); `state` may be abstract. Streamed: the evaluation programs (the chunk trainers and the
    aggregation compile on their first call, while the host prepares chunks; a
    multi-process run compiles the aggregation here too: no process may reach its
    collectives while another still compiles it)."""
    exp, p = self.exp, self.programs
    params = [gs.params for gs in state.groups]
    start = rounds.abstract_round_start(exp, params)
    jobs = []
    if not self.source.streamed:
      metrics = []
      partial = self.sampler.partial
      fns = p.sampled_train_fns if partial else p.train_fns
      for g, (spec, fn) in enumerate(zip(exp.fed.groups, fns)):
        # A sampled group's program, for each number of participants it can get.
        for k in (self.sampler.options[g] if partial else (spec.num_real,)):
          args = (state.groups[g], start[g], self.source.train[spec.dataset]['train'],
                  state.round, state.rng, rounds.num_rounds(exp))
          if partial:
            args += (self.put_rows(np.arange(k, dtype=np.int32)),)
          if self.sampler.stragglers:
            args += (self.put_rows(np.ones(k if partial else spec.num_total, np.float32)),)
          jobs.append((f'train {spec.dataset} x{k}', fn, args))
        metrics.append(with_sharding(jax.eval_shape(fn, *args)[1], exp.client_sharding))
      valid = (self.put_rows(np.ones(exp.fed.num_clients, bool)),) if partial else ()
      jobs.append(('aggregate', p.agg_fn,
                   (rounds.agg_core(state), params, start, metrics, *valid)))
      jobs.append(('evaluate', p.eval_fn, (state.groups, self.source.test)))
    else:
      if jax.process_count() > 1:
        metrics = [with_sharding(zero_accs(g, g.num_total), exp.client_sharding)
                   for g in exp.fed.groups]
        valid = ((self.put_rows(np.ones(exp.fed.num_clients, bool)),)
                 if self.sampler.partial else ())
        jobs.append(('aggregate', p.agg_fn_streamed,
                     (rounds.agg_core(state), params, start, metrics, *valid)))
      for d, batches in self.source.eval_batches.items():
        batch = with_sharding(jax.eval_shape(lambda b=batches: b[0]), exp.replicated)
        accs = jax.eval_shape(p.eval_batch_fns[d], state.groups, batch, None)[0]
        jobs.append((f'evaluate {d}', p.eval_batch_fns[d],
                     (state.groups, batch, with_sharding(accs, exp.replicated))))
    return jobs

  def check_compiled(self, name: str, compiled: Any) -> None:
    """Nothing to check for one federation (`Engine.check_compiled`)."""

  # ---- a round ----------------------------------------------------------------------

  def run_round(self, state: FedState, rnd: int,
                progress: Callable[[int], None] | None = None) -> tuple[FedState, dict]:
    """Round `rnd` (1-based): local training and aggregation; (new state, device
    outputs: 'train' metrics, 'agg' logs, 'health' flags). `progress(steps)` is
    called as local steps of a client group finish (in memory: waiting for the
    group; streamed: when a chunk is dispatched, never waiting)."""
    if self.source.streamed:
      return self._streamed_round(rounds.begin_round(self.programs.begin, state), rnd,
                                  progress)
    s = self.sampler
    if not (s.partial or s.stragglers):
      return memory_round(self.exp, self.programs, state, self.source.train, progress)
    rows, fracs = s.rows(rnd), None
    if s.stragglers:  # the shares the streamed feed masks by, over the rows trained here
      shares = s.step_shares(rnd, rows)
      fracs = ([sh[r] for sh, r in zip(shares, rows)] if s.partial else
               [np.concatenate([sh, np.ones(g.num_pad, np.float32)])  # padding rows
                for sh, g in zip(shares, self.exp.fed.groups)])
    return memory_round(self.exp, self.programs, state, self.source.train, progress,
                        [self.put_rows(r) for r in rows] if s.partial else None,
                        self.put_rows(s.mask(rnd)) if s.partial else None,
                        None if fracs is None else [self.put_rows(f) for f in fracs])

  def put_rows(self, x: np.ndarray) -> jax.Array:
    """A host array of the round's participants, replicated over the mesh."""
    return distributed.put_replicated(x, self.exp.replicated)

  def _streamed_round(self, state: FedState, rnd: int, progress) -> tuple[FedState, dict]:
    """Chunks are dispatched asynchronously: the host prepares the next chunk while
    the device trains on the current one."""
    exp, p, source = self.exp, self.programs, self.source
    groups = list(state.groups)
    start = (copy_tree([gs.params for gs in groups]) if exp.start_axes is None
             else rounds.round_start(p.round_start, [gs.params for gs in groups]))
    accs = [distributed.put_local(zero_accs(g, r.stop - r.start), exp.client_sharding,
                                  g.num_total)
            for g, r in zip(exp.fed.groups, source.rows)]
    done = [0] * len(groups)  # steps dispatched per group
    for g, chunk in source.round_chunks(rnd):
      if p.augmenters is not None:
        chunk['x'] = p.augmenters[g](chunk['x'])
      groups[g], accs[g] = p.chunk_fns[g](groups[g], start[g], accs[g], chunk, state.rng,
                                          state.round, rounds.num_rounds(exp))
      if progress is not None:
        spec = source.train_chunks.specs[g]
        progress(min(spec.chunk_steps, spec.num_steps - done[g]))
        done[g] += spec.chunk_steps
    distributed.barrier(f'round {rnd} aggregation')  # every process dispatched its chunks
    valid = (self.put_rows(self.sampler.mask(rnd)) if self.sampler.partial else None)
    return rounds.aggregate(p.agg_fn_streamed, state.replace(groups=groups), start, accs,
                            p.stats_fn, valid)

  def divergence(self, rnd: int, out: dict) -> str | None:
    """One line naming what went non-finite in round `rnd` (`out`: the round's host
    outputs), or None (`divergence`)."""
    return divergence(self.exp, rnd, out['health'])

  def divergence_hint(self) -> str:
    """What to try when a round goes non-finite."""
    return 'lower optim.lr or check the data'

  def round_rows(self, rnd: int, out: dict, sampler=None) -> list[dict]:
    """The round's metrics.jsonl rows: a train row per (client, task), the agg row and
    the communication row (bytes per client, `fedjax_mtl.comm`). `sampler`: whose
    draws these are (a sweep's replica's; default the run's)."""
    rows = []
    took_part = (sampler or self.sampler).mask(rnd)
    for spec, m in zip(self.exp.fed.groups, out['train']):
      for j, cid in enumerate(spec.client_ids):
        c = self.exp.fed.clients[cid]
        if not took_part[cid]:
          continue  # a client that sat the round out trained nothing
        for s, t in enumerate(c.tasks):
          rows.append({'round': rnd, 'type': 'train', 'client': c.name, 'dataset': c.dataset,
                       'task': t, 'loss': float(m['loss'][j, s]), 'steps': int(m['steps'][j])})
    if out['agg']:
      rows.append({'round': rnd, 'type': 'agg',
                   **{k: np.asarray(v).tolist() for k, v in out['agg'].items()},
                   **self.privacy_row(rnd)})
    rows.append(self.account.row(rnd, took_part))
    return rows

  @functools.cached_property
  def epsilons(self) -> list[float] | None:
    """ε after each round of a `dp(...)` run (`dp.run_epsilons`), else None."""
    return dp.run_epsilons(self.config, self.sampler.rate())

  def privacy_row(self, rnd: int) -> dict:
    """The privacy spent after round `rnd` ({'dp_epsilon', 'dp_delta'}; {} without DP)."""
    return dp.privacy_row(self.config, self.epsilons, rnd)

  @functools.cached_property
  def account(self) -> comm.Account:
    """The bytes each client sends and receives a round (`fedjax_mtl.comm`)."""
    return comm.account(self.exp, self.config)

  def meta_rows(self) -> list[dict]:
    """Round-0 row naming the clients, decoders and decoder layers (for plots)."""
    return [{'round': 0, 'type': 'meta', 'clients': [c.name for c in self.exp.fed.clients],
             'decoders': list(self.exp.fed.decoder_names),
             'decoder_layers': list(DECODER_LAYERS)}]

  # ---- evaluation -------------------------------------------------------------------

  def evaluate(self, state: FedState, rnd: int) -> list[dict]:
    """The eval rows of round `rnd`: (client, task, metric, value) of the models the
    clients evaluate, and with `evaluates_linear` the linear models' ('eval_linear'
    rows: NTKFedAvg's evaluation B, beside the model itself, A). Edge clients: odsF
    or the test loss as `eval_edge_ods` says for round `rnd`."""
    rows = [{'round': rnd, 'type': 'eval', **r, **self.record}
            for r in self.metric_rows(state, rnd=rnd)]
    if self.linear:
      rows += [{'round': rnd, 'type': 'eval_linear', **r, **self.record}
               for r in self.metric_rows(state, linear=True)]
    return rows

  def metric_rows(self, state: FedState, linear: bool = False,
                  rnd: int | None = None) -> list[dict]:
    """Metrics rows (client, task, metric, value): one pass over each test split; an
    edge client's test loss is replaced by its odsF (host-side matching of the same
    pass's edge maps) when `eval_edge_ods` scores round `rnd` (None: a state after
    the rounds, scored as the final round's). `linear`: of the linear models (edge as
    its loss)."""
    return self.rows_of(*self.eval_outputs(state, linear, rnd))

  def rows_of(self, stats: list, edges: list) -> list[dict]:
    """Metrics rows from `eval_outputs`' pooled statistics and odsF rows."""
    rows = []
    for spec, st, ods in zip(self.exp.fed.groups, stats, edges):
      group_rows = evaluation.finalize_group(spec, st, self.exp.fed.clients)
      if ods is not None:
        by_client = {r['client']: r for r in ods}
        group_rows = [by_client.get(r['client'], r) if r['task'] == 'edge' else r
                      for r in group_rows]
      rows += group_rows
    return rows

  def _ods_workers(self):
    """The odsF worker processes (`eval_ods_workers`, started on first use and kept
    until `close`), or None to score in this process (one worker)."""
    if self._ods_pool is None:
      from fedjax_mtl.metrics import edge
      workers = int(self.config.get('eval_ods_workers', 0)) or edge.host_cores()
      if workers > 1:
        self._ods_pool = edge.CountsPool(workers)
    return self._ods_pool

  def _edge_scores(self, rnd: int | None = None) -> list:
    """Per group: a fresh `evaluation.EdgeScores`, or None (no edge client, or no odsF
    in round `rnd`: `evaluation.scores_edge_ods`)."""
    ods = evaluation.scores_edge_ods(self.config, rnd)
    return [evaluation.EdgeScores(g, self.exp.fed.clients, self._ods_workers())
            if ods and evaluation.edge_holders(g) else None
            for g in self.exp.fed.groups]

  def eval_outputs(self, state: FedState, linear: bool = False,
                   rnd: int | None = None) -> tuple[list, list]:
    """One pass over every test split: per group, the pooled test statistics (host
    arrays) and the edge clients' odsF rows (None without edge clients or without
    odsF in round `rnd`, `metric_rows`), both from the same forward passes. `linear`:
    of the linearised models (`evaluates_linear`), without odsF. The host scores the
    edge maps in `eval_ods_workers` processes while the device runs on."""
    if self.source.streamed:
      return self._streamed_eval(state, linear, rnd)
    p = self.programs
    out = (p.eval_fn_linear if linear else p.eval_fn)(state.groups, self.source.test)
    return self.score_outputs(out, linear, rnd)

  def score_outputs(self, out: list, linear: bool = False,
                    rnd: int | None = None) -> tuple[list, list]:
    """`eval_outputs` from the in-memory evaluation program's outputs `out` (per group:
    test statistics, edge probabilities)."""
    edge_scores = [None] * len(out) if linear else self._edge_scores(rnd)
    # The edge probabilities only come to the host for odsF.
    out = distributed.host_get([(st, None if scores is None else probs)
                                for (st, probs), scores in zip(out, edge_scores)])
    stats, edges = [o[0] for o in out], []
    b = self.config.eval_batch_size
    for (_, probs), spec, scores in zip(out, self.exp.fed.groups, edge_scores):
      if scores is not None:
        gt = self.source.edge_truth(spec.dataset)
        for i, lo in enumerate(range(0, len(gt), b)):
          scores.update(probs[i][:, :len(gt[lo:lo + b])], gt[lo:lo + b])
        scores = scores.rows()
      edges.append(scores)
    return stats, edges

  def _streamed_eval(self, state: FedState, linear: bool,
                     rnd: int | None = None) -> tuple[list, list]:
    """Streams each test split once: the device accumulates the statistics and
    returns the edge probabilities of each batch, which the host scores (odsF)
    while the device runs the next batch."""
    exp = self.exp
    stats = [None] * len(exp.fed.groups)
    scores = [None] * len(exp.fed.groups) if linear else self._edge_scores(rnd)
    fns = self.programs.eval_batch_fns_linear if linear else self.programs.eval_batch_fns
    for d in self.source.eval_batches:
      members = [i for i, g in enumerate(exp.fed.groups) if g.dataset == d]
      accs, pending = None, None
      for batch in self.source.test_batches(d):
        gt = batch.get('edge')
        batch = distributed.put_replicated(batch, exp.replicated)
        if accs is None:  # zeros of the statistics' shapes: one compiled function
          shapes = jax.eval_shape(fns[d], state.groups, batch, None)[0]
          accs = distributed.put_replicated(
              jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), shapes), exp.replicated)
        accs, probs = fns[d](state.groups, batch, accs)
        if pending is not None:
          _score(members, scores, *pending)
        pending = (probs, gt)
      if pending is not None:
        _score(members, scores, *pending)
      for i, st in zip(members, distributed.host_get(accs)):
        stats[i] = st
    return stats, [None if s is None else s.rows() for s in scores]

  # ---- records ----------------------------------------------------------------------

  def eval_summary(self, eval_rows: list[dict]) -> str:
    """The progress line's evaluation part: each (dataset, task, metric)'s mean."""
    by = {}
    for r in eval_rows:
      if r['type'] == 'eval':
        by.setdefault((r['dataset'], r['task'], r['metric']), []).append(r['value'])
    return ' '.join(f'{d}/{t} {m} {np.mean(v):.2f}' for (d, t, m), v in by.items())

  def write_reports(self, rows: list[dict], final: list[dict], workdir: str) -> None:
    """curves.png, the hyper-weight plots and results.md / results.csv (with Δm against
    `delta_m_reference`'s final evaluation when set; results.md also sums the bytes
    sent and received, `comm.summary`)."""
    report.plot_metric_curves(rows, workdir)
    report.plot_hyperweights(rows, workdir)
    ref_dir = self.config.get('delta_m_reference', '')
    ref = report.final_eval_rows(os.path.join(ref_dir, 'metrics.jsonl')) if ref_dir else None
    md, csv_text = report.results_table(method_label(self.config), final, ref)
    traffic = comm.totals(rows)
    if traffic is not None:
      md += '\n' + comm.summary(traffic) + '\n'
    spent = [r for r in rows if r.get('type') == 'agg' and 'dp_epsilon' in r]
    if spent:
      cfg = dp.DP.of(self.config)
      eps = spent[-1]['dp_epsilon']  # JSON null: ∞ (no noise)
      eps = '∞' if eps is None or not np.isfinite(eps) else f'{eps:.3g}'
      md += (f"\nPrivacy: (ε, δ) = ({eps}, {spent[-1]['dp_delta']:g}) "
             f"after {spent[-1]['round']} rounds (client level; σ = {cfg.noise_multiplier:g}, "
             f"C = {cfg.clip_norm:g}, noise '{cfg.noise}'; RDP accountant).\n")
    report.atomic_write(os.path.join(workdir, 'results.md'), md)
    report.atomic_write(os.path.join(workdir, 'results.csv'), csv_text)


def memory_round(exp: Experiment, p, state: FedState, train: dict,
                 progress: Callable[[int], None] | None = None, rows: list | None = None,
                 valid: jax.Array | None = None,
                 fracs: list | None = None) -> tuple[FedState, dict]:
  """A round on device-resident data (`train`: the source's arrays per dataset) with the
  programs `p` (`begin`, `round_start`, `train_fns`, `agg_fn`, `stats_fn`: `Programs`,
  or a sweep's with their values bound, `engines.replicas`). `rows` (per group, the
  participating rows) and `valid` ([N] bool): a round of some clients only
  (`participation`), through `p.sampled_train_fns`; `fracs` (per group, over the rows
  it trains): the share of their local steps stragglers complete."""
  state = rounds.begin_round(p.begin, state)
  start = rounds.round_start(p.round_start, [gs.params for gs in state.groups])
  groups, metrics = [], []
  steps = rounds.group_steps(exp)
  fns = p.train_fns if rows is None else p.sampled_train_fns
  for g, (spec, fn) in enumerate(zip(exp.fed.groups, fns)):
    if rows is not None and rows[g].shape[0] == 0:  # no participant in this group
      groups.append(state.groups[g])
      metrics.append(jax.device_put(zero_metrics(spec), exp.client_sharding))
      continue
    extra = (() if rows is None else (rows[g],)) + (() if fracs is None else (fracs[g],))
    gs, m = fn(state.groups[g], start[g], train[spec.dataset]['train'], state.round,
               state.rng, rounds.num_rounds(exp), *extra)
    groups.append(gs)
    metrics.append(m)
    if progress is not None:
      jax.block_until_ready(m['steps'])  # one wait per group, only to report truthfully
      progress(steps[g])
  return rounds.aggregate(p.agg_fn, state.replace(groups=groups), start, metrics, p.stats_fn,
                         valid)


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


def method_label(config) -> str:
  """The method's name in result tables: the algorithm, and FedDEA's unified-model
  decision (spec feddea §6 A1) when the run uses one."""
  mode = unified_mode(config)
  return config.algorithm if mode == 'none' else f'{config.algorithm} [unified={mode}]'
