"""The round loop: build federation -> [local training -> aggregation -> evaluation
-> logging/checkpoint] per round (FedHCA2 Alg. 1 for any aggregation rule).

On the built-in synthetic data one jitted function runs a whole round: every
client group trains (vmapped over clients, scanned over local steps) on
device-resident arrays, encoders `[N, ...]` and decoders `[K, ...]` are
gathered across groups, aggregated and scattered back. On real data
(`data.source=real`) the augmented batches stream from a grain pipeline: each
group trains chunk by chunk (one jitted, vmapped, scanned call per chunk of
`data.chunk_steps` steps, dispatched asynchronously), then one jitted call
aggregates. Evaluation is jitted with statistics pooled on device. Host
transfers of results happen once per round (logging).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tqdm import tqdm

from fedjax_mtl import aggregators, evaluate, federation, local, report, scenarios
from fedjax_mtl import tasks as tasks_lib
from fedjax_mtl.checkpoint import Checkpointer
from fedjax_mtl.data import real, synthetic
from fedjax_mtl.errors import ConfigError, check_choice
from fedjax_mtl.models import get_encoder
from fedjax_mtl.models.multitask import MultiTaskNet

PyTree = Any
DATA_SOURCES = ('synthetic', 'real')
# Config fields that do not change what a run computes: they may change
# between a run and its resumption (dotted names are nested fields).
RESUMABLE_FIELDS = ('eval_every', 'checkpoint_every', 'progress', 'eval_edge_ods',
                    'delta_m_reference', 'data.workers', 'data.threads', 'data.data_dir',
                    'data.cache_dir')


@functools.lru_cache(maxsize=8)
def _synthetic(domain, split, n, resolution, seed):
  return synthetic.generate(domain, split, n, resolution, seed)


def _datasets(config) -> list[str]:
  """The datasets the scenario's clients use."""
  return sorted({b[0] for b in scenarios.layout(config.scenario)})


def load_data(config) -> dict[str, dict[str, dict[str, np.ndarray]]]:
  """Synthetic train/test arrays per dataset used by the scenario."""
  out = {}
  for d in _datasets(config):
    res = tuple(config.data.resolution[d])
    out[d] = {split: _synthetic(d, split, int(config.data[f'num_{split}'][d]), res,
                                int(config.data.seed))
              for split in ('train', 'test')}
  return out


@dataclasses.dataclass(eq=False)
class Experiment:
  """Everything static about a run: federation, models, compiled functions."""
  config: ml_collections.ConfigDict
  fed: federation.Federation
  data: dict
  mesh: Mesh
  encoder: Any
  models_train: list
  models_eval: list
  tx: Any
  aggregator: aggregators.Aggregator
  round_fn: Any = None
  eval_fn: Any = None
  round_traces: int = 0
  edge_predictors: list = dataclasses.field(default_factory=list)
  # Real data (streamed): None on synthetic data.
  train_chunks: real.TrainChunks | None = None
  eval_batches: dict = dataclasses.field(default_factory=dict)
  chunk_fns: list = dataclasses.field(default_factory=list)
  agg_fn: Any = None
  eval_batch_fns: dict = dataclasses.field(default_factory=dict)

  @property
  def streamed(self) -> bool:
    return self.train_chunks is not None

  @property
  def client_sharding(self) -> NamedSharding:
    return NamedSharding(self.mesh, P('clients'))

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, P())


_BUILT: dict[str, Experiment] = {}


def _run_fields(config, keep: tuple[str, ...] = ()) -> dict:
  """The config (or its JSON dict) without the fields a run may change when resumed."""
  d = json.loads(config if isinstance(config, str) else config.to_json_best_effort())
  for f in RESUMABLE_FIELDS:
    if f in keep:
      continue
    *parents, last = f.split('.')
    node = d
    for p in parents:
      node = node.get(p, {})
    node.pop(last, None)
  return d


def build(config) -> Experiment:
  """Validate the config and build the (static) experiment; writes nothing.

  Experiments are cached per config (ignoring logging/checkpoint cadence), so
  running the same config again in one process (a notebook, a resumed run)
  reuses its compiled functions.
  """
  key = json.dumps(_run_fields(config, keep=('data.data_dir', 'data.cache_dir')),
                   sort_keys=True)
  if key not in _BUILT:
    _BUILT.clear()  # keep at most one experiment's buffers alive
    _BUILT[key] = _build(config)
  return _BUILT[key]


