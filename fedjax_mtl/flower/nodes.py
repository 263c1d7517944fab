"""What the strategies of both settings share (`server.EngineStrategy`, dense;
`many_task.ManyTaskStrategy`): one Flower node per client of the run, found by a
handshake, and the clients' failures as one line.

Before the first round the handshake (`query` messages) maps Flower nodes to the
run's clients (`partition-id`) and has every client compare its config with the
server's: a client whose config differs refuses, naming the fields, and the run
stops with that line.
"""

from __future__ import annotations

import os
import re
import time
from logging import INFO
from typing import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.supercore import log

from fedjax_mtl import report
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.flower import codec


def nbytes(content: Message | RecordDict) -> int:
  """Bytes of the arrays a message (or its content) carries."""
  content = content.content if isinstance(content, Message) else content
  return sum(len(a.data) for rec in content.array_records.values() for a in rec.values())


def reason(text: str) -> str:
  """The message of the exception a ClientApp raised, from the error reason Flower
  reports (a remote traceback in simulation, "<class '...'>:<'message'>" elsewhere)."""
  text = re.sub(r'\x1b\[[0-9;]*m', '', text)
  raised = re.findall(r'^[\w.]+(?:Error|Exception): (.+)$', text, re.M)
  raised = [r for r in raised if r.strip()]
  if raised:
    return raised[0].strip()
  if ":<'" in text:
    return text.split(":<'", 1)[1].rstrip("'>")
  lines = [line for line in text.splitlines() if line.strip()]
  return lines[-1].strip() if lines else text


def reply_errors(replies: list[Message], clients: dict[int, int] | None,
                 node_of=None) -> list[str]:
  """One line per failed reply: its reason, after the client (`clients`: node ->
  client) or the node it came from (None: the reason names its client). `node_of(reply)`:
  the node a reply answers for (default its source; an error the SuperLink writes for
  a node it lost comes from the SuperLink itself)."""
  out = []
  for m in replies:
    if m.has_error():
      node = m.metadata.src_node_id if node_of is None else node_of(m)
      why = reason(m.error.reason)
      if clients is not None:
        why = (f'client {clients[node]}' if node in clients else f'node {node}') + ': ' + why
      out.append(why)
  return out


