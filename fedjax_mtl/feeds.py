"""Data feeds: where a round's training data and the test batches come from.

A feed runs the local-training + aggregation part of a round and computes the
pooled test statistics of every group; the round loop (`train.py`) does not
know which feed it drives:

- `InMemoryFeed` (synthetic data): train and test arrays live on device; one
  jitted function runs a whole round; evaluation is one jitted call.
- `StreamedFeed` (real data): augmented batches stream from a grain pipeline
  as chunks of local steps of a client group (one jitted, vmapped, scanned call
  per chunk, dispatched asynchronously), then one jitted call aggregates; the
  test split streams through a jitted accumulation.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol

import jax
import jax.numpy as jnp

from fedjax_mtl import evaluate, rounds
from fedjax_mtl import tasks as tasks_lib
from fedjax_mtl.data import real
from fedjax_mtl.experiment import Experiment
from fedjax_mtl.state import FedState

PyTree = Any


class Feed(Protocol):
  """What the round loop needs from a data source."""

  def run_round(self, state: FedState, rnd: int) -> tuple[FedState, dict]:
    """Round `rnd` (1-based): local training and aggregation; (new state, device outputs)."""

  def eval_stats(self, state: FedState) -> list:
    """Pooled test statistics of every group (host arrays)."""

  def test_batches(self, dataset: str) -> Iterator[dict]:
    """Test batches of `dataset` (for host-side metrics such as odsF)."""

  def close(self) -> None:
    """Release workers and threads."""


def _group_evaluators(exp: Experiment) -> list:
  """Per group: `evaluate(gstate, batches) -> stats` on the variables the algorithm evaluates."""
  evs = [evaluate.make_group_evaluator(g, m) for g, m in zip(exp.fed.groups, exp.models_eval)]
  return [lambda gs, b, ev=ev: ev(*rounds.eval_variables(exp, gs), b) for ev in evs]


class InMemoryFeed:
  """Synthetic data on device; one compiled round, one compiled evaluation."""

  def __init__(self, exp: Experiment):
    self.exp = exp
    self.train_data, self.test_data = device_data(exp)
    self.round_fn = _compiled(exp, 'round_fn', lambda: rounds.make_round_fn(exp))
    self.eval_fn = _compiled(exp, 'eval_fn', lambda: _make_eval_fn(exp))

  def run_round(self, state, rnd):
    return self.round_fn(state, self.train_data)

  def eval_stats(self, state):
    return jax.device_get(self.eval_fn(state.groups, self.test_data))

  def test_batches(self, dataset):
    split, b = self.exp.data[dataset]['test'], self.exp.config.eval_batch_size
    for lo in range(0, len(split['image']), b):
      yield {k: split[k][lo:lo + b] for k in ('image', 'edge')}

  def close(self):
    pass


def _compiled(exp: Experiment, name: str, make):
  """Per-experiment cache of jitted functions (shared by every run of one config)."""
  if name not in exp.compiled:
    exp.compiled[name] = make()
  return exp.compiled[name]


def _make_eval_fn(exp: Experiment):
  """One jitted evaluation of every group on its test split."""
  evaluators = _group_evaluators(exp)

  def eval_fn(groups, test_batches):
    return [ev(gs, test_batches[spec.dataset])
            for ev, gs, spec in zip(evaluators, groups, exp.fed.groups)]

  return jax.jit(eval_fn)


def device_data(exp: Experiment):
  """Train arrays and batched test arrays on device (replicated over the mesh)."""
  train = {d: {'train': v['train']} for d, v in exp.data.items()}
  test = {d: evaluate.batch_test_split(v['test'], exp.config.eval_batch_size)
          for d, v in exp.data.items()}
  return jax.device_put(train, exp.replicated), jax.device_put(test, exp.replicated)


_copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))


class StreamedFeed:
  """Real data streamed from grain: chunked local training, streamed evaluation."""

  def __init__(self, exp: Experiment, start_round: int = 0):
    self.exp = exp
    cfg = exp.config
    self.threads = int(cfg.data.get('threads', 2))
    self.train_chunks, self.eval_batches = _streamed_sources(exp)
    self.chunk_fns = _compiled(exp, 'chunk_fns', lambda: rounds.make_chunk_fns(exp))
    self.agg_fn = _compiled(exp, 'agg_fn', lambda: rounds.make_agg_fn(exp))
    self.eval_batch_fns = _compiled(exp, 'eval_batch_fns', lambda: _make_eval_batch_fns(exp))
    self._feed = None
    self._start = start_round

  def _iter(self):
    if self._feed is None:
      self._feed = real.iterate(self.train_chunks, self.train_chunks.offset(self._start),
                                workers=int(self.exp.config.data.get('workers', 0)),
                                threads=self.threads)
    return self._feed

  def _chunk_arrays(self, element: dict) -> dict:
    """A fed chunk on device: client axes sharded over the mesh."""
    shard, rep = self.exp.client_sharding, self.exp.replicated
    x = {k[2:]: v for k, v in element.items() if k.startswith('x/')}
    return {'x': jax.device_put(x, shard), 'mask': jax.device_put(element['mask'], shard),
            'epoch': jax.device_put(element['epoch'], rep),
            'step': jax.device_put(element['step'], rep)}

  def run_round(self, state, rnd):
    """Chunks are dispatched asynchronously: the host prepares the next chunk
    while the device trains on the current one."""
    feed = self._iter()
    groups = list(state.groups)
    start = _copy([gs.params for gs in groups])
    accs = [{'loss_sum': jnp.zeros((g.num_total, g.num_slots), jnp.float32),
             'steps': jnp.zeros((g.num_total,), jnp.int32)} for g in self.exp.fed.groups]
    accs = jax.device_put(accs, self.exp.client_sharding)
    for _ in range(self.train_chunks.per_round):
      el = next(feed)
      if int(el['round']) != rnd - 1:
        raise RuntimeError(f'data feed out of step: chunk of round {int(el["round"]) + 1} '
                           f'in round {rnd}')
      g = int(el['group'])
      groups[g], accs[g] = self.chunk_fns[g](groups[g], start[g], accs[g],
                                             self._chunk_arrays(el), state.rng, state.round)
    return self.agg_fn(state.replace(groups=groups), start, accs)

  def eval_stats(self, state):
    """Pooled test statistics of every group, streaming each test split once."""
    exp = self.exp
    stats = [None] * len(exp.fed.groups)
    for d, source in self.eval_batches.items():
      members = [i for i, g in enumerate(exp.fed.groups) if g.dataset == d]
      accs = None
      for batch in real.iterate(source, threads=self.threads):
        batch = jax.device_put(batch, exp.replicated)
        if accs is None:  # zeros of the statistics' shapes: one compiled function
          shapes = jax.eval_shape(self.eval_batch_fns[d], state.groups, batch, None)
          accs = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
        accs = self.eval_batch_fns[d](state.groups, batch, accs)
      for i, st in zip(members, jax.device_get(accs)):
        stats[i] = st
    return stats

  def test_batches(self, dataset):
    yield from real.iterate(self.eval_batches[dataset], threads=self.threads)

  def close(self):
    if self._feed is not None:
      self._feed.close()  # stops grain workers


def _streamed_sources(exp: Experiment) -> tuple[real.TrainChunks, dict]:
  """The run's training chunk source and per-dataset test batch sources."""
  cfg, fed = exp.config, exp.fed
  if 'sources' in exp.compiled:
    return exp.compiled['sources']
  size_of = {d: tuple(int(v) for v in cfg.data.resolution[d]) for d in cfg.data.resolution}
  chunk_steps = int(cfg.data.get('chunk_steps', 2))
  specs, sources = [], []
  for g in fed.groups:
    clients = [fed.clients[c] for c in g.client_ids]
    specs.append(real.GroupFeedSpec(
        dataset=g.dataset, client_ids=g.client_ids, num_total=g.num_total,
        counts=tuple(c.num_train for c in clients), epochs=g.local_epochs,
        batch_size=cfg.batch_size,
        chunk_steps=min(chunk_steps, g.local_epochs * (max(g.counts) // cfg.batch_size)),
        keys=g.tasks_used))
    sources.append([real.client_source(cfg, c) for c in clients])
  transforms = {d: real.T.train_transforms(size_of[d]) for d in size_of}
  chunks = real.TrainChunks(specs, sources, cfg.num_rounds, size_of, int(cfg.data.seed),
                            transforms)
  eval_batches = {}
  for d in sorted({g.dataset for g in fed.groups}):
    keys = tuple(t for t in tasks_lib.DATASETS[d].tasks
                 if any(t in g.tasks_used for g in fed.groups if g.dataset == d))
    test = real.open_split(cfg, d, real.TEST_SPLIT, tasks=keys)
    real.check_eval_sizes(cfg, d, test)
    eval_batches[d] = real.EvalBatches(test, cfg.eval_batch_size, size_of[d], keys)
  exp.compiled['sources'] = (chunks, eval_batches)
  return chunks, eval_batches


def _make_eval_batch_fns(exp: Experiment) -> dict:
  """Per dataset: jitted `(groups, batch, accs) -> accs` over the groups on that dataset."""
  evaluators = _group_evaluators(exp)
  fns = {}
  for d in sorted({g.dataset for g in exp.fed.groups}):
    members = [i for i, g in enumerate(exp.fed.groups) if g.dataset == d]

    def eval_batch(groups, batch, accs, members=members):
      stats = [evaluators[i](groups[i], jax.tree.map(lambda x: x[None], batch))
               for i in members]
      return stats if accs is None else jax.tree.map(jnp.add, accs, stats)

    fns[d] = jax.jit(eval_batch)
  return fns


def make_feed(exp: Experiment, start_round: int = 0) -> Feed:
  """The feed of the experiment's data source."""
  return StreamedFeed(exp, start_round) if exp.streamed else InMemoryFeed(exp)
