"""Frozen zero-shot classification heads of a CLIP model (NTKFedAvg spec §1.3).

A head is built once from the text tower (``scripts/zeroshot_heads.py``): for
each class, every prompt template of the task
(:mod:`fedjax_mtl.data.zeroshot_templates`) is embedded and L2-normalised, the
embeddings are averaged, and the mean is L2-normalised again
(:func:`class_weights`). The heads file is one ``.npz``::

  {task}/weight   [E, C] float32   column c: the unit class embedding of class c
  logit_scale     []     float32   CLIP's learned log temperature (not exponentiated)
  model, pretrained  []  str       which OpenCLIP model the heads come from (optional)

Logits are ``exp(logit_scale) * normalize(z) @ W`` for an image embedding ``z``
(:func:`zeroshot_logits`), as in the task-vectors code's
``ClassificationHead(normalize=True)`` whose weights are
``exp(logit_scale) * W.T`` (``load_heads(..., scaled=True)`` returns that scaled
``W``). The head has no bias and stays frozen.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl.errors import ConfigError
from fedjax_mtl.models.convert_vit import save_npz

LOGIT_SCALE = 'logit_scale'


def _unit(x: np.ndarray, axis: int = -1) -> np.ndarray:
  return x / np.linalg.norm(x, axis=axis, keepdims=True)


def class_weights(encode_text: Callable[[list[str]], np.ndarray], classnames: Sequence[str],
                  templates: Sequence[str]) -> np.ndarray:
  """[E, C] head: per class the renormalised mean of the unit embeddings of its prompts.

  ``encode_text`` maps a list of prompts to their embeddings [n, E];
  ``templates`` are ``str.format`` patterns with one ``{}``.
  """
  columns = []
  for name in classnames:
    emb = _unit(np.asarray(encode_text([t.format(name) for t in templates]), np.float64))
    columns.append(_unit(emb.mean(0)))
  return np.stack(columns, axis=1).astype(np.float32)


def _task_keys(files: Iterable[str]) -> dict[str, str]:
  """Lower-cased task name -> task name as stored (``{task}/weight`` keys)."""
  return {k[:-len('/weight')].lower(): k[:-len('/weight')] for k in files if k.endswith('/weight')}


def load_heads(path: str | os.PathLike, tasks: Sequence[str] | None = None, *,
               scaled: bool = False) -> dict[str, np.ndarray]:
  """``{task: W [E, C] float32}`` from a heads ``.npz`` (all its tasks when ``tasks`` is None).

  Task names match case-insensitively (``'eurosat'`` finds ``EuroSAT``); the
  result is keyed by the names asked for. ``scaled=True`` multiplies every
  head by ``exp(logit_scale)``.
  """
  path = os.fspath(path)
  if not os.path.exists(path):
    raise ConfigError(f'zero-shot heads file {path!r} does not exist')
  with np.load(path, allow_pickle=False) as f:
    stored = _task_keys(f.files)
    names = list(stored.values()) if tasks is None else list(tasks)
    missing = [t for t in names if t.lower() not in stored]
    if missing:
      raise ConfigError(f'zero-shot heads file {path!r} has no head for {", ".join(missing)}; '
                        f'it holds: {", ".join(sorted(stored.values())) or "none"}')
    if scaled and LOGIT_SCALE not in f.files:
      raise ConfigError(f'zero-shot heads file {path!r} has no {LOGIT_SCALE!r}')
    scale = float(np.exp(f[LOGIT_SCALE])) if scaled else 1.0
    heads = {}
    for t in names:
      w = np.asarray(f[stored[t.lower()] + '/weight'], np.float32)
      if w.ndim != 2:
        raise ConfigError(f'zero-shot head {t!r} in {path!r} has shape {w.shape}; expected [E, C]')
      heads[t] = w * np.float32(scale)
  return heads


def load_logit_scale(path: str | os.PathLike) -> float:
  """The stored ``logit_scale`` (log temperature) of a heads ``.npz``."""
  with np.load(os.fspath(path), allow_pickle=False) as f:
    if LOGIT_SCALE not in f.files:
      raise ConfigError(f'zero-shot heads file {os.fspath(path)!r} has no {LOGIT_SCALE!r}')
    return float(f[LOGIT_SCALE])


def save_heads(path: str | os.PathLike, heads: Mapping[str, np.ndarray], logit_scale: float, *,
               model: str = '', pretrained: str = '') -> None:
  """Write ``{task: W [E, C]}``, ``logit_scale`` and the provenance strings as a heads ``.npz``."""
  arrays: dict[str, np.ndarray] = {}
  for task, w in heads.items():
    if np.ndim(w) != 2:
      raise ConfigError(f'zero-shot head {task!r} has shape {np.shape(w)}; expected [E, C]')
    arrays[f'{task}/weight'] = np.asarray(w, np.float32)
  arrays[LOGIT_SCALE] = np.asarray(logit_scale, np.float32)
  arrays['model'], arrays['pretrained'] = np.asarray(model), np.asarray(pretrained)
  save_npz(arrays, path)


def zeroshot_logits(features: jax.Array, weight: jax.Array, logit_scale: float | None = None
                    ) -> jax.Array:
  """``exp(logit_scale) * normalize(features) @ weight`` ([B, E] x [E, C] -> [B, C]).

  ``logit_scale=None``: no temperature (``weight`` already scaled, or cosine
  similarities wanted).
  """
  z = features / jnp.linalg.norm(features, axis=-1, keepdims=True)
  logits = z @ weight.astype(z.dtype)
  return logits if logit_scale is None else jnp.exp(logit_scale) * logits


__all__ = ['class_weights', 'load_heads', 'save_heads', 'load_logit_scale', 'zeroshot_logits',
           'LOGIT_SCALE']
