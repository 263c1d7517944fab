"""Convert ViT / CLIP checkpoints to the params of :mod:`fedjax_mtl.models.vit` models.

Three checkpoint layouts (``SOURCES``), all read by :func:`load_vit` from
``.npz``, ``.safetensors`` or ``.pth`` (:func:`convert.load_checkpoint
<fedjax_mtl.models.convert.load_checkpoint>`):

* ``"augreg"``: ``'/'``-joined Flax paths, the layout of the ``vit_jax`` /
  AugReg ``.npz`` checkpoints (``embedding/kernel``, ``cls``,
  ``Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel``,
  ...) and of the files ``scripts/convert_vit.py`` writes, so it also covers a
  converted CLIP tower. Keys equal the model's param paths; only names and
  shapes are checked. ``pre_logits/*`` (the tanh representation layer of some
  IN-21k checkpoints, which the model does not have) is ignored.
* ``"timm"``: timm ``VisionTransformer`` state dicts (``vit_base_patch32_224*``)
  -> :class:`~fedjax_mtl.models.vit.VisionTransformer`. ``cls_token`` ->
  ``cls``, ``pos_embed`` -> ``Transformer/posembed_input/pos_embedding``,
  ``patch_embed.proj.weight`` (OIHW) -> ``embedding/kernel`` (HWIO),
  ``blocks.{i}.norm1/norm2`` -> ``LayerNorm_0/LayerNorm_2``, the fused
  ``blocks.{i}.attn.qkv.weight`` [3D, D] -> ``query``/``key``/``value`` kernels
  [D, H, D/H] (``.bias`` [3D] -> [H, D/H] each), ``blocks.{i}.attn.proj`` ->
  ``out`` ([D, D] -> [H, D/H, D]), ``blocks.{i}.mlp.fc1/fc2`` ->
  ``MlpBlock_3/Dense_0/Dense_1``, ``norm`` -> ``Transformer/encoder_norm``;
  Linear weights (out, in) are transposed to kernels (in, out). ``pre_logits.*``
  is ignored.
* ``"openclip"``: OpenCLIP / OpenAI CLIP state dicts ->
  :class:`~fedjax_mtl.models.vit.CLIPVisionTower`, mapped as the table in
  :mod:`fedjax_mtl.models.vit` says (``visual.transformer.resblocks.{i}.attn.
  in_proj_weight`` split into ``q_proj``/``k_proj``/``v_proj``, ...). The
  ``visual.`` prefix is optional: with it, the keys of the text tower
  (``transformer.*``, ``token_embedding.*``, ``positional_embedding``,
  ``ln_final.*``, ``text_projection``, ``logit_scale``, ``logit_bias``,
  ``attn_mask`` and OpenAI's ``input_resolution``/``context_length``/
  ``vocab_size``) are ignored; without it, every key must belong to the tower.

A leading ``module.`` (DistributedDataParallel) is stripped. The converters
return the **backbone**: a nested dict of float32 NumPy arrays without LoRA
leaves (add them with :func:`vit.add_adapters <fedjax_mtl.models.vit.add_adapters>`)
and without ``head`` unless ``keep_head=True`` (then the model must have
``num_classes`` equal to the checkpoint's). A checkpoint's classifier is
otherwise ignored. Unknown and missing keys are reported together in one
:class:`~fedjax_mtl.errors.ConfigError` line, in the checkpoint's naming; a
shape that does not fit the model names the key and both shapes. The position
embedding fixes the resolution: build the model at the checkpoint's
``image_size``.

:func:`to_timm` and :func:`to_openclip` are the inverses (Flax params ->
PyTorch-layout state dict), :func:`save_npz` writes params in the ``augreg``
layout that :func:`vit.load_npz <fedjax_mtl.models.vit.load_npz>` reads.
"""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import numpy as np

from fedjax_mtl.errors import ConfigError, check_choice
from fedjax_mtl.models import vit
from fedjax_mtl.models.convert import fmt_keys, count_params, load_checkpoint

Params = dict[str, Any]
SOURCES = ('augreg', 'timm', 'openclip')

# Projection name -> position in PyTorch's fused [q; k; v] (both layouts).
_SLOTS = {n: i for layout in (vit.AUGREG, vit.OPENCLIP)
          for i, n in enumerate((layout.q, layout.k, layout.v))}
