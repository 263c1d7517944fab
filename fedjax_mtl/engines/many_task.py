"""The many-task engine: ViT + LoRA classification with many-task clients
(`setting='many_task'`, e.g. `configs/matu.py`, `configs/fedavg.py:mini8`).

    build (`manytask/run.py`: tasks, data, allocation, schedule, backbone, algorithm)
    round: the round's (client, task) pairs train and aggregate (one jitted call;
           NTKFedAvg may then tune the server step on held-out data)
    evaluation: per task, top-1 accuracy and test loss of the evaluated models
    reports: results.md / results.csv (accuracy per task, mean, bits per task,
             normalised accuracy), curves.png

The run loop (`train.py`) drives it through the `engines.Engine` interface, as it
drives the dense engine.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl import algorithms, comm, report
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.manytask import run as run_lib
from fedjax_mtl.manytask.feed import RoundFeed

PyTree = Any


class ManyTaskEngine:
  """The many-task setting's rounds, evaluation and records."""

  def __init__(self, config):
    if float(config.get('participation', 1.0)) != 1.0:
      raise ConfigError(f'participation={config.participation!r} is the dense engine\'s; the '
                        'many-task setting samples its clients with many.participation')
    self._setup(config, run_lib.build_run(config))  # every input is read (and checked) here

  @classmethod
  def of_run(cls, config, run: run_lib.Run) -> 'ManyTaskEngine':
    """The engine of an already built `run` (a sweep replica's records and reports)."""
    self = cls.__new__(cls)
    self._setup(config, run)
    return self

  def _setup(self, config, run: run_lib.Run) -> None:
    self.config = config
    self.run = run
    setting = self.run.setting
    self.label = (f'{config.algorithm} {config.many.num_clients} clients, '
                  f'{setting.num_tasks} tasks')
    self.steps_per_round = 1  # a round is one program
    self.bits = run_lib.upload_bits(self.run)
    mesh = self.run.mesh
    # The state lives on one device, committed there (every call sees the shardings of
    # the first: one compiled round), or replicated over the run's devices, whose
    # processes each hold every input (`run_lib.place`).
    self.sharding = (jax.sharding.SingleDeviceSharding(mesh.devices.flat[0]) if mesh.size == 1
                     else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    self.put = lambda tree: run_lib.place(mesh, tree)
    self.schedule = self.put(jnp.asarray(setting.schedule))
    self.feed = self.test = None
    self._start_shared = None

  # ---- state and data ---------------------------------------------------------------

  def open(self, start: int) -> None:
    """Place the training feed and the test split on the device."""
    images, labels, _ = run_lib.concat_split(self.run.data.train)
    self.feed = RoundFeed(self.run.setting, images, labels, self.config.many.feed, self.put)
    self.test = self.put(run_lib.concat_split(self.run.data.test))
    self._start = start

  def close(self) -> None:
    self.feed = self.test = None

  def init_state(self):
    """The round-0 state, on the device."""
    state = run_lib.init_state(self.run)
    return (jax.device_put(state, self.sharding) if self.run.mesh.size == 1
            else self.put(state))  # one device: committed (`self.sharding`)

  def abstract_state(self):
    """The round-0 state's shapes (what a checkpoint restores into)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self.sharding),
                        jax.eval_shape(lambda: run_lib.init_state(self.run)))

  def round0_programs(self) -> list[tuple[str, Any, tuple]]:
    """None of its own: the round-0 state is made by `run_lib.init_state`'s calls."""
    return []

  def check_compiled(self, name: str, compiled: Any) -> None:
    """Nothing to check for one federation (`Engine.check_compiled`)."""

  def programs_to_compile(self, state) -> list[tuple[str, Any, tuple]]:
    """(name, jitted, args) of the round and evaluation programs (`state` may be
    abstract; the round's data are the first round's real feed)."""
    run, r = self.run, self._start
    pairs = run_lib.eval_pairs(run)
    start = self._shared_like(state)
    jobs = [('round', run.round_fn, (state, run.backbone, self.schedule[r], *self.feed(r))),
            ('evaluate', run.eval_fn, (state, run.backbone, pairs, *self.test))]
    if run.eval_linear_fn is not None:
      jobs.append(('evaluate linear', run.eval_linear_fn,
                   (state, start, run.backbone, pairs, *self.test)))
    if run.alpha_tune_fn is not None:
      jobs.append(('tune alpha', run.alpha_tune_fn,
                   (state, start, run.backbone, pairs, *run.val)))
    return jobs

  def _shared_like(self, state):
    """The shared leaves' shapes (evaluation B's linearisation point)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state.shared)

  # ---- a round ----------------------------------------------------------------------

  def run_round(self, state, rnd: int,
                progress: Callable[[int], None] | None = None) -> tuple[Any, dict]:
    """Round `rnd` (1-based): the round's pairs train and aggregate; NTKFedAvg's
    in-run α tuning follows (`run.tune_alpha`). (new state, outputs)."""
    run, cfg = self.run, self.config
    evaluated = rnd % int(cfg.eval_every) == 0 or rnd == int(cfg.num_rounds)
    # Evaluation B's linearisation point: the shared leaves the round starts from (a
    # copy: the round donates the state), or the run's initial ones.
    self._start_shared = None
    if run.alpha_tune_fn is not None or (evaluated and run.eval_linear_fn is not None):
      self._start_shared = (jax.tree.map(jnp.copy, state.shared)
                            if run.algorithm.client.linearize_at == 'start' else
                            run_lib.place(run.mesh, {k: jnp.asarray(run.trainable[k])
                                                     for k in state.shared}))
    state, out = run.round_fn(state, run.backbone, self.schedule[rnd - 1], *self.feed(rnd - 1))
    if progress is not None:
      progress(1)
    tuned = {}
    if run.alpha_tune_fn is not None:  # a diverged round's state is never kept
      state, tuned = run_lib.tune_alpha(run, state, self._start_shared)
    return state, dict(out, tuned=tuned)

  def divergence(self, rnd: int, out: dict) -> str | None:
    """One line naming the pairs whose round went non-finite, or None."""
    slots = self.run.setting.schedule[rnd - 1]
    bad = [self.run.setting.pair_name(p) for p, ok, real in zip(slots, out['finite'],
                                                                out['real'])
           if real and not ok]
    if not bad and out['agg_finite']:
      return None
    what = (f'training loss or parameters of {", ".join(bad)}' if bad
            else 'aggregated parameters or server state')
    return f'round {rnd}: non-finite {what} ({self.config.algorithm})'

  def divergence_hint(self) -> str:
    """What to try when a round goes non-finite."""
    if (algorithms.parse(self.config.algorithm)[-1] == 'matu'
        and self.config.get('matu', {}).get('combine', 'sum') == 'sum'):
      return ("MaTU's Eq. 7 sum adds the similar tasks' cumulative vectors every round and "
              "can grow without bound (metrics.jsonl: matu_tau_l1); try matu.combine='avg'")
    return 'lower optim.lr or check the data'

  def round_rows(self, rnd: int, out: dict) -> list[dict]:
    """A train row per real (client, task) pair; the agg row with the upload bits."""
    st = self.run.setting
    slots, real = st.schedule[rnd - 1], out['real']
    round_bits = self.bits[slots][real]
    rows = [{'round': rnd, 'type': 'train', 'client': f'client{st.pairs[p][0]}',
             'task': st.tasks[st.pairs[p][1]], 'loss': float(loss), 'steps': int(steps)}
            for p, loss, steps, r in zip(slots, out['loss'], out['steps'], real) if r]
    rows.append({'round': rnd, 'type': 'agg', 'upload_bits': int(round(round_bits.sum())),
                 'bits_per_task': float(round_bits.mean()),
                 **{k: np.asarray(v).tolist() for k, v in out['agg'].items()}, **out['tuned']})
    rows.append(self.comm_row(rnd, np.asarray(slots)[np.asarray(real, bool)]))
    return rows

  def comm_row(self, rnd: int, pairs: np.ndarray) -> dict:
    """The round's 'comm' row (`fedjax_mtl.comm`'s format): each client uploads its
    pairs' bits (`run_lib.upload_bits`) and downloads the same encoding back (its
    pairs' aggregated adapters and heads; MaTU: the unified vector with each task's
    mask and rescaler); clients without a pair this round send nothing."""
    st = self.run.setting
    n = int(self.config.many.num_clients)
    bits = np.zeros(n)
    np.add.at(bits, st.pairs[pairs, 0], self.bits[pairs])
    up = np.ceil(bits / 8).astype(np.int64)
    return comm.comm_row(rnd, up, up)

  def meta_rows(self) -> list[dict]:
    return []

  # ---- evaluation -------------------------------------------------------------------

  def evaluate(self, state, rnd: int) -> list[dict]:
    """Per task: top-1 accuracy (%) and test loss, averaged over the evaluated models
    (and the linearised model's, NTKFedAvg's evaluation B)."""
    start = self._start_shared if self.run.eval_linear_fn is not None else None
    return [{'round': rnd, 'type': 'eval', **r}
            for r in run_lib.evaluate(self.run, state, self.test, start)]

  def eval_summary(self, eval_rows: list[dict]) -> str:
    """The progress line's evaluation part: the mean accuracy over tasks."""
    acc = [r['value'] for r in eval_rows if r.get('metric') == 'accuracy']
    return f'mean accuracy {np.mean(acc):.2f}' if acc else ''

  # ---- records ----------------------------------------------------------------------

  def write_reports(self, rows: list[dict], final: list[dict], workdir: str) -> None:
    """curves.png and results.md / results.csv."""
    mean_bits = float(np.mean([r['bits_per_task'] for r in rows if r['type'] == 'agg']))
    report.plot_task_curves(rows, workdir)
    md, csv = run_lib.results(self.run, final, mean_bits)
    report.atomic_write(os.path.join(workdir, 'results.md'), md)
    report.atomic_write(os.path.join(workdir, 'results.csv'), csv)
