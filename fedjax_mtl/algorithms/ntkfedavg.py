"""NTKFedAvg: clients train the NTK-linearised model; the server averages task vectors.

NTKFedAvg spec §2 (Algorithm 1), in the many-task setting (the CLIP 8-task
benchmark B) and in the dense engine (MaT-FL's benchmark A):

- **Client**: the model's forward is replaced by its linearisation around the
  round's start c (the server model, spec §2.3's default point):
  f_lin(x; θ) = f(x; c) + J_c(x)(θ − c), one `jax.jvp` per step
  (`base.linearized_forward`); training starts at c. Everything else is the
  FedAvg client: NTKFedAvg and FedAvg differ only in this forward
  (`ntkfedavg.linearize=False` is FedAvg with this server).
- **Server**: the uniform mean of the task vectors τ_k = θ_k − c over the
  round's (client, task) pairs (Alg. 1 line 12: 1/K, not weighted by data),
  with the task vectors of the clients in `ntkfedavg.negate` negated
  (federated unlearning, lines 8–10), and the server step α
  (`ntkfedavg.server_lr`): θ ← c + α·τ̄.

Evaluation tools (spec §2.4, §2.6): `linear_outputs` (from `base`) is the linear
model the task vectors were trained in, evaluated at the new server model
(evaluation B; a many-task run logs it as `accuracy_linear` at every evaluation);
`alpha_sweep` gives that model's outputs for a whole grid of server steps α
from one `jax.linearize` per batch (the A.3 server-α tuning): along the line
c + α·τ̄ the linear model is z0 + α·J_c τ̄, so the grid costs one forward and
one JVP, not a forward per α.

`ntkfedavg.point='pretrained'` linearises around the run's initial model θ_0
every round (`Client.linearize_at='origin'`), the ablation of spec §2.3.

In-run server-α tuning (A.3, many-task setting, `ntkfedavg.tune_alpha`): the
server holds out `val_fraction` (at most `val_max`) of each task's training set;
after each round, whose server step is α = 1, `manytask.engine.make_alpha_tuner`
scores the linear model at c + α·τ̄ for the whole grid (`alpha_grid`) with one
`alpha_sweep` per validation batch, and the round keeps the α of the best mean
accuracy (`manytask.run.tune_alpha`; logged as `alpha`).

The dense setting (benchmark A) runs the same client and server in the dense
engine: the linearised forward with batch norm in inference mode
(`Client.frozen_stats`), heads frozen (`freeze_heads`), only the encoder shared,
and its FedAvg (`linearize=False`) averaging the encoder's batch-norm statistics
(`Algorithm.average_stats`). `mu` > 0 adds FedProx's proximal term (NTKFedProx).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_mtl import fields
from fedjax_mtl.algorithms.base import (Algorithm, Client, FedInfo, PyTree, Server,
                                        ServerInputs, ServerState, broadcast_rows, is_head_key,
                                        linear_outputs, linearized_forward, tree_mean)
from fedjax_mtl.algorithms import fedprox
from fedjax_mtl.algorithms.plugin_math import add_scaled
from fedjax_mtl.errors import ConfigError

POINTS = ('server', 'pretrained')

# α = 1 (spec §4), no client negated, the linearised forward on, linearised around the
# server model of the round (`point='server'`; 'pretrained': around the run's initial
# model θ_0 every round, the Fig. 5 ablation).
CONFIG = fields.Block('ntkfedavg', {
    'server_lr': fields.Field(1.0, 'NTKFedAvg: server step α on the mean task vector',
                              fields.above(0)),
    'negate': fields.Field('', 'NTKFedAvg: clients whose task vectors are negated (federated '
                           "unlearning), comma-separated ids ('' = none)"),
    'linearize': fields.Field(True, 'NTKFedAvg: clients train the NTK-linearised model (False: '
                              'the plain forward, FedAvg with this server)'),
    'point': fields.Field('server', "NTKFedAvg: linearisation point: server (the round's server "
                          'model) or pretrained (the initial model, every round)',
                          choices=POINTS),
    'freeze_heads': fields.Field(True, 'NTKFedAvg, dense setting: the linearised clients keep '
                                 "their heads at their initial values (the paper's frozen "
                                 'decoder); False trains them'),
    'mu': fields.Field(0.0, 'NTKFedAvg: proximal coefficient μ of μ/2 ‖θ − θ_start‖² on the '
                       'shared parameters (1: NTKFedProx; with linearize=false, FedProx)',
                       fields.at_least(0)),
    'tune_alpha': fields.Field(False, 'NTKFedAvg, many-task setting: choose the server step α '
                               'every round on a server-held validation split (spec A.3)'),
    'alpha_grid': fields.Field('', "NTKFedAvg α tuning: comma-separated α values ('' = 0.25, "
                               '0.5, ..., number of clients)'),
    'val_fraction': fields.Field(0.1, "NTKFedAvg α tuning: fraction of each task's training "
                                 'examples the server holds out', fields.above(0)),
    'val_max': fields.Field(5000, 'NTKFedAvg α tuning: at most this many held-out examples per '
                            'task', fields.at_least(1)),
})


def default_config() -> ml_collections.ConfigDict:
  return CONFIG.config()


def alpha_grid(cfg, num_clients: int) -> np.ndarray:
  """The server-α grid of the in-run tuning (spec A.3, A10): `ntkfedavg.alpha_grid`
  ('0.5,1,2'), or 0.25, 0.5, ..., K for K clients when empty; ConfigError for an entry
  that is not a number > 0."""
  text = str(cfg.alpha_grid or '').strip()
  if not text:
    return np.arange(1, 4 * num_clients + 1, dtype=np.float32) / 4
  vals = []
  for item in filter(None, (x.strip() for x in text.split(','))):
    try:
      v = float(item)
    except ValueError:
      v = float('nan')
    if not v > 0:
      raise ConfigError(f'ntkfedavg.alpha_grid entry {item!r} is not a number > 0; e.g. '
                        "'0.5,1,2'")
    vals.append(v)
  return np.asarray(vals, np.float32)


def negated_clients(cfg) -> tuple[int, ...]:
  """`ntkfedavg.negate` ('3,7') as client ids; ConfigError for a malformed entry."""
  ids = []
  for item in filter(None, (x.strip() for x in str(cfg.negate).split(','))):
    if not item.isdigit():
      raise ConfigError(f'ntkfedavg.negate entry {item!r} is not a client id; expected '
                        "comma-separated integers >= 0, e.g. '0,3'")
    ids.append(int(item))
  return tuple(sorted(set(ids)))


def server(alpha: float, negate: tuple[int, ...]) -> Server:
  """θ ← c + α · mean over the valid rows of s_k (θ_k − c), s_k = −1 for `negate`."""
  neg = jnp.asarray(negate or (-2,), jnp.int32)

  def apply(state: ServerState, x: ServerInputs):
    n = x.num_examples.shape[0]
    valid = jnp.ones(n, bool) if x.row_valid is None else x.row_valid
    sign = jnp.where(jnp.isin(x.client_ids, neg), -1., 1.)
    w = jnp.where(valid, sign, 0.) / jnp.maximum(jnp.sum(valid), 1)
    out = {}
    for role, local in x.local.items():
      deltas = jax.tree.map(jnp.subtract, local, x.prev[role])
      start = jax.tree.map(lambda p: p[0], x.prev[role])  # every row starts from c
      out[role] = broadcast_rows(add_scaled(start, tree_mean(deltas, w), alpha), local)
    return out, state, {'ntk_negated_rows': jnp.sum(valid & (sign < 0))}

  return Server(init=lambda views: ServerState(), apply=apply)


def alpha_sweep(apply: Callable, c: PyTree, tau: PyTree, x: jax.Array, alphas: jax.Array,
                head: Callable | None = None) -> jax.Array:
  """The linear model's outputs at c + α·τ for every α of `alphas` [A]: [A, ...].

  One `jax.linearize` of `apply(·, x)` at c (a forward) and one JVP of τ give
  z0 and J_c τ; the outputs along the line are z0 + α·J_c τ, and a frozen
  non-linear `head` (e.g. CLIP's normalised zero-shot classifier) is applied
  per α to those. Equals `linear_outputs(apply, c, c + α·τ, x)` for each α."""
  z0, jvp = jax.linearize(lambda p: apply(p, x), c)
  dz = jvp(tau)
  alphas = jnp.asarray(alphas, z0.dtype)
  z = z0[None] + alphas.reshape((-1,) + (1,) * z0.ndim) * dz[None]
  return z if head is None else jax.vmap(head)(z)


def build(info: FedInfo, config=None) -> Algorithm:
  cfg = CONFIG.of(config)
  dense = info.num_tasks <= 0
  point = str(cfg.point)
  if dense and point != 'server':
    raise ConfigError(f"ntkfedavg.point={point!r} runs in the many-task setting only; the "
                      "dense setting linearises around the server model (point='server')")
  negate = negated_clients(cfg)
  if dense and negate and max(negate) >= info.num_clients:
    raise ConfigError(f'ntkfedavg.negate names client {max(negate)}, but the scenario has '
                      f'{info.num_clients} clients (ids 0..{info.num_clients - 1})')
  if dense:  # MaT-FL: only the backbone is aggregated; each client keeps its decoder
    roles = {'encoder': 'shared', 'decoder': 'personal',
             'head': 'frozen' if cfg.linearize and cfg.freeze_heads else 'personal'}
  else:
    roles = {'encoder': 'shared', 'decoder': 'shared', 'head': 'personal'}
  # NTKFedProx (spec §2.3, μ = 1): FedProx's proximal term on the shared parameters.
  loss = (fedprox.proximal_loss(float(cfg.mu), tuple(r for r, k in roles.items()
                                                     if k == 'shared'))
          if float(cfg.mu) > 0 else None)
  kept = {}
  if dense:  # the client part keeps the round's point for evaluation B (spec §2.4)
    backbone = lambda p: {k: v for k, v in p.items() if not is_head_key(k)}
    kept = dict(init=lambda params: {'point': backbone(params)},
                finalize=lambda params, start, state: (params, {'point': backbone(start)}))
  client = (Client(forward=linearized_forward, frozen_stats=dense, loss=loss,
                   linearize_at='origin' if point == 'pretrained' else 'start', **kept)
            if cfg.linearize else Client(loss=loss))
  return Algorithm(name='ntkfedavg', client=client,
                   server=server(float(cfg.server_lr), negate), roles=roles,
                   average_stats=dense and not cfg.linearize)
