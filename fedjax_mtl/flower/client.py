"""The Flower `ClientApp`: one client of the run's federation, trained by this
package's jitted local trainer on the client's own data, in either setting: the
dense setting here, the many-task setting's client (stateless, its (client,
task) pairs' slots) in `many_task.py`, picked by the config's `setting`.

The client is the engine's client `partition-id` (Flower's node config). Its
dense state (params, batch-norm statistics, optimizer and client-part state, a
personal model) stays on the node between rounds (`Context.state`); each round
it receives its rows of the shared roles and of the server's per-row state,
trains exactly as its row of the engine's client group would (same batches,
dropout keys and learning rates: `local_training.GroupRows`; on real data the chunks of
its row, streamed from its own images), runs the algorithm's client
finalize and uploads its rows of the shared roles with its step count and
first/last losses. Evaluation scores its model on its test split.

Messages: `query` answers the server's handshake (refusing a config that differs
from the server's, naming the fields), `train` and `evaluate` as above.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedjax_mtl import evaluation, local_training, rounds, sources
from fedjax_mtl.data import real
from fedjax_mtl.engines.dense import zero_accs
from fedjax_mtl.algorithms import compress
from fedjax_mtl.algorithms.base import merge_view, role_view
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.experiment import init_state
from fedjax_mtl.flower import codec, many_task, nodes, runtime
from fedjax_mtl.state import FedState, GroupState

PyTree = Any
STATE_KEY = 'fedjax_mtl.client_state'


class ClientRuntime:
  """What one process needs to act as any client of the run: the experiment, the
  data, the round-0 state and the jitted programs (compiled once per client
  group, shared by every client of that group)."""

  def __init__(self, config):
    self.config = config
    self.exp = exp = runtime.build(config)
    # Synthetic data on device; real data streams from the client's own images.
    self.train_data, self.test_data = (None, None) if exp.streamed else sources.device_data(exp)
    self.init = init_state(exp)
    self._train: dict[int, Any] = {}
    self._eval: dict[Any, Any] = {}
    self._chunks: dict[int, Any] = {}
    self._tests: dict[str, Any] = {}
    self._quantizers: dict[int, Any] = {}
    self._sparsifier = None
    self.threads = int(config.data.get('threads', 2))

  def locate(self, client: int) -> tuple[int, int]:
    """(group, row in the group) of engine client `client`."""
    for g, spec in enumerate(self.exp.fed.groups):
      if client in spec.client_ids:
        return g, spec.client_ids.index(client)
    raise ConfigError(f'partition-id {client} is not a client of this federation '
                      f'(clients 0..{self.exp.fed.num_clients - 1})')

  def initial_state(self, client: int) -> GroupState:
    """The client's round-0 `GroupState` (one row), on the host like the state kept
    between rounds (one compiled program for both)."""
    g, j = self.locate(client)
    return jax.device_get(jax.tree.map(lambda x: x[j:j + 1], self.init.groups[g]))

  def chunks(self, client: int):
    """The client's training chunks (`real.TrainChunks` of its group, its row only:
    the engine's chunks of that row, read from the client's own images)."""
    if client not in self._chunks:
      exp = self.exp
      g, j = self.locate(client)
      spec = exp.fed.groups[g]
      readers = [real.client_source(self.config, exp.fed.clients[c]) if c == client else None
                 for c in spec.client_ids]
      self._chunks[client] = real.TrainChunks(
          [sources.group_feed_spec(exp, spec)], [readers], self.config.num_rounds,
          sources.sizes(exp), int(self.config.data.seed), sources.train_transforms(exp),
          rows=[slice(j, j + 1)])
    return self._chunks[client]

  def chunk_program(self, g: int):
    """Jitted `(state, start, acc, chunk, rng, round, ids) -> (state, acc)` of group g:
    one chunk of the client's local round (`local_training.make_chunk_trainer`), and the
    jitted finalize `(state, start) -> (state, uploads)`."""
    if g not in self._train:
      exp, cfg = self.exp, self.config
      trainer = local_training.make_chunk_trainer(
          exp.fed.groups[g], exp.models_train[g], exp.tx, cfg.optim, cfg.num_rounds,
          exp.algorithm, exp.labels[g],
          max_parallel=int(cfg.get('max_parallel_clients', 0)))

      def run(cs, start, acc, chunk, rng, rnd, ids):
        key = rounds.group_key(FedState(round=rnd, rng=rng, groups=[]), g)
        return trainer(cs, start, acc, chunk, key, rnd, ids=ids)

      finalize = lambda cs, start: local_training.finalize_group(exp.algorithm, cs, start)
      self._train[g] = (jax.jit(run, donate_argnums=(0, 2)), jax.jit(finalize))
    return self._train[g]

  def train_streamed(self, client: int, cs: GroupState, rnd: int, share: float = 1.0):
    """`train` on streamed real data: the round's chunks of the client's row (a
    straggler's steps past its `share` masked, as the engine's feed masks them)."""
    g, j = self.locate(client)
    spec = self.exp.fed.groups[g]
    chunks = self.chunks(client)
    # The chunks hold the client's group alone (`chunks`): one array of shares.
    shares = np.ones(spec.num_total, np.float32)
    shares[j] = share
    chunks.step_shares = None if share == 1.0 else (lambda r: [shares])
    step, finalize = self.chunk_program(g)
    start = jax.device_put(cs.params)
    cs, acc = jax.device_put(cs), jax.device_put(zero_accs(spec, 1))
    ids = jnp.asarray([j], jnp.int32)
    feed = real.iterate(chunks, chunks.offset(rnd - 1), threads=self.threads)
    try:
      for el in itertools.islice(feed, chunks.per_round):
        cs, acc = step(cs, start, acc, sources.chunk_arrays(el), self.init.rng,
                       jnp.int32(rnd - 1), ids)
    finally:
      feed.close()
    trained, uploads = finalize(cs, start)
    metrics = {'loss': acc['loss_sum'] / jnp.maximum(acc['steps'], 1)[:, None],
               'steps': acc['steps'], 'first_loss': acc['first_loss'],
               'last_loss': acc['last_loss']}
    return trained, uploads, metrics

  def train_program(self, g: int):
    """Jitted `(state, data, round, rng, rows, frac) -> (state, uploads, metrics)` of
    group g: the client's local round (`local_training.make_group_trainer(...).sampled`
    from its own params; `frac` [1]: the share of its steps it takes, below 1 for a
    straggler) and the client part's finalize against the params it started from."""
    if g not in self._train:
      exp, cfg = self.exp, self.config
      spec = exp.fed.groups[g]
      trainer = local_training.make_group_trainer(spec, exp.models_train[g], exp.tx, cfg.optim,
                                         cfg.batch_size, cfg.num_rounds, exp.algorithm,
                                         exp.labels[g],
                                         max_steps=int(cfg.get('max_steps_per_round', 0)),
                                         max_parallel=int(cfg.get('max_parallel_clients', 0)))

      def run(cs, data, rnd, rng, rows, frac):
        key = rounds.group_key(FedState(round=rnd, rng=rng, groups=[]), g)
        trained, metrics = trainer.sampled(cs, data, rnd, key, cs.params, rows, frac=frac)
        trained, uploads = local_training.finalize_group(exp.algorithm, trained, cs.params)
        return trained, uploads, metrics

      self._train[g] = jax.jit(run)
    return self._train[g]

  def eval_program(self, g: int, client: int):
    """Jitted `(state, test batches) -> (stats, edge probabilities)` of the client."""
    key = (g, client)
    if key not in self._eval:
      spec = one_client_spec(self.exp.fed.groups[g], client)
      ev = evaluation.make_group_evaluator(
          spec, self.exp.models_eval[g],
          edge_probs=evaluation.edge_ods_mode(self.config) != 'off',
          sal_metric=self.config.get('sal_metric', 'maxF'))
      self._eval[key] = (spec, jax.jit(
          lambda gs, b: ev(*rounds.eval_variables(self.exp, gs), b)))
    return self._eval[key]

  def train(self, client: int, cs: GroupState, rnd: int,
            share: float = 1.0) -> tuple[GroupState, dict, dict]:
    """Round `rnd` (1-based) of `client` from its state `cs` (the server's rows
    merged in), taking the first ceil(`share`·its steps) steps (a straggler's share;
    1: all): (trained state, uploads per shared role, metrics)."""
    g, j = self.locate(client)
    spec = self.exp.fed.groups[g]
    if self.exp.streamed:
      trained, uploads, metrics = self.train_streamed(client, cs, rnd, share)
    else:
      fn = self.train_program(g)
      trained, uploads, metrics = fn(cs, self.train_data[spec.dataset]['train'],
                                     jnp.int32(rnd - 1), self.init.rng,
                                     local_training.group_rows(spec, (j,)),
                                     jnp.full((1,), share, jnp.float32))
    return trained, self.pieces(client, uploads), metrics

  def pieces(self, client: int, params: PyTree) -> dict:
    """The client's rows of every shared role (role -> the rows of the stacked view)
    in its one-row group `params`."""
    labels = self.exp.labels[self.locate(client)[0]]
    return {r: codec.client_piece(role_view(params, labels, r), r)
            for r in self.exp.algorithm.shared_roles}

  @property
  def bits(self) -> int:
    """`quantize.bits` of the run."""
    return int(compress.QUANTIZE.of(self.config).bits)

  def quantizer(self, client: int):
    """Jitted `(rows sent, rows trained, 0-based round) -> (codes, scales, Σ error²,
    Σ update²)` per shared role: the client's update quantised as the `quantize`
    wrapper would (`compress.encode_quantized`, its rows' global positions)."""
    if client not in self._quantizers:
      fed, seed, bits = self.exp.fed, int(self.config.seed), self.bits

      def run(prev, up, rnd):
        out = {r: compress.encode_quantized(prev[r], up[r], r,
                                            codec.row_slice(fed, r, client).start, rnd, seed,
                                            bits) for r in up}
        return ({r: o[0] for r, o in out.items()}, {r: o[1] for r, o in out.items()},
                sum(o[2] for o in out.values()), sum(o[3] for o in out.values()))

      self._quantizers[client] = jax.jit(run)
    return self._quantizers[client]

  def sparsifier(self):
    """Jitted `(rows sent, rows trained, residual) -> (sparse(u), new residual, entries
    kept, ‖e‖²)` over the client's shared roles (`compress.encode_sparse`)."""
    if self._sparsifier is None:
      fraction = float(compress.SPARSIFY.of(self.config).fraction)
      self._sparsifier = jax.jit(lambda prev, up, e: compress.encode_sparse(prev, up, e,
                                                                             fraction))
    return self._sparsifier

  def zero_residual(self, client: int) -> dict:
    """The client's error-feedback residual before its first round: zeros (float32)
    shaped like its shared rows."""
    return jax.tree.map(lambda x: np.zeros(x.shape, np.float32),
                        self.pieces(client, self.initial_state(client).params))

  def evaluate(self, client: int, cs: GroupState, rnd: int | None = None) -> list[dict]:
    """Metric rows (client, dataset, task, metric, value) of the client's model on
    its dataset's test split in round `rnd` (odsF from the same forward passes where
    `eval_edge_ods` scores that round; scored in this process: a node is one worker)."""
    g, _ = self.locate(client)
    spec, fn = self.eval_program(g, client)
    holds_edge = (evaluation.scores_edge_ods(self.config, rnd)
                  and evaluation.edge_holders(spec))
    scores = evaluation.EdgeScores(spec, self.exp.fed.clients) if holds_edge else None
    if self.exp.streamed:
      stats = None
      for batch in real.iterate(self.test_source(spec), threads=self.threads):
        st, probs = fn(cs, jax.tree.map(lambda x: x[None], batch))
        stats = st if stats is None else jax.tree.map(jnp.add, stats, st)
        if scores is not None:
          scores.update(np.asarray(probs)[0], batch['edge'])
      stats = jax.device_get(stats)
    else:
      stats, probs = jax.device_get(fn(cs, self.test_data[spec.dataset]))
      if scores is not None:
        gt = self.exp.data[spec.dataset]['test']['edge']
        b = self.config.eval_batch_size
        for i, lo in enumerate(range(0, len(gt), b)):
          scores.update(probs[i][:, :len(gt[lo:lo + b])], gt[lo:lo + b])
    rows = evaluation.finalize_group(spec, stats, self.exp.fed.clients)
    if scores is not None:
      by_client = {r['client']: r for r in scores.rows()}
      rows = [by_client.get(r['client'], r) if r['task'] == 'edge' else r for r in rows]
    return rows

  def test_source(self, spec):
    """The test split's batches of `spec`'s dataset, with the labels its tasks need."""
    if spec.dataset not in self._tests:
      self._tests[spec.dataset] = sources.eval_source(self.exp, spec.dataset, spec.tasks_used)
    return self._tests[spec.dataset]


