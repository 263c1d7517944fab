"""Data sources of the dense engine: where a round's batches come from. They only
produce data (device arrays, grain chunks); the engine (`engines/dense.py`) runs the
programs on them.

- `InMemorySource` (synthetic data): the train arrays and the batched test splits,
  on device, replicated over the mesh.
- `StreamedSource` (real data): augmented training chunks (a client group's next
  local steps) from a grain pipeline, placed on device with the client axis
  sharded, and the test splits as batches (`real.EvalBatches`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Iterator

import numpy as np

from fedjax_mtl import data, distributed, evaluation, hostmem, participation
from fedjax_mtl import tasks as tasks_lib
from fedjax_mtl.errors import check_choice
from fedjax_mtl.experiment import Experiment, per_experiment

# `fedjax_mtl.data.real` (grain, scipy.io) is imported inside the functions that read
# real data, so that a synthetic run does not load it.

PyTree = Any


def device_data(exp: Experiment) -> tuple[dict, dict]:
  """Train arrays and batched test arrays on device (replicated over the mesh)."""
  train = {d: {'train': v['train']} for d, v in exp.data.items()}
  test = {d: evaluation.batch_test_split(v['test'], exp.config.eval_batch_size)
          for d, v in exp.data.items()}
  return (distributed.put_replicated(train, exp.replicated),
          distributed.put_replicated(test, exp.replicated))


class InMemorySource:
  """Synthetic data on device: `train[dataset]['train']`, `test[dataset]` batches."""

  streamed = False

  def __init__(self, exp: Experiment):
    self.exp = exp
    self.train, self.test = device_data(exp)

  def edge_truth(self, dataset: str) -> np.ndarray:
    """[N, H, W] host edge maps of `dataset`'s test split (odsF's ground truth)."""
    return self.exp.data[dataset]['test']['edge']

  def close(self) -> None:
    pass


class StreamedSource:
  """Real data from grain: training chunks from round `start_round` on, test batches.

  With `data.augment='device'` the chunks hold raw samples in canvases of the
  datasets' largest images (`device_chunks`), which the engine's augmenters
  transform on the accelerator.
  """

  streamed = True

  def __init__(self, exp: Experiment, start_round: int = 0, config=None):
    # `config`: the run's (its data.workers / threads / feed_memory_gib may differ from
    # those of the config the shared experiment was built with: workdir.RESUMABLE_FIELDS).
    config = exp.config if config is None else config
    self.exp = exp
    self.threads = int(config.data.get('threads', 2))
    self.train_chunks, self.eval_batches = streamed_sources(exp)
    if augment_mode(exp) == 'device':
      self.train_chunks = device_chunks(exp)
    self.workers = self.capped_workers(int(config.data.get('workers', 0)),
                                       float(config.data.get('feed_memory_gib', 0.)))
    self._start = start_round
    self._iter = None

  def capped_workers(self, requested: int, budget_gib: float) -> int:
    """`requested` workers (`data.workers`), fewer where their prefetched chunks would
    hold more than `budget_gib` (0: a quarter of the host's memory), with a log line
    saying so (`real.feed_workers`). The 4c paper layout's PASCAL chunk of 20 clients
    is 0.74 GiB: 8 workers filled 13 GB of shared memory on a 24 GB host."""
    from fedjax_mtl.data import real
    budget = (int(budget_gib * 2**30) if budget_gib > 0
              else hostmem.host_memory_bytes() // 4)
    element = self.train_chunks.element_bytes()
    workers = real.feed_workers(requested, element, budget)
    if workers < requested:
      logging.warning('feed: %d workers would hold up to %.1f GiB of prefetched chunks '
                      '(%.2f GiB each); using %d to stay within %.1f GiB '
                      '(data.feed_memory_gib)', requested,
                      real.ELEMENTS_PER_WORKER * element * requested / 2**30,
                      element / 2**30, workers, budget / 2**30)
    return workers

  @property
  def rows(self) -> list:
    """Per group: the range of client rows this process feeds."""
    return self.train_chunks.rows

  def round_chunks(self, rnd: int) -> Iterator[tuple[int, dict]]:
    """Round `rnd`'s chunks (1-based) as (group, device chunk): client axes sharded
    over the mesh from this process's rows of them (`TrainChunks.rows`)."""
    from fedjax_mtl.data import real
    if self._iter is None:
      self._iter = real.iterate(self.train_chunks, self.train_chunks.offset(self._start),
                                workers=self.workers, threads=self.threads)
    for _ in range(self.train_chunks.per_round):
      el = next(self._iter)
      if int(el['round']) != rnd - 1:
        raise RuntimeError(f'data feed out of step: chunk of round {int(el["round"]) + 1} '
                           f'in round {rnd}')
      yield int(el['group']), self.on_device(el)

  def on_device(self, element: dict) -> dict:
    """A chunk (a `real.TrainChunks` element) as the chunk trainers take it, on device."""
    shard, rep = self.exp.client_sharding, self.exp.replicated
    n = self.exp.fed.groups[int(element['group'])].num_total
    c = chunk_arrays(element)
    return {'x': distributed.put_local(c['x'], shard, n),
            'mask': distributed.put_local(c['mask'], shard, n),
            'epoch': distributed.put_replicated(c['epoch'], rep),
            'step': distributed.put_replicated(c['step'], rep)}

  def test_batches(self, dataset: str) -> Iterator[dict]:
    """`dataset`'s test batches (host arrays), read by this source's threads."""
    from fedjax_mtl.data import real
    return real.iterate(self.eval_batches[dataset], threads=self.threads)

  def close(self) -> None:
    if self._iter is not None:
      self._iter.close()  # stops grain workers


def make_source(exp: Experiment, start_round: int = 0,
                config=None) -> InMemorySource | StreamedSource:
  """The data source of the experiment's `data.source` (opened: a missing cache fails
  here); `config`: the run's, for its host-side feed fields (default `exp.config`)."""
  return StreamedSource(exp, start_round, config) if exp.streamed else InMemorySource(exp)


def augment_mode(exp: Experiment) -> str:
  """`data.augment`: where training samples are augmented ('host' | 'device')."""
  mode = exp.config.data.get('augment', 'host')
  check_choice('data.augment', mode, data.AUGMENT_MODES)
  return mode


@per_experiment
def streamed_sources(exp: Experiment) -> tuple[real.TrainChunks, dict]:
  """The run's training chunk source and per-dataset test batch sources."""
  from fedjax_mtl.data import real
  cfg, fed = exp.config, exp.fed
  specs = [group_feed_spec(exp, g) for g in fed.groups]
  sources = [[real.client_source(cfg, fed.clients[c]) for c in g.client_ids] for g in fed.groups]
  # A multi-process run reads only the clients on this process's devices.
  rows = [distributed.local_rows(exp.client_sharding, g.num_total) for g in fed.groups]
  # Partial participation and stragglers: the clients' share of each round's steps.
  sampler = participation.Sampler(cfg, fed)
  chunks = real.TrainChunks(specs, sources, cfg.num_rounds, sizes(exp), int(cfg.data.seed),
                            train_transforms(exp), rows=rows,
                            step_shares=sampler.step_shares if sampler.active else None)
  eval_batches = {}
  for d in sorted({g.dataset for g in fed.groups}):
    keys = tuple(t for t in tasks_lib.DATASETS[d].tasks
                 if any(t in g.tasks_used for g in fed.groups if g.dataset == d))
    eval_batches[d] = eval_source(exp, d, keys)
  return chunks, eval_batches


@per_experiment
def device_chunks(exp: Experiment) -> real.TrainChunks:
  """The training chunks with raw samples (`data.augment='device'`)."""
  from fedjax_mtl.data import real
  c = streamed_sources(exp)[0]
  return real.TrainChunks(c.specs, c.sources, c.num_rounds, c.size_of, c.seed, c.transforms_of,
                          augment='device', rows=c.rows, step_shares=c.step_shares)


def sizes(exp: Experiment) -> dict[str, tuple[int, int]]:
  """(height, width) the run trains and evaluates each dataset at."""
  res = exp.config.data.resolution
  return {d: tuple(int(v) for v in res[d]) for d in res}


def train_transforms(exp: Experiment) -> dict[str, list]:
  """The training augmentation of each dataset."""
  from fedjax_mtl.data import real
  return {d: real.T.train_transforms(size) for d, size in sizes(exp).items()}


def group_feed_spec(exp: Experiment, g) -> real.GroupFeedSpec:
  """The streamed plan of client group `g`'s local steps (chunks of its round)."""
  from fedjax_mtl.data import real
  cfg, fed = exp.config, exp.fed
  chunk_steps = int(cfg.data.get('chunk_steps', 2))
  spec = real.GroupFeedSpec(
      dataset=g.dataset, client_ids=g.client_ids, num_total=g.num_total,
      counts=tuple(fed.clients[c].num_train for c in g.client_ids), epochs=g.local_epochs,
      batch_size=cfg.batch_size, chunk_steps=chunk_steps, keys=g.tasks_used,
      max_steps=int(cfg.get('max_steps_per_round', 0)))
  return dataclasses.replace(spec, chunk_steps=min(chunk_steps, spec.num_steps))


def eval_source(exp: Experiment, dataset: str, keys: tuple[str, ...]) -> real.EvalBatches:
  """`dataset`'s test split as evaluation batches with the labels `keys`."""
  from fedjax_mtl.data import real
  cfg = exp.config
  test = real.open_split(cfg, dataset, real.TEST_SPLIT, tasks=keys)
  real.check_eval_sizes(cfg, dataset, test)
  return real.EvalBatches(test, cfg.eval_batch_size, sizes(exp)[dataset], keys)


def chunk_arrays(element: dict) -> dict:
  """A `real.TrainChunks` element as the chunk trainers take it (host arrays)."""
  return {'x': {k[2:]: v for k, v in element.items() if k.startswith('x/')},
          'mask': element['mask'], 'epoch': element['epoch'], 'step': element['step']}
