"""Data feeds: where a round's training data and the test batches come from.

A feed runs the local-training + aggregation part of a round and computes the
pooled test statistics of every group; the round loop (`train.py`) does not
know which feed it drives:

- `InMemoryFeed` (synthetic data): train and test arrays live on device; one
  jitted call per client group trains it for the round, one jitted call
  aggregates (`rounds.run_round`); evaluation is one jitted call.
- `StreamedFeed` (real data): augmented batches stream from a grain pipeline
  as chunks of local steps of a client group (one jitted, vmapped, scanned call
  per chunk, dispatched asynchronously), then one jitted call aggregates; the
  test split streams through a jitted accumulation.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl import distributed, evaluate, rounds
from fedjax_mtl import tasks as tasks_lib
from fedjax_mtl.data import device_augment, real
from fedjax_mtl.errors import check_choice
from fedjax_mtl.experiment import Experiment
from fedjax_mtl.state import FedState

PyTree = Any


class Feed(Protocol):
  """What the round loop needs from a data source."""

  def run_round(self, state: FedState, rnd: int,
                progress: Callable[[int], None] | None = None) -> tuple[FedState, dict]:
    """Round `rnd` (1-based): local training and aggregation; (new state, device outputs).
    `progress(steps)` is called as local steps of a client group finish."""

  def eval_outputs(self, state: FedState, linear: bool = False) -> tuple[list, list]:
    """One pass over every test split: per group, the pooled test statistics (host
    arrays) and the edge clients' odsF rows (None without edge clients or with
    `eval_edge_ods` off), both from the same forward passes. `linear`: of the
    linearised models (`evaluates_linear`), without odsF."""

  def programs(self, state: FedState) -> list[tuple[str, Any, tuple]]:
    """(name, jitted, example args) of the programs to compile before the first
    round (`experiment.compile_programs`); `state` may be abstract."""

  def close(self) -> None:
    """Release workers and threads."""


def _edge_ods(exp: Experiment) -> bool:
  return bool(exp.config.get('eval_edge_ods', True))


def evaluates_linear(exp: Experiment) -> bool:
  """Whether the run also evaluates the linear model its clients trained in (NTKFedAvg's
  evaluation B in the dense engine: a linearised forward whose client part keeps the
  round's point, `{'point': backbone}`)."""
  from fedjax_mtl.algorithms.base import linearized_forward
  c = exp.algorithm.client
  return c.forward is linearized_forward and c.frozen_stats


def _group_evaluators(exp: Experiment, linear: bool = False) -> list:
  """Per group: `evaluate(gstate, batches) -> (stats, edge probs)` on the variables the
  algorithm evaluates; `linear`: of the model linearised around each client's point
  (no edge probabilities: the edge row is its loss)."""
  evs = [evaluate.make_group_evaluator(g, m, edge_probs=_edge_ods(exp) and not linear,
                                       sal_metric=exp.config.get('sal_metric', 'maxF'),
                                       linear=linear)
         for g, m in zip(exp.fed.groups, exp.models_eval)]
  if linear:
    return [lambda gs, b, ev=ev: ev(*rounds.eval_variables(exp, gs), b, gs.client['point'])
            for ev in evs]
  return [lambda gs, b, ev=ev: ev(*rounds.eval_variables(exp, gs), b) for ev in evs]


def _edge_scores(exp: Experiment) -> list:
  """Per group: a fresh `evaluate.EdgeScores`, or None (no edge client, or odsF off)."""
  return [evaluate.EdgeScores(g, exp.fed.clients)
          if _edge_ods(exp) and evaluate.edge_holders(g) else None for g in exp.fed.groups]


class InMemoryFeed:
  """Synthetic data on device; one compiled round, one compiled evaluation."""

  def __init__(self, exp: Experiment):
    self.exp = exp
    self.train_data, self.test_data = device_data(exp)
    self.train_fns = _compiled(exp, 'train_fns', lambda: rounds.make_train_fns(exp))
    self.agg_fn = _compiled(exp, 'agg_fn', lambda: rounds.make_agg_fn(exp))
    self.eval_fn = _compiled(exp, 'eval_fn', lambda: _make_eval_fn(exp))

  def run_round(self, state, rnd, progress=None):
    return rounds.run_round(self.exp, self.train_fns, self.agg_fn, state, self.train_data,
                            progress)

  def programs(self, state: FedState) -> list[tuple[str, Any, tuple]]:
    """(name, jitted, args) of every program a round and an evaluation call, for
    `experiment.compile_programs`; `state` may be abstract (`init_state(abstract=True)`)."""
    exp, jobs, metrics = self.exp, [], []
    params = [gs.params for gs in state.groups]
    start = rounds.abstract_round_start(exp, params)
    for g, (spec, fn) in enumerate(zip(exp.fed.groups, self.train_fns)):
      args = (state.groups[g], start[g], self.train_data[spec.dataset]['train'], state.round,
              state.rng, rounds.num_rounds(exp))
      jobs.append((f'train {spec.dataset} x{spec.num_real}', fn, args))
      metrics.append(with_sharding(jax.eval_shape(fn, *args)[1], exp.client_sharding))
    jobs.append(('aggregate', self.agg_fn, (rounds.agg_core(state), params, start, metrics)))
    jobs.append(('evaluate', self.eval_fn, (state.groups, self.test_data)))
    return jobs

  def eval_outputs(self, state, linear: bool = False):
    fn = (_compiled(self.exp, 'eval_fn_linear', lambda: _make_eval_fn(self.exp, True))
          if linear else self.eval_fn)
    out = distributed.host_get(fn(state.groups, self.test_data))
    stats, edges = [o[0] for o in out], []
    b = self.exp.config.eval_batch_size
    edge_scores = [None] * len(out) if linear else _edge_scores(self.exp)
    for (_, probs), spec, scores in zip(out, self.exp.fed.groups, edge_scores):
      if scores is not None:
        gt = self.exp.data[spec.dataset]['test']['edge']
        for i, lo in enumerate(range(0, len(gt), b)):
          scores.update(probs[i][:, :len(gt[lo:lo + b])], gt[lo:lo + b])
        scores = scores.rows()
      edges.append(scores)
    return stats, edges

  def close(self):
    pass


def with_sharding(tree: PyTree, sharding) -> PyTree:
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def _compiled(exp: Experiment, name: str, make):
  """Per-experiment cache of jitted functions (shared by every run of one config)."""
  if name not in exp.compiled:
    exp.compiled[name] = make()
  return exp.compiled[name]


def _make_eval_fn(exp: Experiment, linear: bool = False):
  """One jitted evaluation of every group on its test split."""
  evaluators = _group_evaluators(exp, linear)

  def eval_fn(groups, test_batches):
    return [ev(gs, test_batches[spec.dataset])
            for ev, gs, spec in zip(evaluators, groups, exp.fed.groups)]

  return jax.jit(eval_fn)


def device_data(exp: Experiment):
  """Train arrays and batched test arrays on device (replicated over the mesh)."""
  train = {d: {'train': v['train']} for d, v in exp.data.items()}
  test = {d: evaluate.batch_test_split(v['test'], exp.config.eval_batch_size)
          for d, v in exp.data.items()}
  return (distributed.put_replicated(train, exp.replicated),
          distributed.put_replicated(test, exp.replicated))


copy_tree = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))


