"""Convert PyTorch Swin checkpoints to/from :class:`~fedjax_mtl.models.swin.SwinTransformer` params.

Supported PyTorch namings (``source``):

* ``"mmseg"``: mmsegmentation Swin, e.g. the UperNet-ADE20K checkpoints FedHCA2
  uses (``backbone.stages.0.blocks.0.attn.w_msa.qkv.weight``, ...). Patch
  merging weights are already in ``nn.Unfold`` order, the model's native order.
* ``"swin"``: original Microsoft Swin / timm < 0.9 / Swin-Transformer-Semantic-
  Segmentation (``layers.{i}.blocks...``, ``attn.qkv``, ``mlp.fc1``,
  ``patch_embed.proj``, ``layers.{i}.downsample`` at the *end* of stage i).
* ``"timm"``: timm >= 0.9 (same names, but ``layers.{i+1}.downsample`` at the
  *start* of the next stage).

For ``swin``/``timm`` the patch-merging ``norm``/``reduction`` weights are in the
x0..x3 concat order ((0,0), (1,0), (0,1), (1,1) neighbours) and are reordered to
the Unfold order (``c*4 + ki*2 + kj``). A classification checkpoint's final
``norm`` becomes ``norm{last}``; its ``head`` is ignored. Buffers
(``relative_position_index``, ``attn_mask``) are skipped.

Returned params are the ``'params'`` collection as a nested dict of float32
NumPy arrays: use ``model.apply({'params': params}, x, train=False)``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from fedjax_mtl.models import swin as swin_lib

Params = dict[str, Any]
SOURCES = ('mmseg', 'swin', 'timm')

# Patch-merging neighbour order: Unfold slot p = ki*2 + kj holds concat block
# _CONCAT_OF_UNFOLD[p] (concat order is (0,0), (1,0), (0,1), (1,1)). It is an
# involution, so the same permutation maps both ways.
_CONCAT_OF_UNFOLD = np.array([0, 2, 1, 3])
_SKIP_SUFFIXES = ('relative_position_index', 'attn_mask')
_MAX_LISTED = 8


# ---------------------------------------------------------------------------
# Flax path <-> mmseg name
# ---------------------------------------------------------------------------


def _flax_path_to_mmseg(path: tuple[str, ...], ndim: int) -> tuple[str, str]:
  """Map a flax param path to (mmseg name, kind); kind in linear/conv/id."""
  parts: list[str] = []
  for i, p in enumerate(path[:-1]):
    m = re.fullmatch(r'(stages|blocks)_(\d+)', p)
    if m:
      parts.append(f'{m[1]}.{m[2]}')
    elif p == 'attn':
      parts.append('attn.w_msa')
    elif p == 'mlp':
      continue
    elif p == 'fc1':
      parts.append('ffn.layers.0.0')
    elif p == 'fc2':
      parts.append('ffn.layers.1')
    elif p == 'proj' and i > 0 and path[i - 1] == 'patch_embed':
      parts.append('projection')
    else:
      parts.append(p)
  leaf = path[-1]
  kind = 'id'
  if leaf == 'kernel':
    kind = 'conv' if ndim == 4 else 'linear'
  parts.append('weight' if leaf in ('kernel', 'scale') else leaf)
  return '.'.join(parts), kind


def _to_torch_layout(x: np.ndarray, kind: str) -> np.ndarray:
  if kind == 'linear':
    return x.T
  if kind == 'conv':
    return x.transpose(3, 2, 0, 1)  # HWIO -> OIHW
  return x


def _from_torch_layout(x: np.ndarray, kind: str) -> np.ndarray:
  if kind == 'linear':
    return x.T
  if kind == 'conv':
    return x.transpose(2, 3, 1, 0)  # OIHW -> HWIO
  return x


def _torch_shape(shape: tuple[int, ...], kind: str) -> tuple[int, ...]:
  if kind == 'linear':
    return shape[::-1]
  if kind == 'conv':
    return (shape[3], shape[2], shape[0], shape[1])
  return tuple(shape)


def flatten_tree(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
  out: dict[tuple[str, ...], Any] = {}
  for k, v in tree.items():
    if isinstance(v, Mapping):
      out.update(flatten_tree(v, prefix + (k,)))
    else:
      out[prefix + (k,)] = v
  return out


def unflatten_tree(flat: Mapping[tuple[str, ...], Any]) -> Params:
  out: Params = {}
  for path, v in flat.items():
    node = out
    for p in path[:-1]:
      node = node.setdefault(p, {})
    node[path[-1]] = v
  return out


# ---------------------------------------------------------------------------
# mmseg name <-> original Swin / timm name
# ---------------------------------------------------------------------------

_BLOCK_RENAMES = (  # (mmseg suffix, swin/timm suffix) inside a block
  ('attn.w_msa.relative_position_bias_table', 'attn.relative_position_bias_table'),
  ('attn.w_msa.qkv.', 'attn.qkv.'),
  ('attn.w_msa.proj.', 'attn.proj.'),
  ('ffn.layers.0.0.', 'mlp.fc1.'),
  ('ffn.layers.1.', 'mlp.fc2.'),
)


def _mmseg_to_swin_name(name: str, layout: str) -> str:
  m = re.fullmatch(r'stages\.(\d+)\.downsample\.(.+)', name)
  if m:
    i = int(m[1]) + (1 if layout == 'timm' else 0)
    return f'layers.{i}.downsample.{m[2]}'
  m = re.fullmatch(r'stages\.(\d+)\.blocks\.(\d+)\.(.+)', name)
  if m:
    rest = m[3]
    for a, b in _BLOCK_RENAMES:
      if rest.startswith(a):
        rest = b + rest[len(a):]
        break
    return f'layers.{m[1]}.blocks.{m[2]}.{rest}'
  if name.startswith('patch_embed.projection.'):
    return 'patch_embed.proj.' + name[len('patch_embed.projection.'):]
  return name


def _swin_to_mmseg_name(name: str, layout: str) -> str:
  m = re.fullmatch(r'layers\.(\d+)\.downsample\.(.+)', name)
  if m:
    i = int(m[1]) - (1 if layout == 'timm' else 0)
    return f'stages.{i}.downsample.{m[2]}'
  m = re.fullmatch(r'layers\.(\d+)\.blocks\.(\d+)\.(.+)', name)
  if m:
    rest = m[3]
    for a, b in _BLOCK_RENAMES:
      if rest.startswith(b):
        rest = a + rest[len(b):]
        break
    return f'stages.{m[1]}.blocks.{m[2]}.{rest}'
  if name.startswith('patch_embed.proj.'):
    return 'patch_embed.projection.' + name[len('patch_embed.proj.'):]
  return name


def _is_merge_param(mmseg_name: str) -> bool:
  pattern = r'stages\.\d+\.downsample\.(norm\.(weight|bias)|reduction\.weight)'
  return re.fullmatch(pattern, mmseg_name) is not None


def _reorder_merge(x: np.ndarray, to_unfold: bool) -> np.ndarray:
  """Permute the 4C axis (last) between concat order and Unfold order."""
  lead, four_c = x.shape[:-1], x.shape[-1]
  c = four_c // 4
  if to_unfold:  # [k, c] blocks (k in concat order) -> [c, p] (p in Unfold order)
    y = x.reshape(*lead, 4, c)[..., _CONCAT_OF_UNFOLD, :]
    return np.swapaxes(y, -1, -2).reshape(x.shape)
  y = np.swapaxes(x.reshape(*lead, c, 4), -1, -2)  # -> [p, c]
  return y[..., _CONCAT_OF_UNFOLD, :].reshape(x.shape)


def unfold_to_concat_order(x: np.ndarray) -> np.ndarray:
  """Reorder a patch-merging tensor's last (4C) axis from Unfold to x0..x3 concat order."""
  return _reorder_merge(np.asarray(x), to_unfold=False)


