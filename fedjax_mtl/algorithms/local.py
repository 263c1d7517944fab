"""Local training: nothing is shared; every client keeps its own model (the Δm reference)."""

from fedjax_mtl.algorithms import rules
from fedjax_mtl.algorithms.base import Algorithm, Client, FedInfo


def build(info: FedInfo, config=None) -> Algorithm:
  """No aggregation: every role personal."""
  del info, config
  return Algorithm(name='local', client=Client(), server=rules.identity(),
                   roles={'encoder': 'personal', 'decoder': 'personal', 'head': 'personal'})
