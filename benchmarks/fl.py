"""The federated-learning essentials: what a wrapper adds to the engine's aggregation,
and what a round costs when only some clients take part.

- `bench_wrappers`: the engine's aggregation program (`rounds.make_agg_fn`: finalize,
  gather from the client groups, the rule, scatter back, donation) of FedAvg with
  Swin-T clients of the 1c layout (N = 6) against the same program with each
  wrapper around FedAvg (`quantize`, `dp` clipping and noise, `sparsify`, `dea`),
  calls alternating, best of `repeats`; ratios in one process.
- `bench_participation`: the dense engine's round (`DenseEngine.run_round`, local
  training and aggregation, as the run loop calls it) of the synthetic default
  config on the 4c layout (24 clients) at participation 1, 0.5 and 0.1: the mean
  over `repeats` rounds after the first (which compiles), since rounds draw clients
  of other groups and costs.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from benchmarks.common import algorithm_config

# Wrapped specs timed against FedAvg, with their blocks' values.
WRAPPERS = {
    'quantize(fedavg) 8 bits': ('quantize(fedavg)', {'quantize.bits': 8}),
    'quantize(fedavg) 8 bits, error log': ('quantize(fedavg)', {'quantize.bits': 8,
                                                                'quantize.log_error': True}),
    'dp(fedavg) clipping only': ('dp(fedavg)', {'dp.clip_norm': 1.0,
                                                'dp.noise_multiplier': 0.0}),
    'dp(fedavg) clip + noise': ('dp(fedavg)', {'dp.clip_norm': 1.0, 'dp.noise_multiplier': 1.0}),
    'sparsify(fedavg) 10 %': ('sparsify(fedavg)', {'sparsify.fraction': 0.1}),
    'dea(fedavg) rho 0.25': ('dea(fedavg)', {'dea.rho': 0.25}),
}


def _config(spec: str, values: dict, scenario: str, encoder: str):
  """configs/fedavg.py with `spec` as the algorithm (its blocks added) on `scenario`."""
  from fedjax_mtl import defaults
  cfg = algorithm_config('fedavg')
  cfg.algorithm = spec
  defaults.add_blocks(cfg, spec)
  for k, v in values.items():
    block, field = k.split('.')
    cfg[block][field] = v
  cfg.scenario = scenario
  cfg.model.encoder = encoder
  cfg.model.remat = False
  return cfg


def _agg_runner(cfg):
  """One warmed-up call of `cfg`'s engine aggregation on a trained state
  (`engine.agg_runner`, on `engine.agg_inputs`)."""
  from benchmarks.engine import agg_inputs, agg_runner
  from fedjax_mtl import rounds
  exp, state, start, trained, metrics = agg_inputs(cfg)
  metrics = jax.device_put(metrics, exp.client_sharding)
  holder = {'s': state.replace(groups=[gs.replace(params=p) for gs, p in
                                       zip(state.groups, trained)])}
  del trained
  return agg_runner(rounds.make_agg_fn(exp), holder, start, metrics)[0]


def bench_wrappers(repeats: int = 3, scenario: str = 'pascal_st_nyud_mt_1c',
                   encoder: str = 'swin_t') -> dict:
  """Each wrapper's engine aggregation against FedAvg's, at Swin-T scale (module doc)."""
  runs = {'fedavg': _agg_runner(_config('fedavg', {}, scenario, encoder))}
  for name, (spec, values) in WRAPPERS.items():
    runs[name] = _agg_runner(_config(spec, values, scenario, encoder))
  times = {k: [] for k in runs}
  for _ in range(repeats):
    for k, run in runs.items():
      t0 = time.perf_counter()
      run()
      times[k].append(time.perf_counter() - t0)
  base = min(times['fedavg'])
  out = {'fedavg_s': base}
  print(f'engine aggregation, {encoder} clients of {scenario}: fedavg {base:.3f} s', flush=True)
  for k in WRAPPERS:
    t = min(times[k])
    out[f'{k}: s'] = t
    out[f'{k}: vs_fedavg'] = t / base
    print(f'  {k:28s} {t:.3f} s ({t / base:.2f}x fedavg)', flush=True)
  return out


def bench_participation(repeats: int = 3, fractions=(1.0, 0.5, 0.1),
                        scenario: str = 'pascal_st_nyud_mt_4c') -> dict:
  """The engine's round at each participation fraction (module doc): seconds, and the
  ratio to the full round."""
  from fedjax_mtl import experiment
  from fedjax_mtl.engines.dense import DenseEngine
  out = {}
  for p in fractions:
    cfg = algorithm_config('fedavg')
    cfg.scenario = scenario
    cfg.participation = p
    exp = experiment.build(cfg)
    eng = DenseEngine(exp, cfg)
    eng.open(0)
    state = eng.init_state()
    # As the run loop does: every program a round can call compiles first (a sampled
    # group's program for each number of participants it can get).
    experiment.compile_programs(eng.programs_to_compile(state))
    state, _ = eng.run_round(state, 1)
    jax.block_until_ready(state)
    times = []
    for r in range(repeats):
      t0 = time.perf_counter()
      state, o = eng.run_round(state, r + 2)
      jax.block_until_ready((state, o))
      times.append(time.perf_counter() - t0)
    eng.close()
    slots = eng.sampler.total
    # Rounds draw other groups' clients (a NYUD client costs more than a PASCAL one):
    # the mean over the rounds is what a run pays.
    out[f'participation {p:g}: round_s'] = float(np.mean(times))
    out[f'participation {p:g}: round_s_min_max'] = (min(times), max(times))
    out[f'participation {p:g}: clients'] = slots
    print(f'participation {p:g}: {slots} of {exp.fed.num_clients} clients a round, '
          f'{np.mean(times):.3f} s a round (mean of {repeats}; {min(times):.3f}-'
          f'{max(times):.3f})', flush=True)
  full = out[f'participation {fractions[0]:g}: round_s']
  for p in fractions:
    out[f'participation {p:g}: vs_full'] = out[f'participation {p:g}: round_s'] / full
  return out
