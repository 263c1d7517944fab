"""Engines: what a setting's rounds, evaluation and records are. The run loop
(`train.py`) knows only the `Engine` interface; `build(config)` picks the engine of
`config.setting`:

- `dense` (`engines/dense.py`): hetero-client dense prediction, FedHCA2's setting;
- `many_task` (`engines/many_task.py`): ViT + LoRA classification with many-task
  clients, MaTU's setting.

A sweep (`config.sweep`) runs either as replicas in one program: `engines/replicas.py`
(dense), `engines/many_replicas.py` (many-task).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from fedjax_mtl.errors import check_choice

SETTINGS = ('dense', 'many_task')


class Engine(Protocol):
  """A setting's rounds, evaluation and records, as the run loop drives them."""

  config: Any
  label: str  # the progress bar's title
  steps_per_round: int  # local steps the progress callback counts per round

  def open(self, start: int) -> None:
    """Open the data for the rounds after `start` (fails before anything is written)."""

  def close(self) -> None:
    """Release data workers and threads."""

  def abstract_state(self) -> Any:
    """The round-0 state's shapes (and shardings): what a checkpoint restores into."""

  def init_state(self) -> Any:
    """The round-0 state on the devices."""

  def round0_programs(self) -> list[tuple[str, Any, tuple]]:
    """(name, jitted, example args) of the programs that make the round-0 state (a
    fresh run compiles them while it traces the others; [] when `init_state` has
    none of its own)."""

  def programs_to_compile(self, state: Any) -> list[tuple[str, Any, tuple]]:
    """(name, jitted, example args) of a round's and an evaluation's programs, to
    compile before the first round (`state` may be abstract)."""

  def check_compiled(self, name: str, compiled: Any) -> None:
    """A compiled program of `programs_to_compile` (before anything is written):
    ConfigError (one line) when the run cannot hold it (a sweep's replicas that will
    not fit in memory)."""

  def run_round(self, state: Any, rnd: int,
                progress: Callable[[int], None] | None = None) -> tuple[Any, dict]:
    """Round `rnd` (1-based): local training and aggregation; (new state, outputs)."""

  def divergence(self, rnd: int, out: dict) -> str | None:
    """What went non-finite in round `rnd` (host outputs), one line; or None."""

  def divergence_hint(self) -> str:
    """What to try when a round goes non-finite."""

  def round_rows(self, rnd: int, out: dict) -> list[dict]:
    """The round's train and agg rows of metrics.jsonl (host outputs)."""

  def meta_rows(self) -> list[dict]:
    """Rows written once at a fresh start (names for plots)."""

  def evaluate(self, state: Any, rnd: int) -> list[dict]:
    """The round's eval rows of metrics.jsonl."""

  def eval_summary(self, eval_rows: list[dict]) -> str:
    """The evaluation part of the round's progress line."""

  def write_reports(self, rows: list[dict], final: list[dict], workdir: str) -> None:
    """Plots and result tables of a finished run (`rows`: all of metrics.jsonl)."""


def build(config) -> Engine:
  """The engine of `config.setting`, built (data opened by `Engine.open`)."""
  check_choice('setting', config.get('setting', 'dense'), SETTINGS)
  from fedjax_mtl import sweep, validate
  swept = validate.sweep_of(config)
  if config.get('setting', 'dense') == 'many_task':
    if swept is not None:
      from fedjax_mtl.engines import many_replicas
      sweep.check(config, swept)
      return many_replicas.ManyTaskReplicaEngine(config, swept)
    from fedjax_mtl.engines.many_task import ManyTaskEngine
    return ManyTaskEngine(config)
  from fedjax_mtl import experiment
  if swept is not None:
    from fedjax_mtl.engines import replicas
    sweep.check(config, swept)
    return replicas.ReplicaEngine(experiment.build(config), config, swept)
  from fedjax_mtl.engines.dense import DenseEngine
  return DenseEngine(experiment.build(config), config)
