"""Shared config defaults; `configs/<algorithm>.py` start from `base_config(arg)`.

Variants by the config arg (`--config=configs/fedavg.py:paper`):
- default: the built-in synthetic benchmark with a tiny Swin (`swin_nano`),
  sized for a few minutes on 2 CPU cores;
- `smoke`: the default scenario shrunk to seconds per round (32x32 images, few
  images, 3 rounds, no normals, a one-block CNN) for smoke tests and CI;
- `paper`: the paper's setting (Swin-T, 100 rounds, batch 8, epochs 1/4,
  AdamW 1e-4, 5-epoch warm-up, real PASCAL-Context / NYUD-v2);
- `mini8`: the many-task classification setting (`setting='many_task'`, ViT +
  LoRA) on the offline mini8 benchmark, minutes on 2 CPU cores;
- `paper,table=1|2`: the many-task setting of MaTU's Tables 1 / 2 (ViT-B/32
  IN-21k with LoRA r = 16 at 224², the real 8 tasks from TFDS, N = 30, R = 100
  (MaT-FL 300), ξ = 0.2, ζ_c = 0.1, ζ_t = 0 / 0.5, one local epoch, AdamW 1e-3,
  batch 32, the round's samples gathered per round).
Extra `key=value` items after the variant override top-level fields, e.g.
`configs/hca2.py:paper,scenario=nyud_st_pascal_mt_1c`.
"""

from __future__ import annotations

import ml_collections


def parse_arg(arg: str | None) -> tuple[str, dict[str, str]]:
  """'paper,scenario=x' -> ('paper', {'scenario': 'x'})."""
  variant, kv = 'default', {}
  for item in (arg or '').split(','):
    item = item.strip()
    if not item:
      continue
    if '=' in item:
      k, v = item.split('=', 1)
      kv[k.strip()] = v.strip()
    else:
      variant = item
  return variant, kv


VARIANTS = ('default', 'smoke', 'paper', 'mini8')


PAPER_TABLES = ('1', '2')


def many_task_paper(c: ml_collections.ConfigDict, algorithm: str, table: str) -> None:
  """MaTU's Table 1 (single-task clients) or 2 (ζ_t = 0.5) setting (spec matu §1, §4)."""
  if table not in PAPER_TABLES:
    raise ValueError(f'unknown table {table!r} of the many-task paper setting; valid '
                     'choices: ' + ', '.join(map(repr, PAPER_TABLES)))
  mini8(c)
  m = c.many
  m.benchmark, m.model, m.resolution, m.lora_rank = 'tfds8', 'vit_b32', 224, 16
  m.num_clients, m.participation, m.zeta_c = 30, 0.2, 0.1
  m.zeta_t = 0.0 if table == '1' else 0.5
  m.local_epochs, m.local_steps = 1, 0
  m.pretrained = 'vit_b32_in21k.npz'  # scripts/convert_vit.py output (spec §1.1)
  m.feed = 'round'  # the 8 tasks at 224² are about 40 GB of uint8 images
  # MaT-FL trains 300 rounds, "the slowest convergence" (spec §1.3)
  c.num_rounds = 300 if algorithm == 'matfl' else 100
  c.eval_every, c.checkpoint_every = 10, 10
  c.batch_size, c.eval_batch_size = 32, 256
  c.optim.lr = 1e-3  # spec matu §4


def many_task_config(arg: str | None, algorithm: str, block, setup, key: str,
                     default: str) -> ml_collections.ConfigDict:
  """The config of an algorithm that runs in the many-task setting only (MaTU,
  NTKFedAvg for now): every variant is built on mini8's base with the
  algorithm's `block` ConfigDict, then `setup(config, variant, value, items)`
  adjusts it, where `value` is the arg's `key=` item (`default` when absent)
  and `items` the remaining `key=value` items it may consume."""
  variant, kv = parse_arg(arg)
  if variant not in VARIANTS:
    raise ValueError(f'unknown config variant {variant!r}; valid choices: '
                     + ', '.join(map(repr, VARIANTS)))
  if key != 'table' and 'table' in kv:
    raise ValueError(f"configs/{algorithm}.py takes {key}=, not table= (e.g. "
                     f"configs/{algorithm}.py:paper,{key}={default})")
  value = kv.pop(key, default)
  items = ','.join(['mini8'] + [f'{k}={v}' for k, v in kv.items()])

  def adjust(c, v, rest):
    c[algorithm] = block
    setup(c, variant, value, rest)

  return base_config(items, algorithm=algorithm, setup=adjust)


