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

from fedjax_mtl.algorithms import fedavg, fedprox
from fedjax_mtl.algorithms.base import Algorithm, Client, FedInfo, config_block
from fedjax_mtl.errors import ConfigError


def default_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({'lam': 0.1})


def build(info: FedInfo, config=None) -> Algorithm:
  """FedAvg's server; the client also trains a personal model pulled to the global one."""
  cfg = config_block(config, 'ditto', default_config())
  if cfg.lam < 0:
    raise ConfigError(f'ditto.lam={cfg.lam} is out of range; valid range: lam >= 0')
  base = fedavg.build(info, config)
  client = Client(personal_model=True,
                  personal_loss=fedprox.proximal_loss(cfg.lam, base.shared_roles))
  return Algorithm(name='ditto', client=client, server=base.server, roles=base.roles)