def _build(config) -> Experiment:
  check_choice('algorithm', config.algorithm, aggregators.RULES)
  check_choice('data source', config.data.source, DATA_SOURCES)
  scenarios.layout(config.scenario)
  model_kw = {k: v for k, v in config.model.get('kwargs', {}).items()}
  if config.model.get('dtype', 'float32') not in ('float32', 'bfloat16'):
    raise ConfigError(f"unknown model dtype {config.model.dtype!r}; valid choices: "
                      "'float32', 'bfloat16'")
  dtype = jnp.dtype(config.model.get('dtype', 'float32'))
  model_kw['remat'] = _remat(config)
  encoder = get_encoder(config.model.encoder, dtype=dtype, **model_kw)
  if config.data.source == 'real':
    data = {}
    num_train = {d: len(real.open_split(config, d, 'train', tasks=()))
                 for d in _datasets(config)}
    parts_filter = real.parts_filter(config)
  else:
    data = load_data(config)
    num_train = {d: len(v['train']['image']) for d, v in data.items()}
    parts_filter = scenarios.label_parts_filter({d: v['train'] for d, v in data.items()})
  clients = scenarios.build_clients(config, num_train, parts_filter=parts_filter)
  devices = jax.devices()
  n_dev = config.num_devices or len(devices)
  if n_dev > len(devices):
    raise ConfigError(f'num_devices={n_dev} but only {len(devices)} devices are visible')
  mesh = Mesh(np.asarray(devices[:n_dev]), ('clients',))
  fed = federation.build_federation(clients, n_dev)
  models_train = [MultiTaskNet(encoder, g.head_channels, train=True, dtype=dtype)
                  for g in fed.groups]
  models_eval = [m.clone(train=False) for m in models_train]
  info = aggregators.AggInfo(
      num_clients=fed.num_clients, num_decoders=fed.num_decoders,
      decoder_client=fed.decoder_client, decoder_names=fed.decoder_names,
      client_names=tuple(c.name for c in fed.clients), homo_groups=fed.homo_groups)
  agg = aggregators.get_aggregator(config.algorithm, info, config)
  exp = Experiment(config=config, fed=fed, data=data, mesh=mesh, encoder=encoder,
                   models_train=models_train, models_eval=models_eval,
                   tx=local.make_optimizer(config.optim), aggregator=agg)
  if config.data.source == 'real':
    _build_streaming(exp)
  else:
    exp.round_fn = make_round_fn(exp)
    exp.eval_fn = make_eval_fn(exp)
  exp.edge_predictors = [
      None if p is None else jax.jit(p)
      for p in (evaluate.make_edge_predictor(g, m)
                for g, m in zip(exp.fed.groups, exp.models_eval))]
  return exp


def _init_fn(exp: Experiment):
  """`init(key) -> state`: one shared encoder, fresh decoders/heads per client."""
  cfg = exp.config

  def init(seed):
    # Parameter init uses the 'rbg' PRNG (XLA RngBitGenerator): it compiles
    # several times faster on CPU than threefry for the hundreds of
    # initialiser calls; the training RNG stays threefry.
    k_enc, k_models = jax.random.split(jax.random.key(seed, impl='rbg'))
    k_run = jax.random.PRNGKey(seed)
    groups = []
    enc_params = None
    for spec, model in zip(exp.fed.groups, exp.models_train):
      h, w = cfg.data.resolution[spec.dataset]
      dummy = jnp.zeros((1, h, w, 3), jnp.float32)
      ids = jnp.asarray(list(spec.client_ids) + [spec.client_ids[0]] * spec.num_pad)
      keys = jax.vmap(lambda i: jax.random.fold_in(k_models, i))(ids)
      variables = jax.vmap(lambda k: model.init({'params': k, 'dropout': k}, dummy))(keys)
      if enc_params is None:
        enc_params = model.init({'params': k_enc, 'dropout': k_enc},
                                dummy)['params']['encoder']
      groups.append({'params': dict(variables['params']),
                     'batch_stats': variables['batch_stats']})
    for gs, spec in zip(groups, exp.fed.groups):
      gs['params']['encoder'] = jax.tree.map(
          lambda x: jnp.broadcast_to(x, (spec.num_total,) + x.shape), enc_params)
      gs['opt_state'] = jax.vmap(exp.tx.init)(gs['params'])
    return {'round': jnp.zeros((), jnp.int32), 'rng': k_run, 'groups': groups}

  return init


