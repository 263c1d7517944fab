"""Building an experiment: config -> federation, models, algorithm, mesh; round-0 state.

Everything here is static for a run (nothing is written to disk): the client
groups, the Flax models, the optimizer, the algorithm with the role labels of
every parameter, and the device mesh. `build` caches one experiment per config
(ignoring logging and checkpoint cadence), so running the same config again in
one process (a notebook, a resumed run, tests) reuses its compiled functions.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedjax_mtl import algorithms, distributed, federation, local_training, scenarios
from fedjax_mtl.workdir import run_fields
from fedjax_mtl.algorithms import plugin_math
from fedjax_mtl.algorithms.base import ServerState
from fedjax_mtl import data as data_lib
from fedjax_mtl.data import synthetic
from fedjax_mtl.errors import ConfigError, check_choice
from fedjax_mtl.models import get_encoder
from fedjax_mtl.models.decoder import DECODER_LAYERS
from fedjax_mtl.models.deeplab import DeepLabNet
from fedjax_mtl.models.multitask import DECODERS, MultiTaskNet, param_roles
from fedjax_mtl.state import FedState, GroupState

PyTree = Any
DATA_SOURCES = ('synthetic', 'real')
# XLA:CPU's `cse_barrier_expander` pass drops the optimisation barriers that
# `jax.checkpoint` places around the recomputed forward, and CSE then merges the
# recomputation back into the forward pass: remat would change nothing.
# Compiling with this option keeps it (and the barrier `local_training.map_clients`
# needs). GPU and TPU keep the barriers on their own.
KEEP_REMAT_ON_CPU = {'xla_disable_hlo_passes': 'cse_barrier_expander'}


@dataclasses.dataclass(frozen=True, eq=False)
class Experiment:
  """Everything static about a run."""
  config: ml_collections.ConfigDict
  fed: federation.Federation
  data: dict  # synthetic arrays per dataset and split ({} on real data)
  mesh: Mesh
  encoder: Any
  models_train: list
  models_eval: list
  tx: Any
  algorithm: algorithms.Algorithm
  labels: list  # per group: the role of every parameter leaf (one client's structure)
  # Per group, per leaf: None where every client starts each round from the same
  # values (one row of the round start is kept, `rounds.round_start`), else 0;
  # None for the whole list when no leaf is (a row per client).
  start_axes: list | None = None

  @property
  def streamed(self) -> bool:
    return self.config.data.source == 'real'

  @property
  def client_sharding(self) -> NamedSharding:
    return NamedSharding(self.mesh, P('clients'))

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, P())

  @functools.cached_property
  def init_program(self) -> InitProgram:
    """The round-0 state program, built once: `compile_programs` and `init_state`
    share its executables."""
    return InitProgram(self)


def per_experiment(make, keep: int = 2):
  """`make(exp)` computed once per experiment, for the `keep` experiments used last
  (`build` keeps one alive; a test may hold a second, e.g. a variant of the first)."""
  last: list = []  # (experiment, result), the newest last

  @functools.wraps(make)
  def get(exp: Experiment):
    for i, (e, result) in enumerate(last):
      if e is exp:
        last.append(last.pop(i))
        return result
    del last[:max(0, len(last) - keep + 1)]  # old results go before the new one is made
    last.append((exp, make(exp)))
    return last[-1][1]

  return get


@functools.lru_cache(maxsize=8)
def _synthetic(domain, split, n, resolution, seed, version):
  return synthetic.generate(domain, split, n, resolution, seed, version=version)


def datasets(config) -> list[str]:
  """The datasets the scenario's clients use."""
  return sorted({b[0] for b in scenarios.layout(config.scenario)})


def load_data(config) -> dict[str, dict[str, dict[str, np.ndarray]]]:
  """Synthetic train/test arrays per dataset used by the scenario."""
  out = {}
  for d in datasets(config):
    res = tuple(config.data.resolution[d])
    out[d] = {split: _synthetic(d, split, int(config.data[f'num_{split}'][d]), res,
                                int(config.data.seed),
                                int(config.data.get('synthetic_version', synthetic.VERSION)))
              for split in ('train', 'test')}
  return out


_BUILT: dict[str, Experiment] = {}


