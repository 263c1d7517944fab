"""Model registry: encoders by name; every encoder maps NHWC images to 4 stages."""

from __future__ import annotations

from typing import Callable

from fedjax_mtl.errors import check_choice
from fedjax_mtl.models import convnet, resnet

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
