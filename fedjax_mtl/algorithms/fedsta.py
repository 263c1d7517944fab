"""FedSTA (FeSTA: Park et al., "Federated Split Task-Agnostic Vision Transformer",
NeurIPS 2021, cited by FedHCA2 as FedSTA) adapted to hetero-client FMTL.

The encoder plays FeSTA's shared transformer body, the decoders and heads its
per-client task-specific head and tail. Task-agnostic stage (all rounds but the
last `fedsta.task_specific_rounds`): one body for every client, i.e. the
uniform mean of the uploaded encoders (`fedsta_math.aggregate`); decoders and
heads train locally. Task-specific stage: the body is frozen (zero step size)
and only decoders and heads are fine-tuned; nothing is aggregated. FedHCA2
confines FedSTA's aggregation to the encoders, so FeSTA's averaging of heads
and tails within a task is not done. The stage lengths are not given by either
paper: `task_specific_rounds` = 1 by default (our choice). The derivation and
its sources are in `fedsta_math`.
"""

import jax.numpy as jnp
import ml_collections

from fedjax_mtl import fields
from fedjax_mtl.algorithms import fedsta_math, rules
from fedjax_mtl.algorithms.base import (Algorithm, Client, FedInfo, Server, ServerInputs,
                                        ServerState)
from fedjax_mtl.errors import ConfigError


def _check(cfg, config) -> None:
  if not cfg.task_specific_rounds < config.num_rounds:
    raise ConfigError(f'fedsta.task_specific_rounds={cfg.task_specific_rounds} is out of range; '
                      f'valid range: 0 <= task_specific_rounds < num_rounds={config.num_rounds}')


CONFIG = fields.Block('fedsta', {
    'task_specific_rounds': fields.Field(1, 'FedSTA: last rounds with the encoder frozen, '
                                         '< num_rounds', fields.at_least(0)),
}, check=_check)


def default_config() -> ml_collections.ConfigDict:
  return CONFIG.config()


def shared_body() -> Server:
  """Every client's encoder becomes the one shared body (uniform mean; over the
  round's participants under partial participation, `ServerInputs.row_valid`)."""
  def apply(state, x: ServerInputs):
    out = {}
    w = None if x.row_valid is None else x.row_valid.astype(jnp.float32)
    for role in x.local:
      out[role], _ = fedsta_math.aggregate(x.prev[role], x.local[role], client_weights=w)
    return out, state, {}

  return Server(init=lambda views: ServerState(), apply=apply)


def build(info: FedInfo, config=None) -> Algorithm:
  """Shared body while task-agnostic; frozen body, local heads at the end."""
  cfg = CONFIG.of(config)
  agnostic = info.num_rounds - cfg.task_specific_rounds

  def trainable(round_idx):
    return {'encoder': jnp.asarray(round_idx) < agnostic}

  return Algorithm(name='fedsta', client=Client(trainable=trainable),
                   server=rules.for_rounds(shared_body(), agnostic),
                   roles={'encoder': 'shared', 'decoder': 'personal', 'head': 'personal'})