def build(config) -> Experiment:
  """Validate the config and build the (static) experiment; writes nothing.

  Cached per config (at most one experiment's buffers stay alive).
  """
  # A sweep's replicas share the experiment of one run (`engines.replicas`), on the
  # mesh of their device groups.
  key = run_fields(config, keep=('data.data_dir', 'data.cache_dir'))
  key.pop('sweep', None)
  key = json.dumps([key, replica_shards(config)], sort_keys=True)
  if key not in _BUILT:
    _BUILT.clear()
    _BUILT[key] = _build(config)
  return _BUILT[key]


def replica_shards(config) -> int:
  """The device groups a sweep's replicas are sharded over (`config.sweep`, the mesh's
  `replicas` axis): the largest count dividing both the replicas and the devices, so
  that each group runs whole federations; 1 for one run."""
  from fedjax_mtl import validate
  swept = validate.sweep_of(config)
  if swept is None:
    return 1
  devices = int(config.get('num_devices', 0)) or jax.device_count()
  return math.gcd(swept.size, devices)


def fed_info(fed: federation.Federation, num_rounds: int,
             norm_modules: frozenset = frozenset(), config=None) -> algorithms.FedInfo:
  """The static facts the algorithm sees (`config`: its participation, if any)."""
  from fedjax_mtl import participation
  sampled = 0
  if config is not None and participation.is_partial(config):
    sampled = participation.total(config.participation, fed.num_clients)  # (checks it)
  return algorithms.FedInfo(num_participants=sampled,
      num_clients=fed.num_clients, num_decoders=fed.num_decoders,
      decoder_client=fed.decoder_client, decoder_names=fed.decoder_names,
      client_names=tuple(c.name for c in fed.clients), homo_groups=fed.homo_groups,
      decoder_layers=DECODER_LAYERS, num_rounds=num_rounds,
      client_keys=tuple((c.dataset, '+'.join(c.tasks)) for c in fed.clients),
      decoder_keys=tuple((c.dataset, t) for c in fed.clients for t in c.tasks),
      norm_modules=norm_modules)


def _build(config) -> Experiment:
  algorithms.check(config.algorithm)
  check_choice('data source', config.data.source, DATA_SOURCES)
  check_choice('data.augment', config.data.get('augment', 'host'), data_lib.AUGMENT_MODES)
  scenarios.layout(config.scenario)
  model_kw = {k: v for k, v in config.model.get('kwargs', {}).items()}
  if config.model.get('dtype', 'float32') not in ('float32', 'bfloat16'):
    raise ConfigError(f"unknown model dtype {config.model.dtype!r}; valid choices: "
                      "'float32', 'bfloat16'")
  dtype = jnp.dtype(config.model.get('dtype', 'float32'))
  model_kw['remat'] = remat(config)
  encoder = get_encoder(config.model.encoder, dtype=dtype, **model_kw)
  if config.data.source == 'real':
    from fedjax_mtl.data import real  # grain and scipy: imported for real data only
    data = {}
    num_train = {d: len(real.open_split(config, d, 'train', tasks=()))
                 for d in datasets(config)}
    parts_filter = real.parts_filter(config)
    attribute = real.semseg_attribute(config)
  else:
    data = load_data(config)
    num_train = {d: len(v['train']['image']) for d, v in data.items()}
    parts_filter = scenarios.label_parts_filter({d: v['train'] for d, v in data.items()})
    attribute = scenarios.label_attribute({d: v['train'] for d, v in data.items()})
  clients = scenarios.build_clients(config, num_train, parts_filter=parts_filter,
                                    attribute=attribute)
  if config.get('split', 'equal') == 'dirichlet' and distributed.is_primary():
    # What each client got (the metadata row is the engine's): count, top class share.
    print(f'split=dirichlet (split_alpha={config.split_alpha:g}, split_seed='
          f'{config.split_seed}): ' + scenarios.split_summary(clients, attribute),
          file=sys.stderr, flush=True)
  mesh = distributed.client_mesh(config, replica_shards(config))
  fed = federation.build_federation(clients, mesh.shape['clients'])
  models_train = [dense_model(config, encoder, g.head_channels, dtype) for g in fed.groups]
  models_eval = [m.clone(train=False) for m in models_train]
  labels, norm_modules = [], set()
  for g, m in zip(fed.groups, models_train):
    h, w = config.data.resolution[g.dataset]
    shapes = jax.eval_shape(lambda m=m: m.init(jax.random.PRNGKey(0), jnp.zeros((1, h, w, 3))))
    labels.append(param_roles(shapes['params']))
    norm_modules |= plugin_math.norm_modules(shapes.get('batch_stats', {}))
  alg = algorithms.get_algorithm(config.algorithm, fed_info(fed, config.num_rounds,
                                                            frozenset(norm_modules), config),
                                 config)
  if config.model.get('decoder', 'hca2') == 'deeplab' and algorithms.parse(
      config.algorithm)[-1] == 'hca2':
    raise ConfigError("algorithm 'hca2' aggregates FedHCA2's task decoders, which "
                      "model.decoder='deeplab' does not have; use model.decoder='hca2'")
  if alg.roles.get('head') == 'shared' and len({g.head_channels for g in fed.groups}) > 1:
    raise ConfigError(f'algorithm {config.algorithm!r} shares the heads, whose shapes differ '
                      'between client groups; heads can be shared within one dataset only')
  return Experiment(config=config, fed=fed, data=data, mesh=mesh, encoder=encoder,
                    models_train=models_train, models_eval=models_eval,
                    tx=local_training.make_optimizer(config.optim), algorithm=alg, labels=labels,
                    start_axes=uniform_start_axes(config, alg, labels))


