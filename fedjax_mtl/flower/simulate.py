"""A run in Flower's simulation engine: the `ServerApp` in this process, one virtual
SuperNode per client, `ClientApp`s in Ray workers; either setting (dense, or
many-task with one node per many-task client).

    python -m fedjax_mtl.flower --config=configs/hca2.py:smoke --workdir=runs/flower

takes the same `--config` and `--config.<field>=<value>` overrides as
`python -m fedjax_mtl.main`, and writes the engine's `metrics.jsonl` and
results tables into `--workdir`.
"""

from __future__ import annotations

import contextlib
import os
import time

import numpy as np

from fedjax_mtl.errors import ConfigError
from fedjax_mtl.flower import runtime


def backend_config(num_workers: int | None = None) -> dict:
  """Ray backend settings: one CPU per ClientApp worker, `num_workers` workers (all
  cores by default); on a GPU, workers share it (`num_gpus` per client = 1/workers)."""
  import jax
  cpus = num_workers or os.cpu_count() or 1
  gpus = 1.0 / cpus if jax.default_backend() == 'gpu' else 0.0
  return {'client_resources': {'num_cpus': 1, 'num_gpus': gpus},
          'init_args': {'num_cpus': cpus, 'num_gpus': 1 if gpus else 0,
                        'include_dashboard': False, 'logging_level': 'error',
                        'log_to_driver': False}}


def simulate(config, workdir: str | None = None, num_workers: int | None = None,
             client_config=None, timeout: float = 3600.0):
  """Run `config` in Flower's simulation engine; returns the strategy
  (`server.EngineStrategy`, its `views`: the aggregated rows; or
  `many_task.ManyTaskStrategy`, its `state`: the engine's `ManyState`; both:
  `records`, the metrics rows; `timing`, where each round's time went).

  `client_config`: the clients' config when it should differ from the server's
  (a test of the refusal). ConfigError for what the adapter cannot run, and for any
  failure reported by a client or the server.
  """
  runtime.check(config)  # refuses what the adapter cannot run, before Ray starts
  from fedjax_mtl.flower import server
  with contextlib.ExitStack() as hold:
    if workdir:  # locked before Ray starts, until the run's files are written
      server.claim_workdir(workdir, hold)
    return _simulate(config, workdir, num_workers, client_config)


def _simulate(config, workdir, num_workers, client_config):
  # Worker processes inherit the environment: share the compilation cache, and keep
  # JAX from reserving most of a GPU's memory in every worker.
  import jax
  cache = jax.config.jax_compilation_cache_dir
  if cache:
    os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', cache)
  os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
  from flwr.simulation import run_simulation

  from fedjax_mtl.flower import client, server
  holder: dict = {}
  server_app = server.make_server_app(config, workdir, holder)
  client_app = client.make_client_app(client_config if client_config is not None else config)
  n = runtime.num_clients(config)
  run_simulation(server_app=server_app, client_app=client_app, num_supernodes=n,
                 backend_config=backend_config(num_workers))
  if 'error' in holder:
    e = holder['error']
    raise e if isinstance(e, ConfigError) else ConfigError(f'the Flower run failed: {e}')
  if 'strategy' not in holder:
    raise ConfigError('the Flower run ended before its server started (see the log above)')
  strategy = holder['strategy']
  if len(strategy.timing) < config.num_rounds:
    raise ConfigError(f'the Flower run stopped after {len(strategy.timing)} of '
                      f'{config.num_rounds} rounds (see the log above)')
  return strategy


def in_process(config, workdir: str | None = None, client_config=None):
  """The Flower run's message contents without Flower: the strategy and every client
  in this process, one after the other (what each node would compute, for debugging
  a config before a deployment and for tests), after the handshake every node
  answers (`client.check_run`; `client_config`: the clients' config when it should
  differ from the server's). Returns the strategy (`simulate`)."""
  from fedjax_mtl.flower import client, codec, server
  fields = codec.shared_fields(config)
  errors = []
  for c in range(runtime.num_clients(config)):
    try:
      client.check_run(config if client_config is None else client_config, c, fields)
    except ConfigError as e:
      errors.append(str(e))
  if errors:  # as `nodes.NodeStrategy.handshake` reports them
    raise ConfigError('clients refused the run: ' + '; '.join(errors))
  with contextlib.ExitStack() as hold:
    if workdir:
      server.claim_workdir(workdir, hold)
    if runtime.is_many_task(config):
      strategy = _many_task_in_process(config)
    else:
      strategy = _dense_in_process(config)
    if workdir:
      strategy.write(workdir)
  return strategy


def _many_task_in_process(config):
  from fedjax_mtl.flower import many_task
  strategy = many_task.ManyTaskStrategy(config)
  rt = many_task.client_runtime(config)
  for rnd in range(1, config.num_rounds + 1):
    contents = strategy.train_contents(rnd)
    strategy.aggregate(rnd, {c: many_task.train_reply(rt, c, content)
                             for c, content in sorted(contents.items())})
    if strategy.evaluates(rnd):
      strategy.evaluate_round(rnd)
  return strategy


def _dense_in_process(config):
  from fedjax_mtl.flower import client, server
  strategy = server.EngineStrategy(config)
  rt = client.client_runtime(config)
  n = strategy.exp.fed.num_clients
  kept = {c: None for c in range(n)}
  for rnd in range(1, config.num_rounds + 1):
    t0, on = time.perf_counter(), strategy.participants(rnd)
    contents = {c: strategy.client_content(c, rnd) for c in np.flatnonzero(on).tolist()}
    strategy.note_sent(t0, on, list(contents.values()))
    replies = {}
    for c, content in contents.items():
      kept[c], replies[c] = client.train_reply(rt, c, kept[c], content)
    strategy.aggregate(rnd, replies)
    if strategy.evaluates(rnd):
      strategy.collect_eval(rnd, {c: client.evaluate_reply(rt, c, kept[c],
                                                           strategy.client_content(c, rnd))
                                  for c in range(n)})
  return strategy