class StreamedFeed:
  """Real data streamed from grain: chunked local training, streamed evaluation."""

  def __init__(self, exp: Experiment, start_round: int = 0):
    self.exp = exp
    cfg = exp.config
    self.threads = int(cfg.data.get('threads', 2))
    self.train_chunks, self.eval_batches = _streamed_sources(exp)
    # data.augment='device': raw chunks, augmented on device before each chunk step.
    self.train_chunks, self.augment_fns = _device_augmentation(exp, self.train_chunks)
    self.chunk_fns = _compiled(exp, 'chunk_fns', lambda: rounds.make_chunk_fns(exp))
    self.agg_fn = _compiled(exp, 'agg_fn_streamed',
                            lambda: rounds.make_agg_fn(exp, streamed=True))
    self.eval_batch_fns = _compiled(exp, 'eval_batch_fns', lambda: _make_eval_batch_fns(exp))
    self._feed = None
    self._start = start_round

  def programs(self, state):
    """The evaluation programs (`experiment.compile_programs`); the chunk trainers and
    the aggregation compile on their first call, while the host prepares chunks. A
    multi-process run compiles the aggregation here too: no process may reach its
    collectives while another still compiles it (`distributed.barrier`)."""
    exp = self.exp
    jobs = []
    if jax.process_count() > 1:
      params = [gs.params for gs in state.groups]
      metrics = [with_sharding(zero_accs(g, g.num_total), exp.client_sharding)
                 for g in exp.fed.groups]
      jobs.append(('aggregate', self.agg_fn, (rounds.agg_core(state), params,
                                              rounds.abstract_round_start(exp, params), metrics)))
    for d, source in self.eval_batches.items():
      batch = with_sharding(jax.eval_shape(lambda: source[0]), exp.replicated)
      accs = jax.eval_shape(self.eval_batch_fns[d], state.groups, batch, None)[0]
      jobs.append((f'evaluate {d}', self.eval_batch_fns[d],
                   (state.groups, batch, with_sharding(accs, exp.replicated))))
    return jobs

  def _iter(self):
    if self._feed is None:
      self._feed = real.iterate(self.train_chunks, self.train_chunks.offset(self._start),
                                workers=int(self.exp.config.data.get('workers', 0)),
                                threads=self.threads)
    return self._feed

  def _chunk_arrays(self, element: dict) -> dict:
    """A fed chunk on device: client axes sharded over the mesh (from this process's
    rows of them, `TrainChunks.rows`)."""
    shard, rep = self.exp.client_sharding, self.exp.replicated
    n = self.exp.fed.groups[int(element['group'])].num_total
    c = chunk_arrays(element)
    return {'x': distributed.put_local(c['x'], shard, n),
            'mask': distributed.put_local(c['mask'], shard, n),
            'epoch': distributed.put_replicated(c['epoch'], rep),
            'step': distributed.put_replicated(c['step'], rep)}

  def run_round(self, state, rnd, progress=None):
    """Chunks are dispatched asynchronously: the host prepares the next chunk
    while the device trains on the current one (`progress` counts a chunk's
    steps when it is dispatched, so that it never waits for the device)."""
    feed = self._iter()
    state = rounds.begin_round(self.exp, state)
    groups = list(state.groups)
    start = (copy_tree([gs.params for gs in groups]) if self.exp.start_axes is None
             else rounds.round_start(self.exp, [gs.params for gs in groups]))
    accs = [distributed.put_local(zero_accs(g, r.stop - r.start), self.exp.client_sharding,
                                  g.num_total)
            for g, r in zip(self.exp.fed.groups, self.train_chunks.rows)]
    done = [0] * len(groups)  # steps dispatched per group
    for _ in range(self.train_chunks.per_round):
      el = next(feed)
      if int(el['round']) != rnd - 1:
        raise RuntimeError(f'data feed out of step: chunk of round {int(el["round"]) + 1} '
                           f'in round {rnd}')
      g = int(el['group'])
      chunk = self._chunk_arrays(el)
      if self.augment_fns is not None:
        chunk['x'] = self.augment_fns[g](chunk['x'])
      groups[g], accs[g] = self.chunk_fns[g](groups[g], start[g], accs[g],
                                             chunk, state.rng, state.round,
                                             rounds.num_rounds(self.exp))
      if progress is not None:
        spec = self.train_chunks.specs[g]
        progress(min(spec.chunk_steps, spec.num_steps - done[g]))
        done[g] += spec.chunk_steps
    distributed.barrier(f'round {rnd} aggregation')  # every process dispatched its chunks
    return rounds.aggregate(self.agg_fn, state.replace(groups=groups), start, accs,
                            rounds.stats_program(self.exp))

  def eval_outputs(self, state, linear: bool = False):
    """Streams each test split once: the device accumulates the statistics and
    returns the edge probabilities of each batch, which the host scores (odsF)
    while the device runs the next batch."""
    exp = self.exp
    stats = [None] * len(exp.fed.groups)
    scores = [None] * len(exp.fed.groups) if linear else _edge_scores(exp)
    fns = (_compiled(exp, 'eval_batch_fns_linear', lambda: _make_eval_batch_fns(exp, True))
           if linear else self.eval_batch_fns)
    for d, source in self.eval_batches.items():
      members = [i for i, g in enumerate(exp.fed.groups) if g.dataset == d]
      accs, pending = None, None
      for batch in real.iterate(source, threads=self.threads):
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

  def close(self):
    if self._feed is not None:
      self._feed.close()  # stops grain workers


