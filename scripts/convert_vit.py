"""Convert a ViT / CLIP checkpoint (AugReg .npz, timm, OpenCLIP) to a Flax .npz.

Examples::

  python scripts/convert_vit.py --model vit_b32 --out vit_b32_in21k.npz \\
      --src B_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.03-do_0.0-sd_0.0.npz
  python scripts/convert_vit.py --src open_clip_pytorch_model.bin --model ViT-B-32-256 \\
      --out clip_vit_b32_256.npz

CLIP towers are named as OpenCLIP names them, which says their activation (a
state dict does not): ``ViT-B-32`` and ``ViT-B-32-256`` use the exact GELU,
``ViT-B-32-quickgelu`` QuickGELU (the OpenAI weights). The output records the
activation and model name; loading it into a model with another activation is
an error.

The layout is detected from the keys (``--source`` to force it); the output
holds the backbone params ('/'-joined keys, float32) and loads with
``fedjax_mtl.models.vit.load_npz``. ``--num-classes N`` keeps the checkpoint's
N-class head. Bad input prints one ``error:`` line (exit code 2) and writes
nothing; an existing output is kept unless ``--force``.
"""

from __future__ import annotations

import argparse
import os
import sys

try:
  from fedjax_mtl.errors import ConfigError, check_choice
  from fedjax_mtl.models import convert_vit, vit
except ImportError:  # running from a source checkout without `pip install -e .`
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from fedjax_mtl.errors import ConfigError, check_choice
  from fedjax_mtl.models import convert_vit, vit


def _convert(args: argparse.Namespace) -> str:
  """Validate, convert and write; returns the summary line."""
  check_choice('ViT model', args.model, vit.MODELS)
  if not args.out.endswith('.npz'):
    raise ConfigError(f'--out must end in .npz; got {args.out!r}')
  if os.path.exists(args.out) and not args.force:
    raise ConfigError(f'{args.out!r} exists; pass --force to overwrite it')
  kwargs = {} if args.num_classes is None else {'num_classes': args.num_classes}
  model = vit.get_model(args.model, **kwargs)
  params = convert_vit.load_vit(args.src, model, source=args.source,
                                keep_head=args.num_classes is not None,
                                activation=args.activation)
  convert_vit.save_npz(params, args.out, model=args.model)
  return f'wrote {args.out}: {convert_vit.count_params(params):,} params for {args.model}'


def main(argv: list[str] | None = None) -> int:
  """CLI entry point; returns the exit code."""
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--src', required=True, help='.npz/.safetensors/.pth/.pt/.bin checkpoint')
  parser.add_argument('--model', required=True, metavar='NAME',
                      help='model to convert to: ' + ', '.join(vit.MODELS))
  parser.add_argument('--out', required=True, help='output .npz path')
  parser.add_argument('--source', default='auto', choices=('auto',) + convert_vit.SOURCES,
                      help='checkpoint layout (default: detect from the keys)')
  parser.add_argument('--num-classes', type=int, default=None,
                      help="keep the checkpoint's classifier with this many classes "
                           '(default: backbone only)')
  parser.add_argument('--activation', default=None, choices=vit.ACTIVATIONS,
                      help="the activation the checkpoint's weights were trained with, for a "
                           'CLIP tower not named as OpenCLIP names it (must be the model\'s)')
  parser.add_argument('--force', action='store_true', help='overwrite an existing --out')
  args = parser.parse_args(argv)
  try:
    print(_convert(args))
  except (ImportError, OSError, ValueError) as e:  # ConfigError is a ValueError
    print('error: ' + ' '.join(str(e).split()), file=sys.stderr)
    return 2
  return 0


if __name__ == '__main__':
  sys.exit(main())
