"""MaTU: unified task vectors with per-task masks and rescalers, a stateless server.

The many-task setting only (spec matu.md). Variants:
- `configs/matu.py` (= `:mini8`): the offline mini8 benchmark, 10 clients with
  one task each (ζ_t = 0, the Table 1 analogue), minutes on 2 CPU cores;
  `--config.many.zeta_t=0.5` is the Table 2 analogue (several tasks per client).
- `configs/matu.py:smoke`: seconds (4 clients, ζ_t = 0.5, 2 rounds, small data,
  random backbone).
- `configs/matu.py:paper,table=1|2`: the paper's Tables 1 / 2 (ViT-B/32 IN-21k,
  LoRA r = 16 at 224², the real 8 tasks from TFDS, N = 30, R = 100, ξ = 0.2,
  ζ_c = 0.1, ζ_t = 0 / 0.5, one local epoch, AdamW 1e-3, batch 32). Give the
  converted backbone (`scripts/convert_vit.py`) as `--config.many.pretrained=...`
  and the TFDS data dir as `--config.many.data_dir=...`.

`matu.combine`: 'sum' (Eq. 7 as printed, the default) or 'avg' (the Overview's
average); `matu.cross`: 'similarity', 'none', 'uniform' (Fig. 6b).
"""

from fedjax_mtl.algorithms.matu import default_config
from fedjax_mtl.defaults import VARIANTS, base_config, parse_arg

TABLES = ('1', '2')


def _setup(c, variant: str, table: str) -> None:
  m = c.many
  if variant == 'paper':
    if table not in TABLES:
      raise ValueError(f'unknown table {table!r} of configs/matu.py:paper; valid choices: '
                       + ', '.join(map(repr, TABLES)))
    m.benchmark, m.model, m.resolution, m.lora_rank = 'tfds8', 'vit_b32', 224, 16
    m.num_clients, m.participation, m.zeta_c = 30, 0.2, 0.1
    m.zeta_t = 0.0 if table == '1' else 0.5
    m.local_epochs, m.local_steps = 1, 0
    m.pretrained = 'vit_b32_in21k.npz'  # scripts/convert_vit.py output (spec §1.1)
    c.num_rounds, c.eval_every, c.checkpoint_every = 100, 10, 10
    c.batch_size, c.eval_batch_size = 32, 256
    c.optim.lr = 1e-3  # spec matu §4
  elif variant == 'smoke':
    m.num_clients, m.zeta_t, m.num_train, m.num_test = 4, 0.5, 96, 50
    m.pretrained, m.tasks = '', 'digits,digits_perm,shapes'
    c.num_rounds, c.eval_every, c.checkpoint_every = 2, 1, 1


def get_config(arg=None):
  variant, kv = parse_arg(arg)
  if variant not in VARIANTS:
    raise ValueError(f'unknown config variant {variant!r}; valid choices: '
                     + ', '.join(map(repr, VARIANTS)))
  table = kv.pop('table', '1')
  # Every variant is many-task: built on mini8's base, then adjusted.
  items = ','.join(['mini8'] + [f'{k}={v}' for k, v in kv.items()])
  c = base_config(items, algorithm='matu', setup=lambda c, v, kv: _setup(c, variant, table))
  c.matu = default_config()
  return c
