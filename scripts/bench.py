"""Engine benchmarks: group-step throughput, round time, compile time, peak memory,
and the vmapped group step against a Python loop over the same clients.

    python scripts/bench.py                       # synthetic default config
    python scripts/bench.py --variant=smoke --repeats=2
    python scripts/bench.py --only=pipeline       # training input pipeline alone at 512x512
    python scripts/bench.py --only=hca2           # FedHCA2 aggregation at paper scale
    python scripts/bench.py --only=swin           # Swin-T local step, 128 and 224, batch 8
    python scripts/bench.py --only=swin_memory    # Swin-T step memory at 512, fp32/bf16 x remat
    python scripts/bench.py --only=mfu            # Swin-T step at 512, batch 8, bf16: MFU (GPU)
    python scripts/bench.py --only=algorithms     # round and local step of every algorithm
    python scripts/bench.py --only=rules          # every server rule at paper scale vs a read
    python scripts/bench.py --only=engine_agg     # the round's aggregation as the engine calls it
    python scripts/bench.py --only=augment        # host augmentation vs raw feed + device augment
    python scripts/bench.py --only=top_rho        # FedDEA's top-ρ mask vs FedAvg and a sort, K = 4, 5
                                                  # (and dea_engine after it)
    python scripts/bench.py --only=dea_engine     # the engine's aggregation: FedAvg vs dea(fedavg)
    python scripts/bench.py --only=matu_server    # MaTU's server at N = 30, ViT-B/32 LoRA, vs MaT-FL
    python scripts/bench.py --only=matu_client    # MaTU's unify/mask/rescale vs a mini8 round
    python scripts/bench.py --only=memory         # one client's step memory, Swin-T and ResNet-18, 512
    python scripts/bench.py --only=gpu            # MFU and per-client memory of every paper config's
                                                  # client step on the accelerator found (bf16)
    python scripts/bench.py --only=ntk_step       # NTKFedAvg's linearised step vs the plain one
    python scripts/bench.py --only=ntk_alpha      # NTKFedAvg's server-α grid: one linearize vs 20 forwards
    python scripts/bench.py --only=scan_conv      # conv steps in one lax.scan vs one call each
    python scripts/bench.py --only=multihost      # 2 processes x 2 CPU devices vs 1 x 4: round
                                                  # time and the collectives of a round
    python scripts/bench.py --only=flower         # the smoke round in Flower's simulation engine
                                                  # vs the engine's, and where its time goes

All ratios compare measurements from one run in one process. Timings are taken
after compilation, with `block_until_ready` only at the end of each timed call.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl import cpu_isa, feeds, hostmem, local, train
from fedjax_mtl.experiment import compile_programs
from fedjax_mtl.defaults import base_config
from compare_torch import serve


def _timeit(fn, repeats):
  """Best-of-`repeats` wall time of `fn()` (which must block on its result)."""
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times)


def peak_memory_mb() -> float:
  """Peak device memory where the backend reports it, else the process's max RSS."""
  stats = jax.devices()[0].memory_stats() or {}
  if 'peak_bytes_in_use' in stats:
    return stats['peak_bytes_in_use'] / 2**20
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_engine(variant: str, repeats: int, algorithm: str = 'fedavg') -> dict:
  cfg = algorithm_config(algorithm, variant)
  exp = train.build(cfg)
  state = train.init_state(exp)
  feed = feeds.InMemoryFeed(exp)
  train_data = feed.train_data
  out = {'config': f'configs/{algorithm}.py:{variant}' if variant != 'default' else
         f'configs/{algorithm}.py', 'clients': exp.fed.num_clients}

  # Whole round: compile, then wall time per round (the feed's jitted programs).
  out['round_compile_s'] = _round_compile_s(feed, state)
  holder = {'s': state}

  def one_round():
    holder['s'], m = feed.run_round(holder['s'], 0)
    jax.block_until_ready((holder['s'], m))

  one_round()
  out['round_s'] = _timeit(one_round, repeats)

  # Group step of the largest group: vmapped vs a Python loop over its clients.
  g = max(range(len(exp.fed.groups)), key=lambda i: exp.fed.groups[i].num_real)
  spec, model = exp.fed.groups[g], exp.models_train[g]
  data = train_data[spec.dataset]['train']
  gstate = holder['s'].groups[g]
  key = jax.random.PRNGKey(0)
  rnd = jnp.int32(1)
  trainer = local.make_group_trainer(spec, model, exp.tx, cfg.optim, cfg.batch_size,
                                     cfg.num_rounds, exp.algorithm, exp.labels[g])
  vm = jax.jit(trainer)
  t0 = time.perf_counter()
  vm_c = vm.lower(gstate, data, rnd, key).compile()
  out['group_step_compile_s'] = time.perf_counter() - t0
  run_vm = lambda: jax.block_until_ready(vm_c(gstate, data, rnd, key))
  run_vm()
  out['group_vmap_s'] = _timeit(run_vm, repeats)

  # The loop: each client trained alone as its row of the group (`train.rows`: the
  # same batches, keys and steps), one program for every client.
  alone = jax.jit(trainer.rows)
  singles = [(jax.tree.map(lambda x, j=j: x[j:j + 1], gstate), local.group_rows(spec, (j,)))
             for j in range(spec.num_real)]

  def run_loop():
    res = [alone(s, data, rnd, key, rows) for s, rows in singles]
    jax.block_until_ready(res)

  run_loop()
  out['group_loop_s'] = _timeit(run_loop, repeats)
  out['vmap_speedup'] = out['group_loop_s'] / out['group_vmap_s']
  images = int(spec.local_epochs * (spec.counts[:spec.num_real] // cfg.batch_size).sum()
               * cfg.batch_size)
  out['group'] = f'{spec.dataset} ({spec.num_real} clients, {images} images/round)'
  out['group_images_per_s'] = images / out['group_vmap_s']
  out['peak_memory_mb'] = peak_memory_mb()
  return out


def paper_scale_views(num_clients: int = 6, num_decoders: int = 9) -> dict:
  """Round-start and uploaded rows at the paper's scale: N Swin-T encoders (27.5M
  parameters each) and K FedHCA2 decoders for Swin-T features (175,776 each),
  random updates of 1e-3 relative size; and the `FedInfo` of scenario 1c
  (5 single-task clients + one client holding the other K - 5 decoders)."""
  from fedjax_mtl.algorithms import FedInfo
  from fedjax_mtl.models import get_encoder
  from fedjax_mtl.models.decoder import DECODER_LAYERS, Decoder

  enc_model = get_encoder('swin_t')
  enc_shapes = jax.eval_shape(lambda: enc_model.init(
      jax.random.PRNGKey(0), jnp.zeros((1, 224, 224, 3)), train=False))['params']
  feats = [jnp.zeros((1, 56 // 2**i, 56 // 2**i, 96 * 2**i)) for i in range(4)]
  dec_shapes = jax.eval_shape(
      lambda: Decoder(96, train=True).init(jax.random.PRNGKey(0), feats))['params']

  def stacked(shapes, lead, key, scale):
    leaves, tdef = jax.tree.flatten(shapes)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(tdef, [
        scale * jax.random.normal(k, (lead,) + s.shape, jnp.float32)
        for k, s in zip(keys, leaves)])

  make = jax.jit(lambda k: (stacked(enc_shapes, num_clients, k, 1e-2),
                            stacked(dec_shapes, num_decoders, k, 1e-2)))
  enc_prev, dec_prev = make(jax.random.PRNGKey(0))
  d_enc, d_dec = make(jax.random.PRNGKey(1))
  add = jax.jit(lambda a, b: jax.tree.map(lambda x, d: x + 1e-3 * d, a, b))
  enc_local, dec_local = add(enc_prev, d_enc), add(dec_prev, d_dec)
  st = num_clients - 1
  owners = tuple(range(st)) + (st,) * (num_decoders - st)
  info = FedInfo(num_clients=num_clients, num_decoders=num_decoders, decoder_client=owners,
                 decoder_names=tuple(map(str, range(num_decoders))),
                 client_names=tuple(map(str, range(num_clients))),
                 homo_groups=tuple(range(num_clients)), decoder_layers=DECODER_LAYERS,
                 num_rounds=100,
                 client_keys=tuple(('pascal', str(c)) for c in range(num_clients)),
                 decoder_keys=tuple(('pascal', str(owners[k])) for k in range(num_decoders)))
  return {'prev': {'encoder': enc_prev, 'decoder': dec_prev},
          'local': {'encoder': enc_local, 'decoder': dec_local}, 'info': info,
          'encoder_params': sum(int(np.prod(s.shape)) for s in jax.tree.leaves(enc_shapes)),
          'decoder_params': sum(int(np.prod(s.shape)) for s in jax.tree.leaves(dec_shapes))}


def rule_runners(spec: str = 'hca2', views: dict | None = None, **blocks) -> dict:
  """One server step of algorithm `spec` at the paper's scale, compiled and warmed up.

  Times the jitted server part as the engine calls it on the shared roles'
  rows, from the second round on. `aggregate_s` allocates fresh output
  buffers on every call; `aggregate_donated_s` donates the server state and
  the uploaded rows and feeds the outputs back, as inside the engine's round
  (where the new parameters may reuse those buffers). `blocks` are config
  blocks, e.g. matfl={'mode': 'soft'}.

  Returns the two calls (`run`, `run_donated`), the compile time, the sizes
  and the bytes of the rows the rule reads.
  """
  import ml_collections
  from fedjax_mtl.algorithms import ServerInputs, ServerState, get_algorithm
  v = views or paper_scale_views()
  info = v['info']
  cfg = ml_collections.ConfigDict({k: dict(b) for k, b in blocks.items()})
  alg = get_algorithm(spec, info, cfg)
  roles = alg.shared_roles
  prev = {r: v['prev'][r] for r in roles}
  local_ = {r: v['local'][r] for r in roles}
  n = info.num_clients
  state = jax.jit(alg.server.init)(prev)
  const = dict(num_examples=jnp.full((n,), 100., jnp.float32),
               num_steps=jnp.full((n,), 125, jnp.int32), client_ids=jnp.arange(n),
               round=jnp.int32(1))
  inputs = ServerInputs(prev=prev, local=local_, **const)
  t0 = time.perf_counter()
  compiled = jax.jit(alg.server.apply).lower(state, inputs).compile()
  compile_s = time.perf_counter() - t0
  run = lambda: jax.block_until_ready(compiled(state, inputs))
  run()

  def apply_local(shared, rows, local_, prev):
    return alg.server.apply(ServerState(shared, rows), ServerInputs(prev=prev, local=local_,
                                                                     **const))

  donated = jax.jit(apply_local, donate_argnums=(0, 1, 2)).lower(
      state.shared, state.rows, local_, prev).compile()
  holder = {'args': jax.tree.map(jnp.copy, (state.shared, state.rows, local_))}

  def run_donated():
    new, st, logs = donated(*holder['args'], prev)
    jax.block_until_ready((new, st, logs))
    holder['args'] = (st.shared, st.rows, new)

  run_donated()
  read = sum(x.nbytes for t in (prev, local_) for x in jax.tree.leaves(t))
  return {'run': run, 'run_donated': run_donated, 'compile_s': compile_s,
          'num_clients': n, 'encoder_params': v['encoder_params'],
          'num_decoders': info.num_decoders, 'decoder_params': v['decoder_params'],
          'read_bytes': read, 'roles': roles}


def hca2_runners(num_clients: int = 6, num_decoders: int = 9) -> dict:
  """`rule_runners` of FedHCA2 (conflict-averse encoders, cross-attention decoders)."""
  return rule_runners('hca2', paper_scale_views(num_clients, num_decoders))


def bench_hca2(num_clients: int = 6, num_decoders: int = 9, repeats: int = 3) -> dict:
  """Times `hca2_runners` (fresh outputs and donated), best of `repeats`."""
  r = hca2_runners(num_clients, num_decoders)
  return {'num_clients': num_clients, 'encoder_params': r['encoder_params'],
          'num_decoders': num_decoders, 'decoder_params': r['decoder_params'],
          'compile_s': r['compile_s'], 'aggregate_s': _timeit(r['run'], repeats),
          'aggregate_donated_s': _timeit(r['run_donated'], repeats),
          'peak_memory_mb': peak_memory_mb()}


def algorithm_config(algorithm: str, variant: str = 'default'):
  """The config of `configs/<algorithm>.py:<variant>` (progress off)."""
  import importlib.util
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  spec = importlib.util.spec_from_file_location(
      f'cfg_{algorithm}', os.path.join(root, 'configs', f'{algorithm}.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  cfg = mod.get_config(None if variant == 'default' else variant)
  cfg.progress = False
  return cfg


def _round_compile_s(feed, state) -> float:
  """Seconds to compile a round's programs (group trainers and aggregation)."""
  jobs = [j for j in feed.programs(state) if not j[0].startswith('evaluate')]
  return sum(compile_programs(jobs).values())


def round_runner(algorithm: str = 'fedavg', variant: str = 'default'):
  """(one engine round of `configs/<algorithm>.py`, compile seconds): the in-memory
  feed's round (every group's jitted trainer, then the jitted aggregation, with their
  donation), state fed back from call to call."""
  exp = train.build(algorithm_config(algorithm, variant))
  feed = feeds.InMemoryFeed(exp)
  holder = {'s': train.init_state(exp)}
  compile_s = _round_compile_s(feed, holder['s'])

  def run():
    holder['s'], m = feed.run_round(holder['s'], 0)
    jax.block_until_ready((holder['s'], m))

  run()
  return run, compile_s


def group_step_runner(algorithm: str, variant: str = 'default'):
  """One round of local training of the largest client group (the vmapped, scanned
  step with the algorithm's client part), jitted."""
  cfg = algorithm_config(algorithm, variant)
  exp = train.build(cfg)
  state = train.init_state(exp)
  data = feeds.device_data(exp)[0]
  g = max(range(len(exp.fed.groups)), key=lambda i: exp.fed.groups[i].num_real)
  spec = exp.fed.groups[g]
  fn = jax.jit(local.make_group_trainer(spec, exp.models_train[g], exp.tx, cfg.optim,
                                        cfg.batch_size, cfg.num_rounds, exp.algorithm,
                                        exp.labels[g])).lower(
      state.groups[g], data[spec.dataset]['train'], jnp.int32(1),
      jax.random.PRNGKey(0)).compile()
  run = lambda: jax.block_until_ready(fn(state.groups[g], data[spec.dataset]['train'],
                                         jnp.int32(1), jax.random.PRNGKey(0)))
  run()
  return run


ALGORITHMS = ('local', 'fedavg', 'fedprox', 'fedper', 'ditto', 'fedamp', 'fedbabu', 'fedsta',
              'matfl', 'hca2')


def bench_algorithms(variant: str = 'default', repeats: int = 3,
                     names: tuple[str, ...] = ALGORITHMS) -> dict:
  """Round time of every algorithm on one config (compiled round, best of `repeats`), and
  its largest group's local training alone; ratios against FedAvg."""
  out = {}
  for name in names:
    run, compile_s = round_runner(name, variant)
    out[f'{name}_round_s'] = _timeit(run, repeats)
    out[f'{name}_compile_s'] = compile_s
    out[f'{name}_group_step_s'] = _timeit(group_step_runner(name, variant), repeats)
  if 'fedavg' in names:
    for name in names:
      out[f'{name}_round_vs_fedavg'] = out[f'{name}_round_s'] / out['fedavg_round_s']
      out[f'{name}_step_vs_fedavg'] = out[f'{name}_group_step_s'] / out['fedavg_group_step_s']
  return out


# Server rules timed at the paper's scale (`--only=rules`): name -> (spec, config blocks).
RULES = {
    'fedavg': ('fedavg', {}),
    'fedper (encoders only)': ('fedper', {}),
    'fedamp': ('fedamp', {}),
    'fedsta': ('fedsta', {}),
    'matfl hard': ('matfl', {'matfl': {'mode': 'hard', 'num_clusters': 2, 'th': 0.0}}),
    'matfl soft': ('matfl', {'matfl': {'mode': 'soft', 'num_clusters': 2, 'th': 0.0}}),
    'momentum(fedavg)': ('momentum(fedavg)', {}),
    'dea(fedavg) rho=0.3': ('dea(fedavg)', {'dea': {'rho': 0.3, 'variant': 'top',
                                                    'rescale': True, 'server_lr': 1.0}}),
    'hca2': ('hca2', {}),
}


def read_floor_s(views: dict, roles, repeats: int = 3) -> float:
  """Seconds of one XLA read of the rows a rule must read: sum(local - prev) per leaf."""
  prev = {r: views['prev'][r] for r in roles}
  local_ = {r: views['local'][r] for r in roles}
  f = jax.jit(lambda a, b: sum(jnp.sum(x - y) for x, y in zip(jax.tree.leaves(a),
                                                               jax.tree.leaves(b))))
  f(local_, prev).block_until_ready()
  return _timeit(lambda: f(local_, prev).block_until_ready(), repeats)


def bench_rules(repeats: int = 3, names=None) -> dict:
  """Every server rule at Swin-T scale (N = 6, K = 9), donated as in the round, against
  the time of one read of its inputs."""
  views = paper_scale_views()
  out = {}
  for name in names or RULES:
    spec, blocks = RULES[name]
    r = rule_runners(spec, views, **blocks)
    t = _timeit(r['run_donated'], repeats)
    floor = read_floor_s(views, r['roles'], repeats)
    out[f'{name}: donated_s'] = t
    out[f'{name}: read_floor_s'] = floor
    out[f'{name}: vs_floor'] = t / floor
    out[f'{name}: read_GB'] = r['read_bytes'] / 1e9
    print(f'{name:24s} {t:.3f} s donated, read floor {floor:.3f} s ({t / floor:.1f}x), '
          f"compile {r['compile_s']:.1f} s", flush=True)
    del r
  return out


SCENARIOS = {'1c': 'pascal_st_nyud_mt_1c', '2c': 'pascal_st_nyud_mt_2c',
             '4c': 'pascal_st_nyud_mt_4c'}


def agg_inputs(cfg) -> tuple:
  """What the engine's aggregation program takes, for `cfg`: (experiment, round-0
  state without optimizer states (the aggregation program never sees them; they
  stay in the groups), its params as the round start (`rounds.round_start`, as
  the engine keeps it), trained params = start + 1e-3 noise, per-group metrics
  of 10 steps at loss 1)."""
  from fedjax_mtl import rounds
  exp = train.build(cfg)
  state = train.init_state(exp)
  state = state.replace(groups=[gs.replace(opt_state=None) for gs in state.groups])
  params = [gs.params for gs in state.groups]
  start = rounds.round_start(exp, params)
  move = jax.jit(lambda p, k: jax.tree.map(
      lambda x: x + 1e-3 * jax.random.normal(k, x.shape, x.dtype), p))
  trained = [move(p, jax.random.PRNGKey(g)) for g, p in enumerate(params)]
  metrics = [{'loss': jnp.ones((g.num_total, g.num_slots), jnp.float32),
              'steps': jnp.full((g.num_total,), 10, jnp.int32)} for g in exp.fed.groups]
  return exp, state, start, trained, metrics


def engine_agg_runners(scenario: str = '1c', algorithm: str = 'hca2',
                       encoder: str = 'swin_t') -> dict:
  """The engine's per-round aggregation at the paper's model scale, as the engine calls it.

  Builds `configs/<algorithm>.py` on scenario `scenario` with the Swin-T encoder
  (tiny synthetic data: the aggregation does not depend on it), makes the
  round-0 state and a trained state (every client's params moved by 1e-3
  noise), then returns:
  - `in_memory` / `streamed`: one call of the feed's jitted aggregation
    (`rounds.make_agg_fn`: finalize, gather from the client groups, the rule,
    scatter back, donation of the trained state), output fed back as the next
    trained state, round-start params fixed;
  - `rule`: the rule alone on the same rows pre-stacked (`rule_runners`,
    donated);
  - `floor`: one XLA read of the rows (`read_floor_s`).
  """
  from fedjax_mtl import experiment, rounds
  cfg = algorithm_config(algorithm)
  cfg.scenario = SCENARIOS[scenario]
  cfg.model.encoder = encoder
  cfg.model.remat = False
  cfg.data.num_train = {'pascal': 1600, 'nyud': 64}
  cfg.data.num_test = {'pascal': 2, 'nyud': 2}
  exp, state, start, trained_params, metrics = agg_inputs(cfg)
  accs = [{'loss_sum': m['loss'] * 10., 'steps': m['steps']} for m in metrics]
  metrics, accs = jax.device_put((metrics, accs), exp.client_sharding)
  roles = exp.algorithm.shared_roles
  views = {'prev': {r: experiment.views(exp, rounds.expand_start(exp, start), r)
                    for r in roles},
           'local': {r: experiment.views(exp, trained_params, r) for r in roles},
           'info': experiment.fed_info(exp.fed, cfg.num_rounds), 'encoder_params': 0,
           'decoder_params': 0}
  # One trained state for both feeds' programs (each call's output is the next
  # call's trained state): at 24 Swin-T clients a second copy would not fit.
  holder = {'s': state.replace(groups=[gs.replace(params=p) for gs, p in
                                       zip(state.groups, trained_params)])}
  del trained_params

  def runner(fn, extra):
    t0 = time.perf_counter()
    compiled = fn.lower(rounds.agg_core(holder['s']), [gs.params for gs in holder['s'].groups],
                        start, extra).compile()
    compile_s = time.perf_counter() - t0

    def run():
      holder['s'], out = rounds.aggregate(compiled, holder['s'], start, extra)
      jax.block_until_ready((holder['s'], out))

    run()
    return run, compile_s, compiled

  in_memory, mem_compile, compiled = runner(rounds.make_agg_fn(exp), metrics)
  streamed, str_compile, _ = runner(rounds.make_agg_fn(exp, streamed=True), accs)
  mem = compiled.memory_analysis()
  rule = rule_runners(algorithm, views, **({algorithm: cfg[algorithm].to_dict()}
                                           if algorithm in cfg else {}))
  return {'in_memory': in_memory, 'streamed': streamed, 'rule': rule['run_donated'],
          'floor': lambda: read_floor_s(views, roles, 1), 'views': views, 'roles': roles,
          'num_clients': exp.fed.num_clients, 'num_decoders': exp.fed.num_decoders,
          'compile_s': mem_compile, 'streamed_compile_s': str_compile,
          'rule_compile_s': rule['compile_s'], 'read_bytes': rule['read_bytes'],
          'temp_bytes': getattr(mem, 'temp_size_in_bytes', float('nan'))}


def bench_engine_agg(scenarios=('1c', '4c'), repeats: int = 3, algorithm: str = 'hca2') -> dict:
  """`engine_agg_runners` per scenario: the engine's aggregation (in-memory and streamed
  feeds) against the rule alone on pre-stacked rows and a read of the rows; calls
  alternate between the three, best of `repeats`."""
  import resource
  out = {}
  for sc in scenarios:
    r = engine_agg_runners(sc, algorithm)
    times = {'in_memory': [], 'streamed': [], 'rule': []}
    faults = {k: [] for k in times}
    for _ in range(repeats):
      for k in times:
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        r[k]()
        times[k].append(time.perf_counter() - t0)
        faults[k].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    floor = min(read_floor_s(r['views'], r['roles'], 1) for _ in range(repeats))
    res = {k + '_s': min(v) for k, v in times.items()}
    res.update({k + '_faults': min(v) for k, v in faults.items()})
    res.update(clients=r['num_clients'], decoders=r['num_decoders'], read_floor_s=floor,
               read_GB=r['read_bytes'] / 1e9, temp_GB=r['temp_bytes'] / 1e9,
               compile_s=r['compile_s'], streamed_compile_s=r['streamed_compile_s'],
               rule_compile_s=r['rule_compile_s'])
    res['in_memory_vs_rule'] = res['in_memory_s'] / res['rule_s']
    res['streamed_vs_rule'] = res['streamed_s'] / res['rule_s']
    print(f"{sc}: N={res['clients']} K={res['decoders']} engine agg in-memory "
          f"{res['in_memory_s']:.3f} s, streamed {res['streamed_s']:.3f} s, rule alone "
          f"{res['rule_s']:.3f} s, read floor {floor:.3f} s; compile {res['compile_s']:.1f} s",
          flush=True)
    out[sc] = res
    del r
  return out


def _swin_task(encoder: str, dtype=jnp.float32, remat: bool = False):
  """(init, loss_fn, step) of a local step: `encoder` + one decoder/head (21 classes), AdamW."""
  import optax
  from fedjax_mtl.models import get_encoder
  from fedjax_mtl.models.multitask import MultiTaskNet
  model = MultiTaskNet(get_encoder(encoder, dtype=dtype, remat=remat), (21,), train=True,
                       dtype=dtype)
  tx = optax.adamw(1e-4)

  def init(key, x):
    variables = model.init({'params': key, 'dropout': key}, x[:1])
    return variables['params'], variables['batch_stats'], tx.init(variables['params'])

  def loss_fn(params, bs, x, y, key):
    out, st = model.apply({'params': params, 'batch_stats': bs}, x, rngs={'dropout': key},
                          mutable=['batch_stats'])
    return optax.softmax_cross_entropy_with_integer_labels(out[0], y).mean(), st

  def step(params, bs, opt, x, y, key):
    (loss, st), g = jax.value_and_grad(loss_fn, has_aux=True)(params, bs, x, y, key)
    upd, opt = tx.update(g, opt, params)
    return optax.apply_updates(params, upd), st['batch_stats'], opt, loss

  return init, loss_fn, step


def _abstract_step(encoder: str, resolution: int, batch: int, dtype=jnp.float32,
                   remat: bool = False):
  """(loss_fn, step, args) of `_swin_task`, with args (params, batch_stats, opt_state, x,
  y, key) as shapes: for lowering without allocating."""
  init, loss_fn, step = _swin_task(encoder, dtype, remat)
  x = jax.ShapeDtypeStruct((batch, resolution, resolution, 3), jnp.float32)
  y = jax.ShapeDtypeStruct((batch, resolution, resolution), jnp.int32)
  key = jax.random.PRNGKey(1)
  return loss_fn, step, (*jax.eval_shape(init, key, x), x, y, key)


def swin_step_runner(resolution: int, batch: int = 8, encoder: str = 'swin_t',
                     dtype=jnp.float32, remat: bool = False):
  """(run, compile_s): one compiled, warmed-up local training step of `_swin_task`."""
  from fedjax_mtl.experiment import KEEP_REMAT_ON_CPU
  init, _, step = _swin_task(encoder, dtype, remat)
  x = jnp.zeros((batch, resolution, resolution, 3), jnp.float32)
  y = jnp.zeros((batch, resolution, resolution), jnp.int32)
  args = list(jax.jit(init)(jax.random.PRNGKey(0), x))
  f = jax.jit(step, donate_argnums=(0, 1, 2))
  options = KEEP_REMAT_ON_CPU if remat and jax.default_backend() == 'cpu' else None
  t0 = time.perf_counter()
  c = f.lower(*args, x, y, jax.random.PRNGKey(1)).compile(compiler_options=options)
  compile_s = time.perf_counter() - t0

  def run():
    args[0], args[1], args[2], loss = c(*args, x, y, jax.random.PRNGKey(1))
    jax.block_until_ready(loss)

  run()
  return run, compile_s


from bench_steps import PEAK_BF16_FLOPS, peak_flops  # noqa: E402  (bf16 peak by device kind)


def model_flops(resolution: int, batch: int = 8, encoder: str = 'swin_t') -> float:
  """FLOPs of one local training step (`_swin_task`: forward + backward + AdamW), from
  XLA's cost analysis of the float32 step without remat (recomputation is not model work)."""
  _, step, args = _abstract_step(encoder, resolution, batch)
  cost = jax.jit(step).lower(*args).cost_analysis()
  return float((cost[0] if isinstance(cost, (list, tuple)) else cost)['flops'])


def bench_mfu(resolution: int = 512, batch: int = 8, encoder: str = 'swin_t',
              dtype: str = 'bfloat16', remat: bool = False, repeats: int = 3,
              peak_tflops: float = 0.0) -> dict:
  """Model FLOPs utilisation of one client's local step: model FLOPs per second over the
  device's peak (`PEAK_BF16_FLOPS` by device kind, or `peak_tflops`; none on CPU)."""
  flops = model_flops(resolution, batch, encoder)
  run, compile_s = swin_step_runner(resolution, batch, encoder, jnp.dtype(dtype), remat)
  dt = _timeit(run, repeats)
  peak = peak_flops(peak_tflops)
  return {'encoder': encoder, 'resolution': resolution, 'batch': batch, 'dtype': dtype,
          'remat': remat, 'compile_s': compile_s, 'model_tflop_per_step': flops / 1e12,
          'step_s': dt, 'images_per_s': batch / dt, 'achieved_tflops': flops / dt / 1e12,
          'peak_tflops': peak / 1e12, 'mfu': flops / dt / peak if peak else float('nan'),
          'peak_memory_mb': peak_memory_mb()}


def bench_swin_step(resolution: int, batch: int = 8, repeats: int = 3,
                    encoder: str = 'swin_t') -> dict:
  """Local training step (forward + backward + AdamW) of `encoder` + one decoder/head."""
  run, compile_s = swin_step_runner(resolution, batch, encoder)
  dt = _timeit(run, repeats)
  return {'resolution': resolution, 'batch': batch, 'compile_s': compile_s, 'step_s': dt,
          'images_per_s': batch / dt}


def bench_swin_memory(resolution: int = 512, batch: int = 8, encoder: str = 'swin_t') -> dict:
  """Memory of one client's local step (as `bench_swin_step`), fp32/bf16 x remat; nothing runs.

  Per variant, in GiB:
  * `activations`: the values JAX keeps for the backward pass (the memory remat
    trades for recompute), summed over the step's saved residuals minus its
    arguments. Backend-independent.
  * `temp` (and `args`, `outputs`): XLA's buffer assignment of the compiled
    step, `jit(step).lower(...).compile().memory_analysis()`: peak temporary
    memory on top of the donated params/optimizer state. Compiled with the
    `cse_barrier_expander` pass disabled: XLA:CPU otherwise drops the
    optimization barriers of `jax.checkpoint` before CSE, which folds the
    recomputation back into the forward pass (remat is a no-op on CPU; GPU and
    TPU keep the barriers). XLA:CPU computes bf16 through float32 copies, so
    its bf16 `temp` overstates an accelerator's; `activations` does not.
  """
  from jax._src.ad_checkpoint import saved_residuals
  from fedjax_mtl.experiment import KEEP_REMAT_ON_CPU
  out = {'encoder': encoder, 'resolution': resolution, 'batch': batch}
  for dtype in (jnp.float32, jnp.bfloat16):
    for remat in (False, True):
      loss_fn, step, args = _abstract_step(encoder, resolution, batch, dtype, remat)
      key = args[-1]
      res = saved_residuals(lambda *a: loss_fn(*a, key)[0], *args[:2], *args[3:5])
      activations = sum(a.size * a.dtype.itemsize for a, src in res
                        if not src.startswith('from the argument'))
      mem = jax.jit(step, donate_argnums=(0, 1, 2)).lower(*args).compile(
          compiler_options=KEEP_REMAT_ON_CPU).memory_analysis()
      name = f'{jnp.dtype(dtype).name}{"_remat" if remat else ""}'
      out.update({f'{name}_activations_gib': activations / 2**30,
                  f'{name}_temp_gib': mem.temp_size_in_bytes / 2**30,
                  f'{name}_args_gib': mem.argument_size_in_bytes / 2**30,
                  f'{name}_outputs_gib': mem.output_size_in_bytes / 2**30})
  return out



def bench_top_rho(repeats: int = 3, clients=(4, 5), rho: float = 0.25,
                  baselines=('sort',)) -> dict:
  """FedDEA's exact top-ρ mask over each client's update of the unified Swin-T model
  (the encoder plus K decoders and heads, ≈ 28.3 M values at K = 4), all clients in
  one jitted call, against a FedAvg aggregation of the same update and a full sort
  (`algorithms.topk.bench_top_rho`; normal values with a log-uniform scale per leaf)."""
  from fedjax_mtl.algorithms import topk
  from fedjax_mtl.models import get_encoder
  from fedjax_mtl.models.multitask import MultiTaskNet
  model = MultiTaskNet(get_encoder('swin_t'), (40,))
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                             jnp.zeros((1, 64, 64, 3))))['params']
  size = lambda t: [int(np.prod(x.shape)) for x in jax.tree.leaves(t)]
  task = size({k: v for k, v in shapes.items() if k != 'encoder'})
  out = {}
  for k in clients:
    r = topk.bench_top_rho(k, size(shapes['encoder']) + task * k, repeats, rho, baselines)
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
        fresh = jax.block_until_ready(feeds.copy_tree(base))
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
  from fedjax_mtl import experiment, feeds, rounds
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
      exp = train.build(cfg)
      k = exp.fed.num_clients
      state = experiment.init_state(exp, abstract=True)
      for layout, e in (('one', exp),
                        ('per_row', dataclasses.replace(exp, start_axes=None, compiled={}))):
        feed_data = feeds.device_data(e)[0]
        params = [gs.params for gs in state.groups]
        start = rounds.abstract_round_start(e, params)
        fn = rounds.make_train_fns(e)[0]
        t0 = time.perf_counter()
        mem = fn.lower(state.groups[0], start[0], feed_data[ds]['train'], state.round,
                       state.rng, rounds.num_rounds(e)).compile().memory_analysis()
        compile_s = time.perf_counter() - t0
        metrics = feeds.with_sharding(jax.eval_shape(
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


def vit_lora_runner(batch: int = 32, resolution: int = 224, rank: int = 16):
  """(run, step): one training step of LoRA (rank 16 on q/v) + a 10-class head on a
  frozen ViT-B/32 at 224, batch 32, AdamW, as one (client, task) pair of the
  many-task round trains (`manytask.model.make_forward`, `local.sgd_step`);
  params and optimizer state donated, one call per step."""
  import ml_collections
  from fedjax_mtl.local import sgd_step, make_optimizer
  from fedjax_mtl.manytask import model as many_model
  from fedjax_mtl.models import vit
  cfg = ml_collections.ConfigDict({'model': 'vit_b32', 'resolution': resolution,
                                   'lora_rank': rank, 'lora_alpha': 0.0, 'lora_seed': 0})
  model = many_model.make_model(cfg, 10)
  backbone, trainable = many_model.split(vit.init_params(model, jax.random.PRNGKey(0)))
  forward = many_model.make_forward(model, np.array([10]))
  optim = ml_collections.ConfigDict({'weight_decay': 0.0, 'b1': 0.9, 'b2': 0.999, 'eps': 1e-8})
  tx = make_optimizer(optim)

  def step(params, opt, backbone, images, labels):
    loss, grads = jax.value_and_grad(
        lambda p: many_model.cross_entropy(forward(backbone, p, images, 0), labels))(params)
    return sgd_step(tx, 1e-3, grads, opt, params, None) + (loss,)

  fn = jax.jit(step, donate_argnums=(0, 1))
  key = jax.random.PRNGKey(1)
  images = jax.random.randint(key, (batch, resolution, resolution, 3), 0, 256).astype(jnp.uint8)
  labels = jax.random.randint(key, (batch,), 0, 10)
  holder = {'p': trainable, 'o': tx.init(trainable)}

  def run():
    holder['p'], holder['o'], loss = fn(holder['p'], holder['o'], backbone, images, labels)
    jax.block_until_ready(loss)

  run()
  return run, fn


def bench_vit_lora(repeats: int = 3) -> dict:
  run, _ = vit_lora_runner()
  best = _timeit(run, repeats)
  return {'step_s': best, 'images_per_s': 32 / best}


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
  from fedjax_mtl.data import many_task
  trainable, roles = _adapter_views()
  out = {'adapter_params': sum(int(np.prod(v.shape)) for v in trainable.values())}
  for t, zeta in settings:
    a = many_task.assign_tasks(num_clients, t, zeta, seed=0)
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
      out[f'{name}_{alg_name}_s'] = _timeit(lambda: jax.block_until_ready(fn(x)), repeats)
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
  cfg = config_doc.load_config('configs/matu.py:mini8,table=2')
  run = many_run.build(cfg)
  images, labels, _ = many_run.concat_split(run.data.train)
  feed = RoundFeed(run.setting, images, labels, 'device')
  slots = jnp.asarray(run.setting.schedule[0])
  holder = {'state': many_run.init_state(run)}

  def one_round():
    holder['state'], out = run.round_fn(holder['state'], run.backbone, slots, *feed(0))
    jax.block_until_ready(out['loss'])

  one_round()
  round_s = _timeit(one_round, repeats)
  st = run.setting
  s = st.num_slots
  d = sum(int(np.prod(v.shape)) for k, v in run.trainable.items() if run.roles[k] != 'head')
  pairs = st.schedule[0]
  group = engine.client_segments(jnp.asarray(np.append(st.pairs[:, 0], -1)[pairs], jnp.int32))
  vec = jax.random.normal(jax.random.PRNGKey(0), (s, d), jnp.float32)
  valid = jnp.asarray(pairs < st.num_pairs)
  unify = jax.jit(matu_math.unify)
  jax.block_until_ready(unify(vec, group, valid))
  unify_s = _timeit(lambda: jax.block_until_ready(unify(vec, group, valid)), repeats * 3)
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
    run = many_run.build(c)
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


def bench_pipeline(num_chunks: int = 4, batch: int = 8, size: int = 512,
                   workers: int = 2) -> dict:
  """Training input pipeline alone: the engine's chunk source at `size`², all PASCAL tasks.

  One client of in-memory PASCAL-sized samples (375×500, 5 tasks) through
  `data.real.TrainChunks` (scale, crop with cat_max_ratio, flip, photometric
  distortion, normalise, pad, ignore regions, stacking): images per CPU second
  in this process (workers=0), and images per wall second with `workers`
  grain processes.
  """
  from fedjax_mtl.data import pipeline, real
  from fedjax_mtl.data import transforms as T
  source = pipeline.synthetic_pascal_source(16, (375, 500), 0)
  n = num_chunks * 2 * batch
  spec = real.GroupFeedSpec(dataset='pascal', client_ids=(0,), num_total=1, counts=(n,),
                            epochs=1, batch_size=batch, chunk_steps=2,
                            keys=('semseg', 'human_parts', 'sal', 'normals', 'edge'))
  client = [source[i % len(source)] for i in range(n)]
  chunks = real.TrainChunks([spec], [[client]], 2,
                            {'pascal': (size, size)}, 0,
                            {'pascal': T.train_transforms((size, size))})
  chunks[0]  # warm-up (first allocations)
  c0 = time.process_time()
  for i in range(num_chunks):
    chunks[num_chunks + i]
  per_cpu = n / (time.process_time() - c0)
  t0 = time.perf_counter()
  count = sum(int(el['mask'].sum()) * batch
              for el in real.iterate(chunks, 0, workers=workers))
  return {'size': size, 'batch': batch, 'images_per_cpu_s': per_cpu,
          f'images_per_s_{workers}_workers': count / (time.perf_counter() - t0),
          'cpu_count': os.cpu_count()}


class _SyntheticReader:
  """In-memory samples with the reader interface `data.cache.build_cache` reads."""
  dataset_name, split = 'pascal', 'train'

  def __init__(self, samples, tasks):
    self.samples, self.tasks = samples, tuple(tasks)
    self.ids = [f'{i:06d}' for i in range(len(samples))]

  def __len__(self):
    return len(self.samples)

  def image_size(self, i):
    return self.samples[i]['image'].shape[:2]

  def __getitem__(self, i):
    return self.samples[i]


class _Cycle:
  """`source` repeated to `n` samples."""

  def __init__(self, source, n):
    self.source, self.n = source, n

  def __len__(self):
    return self.n

  def __getitem__(self, i):
    return self.source[int(i) % len(self.source)]


def bench_augment(num_chunks: int = 3, batch: int = 8, size: int = 512,
                  raw_size: tuple[int, int] = (500, 500), repeats: int = 3,
                  target_mfu: float = 0.4, peak_flops: float = PEAK_BF16_FLOPS['H100']) -> dict:
  """Host augmentation against host decode+batch plus device augmentation (data.augment).

  One client of PASCAL-sized samples (375x500, all five tasks) through
  `data.real.TrainChunks` at `size`², batch `batch`, 2 steps per chunk, read from a
  memory-mapped cache of them (`data.cache`, as a run reads; normals decoded) and, for
  reference, from memory:
  * host: the transforms in the chunk source (today's path), images per CPU second;
  * raw: the same chunks with augment='device' (samples placed un-augmented in a
    `raw_size` canvas, PASCAL's largest image), images per CPU second;
  * device: the jitted `device_augment` function on such a raw chunk, images per wall
    second on this backend (all its cores).
  Host cores to feed one H100 at `target_mfu`: H100 images/s from the Swin-T train step's
  model FLOPs at `size` (`model_flops`, dense bf16 peak) over each path's per-core rate
  (from the cache).
  """
  import tempfile
  from fedjax_mtl.data import cache as cache_lib
  from fedjax_mtl.data import device_augment as DA
  from fedjax_mtl.data import pipeline, real
  from fedjax_mtl.data import transforms as T
  keys = ('semseg', 'human_parts', 'sal', 'normals', 'edge')
  samples = pipeline.synthetic_pascal_source(16, (375, 500), 0)
  n = (num_chunks + 1) * 2 * batch
  spec = real.GroupFeedSpec(dataset='pascal', client_ids=(0,), num_total=1, counts=(n,),
                            epochs=1, batch_size=batch, chunk_steps=2, keys=keys)
  ts = {'pascal': T.train_transforms((size, size))}
  out = {'size': size, 'batch': batch, 'raw_canvas': 'x'.join(map(str, raw_size))}

  def per_cpu_s(chunks):
    chunks[0]  # warm-up (first allocations, page cache)
    c0 = time.process_time()
    for i in range(1, num_chunks + 1):
      chunks[i]
    return num_chunks * 2 * batch / (time.process_time() - c0)

  with tempfile.TemporaryDirectory() as tmp:
    cached = cache_lib.CachedDataset(cache_lib.build_cache(
        _SyntheticReader(samples, keys), os.path.join(tmp, 'pascal_train')))
    for name, source in (('', cached), ('in_memory_', samples)):
      client = [_Cycle(source, n)]
      out[f'{name}host_augment_images_per_cpu_s'] = per_cpu_s(
          real.TrainChunks([spec], [client], 1, {'pascal': (size, size)}, 0, ts))
      raw = real.TrainChunks([spec], [client], 1, {'pascal': (size, size)}, 0, ts,
                             augment='device', raw_size_of={'pascal': raw_size})
      out[f'{name}raw_feed_images_per_cpu_s'] = per_cpu_s(raw)
  out['raw_feed_ms_per_image'] = 1e3 / out['raw_feed_images_per_cpu_s']
  x = jax.device_put({k[2:]: v for k, v in raw[0].items() if k.startswith('x/')})
  augment = DA.make_chunk_augmenter(DA.config_from_transforms(ts['pascal']), 0)
  t0 = time.perf_counter()
  jax.block_until_ready(augment(x))
  out['device_augment_compile_s'] = time.perf_counter() - t0
  dt = _timeit(lambda: jax.block_until_ready(augment(x)), repeats)
  out['device_augment_images_per_s'] = 2 * batch / dt
  out['device_augment_backend'] = jax.devices()[0].device_kind
  with jax.enable_x64(True):  # XLA's estimate (the crop-retry loop body counted once)
    cost = augment.jitted.lower(x).cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  out['device_augment_mflop_per_image'] = cost['flops'] / (2 * batch) / 1e6
  flops = model_flops(size, batch)  # one Swin-T train step (forward + backward + AdamW)
  gpu = target_mfu * peak_flops / (flops / batch)
  out['swin_t_gflop_per_train_image'] = flops / batch / 1e9
  out[f'h100_images_per_s_at_{target_mfu:.0%}_mfu'] = gpu
  out['host_cores_per_h100_host_augment'] = gpu / out['host_augment_images_per_cpu_s']
  out['host_cores_per_h100_device_augment'] = gpu / out['raw_feed_images_per_cpu_s']
  out['cpu_count'] = os.cpu_count()
  return out


def bench_multihost(rounds: int = 5, algorithm: str = 'hca2') -> dict:
  """The smoke config for `rounds` rounds as two processes with 2 CPU devices each
  (127.0.0.1, one shared workdir) and as one process with 4: the median round time
  without evaluation (rounds 2..rounds-1; round 1 and the last are left out), and the
  collectives in the round's programs (`round_collectives`, 4 devices)."""
  import socket
  import subprocess
  import tempfile
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  flags = os.environ.get('XLA_FLAGS', '')
  cmd = [sys.executable, '-m', 'fedjax_mtl.main', f'--config=configs/{algorithm}.py:smoke',
         f'--config.num_rounds={rounds}', f'--config.eval_every={rounds}',
         '--config.progress=false']

  def run(n_proc, devices, wd):
    with socket.socket() as sock:
      sock.bind(('127.0.0.1', 0))
      port = sock.getsockname()[1]
    procs = []
    for i in range(n_proc):
      env = dict(os.environ, XLA_FLAGS=f'{flags} --xla_force_host_platform_device_count='
                 f'{devices}')
      if n_proc > 1:
        env.update(JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', JAX_NUM_PROCESSES=str(n_proc),
                   JAX_PROCESS_ID=str(i))
      procs.append(subprocess.Popen(cmd + [f'--workdir={wd}'], cwd=root, env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for p in procs:
      _, err = p.communicate()
      if p.returncode:
        raise RuntimeError(f'{n_proc}-process run failed: {err[-2000:]}')
    with open(os.path.join(wd, 'timing.jsonl')) as f:
      rows = [json.loads(line) for line in f]
    steady = [r['seconds'] for r in rows if 1 < r.get('round', 0) < rounds and 'seconds' in r]
    return float(np.median(steady))

  out = {}
  with tempfile.TemporaryDirectory() as tmp:
    run(1, 4, os.path.join(tmp, 'warm'))  # fills the compilation cache for process 0
    out['one_process_4dev_round_s'] = run(1, 4, os.path.join(tmp, 'one'))
    out['two_processes_2dev_round_s'] = run(2, 2, os.path.join(tmp, 'two'))
    out['round_time_ratio'] = out['two_processes_2dev_round_s'] / out['one_process_4dev_round_s']
    probe = subprocess.run(
        [sys.executable, '-c', 'import json, sys; sys.path.insert(0, "scripts"); import bench; '
         f'print(json.dumps(bench.round_collectives({algorithm!r})))'],
        cwd=root, capture_output=True, text=True,
        env=dict(os.environ, XLA_FLAGS=f'{flags} --xla_force_host_platform_device_count=4'))
    if probe.returncode:
      raise RuntimeError(probe.stderr[-2000:])
    out.update(json.loads(probe.stdout.strip().splitlines()[-1]))
  return out


def bench_flower(rounds: int = 7, algorithm: str = 'hca2', workers: int | None = None) -> dict:
  """The smoke config for `rounds` rounds in the engine (one process, every client
  group one jitted call) and in Flower's simulation engine (`fedjax_mtl.flower`: one
  ClientApp call per client in `workers` Ray workers, the server rule jitted in this
  process): median round time of rounds 2..rounds-1 (no evaluation), and where the
  Flower round's time goes: building the messages, waiting for the clients (their
  decode + local round, and Flower's transport), aggregating (decoding the uploads and
  the rule); the clients' own seconds; the array bytes each way."""
  import tempfile
  from fedjax_mtl.flower import simulate
  workers = workers or os.cpu_count() or 1
  cfg = algorithm_config(algorithm, 'smoke')
  # Neither run evaluates or checkpoints in the timed rounds (a Flower run keeps no
  # checkpoints; its evaluation is a separate message round).
  cfg.num_rounds, cfg.eval_every, cfg.checkpoint_every, cfg.progress = rounds, rounds, rounds, False
  steady = lambda rows: [r for r in rows if 1 < r['round'] < rounds]
  out = {}
  with tempfile.TemporaryDirectory() as tmp:
    train.train_and_evaluate(cfg, os.path.join(tmp, 'engine'))
    with open(os.path.join(tmp, 'engine', 'timing.jsonl')) as f:
      rows = [json.loads(line) for line in f]
    out['engine_round_s'] = float(np.median([r['seconds'] for r in steady(
        [r for r in rows if 'seconds' in r])]))
    strategy = simulate.simulate(cfg, os.path.join(tmp, 'flower'), num_workers=workers)
  t = steady(strategy.timing)
  med = lambda k: float(np.median([r[k] for r in t]))
  out['flower_round_s'] = med('messages') + med('clients') + med('aggregate')
  out['round_time_ratio'] = out['flower_round_s'] / out['engine_round_s']
  out['flower_messages_s'] = med('messages')
  out['flower_wait_for_clients_s'] = med('clients')
  out['flower_aggregate_s'] = med('aggregate')
  out['client_local_round_s'] = float(np.median([x for r in t for x in r['client_train']]))
  out['client_seconds_per_worker'] = float(np.median([sum(r['client_train']) for r in t])) / \
      min(workers, strategy.exp.fed.num_clients)
  out['transport_and_scheduling_s'] = med('clients') - out['client_seconds_per_worker']
  out['mb_down'] = med('bytes_down') / 1e6
  out['mb_up'] = med('bytes_up') / 1e6
  out['workers'] = workers
  out['clients'] = strategy.exp.fed.num_clients
  return out


def round_collectives(algorithm: str = 'hca2') -> dict:
  """The cross-device collectives in the compiled programs of one smoke round on every
  visible device (4 in `bench_multihost`): per program, their count and result bytes;
  and the bytes that cross processes when the devices are split over 2 processes
  (`distributed.collective_bytes`)."""
  from fedjax_mtl import distributed
  cfg = algorithm_config(algorithm, 'smoke')
  exp = train.build(cfg)
  feed = feeds.make_feed(exp)
  out = {'devices': jax.device_count()}
  total = 0
  for name, fn, args in feed.programs(train.init_state(exp, abstract=True)):
    ops = distributed.collective_bytes(fn.lower(*args).compile().as_text())
    key = name.replace(' ', '_')
    out[f'{key}_collectives'] = len(ops)
    out[f'{key}_result_bytes'] = sum(b for _, b in ops)
    if name != 'evaluate':  # a round: training and aggregation
      total += sum(b for _, b in ops)
  # An all-gather or all-reduce over D devices split evenly over P processes hands each
  # process the (P-1)/P of the result that the other processes hold.
  out['round_bytes_crossing_per_process_2proc'] = total // 2
  feed.close()
  return out


def _jsonl_log(path: str):
  """A logger that prints each workload's result as it comes and, with --json, also
  appends it to `<json>.jsonl` (partial results survive a run cut short)."""
  def log(line: str):
    print(line, flush=True)
    if path:
      with open(path + '.jsonl', 'a') as f:
        f.write(json.dumps({'line': line, 'time': time.time()}) + '\n')
  return log


SERVE = {
    'fedavg_round': lambda: round_runner('fedavg')[0],
    'swin_t_128': lambda: swin_step_runner(128)[0],
    'swin_t_224': lambda: swin_step_runner(224)[0],
    'hca2': lambda: hca2_runners()['run_donated'],
    'vit_lora': lambda: vit_lora_runner()[0],
}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--variant', default='default',
                 help='config variant of the engine and algorithm benchmarks: default, smoke '
                      'or paper (default: %(default)s)')
  p.add_argument('--repeats', type=int, default=3,
                 help='timed calls per measurement after compilation; the best is reported '
                      '(default: %(default)s)')
  p.add_argument('--only', default='all',
                 choices=['engine', 'hca2', 'swin', 'swin_memory', 'pipeline', 'mfu',
                          'algorithms', 'rules', 'engine_agg', 'augment', 'top_rho', 'dea_engine',
                          'memory', 'unified_memory', 'many_memory', 'vit_lora', 'matu_server',
                          'matu_client', 'gpu', 'ntk_step', 'ntk_alpha', 'scan_conv', 'multihost',
                          'flower', 'all'],
                 help='one benchmark (see the list above); all = engine, pipeline, hca2 and '
                      'swin (default: %(default)s)')
  p.add_argument('--algorithms', default=','.join(ALGORITHMS),
                 help='--only=algorithms: comma-separated algorithm configs to time '
                      '(default: %(default)s)')
  p.add_argument('--rules', default='',
                 help='--only=rules: comma-separated server rules to time, of: '
                      + ', '.join(RULES).replace('%', '%%') + ' (default: all)')
  p.add_argument('--scenarios', default='1c,4c',
                 help='--only=engine_agg: comma-separated scenarios of 1c, 2c, 4c '
                      '(default: %(default)s)')
  p.add_argument('--mfu_resolution', type=int, default=512,
                 help='--only=mfu: input height and width of the Swin-T step '
                      '(default: %(default)s)')
  p.add_argument('--mfu_dtype', default='bfloat16', choices=['bfloat16', 'float32'],
                 help='--only=mfu: compute dtype of the step (default: %(default)s)')
  p.add_argument('--mfu_remat', action='store_true',
                 help='--only=mfu: recompute activations in the backward pass '
                      '(jax.checkpoint) instead of storing them')
  p.add_argument('--peak_tflops', type=float, default=0.0,
                 help="--only=mfu: the device's peak TFLOP/s that MFU divides by (default: "
                      "the bf16 peak of a known accelerator: H100, H200, A100; none on CPU)")
  p.add_argument('--gpu_scale', type=float, default=1.0,
                 help='--only=gpu / ntk_step: scale of the paper resolutions (e.g. 0.125 for a '
                      'CPU dry run; default: %(default)s)')
  p.add_argument('--gpu_rows', default='',
                 help='--only=gpu: comma-separated workloads of fedhca2_swin_t, ntk_a_deeplab, '
                      'ntk_a_deeplab_linear, ntk_b_clip, ntk_b_clip_linear, many_vit_b32_lora, '
                      'feddea_resnet18 (default: all)')
  p.add_argument('--json', default='', help='also write the results to this JSON file')
  p.add_argument('--reuse_host_memory', action=argparse.BooleanOptionalAction, default=True,
                 help='keep freed host memory mapped on CPU-only runs (fedjax_mtl.hostmem), '
                      'as fedjax_mtl.main does by default')
  p.add_argument('--cpu_isa', default='AVX2', choices=cpu_isa.ISAS,
                 help="cap XLA:CPU's code generation (fedjax_mtl.cpu_isa), as fedjax_mtl.main "
                      "does by default; 'native': the host's widest vector instructions")
  p.add_argument('--serve', default='', choices=['', *SERVE],
                 help='build one workload, then time one call per stdin line '
                      '(for scripts/compare_torch.py); empty: benchmark as --only says')
  a = p.parse_args(argv)
  # Before anything runs on a backend.
  reuse = a.reuse_host_memory and hostmem.reuse_freed_memory()
  cpu_isa.pin(a.cpu_isa)
  if a.serve:
    serve(SERVE[a.serve])
    return {}
  dev = jax.devices()[0]
  results = {'device': f'{dev.platform}:{dev.device_kind}', 'num_devices': jax.device_count(),
             'jax': jax.__version__, 'python': platform.python_version(),
             'reuse_host_memory': reuse}
  if a.only in ('engine', 'all'):
    results['engine'] = bench_engine(a.variant, a.repeats)
  if a.only in ('pipeline', 'all'):
    results['pipeline'] = bench_pipeline()
  if a.only in ('hca2', 'all'):
    results['hca2'] = bench_hca2(repeats=a.repeats)
  if a.only in ('swin', 'all'):
    for res in (128, 224):
      results[f'swin_t_{res}'] = bench_swin_step(res, repeats=a.repeats)
  if a.only == 'algorithms':  # not in 'all': one round compile per algorithm
    results['algorithms'] = bench_algorithms(a.variant, a.repeats,
                                             tuple(a.algorithms.split(',')))
  if a.only == 'rules':  # not in 'all': nine compiles at Swin-T scale
    results['rules'] = bench_rules(a.repeats, a.rules.split(',') if a.rules else None)
  if a.only == 'engine_agg':  # not in 'all': Swin-T federations of 6 and 24 clients
    results['engine_agg'] = bench_engine_agg(tuple(a.scenarios.split(',')), a.repeats)
  if a.only == 'swin_memory':  # not in 'all': four compiles at 512x512
    results['swin_memory'] = bench_swin_memory()
  if a.only == 'mfu':  # not in 'all': a 512x512 step is for accelerators
    results['mfu'] = bench_mfu(a.mfu_resolution, dtype=a.mfu_dtype, remat=a.mfu_remat,
                               repeats=a.repeats, peak_tflops=a.peak_tflops)
  if a.only == 'top_rho':  # not in 'all': the sort baseline takes minutes on a CPU
    results['top_rho'] = bench_top_rho(a.repeats)
  if a.only in ('top_rho', 'dea_engine'):  # the aggregation the engine runs around the mask
    results['dea_engine'] = bench_dea_engine(repeats=max(a.repeats, 5))
  if a.only == 'memory':  # not in 'all': compiles of Swin-T and ResNet-18 steps at 512x512
    results['memory'] = {f'{e}_{k}': v for e in ('swin_t', 'resnet18')
                         for k, v in bench_swin_memory(encoder=e).items()}
  if a.only == 'vit_lora':  # not in 'all': a ViT-B/32 step at 224
    results['vit_lora'] = bench_vit_lora(a.repeats)
  if a.only == 'matu_server':  # not in 'all': paper-scale adapter rows (up to 0.5 GB)
    results['matu_server'] = bench_matu_server()
  if a.only == 'matu_client':  # not in 'all': a mini8 round
    results['matu_client'] = bench_matu_client()
  if a.only == 'many_memory':  # not in 'all': compiles of ViT-B/32 rounds at 224
    results['many_memory'] = bench_many_memory()
  if a.only == 'unified_memory':  # not in 'all': Swin-T / ResNet-18 rounds at the paper's sizes
    results['unified_memory'] = bench_unified_memory()
  if a.only == 'augment':  # not in 'all': lowers a Swin-T step at 512x512 for its FLOPs
    results['augment'] = bench_augment(repeats=a.repeats)
  if a.only == 'scan_conv':  # not in 'all': a diagnosis of XLA:CPU
    import bench_steps
    results['scan_conv'] = bench_steps.bench_scan_conv(a.repeats)
  if a.only == 'ntk_alpha':  # not in 'all': CLIP ViT-B/32 forwards at 224
    import bench_steps
    results['ntk_alpha'] = bench_steps.bench_ntk_alpha(a.repeats)
  if a.only == 'multihost':  # not in 'all': five runs of the smoke config in subprocesses
    results['multihost'] = bench_multihost()
  if a.only == 'flower':  # not in 'all': needs the flower extra; starts Ray
    results['flower'] = bench_flower()
  if a.only in ('gpu', 'ntk_step'):  # not in 'all': paper-size steps are for accelerators
    import bench_steps
    log = _jsonl_log(a.json)
    if a.only == 'gpu':
      results['gpu'] = bench_steps.bench_gpu(a.repeats, a.peak_tflops, log, a.gpu_scale,
                                             tuple(filter(None, a.gpu_rows.split(','))))
    else:
      res = lambda n: bench_steps.scaled(n, a.gpu_scale)
      results['ntk_step'] = bench_steps.bench_ntk_step(
          a.repeats, deeplab=(res(512), 16), clip=(res(224), 32), log=log)
  print(f"reuse_host_memory{'':17s} {reuse}")
  for part in ('engine', 'pipeline', 'hca2', 'swin_t_128', 'swin_t_224', 'swin_memory', 'mfu',
               'algorithms', 'rules', 'engine_agg', 'augment', 'top_rho', 'dea_engine',
               'memory', 'unified_memory', 'many_memory', 'vit_lora', 'matu_server',
               'matu_client', 'gpu', 'ntk_step', 'ntk_alpha', 'scan_conv', 'multihost',
               'flower'):
    for k, v in results.get(part, {}).items():
      print(f'{part}.{k:24s} {v:.3f}' if isinstance(v, float) else f'{part}.{k:24s} {v}')
  if a.json:
    with open(a.json, 'w') as f:
      json.dump(results, f, indent=2)
  return results


if __name__ == '__main__':
  main(sys.argv[1:])
