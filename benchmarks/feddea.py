"""FedDEA: the exact top-ρ mask against FedAvg and a sort (`--only=top_rho`, then
`dea_engine`), the engine's aggregation with `dea(fedavg)` against FedAvg
(`--only=dea_engine`), and the memory of the unified-model round at the paper's
sizes (`--only=unified_memory`).
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import algorithm_config, timeit
from benchmarks.engine import agg_inputs
from fedjax_mtl import experiment, sources
from fedjax_mtl.engines.dense import copy_tree, with_sharding
from fedjax_mtl.algorithms import topk


def top_rho_times(num_clients: int, sizes: Sequence[int], repeats: int = 3,
                  rho: float = 0.25, baselines: Sequence[str] = ('sort',),
                  seed: int = 0) -> dict:
  """Seconds of the top-ρ mask (float32 0/1, and bool: 1 byte an entry) and of its
  threshold alone against the FedAvg aggregation of the same update (`tensordot` of
  uniform weights over the client axis, per leaf): `num_clients` rows of leaves of
  `sizes` entries, normal values with a log-uniform scale per leaf (1e-5..1e-3, like
  layers that move at different rates).

  `baselines`: 'sort' (jnp.sort of each client's concatenated |Δ|, the spec's
  pseudo-code) and 'top_k' (lax.top_k, the implementation this replaces); each takes
  minutes at Swin-T scale on a 2-core CPU, so they run once after their first call.
  Every program is compiled and run once before timing (`*_first_call_s`); ratios
  are to FedAvg timed in the same process. `passes` / `compacted_passes`: counting
  passes over the update / over compacted columns.
  """
  rng = np.random.default_rng(seed)
  scales = 10.0 ** rng.uniform(-5, -3, len(sizes))
  make = jax.jit(lambda key: [s * jax.random.normal(k, (num_clients, n), jnp.float32)
                              for k, n, s in zip(jax.random.split(key, len(sizes)), sizes,
                                                 scales)])
  leaves = jax.block_until_ready(make(jax.random.PRNGKey(seed)))
  row_client = {'encoder': tuple(range(num_clients))}
  w = jnp.full((num_clients,), 1.0 / num_clients, jnp.float32)
  d = int(sum(sizes))
  k = max(int(math.floor(rho * d)), 1)
  flat = lambda x: jnp.concatenate([jnp.abs(v) for v in x], axis=1)
  programs = {
      'fedavg': lambda w, x: [jnp.tensordot(w, v, axes=1, precision=jax.lax.Precision.HIGHEST)
                              for v in x],
      'mask': lambda w, x: topk.top_rho_mask({'encoder': x}, row_client, num_clients, rho),
      'mask_bool': lambda w, x: topk.top_rho_mask({'encoder': x}, row_client, num_clients,
                                                  rho, dtype=jnp.bool_),
      'threshold': lambda w, x: topk.kth_threshold({'encoder': x}, k, row_client, num_clients,
                                                   stats=True),
      'sort': lambda w, x: jnp.sort(flat(x), axis=1)[:, d - k],
      'top_k': lambda w, x: jax.lax.top_k(flat(x), k)[0][:, -1],
  }
  names = ['fedavg', 'mask', 'mask_bool', 'threshold'] + [b for b in ('sort', 'top_k')
                                                          if b in baselines]
  out = {'num_clients': num_clients, 'entries_per_client': d, 'leaves': len(sizes),
         'rho': rho}
  for name in names:
    fn = jax.jit(programs[name])
    t0 = time.perf_counter()
    res = jax.block_until_ready(fn(w, leaves))
    out[f'{name}_first_call_s'] = time.perf_counter() - t0
    if name == 'threshold':
      out.update({key: int(v) for key, v in res[1].items()})
    runs = 1 if name in ('sort', 'top_k') else repeats
    out[f'{name}_s'] = timeit(lambda fn=fn: jax.block_until_ready(fn(w, leaves)), runs)
  for name in names[1:]:
    out[f'{name}_vs_fedavg'] = out[f'{name}_s'] / out['fedavg_s']
  return out


def bench_top_rho(repeats: int = 3, clients=(4, 5), rho: float = 0.25,
                  baselines=('sort',)) -> dict:
  """FedDEA's exact top-ρ mask over each client's update of the unified Swin-T model
  (the encoder plus K decoders and heads, ≈ 28.3 M values at K = 4), all clients in
  one jitted call, against a FedAvg aggregation of the same update and a full sort
  (`top_rho_times`; normal values with a log-uniform scale per leaf)."""
  from fedjax_mtl.models import get_encoder
  from fedjax_mtl.models.multitask import MultiTaskNet
  model = MultiTaskNet(get_encoder('swin_t'), (40,))
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                             jnp.zeros((1, 64, 64, 3))))['params']
  size = lambda t: [int(np.prod(x.shape)) for x in jax.tree.leaves(t)]
  task = size({k: v for k, v in shapes.items() if k != 'encoder'})
  out = {}
  for k in clients:
    r = top_rho_times(k, size(shapes['encoder']) + task * k, repeats, rho, baselines)
    out.update({f'K{k}_{name}': v for name, v in r.items()})
  return out


def bench_dea_engine(datasets=('nyud', 'pascal'), repeats: int = 5,
                     algorithms=('fedavg', 'dea(fedavg)')) -> dict:
  """The engine's aggregation program (`rounds.make_agg_fn`, as `engine_agg_runners`
  calls it: finalize, gather, the rule, scatter, health flags, donated core) for
  `configs/feddea.py` with Swin-T, FedAvg against `dea(fedavg)` (ρ = 1/K, the
  unified model, the per-round logs), K = 4 (NYUD-v2) and 5 (PASCAL-Context)
  task-level clients. Trained params = round-start params + 1e-3 noise.

  Every timed call aggregates that same freshly trained state, as every round of a
  run aggregates freshly trained clients: the state is copied (outside the timer)
  before each call, since the call donates it. Feeding a call's output back as the
  next call's input would time rounds whose clients did not train (every client's
  update is then the previous round's aggregated update, a different input for the
  top-ρ selection). Calls alternate between the algorithms; best and median of
  `repeats`."""
  from fedjax_mtl import rounds
  out = {}
  for ds in datasets:
    runs = {}
    for alg in algorithms:
      cfg = algorithm_config('feddea', f'dataset={ds}')
      cfg.algorithm = alg
      cfg.model.encoder = 'swin_t'
      cfg.model.remat = False
      cfg.data.num_train = {ds: 64}
      cfg.data.num_test = {ds: 2}
      exp, state, start, trained, metrics = agg_inputs(cfg)
      base = state.replace(groups=[gs.replace(params=p)
                                   for gs, p in zip(state.groups, trained)])
      del trained, state
      t0 = time.perf_counter()
      compiled = rounds.make_agg_fn(exp).lower(
          rounds.agg_core(base), [gs.params for gs in base.groups], start,
          metrics).compile()
      out[f'{ds}_{alg}_compile_s'] = time.perf_counter() - t0

      def run(compiled=compiled, base=base, start=start, metrics=metrics):
        fresh = jax.block_until_ready(copy_tree(base))
        t0 = time.perf_counter()
        jax.block_until_ready(rounds.aggregate(compiled, fresh, start, metrics))
        return time.perf_counter() - t0

      run()
      runs[alg] = run
      out[f'{ds}_clients'] = exp.fed.num_clients
    times = {alg: [] for alg in runs}
    for _ in range(repeats):
      for alg, run in runs.items():
        times[alg].append(run())
    for alg, t in times.items():
      out[f'{ds}_{alg}_best_s'] = min(t)
      out[f'{ds}_{alg}_median_s'] = float(np.median(t))
    base_alg = algorithms[0]
    for alg in algorithms[1:]:
      out[f'{ds}_{alg}_vs_{base_alg}'] = min(times[alg]) / min(times[base_alg])
    del runs
  return out


def bench_unified_memory(datasets=('nyud', 'pascal'), encoders=('swin_t', 'resnet18'),
                         remat: bool = False) -> dict:
  """Memory of the unified-model round of `configs/feddea.py:paper` (K = 4 NYUD-v2
  clients at 448×576, K = 5 PASCAL-Context clients at 512×512, batch 8, AdamW,
  `dea(fedavg)`), from XLA's memory analysis of the programs the engine runs;
  nothing runs. The local-training program is the in-memory one (a few synthetic
  images per client: its data argument is small; a step's temporaries are those
  of the streamed program), with the round start as `rounds.round_start` keeps
  it (one encoder) and, for comparison, a row per client (`start_axes=None`,
  what the engine held before). Per layout, in bytes:
  `state` (params, batch-norm statistics and AdamW moments of all K clients),
  `start` (the round start the program reads), `temp` (XLA's temporaries of the
  training program), `agg_temp` (of the aggregation program); `per_client` =
  state / K + temp / K, and `shared` = the one-copy part of the start."""
  import dataclasses
  from fedjax_mtl import rounds
  size = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
  out = {}
  for ds in datasets:
    for enc in encoders:
      cfg = algorithm_config('feddea', f'paper,dataset={ds}')
      cfg.data.source = 'synthetic'
      cfg.model.encoder = enc
      cfg.model.pretrained_path = ''
      cfg.model.remat = remat
      cfg.data.num_train = {ds: TRAIN_IMAGES[ds]}
      cfg.data.num_test = {ds: 2}
      cfg.local_epochs = {ds: 1}
      exp = experiment.build(cfg)
      k = exp.fed.num_clients
      state = experiment.init_state(exp, abstract=True)
      for layout, e in (('one', exp),
                        ('per_row', dataclasses.replace(exp, start_axes=None))):
        feed_data = sources.device_data(e)[0]
        params = [gs.params for gs in state.groups]
        start = rounds.abstract_round_start(e, params)
        fn = rounds.make_train_fns(e)[0]
        t0 = time.perf_counter()
        mem = fn.lower(state.groups[0], start[0], feed_data[ds]['train'], state.round,
                       state.rng, rounds.num_rounds(e)).compile().memory_analysis()
        compile_s = time.perf_counter() - t0
        metrics = with_sharding(jax.eval_shape(
            fn, state.groups[0], start[0], feed_data[ds]['train'], state.round, state.rng,
            rounds.num_rounds(e))[1], e.client_sharding)
        agg = rounds.make_agg_fn(e).lower(rounds.agg_core(state), params, start,
                                          [metrics]).compile().memory_analysis()
        name = f'{ds}_{enc}_{layout}'
        st = size(state.groups[0].params) + size(state.groups[0].batch_stats) + size(
            state.groups[0].opt_state)
        shared = size([x for a, x in zip(
            jax.tree.leaves(e.start_axes[0], is_leaf=lambda a: a is None),
            jax.tree.leaves(start[0])) if a is None]) if e.start_axes is not None else 0
        out.update({f'{name}_clients': k, f'{name}_state_bytes': st,
                    f'{name}_start_bytes': size(start), f'{name}_shared_bytes': shared,
                    f'{name}_temp_bytes': mem.temp_size_in_bytes,
                    f'{name}_args_bytes': mem.argument_size_in_bytes,
                    f'{name}_alias_bytes': mem.alias_size_in_bytes,
                    f'{name}_agg_temp_bytes': agg.temp_size_in_bytes,
                    f'{name}_per_client_bytes': (st + mem.temp_size_in_bytes) / k,
                    f'{name}_compile_s': compile_s})
        print(name, {k_: v for k_, v in out.items() if k_.startswith(name)}, flush=True)
  return out


# Synthetic training images: at least a batch of 8 per client (PASCAL's human-parts
# client keeps only the images with parts).
TRAIN_IMAGES = {'nyud': 32, 'pascal': 200}
