"""grain worker processes end with the run that started them, even a SIGKILLed one
(Linux: the processes are read from /proc)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

CHILD = textwrap.dedent('''
    import os, sys, time
    import numpy as np
    from fedjax_mtl.data import pipeline
    source = [{'x': np.full((4,), i, np.float32)} for i in range(64)]
    it = pipeline.train_loader(source, None, 2, seed=0, epoch=0, transforms=[], worker_count=2)
    next(it)  # the workers are up
    print('ready', flush=True)
    time.sleep(120)
''')


def _children(pid: int) -> set[int]:
  out = set()
  for tid in os.listdir(f'/proc/{pid}/task'):
    with open(f'/proc/{pid}/task/{tid}/children') as f:
      out |= {int(p) for p in f.read().split()}
  return out


def _alive(pid: int) -> bool:
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().split(')')[-1].split()[0] != 'Z'
  except FileNotFoundError:
    return False


def test_workers_exit_when_the_run_is_killed():
  proc = subprocess.Popen([sys.executable, '-c', CHILD], stdout=subprocess.PIPE, text=True)
  try:
    assert proc.stdout.readline().strip() == 'ready'
    workers = _children(proc.pid)
    assert len(workers) >= 2  # two grain workers (and multiprocessing's helper)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 30
    while time.time() < deadline and any(_alive(p) for p in workers):
      time.sleep(0.2)
    left = [p for p in workers if _alive(p)]
    for p in left:
      os.kill(p, signal.SIGKILL)
    assert not left, f'worker processes {left} outlived their killed run'
  finally:
    if proc.poll() is None:
      proc.kill()
