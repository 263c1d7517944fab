"""The Flower adapter deployed as a real federation (deploy/flower, the commands of its
README): a SuperLink and one SuperNode per client, separate processes on 127.0.0.1,
the App submitted with `flwr run`. The smoke FedHCA2 run of test_flower's config (SGD,
2 rounds) on the `mt_only` scenario (2 clients: PASCAL and NYUD, both multi-task)
writes the rows, losses and metric rows `simulate.in_process` computes for the same
config; a SuperNode killed in the middle of round 1 ends its run (not a hang) with one
line naming its client, in the run's status (`flwr ls`) and log (`flwr log`). Flower's
simulation engine (ClientApps in a Ray worker) runs the same config to the same bits.

Each run has a federation of its own, and they overlap: the full run is submitted when
the SuperNode is killed, so the killed run's handshake has the CPUs to itself (well
within its timeout) and its server's wait for the dead node costs no time. Every
process shares this session's XLA flags and persistent compilation cache (conftest.py).
"""

import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

import agreement
from fedjax_mtl.flower import server, simulate
from fedjax_mtl.report import read_jsonl

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
APP = os.path.join(ROOT, 'deploy', 'flower')
CONNECTION = 'fedjax-test'  # the SuperLink connection in $FLWR_HOME/config.toml

# test_flower's config (`multihost_worker.config('hca2')`: the smoke FedHCA2 config, 2
# rounds under agreement.SGD) through the run config's `overrides`, on 2 clients.
OVERRIDES = {'scenario': 'mt_only', 'num_rounds': 2, 'checkpoint_every': 2, 'progress': False,
             **agreement.SGD}
NUM_CLIENTS = 2
DEADLINE = 300  # seconds from the start: a run that has not finished by then fails
# The killed run's `timeout`, the seconds its server waits for a round's replies: long
# enough for client 0's first round on a loaded machine (its ClientApp process starts,
# builds the run and trains: about 10 s here), and shorter than the 37.5 s after which
# the SuperLink may declare the killed node offline (it allows a SuperNode 2 heartbeat
# intervals of 30 s; one comes every 17.5-22.5 s), so that the line is the server's
# own timeout, known in advance (Flower's "Node Unavailable" error reply, which comes
# later, names the client too: test_flower's lost-node test).
KILL_TIMEOUT = 30
KILLED_NODE = 1


def _bin(name: str) -> str:
  """A Flower command (flower-superlink, flower-supernode, flwr) of this environment."""
  here = os.path.join(os.path.dirname(sys.executable), name)
  return here if os.path.exists(here) else shutil.which(name) or name


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _read(path: str) -> str:
  try:
    with open(path, errors='replace') as f:
      return f.read()
  except OSError:
    return ''


def _kill(procs: list[subprocess.Popen]) -> None:
  """SIGKILL each of `procs` and every process below it (a SuperLink or SuperNode starts
  a SuperExec in a session of its own, which starts the ServerApp or the ClientApps),
  and wait until they are gone (or zombies, the ones not ours to reap)."""
  tree = []
  for proc in procs:
    try:
      top = psutil.Process(proc.pid)
      tree += [top] + top.children(recursive=True)
    except psutil.NoSuchProcess:
      pass
  for p in tree:
    try:
      p.send_signal(signal.SIGKILL)
    except psutil.NoSuchProcess:
      pass
  for proc in procs:
    proc.wait(timeout=30)
  deadline = time.time() + 30
  for p in tree:
    try:
      while p.status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
        time.sleep(0.02)
    except psutil.NoSuchProcess:
      pass


