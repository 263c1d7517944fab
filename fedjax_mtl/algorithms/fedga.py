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

Partial participation (`ServerInputs.row_valid`): client k's gap is measured when it
takes part again, G_k = L_k(the model it is sent now) − L_k(its model at the end of
its last round), and is 0 for the clients that sat the round out and for a first
participation (no model of its own yet), so only the participants' weights move
(the step and max_j |G_j| over the gaps measured this round; all weights are then
renormalised). The mean is over the participants, weighted by their a_k
renormalised over them; every row gets it, as FedAvg's. A client's stored last loss
changes only when it trains. With every client each round this is the rule above.
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
  partial = info.num_participants > 0

  def init(views):
    shared = {'weights': jnp.full((n,), 1.0 / n, jnp.float32),
              'last_loss': jnp.zeros((n,), jnp.float32)}
    if partial:  # which clients hold a last loss (have trained at least once)
      shared['seen'] = jnp.zeros((n,), jnp.bool_)
    return ServerState(shared=shared)

  def apply(state: ServerState, x: ServerInputs):
    st = state.shared
    last = x.last_loss.astype(jnp.float32)
    if partial and x.row_valid is not None:
      valid = x.row_valid
      measured = valid & st['seen']
      gaps = jnp.where(measured, x.first_loss - st['last_loss'], 0.)
      moved = jnp.any(measured)
      last = jnp.where(valid, last, st['last_loss'])
      seen = {'seen': st['seen'] | valid}
    else:
      valid, seen = None, {}
      gaps = x.first_loss - st['last_loss']
      moved = x.round > 0
    step = plugin_math.fedga_step(jnp.maximum(x.round - 1, 0), info.num_rounds, step_size)
    updated = plugin_math.fedga_weights(st['weights'], gaps, step)
    weights = jnp.where(moved, updated, st['weights'])
    out = {}
    for role, local in x.local.items():
      owners = jnp.asarray(info.row_client(role))
      w = weights[owners] if valid is None else jnp.where(valid[owners], weights[owners], 0.)
      out[role] = broadcast_rows(tree_mean(local, w / jnp.sum(w)), local)
    shared = {'weights': weights, 'last_loss': last, **seen}
    logs = {'fedga_weights': weights, 'fedga_gaps': jnp.where(moved, gaps, 0.)}
    return out, ServerState(shared=shared, rows=state.rows), logs

  return Server(init=init, apply=apply, blocks=True)


def build(info: FedInfo, config=None) -> Algorithm:
  """FedAvg's roles and client; FedDG-GA's weights on the server."""
  cfg = CONFIG.of(config)
  base = fedavg.build(info, config)
  return Algorithm(name='fedga', client=Client(), server=server(info, cfg.step_size),
                   roles=base.roles)