def one_client_spec(spec, client: int):
  """`spec` reduced to engine client `client`'s row (no padding)."""
  import dataclasses
  j = spec.client_ids.index(client)
  return dataclasses.replace(spec, client_ids=(client,), num_pad=0,
                             task_ids=spec.task_ids[j:j + 1],
                             index_table=spec.index_table[j:j + 1], counts=spec.counts[j:j + 1])


_RUNTIMES: dict[str, ClientRuntime] = {}


def client_runtime(config) -> ClientRuntime:
  """The process's `ClientRuntime` of `config` (`nodes.built_once`)."""
  return nodes.built_once(_RUNTIMES, config, ClientRuntime)


def partition_id(context: Context) -> int:
  """This node's client: `partition-id` of the node config (a simulation sets it;
  a deployed SuperNode gets it with `--node-config "partition-id=3"`)."""
  if 'partition-id' not in context.node_config:
    raise ConfigError('the node config has no partition-id: start the SuperNode with '
                      '--node-config "partition-id=<client index>"')
  return int(context.node_config['partition-id'])


def _kept_like(rt: ClientRuntime, client: int, like: GroupState):
  """What a node keeps between rounds: its state without the server's rows, and under
  a client-side `sparsify` its error-feedback residual too."""
  state = like.replace(server_rows=())
  if compress.encoding(rt.config) == 'sparsify':
    return {'state': state, 'residual': rt.zero_residual(client)}
  return state


