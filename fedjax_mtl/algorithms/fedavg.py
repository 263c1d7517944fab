"""FedAvg for hetero clients: mean of the encoders over N and of the decoders over all K.

As in FedHCA2's released code the mean is uniform (`fedavg.weighting='examples'`
weights clients by their number of local examples), and decoders are averaged
across all tasks, so after aggregation only the heads differ.
"""

import ml_collections

from fedjax_mtl import fields
from fedjax_mtl.algorithms import rules
from fedjax_mtl.algorithms.base import Algorithm, Client, FedInfo, unified_roles

SHARED = {'encoder': 'shared', 'decoder': 'shared', 'head': 'personal'}

CONFIG = fields.Block('fedavg', {
    'weighting': fields.Field('uniform', "FedAvg mean: 'uniform' or 'examples' (by local "
                              'example counts)', choices=rules.WEIGHTINGS),
})


def default_config() -> ml_collections.ConfigDict:
  return CONFIG.config()


def weighting(config) -> str:
  """`fedavg.weighting`: the client weights of every FedAvg-family server (FedAvg,
  FedProx, FedNova, FedDyn, FedBN; their blocks declare `reads=('fedavg',)`)."""
  return CONFIG.of(config).weighting


def build(info: FedInfo, config=None) -> Algorithm:
  """Encoders and decoders shared and averaged; heads personal (or the unified
  model's roles under `config.unified`)."""
  return Algorithm(name='fedavg', client=Client(), server=rules.mean(weighting(config), info),
                   roles=unified_roles(config, SHARED))
