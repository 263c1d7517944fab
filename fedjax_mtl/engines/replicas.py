"""A sweep's replicas of the dense engine as one compiled program (`config.sweep`).

R replicas of the whole federation (`fedjax_mtl.sweep`: seeds and traced field
values) share one experiment. Every leaf of the state gets a leading replica axis,
and each of the round's programs is the single run's function vmapped over it:
one local
training program per client group, one aggregation, one evaluation, compiled
once for all replicas. The traced fields' values enter the trainers and the
aggregation as a [R] input per field (`fields.tracing`). On several devices the
mesh is `replicas` x `clients` (`experiment.replica_shards`: g = gcd(R, devices)
groups of devices, each holding R/g whole replicas with their clients sharded over
the group's devices); with g = 1 every device holds every replica and a share of
its clients.

Records: every metrics.jsonl row of the run's workdir carries `replica` (its
index; the meta row lists `replicas`, their labels). When the run ends, each
replica gets a sub-workdir `replicas/<label>` with what a separate run writes
(config.json, metrics.jsonl, results.md / .csv, curves.png) and the workdir gets
the combined table `results.md` / `results.csv`: one row per point of the
non-seed axes, mean ± std over the seeds.

A non-finite round in any replica stops the whole run, naming the replica (its
seed and values), the client and what went non-finite, and is not saved, as in a
single run: the replicas share one state and one checkpoint, so they advance
together.
"""

from __future__ import annotations

import functools
import os
import types
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from fedjax_mtl import (distributed, evaluation, experiment, fields, hostmem, participation,
                        report, rounds, sweep as sweep_lib)
from fedjax_mtl.engines.dense import (DenseEngine, divergence, memory_round,
                                      programs as dense_programs, with_sharding)
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.experiment import Experiment, per_experiment
from fedjax_mtl.state import FedState

PyTree = Any


def replica_axis(mesh) -> str | None:
  """The mesh axis the replicas are sharded over (`experiment.replica_shards`), or None
  (every device holds every replica)."""
  return 'replicas' if 'replicas' in mesh.axis_names else None


def lifted(sharding):
  """`sharding` of one replica's array -> that of the replicas' stacked array (a
  leading axis, over the mesh's `replicas` axis where it has one)."""
  return NamedSharding(sharding.mesh, P(replica_axis(sharding.mesh), *sharding.spec))


