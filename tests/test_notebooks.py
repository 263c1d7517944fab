"""notebooks/: stored without outputs, Colab-ready, and every one executed on tiny settings.

Each notebook has one cell tagged `parameters`; the test inserts a cell after it that
sets the tiny values (as papermill does) and runs the whole notebook in a fresh
kernel with nbclient: a failing cell fails the test. The runs use the smoke configs
other tests also run, so their programs come from the shared XLA cache.
"""

from __future__ import annotations

import glob
import json
import os
import re
import tomllib

import nbclient
import nbformat
import numpy as np
import pytest

import test_convert
from fake_datasets import make_nyud, make_pascal

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(os.path.basename(p)[:-len('.ipynb')]
                   for p in glob.glob(os.path.join(ROOT, 'notebooks', '*.ipynb')))


def _repository() -> str:
  with open(os.path.join(ROOT, 'pyproject.toml'), 'rb') as f:
    return tomllib.load(f)['project']['urls']['Repository']


def _read(name: str):
  return nbformat.read(os.path.join(ROOT, 'notebooks', f'{name}.ipynb'), as_version=4)


def execute(name: str, **params) -> nbformat.NotebookNode:
  """Run notebook `name` with `params` set after its parameters cell; the executed
  notebook (CellExecutionError on a failing cell)."""
  nb = _read(name)
  at = [i for i, c in enumerate(nb.cells) if 'parameters' in c.metadata.get('tags', [])]
  assert len(at) == 1, f'{name}: expected one cell tagged "parameters", found {len(at)}'
  lines = [f'{k} = {v!r}' for k, v in params.items()]
  nb.cells.insert(at[0] + 1, nbformat.v4.new_code_cell('\n'.join(lines)))
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name='python3',
                                   resources={'metadata': {'path': os.path.join(ROOT, 'notebooks')}})
  client.execute()
  return nb


def outputs(nb, kind: str) -> list:
  """Every output of `kind` ('text/markdown', 'image/png', 'stream') in order."""
  out = []
  for c in nb.cells:
    for o in c.get('outputs', []):
      if kind == 'stream' and o.output_type == 'stream':
        out.append(o.text)
      elif kind in o.get('data', {}):
        out.append(o.data[kind])
  return out


def test_every_seed_system_has_its_notebook():
  assert set(NOTEBOOKS) == {'quickstart', 'fedhca2_paper', 'feddea_rho_sweep', 'matu_mini8',
                            'ntkfedavg_unlearning'}


@pytest.mark.parametrize('name', NOTEBOOKS)
def test_stored_without_outputs_and_opens_in_colab(name):
  nb = _read(name)
  nbformat.validate(nb)
  for c in nb.cells:
    if c.cell_type == 'code':
      assert c.outputs == [] and c.execution_count is None, f'{name}: outputs stored in git'
  repo = _repository()
  owner_repo = repo.removeprefix('https://github.com/')
  badge = f'https://colab.research.google.com/github/{owner_repo}/blob/main/notebooks/{name}.ipynb'
  assert badge in nb.cells[0].source, f'{name}: the first cell lacks its Colab badge'
  assert badge in open(os.path.join(ROOT, 'README.md')).read(), f'README lacks the badge of {name}'
  code = '\n'.join(c.source for c in nb.cells if c.cell_type == 'code')
  assert f"REPO_URL = '{repo}'" in code  # the Colab cell clones this repository
  assert 'notebook.setup()' in code


def test_quickstart_runs_fedhca2_and_local_and_shows_their_comparison(tmp_path):
  out = str(tmp_path / 'quick')
  # Two of the three methods: FedAvg adds compile time, not coverage.
  nb = execute('quickstart', VARIANT='smoke', METHODS='local,fedhca2', OUT=out)
  table = outputs(nb, 'text/markdown')[0]
  rows = {l.split('|')[1].strip() for l in table.splitlines()[2:]}
  assert rows == {'local', 'fedhca2'}
  assert 'Δm (%)' in table
  assert len(outputs(nb, 'image/png')) == 3  # the curves, α and β
  alpha = [json.loads(l) for l in open(f'{out}/fedhca2/seed0/metrics.jsonl')]
  assert any(r.get('type') == 'agg' and r.get('alpha') for r in alpha)


