"""MOON (Li et al. 2021; FedDEA spec §2.4, A12 μ = 1, τ = 0.5): FedAvg plus the
model-contrastive loss on the representation z = the encoder's last-stage
feature map averaged over space (Swin-T: 768-d; spec §2.4):

  μ · −log( e^{sim(z, z_glob)/τ} / (e^{sim(z, z_glob)/τ} + e^{sim(z, z_prev)/τ}) ),

z_glob from the model the client started the round from, z_prev from its own
previous local model (its client state: one copy of the encoder; the initial
global model before its first round, as MOON's reference code starts). Both get
no gradient. Each extra term costs encoder forwards of the step's batch
(`ClientCtx.features`); the representation of the trained model is recomputed
too, so a MOON step runs the encoder four times.
"""

import ml_collections

from fedjax_mtl import fields
from fedjax_mtl.algorithms import fedavg, plugin_math
from fedjax_mtl.algorithms.base import Algorithm, Client, ClientCtx, FedInfo

CONFIG = fields.Block('moon', {
    'mu': fields.Field(plugin_math.MOON_MU, 'MOON: weight μ of the model-contrastive loss',
                       fields.at_least(0)),
    'tau': fields.Field(plugin_math.MOON_TAU, 'MOON: temperature τ of the model-contrastive '
                        'loss', fields.above(0)),
}, reads=('fedavg',))


def default_config() -> ml_collections.ConfigDict:
  return CONFIG.config()


def client(mu: float, tau: float) -> Client:
  """MOON's client part: the contrastive term; its state is the previous local encoder."""
  def loss(ctx: ClientCtx):
    z = ctx.features(ctx.params['encoder'])
    z_glob = ctx.features(ctx.start['encoder'])
    z_prev = ctx.features(ctx.state)
    return plugin_math.moon_loss(z, z_glob, z_prev, mu, tau)

  return Client(init=lambda params: params['encoder'], loss=loss,
                finalize=lambda params, start, state: (params, params['encoder']))


def build(info: FedInfo, config=None) -> Algorithm:
  """FedAvg's roles and server; MOON's client."""
  cfg = CONFIG.of(config)
  base = fedavg.build(info, config)
  return Algorithm(name='moon', client=client(cfg.mu, cfg.tau), server=base.server,
                   roles=base.roles)