def init_state(exp: Experiment, abstract: bool = False) -> PyTree:
  """Round-0 federation state, placed on the mesh (or its abstract shapes).

  All clients start from one shared encoder (loaded from
  `model.pretrained_path` when set); decoders and heads are initialised per
  client from keys folded with the client id.
  """
  key = jnp.asarray(exp.config.seed, jnp.uint32)
  init = _init_fn(exp)
  if abstract:
    state = jax.eval_shape(init, key)
  else:
    state = jax.jit(init)(key)
    if exp.config.model.get('pretrained_path'):
      enc = load_pretrained_encoder(exp.config.model.pretrained_path, exp.encoder,
                                    state['groups'][0]['params']['encoder'])
      for gs, spec in zip(state['groups'], exp.fed.groups):
        gs['params']['encoder'] = jax.tree.map(
            lambda x: jnp.broadcast_to(x, (spec.num_total,) + x.shape), enc)
  params = [gs['params'] for gs in state['groups']]
  agg_init = lambda p: exp.aggregator.init(federation.gather_encoders(p, exp.fed),
                                           federation.gather_decoders(p, exp.fed))
  state['agg'] = jax.eval_shape(agg_init, params) if abstract else jax.jit(agg_init)(params)
  if abstract:
    groups = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=exp.client_sharding),
        state['groups'])
    rest = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=exp.replicated),
        {k: v for k, v in state.items() if k != 'groups'})
    return {**rest, 'groups': groups}
  return place(exp, state)


def load_pretrained_encoder(path: str, encoder, like: PyTree) -> PyTree:
  """Converted encoder weights from `path` (checked against the model's shapes)."""
  if not os.path.exists(path):
    raise ConfigError(f'model.pretrained_path {path!r} does not exist')
  from fedjax_mtl.models import convert  # needs the Swin family
  params = convert.load_pretrained(path, encoder)
  shapes = jax.tree.map(np.shape, params)
  if shapes != jax.tree.map(np.shape, like):
    raise ConfigError(f'pretrained weights in {path!r} do not match model {encoder!r}')
  return jax.tree.map(jnp.asarray, params)


def place(exp: Experiment, state: PyTree) -> PyTree:
  """Shard client axes over the mesh; replicate the rest."""
  groups = jax.device_put(state['groups'], exp.client_sharding)
  rest = jax.device_put({k: v for k, v in state.items() if k != 'groups'}, exp.replicated)
  return {**rest, 'groups': groups}


def _group_key(state, g: int) -> jax.Array:
  """Round key of client group `g` (local training randomness)."""
  return jax.random.fold_in(jax.random.fold_in(state['rng'], state['round']), g)


def _aggregate(exp: Experiment, state, prev_p: list, trained: list):
  """New state after aggregating the trained groups against the round's start params."""
  fed = exp.fed
  local_p = [gs['params'] for gs in trained]
  inputs = aggregators.AggInputs(
      enc_prev=federation.gather_encoders(prev_p, fed),
      enc_local=federation.gather_encoders(local_p, fed),
      dec_prev=federation.gather_decoders(prev_p, fed),
      dec_local=federation.gather_decoders(local_p, fed), round=state['round'])
  enc, dec, agg_state, logs = exp.aggregator.apply(state['agg'], inputs)
  new_params = federation.scatter(local_p, fed, enc, dec)
  groups = [jax.lax.with_sharding_constraint({**gs, 'params': p}, exp.client_sharding)
            for gs, p in zip(trained, new_params)]
  new_state = {'round': state['round'] + 1, 'rng': state['rng'], 'groups': groups,
               'agg': agg_state}
  return new_state, logs


def make_round_fn(exp: Experiment):
  """One jitted communication round: train all groups, aggregate, scatter back."""
  cfg = exp.config
  trainers = [local.make_group_trainer(g, m, exp.tx, cfg.optim, cfg.batch_size,
                                       cfg.num_rounds)
              for g, m in zip(exp.fed.groups, exp.models_train)]

  def round_fn(state, data):
    exp.round_traces += 1  # Python side effect: runs once per trace, not per call
    trained, metrics = [], []
    for g, (spec, train) in enumerate(zip(exp.fed.groups, trainers)):
      gs, m = train(state['groups'][g], data[spec.dataset]['train'], state['round'],
                    _group_key(state, g))
      trained.append(gs)
      metrics.append(m)
    prev_p = [gs['params'] for gs in state['groups']]
    new_state, logs = _aggregate(exp, state, prev_p, trained)
    return new_state, {'train': metrics, 'agg': logs}

  return jax.jit(round_fn, donate_argnums=0, compiler_options=train_compiler_options(cfg))