def dense_model(config, encoder, head_channels: tuple[int, ...], dtype):
  """The train-mode model of a client group (`model.decoder`): FedHCA2's decoder + head
  per task slot, or a DeepLab-v3 head per slot (`model.head_width` ASPP channels)."""
  decoder = config.model.get('decoder', 'hca2')
  check_choice('model.decoder', decoder, DECODERS)
  if decoder == 'deeplab':
    return DeepLabNet(encoder, head_channels, train=True, dtype=dtype,
                      head_width=int(config.model.get('head_width', 256)))
  return MultiTaskNet(encoder, head_channels, train=True, dtype=dtype)


def uniform_start_axes(config, alg: algorithms.Algorithm, labels: list) -> list | None:
  """`Experiment.start_axes`: in FedDEA's unified-model setting (`config.unified`
  'literal' or 'owner') every client starts each round from the one global
  encoder, so the round keeps one copy of it, not one per client. Not the
  leaves of modules the algorithm leaves with each client (FedBN's batch
  norms). None outside that setting, and when no leaf qualifies."""
  if algorithms.unified_mode(config) == 'none' or alg.roles.get('encoder') != 'shared':
    return None

  def axis(path, label):
    names = plugin_math.path_names(path)
    return None if label == 'encoder' and names[:-1] not in alg.local_modules else 0

  axes = [jax.tree_util.tree_map_with_path(axis, lab) for lab in labels]
  uniform = any(a is None for ax in axes
                for a in jax.tree.leaves(ax, is_leaf=lambda x: x is None))
  return axes if uniform else None


def remat(config) -> bool:
  """Whether the encoder rematerialises: `model.remat`, unless `model.kwargs.remat` overrides it."""
  return bool(config.model.get('kwargs', {}).get('remat', config.model.get('remat', False)))


def train_compiler_options(config) -> dict[str, str] | None:
  """XLA options for the jitted training programs: `KEEP_REMAT_ON_CPU` on the CPU
  backend when the encoder rematerialises or when `max_parallel_clients` loops over
  the clients (`local_training.map_clients`: its optimisation barrier is what lets
  the loop update the group's state in place), else None."""
  loops = int(config.get('max_parallel_clients', 0) or 0) > 0
  if (remat(config) or loops) and jax.default_backend() == 'cpu':
    return dict(KEEP_REMAT_ON_CPU)
  return None


# The round-0 state's programs run once per run and take milliseconds, so on the
# CPU backend they are compiled without LLVM's optimisation passes and with
# XLA:CPU's elemental emitters: 2.4x less compile time for the default config's
# init program (BENCHMARKS.md); the values agree to the last bit or two.
RUN_ONCE_ON_CPU = {'xla_backend_optimization_level': 0, 'xla_cpu_use_fusion_emitters': False}


def run_once_compiler_options() -> dict | None:
  """XLA options for programs that run once (`RUN_ONCE_ON_CPU` on CPU, else None)."""
  return dict(RUN_ONCE_ON_CPU) if jax.default_backend() == 'cpu' else None


def views(exp: Experiment, group_params: list, role: str) -> PyTree:
  """`role`'s rows of every real client, stacked across groups."""
  return federation.gather_rows(
      [federation.role_view(p, lab, role) for p, lab in zip(group_params, exp.labels)],
      exp.fed, role)