_TORCH_LEAF = {'kernel': 'weight', 'scale': 'weight', 'bias': 'bias'}
_POS_EMBED = ('Transformer/posembed_input/pos_embedding', 'pos_embed', 'positional_embedding')
_AUGREG_IGNORED = re.compile(r'pre_logits/.*')
_TIMM_IGNORED = re.compile(r'pre_logits\..*')
_TEXT_TOWER = re.compile(r'(transformer|token_embedding|ln_final)\..*|positional_embedding|'
                         r'text_projection|logit_scale|logit_bias|attn_mask|input_resolution|'
                         r'context_length|vocab_size')


# ---------------------------------------------------------------------------
# Flax path <-> checkpoint name
# ---------------------------------------------------------------------------


def _compile(rules: Iterable[tuple[str, str]], layout: vit.Layout) -> tuple:
  """(Flax path regex, checkpoint name template) pairs; ``{i}`` block, ``{leaf}``, ``{qkv}``."""
  subs = dict(layout._asdict(), i=r'(?P<i>\d+)', leaf=r'(?P<leaf>kernel|scale|bias)',
              qkv='(?:' + '|'.join((layout.q, layout.k, layout.v)) + ')')
  return tuple((re.compile(flax.format(**subs)), name) for flax, name in rules)


_TIMM_RULES = _compile((
  ('cls', 'cls_token'),
  ('Transformer/posembed_input/pos_embedding', 'pos_embed'),
  ('embedding/{leaf}', 'patch_embed.proj.{leaf}'),
  ('Transformer/encoderblock_{i}/{ln_1}/{leaf}', 'blocks.{i}.norm1.{leaf}'),
  ('Transformer/encoderblock_{i}/{attn}/{qkv}/{leaf}', 'blocks.{i}.attn.qkv.{leaf}'),
  ('Transformer/encoderblock_{i}/{attn}/{out}/{leaf}', 'blocks.{i}.attn.proj.{leaf}'),
  ('Transformer/encoderblock_{i}/{ln_2}/{leaf}', 'blocks.{i}.norm2.{leaf}'),
  ('Transformer/encoderblock_{i}/{mlp}/{fc_1}/{leaf}', 'blocks.{i}.mlp.fc1.{leaf}'),
  ('Transformer/encoderblock_{i}/{mlp}/{fc_2}/{leaf}', 'blocks.{i}.mlp.fc2.{leaf}'),
  ('Transformer/encoder_norm/{leaf}', 'norm.{leaf}'),
  ('head/{leaf}', 'head.{leaf}'),
), vit.AUGREG)

_BLOCK, _RESBLOCK = 'transformer/resblocks_{i}/', 'transformer.resblocks.{i}.'
_OPENCLIP_RULES = _compile((
  ('class_embedding', 'class_embedding'),
  ('positional_embedding', 'positional_embedding'),
  ('proj', 'proj'),
  ('conv1/{leaf}', 'conv1.{leaf}'),
  ('ln_pre/{leaf}', 'ln_pre.{leaf}'),
  (_BLOCK + '{ln_1}/{leaf}', _RESBLOCK + 'ln_1.{leaf}'),
  (_BLOCK + '{attn}/{qkv}/{leaf}', _RESBLOCK + 'attn.in_proj_{leaf}'),
  (_BLOCK + '{attn}/{out}/{leaf}', _RESBLOCK + 'attn.out_proj.{leaf}'),
  (_BLOCK + '{ln_2}/{leaf}', _RESBLOCK + 'ln_2.{leaf}'),
  (_BLOCK + '{mlp}/{fc_1}/{leaf}', _RESBLOCK + 'mlp.c_fc.{leaf}'),
  (_BLOCK + '{mlp}/{fc_2}/{leaf}', _RESBLOCK + 'mlp.c_proj.{leaf}'),
  ('ln_post/{leaf}', 'ln_post.{leaf}'),
), vit.OPENCLIP)

_RULES = {'timm': _TIMM_RULES, 'openclip': _OPENCLIP_RULES}
_MODEL_OF = {'timm': vit.VisionTransformer, 'openclip': vit.CLIPVisionTower}


def _checkpoint_name(path: str, source: str) -> str | None:
  """The checkpoint key holding Flax param ``path`` in ``source``'s naming (None: no such key)."""
  if source == 'augreg':
    return path
  for pattern, template in _RULES[source]:
    m = pattern.fullmatch(path)
    if m:
      groups = m.groupdict()
      return template.format(i=groups.get('i'), leaf=_TORCH_LEAF.get(groups.get('leaf')))
  return None