def concat_to_unfold_order(x: np.ndarray) -> np.ndarray:
  """Reorder a patch-merging tensor's last (4C) axis from x0..x3 concat to Unfold order."""
  return _reorder_merge(np.asarray(x), to_unfold=True)


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def _resolve_model(model: str | swin_lib.SwinTransformer) -> tuple[swin_lib.SwinTransformer, str]:
  if isinstance(model, str):
    return swin_lib.get_model(model), model
  return model, (f'{type(model).__name__}(embed_dim={model.embed_dim}, depths={model.depths}, '
                 f'window_size={model.window_size})')


def _expected(model: swin_lib.SwinTransformer) -> dict[str, tuple[tuple[str, ...], str, tuple]]:
  """mmseg name -> (flax path, kind, flax shape) for every param of ``model``."""
  out = {}
  for path, s in flatten_tree(swin_lib.param_shapes(model)).items():
    name, kind = _flax_path_to_mmseg(path, len(s.shape))
    out[name] = (path, kind, tuple(s.shape))
  return out


def fmt_keys(keys: list[str]) -> str:
  keys = sorted(keys)
  shown = ', '.join(keys[:_MAX_LISTED])
  more = len(keys) - _MAX_LISTED
  return shown + (f', ... (+{more} more)' if more > 0 else '')


