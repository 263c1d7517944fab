"""The ViT of the many-task setting: a frozen backbone and a trainable pytree.

Params are kept as two trees: the **backbone** (nested, frozen, one copy for
all clients) and the **trainable** flat dict `{'/'-joined path: leaf}` of the
LoRA adapters and the task head. The trainable leaves carry the parameter roles
the algorithms read (`algorithms.base`): the adapters of every block but the
last are `encoder`, those of the last block `decoder`, the head `head`. So
FedAvg/FedProx (`encoder` and `decoder` shared) average every adapter, FedPer
(`decoder` and `head` personal) keeps "the last ViT block and the classifier"
(MaTU spec §3) with each (client, task) pair, Local keeps everything.

Every task's head has `max_classes` outputs; a task with C classes masks the
logits of the others (they get -1e9), so all pairs share one head shape. With
`many.heads` (a CLIP tower and the `.npz` of `scripts/zeroshot_heads.py`), each
task's head is instead its frozen zero-shot classifier on the normalised
embedding (NTKFedAvg spec §1.3): not a parameter, never trained or uploaded.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl.data import image_preprocess
from fedjax_mtl.models import vit, zeroshot

PyTree = Any
MASKED_LOGIT = -1e9


def make_model(cfg, max_classes: int):
  """The ViT `many.model` at `many.resolution` with LoRA on q/v and a `max_classes`
  head, or no head when `many.heads` names frozen zero-shot heads."""
  alpha = float(cfg.lora_alpha) or None
  return vit.get_model(cfg.model, image_size=int(cfg.resolution),
                       num_classes=None if cfg.get('heads', '') else max_classes,
                       lora_rank=int(cfg.lora_rank), lora_alpha=alpha,
                       lora_seed=int(cfg.lora_seed))


def split(params: PyTree) -> tuple[PyTree, dict]:
  """(backbone tree, trainable flat dict) of a full params tree."""
  flat = vit.flatten_params(params)
  labels = vit.flatten_params(vit.param_labels(params))
  train = {k: v for k, v in flat.items() if labels[k] != 'backbone'}
  frozen = vit.unflatten_params({k: v for k, v in flat.items() if labels[k] == 'backbone'})
  return frozen, dict(sorted(train.items()))


def merge(backbone: PyTree, trainable: dict) -> PyTree:
  """The full params tree of `backbone` and a trainable flat dict."""
  return vit.unflatten_params({**vit.flatten_params(backbone), **trainable})


def roles(trainable: dict) -> dict:
  """Role of every trainable leaf: `encoder` (adapters of all blocks but the last),
  `decoder` (the last block's adapters), `head`."""
  def block(path: str) -> int | None:
    return next((b for b in map(vit.block_index, path.split('/')) if b is not None), None)

  last = max((b for b in map(block, trainable) if b is not None), default=-1)

  def role(path: str) -> str:
    if path.startswith(vit.HEAD_NAME + '/'):
      return 'head'
    return 'decoder' if block(path) == last else 'encoder'

  return {k: role(k) for k in trainable}


def checkpoint_norm(model) -> str:
  """The input normalisation of the model family (AugReg ViT: 0.5/0.5; CLIP: CLIP's)."""
  return 'clip' if isinstance(model, vit.CLIPVisionTower) else 'augreg'


def make_forward_parts(model, class_counts: np.ndarray, heads: np.ndarray | None = None):
  """`(inner, finish)` of `make_forward`: `inner(backbone, trainable, images)` is the
  part the trainable leaves act in (the logits of the model's trained head, or the
  embedding under frozen zero-shot `heads`), `finish(out, task)` the frozen rest
  (the zero-shot head on the normalised embedding, the class mask). NTKFedAvg
  linearises `inner` only (spec §1.3: normalisation precedes the text heads)."""
  counts = jnp.asarray(class_counts, jnp.int32)
  norm = checkpoint_norm(model)

  def inner(backbone, trainable, images):
    x = image_preprocess.normalize(images, norm)
    features, logits = model.apply({'params': merge(backbone, trainable)}, x)
    return features if heads is not None else logits

  def finish(out, task):
    logits = out if heads is None else zeroshot.zeroshot_logits(out, jnp.asarray(heads)[task])
    keep = jnp.arange(logits.shape[-1]) < counts[task]
    return jnp.where(keep, logits.astype(jnp.float32), MASKED_LOGIT)

  return inner, finish


def make_forward(model, class_counts: np.ndarray, heads: np.ndarray | None = None):
  """`forward(backbone, trainable, images uint8 [B, R, R, 3], task) -> logits [B, C_max]`
  with the logits past task `task`'s class count masked. `heads` [T, E, C_max]:
  frozen zero-shot heads (already scaled by exp(logit_scale)) on the normalised
  embedding instead of the model's trained head."""
  inner, finish = make_forward_parts(model, class_counts, heads)
  return lambda backbone, trainable, images, task: finish(inner(backbone, trainable, images),
                                                          task)


def nll(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """[B] cross-entropy of each example's integer label (no ignore index: 255 is a
  class of SUN397)."""
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Mean cross-entropy of integer labels."""
  return jnp.mean(nll(logits, labels))