# ---------------------------------------------------------------------------
# Array layouts: PyTorch tensor <-> Flax leaves
# ---------------------------------------------------------------------------


class _Layout(NamedTuple):
  """How one checkpoint tensor relates to its Flax leaves (their shapes ``s``)."""

  shape: Callable[[list[tuple]], tuple]  # Flax shapes -> checkpoint shape
  load: Callable[[np.ndarray, list[tuple]], list[np.ndarray]]  # checkpoint -> Flax leaves
  save: Callable[[list[np.ndarray]], np.ndarray]  # Flax leaves -> checkpoint


_LAYOUTS = {
  'id': _Layout(lambda s: s[0], lambda x, s: [x], lambda v: v[0]),
  # nn.Linear weight (out, in) <-> kernel (in, out)
  'linear': _Layout(lambda s: s[0][::-1], lambda x, s: [x.T], lambda v: v[0].T),
  # conv weight OIHW <-> kernel HWIO
  'conv': _Layout(lambda s: (s[0][3], s[0][2], s[0][0], s[0][1]),
                  lambda x, s: [x.transpose(2, 3, 1, 0)], lambda v: v[0].transpose(3, 2, 0, 1)),
  # fused [q; k; v] weight [3 H hd, D] <-> three kernels [D, H, hd]
  'qkv': _Layout(lambda s: (sum(int(np.prod(k[1:])) for k in s), s[0][0]),
                 lambda x, s: [w.T.reshape(k) for w, k in zip(np.split(x, len(s)), s)],
                 lambda v: np.concatenate([k.reshape(k.shape[0], -1).T for k in v])),
  # fused [q; k; v] bias [3 H hd] <-> three biases [H, hd]
  'qkv_bias': _Layout(lambda s: (sum(int(np.prod(k)) for k in s),),
                      lambda x, s: [b.reshape(k) for b, k in zip(np.split(x, len(s)), s)],
                      lambda v: np.concatenate([b.reshape(-1) for b in v])),
  # output projection weight [D, H hd] <-> kernel [H, hd, D]
  'out': _Layout(lambda s: (s[0][2], s[0][0] * s[0][1]),
                 lambda x, s: [x.T.reshape(s[0])], lambda v: v[0].reshape(-1, v[0].shape[-1]).T),
}


def _layout_kind(path: str, ndim: int, source: str) -> str:
  if source == 'augreg':
    return 'id'
  *parents, leaf = path.split('/')
  fused = bool(parents) and parents[-1] in _SLOTS
  if leaf == 'kernel':
    if ndim == 4:
      return 'conv'
    return 'qkv' if fused else 'out' if ndim == 3 else 'linear'
  return 'qkv_bias' if fused and leaf == 'bias' else 'id'


class _Entry(NamedTuple):
  """One checkpoint key: its array layout, the Flax paths it fills (q, k, v order) and shapes."""

  kind: str
  paths: tuple[str, ...]
  shapes: tuple[tuple[int, ...], ...]


def _group(flat: Mapping[str, Any], source: str) -> tuple[dict[str, _Entry], list[str]]:
  """Group Flax paths (-> array or shape) by checkpoint key; also the paths with no key."""
  slots: dict[str, dict[int, tuple[str, tuple]]] = {}
  kinds: dict[str, str] = {}
  unmapped = []
  for path, leaf in flat.items():
    name = _checkpoint_name(path, source)
    if name is None:
      unmapped.append(path)
      continue
    shape = tuple(np.shape(leaf))
    parent = path.split('/')[-2] if '/' in path else ''
    slot = _SLOTS.get(parent, 0) if source != 'augreg' else 0
    kinds[name] = _layout_kind(path, len(shape), source)
    slots.setdefault(name, {})[slot] = (path, shape)
  entries = {}
  for name, by_slot in slots.items():
    ordered = [by_slot[k] for k in sorted(by_slot)]
    entries[name] = _Entry(kinds[name], tuple(p for p, _ in ordered), tuple(s for _, s in ordered))
  return entries, unmapped


# ---------------------------------------------------------------------------
# Checkpoint -> Flax
# ---------------------------------------------------------------------------


