"""FedACG: lookahead starts, server momentum λ = 0.85, β = 2e-3 (a FedDEA plug-in base).

On the hetero-client benchmark by default; `configs/feddea.py` runs it in the
unified-model setting with `--config.algorithm='dea(fedacg)'`.
"""

from fedjax_mtl.defaults import base_config


def get_config(arg=None):
  return base_config(arg, algorithm='fedacg')  # with its block config.fedacg at the defaults