def stored(rt: ClientRuntime, client: int, kept) -> tuple[GroupState, dict | None]:
  """(the client's state, its error-feedback residual under a client-side `sparsify`,
  else None) from what its node kept (`Context.state`'s record, or None before its
  first round: the round-0 state and a zero residual), read once."""
  like = rt.initial_state(client)
  kept_like = _kept_like(rt, client, like)
  got = kept_like if kept is None else codec.from_record(kept, kept_like)
  state, residual = (got['state'], got['residual']) if isinstance(got, dict) else (got, None)
  return state.replace(server_rows=like.server_rows), residual


def stored_state(rt: ClientRuntime, client: int, kept) -> GroupState:
  """The client's state from what its node kept (`stored`)."""
  return stored(rt, client, kept)[0]


def _with_server_rows(rt: ClientRuntime, client: int, cs: GroupState,
                      content: RecordDict) -> GroupState:
  """`cs` with the server's rows of the shared roles and of its per-row state."""
  g, _ = rt.locate(client)
  labels = rt.exp.labels[g]
  params = cs.params
  roles = rt.exp.algorithm.shared_roles
  like = {r: codec.client_piece(role_view(params, labels, r), r) for r in roles}
  sent = codec.from_record(content['params'], like)
  for r in roles:
    params = merge_view(params, codec.group_piece(sent[r], r))
  server_rows = cs.server_rows
  if jax.tree.leaves(server_rows):
    sent_rows = codec.sent_server_rows(server_rows, compress.encoding(rt.config))
    like_rows = {r: codec.client_piece(v, r) for r, v in sent_rows.items()}
    got = codec.from_record(content['server_rows'], like_rows)
    got = {r: codec.group_piece(v, r) for r, v in got.items()}
    # Rows the server does not send (a client-side sparsify's residual): as they were.
    server_rows = {r: {**v, **got[r]} if isinstance(v, dict) else got[r]
                   for r, v in server_rows.items()}
  return cs.replace(params=params, server_rows=server_rows)