def mini8(c: ml_collections.ConfigDict) -> None:
  """The many-task setting on the offline mini8 benchmark (MaTU spec §1 scaled
  down): 10 clients, one task each (zeta_t = 0), Dirichlet(0.1) class splits, every
  client every round, one local epoch, the cached warm-up backbone, LoRA rank 8."""
  c.setting = 'many_task'
  c.num_rounds = 10
  c.eval_every = 5
  c.checkpoint_every = 5
  c.batch_size = 32
  c.eval_batch_size = 250
  # AdamW, no weight decay, constant within a round (spec matu §4); 3e-3 rather than
  # the spec's 1e-3 for ViT-B/32: the tiny backbone's adapters learn slowly at 1e-3.
  c.optim.lr = 3e-3
  c.optim.weight_decay = 0.0
  c.fedavg = ml_collections.ConfigDict({'weighting': 'examples'})  # |D_n^t| (spec §3)


def base_config(arg: str | None = None, algorithm: str = 'fedavg',
                setup=None) -> ml_collections.ConfigDict:
  """The base ConfigDict for `algorithm` in the variant named by `arg`.

  `setup(config, variant, items)`, if given, adjusts the variant's config before
  the arg's `key=value` items are applied; it may consume items of its own
  (removing them from `items`), e.g. `configs/feddea.py`'s `dataset=`.
  """
  variant, kv = parse_arg(arg)
  table = kv.pop('table', None)
  if table is not None and variant != 'paper':
    raise ValueError(f'table={table} goes with the paper variant (configs/<algorithm>.py:'
                     'paper,table=1|2); mini8 takes many.* overrides instead')
  if variant not in VARIANTS:
    raise ValueError(f'unknown config variant {variant!r}; valid choices: '
                     + ', '.join(map(repr, VARIANTS)))
  c = ml_collections.ConfigDict()
  c.algorithm = algorithm
  c.scenario = 'pascal_st_nyud_mt_1c'
  c.seed = 0
  c.tasks = ''  # comma-separated subset of the scenario's tasks ('' = all)
  c.split_seed = 0  # numpy seed of the client partition (released code: 0)
  c.parts_clients_humans_only = True  # released code keeps only images with humans

  c.data = ml_collections.ConfigDict()
  c.data.source = 'synthetic'  # or 'real': PASCAL-Context / NYUD-v2 caches
  # Real data: folder with PASCALContext/ and NYUDv2/ ('' = $FEDJAX_MTL_DATA_DIR)
  # and their caches from scripts/prepare_data.py ('' = <data_dir>/cache).
  c.data.data_dir = ''
  c.data.cache_dir = ''
  c.data.chunk_steps = 2  # local steps per streamed host->device chunk
  c.data.workers = 0  # grain worker processes for augmentation (0 = threads here)
  c.data.threads = 2  # grain reader threads when workers = 0
  # Where real-data training samples are augmented: 'host' (grain workers,
  # 40-50 images/s per core at 512x512) or 'device' (the host only decodes and
  # batches; data/device_augment.py applies the same transforms on the accelerator).
  c.data.augment = 'host'
  c.data.reproduce_parts_index_bug = False  # spec §1.11 bug 1, for comparability
  c.data.seed = 0
  c.data.resolution = {'pascal': (64, 64), 'nyud': (64, 64)}
  c.data.num_train = {'pascal': 400, 'nyud': 120}
  c.data.num_test = {'pascal': 100, 'nyud': 60}

  c.model = ml_collections.ConfigDict()
  # Tiny Swin (embed 16, one block per stage, window 4): the paper's encoder
  # family at a size whose 8-round run takes about 2 minutes on 2 CPU cores.
  c.model.encoder = 'swin_nano'
  # 'hca2': FedHCA2's decoder + head per task; 'deeplab': a DeepLab-v3 head per task
  # on the encoder's last stage (MaT-FL / NTKFedAvg benchmark A).
  c.model.decoder = 'hca2'
  c.model.head_width = 256  # decoder='deeplab': ASPP channels
  c.model.kwargs = {}
  c.model.dtype = 'float32'  # compute dtype ('bfloat16': bf16 compute, fp32 params)
  # Recompute each encoder block's forward in the backward pass: keeps one
  # activation per block instead of all of them (about one extra forward).
  c.model.remat = False
  c.model.pretrained_path = ''

  c.optim = ml_collections.ConfigDict()
  c.optim.name = 'adamw'  # or 'adam_amsgrad' (MaT-FL's Adam), 'sgd'
  c.optim.schedule = 'cosine'  # or 'round_decay': lr * round_decay^round (MaT-FL)
  c.optim.round_decay = 0.99
  c.optim.reset_each_round = False
  c.optim.lr = 2e-3
  c.optim.weight_decay = 1e-4
  c.optim.b1 = 0.9
  c.optim.b2 = 0.999
  c.optim.eps = 1e-8
  c.optim.momentum = 0.0  # sgd only
  c.optim.warmup_epochs = 1
  c.optim.warmup_lr_init = 1.25e-7
  c.optim.min_lr = 1.25e-6

  c.local_epochs = {'pascal': 1, 'nyud': 4}
  c.batch_size = 8
  c.eval_batch_size = 20
  c.num_rounds = 8
  c.eval_every = 4
  # Saliency: 'maxF' (FedHCA2's pooled F-beta) or 'mIoU' (MaT-FL's max over thresholds of
  # the per-image Jaccard: NTKFedAvg's benchmark A).
  c.sal_metric = 'maxF'
  c.eval_edge_ods = True  # edge odsF (host-side matching); False: edge BCE test loss
  c.checkpoint_every = 1
  c.delta_m_reference = ''  # workdir of a Local run: results tables get Δm against it
  c.num_devices = 0  # 0: all visible devices
  c.progress = True
  # Multi-process runs (fedjax_mtl/distributed.py): empty = the environment or one process.
  from fedjax_mtl import distributed
  c.distributed = distributed.config_block()
  c.tensorboard = False  # also write TensorBoard event files to <workdir>/tensorboard
  # FedDEA's unified model for task-level clients ('literal' / 'owner', spec
  # feddea §6 A1); 'none' is the hetero-client engine.
  c.unified = 'none'
  # Hyper-parameters of the algorithm wrappers (used when `algorithm` names
  # them, e.g. 'momentum(fedavg)'; see fedjax_mtl/algorithms/__init__.py).
  from fedjax_mtl import algorithms
  c.momentum = algorithms.momentum_config()
  c.dea = algorithms.dea_config()
  c.heal = algorithms.heal_config()
  c.grouped = algorithms.grouped_config()
  # 'dense': hetero-client dense prediction (FedHCA2's setting); 'many_task': ViT +
  # LoRA classification with many-task clients (the `many` block, fedjax_mtl/manytask).
  c.setting = 'dense'
  from fedjax_mtl.manytask import setting as many_setting
  c.many = many_setting.default_config()

  if variant == 'smoke':
    c.data.resolution = {'pascal': (32, 32), 'nyud': (32, 32)}
    c.data.num_train = {'pascal': 80, 'nyud': 16}
    c.data.num_test = {'pascal': 8, 'nyud': 8}
    # Normals are left out: their loss normalises near-zero initial
    # predictions, which turns float rounding differences between device
    # layouts into visible parameter differences within a few steps.
    c.tasks = 'semseg,human_parts,sal,edge,depth'
    # The small CNN with one block keeps smoke runs' compile time short.
    c.model.encoder = 'conv_micro'
    c.model.kwargs = {'depths': (1, 0, 0, 0)}
    c.batch_size = 4
    c.eval_batch_size = 8
    c.local_epochs = {'pascal': 1, 'nyud': 2}
    c.num_rounds = 3
    c.eval_every = 2
  if variant == 'paper' and table is not None:
    many_task_paper(c, algorithm, table)
  elif variant == 'paper':
    c.data.source = 'real'
    c.data.resolution = {'pascal': (512, 512), 'nyud': (448, 576)}
    c.model.encoder = 'swin_t'
    c.model.pretrained_path = 'weights/swin_t_upernet_ade20k.npz'
    c.optim.lr = 1e-4
    c.optim.warmup_epochs = 5
    c.num_rounds = 100
    c.eval_batch_size = 8
    c.eval_every = 4
    c.checkpoint_every = 4
    c.data.workers = 8
    # Host-side odsF costs about 10 ms per 64x64 image, so roughly 0.5 s per
    # PASCAL test image per edge client at full size: evaluations report the
    # edge BCE proxy (as the released training loop does) unless
    # eval_edge_ods=True.
    c.eval_edge_ods = False
  if variant == 'mini8':
    mini8(c)
  if setup is not None:
    setup(c, variant, kv)
  for k, v in kv.items():
    if k not in c:
      raise ValueError(f'unknown config field {k!r} in config arg')
    c[k] = type(c[k])(v) if not isinstance(c[k], bool) else v.lower() in ('1', 'true')
  return c
