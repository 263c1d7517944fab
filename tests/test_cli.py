"""The command line: a smoke run with progress output, and bad input.

Bad input must give one `error: ...` line naming the problem and the valid
choices, a non-zero exit code, and leave an existing workdir untouched.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import jax
import pytest

from conftest import tiny_config, snapshot
from fedjax_mtl import experiment, train, workdir
from fedjax_mtl.checkpoint import Checkpointer
from fedjax_mtl.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_main(*args, workdir):
  return subprocess.run(
      [sys.executable, '-m', 'fedjax_mtl.main', *args, f'--workdir={workdir}'],
      cwd=ROOT, capture_output=True, text=True, timeout=600)




def test_smoke_run_prints_progress_and_summaries(tmp_path):
  wd = tmp_path / 'wd'
  r = run_main('--config=configs/local.py:smoke', workdir=wd)
  assert r.returncode == 0, r.stderr[-2000:]
  # stderr: the compile phase, then the rounds bar (algorithm, clients, rounds, ETA).
  # The evaluation (first at round 2) compiles in the background during round 1.
  assert re.search(r'^compiling 5 programs \(train pascal x4, .*\); evaluate in the '
                   r'background; cached in ', r.stderr, re.M)
  assert re.search(r'^compiled in [\d.]+s \(train pascal x4 [\d.]+s, ', r.stderr, re.M)
  assert 'local 5 clients' in r.stderr and '3/3 rounds' in r.stderr and 'done]' in r.stderr
  lines = [l for l in r.stdout.splitlines() if l.startswith('round ')]
  assert [l.split()[1] for l in lines] == ['1/3', '2/3', '3/3']
  assert 'train loss' in lines[0] and 'eval' in lines[1] and 'mIoU' in lines[1]
  for f in ('config.json', 'metrics.jsonl', 'results.md', 'results.csv'):
    assert (wd / f).exists()
  # Re-running the finished run resumes from its last checkpoint: no round is redone.
  before = (wd / 'metrics.jsonl').read_text()
  r2 = run_main('--config=configs/local.py:smoke', workdir=wd)
  assert r2.returncode == 0 and not [l for l in r2.stdout.splitlines() if l.startswith('round ')]
  assert (wd / 'metrics.jsonl').read_text() == before


@pytest.mark.parametrize('override, expected', [
    ('--config.algorithm=fedfoo', "unknown algorithm 'fedfoo'; valid choices: 'local', 'fedavg', 'fedprox'"),
    ('--config.scenario=nowhere', "unknown scenario 'nowhere'; valid choices: 'pascal_st_nyud_mt_1c'"),
    ('--config.model.encoder=resnet9', "unknown model 'resnet9'; valid choices: 'conv_micro'"),
    ('--config.tasks=semseg,colour', "unknown task 'colour' in config.tasks; valid choices:"),
    ('--config.data.augment=gpu', "unknown data.augment 'gpu'; valid choices: 'host', 'device'"),
])
def test_unknown_names_give_one_error_line(tmp_path, override, expected):
  wd = tmp_path / 'wd'
  wd.mkdir()
  (wd / 'notes.txt').write_text('keep me')
  r = run_main('--config=configs/fedavg.py:smoke', override, workdir=wd)
  assert r.returncode == 2
  errors = [l for l in r.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and expected in errors[0], r.stderr[-2000:]
  assert snapshot(wd) == {'notes.txt': b'keep me'}


@pytest.mark.parametrize('config, override, expected', [
    ('fedavg', '--config.algorithm=dea(local)', "'local' shares no parameters"),
    ('fedprox', '--config.fedprox.mu=-1', 'fedprox.mu=-1.0 is out of range; valid range: mu >= 0'),
    ('matfl', '--config.matfl.num_clusters=9', 'matfl.num_clusters=9 is out of range'),
])
def test_bad_algorithm_settings_give_one_error_line(tmp_path, config, override, expected):
  wd = tmp_path / 'wd'
  r = run_main(f'--config=configs/{config}.py:smoke', override, workdir=wd)
  assert r.returncode == 2
  errors = [l for l in r.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and expected in errors[0], r.stderr[-2000:]
  assert not wd.exists()


def test_impossible_split_and_missing_data_dir(tmp_path):
  with pytest.raises(ConfigError, match=r'impossible split: 4 ST clients on .pascal. but only 3'):
    train.train_and_evaluate(tiny_config(**{'data.num_train': {'pascal': 3, 'nyud': 16}}),
                             str(tmp_path / 'a'))
  with pytest.raises(ConfigError, match=r'data dir .*/missing. does not exist'):
    train.train_and_evaluate(
        tiny_config(**{'data.source': 'real', 'data.data_dir': str(tmp_path / 'missing')}),
        str(tmp_path / 'b'))
  assert not (tmp_path / 'a').exists() and not (tmp_path / 'b').exists()


def test_mismatched_workdir_and_checkpoint_are_refused_without_loss(tmp_path):
  cfg = tiny_config()
  wd = str(tmp_path / 'wd')
  exp = experiment.build(cfg)
  ckpt = Checkpointer(os.path.join(wd, 'checkpoints'))
  ckpt.save(1, experiment.init_state(exp))
  ckpt.close()
  with open(os.path.join(wd, 'config.json'), 'w') as f:
    f.write(cfg.to_json_best_effort(indent=2))
  with open(os.path.join(wd, 'metrics.jsonl'), 'w') as f:
    f.write(json.dumps({'round': 1, 'type': 'train'}) + '\n')
  before = snapshot(wd)
  other = tiny_config(**{'model.kwargs': {'embed_dim': 8}})
  with pytest.raises(ConfigError, match=r'holds a run with a different config \(fields: model\)'):
    train.train_and_evaluate(other, wd)
  assert snapshot(wd) == before
  # Without the saved config, the checkpoint itself is checked against the model.
  os.remove(os.path.join(wd, 'config.json'))
  before = snapshot(wd)
  with pytest.raises(ConfigError, match=r'checkpoint .* does not match the config'):
    train.train_and_evaluate(other, wd)
  assert snapshot(wd) == before


def test_workdir_of_an_older_version_resumes_when_new_fields_keep_defaults(tmp_path):
  cfg = tiny_config()
  old = json.loads(cfg.to_json_best_effort())
  del old['data']['augment']  # a field this version added
  (tmp_path / 'config.json').write_text(json.dumps(old))
  workdir.check_config(cfg, str(tmp_path))  # the default: the old run behaved the same
  other = tiny_config(**{'data.augment': 'device'})
  with pytest.raises(ConfigError, match=r'different config \(fields: data\)'):
    workdir.check_config(other, str(tmp_path))
  # Older versions wrote every wrapper's block and the many-task block into every
  # config: at their defaults they match a config that carries only what it uses.
  from fedjax_mtl import algorithms
  from fedjax_mtl.manytask import setting
  every = dict(old, momentum=algorithms.momentum_config().to_dict(),
               dea=algorithms.dea_config().to_dict(), heal=algorithms.heal_config().to_dict(),
               grouped=algorithms.grouped_config().to_dict(),
               many=setting.default_config().to_dict())
  (tmp_path / 'config.json').write_text(json.dumps(every))
  workdir.check_config(cfg, str(tmp_path))
  every['dea']['rho'] = 0.5
  (tmp_path / 'config.json').write_text(json.dumps(every))
  with pytest.raises(ConfigError, match=r'different config \(fields: dea\)'):
    workdir.check_config(cfg, str(tmp_path))
  # An algorithm block a config file added since, at its defaults, matches too; the
  # retired 'masked' block (now 'dea') matters only to a run whose algorithm named it.
  from fedjax_mtl.algorithms import fedacg
  old['masked'] = {'rho': 0.3, 'rescale': True}
  (tmp_path / 'config.json').write_text(json.dumps(old))
  new = tiny_config()
  new.fedacg = fedacg.default_config()
  workdir.check_config(new, str(tmp_path))
  new.fedacg.lam = 0.5
  with pytest.raises(ConfigError, match=r'different config \(fields: fedacg\)'):
    workdir.check_config(new, str(tmp_path))
  old['algorithm'] = 'masked(fedavg)'
  (tmp_path / 'config.json').write_text(json.dumps(old))
  with pytest.raises(ConfigError, match=r'different config \(fields: algorithm, masked\)'):
    workdir.check_config(tiny_config(), str(tmp_path))
