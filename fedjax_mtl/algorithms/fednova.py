"""FedNova (Wang et al. 2020; FedDEA spec §2.4): each client's update normalised by
its number of local steps τ_k, the mean rescaled by τ_eff = Σ_k w_k τ_k:

  θ ← θ + τ_eff Σ_k w_k Δ_k / τ_k.

τ_k is the steps client k actually took this round (`ServerInputs.num_steps`:
clients with fewer batches take fewer); with equal τ_k this is FedAvg. Weights
follow `fedavg.weighting` (uniform, or by local examples as in Eq. 6). Under
`dea(...)` Δ_k is the masked update (the mask is unaffected by the scalar 1/τ_k).
"""

import jax.numpy as jnp

from fedjax_mtl import fields
from fedjax_mtl.algorithms import fedavg, plugin_math, rules
from fedjax_mtl.algorithms.base import (Algorithm, Client, FedInfo, Server, ServerInputs,
                                        ServerState, broadcast_rows, stack, tree_mean, tree_sub)

CONFIG = fields.Block('fednova', {}, reads=('fedavg',))  # no knobs; FedAvg's weights


def server(info: FedInfo, weighting: str = 'uniform') -> Server:
  """FedNova's server rule over every shared role's rows."""
  rules.check_weighting(weighting)

  def apply(state, x: ServerInputs):
    out = {}
    for role, local in x.local.items():
      w = rules.row_weights(weighting, info, role, x)
      taus = x.num_steps[jnp.asarray(info.row_client(role))]
      prev = tree_mean(stack(x.prev[role]), w)  # the rows start from one model
      new = plugin_math.fednova_update(prev, tree_sub(stack(local), stack(x.prev[role])), w,
                                       taus)
      out[role] = broadcast_rows(new, stack(local))
    return out, state, {}

  return Server(init=lambda views: ServerState(), apply=apply)


def build(info: FedInfo, config=None) -> Algorithm:
  """FedAvg's roles and client; FedNova's server."""
  base = fedavg.build(info, config)
  weighting = fedavg.weighting(config)
  return Algorithm(name='fednova', client=Client(), server=server(info, weighting),
                   roles=base.roles)
