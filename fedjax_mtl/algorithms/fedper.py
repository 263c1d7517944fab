"""FedPer: the encoders are shared and averaged; decoders and heads stay personal."""

from fedjax_mtl.algorithms import rules
from fedjax_mtl.algorithms.base import Algorithm, Client, FedInfo


def build(info: FedInfo, config=None) -> Algorithm:
  """FedAvg on the encoders only."""
  del info, config
  return Algorithm(name='fedper', client=Client(), server=rules.mean(),
                   roles={'encoder': 'shared', 'decoder': 'personal', 'head': 'personal'})
