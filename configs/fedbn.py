"""FedBN: FedAvg with every batch-norm layer's parameters kept local (a FedDEA plug-in base).

On the hetero-client benchmark by default; `configs/feddea.py` runs it in the
unified-model setting with `--config.algorithm='dea(fedbn)'`.
"""

from fedjax_mtl.defaults import base_config


def get_config(arg=None):
  return base_config(arg, algorithm='fedbn')
