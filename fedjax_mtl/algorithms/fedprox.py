"""FedProx: FedAvg plus the proximal term μ/2·‖θ − θ_start‖² on the shared parameters.

θ_start is the model the client started the round from (the aggregated
encoder and decoders); heads are personal and not pulled. μ = 0.01 (FedHCA2
spec §6). The term adds μ(θ − θ_start) to the gradient of every shared leaf.
"""

import ml_collections

from fedjax_mtl import fields
from fedjax_mtl.algorithms import fedavg
from fedjax_mtl.algorithms.base import Algorithm, Client, ClientCtx, FedInfo, sq_dist

CONFIG = fields.Block('fedprox', {
    'mu': fields.Field(0.01, 'FedProx proximal coefficient μ', fields.at_least(0), traced=True),
}, reads=('fedavg',))


def default_config() -> ml_collections.ConfigDict:
  return CONFIG.config()


def proximal_loss(mu: float, roles: tuple[str, ...], field: str = ''):
  """`loss(ctx) = μ/2·‖θ − θ_start‖²` over the leaves of `roles`; μ is `field`'s traced
  value in a sweep's replica (`fields.traced_value`) when `field` names one."""
  def loss(ctx: ClientCtx):
    coef = fields.traced_value(field, mu) if field else mu
    return 0.5 * coef * sq_dist(ctx.params, ctx.start, ctx.labels, roles)
  return loss


def build(info: FedInfo, config=None) -> Algorithm:
  """FedAvg's server; the client adds the proximal term."""
  cfg = CONFIG.of(config)
  base = fedavg.build(info, config)
  client = Client(loss=proximal_loss(cfg.mu, base.shared_roles, 'fedprox.mu'))
  return Algorithm(name='fedprox', client=client, server=base.server, roles=base.roles)
