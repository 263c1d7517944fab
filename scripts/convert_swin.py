"""Convert a PyTorch Swin checkpoint (mmseg / original Swin / timm) to a flax .npz.

Example::

  python scripts/convert_swin.py --input upernet_swin_tiny_...pth --model swin_t --output swin_t.npz

The .npz holds the flax ``'params'`` tree flattened with '/'-joined keys; read it
back with ``fedjax_mtl.models.convert.load_npz_params``.
"""

from __future__ import annotations

import argparse
import os
import sys

try:
  from fedjax_mtl.models import convert, swin
except ImportError:  # running from a source checkout without `pip install -e .`
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from fedjax_mtl.models import convert, swin


def main(argv: list[str] | None = None) -> int:
  """CLI entry point."""
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--input', required=True, help='.pth/.pt/.safetensors/.npz checkpoint')
  parser.add_argument('--model', required=True, choices=sorted(swin.MODELS), help='Swin variant')
  parser.add_argument('--output', required=True, help='output .npz path')
  parser.add_argument('--source', default='auto', choices=('auto',) + convert.SOURCES,
            help='checkpoint naming (default: detect)')
  parser.add_argument('--init-missing-norms', action='store_true',
            help='identity-init absent output norms norm0..3 (ImageNet checkpoints)')
  args = parser.parse_args(argv)

  state_dict = convert.load_checkpoint(args.input)
  params = convert.convert_state_dict(
    state_dict, args.model, args.source, init_missing_norms=args.init_missing_norms
  )
  convert.save_npz_params(params, args.output)
  print(f'wrote {args.output}: {convert.count_params(params):,} params for {args.model}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
