"""Model registry: encoders by name; every encoder maps NHWC images to 4 stages."""

from __future__ import annotations

from typing import Callable

from fedjax_mtl import fields
from fedjax_mtl.errors import check_choice
from fedjax_mtl.fields import Field, at_least
from fedjax_mtl.models import convnet, multitask, resnet

ENCODERS: dict[str, Callable] = {
    'conv_micro': convnet.conv_micro,
    'conv_small': convnet.conv_small,
    'resnet18': resnet.resnet18,
    'resnet18_os8': resnet.resnet18_os8,
}

try:  # The Swin family registers itself when its module is present.
  from fedjax_mtl.models import swin as _swin
  ENCODERS.update({name: getattr(_swin, name) for name in
                   ('swin_nano', 'swin_micro', 'swin_t', 'swin_s', 'swin_b')
                   if hasattr(_swin, name)})
except ImportError:  # pragma: no cover
  pass


def get_encoder(name: str, **kwargs):
  """Encoder module by name, with a clear error listing the valid names."""
  check_choice('model', name, ENCODERS)
  return ENCODERS[name](**kwargs)


# The `model` block: the dense setting's encoder, decoders and compute dtype.
CONFIG = fields.Block('model', {
    # Tiny Swin (embed 16, one block per stage, window 4): the paper's encoder family at
    # a size whose 8-round run takes about 2 minutes on 2 CPU cores.
    'encoder': Field('swin_nano', 'encoder name, e.g. swin_nano, swin_t, conv_micro '
                     '(fedjax_mtl/models/__init__.py ENCODERS)'),
    'decoder': Field('hca2', "task decoders of the dense model: hca2 (FedHCA2's decoder "
                     '+ head per task) or deeplab (a DeepLab-v3 ASPP head per task on the '
                     "encoder's last stage: MaT-FL's and NTKFedAvg's benchmark A)",
                     choices=lambda: multitask.DECODERS),
    'head_width': Field(256, "decoder='deeplab': channels of the ASPP and its projection "
                        '(256 in the reference)', at_least(1)),
    'kwargs': Field({}, "keyword arguments of the encoder, e.g. {'embed_dim': 8, "
                    "'depths': (1, 1, 1, 1)}", mapping=True),
    'dtype': Field('float32', 'compute dtype (bfloat16: bf16 compute, float32 params)',
                   choices=('float32', 'bfloat16')),
    # Keeps one activation per block instead of all of them (about one extra forward).
    'remat': Field(False, "recompute each encoder block's forward in the backward pass "
                   '(less memory, about one extra forward)'),
    'pretrained_path': Field('', "converted encoder weights (.npz) all clients start "
                             "from ('' = random init)"),
})
