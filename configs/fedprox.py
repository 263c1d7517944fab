"""FedProx: FedAvg plus the proximal term μ/2‖θ − θ_start‖² (μ = config.fedprox.mu = 0.01).

Variants as every algorithm config: `configs/fedprox.py` (synthetic benchmark),
`configs/fedprox.py:smoke` (seconds per round), `configs/fedprox.py:paper,scenario=...`
(the paper's setting on real PASCAL-Context / NYUD-v2).
"""

from fedjax_mtl.defaults import base_config


def get_config(arg=None):
  return base_config(arg, algorithm='fedprox')  # with its block config.fedprox at the defaults