def _resolve_model(model: str | nn.Module) -> tuple[nn.Module, str]:
  if isinstance(model, str):
    return vit.get_model(model), model
  fields = ('patch_size', 'hidden_size', 'width', 'depth', 'num_heads', 'image_size',
            'num_classes')
  args = ', '.join(f'{f}={getattr(model, f)}' for f in fields if hasattr(model, f))
  return model, f'{type(model).__name__}({args})'


def _strip_module(state_dict: Mapping[str, Any]) -> dict[str, Any]:
  sd = dict(state_dict)
  if sd and all(k.startswith('module.') for k in sd):  # DistributedDataParallel wrapper
    sd = {k[len('module.'):]: v for k, v in sd.items()}
  return sd


def _convert(named: Mapping[str, tuple[str, Any]], model: str | nn.Module, source: str,
             keep_head: bool, meta: Mapping[str, str]) -> Params:
  """``named``: model-side key -> (key as in the file, array); validated, laid out for Flax.
  ``meta``: what is known of the weights (``activation``), checked against the model."""
  module, model_name = _resolve_model(model)
  want_cls = _MODEL_OF.get(source)
  if want_cls is not None and not isinstance(module, want_cls):
    raise ConfigError(f'a {source} checkpoint converts to a {want_cls.__name__}, not to '
                      f'{model_name}')
  vit.check_activation(module, meta, f'the {source} checkpoint', repr(model_name))
  if keep_head and getattr(module, 'num_classes', None) is None:
    raise ConfigError(f'keep_head needs a model with num_classes set; {model_name} has no head')
  shapes = {path: s for path, s in vit.flatten_params(vit.param_shapes(module)).items()
            if path.split('/')[-1] not in vit.ADAPTER_LEAVES
            and (keep_head or path.split('/')[0] != vit.HEAD_NAME)}
  expected, _ = _group(shapes, source)
  unknown = [orig for name, (orig, _) in named.items() if name not in expected]
  missing = [name for name in expected if name not in named]
  if unknown or missing:
    parts = [f'{len(unknown)} unknown key(s): {fmt_keys(unknown)}'] if unknown else []
    if missing:
      parts.append(f'{len(missing)} missing key(s): {fmt_keys(missing)}')
    raise ConfigError(f'{source} checkpoint does not match {model_name}: ' + '; '.join(parts))
  flat = {}
  for name, entry in expected.items():
    orig, value = named[name]
    value = np.asarray(value, np.float32)
    layout = _LAYOUTS[entry.kind]
    want = tuple(layout.shape(list(entry.shapes)))
    if value.shape != want:
      hint = (' (the position embedding fixes the resolution: build the model with the '
              "checkpoint's image_size)" if name in _POS_EMBED else '')
      raise ConfigError(f'{source} checkpoint does not match {model_name}: shape mismatch for '
                        f'{orig!r}: checkpoint {tuple(value.shape)} vs model {want}{hint}')
    for path, leaf in zip(entry.paths, layout.load(value, list(entry.shapes))):
      flat[path] = np.ascontiguousarray(leaf)
  return vit.unflatten_params(flat)


def _heads_checked(sd: dict[str, Any], head_prefix: str, pre_logits: re.Pattern,
                   keep_head: bool) -> dict[str, Any]:
  """Drop the classifier (unless kept) and the ignored pre-logits layer."""
  if keep_head and any(pre_logits.fullmatch(k) for k in sd):
    raise ConfigError('keep_head: this checkpoint classifies from a pre-logits layer the model '
                      'does not have; convert the backbone only')
  return {k: v for k, v in sd.items() if not pre_logits.fullmatch(k)
          and (keep_head or not k.startswith(head_prefix))}


def _stated(meta: Mapping[str, str], activation: str | None, source: str) -> dict[str, str]:
  """The weights' metadata with the caller's ``activation`` (which must agree with a
  recorded one)."""
  meta = dict(meta)
  if activation is not None:
    check_choice('activation', activation, vit.ACTIVATIONS)
    if meta.get('activation', activation) != activation:
      raise ConfigError(f'activation={activation!r}, but the {source} checkpoint records '
                        f'{meta["activation"]!r}')
    meta['activation'] = activation
  return meta


