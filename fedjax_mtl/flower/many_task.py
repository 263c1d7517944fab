"""The Flower adapter's many-task setting (`setting='many_task'`, e.g. `configs/matu.py`,
`configs/fedavg.py:mini8`): the engine's round (`manytask/engine.py`) cut at its
seam (`engine.RoundParts`), local training on the clients, the aggregation on the
server. MaTU's own paper simulates its federation with Flower.

- **Nodes**: one Flower node per many-task client (`partition-id` = client id, as
  in the dense setting). Round r trains the slots `setting.schedule[r - 1]` (the
  round's (client, task) pairs, padded with the dummy pair); the clients holding a
  real slot take part.
- **Server** (`ManyTaskStrategy`): keeps the engine's `ManyState` (the global
  leaves, the task and pair rows, the rule's state). Each round it gathers each
  slot's start params and key (`RoundParts.start` / `keys`, jitted) and sends every
  taking-part client the global leaves once, its slots' task and pair rows and
  keys; it stacks the replies in slot order (the dummy slots: `RoundParts.idle`,
  what the engine's vmapped dummy slot yields), runs `RoundParts.aggregate` jitted
  and logs the engine's train and agg rows (`ManyTaskEngine.round_rows`, upload
  bits included). At evaluation rounds the server evaluates its own state
  (`manytask.run.evaluate`): each task's test split is the server's in MaTU's setup
  and the state holds every evaluated model, so no evaluate messages go out.
- **Client** (`ManyTaskClient`): stateless between rounds, like the engine's
  clients (a fresh optimizer every round). It trains its slots one after the
  other with the jitted per-slot trainer (`RoundParts.train`) on its own pairs'
  samples (a block of the training set of a size every client shares: one
  compiled program), with the engine's keys, and uploads per slot the finalized
  shared-role leaves (`upload`: what the rule aggregates), the trained leaves the
  server keeps per task or per pair (`kept`: the heads, personal leaves), the
  mean loss and the step count.

Personal leaves travel: the server holds the engine's whole state and evaluates
every model from it, so FedPer's and Local's personal rows go to their client and
come back each round. Every node builds the run from the config as the engine
does (it reads the benchmark), and a client trains on its own pairs' samples only.
Not supported, refused before Ray starts (`runtime.check_many_task`): NTKFedAvg's
in-run α tuning and frozen zero-shot heads.
"""

from __future__ import annotations

import time
from logging import INFO
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.supercore import log

from fedjax_mtl.engines.many_task import ManyTaskEngine
from fedjax_mtl.errors import ConfigError, DivergedError
from fedjax_mtl.flower import codec, nodes, runtime
from fedjax_mtl.manytask import run as run_lib
from fedjax_mtl.manytask import setting as setting_lib

PyTree = Any


def leaf_keys(run: run_lib.Run) -> dict[str, list[str]]:
  """The trainable leaves by what travels: 'global' (sent once per client), 'rows'
  (sent per slot: task and pair rows), 'upload' (returned per slot: the shared
  roles' leaves, finalized), 'kept' (returned per slot: the trained leaves the
  aggregation writes back per task or per pair, other than the shared roles' of a
  pair)."""
  shared = set(run.algorithm.shared_roles)
  names = sorted(run.trainable)
  where, roles = run.where, run.roles
  return {'global': [k for k in names if where[k] == 'global'],
          'rows': [k for k in names if where[k] != 'global'],
          'upload': [k for k in names if roles[k] in shared],
          'kept': [k for k in names if where[k] == 'task'
                   or (where[k] == 'pair' and roles[k] not in shared)]}


def slot_owners(setting: setting_lib.Setting, rnd: int) -> dict[int, list[int]]:
  """{client: its slots' positions} of round `rnd` (1-based), the real slots only."""
  out: dict[int, list[int]] = {}
  for j, p in enumerate(setting.schedule[rnd - 1]):
    if p < setting.num_pairs:
      out.setdefault(int(setting.pairs[p, 0]), []).append(j)
  return out


def _like(run: run_lib.Run, keys: list[str], n: int | None = None) -> dict:
  """Zeros shaped like the leaves `keys` (one row, or `n` stacked rows)."""
  lead = () if n is None else (n,)
  return {k: np.zeros(lead + tuple(np.shape(run.trainable[k])), np.dtype(run.trainable[k].dtype))
          for k in keys}