def lift_abstract(tree: PyTree, r: int) -> PyTree:
  """One replica's ShapeDtypeStructs (with shardings) -> the stacked ones of `r`."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct((r,) + tuple(x.shape), x.dtype,
                                                     sharding=lifted(x.sharding)), tree)


class ReplicaPrograms:
  """The round's programs over a leading replica axis, each built on first use."""

  def __init__(self, exp: Experiment):
    self.exp = exp
    self.single = dense_programs(exp)
    self.client = lifted(exp.client_sharding)
    self.axis = replica_axis(exp.mesh)
    # Per replica and replicated within it (the round, RNG, server state): over the
    # replica groups where the mesh has them.
    self.rep = exp.replicated if self.axis is None else lifted(exp.replicated)

  def vmap(self, fn, **kw):
    """`jax.vmap` over the replica axis (named for the mesh's sharding constraints)."""
    return jax.vmap(fn, spmd_axis_name=self.axis, **kw)

  def state_shardings(self) -> FedState:
    """The stacked state's shardings (a prefix tree, as `rounds.state_shardings`)."""
    return FedState(round=self.rep, rng=self.rep, groups=[self.client] * len(self.exp.fed.groups),
                    server=self.rep)

  @functools.cached_property
  def train_fns(self) -> list:
    """Per group: `(values, gstate, start, data, round, rng, total) -> (gstate, metrics)`."""
    exp = self.exp

    return [self._replica_train(body) for body in rounds.train_bodies(exp)]

  @functools.cached_property
  def masked_train_fns(self) -> list:
    """Per group: `train_fns` with a last argument, each replica's share of its local
    steps per row ([R, rows] float32: 0 for a client that sits the round out, below 1
    for a straggler; masked steps leave a client as it was)."""
    return [self._replica_train(body, masked=True) for body in rounds.train_bodies(self.exp)]

  def _replica_train(self, body, masked: bool = False):
    exp = self.exp

    def run(values, gs, start, data, rnd, rng, total, *frac):
      with fields.tracing(values):
        return body(gs, start, data, rnd, rng, total, *frac)
    return jax.jit(self.vmap(run, in_axes=(0, 0, 0, None, 0, 0, None) + ((0,) if masked else ())),
                   out_shardings=(self.client, self.client),
                   donate_argnums=tuple(i + 1 for i in rounds.train_donation(exp)),
                   compiler_options=experiment.train_compiler_options(exp.config))

  @functools.cached_property
  def agg_fn(self):
    """`(values, core, params, start, metrics[, valid]) -> (core, outputs)`
    (`rounds.make_agg_fn`; `valid` [R, N]: each replica's participants)."""
    body = rounds.agg_body(self.exp)

    def run(values, core, params, start, metrics, *valid):  # valid: [R, N] participants
      with fields.tracing(values):
        return body(core, params, start, metrics, *valid)

    return jax.jit(self.vmap(run), donate_argnums=1,
                   out_shardings=(self.state_shardings(), self.rep))

  @functools.cached_property
  def begin(self):
    """The client part's `begin` of every replica, or None (`rounds.make_begin`)."""
    fn = self.single.begin
    return None if fn is None else jax.jit(self.vmap(fn), out_shardings=self.client)

  @functools.cached_property
  def round_start(self):
    """The replicas' round-start copies, or None (`rounds.make_round_start`)."""
    fn = self.single.round_start
    if fn is None:
      return None
    outs = [jax.tree.map(lambda ax: self.rep if ax is None else self.client, ax,
                         is_leaf=lambda x: x is None) for ax in self.exp.start_axes]
    return jax.jit(self.vmap(fn), out_shardings=outs)

  @functools.cached_property
  def stats_fn(self):
    """The batch-norm statistics' average per replica, or None (`rounds.make_stats_fn`)."""
    fn = self.single.stats_fn
    return None if fn is None else jax.jit(self.vmap(fn), donate_argnums=0,
                                           out_shardings=self.client)

  def eval_fn(self, linear: bool = False):
    """Every replica's evaluation on the (shared) in-memory test splits."""
    return self._eval_fns[linear]

  @functools.cached_property
  def _eval_fns(self) -> dict:
    return {lin: jax.jit(self.vmap(self.single.eval_fn_linear if lin else self.single.eval_fn,
                                   in_axes=(0, None)))
            for lin in (False, True)}

  @functools.cached_property
  def init_states(self):
    """`(values, [R] outputs of the init program's params part, pretrained encoder or
    None) -> stacked round-0 state`: each replica's `experiment.InitProgram` states
    part with its traced values (the server's initial state may read them: FedHCA2's
    α, β and their optimizer). The parameters come from the single run's params
    program, once per seed: the same executable as a separate run's (and the same
    bits: vmapped, the parameters' 'rbg' generator would draw others)."""
    program = self.exp.init_program

    def run(values, outs, enc):
      stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *outs)

      def one(args):
        with fields.tracing(args[0]):
          return program.states_fn(*args[1], enc)

      return jax.lax.map(one, (values, stacked))

    return jax.jit(run, out_shardings=self.state_shardings(),
                   compiler_options=experiment.run_once_compiler_options())


replica_programs = per_experiment(ReplicaPrograms)


def _expand(prefix: PyTree, tree: PyTree) -> PyTree:
  """The sharding prefix tree `prefix` expanded to one sharding per leaf of `tree`."""
  return jax.tree.map(lambda s, t: jax.tree.map(lambda _: s, t), prefix, tree,
                      is_leaf=lambda x: isinstance(x, NamedSharding))


def nbytes(tree: PyTree) -> int:
  """Bytes of every array (or ShapeDtypeStruct) in `tree`."""
  return sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def device_memory_bytes(device) -> int:
  """The memory a program may use on `device`: its allocator's limit (GPU, TPU), else
  the host's physical memory (CPU)."""
  stats = device.memory_stats() if hasattr(device, 'memory_stats') else None
  if stats and stats.get('bytes_limit'):
    return int(stats['bytes_limit'])
  return hostmem.host_memory_bytes()