def convert_augreg(npz_dict: Mapping[str, Any], model: str | nn.Module, *,
                   keep_head: bool = False, activation: str | None = None) -> Params:
  """A ``'/'``-keyed ``vit_jax``/AugReg (or converted) checkpoint -> backbone params of ``model``.

  ``model`` is a name in :data:`vit.MODELS <fedjax_mtl.models.vit.MODELS>` or a
  module. ``head/*`` is dropped unless ``keep_head``; ``pre_logits/*`` always.
  A converted file's recorded activation (``__meta__/activation``) must be the
  model's; a CLIP tower needs it recorded, or stated as ``activation``.
  """
  sd = dict(npz_dict)
  meta = {k[len(vit.META_PREFIX):]: str(np.asarray(sd.pop(k))) for k in list(sd)
          if k.startswith(vit.META_PREFIX)}
  sd = _heads_checked(sd, vit.HEAD_NAME + '/', _AUGREG_IGNORED, keep_head)
  return _convert({k: (k, v) for k, v in sd.items()}, model, 'augreg', keep_head,
                  _stated(meta, activation, 'augreg'))


def convert_timm(state_dict: Mapping[str, Any], model: str | nn.Module, *,
                 keep_head: bool = False, activation: str | None = None) -> Params:
  """A timm ``VisionTransformer`` state dict -> backbone params of a ViT in the AugReg layout.

  ``head.*`` is dropped unless ``keep_head``; ``pre_logits.*`` always. timm's ViTs
  use the exact GELU; ``activation`` (if given) must be the model's.
  """
  sd = _heads_checked(_strip_module(state_dict), 'head.', _TIMM_IGNORED, keep_head)
  return _convert({k: (k, v) for k, v in sd.items()}, model, 'timm', keep_head,
                  _stated({}, activation, 'timm'))


def convert_openclip(state_dict: Mapping[str, Any], model: str | nn.Module, *,
                     activation: str | None = None) -> Params:
  """An OpenCLIP / OpenAI CLIP state dict (whole model or image tower) -> CLIP tower params.

  A state dict does not record its activation, so it must be said: by naming the
  model as OpenCLIP does (``'ViT-B-32'``: exact GELU; ``'ViT-B-32-quickgelu'``:
  QuickGELU, the OpenAI weights; ``vit.OPENCLIP_MODELS``), or by ``activation``
  (``'gelu'`` or ``'quick_gelu'``), which must then be the model's.
  """
  if activation is None and isinstance(model, str) and model in vit.OPENCLIP_MODELS:
    activation = vit.activation(vit.get_model(model))
  if activation is None:
    raise ConfigError(
        'an OpenCLIP state dict does not record its activation; name the model as OpenCLIP '
        "does ('ViT-B-32': exact GELU; 'ViT-B-32-quickgelu': QuickGELU, the OpenAI weights; "
        + ', '.join(repr(m) for m in vit.OPENCLIP_MODELS)
        + ") or pass activation='gelu' or 'quick_gelu'")
  sd = _strip_module(state_dict)
  meta = _stated({}, activation, 'openclip')
  if not any(k.startswith('visual.') for k in sd):
    return _convert({k: (k, v) for k, v in sd.items()}, model, 'openclip', False, meta)
  named = {}
  for key, value in sd.items():
    if key.startswith('visual.'):
      named[key[len('visual.'):]] = (key, value)
    elif not _TEXT_TOWER.fullmatch(key):
      named[key] = (key, value)  # neither image nor text tower: reported as unknown
  return _convert(named, model, 'openclip', False, meta)


CONVERTERS: dict[str, Callable[..., Params]] = {
  'augreg': convert_augreg, 'timm': convert_timm, 'openclip': convert_openclip,
}


def detect(keys: Iterable[str]) -> str:
  """The layout of a checkpoint from its keys: ``'augreg'``, ``'timm'`` or ``'openclip'``."""
  keys = [k[len('module.'):] if k.startswith('module.') else k for k in keys]
  if any('/' in k for k in keys):
    return 'augreg'
  openclip = ('visual.', 'conv1.', 'ln_pre.', 'transformer.resblocks.')
  if any(k.startswith(openclip) or k == 'class_embedding' for k in keys):
    return 'openclip'
  if any(k.startswith(('blocks.', 'patch_embed.')) or k in ('cls_token', 'pos_embed')
         for k in keys):
    return 'timm'
  raise ConfigError(
    "cannot detect the checkpoint layout: expected '/'-joined Flax keys (augreg), timm keys "
    "('cls_token', 'blocks.0...') or OpenCLIP keys ('visual.conv1.weight', ...); "
    f'first keys: {fmt_keys(keys[:8]) or "none"}')


