"""The Flower `ServerApp`: a `Strategy` that runs this package's server rules, in
either setting (`make_strategy`): `EngineStrategy` for the dense setting (here),
`many_task.ManyTaskStrategy` for the many-task setting.

`EngineStrategy` keeps what the dense engine's server keeps: every shared role's
stacked rows (encoders and heads one row per client, decoders one row per task
decoder; personalised rules such as FedHCA2 give every client its own rows),
the rule's replicated state (FedHCA2's α/β and their optimizer) and its
per-row state (`ServerState.rows`). Each round it sends every client its rows,
gathers the clients' uploads in client order and calls the algorithm's server
part, jitted, on them: the same `ServerInputs` the engine's round builds (the
rows the clients started from, their uploads, example and step counts,
first/last losses), in the same row blocks.

Each round trains the clients the engine's run would (`participation.Sampler`:
participants and stragglers from (seed, round)); a client that sits a round out
gets no message and counts as in the engine (`ServerInputs.row_valid`). Under an
outermost `quantize(...)` the clients send quantisation codes
(`compress.encode_quantized`), with an outermost `sparsify(...)` their top-k entries
of Δ + e with positions, keeping e (`compress.encode_sparse`), and the server decodes
them (`ServerInputs.encoded`);
`dp(...)` clips and adds noise here, in the strategy.

Before the first round a handshake (`nodes.NodeStrategy.handshake`) maps Flower
nodes to the run's clients (`partition-id`) and has every client compare its
config with the server's: a client whose config differs refuses, naming the
fields, and the run stops with that line.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from logging import INFO
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log

from fedjax_mtl import comm, federation, participation, report
from fedjax_mtl.algorithms import compress, dp
from fedjax_mtl import workdir as workdir_lib
from fedjax_mtl.algorithms.base import ServerInputs, ServerState, stack, unstack
from fedjax_mtl.errors import ConfigError, DivergedError
from fedjax_mtl.experiment import init_state, views
from fedjax_mtl.flower import codec, many_task, nodes, runtime

PyTree = Any


def config_from_run(run_config) -> Any:
  """The run's config from a Flower run config: `config` = `configs/x.py[:arg]`
  and optionally `overrides` = a JSON object of dotted fields
  (`'{"num_rounds": 2, "optim.lr": 0.001}'`) and `fraction-train` (Flower's
  strategies' name for the share of nodes trained a round): the config's
  `participation`. Server and clients read the same run config."""
  from fedjax_mtl import config_doc
  if 'config' not in run_config:
    raise ConfigError("the Flower run config has no 'config' (e.g. config='configs/hca2.py:smoke')")
  config = config_doc.load_config(str(run_config['config']))
  for key, value in json.loads(str(run_config.get('overrides', '{}'))).items():
    node, last = config_doc.field_parent(config, key)
    node[last] = tuple(value) if isinstance(node[last], tuple) else value
  if 'fraction-train' in run_config:  # Flower's name for the clients trained a round
    config.participation = float(run_config['fraction-train'])
  return config


class EngineStrategy(nodes.NodeStrategy):
  """A Flower strategy running `config`'s algorithm (its server part, jitted) over
  the federation's clients, one Flower node per client."""

  def __init__(self, config, timeout: float = 3600.0):
    self.exp = exp = runtime.build(config)
    fed, alg = exp.fed, exp.algorithm
    super().__init__(config, fed.num_clients, timeout)
    state = init_state(exp)
    params = [gs.params for gs in state.groups]
    self.views = jax.device_get({r: views(exp, params, r) for r in alg.shared_roles})
    first = state.groups[0].server_rows
    self.rows = jax.device_get({
        r: federation.gather_rows([gs.server_rows[r] for gs in state.groups], fed, r)
        for r in (first.keys() if first else ())})
    self.shared = state.server
    # metrics.jsonl rows, as the engine writes them
    self.records: list[dict] = [{'round': 0, 'type': 'meta',
                                 'clients': [c.name for c in fed.clients],
                                 'decoders': list(fed.decoder_names)}]
    # Who trains each round (and the stragglers' step shares): the engine's draw from
    # (seed, round), so a Flower run trains the clients the engine's run would.
    self.sampler = participation.Sampler(exp.config, fed)
    self._apply = jax.jit(self._server_apply)

  # -- the rule -----------------------------------------------------------------

  def _server_apply(self, shared, rows, prev, local, steps, first, last, rnd, valid=None,
                    encoded=None):
    """The algorithm's server part on stacked rows, in the engine's row blocks;
    `valid` ([N] bool): the round's participants (None: every client); `encoded`:
    the clients' quantised updates, decoded (`ServerInputs.encoded`)."""
    exp = self.exp
    fed, alg = exp.fed, exp.algorithm
    if alg.server.blocks:
      wrap = lambda v, r: unstack(v, federation.block_sizes(fed, r))
    else:
      wrap = lambda v, r: v
    inputs = ServerInputs(
        prev={r: wrap(v, r) for r, v in prev.items()},
        local={r: wrap(v, r) for r, v in local.items()},
        num_examples=jnp.asarray(fed.num_examples), num_steps=steps,
        client_ids=jnp.arange(fed.num_clients, dtype=jnp.int32), round=rnd,
        first_loss=first, last_loss=last, row_valid=valid,
        encoded=None if encoded is None else {r: wrap(v, r) for r, v in encoded.items()})
    new, sstate, logs = alg.server.apply(
        ServerState(shared, {r: wrap(v, r) for r, v in rows.items()}), inputs)
    new_rows = {r: stack(v) if jax.tree.leaves(v) else rows[r] for r, v in sstate.rows.items()}
    return {r: stack(v) for r, v in new.items()}, sstate.shared, new_rows, logs

  # -- messages -----------------------------------------------------------------

  def client_content(self, client: int, rnd: int) -> RecordDict:
    """What client `client` receives in round `rnd`: its rows of every shared role and
    of the per-row server state, and the round."""
    fed = self.exp.fed
    cut = lambda tree, r: jax.tree.map(lambda x: x[codec.row_slice(fed, r, client)], tree)
    content = {'params': codec.to_record({r: cut(v, r) for r, v in self.views.items()}),
               'config': ConfigRecord({'server-round': rnd,
                                       'step-share': float(self.step_shares(rnd)[client])})}
    if jax.tree.leaves(self.rows):
      rows = codec.sent_server_rows(self.rows, compress.encoding(self.config))
      content['server_rows'] = codec.to_record({r: cut(v, r) for r, v in rows.items()})
    return RecordDict(content)

  def participants(self, rnd: int) -> np.ndarray:
    """[N] bool: the clients that train in round `rnd` (`participation.Sampler`)."""
    return self.sampler.mask(rnd)

  def step_shares(self, rnd: int) -> np.ndarray:
    """[N] float32: the share of its local steps each client takes in round `rnd`
    (0: it sits the round out; below 1: a straggler)."""
    out = np.zeros(self.exp.fed.num_clients, np.float32)
    for ids, share in zip(self.sampler.client_ids, self.sampler.step_shares(rnd)):
      out[ids] = share
    return out

  def _messages(self, rnd: int, kind: str, clients=None) -> list[Message]:
    return [Message(content=self.client_content(c, rnd), message_type=kind, dst_node_id=n)
            for c, n in sorted(self.nodes.items()) if clients is None or clients[c]]

  # -- Strategy -----------------------------------------------------------------

  def summary(self) -> None:
    fed = self.exp.fed
    log(INFO, '\t├── fedjax_mtl %s over %d clients (%d task decoders), rows of %s',
        self.config.algorithm, fed.num_clients, fed.num_decoders,
        ', '.join(self.exp.algorithm.shared_roles))

  def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                      grid: Grid) -> Iterable[Message]:
    import time
    t0 = time.perf_counter()
    on = self.participants(server_round)
    msgs = self._messages(server_round, MessageType.TRAIN, on)
    self.note_sent(t0, on, msgs)
    return self.sending(msgs)

  def note_sent(self, t0: float, on: np.ndarray, msgs: list) -> None:
    """The array bytes each client receives this round (0 for a client that sits it
    out; `msgs`: the participants' messages or contents, in client order), for the
    round's 'comm' row, and when sending started."""
    import time
    down = np.zeros(len(on), np.int64)
    down[np.flatnonzero(on)] = [nodes.nbytes(m) for m in msgs]
    self._sent = (t0, time.perf_counter(), down.tolist())

  def aggregate_train(self, server_round: int,
                      replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
    import time
    t_recv = time.perf_counter()
    on = self.participants(server_round)
    got = {c: m.content for c, m in self.replies(replies, f'round {server_round}',
                                                  np.flatnonzero(on).tolist()).items()}
    return self.aggregate(server_round, got, t_recv)

  def aggregate(self, server_round: int, got: dict[int, RecordDict],
                t_recv: float | None = None) -> tuple[ArrayRecord | None, MetricRecord]:
    """The server step of round `server_round` on the reply content of every client
    that took part (`participants`). A client that sat the round out counts as the
    engine counts it: its upload the rows it was sent, no steps, and
    `ServerInputs.row_valid` False."""
    import time
    t_recv = time.perf_counter() if t_recv is None else t_recv
    fed, exp = self.exp.fed, self.exp
    on = self.participants(server_round)
    cut = lambda tree, r, c: jax.tree.map(lambda x: x[codec.row_slice(fed, r, c)], tree)
    encoding = compress.encoding(self.config)
    encoded = encoding is not None  # the clients compressed their own updates
    quantized = encoding == 'quantize'
    bits = int(compress.QUANTIZE.of(self.config).bits) if quantized else 0
    uploads, sent = [], []  # sent: the decoded Q(Δ) or sparse(u) rows (encoded runs)
    for c in range(fed.num_clients):
      like = {r: cut(v, r, c) for r, v in self.views.items()}
      if not on[c]:  # its upload: the rows it holds; nothing sent
        uploads.append(like)
        if encoded:
          sent.append(jax.tree.map(lambda x: np.zeros(x.shape, np.float32), like))
        continue
      if quantized:  # Q(Δ) from the codes; the rule reads prev + Q(Δ) (`compress.quantize`)
        codes, scales = codec.read_quantized(got[c]['upload'], like, bits)
        up = {r: compress.decode_quantized(codes[r], scales[r], like[r], bits) for r in like}
        up = jax.device_get(up)
        sent.append(up)
        uploads.append(like)
      elif encoded:  # sparse(u): the rule reads prev + it (`compress.sparsify`)
        up = codec.read_sparse(got[c]['upload'], like)
        sent.append(up)
        uploads.append(like)
      else:
        up = codec.from_record(got[c]['upload'], like)
        uploads.append(up)
      if not all(np.all(np.isfinite(x)) for x in jax.tree.leaves(up)
                 if np.issubdtype(x.dtype, np.inexact)):
        client = fed.clients[c]
        raise DivergedError(f'round {server_round}: non-finite upload of client '
                            f'{client.name} ({", ".join(client.tasks)})')
    cat = lambda trees: {r: jax.tree.map(lambda *xs: np.concatenate(xs, 0), *[t[r] for t in trees])
                         for r in self.views}
    local = cat(uploads)
    metric = lambda k: np.asarray([got[c]['metrics'][k] if on[c] else 0
                                   for c in range(fed.num_clients)])
    valid = jnp.asarray(on) if self.sampler.partial else None
    new, self.shared, rows, logs = self._apply(
        self.shared, self.rows, self.views, local, jnp.asarray(metric('steps'), jnp.int32),
        jnp.asarray(metric('first_loss'), jnp.float32),
        jnp.asarray(metric('last_loss'), jnp.float32), jnp.int32(server_round - 1), valid,
        cat(sent) if encoded else None)
    self.views, self.rows, logs = jax.device_get((new, rows, logs))  # waits for the rule
    if quantized and compress.QUANTIZE.of(self.config).log_error:
      # each client's error of its own quantisation, as the wrapper logs it
      err, norm = metric('quant_err'), metric('quant_norm')
      logs = {**logs, 'quant_rel_error': np.sqrt(np.where(norm > 0, err / np.where(
          norm > 0, norm, 1.), 0.)).astype(np.float32)}
    if encoding == 'sparsify' and float(compress.SPARSIFY.of(self.config).fraction) < 1:
      # each client's own count and residual, as the wrapper logs them (a client that
      # sat out kept nothing this round; its residual is its own, unreported: 0)
      d = metric('sparse_values').astype(np.float64)
      logs = {**logs, 'sparse_kept': (metric('sparse_kept_count') / np.maximum(d, 1))
              .astype(np.float32),
              'sparse_residual_norm': np.sqrt(metric('sparse_resid_sq')).astype(np.float32)}
    for c, client in enumerate(fed.clients):
      if not on[c]:
        continue  # a client that sat the round out trained nothing (the engine's rows)
      m = got[c]['metrics']
      for s, task in enumerate(client.tasks):
        self.records.append({'round': server_round, 'type': 'train', 'client': client.name,
                             'dataset': client.dataset, 'task': task,
                             'loss': float(m['loss'][s]), 'steps': int(m['steps'])})
    if logs:
      self.records.append({'round': server_round, 'type': 'agg',
                           **{k: np.asarray(v).tolist() for k, v in logs.items()},
                           **self.privacy_row(server_round)})
    t0, t_sent, down = getattr(self, '_sent', (t_recv, t_recv, [0] * fed.num_clients))
    up = [nodes.nbytes(got[c]) if on[c] else 0 for c in range(fed.num_clients)]
    # The bytes the messages really carried, in the engine's 'comm' row format.
    self.records.append(comm.comm_row(server_round, up, down))
    self.timing.append({'round': server_round, 'messages': t_sent - t0,
                        'clients': t_recv - t_sent, 'aggregate': time.perf_counter() - t_recv,
                        'client_train': [float(x) for x in metric('train_seconds')[on]],
                        'bytes_down': sum(down), 'bytes_up': sum(up)})
    losses = [r['loss'] for r in self.records
              if r['type'] == 'train' and r['round'] == server_round]
    last = server_round == exp.config.num_rounds
    return (self.arrays() if last else None), MetricRecord({'train_loss': float(np.mean(losses))})

  @functools.cached_property
  def epsilons(self) -> list[float] | None:
    """ε after each round of a `dp(...)` run (the engine's accountant), else None."""
    return dp.run_epsilons(self.config, self.sampler.rate())

  def privacy_row(self, rnd: int) -> dict:
    """{'dp_epsilon', 'dp_delta'} after round `rnd`, as the engine logs them ({}
    without DP)."""
    return dp.privacy_row(self.config, self.epsilons, rnd)

  def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                         grid: Grid) -> Iterable[Message]:
    if not self.evaluates(server_round):
      return []
    return self.sending(self._messages(server_round, MessageType.EVALUATE))

  def aggregate_evaluate(self, server_round: int,
                         replies: Iterable[Message]) -> MetricRecord | None:
    if not self.evaluates(server_round):
      return None
    got = self.replies(replies, f'evaluation of round {server_round}')
    return self.collect_eval(server_round, {c: m.content for c, m in got.items()})

  def collect_eval(self, server_round: int, got: dict[int, RecordDict]) -> MetricRecord:
    """The evaluation rows of every client's reply content, as run records."""
    rows = []
    for c in sorted(got):
      rows += json.loads(got[c]['eval']['rows'])
    record = {} if self.config.get('unified', 'none') == 'none' else {
        'unified': self.config.unified}
    self.records += [{'round': server_round, 'type': 'eval', **r, **record} for r in rows]
    return MetricRecord({f'{r["client"]}/{r["task"]} {r["metric"]}': float(r['value'])
                         for r in rows if r['value'] is not None})

  # -- results ------------------------------------------------------------------

  def arrays(self) -> ArrayRecord:
    """Every shared role's stacked rows (`{'encoder': [N, ...], 'decoder': [K, ...]}`)."""
    return codec.to_record(self.views)

  def write(self, workdir: str) -> None:
    """metrics.jsonl, results.md and results.csv of the run in `workdir` (the
    engine's formats: `scripts/compare.py` and the notebooks read them), and the
    aggregated rows of every shared role in `final_rows.npz` (keyed by their paths,
    `codec.to_record`'s keys; `read_final_rows`)."""
    from fedjax_mtl.engines.dense import method_label
    final = nodes.write_run(workdir, self.config, self.records)
    write_final_rows(workdir, self.views)
    md, csv_text = report.results_table(method_label(self.config) + ' (Flower)', final, None)
    report.atomic_write(os.path.join(workdir, 'results.md'), md)
    report.atomic_write(os.path.join(workdir, 'results.csv'), csv_text)


