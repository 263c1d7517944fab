"""FedGA (FedDG-GA): client weights moved by the generalisation gap, d = 0.2 (a FedDEA plug-in base).

On the hetero-client benchmark by default; `configs/feddea.py` runs it in the
unified-model setting with `--config.algorithm='dea(fedga)'`.
"""

from fedjax_mtl.defaults import base_config


def get_config(arg=None):
  return base_config(arg, algorithm='fedga')  # with its block config.fedga at the defaults
