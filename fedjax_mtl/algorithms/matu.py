"""MaTU: unified task vectors with per-task masks and rescalers, a stateless server.

Runs in the many-task setting (`configs/matu.py`; spec matu.md §2), where every
row of the server's views is one (client, task) pair of the round:

- **Client** (§2.2): each pair trains from the task model its client recovered
  last round (the engine keeps that recovered adapter per pair, so it is the
  client's own state; a client never sampled before starts from θ_p). After
  training, each client unifies the task vectors τ_n^t = adapters − θ_p of its
  tasks into τ_n (Eq. 2, EMR-Merging's tie rule: a zero sum counts as −1), with
  binary masks m_n^t = (τ_n^t ⊙ τ_n > 0) and rescalers λ_n^t; it uploads τ_n,
  the bit-packed masks, the scalars and |D_n^t|. All clients of the round do
  this in one program, segmented by `ServerInputs.row_client`.
- **Server** (§2.3–2.4, `matu_math.server`): a pure function of the round's
  uploads. Per task the soft sign-agreement mask m̂^t (ρ), the same-task average
  τ̂^t over the reconstructions m_n^t ⊙ τ_n weighted by γ_n^t λ_n^t, the sign
  similarity S of all tasks (one matmul), the similar tasks Z^t (S > ε, top κ,
  t itself excluded), the cross-task vector, the combination (`combine='sum'`,
  Eq. 7 as printed; `'avg'`, the Overview's "averaging"), then per client the
  unified vector, masks and rescalers sent back. It keeps nothing between rounds:
  `ServerState()` in, `ServerState()` out.
- **Recovery**: each pair starts the next round from θ_p + λ_n^t m_n^t ⊙ τ_n.
  Pairs of clients not sampled keep what they had (spec §7 item 4).

Task vectors are the flattened LoRA factors (A and B of every adapted layer)
minus their shared initialisation (spec §7 item 6, factor space). Heads are not
part of τ: the many-task engine averages them per task (spec §7 item 7).
Fig. 6b's variants: `cross='none'` (no cross-task vector) and `'uniform'` (every
task of the round weighted 1/|T_r|).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_mtl import fields
from fedjax_mtl.algorithms import matu_math as mm
from fedjax_mtl.algorithms.base import (Algorithm, Client, FedInfo, Server, ServerInputs,
                                        ServerState)
from fedjax_mtl.errors import ConfigError

# ρ and ε of the paper; κ = 3 for 8 tasks (5 for 30, spec §4); Eq. 7 as printed.
CONFIG = fields.Block('matu', {
    'rho': fields.Field(0.4, 'MaTU: sign-agreement threshold ρ of the soft task mask (Eq. 3)',
                        fields.unit(True)),
    'eps': fields.Field(0.5, 'MaTU: similarity threshold ε of the similar-task sets (the sign '
                        'similarity lies in [0, 1])', fields.unit(True)),
    'kappa': fields.Field(3, "MaTU: at most κ similar tasks per task (3 for 8 tasks, 5 for 30; "
                          "matu.cross='none' turns the cross-task vector off)",
                          fields.at_least(1)),
    'combine': fields.Field('sum', "MaTU: same-task + cross-task vector: 'sum' (Eq. 7 as "
                            "printed) or 'avg' (the paper's Overview: their average)",
                            choices=mm.COMBINES),
    'cross': fields.Field('similarity', "MaTU cross-task aggregation: 'similarity' (Eq. 6), "
                          "'none' or 'uniform' (Fig. 6b's variants)", choices=mm.CROSS),
    'tie': fields.Field('emr', "MaTU unification of a zero sign sum: 'emr' (-1, EMR-Merging's "
                        "code) or 'zero' (sgn(0) = 0)", choices=mm.TIES),
})


def default_config() -> ml_collections.ConfigDict:
  return CONFIG.config()


def _flatten(view: dict) -> tuple[jax.Array, list]:
  """[S, d] rows of every leaf of every role (roles sorted), and how to split them back."""
  parts, spec = [], []
  for role in sorted(view):
    leaves, treedef = jax.tree.flatten(view[role])
    spec.append((role, treedef, [x.shape[1:] for x in leaves], [x.dtype for x in leaves]))
    parts += [x.reshape(x.shape[0], -1).astype(jnp.float32) for x in leaves]
  return jnp.concatenate(parts, axis=1), spec


def _unflatten(rows: jax.Array, spec: list) -> dict:
  out, lo = {}, 0
  for role, treedef, shapes, dtypes in spec:
    leaves = []
    for shape, dtype in zip(shapes, dtypes):
      n = int(np.prod(shape))
      leaves.append(rows[:, lo:lo + n].reshape((rows.shape[0],) + shape).astype(dtype))
      lo += n
    out[role] = jax.tree.unflatten(treedef, leaves)
  return out


def server(cfg, num_tasks: int) -> Server:
  """The MaTU round over every shared role: client unification and upload, the
  stateless server, recovery (module docstring)."""
  kw = dict(rho=float(cfg.rho), eps=float(cfg.eps), kappa=int(cfg.kappa), cross=cfg.cross,
            combine=cfg.combine)

  def apply(state: ServerState, x: ServerInputs):
    if x.row_client is None or x.row_task is None or x.origin is None:
      raise ValueError('MaTU needs the many-task round (row_client, row_task, origin)')
    local, spec = _flatten(x.local)
    origin, _ = _flatten(jax.tree.map(lambda v: v[None], x.origin))
    valid = (jnp.ones(local.shape[0], bool) if x.row_valid is None else x.row_valid)
    # τ = local − origin, block by block inside the round (no [S, d] temporary).
    cols = lambda v, start, w: jax.lax.dynamic_slice_in_dim(v, start, w, axis=1)
    recovered, logs = mm.round_blocks(
        (local, origin), lambda src, start, w: cols(src[0], start, w) - cols(src[1], start, w),
        local.shape[1], x.row_client, x.row_task, x.num_examples, valid, num_tasks, tie=cfg.tie,
        **kw)
    rows = jnp.where(valid[:, None], origin + recovered, local)
    return _unflatten(rows, spec), state, logs

  return Server(init=lambda views: ServerState(), apply=apply)


def build(info: FedInfo, config=None) -> Algorithm:
  """MaTU (many-task setting only): adapters shared through the MaTU round, heads per
  task (the many-task engine averages them)."""
  cfg = CONFIG.of(config)
  if info.num_tasks <= 0:
    raise ConfigError("algorithm 'matu' runs in the many-task setting only "
                      "(config.setting='many_task', e.g. configs/matu.py)")
  return Algorithm(name='matu', client=Client(), server=server(cfg, info.num_tasks),
                   roles={'encoder': 'shared', 'decoder': 'shared', 'head': 'personal'})