class NodeStrategy(Strategy):
  """A Flower strategy over `num_clients` clients of `config`'s run, one Flower node
  each; subclasses make and aggregate the rounds' messages."""

  def __init__(self, config, num_clients: int, timeout: float = 3600.0):
    self.config = config
    self.num_clients = num_clients
    self.timeout = timeout
    self.nodes: dict[int, int] = {}  # client -> node id
    self._outbox: list[Message] = []  # the messages of the exchange under way (`sending`)
    # Per round: seconds building the messages, waiting for the clients (their
    # training and Flower's transport), aggregating; each client's own seconds;
    # array bytes sent and received.
    self.timing: list[dict] = []

  def replies(self, replies: Iterable[Message], what: str,
              expected: Iterable[int] | None = None) -> dict[int, Message]:
    """Replies by client (of `expected`, default every client); ConfigError naming
    every failed or missing client."""
    replies = list(replies)
    by_node = {n: c for c, n in self.nodes.items()}
    node_of = self.node_of()
    errors = reply_errors(replies, by_node, node_of)
    got = {by_node[m.metadata.src_node_id]: m for m in replies if not m.has_error()}
    want = set(self.nodes) if expected is None else set(expected)
    missing = sorted(want - set(got) - {by_node.get(node_of(m)) for m in replies})
    if missing:
      errors.append(f'no reply within {self.timeout:.0f} s from client(s) '
                    f'{", ".join(map(str, missing))}')
    if errors:
      raise ConfigError(f'{what} failed: ' + '; '.join(errors))
    return got

  def sending(self, msgs: list[Message]) -> list[Message]:
    """`msgs`, kept until their replies come (`node_of` reads their ids, which the
    grid sets as it pushes them)."""
    self._outbox = list(msgs)
    return msgs

  def node_of(self):
    """`reply -> node` it answers for: the destination of the message it replies to
    (an error the SuperLink writes for a node that stopped reporting comes from the
    SuperLink, not from that node), else its source."""
    dst = {m.metadata.message_id: m.metadata.dst_node_id for m in self._outbox}
    return lambda m: dst.get(m.metadata.reply_to_message_id, m.metadata.src_node_id)

  def handshake(self, grid: Grid) -> None:
    """Map nodes to clients and have every client check its config against ours."""
    n = self.num_clients
    deadline = time.time() + self.timeout
    while len(nodes := list(grid.get_node_ids())) < n:
      if time.time() > deadline:
        raise ConfigError(f'the run has {n} clients but only {len(nodes)} Flower nodes '
                          f'connected within {self.timeout:.0f} s')
      time.sleep(1)
    if len(nodes) > n:
      raise ConfigError(f'the run has {n} clients but {len(nodes)} Flower nodes are connected; '
                        'start one SuperNode per client')
    fields = codec.shared_fields(self.config)
    msgs = [Message(content=RecordDict({'config': ConfigRecord({'fields': fields})}),
                    message_type=MessageType.QUERY, dst_node_id=node) for node in nodes]
    replies = list(grid.send_and_receive(self.sending(msgs), timeout=self.timeout))
    errors = reply_errors(replies, None)
    if errors:
      raise ConfigError('clients refused the run: ' + '; '.join(errors))
    clients = {int(m.content['client']['client']): m.metadata.src_node_id for m in replies}
    if sorted(clients) != list(range(n)):
      raise ConfigError(f'the nodes hold partition-ids {sorted(clients)}; the run needs each '
                        f'of 0..{n - 1} exactly once')
    self.nodes = clients

  def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None,
            num_rounds: int | None = None, timeout: float | None = None,
            train_config: ConfigRecord | None = None,
            evaluate_config: ConfigRecord | None = None, evaluate_fn=None) -> Result:
    """The handshake, then Flower's round loop for `config.num_rounds` rounds (the
    server's rows are the strategy's own; `initial_arrays` is not used)."""
    if timeout is not None:
      self.timeout = timeout
    self.handshake(grid)
    return super().start(grid, initial_arrays or ArrayRecord(),
                         num_rounds or self.config.num_rounds, self.timeout, train_config,
                         evaluate_config, evaluate_fn)

  def evaluates(self, server_round: int) -> bool:
    cfg = self.config
    return server_round % cfg.eval_every == 0 or server_round == cfg.num_rounds

  def summary(self) -> None:
    log(INFO, '\t├── fedjax_mtl %s over %d clients', self.config.algorithm, self.num_clients)


def write_run(workdir: str, config, records: list[dict]) -> list[dict]:
  """A Flower run's metrics.jsonl (`records`) and config.json in `workdir`, in the
  engine's formats; returns the final round's eval rows (for the result tables)."""
  os.makedirs(workdir, exist_ok=True)
  report.atomic_write(os.path.join(workdir, 'metrics.jsonl'), '')
  report.append_jsonl(os.path.join(workdir, 'metrics.jsonl'), records)
  report.atomic_write(os.path.join(workdir, 'config.json'), config.to_json_best_effort(indent=2))
  return [r for r in records if r['type'] == 'eval' and r['round'] == config.num_rounds]


def built_once(built: dict, config, make):
  """`make(config)`, kept in `built` (a module's dict) per config (its
  `codec.shared_fields`), the newest only: a simulation's worker serves many clients,
  one after the other. The callers are module-level functions, which Ray pickles by
  reference (a closure would carry the built runtime, devices and all)."""
  key = codec.shared_fields(config)
  if key not in built:
    built.clear()
    built[key] = make(config)
  return built[key]