def detect_source(keys: list[str] | Mapping[str, Any]) -> str:
  """Guess the naming of a (prefix-stripped) Swin state dict: mmseg, swin or timm."""
  keys = list(keys)
  if any(k.startswith('stages.') for k in keys):
    return 'mmseg'
  if any(k.startswith('layers.') for k in keys):
    down = {int(m[1]) for k in keys if (m := re.match(r'layers\.(\d+)\.downsample\.', k))}
    if down and 0 not in down:
      return 'timm'  # timm >= 0.9 puts downsample at the start of stages 1..n-1
    return 'swin'
  raise ValueError(
    "cannot detect checkpoint naming: expected keys starting with 'stages.' (mmseg) "
    f"or 'layers.' (swin/timm); first keys: {fmt_keys(keys[:_MAX_LISTED])}"
  )


def _strip_prefixes(state_dict: Mapping[str, Any]) -> dict[str, Any]:
  sd = dict(state_dict)
  if sd and all(k.startswith('module.') for k in sd):  # DistributedDataParallel wrapper
    sd = {k[len('module.'):]: v for k, v in sd.items()}
  if any(k.startswith('backbone.') for k in sd):
    # Full segmentor checkpoint: keep only the backbone (drops decode_head, auxiliary_head, ...).
    return {k[len('backbone.'):]: v for k, v in sd.items() if k.startswith('backbone.')}
  return {k: v for k, v in sd.items() if not k.startswith(('decode_head.', 'auxiliary_head.'))}


def convert_state_dict(
  state_dict: Mapping[str, np.ndarray],
  model: str | swin_lib.SwinTransformer,
  source: str = 'auto',
  *,
  init_missing_norms: bool = False,
) -> Params:
  """Convert a PyTorch Swin state dict (mmseg/swin/timm naming) to flax params.

  ``init_missing_norms=True`` fills absent output norms ``norm{i}`` with the
  identity (scale 1, bias 0), as PyTorch's fresh LayerNorm would; use it for
  ImageNet classification checkpoints, which have no ``norm0..norm{n-2}``.
  """
  module, model_name = _resolve_model(model)
  sd = _strip_prefixes(state_dict)
  if source == 'auto':
    source = detect_source(sd)
  if source not in SOURCES:
    raise ValueError(f"unknown source {source!r}; expected 'auto' or one of {SOURCES}")
  num_stages = len(module.depths)
  last_norm = f'norm{num_stages - 1}'

  # Rename every kept key to mmseg naming, remembering the original for messages.
  renamed: dict[str, tuple[str, np.ndarray]] = {}
  for key, value in sd.items():
    if key.endswith(_SKIP_SUFFIXES):
      continue
    name = key
    if source != 'mmseg':
      if key.startswith('head.'):  # classifier head of a classification checkpoint
        continue
      name = _swin_to_mmseg_name(key, source)
      if key.startswith('norm.') and not any(k.startswith(last_norm + '.') for k in sd):
        name = last_norm + key[len('norm'):]  # final classification norm == last stage norm
    renamed[name] = (key, value)

  expected = _expected(module)
  unknown = [orig for name, (orig, _) in renamed.items() if name not in expected]
  missing = [name for name in expected if name not in renamed]
  if init_missing_norms:
    missing = [n for n in missing if not re.fullmatch(r'norm\d+\.(weight|bias)', n)]
  if unknown or missing:
    parts = []
    if unknown:
      parts.append(f'{len(unknown)} unknown key(s): {fmt_keys(unknown)}')
    if missing:
      parts.append(f'{len(missing)} missing key(s): {fmt_keys(missing)}')
    raise ValueError(f'{source} state dict does not match {model_name}: ' + '; '.join(parts))

  flat: dict[tuple[str, ...], np.ndarray] = {}
  for name, (path, kind, shape) in expected.items():
    if name not in renamed:  # an output norm allowed to be missing
      flat[path] = (np.ones if name.endswith('.weight') else np.zeros)(shape, np.float32)
      continue
    orig, value = renamed[name]
    value = np.asarray(value, dtype=np.float32)
    want = _torch_shape(shape, kind)
    if value.shape != want:
      raise ValueError(
        f'shape mismatch for {orig!r}: checkpoint {tuple(value.shape)} vs model {want}'
      )
    if source != 'mmseg' and _is_merge_param(name):
      value = concat_to_unfold_order(value)
    flat[path] = np.ascontiguousarray(_from_torch_layout(value, kind))
  return unflatten_tree(flat)


