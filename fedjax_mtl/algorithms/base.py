"""An algorithm is a client part plus a server part, both pure functions.

- **Parameter roles** come from a label tree (as in `optax.multi_transform`):
  the model labels each parameter leaf with a role (`encoder`, `decoder`,
  `head`); batch-norm statistics are the role `norm_stats`. An algorithm's
  `roles` maps each role to a policy: `shared` (uploaded and aggregated),
  `personal` (trained, never leaves the client) or `frozen` (not trained).
- **Client part** (`Client`, FedJAX's client_init/step/final shape), compiled
  into the vmapped local training: `init(params) -> state` once per client,
  `begin` the point local training starts from, `loss(ctx)` extra loss terms,
  `finalize(params, start, state) -> (upload, state)` after the local steps,
  and `forward` replaces the model's apply
  (NTK linearisation swaps it for a `jax.jvp` forward). Per-client state lives
  in the client groups, sharded along the `clients` axis like the parameters.
- **Server part** (`Server`, optax's init/update shape) over the shared roles,
  each stacked over its rows (encoders `[N, ...]` per client, decoders
  `[K, ...]` per task decoder): `init(views) -> ServerState`,
  `apply(state, ServerInputs) -> (new views, state, logs)`. State kept per row
  (`ServerState.rows`, e.g. momentum per client) is stored in the client
  groups, sharded like the parameters; `ServerState.shared` is replicated.
  A server with `blocks=True` gets each role's rows as `Blocks` (the client
  groups' own arrays, no concatenated copy of all rows) and returns `Blocks`;
  the others get (and return) the concatenated `[rows, ...]` trees.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

# Rows of stacked pytrees are part of the algorithm API (rules import them from here).
from fedjax_mtl.algorithms.rows import (Blocks, block_rows, deviation_gram,  # noqa: F401
                                        keep_rows, num_rows, row_offsets, stack, unstack,
                                        where_rows)

PyTree = Any
Views = dict  # role -> stacked pytree [rows, ...]

ROLES = ('encoder', 'decoder', 'head')  # parameter roles the models label
STACKABLE = ('encoder', 'decoder', 'head')  # roles that stack across client groups


@dataclasses.dataclass(frozen=True)
class FedInfo:
  """Static facts a rule may use: sizes, ownership and naming of the stacked rows."""
  num_clients: int
  num_decoders: int
  decoder_client: tuple[int, ...]  # owner client of each decoder row
  decoder_names: tuple[str, ...]
  client_names: tuple[str, ...]
  homo_groups: tuple[int, ...]  # runs of consecutive clients with the same dataset and tasks
  decoder_layers: tuple[str, ...] = ()  # top-level module names of a decoder, in forward order
  num_rounds: int = 1
  client_keys: tuple[tuple[str, str], ...] = ()  # (dataset, tasks) per client
  decoder_keys: tuple[tuple[str, str], ...] = ()  # (dataset, task) per decoder
  # Module paths (names from the params root, e.g. ('decoders', 'fuse_bn')) of the
  # layers that keep batch-norm statistics: FedBN keeps their parameters local.
  norm_modules: frozenset = frozenset()
  num_tasks: int = 0  # many-task setting: the benchmark's tasks (0: the dense engine)
  # Clients a round trains under partial participation (`ServerInputs.row_valid` marks
  # that many; fixed per run); 0: every client, every round.
  num_participants: int = 0


  def row_client(self, role: str) -> tuple[int, ...]:
    """Owner client of every row of `role`'s stacked view: one row per client for
    the encoder and the heads (all of a client's slots in one row), one per task
    decoder for the decoders."""
    return self.decoder_client if role == 'decoder' else tuple(range(self.num_clients))


class ServerInputs(NamedTuple):
  """What the server sees after local training (views: role -> `[rows, ...]`)."""
  prev: Views  # the params the clients started the round from
  local: Views  # what the clients uploaded (their params after local training)
  num_examples: jax.Array  # [N] float32, local training examples per client
  num_steps: jax.Array  # [N] int32, local steps each client actually took
  client_ids: jax.Array  # [N] int32 (many-task rounds: the client of each pair, -1 padding)
  round: jax.Array  # 0-based index of the round being aggregated
  # [N] float32 summed task losses of each client's first local step (the model the
  # server sent, on one batch) and of its last real step (its trained model one
  # step before the end); FedGA's generalisation gaps read them.
  first_loss: jax.Array | None = None
  last_loss: jax.Array | None = None
  # [N] bool: rows that hold a real upload this round (None: all of them). The
  # many-task round pads its slots; a padding row trained nothing.
  row_valid: jax.Array | None = None
  # Many-task rounds (rows = (client, task) pairs): [N] int32 segment id of each
  # row's client (the rows of one client share it, ids < N) and [N] int32 task of
  # each row; `origin` (role -> one row's tree) is the point every row's task
  # vector is measured from (the shared LoRA initialisation: θ_p's trainable part).
  row_client: jax.Array | None = None
  row_task: jax.Array | None = None
  origin: Views | None = None
  # role -> the updates the clients sent, compressed by the clients themselves and
  # decoded by the server (a Flower deployment: `compress.encoding`), in `local`'s
  # views; None: the uploads are `local` and the compression wrapper compresses them.
  # The outermost compression wrapper reads it and passes it on as None.
  encoded: Views | None = None


class ServerState(NamedTuple):
  """`shared`: replicated pytree; `rows`: role -> pytree with a leading rows axis."""
  shared: PyTree = ()
  rows: Mapping[str, PyTree] = {}


class Server(NamedTuple):
  """`init(views) -> ServerState`; `apply(state, inputs) -> (views, state, logs)`.

  `blocks`: `apply` takes and returns every role's rows (views and per-row
  state) as `Blocks`; `init` always sees concatenated views.
  """
  init: Callable[[Views], ServerState]
  apply: Callable[[ServerState, ServerInputs], tuple[Views, ServerState, dict]]
  blocks: bool = False


class ClientCtx(NamedTuple):
  """What a client's extra loss terms see at one local step (one client, unbatched)."""
  params: PyTree  # the params being trained
  start: PyTree  # the params this client started the round from
  state: PyTree  # the client part's own state
  server_rows: Mapping[str, PyTree]  # this client's rows of the server's per-row state
  labels: PyTree  # role of every parameter leaf (same structure as params)
  batch: Mapping[str, jax.Array]
  # features(encoder_params) -> [B, C]: the encoder's last-stage map of this step's
  # images, averaged over space (MOON's representation), under the given params.
  features: Callable[[PyTree], jax.Array] | None = None


