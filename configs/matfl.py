"""MaT-FL: dynamic grouping of the encoders (config.matfl.mode = hard|soft, num_clusters = 2, th = 0).

Variants as every algorithm config: `configs/matfl.py` (synthetic benchmark),
`configs/matfl.py:smoke` (seconds per round), `configs/matfl.py:paper,scenario=...`
(the paper's setting on real PASCAL-Context / NYUD-v2), `configs/matfl.py:mini8` (the
many-task setting: the round's (client, task) pairs grouped, 3 clusters).
"""

from fedjax_mtl.defaults import base_config, parse_arg


def get_config(arg=None):
  c = base_config(arg, algorithm='matfl')  # with its block config.matfl at the defaults
  variant, items = parse_arg(arg)
  if variant == 'mini8' or 'table' in items:  # many-task: 3 clusters for 8 tasks (spec matu §4)
    c.matfl.num_clusters = 3
  return c