class Federation:
  """A SuperLink and one SuperNode per client (`partition-id` i), started as the
  README starts them (cwd: the repository root, where `configs/hca2.py` resolves), and
  the Flower configuration (`$FLWR_HOME/config.toml`) naming the SuperLink."""

  def __init__(self, tmp: str):
    self.tmp = tmp
    self.home = os.path.join(tmp, 'flwr_home')
    os.makedirs(self.home)
    self.env = dict(os.environ, FLWR_HOME=self.home, FLWR_TELEMETRY_ENABLED='0',
                    FLWR_DISABLE_UPDATE_CHECK='1', XLA_PYTHON_CLIENT_PREALLOCATE='false')
    self.port = _free_port()
    self.procs: dict[str, subprocess.Popen] = {}
    self.logs: dict[str, str] = {}
    with open(os.path.join(self.home, 'config.toml'), 'w') as f:
      f.write(f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
              f'address = "127.0.0.1:{self.port}"\ninsecure = true\n')

  def start(self) -> None:
    self._spawn('superlink', ['flower-superlink', '--insecure', '--host', '127.0.0.1',
                              '--port', str(self.port),
                              '--disable-runtime-dependency-installation'])
    for i in range(NUM_CLIENTS):
      self._spawn(f'supernode{i}', ['flower-supernode', '--insecure',
                                    '--superlink', f'127.0.0.1:{self.port}',
                                    '--port', str(_free_port()),
                                    '--node-config', f'partition-id={i}'])

  def wait_listening(self, deadline: float) -> None:
    while True:  # `flwr run` needs the SuperLink's Control API
      self.check_alive()
      with socket.socket() as s:
        if s.connect_ex(('127.0.0.1', self.port)) == 0:
          return
      assert time.time() < deadline, 'the SuperLink did not start\n' + self.tails()
      time.sleep(0.2)

  def _spawn(self, name: str, args: list[str]) -> None:
    self.logs[name] = log = os.path.join(self.tmp, f'{name}.log')
    with open(log, 'w') as out:
      self.procs[name] = subprocess.Popen([_bin(args[0])] + args[1:], cwd=ROOT,
                                          env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True)

  def check_alive(self, but=()) -> None:
    for name, p in self.procs.items():
      if name not in but and p.poll() is not None:
        pytest.fail(f'{name} exited with {p.returncode}\n' + self.tails())

  def wait_log(self, name: str, text: str, deadline: float, but=()) -> float | None:
    """When `text` appeared in `name`'s log (None: not by `deadline`)."""
    while time.time() < deadline:
      if text in _read(self.logs[name]):
        return time.time()
      self.check_alive(but)
      time.sleep(0.1)
    return None

  def tails(self, n: int = 40) -> str:
    return '\n'.join(f'--- {name}.log\n' + ''.join(_read(log).splitlines(True)[-n:])
                     for name, log in self.logs.items())

  def flwr(self, *args: str, timeout: float = 60) -> str:
    r = subprocess.run([_bin('flwr'), *args], cwd=ROOT, env=self.env,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f'flwr {" ".join(args)}: {r.returncode}\n{r.stdout}\n{r.stderr}'
    return r.stdout

  def run(self, workdir: str, timeout: float) -> int:
    """`flwr run deploy/flower` with this module's overrides; the run's id."""
    run_config = os.path.join(self.tmp, 'run_config.toml')
    with open(run_config, 'w') as f:  # JSON strings are TOML basic strings
      f.write(f'overrides = {json.dumps(json.dumps(OVERRIDES))}\n'
              f'workdir = {json.dumps(workdir)}\ntimeout = {timeout}\n')
    out = self.flwr('run', APP, CONNECTION, '--run-config', run_config, '--format', 'json')
    return int(json.loads(out[out.index('{'):])['run-id'])

  def wait_finished(self, run_id: int, deadline: float, but=()) -> dict:
    """Wait until the SuperLink reports the run's ServerApp finished; the run as
    `flwr ls --run-id` reports it."""
    done = re.compile(rf'Finished task \d+ of run {run_id}\b')
    while not done.search(_read(self.logs['superlink'])):
      self.check_alive(but)
      assert time.time() < deadline, f'run {run_id} did not finish in time\n' + self.tails()
      time.sleep(0.5)
    out = self.flwr('ls', '--run-id', str(run_id), '--format', 'json')
    return json.loads(out[out.index('{'):])['runs'][0]


@pytest.fixture(scope='module')
def deployment(tmp_path_factory):
  """Two federations: on 'killed', SuperNode KILLED_NODE and its ClientApp are killed
  once round 1's train message reached them; 'full' runs to its end, submitted then.
  Every process is killed at the end."""
  tmp = tmp_path_factory.mktemp('flower_deploy')
  t0 = time.time()
  feds = {name: Federation(str(tmp / name)) for name in ('killed', 'full')}
  try:
    for fed in feds.values():
      fed.start()
    for fed in feds.values():
      fed.wait_listening(t0 + 60)
    fed = feds['killed']
    ids = {'killed': fed.run(str(tmp / 'killed' / 'wd'), timeout=KILL_TIMEOUT)}
    node = f'supernode{KILLED_NODE}'
    assert fed.wait_log(node, 'Receiving: train message', t0 + DEADLINE), (
        f'SuperNode {KILLED_NODE} got no train message\n' + fed.tails())
    _kill([fed.procs[node]])
    times = {'killed': time.time()}
    ids['full'] = feds['full'].run(str(tmp / 'full' / 'wd'), timeout=600)
    times['full'] = time.time()
    yield {'feds': feds, 'ids': ids, 'times': times, 'tmp': tmp, 't0': t0}
  finally:
    _kill([p for fed in feds.values() for p in fed.procs.values()])


def config():
  return server.config_from_run({'config': os.path.join(ROOT, 'configs/hca2.py:smoke'),
                                 'overrides': json.dumps(OVERRIDES)})


def test_the_overrides_give_test_flowers_config():
  from conftest import override
  from test_flower import config as flower_config
  want = override(flower_config(), scenario='mt_only')
  assert config().to_json_best_effort(sort_keys=True) == want.to_json_best_effort(sort_keys=True)


def _rows(npz: dict) -> dict:
  """`read_final_rows`' arrays in `agreement.model_rows`' layout (`encoder[...]`)."""
  return {re.sub(r"^\['(\w+)'\]", r'\1', k): np.asarray(v, np.float64) for k, v in npz.items()}


@pytest.fixture(scope='module')
def in_process_run(tmp_path_factory):
  """(workdir, strategy) of `simulate.in_process` on the config: the reference of the
  deployed run (computed while it runs: set up after `deployment`) and of the Ray run."""
  wd = tmp_path_factory.mktemp('in_process') / 'wd'
  strategy = simulate.in_process(config(), str(wd))
  return str(wd), strategy, time.time()


def test_a_deployed_run_computes_what_the_in_process_run_computes(deployment, in_process_run):
  """The deployed run's final rows (`final_rows.npz`), train losses and metric rows are
  those of `simulate.in_process` on the same config."""
  fed, run_id = deployment['feds']['full'], deployment['ids']['full']
  t0 = deployment['t0']
  # The reference, computed while the deployment runs.
  cfg = config()
  init = agreement.flat_views(server.EngineStrategy(cfg).views)
  ref_wd, _, t1 = in_process_run
  run = fed.wait_finished(run_id, t0 + DEADLINE)
  t2 = time.time()
  assert run['status'] == 'finished:completed', (run, fed.tails())
  wd = str(deployment['tmp'] / 'full' / 'wd')
  got = _rows(server.read_final_rows(wd))
  want = _rows(server.read_final_rows(ref_wd))
  assert {k.split('[')[0] for k in want} == {'encoder', 'decoder'}
  # Each party runs the programs the in-process run runs (a client's rows at a time, the
  # same jitted server rule), compiled with the same flags: the rows agree to rounding
  # (agreement.py's bound; measured here: equal to the bit).
  diff = max(float(np.abs(got[k] - want[k]).max()) for k in want)
  t_full = deployment['times']['full']
  print(f'\nfrom the start: deployed run submitted at {t_full - t0:.1f} s, finished at '
        f'{t2 - t0:.1f} s; in-process run done at {t1 - t0:.1f} s; '
        f'max |deployed - in-process| = {diff:.3g};',
        agreement.assert_within_bound(got, want, init))
  rows = read_jsonl(os.path.join(wd, 'metrics.jsonl'))
  ref = read_jsonl(os.path.join(ref_wd, 'metrics.jsonl'))
  key = lambda r: (r['round'], r['type'], r.get('client'), r.get('task'), r.get('metric'))
  assert sorted(map(key, rows)) == sorted(map(key, ref))
  assert {r['client'] for r in rows if r['type'] == 'train'} == {
      'pascal_mt_mt_0', 'nyud_mt_mt_0'}
  pick = lambda rs, t, f: [r[f] for r in sorted(rs, key=key) if r['type'] == t]
  np.testing.assert_allclose(pick(rows, 'train', 'loss'), pick(ref, 'train', 'loss'), rtol=1e-4)
  assert pick(rows, 'train', 'steps') == pick(ref, 'train', 'steps')
  np.testing.assert_allclose(pick(rows, 'agg', 'alpha'), pick(ref, 'agg', 'alpha'),
                             rtol=1e-4, atol=1e-6)
  # The deployment counts the bytes its messages carried (the in-process run sends none).
  assert all(sum(b) > 0 for b in pick(rows, 'comm', 'down_bytes'))
  assert pick(rows, 'comm', 'up_bytes') == pick(ref, 'comm', 'up_bytes')
  assert '(Flower)' in open(os.path.join(wd, 'results.md')).read()


def test_a_supernode_killed_mid_round_ends_the_run_naming_its_client(deployment):
  """SuperNode 1 and its ClientApp are killed once round 1's train message reached
  them: the server stops when the run's `timeout` passes, naming client 1; the run's
  status and its log carry the line, and the workdir holds no results."""
  fed, run_id = deployment['feds']['killed'], deployment['ids']['killed']
  t0, times = deployment['t0'], deployment['times']
  run = fed.wait_finished(run_id, t0 + DEADLINE, but=(f'supernode{KILLED_NODE}',))
  end = datetime.datetime.strptime(run['finished-at'], '%Y-%m-%d %H:%M:%SZ')
  end = end.replace(tzinfo=datetime.timezone.utc).timestamp()
  print(f'\nSuperNode {KILLED_NODE} killed {times["killed"] - t0:.1f} s from the start; its '
        f'run ended {end - times["killed"]:.0f} s after the kill')
  line = f'round 1 failed: no reply within {KILL_TIMEOUT} s from client(s) {KILLED_NODE}'
  assert run['status'] == 'finished:failed', run
  replied = 'Sending: train message' in _read(fed.logs[f'supernode{1 - KILLED_NODE}'])
  assert run['status-details'] == f'ServerApp failed with exception: {line}', (
      run, f'client 0 sent its round-1 reply: {replied}')
  assert line in fed.flwr('log', str(run_id), '--show')
  assert not os.path.exists(deployment['tmp'] / 'killed' / 'wd' / 'metrics.jsonl')


def test_flowers_simulation_engine_runs_what_the_in_process_run_computes(in_process_run,
                                                                        tmp_path):
  """`simulate.simulate`: the ServerApp here, the ClientApps in a Ray worker (Flower's
  simulation engine), on the same config: the same rows, losses and bytes as the
  in-process run's messages (one program per client in either place: equal to the bit
  on a CPU)."""
  ray = simulate.simulate(config(), str(tmp_path / 'ray'), num_workers=1)
  ref_wd, here, _ = in_process_run
  got, want = agreement.flat_views(ray.views), agreement.flat_views(here.views)
  assert got.keys() == want.keys() and got
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  rows = lambda d: sorted((r['round'], r['type'], r.get('client'), r.get('loss'),
                           r.get('up_bytes'), r.get('alpha'))
                          for r in read_jsonl(os.path.join(d, 'metrics.jsonl'))
                          if r['type'] in ('train', 'comm', 'agg'))
  assert rows(str(tmp_path / 'ray')) == rows(ref_wd)
  assert [t['round'] for t in ray.timing] == [1, 2]
