"""FedSTA encoder aggregation: pure, jit-compatible JAX functions on stacked pytrees.

What FedSTA is, and where each fact comes from
----------------------------------------------
[H] FedHCA2 supplementary (../shared/seeds/000_*.txt, §C; spec
    ../shared/spec/fedhca2.md §6): FedSTA [17] is one of two "FMTL methods"
    among the baselines; "In the case of FedPer, FedBABU, FedSTA and MaT-FL,
    aggregation is confined to the encoders"; baselines use "the default
    configurations as specified in the original publications or source code".
    No FedSTA formula, hyperparameter or result is given.
[17] The reference list of [H] gives: Sangjoon Park, Gwanghyun Kim, Jeongsol
    Kim, Boah Kim, Jong Chul Ye, "Federated Split Task-Agnostic Vision
    Transformer for COVID-19 CXR Diagnosis", NeurIPS 34:24617-24630, 2021
    (arXiv 2111.01338). The paper names its method FeSTA / FESTA (Federated
    Split Task-Agnostic learning); FedDEA (../shared/seeds/003_*.txt) cites
    the same paper as "FedSTA fedstaNips2021". I found no released code.
[F] From the paper's abstract (stored NeurIPS / arXiv pages): a Vision
    Transformer, decomposed for split learning and combined with federated
    learning, trained with heterogeneous multi-task clients. From the abstract
    of its follow-up p-FeSTA (Park & Ye, 2022): FeSTA uses a CNN
    head and enables multi-task collaboration through the ViT. From the
    paper's method section as I recall it (its full text could not be
    retrieved in this session, so these are unverified): each
    client c has a CNN head H_c and a task-specific tail T_c; ONE body B on the
    server is shared by all clients and all tasks and is trained by split
    learning on the features of every client; heads and tails are averaged
    (FedAvg) among the clients of the same task at fixed intervals; training has
    a task-agnostic stage (B trained) followed by a task-specific stage in which
    B is frozen and only heads and tails are fine-tuned. (A third-party review
    of FeSViBS, MICCAI 2023, also says FeSTA "necessitate[s] pretraining".)

The rule implemented (server side, encoders only)
-------------------------------------------------
Decisions marked [R] are mine.

* [R] The HC-FMTL encoder plays the role of FeSTA's shared body B; the
  decoders and heads play the task-specific head/tail.
* [R] Task-agnostic stage: B is a single model every client uses, so after a
  round all clients get the same encoder,

    theta_i^{new} = sum_j p_j theta_j^{local}   for every i,   sum_j p_j = 1,

  with uniform p_j = 1/N by default. Uniform because in FeSTA every client
  feeds the shared body one batch per split-learning step whatever its data
  size, and FedHCA2's released FedAvg is uniform too. ``client_weights``
  (e.g. data sizes) are an option, not the paper's. Because the weights sum to
  1 this equals sum_j p_j theta_j^{prev} + sum_j p_j (theta_j^{local} -
  theta_j^{prev}), i.e. FedAvg of the updates applied to the shared round-start
  body.
* [R] Task-specific stage (``body_frozen=True``): B is frozen, so the encoders
  are returned unchanged, theta_i^{new} = theta_i^{prev}. Client side for this
  stage: do not update the encoder (zero its gradient / learning rate); only
  decoders and heads train. The stage lengths are not given in [H] and I could
  not verify the paper's, so the round schedule is left to the caller.
* Not done, per [H] ("aggregation is confined to the encoders"): FeSTA's FedAvg
  of heads/tails among same-task clients. Decoders and heads stay local.

Consequence: in the task-agnostic stage this encoder rule coincides with
FedAvg on the encoders (FedPer's encoder rule); FedSTA differs from FedPer only
through the frozen task-specific stage.

Nothing concatenates the leaves into one [N, D] copy: each leaf is reduced by
one [N] x [N, d] contraction (an encoder can be 24 x 27.5M float32 parameters).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fedjax_mtl.algorithms.base import num_rows

PyTree = Any

_HI = jax.lax.Precision.HIGHEST

# FeSTA's encoder rule has no tunable number that [H] or the recalled paper fixes;
# these are the defaults of this module's options (see the module docstring).
DEFAULTS: dict[str, Any] = {
    'client_weights': None,  # None = uniform 1/N (one batch per client per step)
    'body_frozen': False,  # True in the task-specific (fine-tuning) stage
}



def normalized_weights(num_clients: int, client_weights: jax.Array | None = None) -> jax.Array:
  """Aggregation weights p [N] summing to 1: uniform, or client_weights / sum (non-negative)."""
  if client_weights is None:
    return jnp.full((num_clients,), 1.0 / num_clients, jnp.float32)
  w = jnp.asarray(client_weights, jnp.float32)
  if w.shape != (num_clients,):
    raise ValueError(f'fedsta_math: client_weights must have shape ({num_clients},), got {w.shape}')
  return w / jnp.sum(w)


def shared_body(local_stacked: PyTree, weights: jax.Array) -> PyTree:
  """Stacked pytree whose every row is sum_j p_j theta_j (the one shared body), leaf dtypes kept."""
  p = jnp.asarray(weights, jnp.float32)

  def one(x: jax.Array) -> jax.Array:
    # [N] x [N, ...] contraction, then a broadcast back to the client axis.
    mean = jnp.tensordot(p, x.astype(jnp.float32), axes=1, precision=_HI)
    return jnp.broadcast_to(mean, x.shape).astype(x.dtype)

  return jax.tree_util.tree_map(one, local_stacked)


def aggregate(
    prev_stacked: PyTree,
    local_stacked: PyTree,
    *,
    client_weights: jax.Array | None = DEFAULTS['client_weights'],
    body_frozen: bool = DEFAULTS['body_frozen'],
) -> tuple[PyTree, dict[str, jax.Array]]:
  """FedSTA server rule on encoders: (new per-client encoders [N, ...], {'weights': p})."""
  n = num_rows(local_stacked)
  if jax.tree_util.tree_structure(prev_stacked) != jax.tree_util.tree_structure(local_stacked):
    raise ValueError('fedsta_math: prev_stacked and local_stacked differ in structure')
  p = normalized_weights(n, client_weights)
  # body_frozen is a Python bool (static under jit): the two stages are
  # different programs, and a traced select would read both full encoders.
  if body_frozen:
    return prev_stacked, {'weights': p}
  return shared_body(local_stacked, p), {'weights': p}


__all__ = [
    'DEFAULTS',
    'aggregate',
    'normalized_weights',
    'shared_body',
]