def plain_forward(apply: Callable, params: PyTree, start: PyTree, batch_stats: PyTree,
                  image: jax.Array, key: jax.Array):
  """The model's own apply (the default `Client.forward`); `start` is unused."""
  del start
  return apply(params, batch_stats, image, key)


def is_head_key(key: str) -> bool:
  """Whether a top-level parameter key is a prediction head: the many-task model's
  `head/...` leaves and the dense model's `head_<slot>` modules."""
  return key.split('/')[0] == 'head' or key.startswith('head_')


def linearized_forward(apply: Callable, params: PyTree, start: PyTree, batch_stats: PyTree,
                       image: jax.Array, key: jax.Array,
                       nonlinear: Callable[[str], bool] = is_head_key):
  """The NTK-linearised apply around the round's start c (NTKFedAvg spec §2.3):
  f(x; c) + J_c(x)(θ − c) by one `jax.jvp` (a forward and a tangent pass; its
  gradient is reverse-over-forward). c is a constant (`stop_gradient`). For
  applies that return one output pytree (the many-task round's logits).

  Only the backbone is linearised: the top-level entries of `params` for which
  `nonlinear(key)` holds (the heads, `is_head_key`) enter at their current
  values θ_h, so the output is f(x; c_b, θ_h) + J_b(θ_b − c_b), the heads
  applied to the linearised backbone (exactly so for a linear head). Spec §2.6
  keeps heads out of the linearisation; linearising a zero-initialised head
  too would make J_c zero for every backbone leaf and leave the backbone
  untrained."""
  heads = {k: v for k, v in params.items() if nonlinear(k)}
  backbone = {k: v for k, v in params.items() if not nonlinear(k)}
  c = jax.lax.stop_gradient({k: v for k, v in start.items() if not nonlinear(k)})
  return linear_outputs(lambda p, x: apply({**p, **heads}, batch_stats, x, key), c, backbone,
                        image)


