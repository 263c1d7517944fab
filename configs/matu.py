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
- `table=` also on mini8 (`configs/matu.py:mini8,table=2`): `2` is ζ_t = 0.5;
  `fig5,k=K` gives every client exactly K tasks (N = 10, ξ = 1); `fig6a,conflict=C,
  relatedness=FILE` gives the clients Fig. 6a's groups of 3 tasks spanning C = 0, 2
  or 3 of the task clusters in FILE (`scripts/task_relatedness.py`), `fig6b` the
  same groups for the cross-task ablation (`--config.matu.cross=none|uniform`);
  on `paper` these run 300 rounds on the 8 real tasks.
- `configs/matu.py:paper,table=fig4` (N = 30, ζ_t = 0.2) and `paper,table=fig5,k=K`
  (N = 10, K tasks per client) run 300 rounds on the 30-task benchmark
  (`many.benchmark='folder30'`: ImageFolder trees in `many.data_dir`,
  `fedjax_mtl/data/folder30.py`), κ = 5.
  `scripts/matu_figures.py` runs the Fig. 5 / 6 sweeps and plots them.

`matu.combine`: 'sum' (Eq. 7 as printed, the default) or 'avg' (the Overview's
average); `matu.cross`: 'similarity', 'none', 'uniform' (Fig. 6b).
"""

from fedjax_mtl.algorithms.matu import default_config
from fedjax_mtl.defaults import many_task_config, many_task_paper

TABLES = ('1', '2', 'fig4', 'fig5', 'fig6a', 'fig6b')


def _groups(items: dict) -> tuple[str, list[str]]:
  """`many.client_tasks` of Fig. 6a's conflict level `conflict` (0, 2, 3) from the
  task clusters in `relatedness` (scripts/task_relatedness.py's relatedness.json)."""
  import json
  import os
  from fedjax_mtl.manytask import allocation
  path = items.pop('relatedness', '')
  if not os.path.isfile(path):
    raise ValueError(f'fig6a/fig6b need relatedness=<relatedness.json of '
                     f'scripts/task_relatedness.py> (the task clusters); got {path!r}')
  with open(path) as f:
    clusters = json.load(f)['clusters']
  groups = allocation.conflict_groups(clusters, int(items.pop('conflict', '0')), 10)
  return ';'.join('+'.join(g) for g in groups), sorted({t for g in groups for t in g})


def _setup(c, variant: str, table: str, items: dict) -> None:
  m = c.many
  if table == 'fig4' and variant != 'paper':
    raise ValueError('table=fig4 (30 tasks, 30 clients) is a paper table: '
                     'configs/matu.py:paper,table=fig4')
  if table not in TABLES:
    raise ValueError(f'unknown table {table!r} of configs/matu.py; valid choices: '
                     + ', '.join(map(repr, TABLES)))
  if variant == 'paper':  # the Table 1 setting, then the table's changes below
    many_task_paper(c, 'matu', '1')
  elif variant == 'smoke':
    m.num_clients, m.zeta_t, m.num_train, m.num_test = 4, 0.5, 96, 50
    m.pretrained, m.tasks = '', 'digits,digits_perm,shapes'
    c.num_rounds, c.eval_every, c.checkpoint_every = 2, 1, 1
  if table == '2':
    m.zeta_t = 0.5
  elif table.startswith('fig'):  # Figs. 4-6: every client every round (N = 10; fig4 30)
    m.num_clients, m.participation = 10, 1.0
    if variant == 'paper':
      c.num_rounds, c.eval_every, c.checkpoint_every = 300, 25, 25
      if table in ('fig4', 'fig5'):  # the 30-task benchmark, κ = 5 (spec §4)
        m.benchmark = 'folder30'
        c.matu.kappa = 5
    if table == 'fig4':
      m.num_clients, m.zeta_t = 30, 0.2
    elif table == 'fig5':
      m.tasks_per_client = int(items.pop('k', '2'))
    else:
      m.client_tasks, held = _groups(items)
      m.tasks = ','.join(held)


def get_config(arg=None):
  return many_task_config(arg, 'matu', default_config(), _setup, 'table', '1')
