"""FedACG (Kim et al. 2024; FedDEA spec §2.4, A12 λ = 0.85, β = 2e-3 in the β/2 form).

The server broadcasts its momentum m with the model; each client starts local
training from the lookahead θ̃ = θ + λm (`Client.begin`) and adds β/2 ‖θ − θ̃‖²
on the shared parameters. The server averages the uploads as FedAvg does, which
is θ̃ + Σ_k w_k Δ_k = θ^{t+1} with Δ_k relative to θ̃, and keeps

  m^{t+1} = λ m^t + Σ_k w_k Δ_k  (= θ^{t+1} − θ̃ + λ m^t),

so θ^{t+1} = θ^t + m^{t+1} (FedACG's `ServerM`). θ^{t+1} is what the clients hold
between rounds and what is evaluated. m is kept per client row (sharded with the
clients, one float32 copy of the shared parameters each) so that `begin` reads it
where it trains. Under `dea(fedacg)` the server rule reads the masked Δ̃_k
relative to the lookahead, as A11 asks.
"""

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_mtl import fields
from fedjax_mtl.algorithms import fedavg, fedprox, plugin_math
from fedjax_mtl.algorithms.base import (Algorithm, Client, FedInfo, Server, ServerInputs,
                                        ServerState, merge_view, role_view)

MOMENTUM = 'acg_momentum'  # the per-row server state `begin` reads

CONFIG = fields.Block('fedacg', {
    'lam': fields.Field(plugin_math.FEDACG_LAMBDA, 'FedACG: momentum λ of the server update '
                        'and of the lookahead', fields.unit()),
    'beta': fields.Field(plugin_math.FEDACG_BETA, 'FedACG: coefficient β of β/2 ‖θ − '
                         'θ_lookahead‖²', fields.at_least(0)),
}, reads=('fedavg',))


def default_config() -> ml_collections.ConfigDict:
  return CONFIG.config()


def begin(lam: float, roles: tuple[str, ...]):
  """`begin(params, server_rows, labels)`: the lookahead θ + λ m on the shared roles."""
  def fn(params, server_rows, labels):
    for r in roles:
      ahead = plugin_math.fedacg_lookahead(role_view(params, labels, r),
                                           server_rows[r][MOMENTUM], lam)
      params = merge_view(params, ahead)
    return params
  return fn


def with_momentum(rule: Server, lam: float) -> Server:
  """`rule` plus FedACG's momentum m^{t+1} = λ m^t + (rule output − prev), kept per row."""
  def init(views) -> ServerState:
    inner = rule.init(views)
    zeros = lambda v: jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), v)
    return ServerState(inner.shared, {r: {'inner': inner.rows.get(r, {}), MOMENTUM: zeros(v)}
                                      for r, v in views.items()})

  def apply(state: ServerState, x: ServerInputs):
    inner = ServerState(state.shared, {r: v['inner'] for r, v in state.rows.items()})
    new, st, logs = rule.apply(inner, x)
    rows = {r: {'inner': st.rows.get(r, {}),
                MOMENTUM: jax.tree.map(
                    lambda m, a, p: lam * m + (a.astype(jnp.float32) - p.astype(jnp.float32)),
                    state.rows[r][MOMENTUM], v, x.prev[r])}
            for r, v in new.items()}
    return new, ServerState(st.shared, rows), logs

  return Server(init=init, apply=apply)  # per-row state as stacked rows, not `Blocks`


def build(info: FedInfo, config=None) -> Algorithm:
  """FedAvg's roles and server rule, FedACG's lookahead, penalty and momentum."""
  cfg = CONFIG.of(config)
  base = fedavg.build(info, config)
  client = Client(loss=fedprox.proximal_loss(cfg.beta, base.shared_roles),
                  begin=begin(cfg.lam, base.shared_roles))
  return Algorithm(name='fedacg', client=client, server=base.server, roles=base.roles,
                   outermost=lambda server: with_momentum(server, cfg.lam))
