"""Preemption: on SIGTERM or SIGINT a run finishes its round, saves it and exits 75.

Clusters (SLURM, Kubernetes, preemptible cloud VMs) send SIGTERM and kill a grace
period later. While the round loop runs (`Signals`), the first SIGTERM or SIGINT
only sets a flag: the round in progress runs to its end (training, aggregation,
its evaluation and rows), its checkpoint is saved and committed, and the run
stops with one line, `stopped at round R on SIGTERM; checkpoint saved; re-run the
same command to resume`, and exit code `EXIT_CODE` (75, EX_TEMPFAIL: retry). The
re-run resumes bitwise from that round. A signal during the last round lets the
run finish as usual (exit 0). After the first SIGINT, a second one aborts at once
(the default action: the process ends with 130), as does any signal outside the
round loop (nothing is trained there yet).

Multi-process runs must stop at the same round on every process, also when only
one process is signalled. There SIGTERM is JAX's preemption notice (the
distributed runtime's notifier catches it and the coordination service spreads
it to every process), and `multihost_utils.reached_preemption_sync_point` names
the round at which all processes stop; a SIGINT is passed on as that notice.
"""

from __future__ import annotations

import signal
import sys
import threading

EXIT_CODE = 75


class Stopped(Exception):
  """The run stopped after `round` on `signal_name`; its checkpoint is committed."""

  def __init__(self, round_: int, signal_name: str):
    self.round = round_
    self.signal_name = signal_name
    super().__init__(f'stopped at round {round_} on {signal_name}; checkpoint saved; '
                     're-run the same command to resume')


class Signals:
  """While entered (the round loop), SIGTERM and SIGINT ask the run to stop after the
  round in progress instead of ending the process; `stop_after(rnd)` says whether to."""

  def __init__(self, start: int = 0):
    self.start = start  # rounds done before this process's loop began
    self.received: str | None = None
    self._previous: dict[int, object] = {}
    self._multi = False

  def __enter__(self) -> 'Signals':
    if threading.current_thread() is not threading.main_thread():
      return self  # only the main thread may set handlers: signals keep their action
    import jax
    self._multi = jax.process_count() > 1
    if self._multi:
      if not _preemption_service():
        return self  # no notices can reach the other processes: signals keep their action
      self._reached(0)  # a notice from now on stops the run after its next round
    ours = (signal.SIGINT,) if self._multi else (signal.SIGTERM, signal.SIGINT)
    for sig in ours:
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous.clear()

  def _handle(self, signum: int, frame) -> None:
    name = signal.Signals(signum).name
    if signum == signal.SIGINT:
      signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second SIGINT aborts at once
      if self._multi:  # every process hears it as a preemption notice
        signal.raise_signal(signal.SIGTERM)
    if self.received is None:
      self.received = name
      print(f'{name}: finishing the round in progress and saving it'
            + ('; press Ctrl-C again to abort at once' if signum == signal.SIGINT else ''),
            file=sys.stderr, flush=True)

  def stop_after(self, rnd: int) -> str | None:
    """The signal's name if the run stops after round `rnd`, else None. Multi-process:
    collective (every process calls it after every round, with the same `rnd`)."""
    if self._multi:
      return (self.received or 'SIGTERM') if self._reached(rnd - self.start) else None
    return self.received

  def _reached(self, rounds_run: int) -> bool:
    """JAX's preemption sync point, counted in rounds this process ran: the protocol takes
    the largest count any process reported when the notice came, plus one; every process
    of a resumed run starts again from 0 at the same round."""
    if not _preemption_service():
      return False
    from jax.experimental import multihost_utils
    return multihost_utils.reached_preemption_sync_point(rounds_run)


def _preemption_service() -> bool:
  """Whether JAX's distributed runtime runs its preemption sync manager (the
  `jax_enable_preemption_service` option, on by default)."""
  from jax._src import distributed as _d  # the runtime's state (no public accessor)
  return _d.global_state.preemption_sync_manager is not None