def _init_fn(exp: Experiment):
  """`init(seed) -> (groups, round, rng)`: one shared encoder, fresh decoders/heads per client."""
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
      groups.append((dict(variables['params']), variables['batch_stats']))
    out = []
    for (params, bstats), spec in zip(groups, exp.fed.groups):
      params['encoder'] = jax.tree.map(
          lambda x: jnp.broadcast_to(x, (spec.num_total,) + x.shape), enc_params)
      out.append((params, bstats))
    return out, jnp.zeros((), jnp.int32), k_run

  return init


def _client_states(exp: Experiment, params_bstats: list) -> list[GroupState]:
  """Group states from round-0 params: optimizer, client-part and personal-model states."""
  alg = exp.algorithm
  out = []
  for params, bstats in params_bstats:
    opt = jax.vmap(exp.tx.init)(params)
    personal = (params, bstats, opt) if alg.client.personal_model else ()
    out.append(GroupState(params=params, batch_stats=bstats, opt_state=opt,
                          client=jax.vmap(alg.client.init)(params), personal=personal))
  return out


def _with_server(exp: Experiment, groups: list[GroupState], rnd, rng) -> FedState:
  """The round-0 state with the server's state (per-row parts scattered into the groups)."""
  alg = exp.algorithm
  params = [g.params for g in groups]
  sstate: ServerState = alg.server.init({r: views(exp, params, r) for r in alg.shared_roles})
  rows = {r: federation.scatter_rows(v, exp.fed, r) for r, v in sstate.rows.items()}
  groups = [g.replace(server_rows={r: rows[r][i] for r in rows}) for i, g in enumerate(groups)]
  return FedState(round=rnd, rng=rng, groups=groups, server=sstate.shared)


class InitProgram:
  """The round-0 state `(seed, pretrained encoder or None) -> FedState` as two jitted
  programs: the models' parameters (`params`: they depend on the models and the
  federation only, so runs of other algorithms on the same models share its
  executable through the compilation cache; it is most of the compile time) and the
  algorithm's states from them (`states`: optimizer, client part, server). Both are
  created on the mesh: client axes sharded, the rest replicated (no host copy, and in
  a multi-process run no cross-process check of host values)."""

  def __init__(self, exp: Experiment):
    init = self.init_fn = _init_fn(exp)  # (unjitted: a sweep's replica programs vmap it)
    seed = jax.ShapeDtypeStruct((), jnp.uint32)
    rep, shard = exp.replicated, exp.client_sharding
    once = run_once_compiler_options()
    self.params = jax.jit(init, out_shardings=(shard, rep, rep), compiler_options=once)
    pb, rnd, rng = self.params.eval_shape(seed)  # the trace its compilation reuses

    def states(pb, rnd, rng, enc=None):
      if enc is not None:  # {'params': ..., 'batch_stats': ... (encoders with batch norm)}
        every = lambda t, g: jax.tree.map(
            lambda x: jnp.broadcast_to(x, (g.num_total,) + x.shape), t)
        pb = [({**p, 'encoder': every(enc['params'], g)},
               {**b, 'encoder': every(enc['batch_stats'], g)} if 'batch_stats' in enc else b)
              for (p, b), g in zip(pb, exp.fed.groups)]
      return _with_server(exp, _client_states(exp, pb), rnd, rng)

    self.states_fn = states
    shapes = jax.eval_shape(states, pb, rnd, rng)
    # Shapes do not depend on the seed's value: traced once, here.
    self.param_shapes = (pb, rnd, rng)  # of `params(seed)`
    self.state_shapes = shapes  # of the round-0 state
    self.states = jax.jit(states, out_shardings=_state_shardings(exp, shapes),
                          compiler_options=once)
    on = lambda t, sh: jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), t)
    self._states_args = (on(pb, shard), on(rnd, rep), on(rng, rep), None)

  def __call__(self, seed, enc=None) -> FedState:
    return self.states(*self.params(seed), enc)

  def jobs(self, seed) -> list[tuple[str, Any, tuple]]:
    """`compile_programs` jobs of both programs (the states program for a run that
    initialises its encoder, not one that loads a pretrained one)."""
    return [('init', self.params, (seed,)), ('init states', self.states, self._states_args)]


def _state_shardings(exp: Experiment, state: FedState) -> FedState:
  """`state`'s tree of shardings: client axes over the mesh, the rest replicated."""
  on = lambda t, s: jax.tree.map(lambda _: s, t)
  return FedState(round=on(state.round, exp.replicated), rng=on(state.rng, exp.replicated),
                  groups=on(state.groups, exp.client_sharding),
                  server=on(state.server, exp.replicated))


