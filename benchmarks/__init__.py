"""Benchmarks of fedjax_mtl, one module per subject (`python -m benchmarks --only=NAME`,
or `python scripts/bench.py --only=NAME`; results in BENCHMARKS.md):

- `engine`: engine rounds, every algorithm's round and local step, the round's
  aggregation as the engine calls it, a round's cross-device collectives.
- `rules`: server rules at the paper's scale, FedHCA2's aggregation.
- `models`: Swin-T local step, MFU, Swin-T / ResNet-18 step memory, ViT-B/32 LoRA
  step, conv steps in a scan.
- `feddea`: the top-ρ mask, the FedDEA aggregation in the engine, the unified
  round's memory.
- `many_task`: MaTU's server and client side, the many-task round's memory,
  NTKFedAvg's server-α grid.
- `pipeline`: the training input pipeline, host against device augmentation.
- `multihost`: two processes against one, the Flower simulation engine.
- `gpu`: one client's step of every paper configuration (MFU, memory), and
  NTKFedAvg's linearised step.
- `common`: shared helpers (timing, peak memory, configs, logs); `torch_compare`:
  interleaved timing against the PyTorch reference (scripts/compare_torch.py).

Not part of the installed package: run from the repository root (tests put it on
the path through pytest's `pythonpath`).
"""
