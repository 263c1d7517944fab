"""Preemption (fedjax_mtl/preempt.py): SIGTERM or SIGINT finishes the round in progress,
saves it and exits 75 with one line; the re-run resumes to the same files as a run
that was never stopped. A second SIGINT aborts at once. (Multi-process runs:
tests/test_multihost.py.)
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from fedjax_mtl import preempt
from fedjax_mtl.report import read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Six rounds, checkpoints only at the end (and on a signal): a signal sent in round 1
# lands rounds before the last one, however slow this machine is.
RUN = [sys.executable, '-m', 'fedjax_mtl.main', '--config=configs/hca2.py:smoke',
       '--config.num_rounds=6', '--config.checkpoint_every=6', '--config.progress=false']
LOOP = ('import sys, time\nfrom fedjax_mtl import preempt\n'
        'with preempt.Signals() as s:\n  print("ready", flush=True)\n'
        '  while not s.stop_after(1):\n    time.sleep(0.01)\n'
        '  print("stop", s.stop_after(1), flush=True)\n  time.sleep(60)\n')


def _wait_for(cond, proc, what, timeout=300):
  deadline = time.monotonic() + timeout
  while not cond():
    assert proc.poll() is None, f'exited {proc.returncode} before {what}: {proc.stderr.read()}'
    assert time.monotonic() < deadline, f'no {what} after {timeout} s'
    time.sleep(0.02)


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  """The same command's workdir, never stopped."""
  wd = tmp_path_factory.mktemp('whole') / 'wd'
  r = subprocess.run(RUN + [f'--workdir={wd}'], cwd=ROOT, capture_output=True, text=True,
                     timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  return wd


def test_sigterm_saves_the_round_in_progress_and_the_rerun_resumes_it(uninterrupted, tmp_path):
  # SIGINT takes the same path (`preempt.Signals`); its own behaviour is tested below.
  sig = signal.SIGTERM
  wd = tmp_path / 'wd'
  p = subprocess.Popen(RUN + [f'--workdir={wd}'], cwd=ROOT, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
  metrics = wd / 'metrics.jsonl'
  _wait_for(lambda: metrics.exists() and any(r['type'] == 'train'
                                             for r in read_jsonl(str(metrics))),
            p, 'round 1')
  p.send_signal(sig)
  out, err = p.communicate(timeout=300)
  name = signal.Signals(sig).name
  assert p.returncode == preempt.EXIT_CODE == 75, err[-3000:]
  last = err.strip().splitlines()[-1]
  stopped = int(last.split()[3].rstrip(';')) if last.startswith('stopped at round ') else None
  assert last == (f'stopped at round {stopped} on {name}; checkpoint saved; re-run the same '
                  'command to resume'), err[-3000:]
  assert f'{name}: finishing the round in progress and saving it' in err
  assert 1 <= stopped < 6
  # The round in progress was saved (no checkpoint was due), and nothing after it ran.
  assert sorted(os.listdir(wd / 'checkpoints')) == [str(stopped)]
  assert max(r['round'] for r in read_jsonl(str(metrics))) == stopped
  assert [l.split()[1] for l in out.splitlines() if l.startswith('round ')] == [
      f'{r}/6' for r in range(1, stopped + 1)]
  assert not (wd / 'results.md').exists()

  r = subprocess.run(RUN + [f'--workdir={wd}'], cwd=ROOT, capture_output=True, text=True,
                     timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  assert [l.split()[1] for l in r.stdout.splitlines() if l.startswith('round ')] == [
      f'{r}/6' for r in range(stopped + 1, 7)]
  for f in ('metrics.jsonl', 'results.md', 'results.csv', 'config.json'):
    assert (wd / f).read_bytes() == (uninterrupted / f).read_bytes(), f


def test_the_first_sigint_asks_to_stop_and_a_second_aborts_at_once():
  p = subprocess.Popen([sys.executable, '-c', LOOP], cwd=ROOT, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
  assert p.stdout.readline().strip() == 'ready'
  p.send_signal(signal.SIGINT)
  assert p.stdout.readline().strip() == 'stop SIGINT'  # the loop goes on to its round's end
  assert p.stderr.readline().strip() == ('SIGINT: finishing the round in progress and saving '
                                         'it; press Ctrl-C again to abort at once')
  t0 = time.monotonic()
  p.send_signal(signal.SIGINT)
  assert p.wait(timeout=30) == -signal.SIGINT and time.monotonic() - t0 < 10


def test_outside_the_round_loop_signals_keep_their_action():
  code = ('import signal\nfrom fedjax_mtl import preempt\n'
          'before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))\n'
          'with preempt.Signals() as s:\n'
          '  inside = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))\n'
          'assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before\n'
          'assert inside[0] == inside[1] != before[0]\n'
          'assert s.stop_after(1) is None\n')
  r = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                     timeout=60)
  assert r.returncode == 0, r.stderr