def zero_accs(g, n: int) -> dict:
  """A group's training statistics, zero, for `n` of its clients (host arrays)."""
  return {'loss_sum': np.zeros((n, g.num_slots), np.float32), 'steps': np.zeros((n,), np.int32),
          'first_loss': np.zeros((n,), np.float32), 'last_loss': np.zeros((n,), np.float32)}


def _streamed_sources(exp: Experiment) -> tuple[real.TrainChunks, dict]:
  """The run's training chunk source and per-dataset test batch sources."""
  cfg, fed = exp.config, exp.fed
  if 'sources' in exp.compiled:
    return exp.compiled['sources']
  size_of = sizes(exp)
  specs = [group_feed_spec(exp, g) for g in fed.groups]
  sources = [[real.client_source(cfg, fed.clients[c]) for c in g.client_ids] for g in fed.groups]
  # A multi-process run reads only the clients on this process's devices.
  rows = [distributed.local_rows(exp.client_sharding, g.num_total) for g in fed.groups]
  chunks = real.TrainChunks(specs, sources, cfg.num_rounds, size_of, int(cfg.data.seed),
                            train_transforms(exp), rows=rows)
  eval_batches = {}
  for d in sorted({g.dataset for g in fed.groups}):
    keys = tuple(t for t in tasks_lib.DATASETS[d].tasks
                 if any(t in g.tasks_used for g in fed.groups if g.dataset == d))
    eval_batches[d] = eval_source(exp, d, keys)
  exp.compiled['sources'] = (chunks, eval_batches)
  return chunks, eval_batches