def test_paper_notebook_builds_caches_converts_and_runs(tmp_path):
  data = tmp_path / 'drive'
  make_pascal(str(data / 'PASCALContext'), ids=[f'2008_{i:06d}' for i in range(1, 21)],
              num_val=3)
  make_nyud(str(data / 'NYUDv2'), ids=[f'{i:04d}' for i in range(1, 7)])
  ckpt = str(tmp_path / 'upernet_swin_nano.npz')  # a random swin_nano in mmseg naming
  np.savez(ckpt, **{'backbone.' + k: v for k, v in test_convert._mmseg_sd(0).items()})
  out = str(tmp_path / 'run')
  nb = execute('fedhca2_paper', CONFIG='configs/fedavg.py:paper', DATA_ROOT=str(data), CHECKPOINT=ckpt, ENCODER='swin_nano',
               CACHE_DIR=str(tmp_path / 'cache'), OUT=out, WORKERS=0,
               OVERRIDES={'data.resolution': {'pascal': (64, 64), 'nyud': (32, 64)},
                          'batch_size': 2, 'eval_batch_size': 2, 'num_rounds': 1,
                          'eval_every': 1, 'data.workers': 0, 'tasks': 'semseg,depth',
                          # the smoke CNN keeps the compile short: Swin's train step takes
                          # about a minute to compile here (the converted weights are checked
                          # below; loading them is tested in test_engine and test_convert)
                          'model.encoder': 'conv_micro', 'model.kwargs': {'depths': (1, 0, 0, 0)},
                          'model.pretrained_path': '', 'local_epochs': {'pascal': 1, 'nyud': 1}})
  for d in ('pascal_train', 'pascal_val', 'nyud_train', 'nyud_val'):
    assert os.path.isfile(tmp_path / 'cache' / d / 'COMPLETE')
  assert os.path.isfile(tmp_path / 'cache' / 'swin_nano.npz')
  table = outputs(nb, 'text/markdown')[0]
  assert re.search(r'semseg mIoU', table) and 'depth' in table
  weights = np.load(tmp_path / 'cache' / 'swin_nano.npz')
  assert 'stages_0/blocks_0/attn/qkv/kernel' in weights.files  # flax names, converted
  config = json.load(open(f'{out}/config.json'))
  assert config['data']['source'] == 'real' and config['data']['cache_dir'] == str(tmp_path / 'cache')


def test_feddea_notebook_sweeps_rho_and_prints_the_mask_logs(tmp_path):
  out = str(tmp_path / 'rho')
  # ρ = 1/4 and 2 rounds: the config of test_feddea's smoke run (its programs are cached)
  nb = execute('feddea_rho_sweep', CONFIG='configs/feddea.py:smoke num_rounds=2', RHOS='0.25',
               OUT=out)
  assert len(outputs(nb, 'image/png')) == 1
  table = outputs(nb, 'text/markdown')[0]
  assert '0.25' in table and 'Δm' in table
  logs = ''.join(outputs(nb, 'stream'))
  assert re.search(r'round 1: energy \[[\d.]+, ', logs) and 'amplification' in logs


# mini8 shrunk as tests/test_manytask.py's tiny() does it.
TINY_MANY = ('num_rounds=2 eval_every=1 batch_size=8 eval_batch_size=16 many.model=vit_micro '
             'many.resolution=16 many.lora_rank=2 many.num_train=48 many.num_test=20 '
             'many.pretrained=')


def test_matu_notebook_writes_the_table_1_layout(tmp_path):
  out = str(tmp_path / 'matu')
  nb = execute('matu_mini8', TASKS='digits,digits_perm,shapes', SET=TINY_MANY, OUT=out)
  table = outputs(nb, 'text/markdown')[0]
  rows = {l.split('|')[1].strip() for l in table.splitlines()[2:]}
  assert rows == {'individual', 'fedavg', 'matu'}
  assert 'normalised avg' in table and 'bits/task' in table
  assert len(outputs(nb, 'image/png')) == 1


def test_unlearning_notebook_negates_the_target_client(tmp_path):
  out = str(tmp_path / 'unlearn')
  nb = execute('ntkfedavg_unlearning', VARIANT='smoke', ROUNDS=2, METHODS='ntkfedavg', OUT=out)
  assert len(outputs(nb, 'image/png')) == 1
  table = outputs(nb, 'text/markdown')[0]
  assert 'ntkfedavg' in table and 'digits' in table
