"""Multi-process runs on the JAX distributed runtime (fedjax_mtl/distributed.py).

One process with 4 CPU devices runs the smoke hca2 config (`multihost_worker.py`)
and matches the same run on one device (tests/agreement.py says how runs on other
meshes are compared). Two processes on 127.0.0.1 with 2 CPU devices each run the
smoke FedAvg config; one of them gets SIGTERM, both stop after the same round with
its checkpoint, then resume; the result matches the run on one device. Bad settings
end with one `error:` line before anything is written.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import agreement
from fedjax_mtl import distributed
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.report import read_jsonl

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _env(devices: int, **extra) -> dict:
  env = dict(os.environ, XLA_FLAGS=os.environ.get('XLA_FLAGS', '')
             + f' --xla_force_host_platform_device_count={devices}')
  env.update({k: str(v) for k, v in extra.items()})
  return env


def _launch(args: list[str], devices=(2, 2), port=None, cwd=HERE, log=None) -> list:
  """One process per entry of `devices` (its device count), joined at 127.0.0.1:port."""
  port = port or _free_port()
  return [subprocess.Popen(args, cwd=cwd, stdout=log or subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True,
                           env=_env(n, JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}',
                                    JAX_NUM_PROCESSES=len(devices), JAX_PROCESS_ID=i))
          for i, n in enumerate(devices)]


def _wait(procs, timeout=400) -> list[tuple[int, str]]:
  out = []
  for p in procs:
    text, _ = p.communicate(timeout=timeout)
    out.append((p.returncode, text or ''))
  return out


WORKER = [sys.executable, 'multihost_worker.py']


def _rows(npz) -> dict:
  return {k: np.asarray(npz[k], np.float64) for k in npz.files
          if k.startswith(('encoder', 'decoder', 'head'))}


def _assert_same_run(got, ev_got: list, ref, num_padded: int) -> None:
  """Model rows and evaluation rows of a run on another mesh against the one-device
  `ref` (agreement.py: under SGD their differences stay rounding-sized)."""
  print(agreement.assert_agree(got, ref.final, ref.init, ref.exp.fed.num_clients, num_padded))
  ev_want = ref.result['eval']
  assert [(r['client'], r['task'], r['metric']) for r in ev_got] == [
      (r['client'], r['task'], r['metric']) for r in ev_want]
  # Thresholded metrics (mIoU, odsF, maxF) flip with a near-tied pixel; depth RMSE is a
  # smooth function of the models compared above.
  smooth = [i for i, r in enumerate(ev_want) if r['metric'] == 'RMSE']
  assert smooth
  np.testing.assert_allclose([ev_got[i]['value'] for i in smooth],
                             [ev_want[i]['value'] for i in smooth], rtol=1e-4)


def test_four_devices_match_one_device(reference_run, tmp_path):
  from multihost_worker import config
  r = subprocess.run(WORKER + [str(tmp_path / 'one.npz'), str(tmp_path / 'wd')], cwd=HERE,
                     env=_env(4), capture_output=True, text=True, timeout=400)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  got = np.load(tmp_path / 'one.npz')
  assert int(got['num_devices']) == 4 and int(got['devices_holding_clients']) == 4
  # pascal: 4 single-task clients; nyud: 1 multi-task client padded to 4 devices.
  assert int(got['num_padded_clients']) == 4 + 4
  _assert_same_run(_rows(got), json.loads(str(got['eval'])), reference_run(config('hca2')), 8)


def test_two_processes_stopped_by_sigterm_and_resumed_match_one_process(reference_run,
                                                                         tmp_path):
  from multihost_worker import config
  # Two processes, one shared workdir: process 1 alone gets SIGTERM (a preempted host)
  # once round 1 is done; both stop after the same round, its checkpoint saved.
  wd = tmp_path / 'wd2'
  worker = WORKER + [str(tmp_path / 'two.npz'), str(wd), 'fedavg']
  log = open(tmp_path / 'first.log', 'w')
  procs = _launch(worker, log=log)
  deadline = time.monotonic() + 400
  metrics = wd / 'metrics.jsonl'
  while not (metrics.exists() and any(r['type'] == 'train' for r in read_jsonl(str(metrics)))):
    assert all(p.poll() is None for p in procs), open(tmp_path / 'first.log').read()[-3000:]
    assert time.monotonic() < deadline, 'no round 1'
    time.sleep(0.05)
  procs[1].send_signal(signal.SIGTERM)
  assert [p.wait(timeout=200) for p in procs] == [75, 75], open(tmp_path / 'first.log').read()
  stops = re.findall(r'^stopped at round (\d) on SIGTERM; checkpoint saved; re-run the same '
                     r'command to resume$', open(tmp_path / 'first.log').read(), re.M)
  assert len(stops) == 1  # process 0's line
  stopped = int(stops[0])
  assert 1 <= stopped < 4 and not (tmp_path / 'two.npz').exists()
  assert sorted(os.listdir(wd / 'checkpoints')) == [str(stopped)]  # saved on the signal
  assert max(r['round'] for r in read_jsonl(str(metrics))) == stopped

  resumed = _wait(_launch(worker))
  for rc, text in resumed:
    assert rc == 0, text[-3000:]
  # Process 0 alone prints the round summaries; it resumed after the saved round.
  assert [re.findall(r'^round (\d)', t, re.M) for _, t in resumed] == [
      [str(r) for r in range(stopped + 1, 5)], []]

  got = np.load(tmp_path / 'two.npz')
  assert int(got['num_processes']) == 2 and int(got['num_devices']) == 4
  # The client axis spans both processes' devices: the aggregation's collectives cross
  # processes (gloo over TCP).
  assert int(got['processes_holding_clients']) == 2 and int(got['devices_holding_clients']) == 4
  ref = reference_run(config('fedavg'))
  _assert_same_run(_rows(got), json.loads(str(got['eval'])), ref, 8)
  # One metrics file, written by process 0: every round once, training losses as in
  # the one-process run.
  rows, want = read_jsonl(str(wd / 'metrics.jsonl')), read_jsonl(
      os.path.join(ref.workdir, 'metrics.jsonl'))
  key = lambda r: (r['round'], r['type'], r.get('client'), r.get('task'), r.get('metric'))
  assert sorted(map(key, rows)) == sorted(map(key, want))
  loss = lambda rs: [r['loss'] for r in sorted(rs, key=key) if r['type'] == 'train']
  np.testing.assert_allclose(loss(rows), loss(want), rtol=1e-4)
  for f in ('results.md', 'results.csv', 'curves.png'):
    assert (wd / f).is_file(), f


def test_many_task_two_processes_match_one_process(tmp_path):
  """The many-task setting on two processes (2 devices each): the round's slots spread
  over all four devices (the aggregation's sums cross processes), the state
  replicated; the result matches the one-device run (agreement.py's bound, per leaf)."""
  from multihost_worker import config
  from fedjax_mtl import train
  from fedjax_mtl.manytask import run as run_lib
  cfg = config('many_fedavg')
  want_out = train.train_and_evaluate(cfg, str(tmp_path / 'one'))
  want = agreement.many_task_rows(want_out['state'])
  init = agreement.many_task_rows(run_lib.init_state(run_lib.build_run(cfg)))
  worker = WORKER + [str(tmp_path / 'two.npz'), str(tmp_path / 'wd'), 'many_fedavg']
  for rc, text in _wait(_launch(worker)):
    assert rc == 0, text[-3000:]
  got = np.load(tmp_path / 'two.npz')
  assert int(got['num_processes']) == 2 and int(got['mesh_processes']) == 2
  assert int(got['num_slots']) % 4 == 0  # padded with the dummy pair to the device count
  # The fault padding slots would make (weighed into the means: every update shrunk by
  # 5/8) is far outside the bound.
  print(agreement.assert_many_task_agree({k: np.asarray(got[k], np.float64) for k in want},
                                         want, init))
  ev_got = json.loads(str(got['eval']))
  assert [(r['task'], r['metric']) for r in ev_got] == [
      (r['task'], r['metric']) for r in want_out['eval']]
  losses = [i for i, r in enumerate(ev_got) if r['metric'] == 'loss']
  np.testing.assert_allclose([ev_got[i]['value'] for i in losses],
                             [want_out['eval'][i]['value'] for i in losses], rtol=1e-4)


@pytest.mark.parametrize('process_id,expected', [
    # Nobody serves the coordinator: process 1 gives up on reaching it.
    (1, ('error: coordinator 127.0.0.1:', 'cannot be reached after 3 s')),
    # Process 0 serves the coordinator; process 1 never starts.
    (0, ('error: the 2 processes did not all join coordinator 127.0.0.1:',
         'within 3 s (this is process 0)')),
])
def test_a_missing_process_is_one_error_line_after_the_timeout(tmp_path, process_id, expected):
  t0 = time.monotonic()
  r = subprocess.run([sys.executable, '-m', 'fedjax_mtl.main', '--config=configs/hca2.py:smoke',
                      f'--workdir={tmp_path / "wd"}',
                      f'--config.distributed.coordinator=127.0.0.1:{_free_port()}',
                      '--config.distributed.num_processes=2',
                      f'--config.distributed.process_id={process_id}',
                      '--config.distributed.timeout_s=3'],
                     cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert r.returncode == 2
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(expected[0]), r.stderr[-2000:]
  assert expected[1] in lines[0]
  assert time.monotonic() - t0 < 60
  assert not (tmp_path / 'wd').exists()


def test_processes_with_unequal_device_counts_are_refused(tmp_path):
  procs = _launch([sys.executable, '-m', 'fedjax_mtl.main', '--config=configs/hca2.py:smoke',
                   f'--workdir={tmp_path / "wd"}', '--config.distributed.timeout_s=60'],
                  devices=(2, 1), cwd=ROOT)
  for rc, text in _wait(procs, timeout=200):
    assert rc == 2, text[-2000:]
    errors = [line for line in text.splitlines() if line.startswith('error:')]
    assert errors == ['error: the 2 processes have unequal device counts (process 0: 2, '
                      'process 1: 1); the clients cannot be split evenly over them'], text[-2000:]
  assert not (tmp_path / 'wd').exists()


@pytest.mark.parametrize('block,env,message', [
    ({'num_processes': 2, 'process_id': 0}, {}, 'needs the coordinator address'),
    ({'coordinator': 'localhost', 'num_processes': 2}, {}, "is not host:port"),
    ({'coordinator': 'h:1234', 'num_processes': 2, 'process_id': 2}, {},
     'process id 2 is not one of 0..1'),
    ({}, {'JAX_COORDINATOR_ADDRESS': 'h:1234', 'JAX_NUM_PROCESSES': '2'},
     'process id -1 is not one of 0..1'),
    ({}, {'JAX_COORDINATOR_ADDRESS': 'h:1234'}, 'the process count is not'),
    ({'coordinator': 'h:1', 'num_processes': 2, 'process_id': 0, 'timeout_s': 0.}, {},
     'timeout_s must be > 0'),
])
def test_bad_settings_are_one_line(block, env, message):
  from conftest import tiny_config
  c = tiny_config('hca2')
  c.distributed.update(block)
  with pytest.raises(ConfigError, match=re.escape(message)):
    distributed.settings(c, environ=env)


def test_settings_come_from_the_config_before_the_environment():
  from conftest import tiny_config
  c = tiny_config('hca2')
  assert distributed.settings(c, environ={}) is None
  env = {'JAX_COORDINATOR_ADDRESS': '10.0.0.1:1234', 'JAX_NUM_PROCESSES': '4',
         'JAX_PROCESS_ID': '3'}
  assert distributed.settings(c, environ=env) == distributed.Settings('10.0.0.1:1234', 4, 3, 300.)
  c.distributed.update({'coordinator': 'head:99', 'process_id': 0})
  assert distributed.settings(c, environ=env) == distributed.Settings('head:99', 4, 0, 300.)


def test_settings_after_jax_started_are_one_line():
  import jax.numpy as jnp
  from conftest import tiny_config
  jnp.zeros(1).block_until_ready()  # this test process's backends exist
  c = tiny_config('hca2')
  c.distributed.update({'coordinator': '127.0.0.1:1', 'num_processes': 2, 'process_id': 1})
  with pytest.raises(ConfigError, match='came after JAX started its devices'):
    distributed.initialize(c)