def to_state_dict(params: Mapping[str, Any], naming: str = 'mmseg') -> dict[str, np.ndarray]:
  """Inverse of :func:`convert_state_dict`: flax params -> PyTorch-layout state dict."""
  if naming not in SOURCES:
    raise ValueError(f'unknown naming {naming!r}; expected one of {SOURCES}')
  if 'params' in params and len(params) == 1:
    params = params['params']
  out: dict[str, np.ndarray] = {}
  for path, value in flatten_tree(params).items():
    value = np.asarray(value)
    name, kind = _flax_path_to_mmseg(path, value.ndim)
    value = _to_torch_layout(value, kind)
    if naming != 'mmseg':
      if _is_merge_param(name):
        value = unfold_to_concat_order(value)
      name = _mmseg_to_swin_name(name, naming)
    out[name] = np.ascontiguousarray(value)
  return out


def _tensor_to_numpy(t: Any) -> np.ndarray:
  if hasattr(t, 'detach'):  # torch.Tensor; bf16/fp16 have no exact NumPy twin -> float32
    t = t.detach().cpu()
    if t.is_floating_point():
      t = t.float()
    return t.numpy()
  return np.asarray(t)


def load_checkpoint(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """Read a state dict from .pth/.pt/.bin (torch), .safetensors or .npz as NumPy arrays."""
  path = os.fspath(path)
  ext = os.path.splitext(path)[1].lower()
  if ext in ('.pth', '.pt', '.bin', '.ckpt'):
    try:
      import torch
    except ImportError as e:
      raise ImportError(
        f'reading {ext} checkpoints needs PyTorch: pip install "fedjax_mtl[torch]"'
      ) from e
    obj = torch.load(path, map_location='cpu', weights_only=True)
    for key in ('state_dict', 'model'):
      if isinstance(obj, Mapping) and isinstance(obj.get(key), Mapping):
        obj = obj[key]
        break
    return {k: _tensor_to_numpy(v) for k, v in obj.items() if hasattr(v, 'shape')}
  if ext == '.safetensors':
    try:
      from safetensors.numpy import load_file
    except ImportError as e:
      raise ImportError(
        'reading .safetensors checkpoints needs safetensors: pip install "fedjax_mtl[safetensors]"'
      ) from e
    return dict(load_file(path))
  if ext == '.npz':
    with np.load(path, allow_pickle=False) as f:
      return {k: f[k] for k in f.files}
  raise ValueError(
      f'unsupported checkpoint extension {ext!r} for {path}; use .pth, .pt, .safetensors or .npz')


def save_npz_params(params: Mapping[str, Any], path: str | os.PathLike) -> None:
  """Write a flax param tree to .npz with '/'-joined keys."""
  if 'params' in params and len(params) == 1:
    params = params['params']
  flat = {'/'.join(p): np.asarray(v) for p, v in flatten_tree(params).items()}
  np.savez(path, **flat)


def load_npz_params(path: str | os.PathLike) -> Params:
  """Read an .npz written by :func:`save_npz_params` back into a nested param dict."""
  with np.load(path, allow_pickle=False) as f:
    return unflatten_tree({tuple(k.split('/')): f[k] for k in f.files})


def load_pretrained(
  path: str | os.PathLike,
  model: str | swin_lib.SwinTransformer,
  source: str = 'auto',
  **kwargs: Any,
) -> Params:
  """Load a checkpoint (PyTorch or converted .npz) as validated flax params for ``model``."""
  sd = load_checkpoint(path)
  if sd and all('/' in k for k in sd):  # already a converted flax .npz: validate via round trip
    sd = to_state_dict(unflatten_tree({tuple(k.split('/')): v for k, v in sd.items()}))
    source = 'mmseg'
  return convert_state_dict(sd, model, source, **kwargs)


def count_params(params: Mapping[str, Any]) -> int:
  """Total number of scalars in a param tree."""
  return sum(int(np.prod(np.shape(x))) for x in jax.tree.leaves(params))


__all__ = [
  'convert_state_dict', 'to_state_dict', 'load_checkpoint', 'load_pretrained',
  'save_npz_params', 'load_npz_params', 'detect_source', 'count_params',
  'unfold_to_concat_order', 'concat_to_unfold_order', 'SOURCES',
]