def linear_outputs(apply: Callable, c: PyTree, theta: PyTree, x: jax.Array) -> PyTree:
  """f(x; c) + J_c(x)(θ − c): `apply(params, x)` linearised around c, at θ, by one
  `jax.jvp` (NTKFedAvg's client forward, and its evaluation B of spec §2.4)."""
  delta = jax.tree.map(jnp.subtract, theta, c)
  primal, tangent = jax.jvp(lambda p: apply(p, x), (c,), (delta,))
  return jax.tree.map(jnp.add, primal, tangent)


@dataclasses.dataclass(frozen=True)
class Client:
  """The client part of an algorithm; every field defaults to plain local training.

  `personal_model`: the client also trains a personal copy of the whole model
  (own batch-norm statistics and optimizer state) in the same local steps, with
  `personal_loss(ctx)` added to its task loss (`ctx.params` is the personal
  model there); the personal model is what gets evaluated (Ditto).
  """
  init: Callable[[PyTree], PyTree] = lambda params: ()
  loss: Callable[[ClientCtx], jax.Array] | None = None
  finalize: Callable[[PyTree, PyTree, PyTree], tuple[PyTree, PyTree]] = (
      lambda params, start, state: (params, state))
  forward: Callable = plain_forward
  trainable: Callable[[jax.Array], Mapping[str, Any]] | None = None  # round -> role -> bool
  personal_model: bool = False
  personal_loss: Callable[[ClientCtx], jax.Array] | None = None
  # begin(params, server_rows, labels) -> params: where the client's local training
  # starts from the params the server left it (FedACG's lookahead θ + λm); the
  # result is also the round's start point the server sees (`ServerInputs.prev`).
  begin: Callable[[PyTree, Mapping[str, PyTree], PyTree], PyTree] | None = None
  # The point a linearised `forward` receives as its `start`: 'start' (the params the
  # client starts the round from) or 'origin' (the run's initial params: NTKFedAvg's
  # pretrained linearisation point; the many-task engine).
  linearize_at: str = 'start'
  # The dense engine runs the model in inference mode: batch norm normalises with the
  # running statistics the client holds (left unchanged by local training) and dropout
  # is off; `forward`'s `apply` then returns the outputs only (NTKFedAvg's linearised
  # clients, spec §2.6: BN statistics of the linearisation point as constants).
  frozen_stats: bool = False


@dataclasses.dataclass(frozen=True)
class Algorithm:
  """A named client + server pair and the policy of every parameter role."""
  name: str
  client: Client
  server: Server
  roles: Mapping[str, str]  # role -> 'shared' | 'personal' | 'frozen'
  # Applied around the composed server, after every wrapper (e.g. FedBN keeps the
  # batch-norm parameters out of DEA's mask and out of aggregation).
  outermost: Callable[[Server], Server] | None = None
  # Modules (name paths from the params root) of the shared roles whose parameters
  # the server leaves with each client (FedBN: the batch norms).
  local_modules: frozenset = frozenset()
  # The dense engine sets every client's encoder batch-norm running statistics to
  # their uniform mean after each round (MaT-FL aggregates them with the weights).
  average_stats: bool = False

  @property
  def shared_roles(self) -> tuple[str, ...]:
    return tuple(r for r in STACKABLE if self.roles.get(r) == 'shared')


UNIFIED_MODES = ('none', 'literal', 'owner')
# Roles of FedDEA's unified model (spec feddea §6 A1): 'literal' aggregates the
# whole θ; 'owner' leaves each task's decoder and head to its owner.
UNIFIED_ROLES = {'literal': {'encoder': 'shared', 'decoder': 'shared', 'head': 'shared'},
                 'owner': {'encoder': 'shared', 'decoder': 'personal', 'head': 'personal'}}


def unified_mode(config) -> str:
  """`config.unified` ('none' without a config or the field)."""
  return str(config.get('unified', 'none')) if config is not None else 'none'