# XLA:CPU's `cse_barrier_expander` pass drops the optimisation barriers that
# `jax.checkpoint` places around the recomputed forward, and CSE then merges the
# recomputation back into the forward pass: remat would change nothing.
# Compiling with this option keeps it. GPU and TPU keep the barriers on their own.
KEEP_REMAT_ON_CPU = {'xla_disable_hlo_passes': 'cse_barrier_expander'}


def _remat(config) -> bool:
  """Whether the encoder rematerialises: `model.remat`, unless `model.kwargs.remat` overrides it."""
  return bool(config.model.get('kwargs', {}).get('remat', config.model.get('remat', False)))


def train_compiler_options(config) -> dict[str, str] | None:
  """XLA options for the jitted training programs: `KEEP_REMAT_ON_CPU` when the
  encoder rematerialises on the CPU backend, else None."""
  if _remat(config) and jax.default_backend() == 'cpu':
    return dict(KEEP_REMAT_ON_CPU)
  return None


def _build_streaming(exp: Experiment) -> None:
  """Real data: the run's chunk source, per-group chunk trainers, aggregation, eval."""
  cfg = exp.config
  fed = exp.fed
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
  exp.train_chunks = real.TrainChunks(specs, sources, cfg.num_rounds, size_of,
                                      int(cfg.data.seed), transforms)
  for d in sorted({g.dataset for g in fed.groups}):
    keys = tuple(t for t in tasks_lib.DATASETS[d].tasks
                 if any(t in g.tasks_used for g in fed.groups if g.dataset == d))
    test = real.open_split(cfg, d, real.TEST_SPLIT, tasks=keys)
    real.check_eval_sizes(cfg, d, test)
    exp.eval_batches[d] = real.EvalBatches(test, cfg.eval_batch_size, size_of[d], keys)

  def chunk_fn(g, trainer):
    def run(gs, acc, chunk, state_rng, rnd):
      return trainer(gs, acc, chunk, _group_key({'rng': state_rng, 'round': rnd}, g))
    return jax.jit(run, donate_argnums=(0, 1), compiler_options=train_compiler_options(cfg))

  exp.chunk_fns = [chunk_fn(g, local.make_chunk_trainer(spec, m, exp.tx, cfg.optim,
                                                         cfg.num_rounds))
                   for g, (spec, m) in enumerate(zip(fed.groups, exp.models_train))]

  def agg_fn(state, prev_p, accs):
    exp.round_traces += 1
    metrics = [{'loss': a['loss_sum'] / jnp.maximum(a['steps'], 1)[:, None],
                'steps': a['steps']} for a in accs]
    new_state, logs = _aggregate(exp, state, prev_p, state['groups'])
    return new_state, {'train': metrics, 'agg': logs}

  exp.agg_fn = jax.jit(agg_fn, donate_argnums=0)
  evaluators = [evaluate.make_group_evaluator(g, m)
                for g, m in zip(fed.groups, exp.models_eval)]
  for d in exp.eval_batches:
    members = [i for i, g in enumerate(fed.groups) if g.dataset == d]

    def eval_batch(groups, batch, accs, members=members):
      stats = [evaluators[i](groups[i]['params'], groups[i]['batch_stats'],
                             jax.tree.map(lambda x: x[None], batch)) for i in members]
      return stats if accs is None else jax.tree.map(jnp.add, accs, stats)

    exp.eval_batch_fns[d] = jax.jit(eval_batch)


_copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))


def _chunk_arrays(exp: Experiment, element: dict) -> dict:
  """A fed chunk on device: client axes sharded over the mesh."""
  shard, rep = exp.client_sharding, exp.replicated
  x = {k[2:]: v for k, v in element.items() if k.startswith('x/')}
  return {'x': jax.device_put(x, shard), 'mask': jax.device_put(element['mask'], shard),
          'epoch': jax.device_put(element['epoch'], rep),
          'step': jax.device_put(element['step'], rep)}