class ManyTaskStrategy(nodes.NodeStrategy):
  """A Flower strategy running `config`'s many-task round: local training on the
  clients, the aggregation (jitted) and evaluation on this server (module
  docstring)."""

  def __init__(self, config, timeout: float = 3600.0):
    runtime.check_many_task(config)
    self.engine = eng = ManyTaskEngine(runtime.party_config(config))
    self.run = run = eng.run
    super().__init__(config, run.setting.allocation.num_clients, timeout)
    self.parts = parts = run.round_parts
    self.keys = leaf_keys(run)
    self.state = eng.init_state()
    self.test = jax.device_put(run_lib.concat_split(run.data.test))
    self._gather = jax.jit(lambda st, slots: (parts.start(st, slots), parts.keys(st, slots)))
    self._idle = jax.jit(jax.vmap(parts.idle, in_axes=(parts.axes,)))
    # Not donated: a slot's start of a global leaf may be the state's own buffer.
    self._aggregate = jax.jit(parts.aggregate)
    self._round: tuple | None = None  # (round, slots, start on the device) being trained
    self._start_shared = None  # evaluation B's linearisation point (NTKFedAvg)
    self.records: list[dict] = []  # metrics.jsonl rows, as the engine writes them

  def summary(self) -> None:
    st = self.run.setting
    log(INFO, '\t├── fedjax_mtl %s (many-task) over %d clients, %d tasks, %d slots a round',
        self.config.algorithm, self.num_clients, st.num_tasks, st.num_slots)

  # -- messages -----------------------------------------------------------------

  def train_contents(self, rnd: int) -> dict[int, RecordDict]:
    """What each taking-part client receives in round `rnd`: the global leaves, its
    slots' pair ids, task and pair rows and keys, and the round."""
    slots = self.run.setting.schedule[rnd - 1]
    start, keys = self._gather(self.state, jnp.asarray(slots))
    self._round = (rnd, slots, start)
    start, keys = jax.device_get((start, keys))
    glob = codec.to_record({k: start[k] for k in self.keys['global']})
    out = {}
    for c, js in slot_owners(self.run.setting, rnd).items():
      out[c] = RecordDict({
          'config': ConfigRecord({'server-round': rnd, 'pairs': [int(slots[j]) for j in js]}),
          'global': glob,
          'rows': codec.to_record({k: start[k][js] for k in self.keys['rows']}),
          'keys': codec.to_record({'keys': np.asarray(keys[js])})})
    return out

  def aggregate(self, rnd: int, got: dict[int, RecordDict],
                t_recv: float | None = None) -> tuple[ArrayRecord | None, MetricRecord]:
    """The server step of round `rnd` on the taking-part clients' reply contents."""
    t_recv = time.perf_counter() if t_recv is None else t_recv
    if self._round is None or self._round[0] != rnd:
      raise ValueError(f'round {rnd} was not sent (train_contents)')
    _, slots, start = self._round
    trained, uploads, loss, steps = (
        jax.tree.map(np.array, x) for x in jax.device_get(self._idle(start)))
    owners = slot_owners(self.run.setting, rnd)
    for c, js in owners.items():
      if c not in got:
        raise ConfigError(f'round {rnd}: no reply from client {c}')
      up = codec.from_record(got[c]['upload'], _like(self.run, self.keys['upload'], len(js)))
      kept = codec.from_record(got[c]['kept'], _like(self.run, self.keys['kept'], len(js)))
      for k, v in up.items():
        uploads[k][js] = v
        trained[k][js] = v  # read for the finiteness check only, unless also kept
      for k, v in kept.items():
        trained[k][js] = v
      m = got[c]['metrics']
      loss[js] = np.asarray(m['loss'], np.float32)
      steps[js] = np.asarray(m['steps'], np.int32)
    run = self.run
    if run.eval_linear_fn is not None and self.evaluates(rnd):
      self._start_shared = (self.state.shared if run.algorithm.client.linearize_at == 'start'
                            else {k: jnp.asarray(run.trainable[k]) for k in self.state.shared})
    self.state, out = self._aggregate(self.state, jnp.asarray(slots), start, trained, uploads,
                                      loss, steps)
    out = dict(jax.device_get(out), tuned={})  # waits for the rule
    self._round = None
    diverged = self.engine.divergence(rnd, out)
    if diverged:
      raise DivergedError(f'{diverged}; {self.engine.divergence_hint()}')
    rows = self.engine.round_rows(rnd, out)
    self.records += rows
    t0, t_sent, down = getattr(self, '_sent', (t_recv, t_recv, 0))
    self.timing.append({'round': rnd, 'messages': t_sent - t0, 'clients': t_recv - t_sent,
                        'aggregate': time.perf_counter() - t_recv,
                        'client_train': [float(got[c]['metrics']['train_seconds'])
                                         for c in sorted(owners)],
                        'bytes_down': down,
                        'bytes_up': sum(nodes.nbytes(got[c]) for c in owners)})
    last = rnd == self.config.num_rounds
    losses = [r['loss'] for r in rows if r['type'] == 'train']
    return (self.arrays() if last else None), MetricRecord({'train_loss': float(np.mean(losses))})

  def evaluate_round(self, rnd: int) -> MetricRecord:
    """Round `rnd`'s eval rows (`manytask.run.evaluate` on the server's state)."""
    start = self._start_shared if self.run.eval_linear_fn is not None else None
    rows = [{'round': rnd, 'type': 'eval', **r}
            for r in run_lib.evaluate(self.run, self.state, self.test, start)]
    self.records += rows
    return MetricRecord({f'{r["task"]} {r["metric"]}': float(r['value']) for r in rows})

  # -- Strategy -----------------------------------------------------------------

  def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                      grid: Grid) -> Iterable[Message]:
    t0 = time.perf_counter()
    msgs = [Message(content=content, message_type=MessageType.TRAIN, dst_node_id=self.nodes[c])
            for c, content in sorted(self.train_contents(server_round).items())]
    self._sent = (t0, time.perf_counter(), sum(nodes.nbytes(m) for m in msgs))
    return self.sending(msgs)

  def aggregate_train(self, server_round: int,
                      replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
    t_recv = time.perf_counter()
    owners = slot_owners(self.run.setting, server_round)
    got = self.replies(replies, f'round {server_round}', expected=owners)
    return self.aggregate(server_round, {c: m.content for c, m in got.items()}, t_recv)

  def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None,
            num_rounds: int | None = None, timeout: float | None = None,
            train_config: ConfigRecord | None = None,
            evaluate_config: ConfigRecord | None = None, evaluate_fn=None) -> Result:
    """`nodes.NodeStrategy.start` with the server's own evaluation as Flower's
    server-side evaluation (`evaluate_fn` is not used: `evaluate_round` takes its place)."""
    own = lambda rnd, arrays: self.evaluate_round(rnd) if rnd and self.evaluates(rnd) else None
    return super().start(grid, initial_arrays, num_rounds, timeout, train_config,
                         evaluate_config, own)

  def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                         grid: Grid) -> Iterable[Message]:
    return []  # the server evaluates its own state (`start`)

  def aggregate_evaluate(self, server_round: int,
                         replies: Iterable[Message]) -> MetricRecord | None:
    return None

  # -- results ------------------------------------------------------------------

  def trainable_rows(self) -> dict:
    """The state's trainable rows: {'shared': {path: leaf}, 'task_rows': {path: [T, ...]},
    'pair_rows': {path: [M + 1, ...]}}, on the host."""
    st = self.state
    return jax.device_get({'shared': st.shared, 'task_rows': st.task_rows,
                           'pair_rows': st.pair_rows})

  def arrays(self) -> ArrayRecord:
    """`trainable_rows` as one record."""
    return codec.to_record(self.trainable_rows())

  def write(self, workdir: str) -> None:
    """metrics.jsonl, config.json, results.md / results.csv and curves.png of the run
    in `workdir` (the engine's formats)."""
    final = nodes.write_run(workdir, self.config, self.records)
    self.engine.write_reports(self.records, final, workdir)


