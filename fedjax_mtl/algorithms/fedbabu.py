"""FedBABU: only the body (encoder) is learned and shared; the decoders and heads are
frozen at their initialisation during the communication rounds and fine-tuned
locally at the end.

The last `fedbabu.finetune_rounds` of the run's `num_rounds` rounds are the
fine-tuning: every client trains its whole model on its own data and nothing is
aggregated (FedHCA2 spec §6 recommendation). Frozen parameters get a zero step
size, as a parameter group with learning rate 0 would in PyTorch: the
optimizer's moments still see their gradients.
"""

import jax.numpy as jnp
import ml_collections

from fedjax_mtl import fields
from fedjax_mtl.algorithms import rules
from fedjax_mtl.algorithms.base import Algorithm, Client, FedInfo
from fedjax_mtl.errors import ConfigError


def _check(cfg, config) -> None:
  if not cfg.finetune_rounds < config.num_rounds:
    raise ConfigError(f'fedbabu.finetune_rounds={cfg.finetune_rounds} is out of range; '
                      f'valid range: 0 <= finetune_rounds < num_rounds={config.num_rounds}')


CONFIG = fields.Block('fedbabu', {
    'finetune_rounds': fields.Field(1, 'FedBABU: last rounds of local fine-tuning, < num_rounds',
                                    fields.at_least(0)),
}, check=_check)


def default_config() -> ml_collections.ConfigDict:
  return CONFIG.config()


def build(info: FedInfo, config=None) -> Algorithm:
  """FedAvg of the encoders while the head part is frozen; local fine-tuning at the end."""
  cfg = CONFIG.of(config)
  last_fed_round = info.num_rounds - cfg.finetune_rounds

  def trainable(round_idx):
    tune = jnp.asarray(round_idx) >= last_fed_round
    return {'decoder': tune, 'head': tune}

  return Algorithm(name='fedbabu', client=Client(trainable=trainable),
                   server=rules.for_rounds(rules.mean('uniform', info), last_fed_round),
                   roles={'encoder': 'shared', 'decoder': 'frozen', 'head': 'frozen'})