def write_final_rows(workdir: str, views: PyTree) -> None:
  """`views` (role -> stacked rows) as `final_rows.npz` in `workdir`, atomically."""
  flat = {jax.tree_util.keystr(p): np.asarray(x)
          for p, x in jax.tree_util.tree_flatten_with_path(views)[0]}
  tmp = os.path.join(workdir, 'final_rows.tmp.npz')
  np.savez(tmp, **flat)
  os.replace(tmp, os.path.join(workdir, 'final_rows.npz'))


def read_final_rows(workdir: str) -> dict[str, np.ndarray]:
  """The arrays `write_final_rows` wrote, by path (`"['encoder']['conv']..."`)."""
  with np.load(os.path.join(workdir, 'final_rows.npz')) as z:
    return {k: z[k] for k in z.files}


def claim_workdir(workdir: str, hold: contextlib.ExitStack) -> None:
  """Take `workdir`'s lock into `hold` (`fedjax_mtl.workdir`); ConfigError (one line)
  if another run holds it or it already holds a run (Flower runs do not resume)."""
  from fedjax_mtl import validate
  validate.check_workdir(workdir)
  hold.enter_context(workdir_lib.lock(workdir))
  if os.path.exists(os.path.join(workdir, 'metrics.jsonl')):
    raise ConfigError(f'workdir {workdir!r} already holds a run; Flower runs do not '
                      'resume: use a new --workdir')