def unified_roles(config, roles: Mapping[str, str]) -> dict[str, str]:
  """`roles`, or the unified model's roles when `config.unified` asks for them."""
  return dict(UNIFIED_ROLES.get(unified_mode(config), roles))


def config_block(config, name: str, defaults: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`defaults` updated with `config.<name>` where the config has that block."""
  cfg = ml_collections.ConfigDict(defaults.to_dict())
  if config is not None and name in config:
    cfg.update(config[name])
  return cfg


# ----------------------------------------------------------------------------
# Tree helpers for rules and client parts.
# ----------------------------------------------------------------------------

def tree_mean(stacked: PyTree, weights: jax.Array | None = None) -> PyTree:
  """Weighted mean over the rows (uniform by default), one row's shape; `stacked`
  may be `Blocks`.

  One `[N] @ [N, d]` contraction per leaf (XLA:CPU's reduction over a leading
  axis is several times slower at model scale). `Blocks` are concatenated for
  it: per-part contractions summed afterwards round differently (FedAvg's
  results would change in the last bits, and training amplifies that), and the
  mean reads every row once anyway.
  """
  if isinstance(stacked, Blocks):
    stacked = stack(stacked)

  def one(x):
    n = x.shape[0]
    w = jnp.full((n,), 1.0 / n, jnp.float32) if weights is None else weights
    return jnp.tensordot(w.astype(jnp.float32), x.astype(jnp.float32), axes=1,
                         precision=jax.lax.Precision.HIGHEST).astype(x.dtype)
  return jax.tree.map(one, stacked)


def broadcast_rows(tree: PyTree, like: PyTree) -> PyTree:
  """Every row of `like` (stacked or `Blocks`) set to the unstacked `tree`."""
  def fill(part):
    return jax.tree.map(lambda x, l: jnp.broadcast_to(x.astype(l.dtype), l.shape), tree, part)
  if isinstance(like, Blocks):
    return Blocks(tuple(fill(p) for p in like.parts))
  return fill(like)


def mix_rows(weights: jax.Array, stacked: PyTree) -> PyTree:
  """Rows `new_i = Σ_j W_ij x_j` for a `[M, N]` weight matrix (a contraction per leaf)."""
  return jax.tree.map(
      lambda x: jnp.tensordot(weights.astype(jnp.float32), x.astype(jnp.float32), axes=1,
                              precision=jax.lax.Precision.HIGHEST).astype(x.dtype), stacked)


def tree_sub(a: PyTree, b: PyTree) -> PyTree:
  """a - b in float32."""
  return jax.tree.map(lambda x, y: x.astype(jnp.float32) - y.astype(jnp.float32), a, b)


def sq_dist(a: PyTree, b: PyTree, labels: PyTree, roles: tuple[str, ...]) -> jax.Array:
  """‖a - b‖² over the leaves whose label is in `roles` (one client, unstacked)."""
  terms = [jnp.sum(jnp.square(x.astype(jnp.float32) - y.astype(jnp.float32)))
           for x, y, l in zip(jax.tree.leaves(a), jax.tree.leaves(b), jax.tree.leaves(labels))
           if l in roles]
  return sum(terms) if terms else jnp.float32(0.)


def role_view(tree: PyTree, labels: PyTree, role: str) -> PyTree:
  """The subtree of `tree` (nested dicts) whose leaves are labelled `role`."""
  if isinstance(labels, dict):
    out = {}
    for k, lab in labels.items():
      sub = role_view(tree[k], lab, role)
      if sub is not None:
        out[k] = sub
    return out or None
  return tree if labels == role else None


def merge_view(tree: PyTree, view: PyTree) -> PyTree:
  """`tree` with the leaves of `view` (a `role_view` of it) replaced."""
  if isinstance(view, dict):
    return {**tree, **{k: merge_view(tree[k], v) for k, v in view.items()}}
  return view


def sq_dist_trees(a: PyTree, b: PyTree) -> jax.Array:
  """‖a - b‖² over all leaves of two trees of one structure."""
  return sum(jnp.sum(jnp.square(x.astype(jnp.float32) - y.astype(jnp.float32)))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
