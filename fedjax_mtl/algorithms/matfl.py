"""MaT-FL: dynamic grouping of the encoders; decoders and heads stay personal.

Each round the server compares the clients' encoders by the cosine of their
deviations from the mean model and mixes them with a row-stochastic weight
matrix (`matfl_math`): `hard` = average-linkage agglomerative clustering into
`num_clusters` groups (K = 2, FedHCA2 spec §6) and a uniform mean within each
group; `soft` = rows of max(cos + th, 0), normalised. Both are the released
code's `dg_utils` options (spec matu.md §3). Batch-norm statistics stay local.
"""

import jax.numpy as jnp
import ml_collections

from fedjax_mtl import fields
from fedjax_mtl.algorithms import matfl_math as mm
from fedjax_mtl.algorithms.base import (Algorithm, Client, FedInfo, Server, ServerInputs,
                                        ServerState)
from fedjax_mtl.errors import ConfigError

CONFIG = fields.Block('matfl', {
    'mode': fields.Field('hard', 'MaT-FL grouping: hard (clustering) or soft (cosine weights)',
                         choices=mm.MODES),
    'num_clusters': fields.Field(2, 'MaT-FL hard mode: number of clusters, 1..number of '
                                 'clients', fields.at_least(1)),
    'th': fields.Field(0.0, 'MaT-FL soft mode: weights are max(cos + th, 0)', fields.above(-1)),
})


def default_config() -> ml_collections.ConfigDict:
  return CONFIG.config()


def grouping(mode: str, num_clusters: int, th: float, info: FedInfo) -> Server:
  """Every row of every role it gets becomes its group's weighted mean (rows marked
  invalid in `ServerInputs.row_valid`, padding, keep their upload and join no group)."""
  def apply(state, x: ServerInputs):
    out, logs = {}, {}
    for role, local in x.local.items():
      valid = None if x.row_valid is None else x.row_valid[jnp.asarray(info.row_client(role))]
      w, aux = mm.group_weights(local, mode, num_clusters, th, valid)
      out[role] = mm.mix(w, local)
      logs.update({f'matfl_{role}_weights': w, f'matfl_{role}_labels': aux['labels']})
    return out, state, logs

  return Server(init=lambda views: ServerState(), apply=apply)


def build(info: FedInfo, config=None) -> Algorithm:
  """MaT-FL's grouping on the encoders."""
  cfg = CONFIG.of(config)
  # The clients (the round's pairs in the many-task setting) are known only here.
  if cfg.mode == 'hard' and not cfg.num_clusters <= info.num_clients:
    raise ConfigError(f'matfl.num_clusters={cfg.num_clusters} is out of range; valid range: '
                      f'1 <= num_clusters <= number of clients ({info.num_clients})')
  return Algorithm(name='matfl', client=Client(),
                   server=grouping(cfg.mode, int(cfg.num_clusters), float(cfg.th), info),
                   roles={'encoder': 'shared', 'decoder': 'personal', 'head': 'personal'})
