"""Convert torchvision ResNet state dicts to :class:`~fedjax_mtl.models.resnet.ResNet` variables.

torchvision names map one to one: ``layer2.0.downsample.1.running_mean`` is
``batch_stats['layer2_0']['downsample_1']['mean']``; conv ``weight`` (OIHW)
becomes ``kernel`` (HWIO); BN ``weight``/``bias`` become ``scale``/``bias``
(params) and ``running_mean``/``running_var`` become ``mean``/``var``
(batch_stats). ``fc.*`` (the classifier) and ``num_batches_tracked`` are
ignored. The dilated variant has the same parameters, so a plain ResNet-18
checkpoint loads into ``resnet18_os8`` too (as MaT-FL's ResnetDilated does).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl.errors import ConfigError
from fedjax_mtl.models import resnet as resnet_lib
from fedjax_mtl.models.convert import flatten_tree, fmt_keys, unflatten_tree, load_checkpoint

Tree = dict[str, Any]
_IGNORED = (r'fc\..*', r'.*num_batches_tracked')
_BN_LEAVES = {'weight': ('params', 'scale'), 'bias': ('params', 'bias'),
              'running_mean': ('batch_stats', 'mean'), 'running_var': ('batch_stats', 'var')}


def variable_shapes(model: resnet_lib.ResNet | None = None) -> Tree:
  """``{'params': ..., 'batch_stats': ...}`` shape tree of `model` (default resnet18)."""
  model = model or resnet_lib.resnet18()
  x = jax.ShapeDtypeStruct((1, 32, 32, 3), jnp.float32)  # shapes do not depend on the size
  return jax.eval_shape(lambda r, x: model.init(r, x, train=False), jax.random.key(0), x)


def resnet_params_from_torch(
    state_dict: Mapping[str, np.ndarray],
    model: resnet_lib.ResNet | None = None) -> tuple[Tree, Tree]:
  """Map a torchvision ResNet state dict to `(params, batch_stats)` of `model` (default resnet18).

  Raises ConfigError naming the missing or unexpected keys or the first shape mismatch.
  """
  sd = dict(state_dict)
  if sd and all(k.startswith('module.') for k in sd):  # DistributedDataParallel wrapper
    sd = {k[len('module.'):]: v for k, v in sd.items()}
  expected = flatten_tree(variable_shapes(model))
  found: dict[tuple[str, ...], str] = {}
  unexpected = []
  for key in sd:
    if any(re.fullmatch(p, key) for p in _IGNORED):
      continue
    path = _torch_to_flax(key)
    if path in expected:
      found[path] = key
    else:
      unexpected.append(key)
  missing = [_flax_to_torch(p) for p in expected if p not in found]
  if unexpected or missing:
    parts = [f'{len(unexpected)} unexpected key(s): {fmt_keys(unexpected)}'] if unexpected else []
    if missing:
      parts.append(f'{len(missing)} missing key(s): {fmt_keys(missing)}')
    raise ConfigError('ResNet state dict does not match the model: ' + '; '.join(parts))
  flat = {}
  for path, key in found.items():
    value = np.asarray(sd[key], np.float32)
    want = tuple(expected[path].shape)
    if len(want) == 4:
      want = (want[3], want[2], want[0], want[1])  # HWIO -> OIHW
    if value.shape != want:
      raise ConfigError(f'ResNet state dict: shape mismatch for {key!r}: checkpoint '
                        f'{tuple(value.shape)} vs model {want}')
    flat[path] = np.ascontiguousarray(value.transpose(2, 3, 1, 0) if value.ndim == 4 else value)
  tree = unflatten_tree(flat)
  return tree['params'], tree['batch_stats']


def _torch_to_flax(key: str) -> tuple[str, ...]:
  """torchvision name -> (collection, module path..., flax leaf), or ('?', key) if none."""
  name = re.sub(r'(layer\d+)\.(\d+)\.', r'\1_\2.', key).replace('downsample.', 'downsample_')
  *mods, leaf = name.split('.')
  if not mods:
    return ('?', key)
  if re.fullmatch(r'conv\d+|downsample_0', mods[-1]):
    return ('params', *mods, 'kernel') if leaf == 'weight' else ('?', key)
  if re.fullmatch(r'bn\d+|downsample_1', mods[-1]) and leaf in _BN_LEAVES:
    coll, flax_leaf = _BN_LEAVES[leaf]
    return (coll, *mods, flax_leaf)
  return ('?', key)


def _flax_to_torch(path: tuple[str, ...]) -> str:
  """(collection, module path..., flax leaf) -> torchvision name."""
  _, *mods, leaf = path
  torch_leaf = {'kernel': 'weight', 'scale': 'weight', 'bias': 'bias',
                'mean': 'running_mean', 'var': 'running_var'}[leaf]
  name = '.'.join([*mods, torch_leaf])
  name = re.sub(r'(layer\d+)_(\d+)\.', r'\1.\2.', name)
  return name.replace('downsample_', 'downsample.')


def resnet_state_dict_from_flax(params: Tree, batch_stats: Tree) -> dict[str, np.ndarray]:
  """Inverse of :func:`resnet_params_from_torch` (no ``fc`` or ``num_batches_tracked``)."""
  out = {}
  for path, value in flatten_tree({'params': params, 'batch_stats': batch_stats}).items():
    value = np.asarray(value)
    out[_flax_to_torch(path)] = value.transpose(3, 2, 0, 1) if value.ndim == 4 else value
  return out


def load_resnet_checkpoint(path: str | os.PathLike,
                           model: resnet_lib.ResNet | None = None) -> tuple[Tree, Tree]:
  """`(params, batch_stats)` from a torchvision .pth/.pt (needs torch), .safetensors or .npz."""
  if not os.path.exists(path):
    raise ConfigError(f'ResNet checkpoint {os.fspath(path)!r} does not exist')
  return resnet_params_from_torch(load_checkpoint(path), model)


__all__ = ['resnet_params_from_torch', 'resnet_state_dict_from_flax', 'load_resnet_checkpoint',
           'variable_shapes']
