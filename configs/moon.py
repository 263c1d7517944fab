"""MOON: FedAvg plus the model-contrastive loss, μ = 1, τ = 0.5 (a FedDEA plug-in base).

On the hetero-client benchmark by default; `configs/feddea.py` runs it in the
unified-model setting with `--config.algorithm='dea(moon)'`.
"""

from fedjax_mtl.defaults import base_config


def get_config(arg=None):
  return base_config(arg, algorithm='moon')  # with its block config.moon at the defaults
