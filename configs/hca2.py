"""FedHCA2 (the main job): conflict-averse encoders, cross-attention decoders, learned α/β.

`configs/hca2.py` runs the synthetic `pascal_st_nyud_mt_1c` benchmark in a few
minutes on 2 CPU cores; `configs/hca2.py:paper` is the paper's setting (Swin-T,
real PASCAL-Context / NYUD-v2, 100 rounds, batch 8, epochs 1/4, AdamW 1e-4 with a
5-epoch warm-up). Ablations: `--config.hca2.encoder_agg=fedavg|none`,
`--config.hca2.decoder_agg=fedavg|none`, `--config.hca2.ca_c=...`,
`--config.hca2.alpha_init=...`, `--config.hca2.beta_init=...`, `--config.hca2.hyper_lr=...`.
"""

from fedjax_mtl.defaults import base_config


def get_config(arg=None):
  return base_config(arg, algorithm='hca2')  # with its block config.hca2 at the defaults
