"""FedAMP: attentive message passing on encoders and decoders (λ = 1, α_k = 1, σ = 1 in config.fedamp).

Variants as every algorithm config: `configs/fedamp.py` (synthetic benchmark),
`configs/fedamp.py:smoke` (seconds per round), `configs/fedamp.py:paper,scenario=...`
(the paper's setting on real PASCAL-Context / NYUD-v2).
"""

from fedjax_mtl.defaults import base_config


def get_config(arg=None):
  return base_config(arg, algorithm='fedamp')  # with its block config.fedamp at the defaults