class ManyTaskClient:
  """What one process needs to act as any client of the many-task run: the run (the
  setting, the backbone, every task's training set on the host), the jitted
  per-slot trainer (compiled once, shared by every client) and each client's block
  of samples."""

  def __init__(self, config):
    self.config = config
    cfg = runtime.party_config(config)
    with cfg.unlocked():  # the server's reference results, not the client's
      cfg.many.individual_reference = ''
    self.run = run = runtime.build_many_task(cfg)
    self.keys = leaf_keys(run)
    self.train_fn = jax.jit(run.round_parts.train)
    st = run.setting
    self.images, self.labels, _ = run_lib.concat_split(run.data.train)
    # Every client's block has the largest client's size: one compiled trainer.
    self.block_size = int(max(1, np.bincount(st.pairs[:, 0], weights=st.counts).max()))
    self._blocks: dict[int, tuple] = {}

  def check_client(self, client: int) -> None:
    """ConfigError when `client` is not a client of the run."""
    if not 0 <= client < self.run.setting.allocation.num_clients:
      raise ConfigError(f'partition-id {client} is not a client of this run (clients '
                        f'0..{self.run.setting.allocation.num_clients - 1})')

  def block(self, client: int) -> tuple[jax.Array, jax.Array, dict[int, jax.Array]]:
    """The client's samples (images, labels: its pairs' training examples, padded to
    `block_size`) on the device, and each of its pairs' sample-index row into them
    (the engine's `index_table` row, renumbered; entries past a pair's count are
    never read)."""
    if client not in self._blocks:
      self.check_client(client)
      st = self.run.setting
      mine = [int(p) for p in np.flatnonzero(st.pairs[:, 0] == client)]
      used = np.unique(np.concatenate([st.index_table[p, :st.counts[p]] for p in mine]
                                      or [np.zeros(0, np.int64)]))
      take = np.zeros(self.block_size, np.int64)
      take[:len(used)] = used
      rows = {p: jnp.asarray(np.searchsorted(used, st.index_table[p])
                             .clip(0, max(len(used) - 1, 0)).astype(np.int32)) for p in mine}
      self._blocks[client] = (jnp.asarray(self.images[take]), jnp.asarray(self.labels[take]),
                              rows)
    return self._blocks[client]

  def train(self, client: int, pairs: list[int], glob: dict, rows: dict, keys: np.ndarray):
    """The client's slots of a round, one after the other: (uploads, kept leaves,
    losses, steps), each stacked over `pairs` in their order."""
    images, labels, index_rows = self.block(client)
    outs = []
    for i, p in enumerate(pairs):
      if p not in index_rows:
        raise ConfigError(f'client {client} was sent pair {p}, which is not its own')
      start = {**glob, **{k: v[i] for k, v in rows.items()}}
      outs.append(self.train_fn(start, self.run.backbone, jnp.int32(p), index_rows[p],
                                jnp.asarray(keys[i]), images, labels))
    outs = jax.device_get(outs)
    stack = lambda which, names: {k: np.stack([o[which][k] for o in outs]) for k in names}
    return (stack(1, self.keys['upload']), stack(0, self.keys['kept']),
            [float(o[2]) for o in outs], [int(o[3]) for o in outs])