def sizes(exp: Experiment) -> dict[str, tuple[int, int]]:
  """(height, width) the run trains and evaluates each dataset at."""
  res = exp.config.data.resolution
  return {d: tuple(int(v) for v in res[d]) for d in res}


def train_transforms(exp: Experiment) -> dict[str, list]:
  """The training augmentation of each dataset."""
  return {d: real.T.train_transforms(size) for d, size in sizes(exp).items()}


def group_feed_spec(exp: Experiment, g) -> real.GroupFeedSpec:
  """The streamed plan of client group `g`'s local steps (chunks of its round)."""
  cfg, fed = exp.config, exp.fed
  chunk_steps = int(cfg.data.get('chunk_steps', 2))
  return real.GroupFeedSpec(
      dataset=g.dataset, client_ids=g.client_ids, num_total=g.num_total,
      counts=tuple(fed.clients[c].num_train for c in g.client_ids), epochs=g.local_epochs,
      batch_size=cfg.batch_size,
      chunk_steps=min(chunk_steps, g.local_epochs * (max(g.counts) // cfg.batch_size)),
      keys=g.tasks_used)


def eval_source(exp: Experiment, dataset: str, keys: tuple[str, ...]) -> real.EvalBatches:
  """`dataset`'s test split as evaluation batches with the labels `keys`."""
  cfg = exp.config
  test = real.open_split(cfg, dataset, real.TEST_SPLIT, tasks=keys)
  real.check_eval_sizes(cfg, dataset, test)
  return real.EvalBatches(test, cfg.eval_batch_size, sizes(exp)[dataset], keys)


def chunk_arrays(element: dict) -> dict:
  """A `real.TrainChunks` element as the chunk trainers take it (host arrays)."""
  return {'x': {k[2:]: v for k, v in element.items() if k.startswith('x/')},
          'mask': element['mask'], 'epoch': element['epoch'], 'step': element['step']}


def _score(members: list, scores: list, probs: list, gt) -> None:
  """Host-side odsF of one test batch for the groups `members` (`probs` per member)."""
  for i, p in zip(members, probs):
    if scores[i] is not None:
      scores[i].update(distributed.host_get(p)[0], gt)


def _device_augmentation(exp: Experiment, chunks: real.TrainChunks) -> tuple:
  """(chunk source, per-group augmenters or None) for `data.augment` ('host' | 'device').

  'device': the same chunks with raw samples in canvases of the datasets'
  largest images, and per group the jitted `device_augment.augment_chunk`
  keyed by (data.seed, client, epoch, position) like the host path.
  """
  mode = exp.config.data.get('augment', 'host')
  check_choice('data.augment', mode, real.AUGMENT_MODES)
  if mode == 'host':
    return chunks, None

  def make():
    raw = real.TrainChunks(chunks.specs, chunks.sources, chunks.num_rounds, chunks.size_of,
                           chunks.seed, chunks.transforms_of, augment='device', rows=chunks.rows)
    by_dataset = {d: device_augment.make_chunk_augmenter(
        device_augment.config_from_transforms(ts), chunks.seed, exp.client_sharding)
        for d, ts in chunks.transforms_of.items()}
    return raw, [by_dataset[spec.dataset] for spec in raw.specs]

  return _compiled(exp, 'device_augment', make)


def _make_eval_batch_fns(exp: Experiment, linear: bool = False) -> dict:
  """Per dataset: jitted `(groups, batch, accs) -> (accs, edge probs)` over the groups
  on that dataset."""
  evaluators = _group_evaluators(exp, linear)
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


def make_feed(exp: Experiment, start_round: int = 0) -> Feed:
  """The feed of the experiment's data source."""
  return StreamedFeed(exp, start_round) if exp.streamed else InMemoryFeed(exp)
