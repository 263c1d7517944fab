"""Precompute the frozen zero-shot heads of the 8-task CLIP benchmark with OpenCLIP.

Needs PyTorch and OpenCLIP (``pip install torch open_clip_torch``) and downloads
the model's weights once. Example (NTKFedAvg's CLIP, the defaults)::

  python scripts/zeroshot_heads.py --out heads_clip_vit_b32_256.npz

For every task and class, the task's prompt templates
(``fedjax_mtl/data/zeroshot_templates.py``) are embedded by the text tower,
each embedding L2-normalised, averaged and normalised again. The output .npz
holds ``{task}/weight`` [E, C], ``logit_scale`` and the model / pretrained tags;
read it with ``fedjax_mtl.models.zeroshot.load_heads``. Bad input prints one
``error:`` line (exit code 2) and writes nothing; an existing output is kept
unless ``--force``.
"""

from __future__ import annotations

import argparse
import os
import sys

try:
  from fedjax_mtl.data import zeroshot_templates as zt
  from fedjax_mtl.errors import ConfigError, check_choice
  from fedjax_mtl.models import zeroshot
except ImportError:  # running from a source checkout without `pip install -e .`
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from fedjax_mtl.data import zeroshot_templates as zt
  from fedjax_mtl.errors import ConfigError, check_choice
  from fedjax_mtl.models import zeroshot


def _import_openclip():
  try:
    import open_clip
    import torch
  except ImportError as e:
    raise ConfigError(f'zeroshot_heads.py needs PyTorch and OpenCLIP ({e}): '
                      'pip install torch open_clip_torch') from e
  return open_clip, torch


def _build(args: argparse.Namespace) -> str:
  """Validate, embed the prompts and write the heads; returns the summary line."""
  tasks = args.tasks or list(zt.TASKS)
  for task in tasks:
    check_choice('task', task, zt.TASKS)
  if not args.out.endswith('.npz'):
    raise ConfigError(f'--out must end in .npz; got {args.out!r}')
  if os.path.exists(args.out) and not args.force:
    raise ConfigError(f'{args.out!r} exists; pass --force to overwrite it')
  open_clip, torch = _import_openclip()
  model, _, _ = open_clip.create_model_and_transforms(args.model, pretrained=args.pretrained,
                                                      device=args.device)
  model.eval()
  tokenizer = open_clip.get_tokenizer(args.model)

  def encode(prompts: list[str]):
    with torch.no_grad():
      return model.encode_text(tokenizer(prompts).to(args.device)).float().cpu().numpy()

  heads = {}
  for task in tasks:
    heads[task] = zeroshot.class_weights(encode, zt.CLASSNAMES[task], zt.TEMPLATES[task])
    print(f'{task}: {heads[task].shape[1]} classes x {len(zt.TEMPLATES[task])} templates')
  zeroshot.save_heads(args.out, heads, float(model.logit_scale.item()), model=args.model,
                      pretrained=args.pretrained)
  return f'wrote {args.out}: heads for {", ".join(tasks)} ({args.model}, {args.pretrained})'


def main(argv: list[str] | None = None) -> int:
  """CLI entry point; returns the exit code."""
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--out', required=True, help='output .npz path')
  parser.add_argument('--model', default='ViT-B-32-256', help='OpenCLIP model name')
  parser.add_argument('--pretrained', default='datacomp_s34b_b86k',
                      help='OpenCLIP pretrained tag (or a local checkpoint path)')
  parser.add_argument('--tasks', nargs='*', default=None,
                      help='subset of ' + ' '.join(zt.TASKS) + ' (default: all)')
  parser.add_argument('--device', default='cpu', help="torch device ('cpu', 'cuda', ...)")
  parser.add_argument('--force', action='store_true', help='overwrite an existing --out')
  args = parser.parse_args(argv)
  try:
    print(_build(args))
  except (ImportError, OSError, RuntimeError, ValueError) as e:  # ConfigError is a ValueError
    print('error: ' + ' '.join(str(e).split()), file=sys.stderr)
    return 2
  return 0


if __name__ == '__main__':
  sys.exit(main())
