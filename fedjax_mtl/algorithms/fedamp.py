"""FedAMP: attentive message passing on the encoders and on the decoders.

After each round the server gives client i the cloud model
u_i = Σ_j ξ_ij w_j with ξ_ij = α_k·exp(−‖w_i − w_j‖²/σ)/σ (j ≠ i) and
ξ_ii = 1 − Σ_{j≠i} ξ_ij (`fedamp_math`; encoders over the N clients, decoders
over the K task decoders). Each client keeps training its own model w_i
(nothing overwrites it) with the proximal term λ/(2α_k)·‖w_i − u_i‖². u starts
as the initial model, as in PFLlib. λ = 1, α_k = 1, σ = 1 (FedHCA2 spec §6).
The proximal term is the paper's squared distance with its gradient; PFLlib's
client adds 0.5·λ/α_k·‖w − u‖ (not squared) on detached copies, which leaves
training unchanged.
The cloud models are per-row server state: they live with their clients'
groups, sharded like the parameters.
"""

import jax
import ml_collections

from fedjax_mtl import fields
from fedjax_mtl.algorithms import fedamp_math as fm
from fedjax_mtl.algorithms.base import (Algorithm, Client, ClientCtx, FedInfo, Server,
                                        ServerInputs, ServerState, keep_rows, role_view,
                                        sq_dist_trees)

CONFIG = fields.Block('fedamp', {
    'lam': fields.Field(1.0, 'FedAMP proximal coefficient λ', fields.at_least(0)),
    'alpha_k': fields.Field(1.0, 'FedAMP step α_k of the cloud models', fields.above(0)),
    'sigma': fields.Field(1.0, 'FedAMP similarity scale σ', fields.above(0)),
})


def default_config() -> ml_collections.ConfigDict:
  return CONFIG.config()


def cloud_models(alpha_k: float, sigma: float, info: FedInfo | None = None) -> Server:
  """Uploads stay the clients' models; per-row state 'center' becomes u. With partial
  participation (`ServerInputs.row_valid`, needs `info`) u mixes the participants'
  models, and a non-participant keeps its u."""
  def init(views):
    return ServerState(rows={r: {'center': v} for r, v in views.items()})

  def apply(state, x: ServerInputs):
    rows, logs = {}, {}
    for role, local in x.local.items():
      valid = (None if x.row_valid is None
               else x.row_valid[jax.numpy.asarray(info.row_client(role))])
      u, aux = fm.cloud_models(local, alpha_k, sigma, valid)
      if valid is not None:  # a client that sat the round out keeps its u
        u = keep_rows(u, state.rows[role]['center'], valid)
      rows[role] = {'center': u}
      logs[f'fedamp_{role}_self_weight'] = jax.numpy.diagonal(aux['weights'])
    return dict(x.local), state._replace(rows=rows), logs

  return Server(init=init, apply=apply)


def build(info: FedInfo, config=None) -> Algorithm:
  """Cloud models on the server, the proximal pull to them on the client."""
  cfg = CONFIG.of(config)
  coef = 0.5 * cfg.lam / cfg.alpha_k
  shared = ('encoder', 'decoder')

  def loss(ctx: ClientCtx):
    return coef * sum(
        sq_dist_trees(role_view(ctx.params, ctx.labels, r), ctx.server_rows[r]['center'])
        for r in shared)

  return Algorithm(name='fedamp', client=Client(loss=loss),
                   server=cloud_models(cfg.alpha_k, cfg.sigma, info),
                   roles={'encoder': 'shared', 'decoder': 'shared', 'head': 'personal'})