def check_fits(name: str, compiled: Any, r: int, state: float, data: float, device) -> None:
  """ConfigError (one line) when `r` replicas will not fit in `device`'s memory while
  `compiled` runs: the stacked state (`state` bytes per device) and the data (`data`
  bytes) resident, plus the program's temporaries and new outputs (XLA's memory
  analysis), against the device's memory (the host's on CPU); the line gives the
  largest R that fits, taking everything but the data as proportional to R."""
  analysis = compiled.memory_analysis()
  if analysis is None:
    return
  program = (analysis.temp_size_in_bytes + analysis.output_size_in_bytes
             - analysis.alias_size_in_bytes)
  need = state + data + program
  limit = 0.9 * device_memory_bytes(device)
  if need <= limit:
    return
  fits = max(0, int((limit - data) // ((need - data) / r)))
  raise ConfigError(
      f'config.sweep: {r} replicas need about {need / 2**30:.1f} GiB per device while '
      f'{name!r} runs (state, data and the program\'s own buffers; XLA memory analysis) '
      f'but {limit / 2**30:.1f} GiB are usable; at most R = {fits} fits')


class ReplicaEngine(DenseEngine):
  """The dense engine over a sweep's replicas (see the module's docstring)."""

  def __init__(self, exp: Experiment, config, sweep: sweep_lib.Sweep):
    super().__init__(exp, config)
    self.sweep = sweep
    self.num_replicas = sweep.size
    self.label += f' x{self.num_replicas} replicas'
    self.replica_programs = replica_programs(exp)
    self._values = {k: jax.device_put(jnp.asarray([p[k] for p in sweep.points], jnp.float32),
                                      exp.replicated)
                    for k in sweep.traced_names}
    v = self.replica_programs  # the round's programs with the replicas' values bound
    self._round_programs = types.SimpleNamespace(
        begin=v.begin, round_start=v.round_start, stats_fn=v.stats_fn,
        train_fns=[functools.partial(f, self._values) for f in v.train_fns],
        agg_fn=functools.partial(v.agg_fn, self._values))
    # Partial participation and stragglers: each replica draws its own clients from its
    # seed, as its separate run would; every client of every replica steps, those
    # that sit the round out with all their steps masked (0 of them: left as they
    # were), so that the replicas' groups keep one shape (`run_round`).
    self.samplers = [participation.Sampler(config, exp.fed, seed) for seed in self._seeds()]
    self._masked_programs = types.SimpleNamespace(**{
        **vars(self._round_programs),
        'train_fns': [functools.partial(f, self._values) for f in v.masked_train_fns]})

  # ---- state ------------------------------------------------------------------------

  def _seeds(self) -> list[int]:
    return [self.sweep.seed(self.config, r) for r in range(self.num_replicas)]

  def _states_args(self) -> tuple:
    """Abstract arguments of the replicas' states program (`ReplicaPrograms.init_states`)."""
    pb, rnd, rng = self.exp.init_program.param_shapes
    rep = self.exp.replicated
    one = (with_sharding(pb, self.exp.client_sharding), with_sharding(rnd, rep),
           with_sharding(rng, rep))
    return with_sharding(self._values, rep), [one] * self.num_replicas, None

  def abstract_state(self) -> FedState:
    """The stacked round-0 state's shapes and shardings."""
    return self._abstract

  @functools.cached_property
  def _abstract(self) -> FedState:
    shapes = jax.eval_shape(self.replica_programs.init_states, *self._states_args())
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        shapes, _expand(self.replica_programs.state_shardings(), shapes))

  def init_state(self) -> FedState:
    """Every replica's round-0 state (its seed and traced values), stacked on the mesh."""
    program = self.exp.init_program
    outs = [program.params(jnp.asarray(s, jnp.uint32)) for s in self._seeds()]
    enc = (experiment.pretrained_encoder(self.exp)
           if self.config.model.get('pretrained_path') else None)
    return self.replica_programs.init_states(self._values, outs, enc)

  def round0_programs(self) -> list[tuple[str, Any, tuple]]:
    """The single run's params program (a separate run's executable) and the replicas'
    states program; none for a pretrained encoder (its states program takes the
    weights)."""
    if self.config.model.get('pretrained_path'):
      return []
    params = self.exp.init_program.jobs(jnp.asarray(self.config.seed, jnp.uint32))[0]
    return [params, (f'init states x{self.num_replicas} replicas',
                     self.replica_programs.init_states, self._states_args())]

  def programs_to_compile(self, state: FedState) -> list[tuple[str, Any, tuple]]:
    """The replicas' trainers, aggregation and evaluation (`state` may be abstract)."""
    exp, v, r = self.exp, self.replica_programs, self.num_replicas
    state = self.abstract_state()
    start = lift_abstract(rounds.abstract_round_start(
        exp, [gs.params for gs in super().abstract_state().groups]), r)
    values = with_sharding(self._values, exp.replicated)
    jobs, metrics = [], []
    masked = self.sampler.active  # `run_round`'s step shares and participants
    for g, (spec, fn) in enumerate(zip(exp.fed.groups,
                                       v.masked_train_fns if masked else v.train_fns)):
      args = (values, state.groups[g], start[g], self.source.train[spec.dataset]['train'],
              state.round, state.rng, rounds.num_rounds(exp))
      if masked:
        args += (with_sharding(jax.ShapeDtypeStruct((r, spec.num_total), jnp.float32),
                               exp.replicated),)
      jobs.append((f'train {spec.dataset} x{spec.num_real} x{r} replicas', fn, args))
      metrics.append(with_sharding(jax.eval_shape(fn, *args)[1], v.client))
    params = [gs.params for gs in state.groups]
    extra = ((with_sharding(jax.ShapeDtypeStruct((r, exp.fed.num_clients), jnp.bool_),
                            exp.replicated),) if self.sampler.partial else ())
    jobs.append(('aggregate', v.agg_fn,
                 (values, rounds.agg_core(state), params, start, metrics) + extra))
    jobs.append(('evaluate', v.eval_fn(), (state.groups, self.source.test)))
    return jobs

  def check_compiled(self, name: str, compiled: Any) -> None:
    """`check_fits` with the stacked state shared over the mesh's devices and the
    in-memory data resident."""
    check_fits(name, compiled, self.num_replicas,
               nbytes(self.abstract_state()) / self.exp.mesh.size,
               nbytes((self.source.train, self.source.test)), self.exp.mesh.devices.flat[0])

  # ---- a round ----------------------------------------------------------------------

  def run_round(self, state: FedState, rnd: int,
                progress: Callable[[int], None] | None = None) -> tuple[FedState, dict]:
    """Round `rnd` of every replica (`dense.memory_round` with the replica programs);
    with participation or stragglers, each replica's clients and step shares from its
    own seed (`round_masks`)."""
    if not self.sampler.active:
      return memory_round(self.exp, self._round_programs, state, self.source.train, progress)
    valid, fracs = self.round_masks(rnd)
    return memory_round(self.exp, self._masked_programs, state, self.source.train, progress,
                        None, None if valid is None else self.put_rows(valid),
                        [self.put_rows(f) for f in fracs])

  def round_masks(self, rnd: int) -> tuple[np.ndarray | None, list[np.ndarray]]:
    """([R, N] bool participants, or None without sampling; per group [R, rows] float32
    step shares, padding rows 1) of round `rnd`, from each replica's sampler."""
    shares = [s.step_shares(rnd) for s in self.samplers]
    fracs = [np.stack([np.concatenate([sh[g], np.ones(spec.num_pad, np.float32)])
                       for sh in shares]) for g, spec in enumerate(self.exp.fed.groups)]
    valid = (np.stack([s.mask(rnd) for s in self.samplers]) if self.sampler.partial
             else None)
    return valid, fracs

  def replica_out(self, out: PyTree, r: int) -> PyTree:
    """Replica `r`'s part of host outputs (a round's, an evaluation's)."""
    return jax.tree.map(lambda x: x[r], out)

  def divergence(self, rnd: int, out: dict) -> str | None:
    """The first replica's non-finite round, named with its seed and values."""
    for r in range(self.num_replicas):
      line = divergence(self.exp, rnd, self.replica_out(out, r)['health'])
      if line:  # 'round 3: ...' -> 'round 3, replica 1 (seed=1): ...'
        head, _, rest = line.partition(': ')
        return f'{head}, replica {r} ({self.sweep.label(r)}): {rest}'
    return None

  def round_rows(self, rnd: int, out: dict) -> list[dict]:
    one = super().round_rows  # (not callable as super() inside the comprehension)
    return [{**row, 'replica': r} for r in range(self.num_replicas)
            for row in one(rnd, self.replica_out(out, r), self.samplers[r])]

  def meta_rows(self) -> list[dict]:
    labels = [self.sweep.label(r) for r in range(self.num_replicas)]
    return [{**row, 'replicas': labels} for row in super().meta_rows()]

  # ---- evaluation -------------------------------------------------------------------

  def evaluate(self, state: FedState, rnd: int) -> list[dict]:
    """Every replica's eval rows (`DenseEngine.evaluate`), each with its `replica`."""
    rows = []
    kinds = [('eval', False)] + ([('eval_linear', True)] if self.linear else [])
    for kind, linear in kinds:
      out = self.replica_programs.eval_fn(linear)(state.groups, self.source.test)
      # One transfer for all replicas; the edge maps only for odsF.
      probs = not linear and evaluation.scores_edge_ods(self.config, rnd)
      out = distributed.host_get([(st, p if probs else None) for st, p in out])
      for r in range(self.num_replicas):
        stats, edges = self.score_outputs(self.replica_out(out, r), linear,
                                          None if linear else rnd)
        rows += [{'round': rnd, 'type': kind, **row, **self.record, 'replica': r}
                 for row in self.rows_of(stats, edges)]
    return rows

  # ---- records ----------------------------------------------------------------------

  def replica_dir(self, workdir: str, r: int) -> str:
    """Replica `r`'s sub-workdir."""
    return os.path.join(workdir, 'replicas', self.sweep.label(r))

  def write_reports(self, rows: list[dict], final: list[dict], workdir: str) -> None:
    """Each replica's sub-workdir (what its separate run writes) and the combined
    table (results.md / .csv)."""
    meta = [{k: v for k, v in r.items() if k != 'replicas'} for r in rows if r['type'] == 'meta']
    finals = {}
    for r in range(self.num_replicas):
      sub = self.replica_dir(workdir, r)
      os.makedirs(sub, exist_ok=True)
      mine = meta + [{k: v for k, v in row.items() if k != 'replica'}
                     for row in rows if row.get('replica') == r]
      report.atomic_write(os.path.join(sub, 'metrics.jsonl'),
                          ''.join(report.json_line(row) for row in mine))
      report.atomic_write(os.path.join(sub, 'config.json'),
                          self.sweep.config_of(self.config, r).to_json_best_effort(indent=2))
      last = [{k: v for k, v in row.items() if k != 'replica'}
              for row in final if row.get('replica') == r and row['type'] == 'eval']
      super().write_reports(mine, last, sub)
      finals[r] = report.final_metrics(sub)
    md, csv_text = self.combined_table(finals)
    report.atomic_write(os.path.join(workdir, 'results.md'), md)
    report.atomic_write(os.path.join(workdir, 'results.csv'), csv_text)

  def combined_table(self, finals: dict[int, dict[str, float]]) -> tuple[str, str]:
    """One row per point of the non-seed axes (mean ± std over the seeds), as
    `report.comparison_table` (Δm against the first point's row)."""
    points: dict[str, list[dict[str, float]]] = {}
    for r in range(self.num_replicas):
      name = self.sweep.label(r, seed=False) or self.config.algorithm
      points.setdefault(name, []).append(finals[r])
    return report.comparison_table(points, reference=next(iter(points)))
