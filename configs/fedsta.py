"""FedSTA: the shared encoder of FeSTA (Park et al., NeurIPS 2021) in the task-agnostic rounds, then frozen while decoders and heads fine-tune (config.fedsta).

Variants as every algorithm config: `configs/fedsta.py` (synthetic benchmark),
`configs/fedsta.py:smoke` (seconds per round), `configs/fedsta.py:paper,scenario=...`
(the paper's setting on real PASCAL-Context / NYUD-v2).
"""

from fedjax_mtl.defaults import base_config


def get_config(arg=None):
  return base_config(arg, algorithm='fedsta')  # with its block config.fedsta at the defaults
