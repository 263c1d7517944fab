"""FedGA = FedDG-GA (Zhang et al. 2023; FedDEA spec §2.4): client weights a_k that
move toward the clients the global model serves worst.

After each round, client k's generalisation gap is G_k = L_k(global model after
aggregation) − L_k(its local model), both on its own data, and

  a_k ← clip(a_k + (d^r/K) · G_k / max_j |G_j|, 0, 1), renormalised,
  d^r = d (1 − r/R), d = 0.2,

weights the next round's aggregation θ ← Σ_k a_k θ_k (a⁰ uniform, as the
reference). The two losses come from local training, so no extra pass over the
data is made: L_k(global) is client k's first-step loss of the next round (the
model the server sent, on one batch) and L_k(local) its last real step's loss of
this round (its trained model one step before the end, on one batch); the gap
of round r is therefore applied when round r + 1 is aggregated, which is when
the reference uses it. Single-batch estimates are noisier than the reference's
full passes. Under `dea(fedga)` the weighted mean reads the masked uploads.
"""

import jax.numpy as jnp
import ml_collections

from fedjax_mtl import fields
from fedjax_mtl.algorithms import fedavg, plugin_math
from fedjax_mtl.algorithms.base import (Algorithm, Client, FedInfo, Server, ServerInputs,
                                        ServerState, broadcast_rows, tree_mean)

CONFIG = fields.Block('fedga', {
    'step_size': fields.Field(plugin_math.FEDGA_STEP_SIZE, 'FedGA (FedDG-GA): initial step d '
                              'of the client-weight update, decaying linearly over the rounds',
                              fields.at_least(0)),
}, reads=('fedavg',))


def default_config() -> ml_collections.ConfigDict:
  return CONFIG.config()


def server(info: FedInfo, step_size: float) -> Server:
  """FedDG-GA's weight update and weighted mean; state: the weights, the last losses."""
  n = info.num_clients

  def init(views):
    return ServerState(shared={'weights': jnp.full((n,), 1.0 / n, jnp.float32),
                               'last_loss': jnp.zeros((n,), jnp.float32)})

  def apply(state: ServerState, x: ServerInputs):
    gaps = x.first_loss - state.shared['last_loss']
    step = plugin_math.fedga_step(jnp.maximum(x.round - 1, 0), info.num_rounds, step_size)
    updated = plugin_math.fedga_weights(state.shared['weights'], gaps, step)
    weights = jnp.where(x.round > 0, updated, state.shared['weights'])
    out = {}
    for role, local in x.local.items():
      w = weights[jnp.asarray(info.row_client(role))]
      out[role] = broadcast_rows(tree_mean(local, w / jnp.sum(w)), local)
    shared = {'weights': weights, 'last_loss': x.last_loss.astype(jnp.float32)}
    logs = {'fedga_weights': weights, 'fedga_gaps': jnp.where(x.round > 0, gaps, 0.)}
    return out, ServerState(shared=shared, rows=state.rows), logs

  return Server(init=init, apply=apply, blocks=True)


def build(info: FedInfo, config=None) -> Algorithm:
  """FedAvg's roles and client; FedDG-GA's weights on the server."""
  cfg = CONFIG.of(config)
  base = fedavg.build(info, config)
  return Algorithm(name='fedga', client=Client(), server=server(info, cfg.step_size),
                   roles=base.roles)
