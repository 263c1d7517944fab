"""A sweep's replicas of the many-task engine as one compiled program (`config.sweep`
with `setting='many_task'`).

R replicas of the many-task federation (`fedjax_mtl.sweep`: `seed`, `split_seed`
and traced field values; `scripts/compare.py` and the sweep scripts run a method's
seeds as `seed+split_seed=...`, each with its own client split) share one round
program and one evaluation program: the single run's over a leading replica axis
of the state, `many.parallel_replicas` at a time (vmapped; `jax.lax.map` over
groups of them when fewer than R; by default all on an accelerator, one at a time
on a CPU, where one replica keeps the cores busy). What differs per replica enters
as inputs:

- the state (its initial adapters and heads from its seed, its RNG);
- its client split (`split_seed`): the pair tables (`manytask.engine.Tables`:
  each pair's task, examples and client), the round schedule and the sample-index
  rows, and the models evaluated. The replicas' splits must have the same numbers
  of pairs and of slots a round (`many.tasks_per_client` or `many.client_tasks`
  fix them); the index rows are padded to the longest pair's, and every replica
  runs the largest replica's steps per epoch, the steps past its own masked. Both
  leave a replica's batches as its separate run draws them (the permutation
  draws of `jax.random` are prefix-stable), so each replica trains what its
  separate run trains;
- the initialisation the server and NTKFedAvg's linearisation read (`origin`);
- the frozen backbone when it comes from the seed (`many.pretrained=''`); a
  pretrained or warm-up backbone is one copy for all;
- the traced fields (`optim.lr`, `fedprox.mu`), as `fields.tracing` values.

Records are the dense sweep's (`engines.replicas`): every metrics.jsonl row carries
`replica`; at the end each replica gets `replicas/<label>` with what its separate
run writes, and the workdir the combined table (per point of the non-seed axes,
mean ± std over the seeds of each task's accuracy). A non-finite round in any
replica stops the run naming the replica, its seed and values, and the pairs.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl import distributed, fields, report, sweep as sweep_lib
from fedjax_mtl.engines.many_task import ManyTaskEngine
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.manytask import engine as engine_lib
from fedjax_mtl.manytask import model as model_lib
from fedjax_mtl.manytask import pretrain
from fedjax_mtl.manytask import run as run_lib
from fedjax_mtl.manytask import setting as setting_lib

PyTree = Any


def _stack(trees: list[PyTree]) -> PyTree:
  return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *trees)


def _pad_width(table: np.ndarray, width: int) -> np.ndarray:
  return np.pad(table, ((0, 0), (0, width - table.shape[1])))


class ManyTaskReplicaEngine(ManyTaskEngine):
  """The many-task engine over a sweep's replicas (see the module's docstring)."""

  def __init__(self, config, sweep: sweep_lib.Sweep):
    super().__init__(config)  # (`engines.build` has run `sweep.check`)
    self.sweep = sweep
    r_count = self.num_replicas = sweep.size
    self.label += f' x{r_count} replicas'
    run, cfg = self.run, config.many
    configs = [sweep.config_of(config, r) for r in range(r_count)]
    settings = []
    for r, c in enumerate(configs):  # each replica's client split, as its run builds it
      st = (run.setting if int(c.split_seed) == int(config.split_seed) else
            run_lib.pad_slots(setting_lib.build_setting(run.setting.tasks, run.data, c.many,
                                                        int(c.num_rounds), int(c.split_seed),
                                                        cfg.benchmark), run.mesh.size))
      settings.append(st)
    shapes = [(st.num_pairs, st.num_slots) for st in settings]
    if len(set(shapes)) > 1:
      raise ConfigError(
          'config.sweep: the replicas\' client splits differ in size ('
          + ', '.join(f'{sweep.label(r)}: {m} pairs, {s} slots a round'
                      for r, (m, s) in enumerate(shapes))
          + '); fix them with many.tasks_per_client or many.client_tasks, or run one '
          'process per seed (--no-replicas)')
    width = max(st.index_table.shape[1] for st in settings)
    self.index_tables = np.stack([_pad_width(st.index_table, width) for st in settings])
    self.schedules = np.stack([st.schedule for st in settings])
    args, kw = run.round_spec
    # Each replica's trainable initialisation and backbone, as its run makes them.
    # (`vit.init_params`' computation, compiled once for every seed)
    x = jnp.zeros((1, run.model.image_size, run.model.image_size, 3), jnp.float32)
    init = jax.jit(lambda key: run.model.init(key, x)['params'])
    params = [init(jax.random.PRNGKey(int(c.seed))) for c in configs]
    split = [model_lib.split(p) for p in params]
    self.per_replica_backbone = not cfg.pretrained
    self.backbone = (jax.device_put(_stack([pretrain.load_backbone(cfg, b) for b, _ in split]),
                                    self.sharding)
                     if self.per_replica_backbone else run.backbone)
    self.runs = [dataclasses.replace(run, config=c, setting=st, trainable=t,
                                     eval_pairs=engine_lib.eval_models(st, run.where))
                 for c, st, (_, t) in zip(configs, settings, split)]
    self.views = [ManyTaskEngine.of_run(c, rr) for c, rr in zip(configs, self.runs)]
    self.tables = jax.device_put(_stack([engine_lib.tables(st, t) for st, (_, t)
                                         in zip(settings, split)]), self.sharding)
    self.values = jax.device_put({k: np.asarray([p[k] for p in sweep.points], np.float32)
                                  for k in sweep.traced_names}, self.sharding)
    self.eval_pairs = jax.device_put(np.stack([rr.eval_pairs for rr in self.runs]),
                                     self.sharding)
    self.schedule = jax.device_put(self.schedules, self.sharding)
    steps = int(kw['local_steps'])
    spe = 0 if steps else max(engine_lib.epoch_steps(st, int(kw['batch_size']))
                              for st in settings)
    single = engine_lib.make_round(*args, **kw, steps_per_epoch=spe,
                                   max_parallel=int(config.get('max_parallel_clients', 0)))
    # On a CPU one replica's round keeps the cores busy already: one at a time runs a
    # replica at a single run's speed, all at once (vmapped) measured 0.85x of it
    # (BENCHMARKS.md, many-task sweeps).
    self.parallel = int(cfg.parallel_replicas) or (
        1 if jax.default_backend() == 'cpu' else r_count)
    bb = 0 if self.per_replica_backbone else None
    self.round_program = jax.jit(
        self._over_replicas(self._traced(single.__wrapped__), (0, 0, 0, bb, 0, 0, None, None)),
        donate_argnums=2)
    self.eval_program = jax.jit(self._over_replicas(
        self._traced(run.eval_fn.__wrapped__), (0, 0, 0, bb, 0, None, None, None)))
    self.eval_linear_program = None if run.eval_linear_fn is None else jax.jit(
        self._over_replicas(self._traced(run.eval_linear_fn.__wrapped__),
                            (0, 0, 0, 0, bb, 0, None, None, None)))

  def _over_replicas(self, fn: Callable, in_axes: tuple) -> Callable:
    """`fn` over the replicas (a leading axis of the arguments whose `in_axes` is 0):
    all at once (`jax.vmap`) or `self.parallel` at a time (`jax.lax.map`)."""
    if self.parallel >= self.num_replicas:
      return jax.vmap(fn, in_axes=in_axes)

    def mapped(*args):
      per = tuple(a for a, ax in zip(args, in_axes) if ax == 0)

      def one(xs):
        it = iter(xs)
        return fn(*(next(it) if ax == 0 else a for a, ax in zip(args, in_axes)))
      return jax.lax.map(one, per, batch_size=self.parallel if self.parallel > 1 else None)
    return mapped

  @staticmethod
  def _traced(fn: Callable) -> Callable:
    """`fn` of one replica, with its traced values and tables as its first two inputs."""
    def one(values, tables, *args):
      with fields.tracing(values), engine_lib.replica_tables(tables):
        return fn(*args)
    return one

  # ---- state and data ---------------------------------------------------------------

  def open(self, start: int) -> None:
    images, labels, _ = run_lib.concat_split(self.run.data.train)
    self.images, self.labels = jax.device_put((images, labels), self.sharding)
    self.test = self.put(run_lib.concat_split(self.run.data.test))
    self._start = start

  def close(self) -> None:
    self.images = self.labels = self.test = None

  def _rows(self, rnd: int) -> jax.Array:
    """[R, S, width] sample rows of round `rnd` (0-based) of every replica."""
    rows = np.stack([t[s[rnd]] for t, s in zip(self.index_tables, self.schedules)])
    return jax.device_put(rows, self.sharding)

  def init_state(self):
    """Every replica's round-0 state (`run_lib.init_state` of its run), stacked."""
    states = []
    for r, rr in enumerate(self.runs):
      with fields.tracing(self.sweep.traced(r)):
        states.append(run_lib.init_state(rr))
    return jax.device_put(_stack(states), self.sharding)

  def abstract_state(self):
    one = jax.eval_shape(lambda: run_lib.init_state(self.runs[0]))
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct((self.num_replicas,) + x.shape, x.dtype,
                                                       sharding=self.sharding), one)

  def programs_to_compile(self, state) -> list[tuple[str, Any, tuple]]:
    r = self.num_replicas
    state = self.abstract_state()
    jobs = [(f'round x{r} replicas', self.round_program,
             (self.values, self.tables, state, self.backbone, self.schedule[:, self._start],
              self._rows(self._start), self.images, self.labels)),
            (f'evaluate x{r} replicas', self.eval_program,
             (self.values, self.tables, state, self.backbone, self.eval_pairs, *self.test))]
    if self.eval_linear_program is not None:
      start = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state.shared)
      jobs.append((f'evaluate linear x{r} replicas', self.eval_linear_program,
                   (self.values, self.tables, state, start, self.backbone, self.eval_pairs,
                    *self.test)))
    return jobs

  def check_compiled(self, name: str, compiled: Any) -> None:
    """`engines.replicas.check_fits` on the run's one device."""
    from fedjax_mtl.engines import replicas
    replicas.check_fits(name, compiled, self.num_replicas, replicas.nbytes(self.abstract_state()),
                        replicas.nbytes((self.images, self.labels, self.test)),
                        self.run.mesh.devices.flat[0])

  # ---- a round ----------------------------------------------------------------------

  def run_round(self, state, rnd: int,
                progress: Callable[[int], None] | None = None) -> tuple[Any, dict]:
    """Round `rnd` (1-based) of every replica."""
    run, cfg = self.run, self.config
    evaluated = rnd % int(cfg.eval_every) == 0 or rnd == int(cfg.num_rounds)
    self._start_shared = None
    if evaluated and run.eval_linear_fn is not None:  # evaluation B's linearisation point
      self._start_shared = (jax.tree.map(jnp.copy, state.shared)
                            if run.algorithm.client.linearize_at == 'start' else
                            jax.device_put({k: self.tables.origin[k] for k in state.shared},
                                           self.sharding))
    state, out = self.round_program(self.values, self.tables, state, self.backbone,
                                    self.schedule[:, rnd - 1], self._rows(rnd - 1),
                                    self.images, self.labels)
    if progress is not None:
      progress(1)
    return state, dict(out, tuned={})

  def replica_out(self, out: PyTree, r: int) -> PyTree:
    return jax.tree.map(lambda x: x[r], out)

  def divergence(self, rnd: int, out: dict) -> str | None:
    """The first replica's non-finite round, named with its seed and values."""
    for r, view in enumerate(self.views):
      line = view.divergence(rnd, self.replica_out(out, r))
      if line:  # 'round 3: ...' -> 'round 3, replica 1 (seed=1): ...'
        head, _, rest = line.partition(': ')
        return f'{head}, replica {r} ({self.sweep.label(r)}): {rest}'
    return None

  def round_rows(self, rnd: int, out: dict) -> list[dict]:
    return [{**row, 'replica': r} for r, view in enumerate(self.views)
            for row in view.round_rows(rnd, self.replica_out(out, r))]

  def meta_rows(self) -> list[dict]:
    return [{'round': 0, 'type': 'meta',
             'replicas': [self.sweep.label(r) for r in range(self.num_replicas)]}]

  # ---- evaluation -------------------------------------------------------------------

  def evaluate(self, state, rnd: int) -> list[dict]:
    """Every replica's eval rows (`run_lib.eval_rows` of its run), each with `replica`."""
    outs = [('', self.eval_program(self.values, self.tables, state, self.backbone,
                                   self.eval_pairs, *self.test))]
    if self._start_shared is not None:
      outs.append(('_linear', self.eval_linear_program(
          self.values, self.tables, state, self._start_shared, self.backbone,
          self.eval_pairs, *self.test)))
    outs = distributed.host_get(outs)
    return [{'round': rnd, 'type': 'eval', **row, 'replica': r}
            for r, rr in enumerate(self.runs)
            for row in run_lib.eval_rows(rr, [(s, self.replica_out(o, r)) for s, o in outs])]

  # ---- records ----------------------------------------------------------------------

  def replica_dir(self, workdir: str, r: int) -> str:
    return os.path.join(workdir, 'replicas', self.sweep.label(r))

  def write_reports(self, rows: list[dict], final: list[dict], workdir: str) -> None:
    """Each replica's sub-workdir (what its separate run writes) and the combined
    table (results.md / .csv: per point, mean ± std over its seeds)."""
    points: dict[str, list[dict[str, float]]] = {}
    bits: dict[str, list[float]] = {}
    for r, view in enumerate(self.views):
      sub = self.replica_dir(workdir, r)
      os.makedirs(sub, exist_ok=True)
      mine = [{k: v for k, v in row.items() if k != 'replica'}
              for row in rows if row.get('replica') == r]
      report.atomic_write(os.path.join(sub, 'metrics.jsonl'),
                          ''.join(report.json_line(row) for row in mine))
      report.atomic_write(os.path.join(sub, 'config.json'),
                          view.config.to_json_best_effort(indent=2))
      last = [{k: v for k, v in row.items() if k != 'replica'}
              for row in final if row.get('replica') == r and row['type'] == 'eval']
      view.write_reports(mine, last, sub)
      name = self.sweep.label(r, seed=False) or self.config.algorithm
      points.setdefault(name, []).append(report.final_accuracy(sub))
      bits.setdefault(name, []).append(report.bits_per_task(sub))
    md, csv_text = report.many_task_table(points, next(iter(points)), bits)
    report.atomic_write(os.path.join(workdir, 'results.md'), md)
    report.atomic_write(os.path.join(workdir, 'results.csv'), csv_text)