_CLIENTS: dict[str, ManyTaskClient] = {}


def client_runtime(config) -> ManyTaskClient:
  """The process's `ManyTaskClient` of `config` (`nodes.built_once`)."""
  return nodes.built_once(_CLIENTS, config, ManyTaskClient)


def train_reply(rt: ManyTaskClient, client: int, content: RecordDict) -> RecordDict:
  """A train message's work: the reply's content (module docstring)."""
  t0 = time.perf_counter()
  pairs = [int(p) for p in content['config']['pairs']]
  n = len(pairs)
  glob = codec.from_record(content['global'], _like(rt.run, rt.keys['global']))
  rows = codec.from_record(content['rows'], _like(rt.run, rt.keys['rows'], n))
  keys = codec.from_record(content['keys'], {'keys': np.zeros((n, 2), np.uint32)})['keys']
  uploads, kept, losses, steps = rt.train(client, pairs, glob, rows, keys)
  counts = rt.run.setting.counts
  metrics = MetricRecord({'num-examples': int(sum(counts[p] for p in pairs)), 'loss': losses,
                          'steps': steps, 'train_seconds': time.perf_counter() - t0})
  return RecordDict({'upload': codec.to_record(uploads), 'kept': codec.to_record(kept),
                     'metrics': metrics, 'client': ConfigRecord({'client': client})})
