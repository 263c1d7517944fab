"""FedPer: encoders shared and averaged; decoders and heads personal.

Variants as every algorithm config: `configs/fedper.py` (synthetic benchmark),
`configs/fedper.py:smoke` (seconds per round), `configs/fedper.py:paper,scenario=...`
(the paper's setting on real PASCAL-Context / NYUD-v2).
"""

from fedjax_mtl.defaults import base_config


def get_config(arg=None):
  return base_config(arg, algorithm='fedper')
