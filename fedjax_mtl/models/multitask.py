"""Per-client multi-task network: shared encoder, one decoder + head per task slot.

Decoders are identical across slots and are applied with `nn.vmap`, so their
parameters are natively stacked `[slots, ...]` (one batched matmul instead of
one per task). Heads differ per slot only in output channels (padded to the
largest task that slot can hold within a client group).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_mtl.models.decoder import Decoder, Head

# `model.decoder`: FedHCA2's decoder + head per task slot (`MultiTaskNet`), or a
# DeepLab-v3 head per slot on the encoder's last stage (`deeplab.DeepLabNet`).
DECODERS = ('hca2', 'deeplab')


class MultiTaskNet(nn.Module):
  """Encoder -> vmapped decoders over task slots -> per-slot heads."""
  encoder: Any
  head_channels: tuple[int, ...]  # per task slot
  train: bool = False
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> list[jax.Array]:
    """Returns one [B, H, W, head_channels[s]] float32 output per task slot."""
    feats = self.encoder(x, train=self.train)
    dim = self.encoder.dims[0]
    decoders = nn.vmap(
        Decoder, in_axes=None, out_axes=0,
        variable_axes={'params': 0, 'batch_stats': 0},
        split_rngs={'params': True}, axis_size=len(self.head_channels))
    z = decoders(dim, train=self.train, dtype=self.dtype, name='decoders')(feats)
    return [Head(dim, c, self.dtype, name=f'head_{s}')(z[s])
            for s, c in enumerate(self.head_channels)]


def param_roles(params: dict) -> dict:
  """The role of every parameter leaf (a label tree, as `optax.multi_transform` takes):
  'encoder', 'decoder' (the task decoders) or 'head' (the per-slot heads)."""
  role = {'encoder': 'encoder', 'decoders': 'decoder'}
  out = {}
  for k, sub in params.items():
    r = role.get(k, 'head' if k.startswith('head_') else None)
    if r is None:
      raise ValueError(f'parameter {k!r} has no role; known: encoder, decoders, head_<slot>')
    out[k] = jax.tree.map(lambda _, r=r: r, sub)
  return out
