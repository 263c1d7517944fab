"""FedDyn: dynamic regularisation, α = 0.01 (a FedDEA plug-in base).

On the hetero-client benchmark by default; `configs/feddea.py` runs it in the
unified-model setting with `--config.algorithm='dea(feddyn)'`.
"""

from fedjax_mtl.defaults import base_config


def get_config(arg=None):
  return base_config(arg, algorithm='feddyn')  # with its block config.feddyn at the defaults
