"""Ditto: a global model by FedAvg plus a personal model per client.

Every local step trains both on the same batch: the global copy w (encoder and
decoders shared and averaged, heads local) with the task loss, and the personal
model v with the task loss plus λ/2·‖v − w_start‖² over the shared parameters
(w_start: the global model the round started from). The personal model (its
own batch-norm statistics and optimizer state) is what gets evaluated.
λ = 0.1 (FedHCA2 spec §6). Both models are trained in the same compiled step;
PFLlib's Ditto instead runs the personal epochs first on a separate pass.
"""

import ml_collections

from fedjax_mtl import fields
from fedjax_mtl.algorithms import fedavg, fedprox
from fedjax_mtl.algorithms.base import Algorithm, Client, FedInfo

CONFIG = fields.Block('ditto', {
    'lam': fields.Field(0.1, 'Ditto: pull λ of the personal model to the global one',
                        fields.at_least(0), traced=True),
}, reads=('fedavg',))


def default_config() -> ml_collections.ConfigDict:
  return CONFIG.config()


def build(info: FedInfo, config=None) -> Algorithm:
  """FedAvg's server; the client also trains a personal model pulled to the global one."""
  cfg = CONFIG.of(config)
  base = fedavg.build(info, config)
  client = Client(personal_model=True,
                  personal_loss=fedprox.proximal_loss(cfg.lam, base.shared_roles,
                                                                'ditto.lam'))
  return Algorithm(name='ditto', client=client, server=base.server, roles=base.roles)