def make_strategy(config, timeout: float = 3600.0) -> nodes.NodeStrategy:
  """The strategy of `config`'s setting: `EngineStrategy` (dense) or
  `many_task.ManyTaskStrategy`."""
  if runtime.is_many_task(config):
    return many_task.ManyTaskStrategy(config, timeout)
  return EngineStrategy(config, timeout)


def make_server_app(config=None, workdir: str | None = None,
                    holder: dict | None = None) -> ServerApp:
  """A `ServerApp` running `make_strategy(config)`; without `config`, from the run
  config (`config_from_run`). `workdir`: where the run's metrics and tables go.
  `holder['strategy']` receives the strategy (`simulate` reads its results), and
  `holder['error']` an exception that stopped the run. A deployment's run config may
  name the workdir too (`workdir='runs/flower'`), and `timeout`: the seconds the
  server waits for a round's replies before it stops naming the clients that did
  not answer (default 3600)."""
  app = ServerApp()

  @app.main()
  def main(grid: Grid, context) -> None:
    try:
      cfg = config if config is not None else config_from_run(context.run_config)
      out = workdir or (context.run_config.get('workdir') if config is None else None)
      with contextlib.ExitStack() as hold:
        if out:  # one writer: the workdir stays locked while the rounds run
          claim_workdir(str(out), hold)
        wait = float(context.run_config.get('timeout', 3600.0)) if config is None else 3600.0
        strategy = make_strategy(cfg, wait)
        if holder is not None:
          holder['strategy'] = strategy
        strategy.start(grid)
        if out:
          strategy.write(str(out))
    except Exception as e:
      if holder is not None:
        holder['error'] = e
      raise

  return app


# What a deployment loads (`fedjax_mtl.flower.server:app`).
app = make_server_app()
