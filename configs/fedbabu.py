"""FedBABU: encoders shared; decoders and heads frozen at init, fine-tuned locally in the last config.fedbabu.finetune_rounds rounds.

Variants as every algorithm config: `configs/fedbabu.py` (synthetic benchmark),
`configs/fedbabu.py:smoke` (seconds per round), `configs/fedbabu.py:paper,scenario=...`
(the paper's setting on real PASCAL-Context / NYUD-v2).
"""

from fedjax_mtl.defaults import base_config


def get_config(arg=None):
  return base_config(arg, algorithm='fedbabu')  # with its block config.fedbabu at the defaults
