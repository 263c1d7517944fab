"""The aggregation plug-in interface: pure functions over stacked pytrees.

A rule sees the encoders of all N clients stacked `[N, ...]` and the decoders
of all K task decoders stacked `[K, ...]`, both before (`*_prev`, last round's
post-aggregation personalised params) and after local training (`*_local`),
and returns the new personalised encoders and decoders plus its next state and
logs. Its state is a pytree kept in the federation state (so it is
checkpointed); logs are small arrays written to metrics.jsonl.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

PyTree = Any


@dataclasses.dataclass(frozen=True)
class AggInfo:
  """Static facts a rule may use: sizes, ownership and grouping of models."""
  num_clients: int
  num_decoders: int
  decoder_client: tuple[int, ...]  # owner client of each decoder
  decoder_names: tuple[str, ...]
  client_names: tuple[str, ...]
  homo_groups: tuple[int, ...]  # same-dataset-same-tasks runs of clients


class AggInputs(NamedTuple):
  enc_prev: PyTree
  enc_local: PyTree
  dec_prev: PyTree
  dec_local: PyTree
  round: jax.Array  # 0-based index of the round being aggregated


class Aggregator(NamedTuple):
  """`init(enc, dec) -> state`; `apply(state, inputs) -> (enc, dec, state, logs)`."""
  init: Callable[[PyTree, PyTree], PyTree]
  apply: Callable[[PyTree, AggInputs], tuple[PyTree, PyTree, PyTree, dict]]


def tree_mean_broadcast(stacked: PyTree) -> PyTree:
  """Uniform mean over the leading axis, broadcast back to every row.

  Computed as a `[N] @ [N, d]` contraction: XLA:CPU's reduction over a leading
  axis is several times slower at model scale.
  """
  def one(x):
    n = x.shape[0]
    w = jnp.full((n,), 1.0 / n, jnp.float32)
    mean = jnp.tensordot(w, x.astype(jnp.float32), axes=1,
                         precision=jax.lax.Precision.HIGHEST)
    return jnp.broadcast_to(mean, x.shape).astype(x.dtype)
  return jax.tree.map(one, stacked)
