"""FedDyn (Acar et al. 2021; FedDEA spec §2.4, A12 α = 0.01).

Client k adds −⟨∇L_k(θ_k^{t−1}), θ⟩ + α/2 ‖θ − θ^{t−1}‖² on the shared
parameters, and after local training updates its state ∇L_k ← ∇L_k − α(θ_k −
θ^{t−1}) (one float32 copy of the params per client). The server keeps h:

  h ← h − α (1/m) Σ_k (θ_k − θ),   θ ← mean_k θ_k − h / α,

with θ_k = θ + Δ_k; under `dea(feddyn)` the masked update Δ̃_k enters both lines
(spec §2.4, A-REC). Weights follow `fedavg.weighting`.
"""

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_mtl import fields
from fedjax_mtl.algorithms import fedavg, plugin_math, rules
from fedjax_mtl.algorithms.base import (Algorithm, Client, ClientCtx, FedInfo, Server,
                                        ServerInputs, ServerState, broadcast_rows, stack,
                                        tree_mean, tree_sub)

CONFIG = fields.Block('feddyn', {
    'alpha': fields.Field(plugin_math.FEDDYN_ALPHA, 'FedDyn regularisation α', fields.above(0)),
}, reads=('fedavg',))


def default_config() -> ml_collections.ConfigDict:
  return CONFIG.config()


def _shared(tree, labels, roles):
  return [x for x, l in zip(jax.tree.leaves(tree), jax.tree.leaves(labels)) if l in roles]


def client(alpha: float, roles: tuple[str, ...]) -> Client:
  """FedDyn's client part: the linear and quadratic terms, and its gradient state."""
  def loss(ctx: ClientCtx):
    params, start = _shared(ctx.params, ctx.labels, roles), _shared(ctx.start, ctx.labels, roles)
    grads = _shared(ctx.state, ctx.labels, roles)
    return plugin_math.feddyn_penalty(params, start, grads, alpha)

  def finalize(params, start, state):
    return params, plugin_math.feddyn_grad_state(state, params, start, alpha)

  return Client(init=plugin_math.feddyn_init, loss=loss, finalize=finalize)


def server(info: FedInfo, alpha: float, weighting: str = 'uniform') -> Server:
  """FedDyn's server rule; its state h is one row's shape per role (replicated)."""
  rules.check_weighting(weighting)

  def init(views):
    return ServerState(shared={r: plugin_math.feddyn_init(jax.tree.map(lambda x: x[0], v))
                               for r, v in views.items()})

  def apply(state: ServerState, x: ServerInputs):
    out, h = {}, {}
    for role, local in x.local.items():
      w = rules.row_weights(weighting, info, role, x)
      prev = tree_mean(stack(x.prev[role]), w)  # the rows start from one model
      # Partial participation (Alg. 1): h moves by (1/m) Σ_{k∈P}, m every row; the
      # weights w are over the participants, so the total that gives k/m = |P|/k is k²/|P|.
      k = len(info.row_client(role))
      total = (None if x.row_valid is None else
               k * k / jnp.sum(x.row_valid[jnp.asarray(info.row_client(role))]))
      new, h[role] = plugin_math.feddyn_server(
          prev, tree_sub(stack(local), stack(x.prev[role])), state.shared[role], alpha,
          num_clients_total=total, weights=w)
      out[role] = broadcast_rows(new, stack(local))
    return out, ServerState(shared=h, rows=state.rows), {}

  return Server(init=init, apply=apply)


def build(info: FedInfo, config=None) -> Algorithm:
  """FedAvg's roles; FedDyn's client and server."""
  cfg = CONFIG.of(config)
  base = fedavg.build(info, config)
  return Algorithm(name='feddyn', client=client(cfg.alpha, base.shared_roles),
                   server=server(info, cfg.alpha, fedavg.weighting(config)), roles=base.roles)