def init_state(exp: Experiment, abstract: bool = False) -> FedState:
  """Round-0 federation state, placed on the mesh (or its abstract shapes).

  All clients start from one shared encoder (loaded from
  `model.pretrained_path` when set); decoders and heads are initialised per
  client from keys folded with the client id.
  """
  program = exp.init_program
  if abstract:
    state = program.state_shapes
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        state, _state_shardings(exp, state))
  enc = pretrained_encoder(exp) if exp.config.model.get('pretrained_path') else None
  return program(jnp.asarray(exp.config.seed, jnp.uint32), enc)


def pretrained_encoder(exp: Experiment) -> dict:
  """One client's encoder weights from `model.pretrained_path`, checked against the
  model (`load_pretrained_encoder`)."""
  params, stats = exp.init_program.param_shapes[0][0]
  like = {'params': params['encoder'], 'batch_stats': stats.get('encoder', {})}
  one = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), like)
  return load_pretrained_encoder(exp.config.model.pretrained_path, exp.encoder, one)


def compile_programs(jobs: list[tuple[str, Any, tuple]], check=None) -> dict[str, float]:
  """Compile `(name, jitted, example args)` jobs, one after the other; returns the
  seconds of each (the run logs them in timing.jsonl). `check(name, compiled)`, when
  given, sees each executable (`Engine.check_compiled`: its memory analysis).

  The executables land in each jitted function's cache, so the engine's calls
  do not compile again. Args may be `jax.ShapeDtypeStruct`s with the
  shardings of the real calls. Not concurrent: XLA:CPU already spreads one
  compilation over the cores (parallel LLVM code generation), and two at once
  took longer than one after the other (BENCHMARKS.md); `BackgroundCompile` runs
  the ones that need not wait (the round-0 programs, the evaluation).
  """
  import time
  out = {}
  for name, fn, args in jobs:
    t0 = time.perf_counter()
    compiled = fn.lower(*args).compile()
    out[name] = round(time.perf_counter() - t0, 2)
    if check is not None:
      check(name, compiled)
  return out


class BackgroundCompile:
  """`compile_programs(jobs)` in one background thread, started at once (XLA
  releases the GIL while it compiles): the round-0 programs compile while the
  round's programs are traced, the evaluation programs while the rounds before
  the first evaluation run. `wait()` returns their seconds (and raises what the
  compilation raised); `close()` waits for the thread."""

  def __init__(self, jobs: list[tuple[str, Any, tuple]]):
    import concurrent.futures
    import time
    self.names = [name for name, _, _ in jobs]
    self.started = time.perf_counter()
    self._pool = (concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='compile')
                  if jobs else None)
    self._future = self._pool.submit(compile_programs, jobs) if jobs else None

  def wait(self) -> dict[str, float]:
    """The jobs' compile seconds once they are compiled ({} when there were none or
    they were already returned)."""
    if self._future is None:
      return {}
    future, self._future = self._future, None
    return future.result()

  def close(self) -> None:
    if self._pool is not None:
      self._pool.shutdown(wait=True)


def load_pretrained_encoder(path: str, encoder, like: PyTree) -> dict:
  """Converted encoder weights from `path`, checked against `like` ({'params',
  'batch_stats'} of one client's encoder): {'params'} for Swin (mmseg / converted
  .npz), {'params', 'batch_stats'} for ResNet (torchvision .pth / .safetensors /
  .npz, running statistics included)."""
  if not os.path.exists(path):
    raise ConfigError(f'model.pretrained_path {path!r} does not exist')
  from fedjax_mtl.models import resnet
  if isinstance(encoder, resnet.ResNet):
    from fedjax_mtl.models import convert_resnet
    params, stats = convert_resnet.load_resnet_checkpoint(path, encoder)
    out = {'params': params, 'batch_stats': stats}
  else:
    from fedjax_mtl.models import convert  # the Swin family
    out = {'params': convert.load_pretrained(path, encoder)}
  want = {k: like[k] for k in out}
  if jax.tree.map(np.shape, out) != jax.tree.map(np.shape, want):
    raise ConfigError(f'pretrained weights in {path!r} do not match model {encoder!r}')
  return jax.tree.map(jnp.asarray, out)
