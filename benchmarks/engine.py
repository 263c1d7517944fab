"""Engine benchmarks: a round of the engine (compile, wall time, the vmapped group
step against a Python loop over its clients), every algorithm's round and local step,
the round's aggregation as the engine calls it, and a round's cross-device collectives.

`--only=engine`, `--only=algorithms`, `--only=engine_agg`; `round_collectives` is
what `--only=multihost` reads in a 4-device subprocess.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from benchmarks.common import algorithm_config, peak_memory_mb, timeit
from benchmarks.rules import read_floor_s, rule_runners
from fedjax_mtl import experiment, local_training, sources
from fedjax_mtl.engines.dense import DenseEngine
from fedjax_mtl.experiment import compile_programs


def _round_compile_s(engine: DenseEngine, state) -> float:
  """Seconds to compile a round's programs (group trainers and aggregation)."""
  jobs = [j for j in engine.programs_to_compile(state)
          if not j[0].startswith('evaluate')]
  return sum(compile_programs(jobs).values())


def bench_engine(variant: str, repeats: int, algorithm: str = 'fedavg') -> dict:
  cfg = algorithm_config(algorithm, variant)
  exp = experiment.build(cfg)
  state = experiment.init_state(exp)
  feed = DenseEngine(exp)
  feed.open(0)
  train_data = feed.source.train
  out = {'config': f'configs/{algorithm}.py:{variant}' if variant != 'default' else
         f'configs/{algorithm}.py', 'clients': exp.fed.num_clients}

  # Whole round: compile, then wall time per round (the feed's jitted programs).
  out['round_compile_s'] = _round_compile_s(feed, state)
  holder = {'s': state}

  def one_round():
    holder['s'], m = feed.run_round(holder['s'], 0)
    jax.block_until_ready((holder['s'], m))

  one_round()
  out['round_s'] = timeit(one_round, repeats)

  # Group step of the largest group: vmapped vs a Python loop over its clients.
  g = max(range(len(exp.fed.groups)), key=lambda i: exp.fed.groups[i].num_real)
  spec, model = exp.fed.groups[g], exp.models_train[g]
  data = train_data[spec.dataset]['train']
  gstate = holder['s'].groups[g]
  key = jax.random.PRNGKey(0)
  rnd = jnp.int32(1)
  trainer = local_training.make_group_trainer(spec, model, exp.tx, cfg.optim, cfg.batch_size,
                                     cfg.num_rounds, exp.algorithm, exp.labels[g])
  vm = jax.jit(trainer)
  t0 = time.perf_counter()
  vm_c = vm.lower(gstate, data, rnd, key).compile()
  out['group_step_compile_s'] = time.perf_counter() - t0
  run_vm = lambda: jax.block_until_ready(vm_c(gstate, data, rnd, key))
  run_vm()
  out['group_vmap_s'] = timeit(run_vm, repeats)

  # The loop: each client trained alone as its row of the group (`train.rows`: the
  # same batches, keys and steps), one program for every client.
  alone = jax.jit(trainer.rows)
  singles = [(jax.tree.map(lambda x, j=j: x[j:j + 1], gstate), local_training.group_rows(spec, (j,)))
             for j in range(spec.num_real)]

  def run_loop():
    res = [alone(s, data, rnd, key, rows) for s, rows in singles]
    jax.block_until_ready(res)

  run_loop()
  out['group_loop_s'] = timeit(run_loop, repeats)
  out['vmap_speedup'] = out['group_loop_s'] / out['group_vmap_s']
  images = int(spec.local_epochs * (spec.counts[:spec.num_real] // cfg.batch_size).sum()
               * cfg.batch_size)
  out['group'] = f'{spec.dataset} ({spec.num_real} clients, {images} images/round)'
  out['group_images_per_s'] = images / out['group_vmap_s']
  out['peak_memory_mb'] = peak_memory_mb()
  return out


def round_runner(algorithm: str = 'fedavg', variant: str = 'default'):
  """(one engine round of `configs/<algorithm>.py`, compile seconds): the in-memory
  feed's round (every group's jitted trainer, then the jitted aggregation, with their
  donation), state fed back from call to call."""
  exp = experiment.build(algorithm_config(algorithm, variant))
  feed = DenseEngine(exp)
  feed.open(0)
  holder = {'s': experiment.init_state(exp)}
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
  exp = experiment.build(cfg)
  state = experiment.init_state(exp)
  data = sources.device_data(exp)[0]
  g = max(range(len(exp.fed.groups)), key=lambda i: exp.fed.groups[i].num_real)
  spec = exp.fed.groups[g]
  fn = jax.jit(local_training.make_group_trainer(spec, exp.models_train[g], exp.tx, cfg.optim,
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
    out[f'{name}_round_s'] = timeit(run, repeats)
    out[f'{name}_compile_s'] = compile_s
    out[f'{name}_group_step_s'] = timeit(group_step_runner(name, variant), repeats)
  if 'fedavg' in names:
    for name in names:
      out[f'{name}_round_vs_fedavg'] = out[f'{name}_round_s'] / out['fedavg_round_s']
      out[f'{name}_step_vs_fedavg'] = out[f'{name}_group_step_s'] / out['fedavg_group_step_s']
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
  from fedjax_mtl.engines.dense import programs as dense_programs
  exp = experiment.build(cfg)
  state = experiment.init_state(exp)
  state = state.replace(groups=[gs.replace(opt_state=None) for gs in state.groups])
  params = [gs.params for gs in state.groups]
  start = rounds.round_start(dense_programs(exp).round_start, params)
  move = jax.jit(lambda p, k: jax.tree.map(
      lambda x: x + 1e-3 * jax.random.normal(k, x.shape, x.dtype), p))
  trained = [move(p, jax.random.PRNGKey(g)) for g, p in enumerate(params)]
  metrics = [{'loss': jnp.ones((g.num_total, g.num_slots), jnp.float32),
              'steps': jnp.full((g.num_total,), 10, jnp.int32)} for g in exp.fed.groups]
  return exp, state, start, trained, metrics


def agg_runner(fn, holder: dict, start: list, extra: list):
  """(run, compile seconds, executable) of the engine's aggregation program `fn`
  (`rounds.make_agg_fn`) compiled for the trained state `holder['s']`: each `run()` is
  one warmed-up call as the engine makes it (`rounds.aggregate`, donation included),
  its output fed back as the next trained state, the round start fixed."""
  from fedjax_mtl import rounds
  t0 = time.perf_counter()
  compiled = fn.lower(rounds.agg_core(holder['s']), [gs.params for gs in holder['s'].groups],
                      start, extra).compile()
  compile_s = time.perf_counter() - t0

  def run():
    holder['s'], out = rounds.aggregate(compiled, holder['s'], start, extra)
    jax.block_until_ready((holder['s'], out))

  run()
  return run, compile_s, compiled


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

  in_memory, mem_compile, compiled = agg_runner(rounds.make_agg_fn(exp), holder, start, metrics)
  streamed, str_compile, _ = agg_runner(rounds.make_agg_fn(exp, streamed=True), holder, start,
                                        accs)
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


def round_collectives(algorithm: str = 'hca2') -> dict:
  """The cross-device collectives in the compiled programs of one smoke round on every
  visible device (4 in `bench_multihost`): per program, their count and result bytes;
  and the bytes that cross processes when the devices are split over 2 processes
  (`distributed.collective_bytes`)."""
  from fedjax_mtl import distributed
  cfg = algorithm_config(algorithm, 'smoke')
  exp = experiment.build(cfg)
  feed = DenseEngine(exp)
  feed.open(0)
  out = {'devices': jax.device_count()}
  total = 0
  for name, fn, args in feed.programs_to_compile(experiment.init_state(exp, abstract=True)):
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
