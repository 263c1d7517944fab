"""MaT-FL: dynamic grouping of the encoders (config.matfl.mode = hard|soft, num_clusters = 2, th = 0).

Variants as every algorithm config: `configs/matfl.py` (synthetic benchmark),
`configs/matfl.py:smoke` (seconds per round), `configs/matfl.py:paper,scenario=...`
(the paper's setting on real PASCAL-Context / NYUD-v2).
"""

from fedjax_mtl.algorithms.matfl import default_config
from fedjax_mtl.defaults import base_config


def get_config(arg=None):
  c = base_config(arg, algorithm='matfl')
  c.matfl = default_config()
  return c