def load_vit(path: str | os.PathLike, model: str | nn.Module, *, source: str = 'auto',
             keep_head: bool = False, activation: str | None = None) -> Params:
  """Read a checkpoint (.npz/.safetensors/.pth) and convert it to backbone params of ``model``.

  ``source='auto'`` detects the layout (:func:`detect`). OpenCLIP checkpoints
  have no classifier to keep (zero-shot heads: :mod:`fedjax_mtl.models.zeroshot`).
  The weights' activation must be the model's: an OpenCLIP state dict's is said by
  an OpenCLIP model name or ``activation`` (:func:`convert_openclip`); a converted
  ``.npz`` records it (:func:`save_npz`); a mismatch is one ConfigError line.
  """
  path = os.fspath(path)
  if not os.path.exists(path):
    raise ConfigError(f'checkpoint {path!r} does not exist')
  try:
    sd = load_checkpoint(path)
  except (OSError, RuntimeError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile) as e:
    raise ConfigError(f'cannot read checkpoint {path!r}: {e}') from e
  if source == 'auto':
    source = detect(sd)
  check_choice('checkpoint layout', source, SOURCES)
  if source == 'openclip':
    if keep_head:
      raise ConfigError('keep_head: an OpenCLIP checkpoint has no classification head')
    return convert_openclip(sd, model, activation=activation)
  return CONVERTERS[source](sd, model, keep_head=keep_head, activation=activation)


# ---------------------------------------------------------------------------
# Flax -> checkpoint
# ---------------------------------------------------------------------------


def _to_state_dict(params: Mapping[str, Any], source: str) -> dict[str, np.ndarray]:
  flat = vit.flatten_params(params)
  adapters = [p for p in flat if p.split('/')[-1] in vit.ADAPTER_LEAVES]
  if adapters:
    raise ConfigError(f'params hold {len(adapters)} LoRA leaves ({fmt_keys(adapters)}); fold '
                      'them in with vit.merge_lora or drop them first')
  entries, unmapped = _group(flat, source)
  if unmapped:
    raise ConfigError(f'{len(unmapped)} param(s) have no {source} name: {fmt_keys(unmapped)}')
  out = {}
  for name, entry in entries.items():
    if entry.kind in ('qkv', 'qkv_bias') and len(entry.paths) != 3:
      raise ConfigError(f'{name!r} needs the query, key and value params; got {entry.paths}')
    leaves = [np.asarray(flat[p], np.float32) for p in entry.paths]
    out[name] = np.ascontiguousarray(_LAYOUTS[entry.kind].save(leaves))
  return out


def to_timm(params: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """ViT params (AugReg layout, no adapters) -> timm state dict; inverse of :func:`convert_timm`."""
  return _to_state_dict(params, 'timm')


def to_openclip(params: Mapping[str, Any], prefix: str = 'visual.') -> dict[str, np.ndarray]:
  """CLIP tower params -> OpenCLIP state dict, keys with ``prefix``; see :func:`convert_openclip`."""
  return {prefix + k: v for k, v in _to_state_dict(params, 'openclip').items()}


def save_npz(params: Mapping[str, Any], path: str | os.PathLike,
             model: str | nn.Module | None = None) -> None:
  """Write params as the ``'/'``-keyed ``.npz`` :func:`vit.load_npz` reads (never half-written).

  With ``model`` (a name or module), its activation and name are recorded
  (``__meta__/activation``, ``__meta__/model``): loading checks them
  (:func:`vit.check_activation`).
  """
  path = os.fspath(path)
  flat = {k: np.asarray(v) for k, v in vit.flatten_params(params).items()}
  if model is not None:
    module, name = _resolve_model(model)
    flat[vit.META_PREFIX + 'activation'] = np.asarray(vit.activation(module))
    flat[vit.META_PREFIX + 'model'] = np.asarray(name)
  tmp = f'{path}.tmp{os.getpid()}'
  try:
    with open(tmp, 'wb') as f:
      np.savez(f, **flat)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


__all__ = [
  'SOURCES', 'CONVERTERS', 'convert_augreg', 'convert_timm', 'convert_openclip', 'detect',
  'load_vit', 'to_timm', 'to_openclip', 'save_npz', 'count_params',
]
