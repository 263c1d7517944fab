"""What a run shows while it works: the compile phase, a step bar inside the
round, and an ETA from steady rounds only.

Everything goes to stderr through tqdm (the round summaries go to stdout via
`tqdm.write`). The step bar is drawn on terminals only, so that logs
redirected to a file hold one line per round, not one per update.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from tqdm import tqdm


def eta_seconds(times: list[tuple[float, bool]], rounds_left: int, evals_left: int
                ) -> float | None:
  """Seconds still to go from the rounds timed so far (`(seconds, evaluated)` each).

  The first round of a process is left out (a streamed feed compiles its
  trainers in it): the median of the later rounds without evaluation times
  the rounds left, plus the median extra of an evaluating round (over the
  plain median) times the evaluations left. None until a steady plain round
  exists.
  """
  steady = times[1:]
  plain = [t for t, e in steady if not e]
  if not plain:
    return None
  base = float(np.median(plain))
  extra = [t - base for t, e in times if e]
  per_eval = max(float(np.median(extra)), 0.) if extra else 0.
  return rounds_left * base + evals_left * per_eval


def _clock(seconds: float) -> str:
  m, s = divmod(int(round(seconds)), 60)
  h, m = divmod(m, 60)
  return f'{h}:{m:02d}:{s:02d}' if h else f'{m}:{s:02d}'


class Progress:
  """The run's progress display: compile phase, rounds bar with ETA, step bar."""

  def __init__(self, desc: str, total: int, start: int, eval_rounds: set[int],
               steps_per_round: int, enabled: bool = True, steps_bar: bool | None = None,
               summaries: bool = True):
    self.enabled, self.summaries = enabled, summaries
    self.total, self.eval_rounds = total, eval_rounds
    self.steps_per_round = steps_per_round
    self.desc, self.start = desc, start
    self.steps_bar = enabled and (sys.stderr.isatty() if steps_bar is None else steps_bar)
    self.times: list[tuple[float, bool]] = []
    self.bar = self.step = None

  def compiling(self, names: list[str], cache_dir: str | None,
                background: list[str] = ()) -> None:
    """Announce the compile phase (one line), and the programs compiled in the
    background while the first rounds run."""
    if not self.enabled or not (names or background):
      return
    where = (f'cached in {cache_dir} for the next run' if cache_dir
             else 'no compilation cache (--xla_cache_dir=none)')
    later = f'; {", ".join(background)} in the background' if background else ''
    tqdm.write(f'compiling {len(names)} programs ({", ".join(names)}){later}; {where} ...',
               file=sys.stderr)

  def compiled(self, seconds: dict[str, float], wall: float | None = None) -> None:
    """One line with the compile (or cache load) time of each program and the wall
    time of them all (`wall`; their sum when not given: some compile at once)."""
    if not self.enabled or not seconds:
      return
    parts = ', '.join(f'{k} {v:.1f}s' for k, v in seconds.items())
    total = sum(seconds.values()) if wall is None else wall
    tqdm.write(f'compiled in {total:.1f}s ({parts})', file=sys.stderr)

  def __enter__(self) -> Progress:
    self.bar = tqdm(total=self.total, initial=self.start, unit='round', disable=not self.enabled,
                    desc=self.desc, dynamic_ncols=True,
                    bar_format='{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} rounds '
                               '[{elapsed}{postfix}]')
    self.bar.set_postfix_str('ETA …', refresh=False)  # known after two plain rounds
    return self

  def round_start(self, rnd: int) -> None:
    """Open the step bar of round `rnd` (terminals only)."""
    self._t0 = time.time()
    if self.steps_bar:
      self.step = tqdm(total=self.steps_per_round, unit='step', leave=False, position=1,
                       desc=f'round {rnd}', dynamic_ncols=True)

  def step_callback(self):
    """`steps` when a step bar is drawn, else None: the in-memory feed then never
    waits for a group just to report it."""
    return self.steps if self.steps_bar else None

  def steps(self, n: int) -> None:
    """`n` local steps of a client group are done (the engine's `progress` callback)."""
    if self.step is not None:
      self.step.update(n)

  def round_seconds(self) -> float:
    """Wall seconds since `round_start`."""
    return time.time() - self._t0

  def round_end(self, rnd: int, dt: float, evaluated: bool, summary: str) -> None:
    """Close round `rnd` (`dt` seconds): update the ETA and print its summary."""
    if self.step is not None:
      self.step.close()
      self.step = None
    self.times.append((dt, evaluated))
    left = range(rnd + 1, self.total + 1)
    eta = eta_seconds(self.times, len(left), sum(r in self.eval_rounds for r in left))
    if not left:
      self.bar.set_postfix_str('done', refresh=False)
    elif eta is not None:
      self.bar.set_postfix_str(f'ETA {_clock(eta)}', refresh=False)
    self.bar.update(1)
    if self.summaries:
      tqdm.write(summary)

  def __exit__(self, *exc) -> None:
    if self.step is not None:
      self.step.close()
    self.bar.close()