def train_reply(rt: ClientRuntime, client: int, kept, content: RecordDict):
  """A train message's work: (the state to keep, as a record; the reply's content)."""
  rnd = int(content['config']['server-round'])
  share = float(content['config'].get('step-share', 1.0))
  t0 = time.perf_counter()
  cs, residual = stored(rt, client, kept)
  cs = _with_server_rows(rt, client, cs, content)
  trained, pieces, m = rt.train(client, cs, rnd, share)
  m = jax.device_get(m)
  spec = rt.exp.fed.groups[rt.locate(client)[0]]
  extra = {}
  encoding = compress.encoding(rt.config)
  if encoding == 'quantize':  # sent as codes: `quantize` at the client
    codes, scales, err, norm = jax.device_get(rt.quantizer(client)(
        rt.pieces(client, cs.params), pieces, jnp.int32(rnd - 1)))
    upload = codec.quantized_record(codes, scales, rt.bits)
    extra = {'quant_err': float(err), 'quant_norm': float(norm)}
  elif encoding == 'sparsify':  # top-k of Δ + e sent, e kept here: `sparsify` at the client
    sent, residual, kept_n, resid_sq = jax.device_get(rt.sparsifier()(
        rt.pieces(client, cs.params), pieces, residual))
    upload = codec.sparse_record({r: jax.tree.leaves(v) for r, v in sent.items()})
    extra = {'sparse_kept_count': int(kept_n), 'sparse_resid_sq': float(resid_sq),
             'sparse_values': int(sum(np.size(x) for x in jax.tree.leaves(sent)))}
  else:
    upload = codec.to_record(jax.device_get(pieces))
  seconds = time.perf_counter() - t0  # the server's rows decoded, the local round
  metrics = MetricRecord({
      'num-examples': int(rt.exp.fed.clients[client].num_train),
      'steps': int(m['steps'][0]), 'first_loss': float(m['first_loss'][0]),
      'last_loss': float(m['last_loss'][0]), 'train_seconds': seconds,
      'loss': [float(x) for x in np.asarray(m['loss'][0])][:spec.num_slots], **extra})
  reply = RecordDict({'upload': upload, 'metrics': metrics,
                      'client': ConfigRecord({'client': client})})
  state = jax.device_get(trained.replace(server_rows=()))
  keep = state if residual is None else {'state': state, 'residual': residual}
  return codec.to_record(keep), reply


