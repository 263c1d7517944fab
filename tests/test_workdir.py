"""One writer per workdir (fedjax_mtl/workdir.py): an OS lock held for a run's life.

A second run, `scripts/compare.py` and the Flower server on a held workdir stop with
one `error:` line naming the holder's PID and host and touch nothing; a killed
holder leaves no stale lock; a run that fails before writing leaves no trace.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys

import pytest

from conftest import snapshot
from fedjax_mtl import workdir
from fedjax_mtl.workdir import WorkdirLocked

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOLD = ('import sys, time\nfrom fedjax_mtl import workdir\n'
        'with workdir.lock(sys.argv[1]):\n  print("held", flush=True)\n  time.sleep(600)\n')


@contextlib.contextmanager
def held_by_another_process(wd):
  """`wd` locked by a child process for the block; yields its PID."""
  p = subprocess.Popen([sys.executable, '-c', HOLD, str(wd)], cwd=ROOT, stdout=subprocess.PIPE,
                       text=True)
  try:
    assert p.stdout.readline().strip() == 'held'
    yield p
  finally:
    p.kill()
    p.wait()


def test_a_held_workdir_is_refused_naming_the_holder_and_left_untouched(tmp_path):
  wd = tmp_path / 'wd'
  wd.mkdir()
  (wd / 'metrics.jsonl').write_text('{"round": 1}\n')
  with held_by_another_process(wd) as holder:
    before = snapshot(wd)
    with pytest.raises(WorkdirLocked) as e:
      with workdir.lock(str(wd)):
        pass
    msg = str(e.value)
    assert msg == (f"workdir {str(wd)!r} is in use by another run (PID {holder.pid} on host "
                   f"{socket.gethostname()}, since {msg.split('since ')[1].split(')')[0]}); "
                   'wait for it to end or use another --workdir')
    assert workdir.holder(str(wd))['pid'] == holder.pid
    with pytest.raises(WorkdirLocked, match=f'PID {holder.pid} '):
      workdir.check_free(str(wd))
    assert snapshot(wd) == before
  # The holder was killed: the kernel released its lock, none is stale.
  assert workdir.holder(str(wd)) is None
  with workdir.lock(str(wd)):
    assert workdir.holder(str(wd))['pid'] == os.getpid()
  assert snapshot(wd) == {'metrics.jsonl': b'{"round": 1}\n'}  # the lock file is gone


def test_the_lock_is_reentrant_and_a_failed_start_leaves_no_trace(tmp_path):
  wd = tmp_path / 'new' / 'wd'
  with pytest.raises(RuntimeError):
    with workdir.lock(str(wd)):
      with workdir.lock(str(wd)):  # the same process may enter again (a script and its run)
        assert wd.is_dir()
      raise RuntimeError('failed before writing')
  assert not (tmp_path / 'new').exists()  # the folders the lock made are gone again
  with workdir.lock(str(wd)):
    (wd / 'config.json').write_text('{}')
  assert snapshot(wd) == {'config.json': b'{}'}


def test_a_second_main_on_a_held_workdir_exits_2_with_one_line(tmp_path):
  wd = tmp_path / 'wd'
  wd.mkdir()
  (wd / 'notes.txt').write_text('keep me')
  with held_by_another_process(wd) as holder:
    before = snapshot(wd)
    r = subprocess.run([sys.executable, '-m', 'fedjax_mtl.main', '--config=configs/hca2.py:smoke',
                        f'--workdir={wd}'], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f'error: workdir {str(wd)!r} is in use by '
                                                   f'another run (PID {holder.pid} on host ')
    assert snapshot(wd) == before


def test_compare_and_flower_respect_the_lock(tmp_path):
  from fedjax_mtl import compare
  from fedjax_mtl.flower import simulate
  from conftest import tiny_config
  run = tmp_path / 'out' / 'fedavg' / 'seed0'
  run.mkdir(parents=True)
  with held_by_another_process(run) as holder:
    before = snapshot(tmp_path)
    for hold in (None, contextlib.ExitStack()):
      with pytest.raises(WorkdirLocked, match=f'PID {holder.pid} '):
        compare.plan_runs(['fedavg=configs/fedavg.py:smoke'], [0], str(tmp_path / 'out'),
                          hold=hold)
    with pytest.raises(WorkdirLocked, match=f'PID {holder.pid} '):
      simulate.simulate(tiny_config('hca2'), str(run))
    with pytest.raises(WorkdirLocked, match=f'PID {holder.pid} '):
      simulate.in_process(tiny_config('hca2'), str(run))
    assert snapshot(tmp_path) == before
  # compare.py holds every planned run folder while the comparison lasts.
  with contextlib.ExitStack() as hold:
    plan = compare.plan_runs(['fedavg=configs/fedavg.py:smoke', 'local=configs/local.py:smoke'],
                             [0, 1], str(tmp_path / 'out'), hold=hold)
    assert all(workdir.holder(r.workdir)['pid'] == os.getpid() for r in plan)
    p = subprocess.run([sys.executable, '-c', HOLD, plan[-1].workdir], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and 'WorkdirLocked' in p.stderr
  assert all(workdir.holder(r.workdir) is None for r in plan)
  assert not (tmp_path / 'out' / 'local').exists()  # nothing ran there: nothing is left
