"""Many-task setting: MaTU's server at the paper's scale against MaT-FL's
(`--only=matu_server`), MaTU's client-side unify against a mini8 round
(`--only=matu_client`), the many-task round's memory (`--only=many_memory`), and
NTKFedAvg's server-α grid (`--only=ntk_alpha`).
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import ROOT, timeit


def _adapter_views(model: str = 'vit_b32', resolution: int = 224, rank: int = 16):
  """(trainable flat dict, roles) of the many-task ViT with LoRA on q/v (heads excluded)."""
  import ml_collections
  from fedjax_mtl.manytask import model as many_model
  from fedjax_mtl.models import vit
  cfg = ml_collections.ConfigDict({'model': model, 'resolution': resolution,
                                   'lora_rank': rank, 'lora_alpha': 0.0, 'lora_seed': 0})
  m = many_model.make_model(cfg, 10)
  shapes = jax.eval_shape(lambda: vit.init_params(m, jax.random.PRNGKey(0)))
  _, trainable = many_model.split(shapes)
  roles = many_model.roles(trainable)
  keep = {k: v for k, v in trainable.items() if roles[k] != 'head'}
  return keep, {k: roles[k] for k in keep}


def matu_server_inputs(assignment: np.ndarray, trainable: dict, roles: dict, seed: int = 0):
  """ServerInputs of one many-task round where every client of `assignment` [N, T]
  takes part: one row per (client, task) pair, random trained adapters around a
  random origin, as `manytask.engine.make_round` hands them to the server."""
  from fedjax_mtl.algorithms.base import ServerInputs, role_view
  pairs = np.argwhere(assignment)  # client-major
  s = len(pairs)
  key = jax.random.PRNGKey(seed)
  origin = {k: jax.random.normal(jax.random.fold_in(key, i), v.shape, jnp.float32)
            for i, (k, v) in enumerate(sorted(trainable.items()))}
  local = {k: origin[k][None] + 1e-3 * jax.random.normal(jax.random.fold_in(key, 1000 + i),
                                                         (s,) + v.shape, jnp.float32)
           for i, (k, v) in enumerate(sorted(trainable.items()))}
  from fedjax_mtl.manytask.engine import client_segments
  shared = ('encoder', 'decoder')
  return ServerInputs(
      prev={r: role_view(local, roles, r) for r in shared},
      local={r: role_view(local, roles, r) for r in shared},
      num_examples=jnp.asarray(np.random.default_rng(seed).integers(50, 500, s), jnp.float32),
      num_steps=jnp.ones(s, jnp.int32), client_ids=jnp.asarray(pairs[:, 0], jnp.int32),
      round=jnp.int32(0), row_valid=jnp.ones(s, bool),
      row_client=client_segments(jnp.asarray(pairs[:, 0], jnp.int32)),
      row_task=jnp.asarray(pairs[:, 1], jnp.int32),
      origin={r: role_view(origin, roles, r) for r in shared})


def bench_matu_server(repeats: int = 5, num_clients: int = 30,
                      settings=((8, 0.0), (8, 0.5), (30, 0.2))) -> dict:
  """MaTU's server step as the many-task round runs it (`algorithms.matu` server:
  client unification, the stateless server, recovery; jitted) at the paper's scale:
  ViT-B/32 LoRA r = 16 adapters (589,824 values), N = 30 clients all taking part,
  T tasks allocated by Dirichlet(ζ_t) (ζ_t = 0: one task per client); and MaT-FL's
  server (3 clusters) on the same rows. Best of `repeats` seconds per call."""
  import ml_collections
  from fedjax_mtl import algorithms
  from fedjax_mtl.algorithms.base import ServerState
  from fedjax_mtl.manytask import allocation
  trainable, roles = _adapter_views()
  out = {'adapter_params': sum(int(np.prod(v.shape)) for v in trainable.values())}
  for t, zeta in settings:
    a = allocation.assign_tasks(num_clients, t, zeta, seed=0)
    x = matu_server_inputs(a, trainable, roles)
    s = int(a.sum())
    info = algorithms.FedInfo(num_clients=s, num_decoders=s, decoder_client=tuple(range(s)),
                              decoder_names=(), client_names=(), homo_groups=(s,),
                              num_tasks=t)
    cfg = ml_collections.ConfigDict({'matfl': {'mode': 'hard', 'num_clusters': 3, 'th': 0.0}})
    name = f'T{t}_zeta{zeta:g}'
    out[f'{name}_rows'] = s
    for alg_name in ('matu', 'matfl'):
      alg = algorithms.get_algorithm(alg_name, info, cfg)
      fn = jax.jit(lambda x, alg=alg: alg.server.apply(ServerState(), x)[0])
      jax.block_until_ready(fn(x))
      out[f'{name}_{alg_name}_s'] = timeit(lambda: jax.block_until_ready(fn(x)), repeats)
    print(out, flush=True)
  return out


def bench_matu_client(repeats: int = 3) -> dict:
  """MaTU's client-side unify / mask / rescale against a whole local round, on
  mini8 (`configs/matu.py:mini8,table=2`: 10 clients, ζ_t = 0.5): the round
  program as the engine runs it (training of every pair + the MaTU server), and
  `matu_math.unify` alone on the same [S, d] rows and client segments."""
  from fedjax_mtl import config_doc
  from fedjax_mtl.algorithms import matu_math
  from fedjax_mtl.manytask import engine
  from fedjax_mtl.manytask import run as many_run
  from fedjax_mtl.manytask.feed import RoundFeed
  cfg = config_doc.load_config(os.path.join(ROOT, 'configs', 'matu.py') + ':mini8,table=2')
  run = many_run.build_run(cfg)
  images, labels, _ = many_run.concat_split(run.data.train)
  feed = RoundFeed(run.setting, images, labels, 'device')
  slots = jnp.asarray(run.setting.schedule[0])
  holder = {'state': many_run.init_state(run)}

  def one_round():
    holder['state'], out = run.round_fn(holder['state'], run.backbone, slots, *feed(0))
    jax.block_until_ready(out['loss'])

  one_round()
  round_s = timeit(one_round, repeats)
  st = run.setting
  s = st.num_slots
  d = sum(int(np.prod(v.shape)) for k, v in run.trainable.items() if run.roles[k] != 'head')
  pairs = st.schedule[0]
  group = engine.client_segments(jnp.asarray(np.append(st.pairs[:, 0], -1)[pairs], jnp.int32))
  vec = jax.random.normal(jax.random.PRNGKey(0), (s, d), jnp.float32)
  valid = jnp.asarray(pairs < st.num_pairs)
  unify = jax.jit(matu_math.unify)
  jax.block_until_ready(unify(vec, group, valid))
  unify_s = timeit(lambda: jax.block_until_ready(unify(vec, group, valid)), repeats * 3)
  return {'slots': s, 'adapter_params': d, 'round_s': round_s, 'unify_s': unify_s,
          'unify_share': unify_s / round_s}


def bench_many_memory(slots=(1, 6), model: str = 'vit_b32', resolution: int = 224,
                      batch: int = 32, algorithm: str = 'fedavg') -> dict:
  """Memory of the many-task round (`fedjax_mtl/manytask`) at MaTU's scale: ViT-B/32
  at 224, LoRA rank 16 on q/v, batch 32, N = 30 clients, T = 8 tasks (mini8's
  generators at 224 stand in for the data, a few images per pair), S pairs per
  round; from XLA's memory analysis of the compiled round (nothing runs). Per S:
  argument bytes (backbone, state, data), temporaries (the S vmapped training
  steps), and their sum; `per_slot_bytes` is the growth per extra pair, from
  the two S values."""
  from fedjax_mtl.defaults import base_config
  from fedjax_mtl.manytask import run as many_run
  out = {'model': model, 'resolution': resolution, 'batch': batch}
  totals = {}
  for s in slots:
    c = base_config('mini8', algorithm)
    c.batch_size = batch
    m = c.many
    m.model, m.resolution, m.lora_rank, m.pretrained = model, resolution, 16, ''
    m.num_clients, m.zeta_t, m.participation = 30, 0.0, s / 30
    m.num_train, m.num_test = 2 * batch * 4, 8
    run = many_run.build_run(c)
    state = jax.eval_shape(lambda: many_run.init_state(run))
    images, labels, _ = many_run.concat_split(run.data.train)
    size = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
    t0 = time.perf_counter()
    rows = run.setting.index_table[run.setting.schedule[0]]
    mem = run.round_fn.lower(state, run.backbone, run.setting.schedule[0], rows, images,
                             labels).compile().memory_analysis()
    out.update({f's{s}_slots': run.setting.num_slots,
                f's{s}_backbone_bytes': size(run.backbone),
                f's{s}_state_bytes': size(state),
                f's{s}_data_bytes': images.nbytes + labels.nbytes,
                f's{s}_args_bytes': mem.argument_size_in_bytes,
                f's{s}_temp_bytes': mem.temp_size_in_bytes,
                f's{s}_compile_s': time.perf_counter() - t0})
    totals[run.setting.num_slots] = mem.argument_size_in_bytes + mem.temp_size_in_bytes
    adapters = sum(int(np.prod(v.shape)) for k, v in run.trainable.items()
                   if run.roles[k] != 'head')
    out['adapter_params'] = adapters
    print(out, flush=True)
  (s0, t0_), (s1, t1_) = sorted(totals.items())[:2]
  per = (t1_ - t0_) / (s1 - s0)
  out['per_slot_bytes'] = per
  out['fits_16gb_slots'] = int((16e9 - (t0_ - s0 * per)) // per)
  # N = 30 clients x T = 8 tasks, every pair with its own adapters (MaTU/FedPer-like
  # per-pair state), float32, next to one backbone.
  out['pairs_30x8_adapter_bytes'] = 30 * 8 * adapters * 4
  return out


def bench_ntk_alpha(repeats: int = 3, batch: int = 32, grid: int = 20, resolution: int = 224,
                    model: str = 'ViT-B-32-quickgelu', dtype=jnp.float32) -> dict:
  """The server-α grid (NTKFedAvg A.3) on one validation batch: `ntkfedavg.alpha_sweep`
  (one `jax.linearize` + one JVP, then the frozen zero-shot head per α) against
  `grid` plain forwards f(x; c + α·τ) of the CLIP tower (NTKFedAvg issue target:
  ≤ 0.5x). Both jitted; the α grid is (1 .. grid) / 4 as decision A10's."""
  from fedjax_mtl.algorithms import ntkfedavg
  from fedjax_mtl.models import vit, zeroshot
  net = vit.get_model(model, image_size=resolution, dtype=dtype)
  c = vit.init_params(net, jax.random.PRNGKey(0))
  tau = jax.tree.map(lambda p: 1e-3 * jax.random.normal(jax.random.PRNGKey(1), p.shape, p.dtype), c)
  w = jax.random.normal(jax.random.PRNGKey(2), (net.output_dim, 10))
  w = w / jnp.linalg.norm(w, axis=0, keepdims=True)
  head = lambda z: zeroshot.zeroshot_logits(z, w, jnp.log(100.))
  x = jax.random.uniform(jax.random.PRNGKey(3), (batch, resolution, resolution, 3))
  alphas = jnp.arange(1, grid + 1, dtype=jnp.float32) / 4
  apply = lambda p, x: net.apply({'params': p}, x)[0].astype(jnp.float32)
  sweep = jax.jit(lambda c, t, x: ntkfedavg.alpha_sweep(apply, c, t, x, alphas, head))
  plain = jax.jit(lambda c, t, x: jax.lax.map(
      lambda a: head(apply(jax.tree.map(lambda p, d: p + a * d, c, t), x)), alphas))
  forward = jax.jit(lambda c, x: head(apply(c, x)))
  out = {'batch': batch, 'grid': grid, 'resolution': resolution}
  for name, fn, args in (('sweep', sweep, (c, tau, x)), ('plain_grid', plain, (c, tau, x)),
                         ('one_forward', forward, (c, x))):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    out[f'{name}_first_call_s'] = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times.append(time.perf_counter() - t0)
    out[f'{name}_s'] = min(times)
  out['sweep_vs_plain_grid'] = out['sweep_s'] / out['plain_grid_s']
  out['sweep_in_forwards'] = out['sweep_s'] / out['one_forward_s']
  return out
