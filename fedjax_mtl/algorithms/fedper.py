"""FedPer: the encoders are shared and averaged; decoders and heads stay personal."""

from fedjax_mtl.algorithms import rules
from fedjax_mtl.algorithms.base import Algorithm, Client, FedInfo


def build(info: FedInfo, config=None) -> Algorithm:
  """FedAvg on the encoders only."""
  del config
  return Algorithm(name='fedper', client=Client(), server=rules.mean('uniform', info),
                   roles={'encoder': 'shared', 'decoder': 'personal', 'head': 'personal'})