def evaluate_reply(rt: ClientRuntime, client: int, kept, content: RecordDict) -> RecordDict:
  """An evaluate message's work: the reply's content (the metric rows as JSON)."""
  cs = _with_server_rows(rt, client, stored_state(rt, client, kept), content)
  rows = rt.evaluate(client, cs, int(content['config']['server-round']))
  return RecordDict({'eval': ConfigRecord({'rows': json.dumps(rows)}),
                     'client': ConfigRecord({'client': client})})


def check_run(cfg, client: int, fields) -> None:
  """A node's answer to the server's handshake: ConfigError (one line naming `client`)
  when its config `cfg` differs from the server's shared `fields`
  (`codec.shared_fields`) or holds no client `client`."""
  diffs = codec.differing_fields(cfg, fields)
  if diffs:
    raise ConfigError(f'client {client}: its config differs from the server\'s in '
                      f'{", ".join(diffs)}')
  if runtime.is_many_task(cfg):
    many_task.client_runtime(cfg).check_client(client)
  else:
    client_runtime(cfg).locate(client)


def make_client_app(config=None) -> ClientApp:
  """A `ClientApp` acting as engine client `partition-id` of the run `config`
  describes (either setting); without `config`, the node reads it from its run config
  (`config='configs/hca2.py:smoke'`, optional `overrides` = JSON of dotted fields)."""
  app = ClientApp()

  def config_of(context: Context):
    if config is not None:
      return config
    from fedjax_mtl.flower import server
    return server.config_from_run(context.run_config)

  @app.query()
  def query(msg: Message, context: Context) -> Message:
    client = partition_id(context)
    check_run(config_of(context), client, msg.content['config']['fields'])
    return Message(RecordDict({'client': ConfigRecord({'client': client})}), reply_to=msg)

  @app.train()
  def train(msg: Message, context: Context) -> Message:
    cfg = config_of(context)
    if runtime.is_many_task(cfg):  # stateless: nothing kept between rounds
      reply = many_task.train_reply(many_task.client_runtime(cfg), partition_id(context),
                                    msg.content)
      return Message(reply, reply_to=msg)
    rt = client_runtime(cfg)
    kept, reply = train_reply(rt, partition_id(context), context.state.get(STATE_KEY),
                              msg.content)
    context.state[STATE_KEY] = kept
    return Message(reply, reply_to=msg)

  @app.evaluate()
  def evaluate_(msg: Message, context: Context) -> Message:
    rt = client_runtime(config_of(context))
    reply = evaluate_reply(rt, partition_id(context), context.state.get(STATE_KEY),
                           msg.content)
    return Message(reply, reply_to=msg)

  return app


# What a deployment loads (`fedjax_mtl.flower.client:app`): the config comes from
# the run config.
app = make_client_app()