def streamed_round(exp: Experiment, state, feed: Iterator[dict], rnd: int):
  """Round `rnd` (0-based) on streamed data: chunked local training, then aggregation.

  `feed` yields `exp.train_chunks` elements from this round on; calls are
  dispatched asynchronously, so the host prepares the next chunk while the
  device trains on the current one.
  """
  groups = list(state['groups'])
  prev_p = _copy([gs['params'] for gs in groups])
  accs = [{'loss_sum': jnp.zeros((g.num_total, g.num_slots), jnp.float32),
           'steps': jnp.zeros((g.num_total,), jnp.int32)} for g in exp.fed.groups]
  accs = jax.device_put(accs, exp.client_sharding)
  for _ in range(exp.train_chunks.per_round):
    el = next(feed)
    if int(el['round']) != rnd:
      raise RuntimeError(f'data feed out of step: chunk of round {int(el["round"])} '
                         f'in round {rnd}')
    g = int(el['group'])
    groups[g], accs[g] = exp.chunk_fns[g](groups[g], accs[g], _chunk_arrays(exp, el),
                                          state['rng'], state['round'])
  return exp.agg_fn({**state, 'groups': groups}, prev_p, accs)


def make_eval_fn(exp: Experiment):
  """One jitted evaluation of every group on its test split."""
  evaluators = [evaluate.make_group_evaluator(g, m)
                for g, m in zip(exp.fed.groups, exp.models_eval)]

  def eval_fn(groups, test_batches):
    return [ev(gs['params'], gs['batch_stats'], test_batches[spec.dataset])
            for ev, gs, spec in zip(evaluators, groups, exp.fed.groups)]

  return jax.jit(eval_fn)


def device_data(exp: Experiment):
  """Train arrays and batched test arrays on device (replicated over the mesh)."""
  train = {d: {'train': v['train']} for d, v in exp.data.items()}
  test = {d: evaluate.batch_test_split(v['test'], exp.config.eval_batch_size)
          for d, v in exp.data.items()}
  return jax.device_put(train, exp.replicated), jax.device_put(test, exp.replicated)


def _streamed_stats(exp: Experiment, groups) -> list:
  """Pooled test statistics of every group, streaming each test split once."""
  stats = [None] * len(exp.fed.groups)
  threads = int(exp.config.data.get('threads', 2))
  for d, source in exp.eval_batches.items():
    members = [i for i, g in enumerate(exp.fed.groups) if g.dataset == d]
    accs = None
    for batch in real.iterate(source, threads=threads):
      batch = jax.device_put(batch, exp.replicated)
      if accs is None:  # zeros of the statistics' shapes: one compiled function
        shapes = jax.eval_shape(exp.eval_batch_fns[d], groups, batch, None)
        accs = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
      accs = exp.eval_batch_fns[d](groups, batch, accs)
    for i, st in zip(members, jax.device_get(accs)):
      stats[i] = st
  return stats


def _test_batches(exp: Experiment, dataset: str) -> Iterator[dict]:
  """Test batches of `dataset` (edge odsF pass), from memory or streamed."""
  if exp.streamed:
    yield from real.iterate(exp.eval_batches[dataset],
                            threads=int(exp.config.data.get('threads', 2)))
    return
  split, b = exp.data[dataset]['test'], exp.config.eval_batch_size
  for lo in range(0, len(split['image']), b):
    yield {k: split[k][lo:lo + b] for k in ('image', 'edge')}


def run_eval(exp: Experiment, state, test_data) -> list[dict]:
  """Metrics rows (client, task, metric, value) of the current personalised models."""
  if exp.streamed:
    stats = _streamed_stats(exp, state['groups'])
  else:
    stats = jax.device_get(exp.eval_fn(state['groups'], test_data))
  rows = []
  for g, (spec, st) in enumerate(zip(exp.fed.groups, stats)):
    group_rows = evaluate.finalize_group(spec, st, exp.fed.clients)
    if exp.config.get('eval_edge_ods', True) and exp.edge_predictors[g] is not None:
      # Edge: the test loss is replaced by odsF (host-side matching, per batch).
      ods = evaluate.edge_ods_rows(spec, exp.edge_predictors[g], state['groups'][g],
                                   _test_batches(exp, spec.dataset), exp.fed.clients)
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


def _summary(rnd: int, total: int, dt: float, train_rows, eval_rows) -> str:
  loss = np.mean([r['loss'] for r in train_rows])
  line = f'round {rnd}/{total} {dt:6.2f}s | train loss {loss:.4f}'
  if eval_rows:
    by = {}
    for r in eval_rows:
      by.setdefault((r['dataset'], r['task'], r['metric']), []).append(r['value'])
    line += ' | eval ' + ' '.join(f'{d}/{t} {m} {np.mean(v):.2f}' for (d, t, m), v in by.items())
  return line


