"""Ditto: a global model by FedAvg plus a personal model per client (λ = config.ditto.lam = 0.1); the personal model is evaluated.

Variants as every algorithm config: `configs/ditto.py` (synthetic benchmark),
`configs/ditto.py:smoke` (seconds per round), `configs/ditto.py:paper,scenario=...`
(the paper's setting on real PASCAL-Context / NYUD-v2).
"""

from fedjax_mtl.defaults import base_config


def get_config(arg=None):
  return base_config(arg, algorithm='ditto')  # with its block config.ditto at the defaults