def _check_workdir(config, workdir: str) -> None:
  """Refuse a workdir holding a run with another config (before writing anything)."""
  path = os.path.join(workdir, 'config.json')
  if not os.path.exists(path):
    return
  with open(path) as f:
    old = _run_fields(f.read())
  new = _run_fields(config)
  diffs = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
  if diffs:
    raise ConfigError(
        f'workdir {workdir!r} holds a run with a different config (fields: '
        f'{", ".join(diffs)}); use a new --workdir or the same config to resume')


def train_and_evaluate(config, workdir: str, stop_after: int | None = None) -> dict:
  """Run (or resume) the federated experiment in `workdir`; returns final metrics.

  `stop_after` ends the process after that many completed rounds, as an
  interruption would (used to test resumption).
  """
  _check_workdir(config, workdir)
  exp = build(config)
  os.makedirs(workdir, exist_ok=True)
  ckpt = Checkpointer(os.path.join(workdir, 'checkpoints'))
  metrics_path = os.path.join(workdir, 'metrics.jsonl')
  start = ckpt.latest_round() or 0
  if start:
    state = ckpt.restore(init_state(exp, abstract=True))
    report.truncate_jsonl(metrics_path, start)
  else:
    state = init_state(exp)
    # A fresh start: rows left by an attempt that never reached a checkpoint go.
    report.atomic_write(metrics_path, '')
    report.append_jsonl(metrics_path, [_meta_row(exp)])
  report.atomic_write(os.path.join(workdir, 'config.json'), config.to_json_best_effort(indent=2))
  if exp.streamed:
    train_data = test_data = None
    feed = real.iterate(exp.train_chunks, exp.train_chunks.offset(start),
                        workers=int(config.data.get('workers', 0)),
                        threads=int(config.data.get('threads', 2)))
  else:
    train_data, test_data = device_data(exp)
  total = config.num_rounds
  steps = sum(int(g.local_epochs * (g.counts // config.batch_size).sum()) for g in exp.fed.groups)
  bar = tqdm(total=total, initial=start, unit='round', disable=not config.progress,
             desc=f'{config.algorithm} {exp.fed.num_clients} clients {steps} steps/round')
  eval_rows: list[dict] = []
  try:
    for rnd in range(start + 1, total + 1):
      t0 = time.time()
      if exp.streamed:
        state, out = streamed_round(exp, state, feed, rnd - 1)
      else:
        state, out = exp.round_fn(state, train_data)
      out = jax.device_get(out)  # the one host transfer per round
      rows = _train_rows(exp, rnd, out['train']) + _agg_rows(rnd, out['agg'])
      eval_rows = []
      if rnd % config.eval_every == 0 or rnd == total:
        eval_rows = [{'round': rnd, 'type': 'eval', **r} for r in run_eval(exp, state, test_data)]
      report.append_jsonl(metrics_path, rows + eval_rows)
      if rnd % config.checkpoint_every == 0 or rnd == total:
        ckpt.save(rnd, state)
      bar.update(1)
      tqdm.write(_summary(rnd, total, time.time() - t0,
                          [r for r in rows if r['type'] == 'train'], eval_rows))
      if stop_after is not None and rnd >= stop_after:
        return {'state': state, 'eval': eval_rows, 'interrupted': True}
  finally:
    bar.close()
    ckpt.close()
    if exp.streamed:
      feed.close()  # stops grain workers
  final = [r for r in report.read_jsonl(metrics_path) if r['type'] == 'eval'
           and r['round'] == total]
  all_rows = report.read_jsonl(metrics_path)
  report.plot_metric_curves(all_rows, workdir)
  report.plot_hyperweights(all_rows, workdir)
  ref_dir = config.get('delta_m_reference', '')
  ref = report.final_eval_rows(os.path.join(ref_dir, 'metrics.jsonl')) if ref_dir else None
  md, csv_text = report.results_table(config.algorithm, final, ref)
  report.atomic_write(os.path.join(workdir, 'results.md'), md)
  report.atomic_write(os.path.join(workdir, 'results.csv'), csv_text)
  return {'state': state, 'eval': final, 'interrupted': False}
