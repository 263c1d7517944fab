"""Run validation: every bad config value or workdir is one ConfigError line before
anything is written; every config field is documented; the CLI prints one `error:` line.
"""

import glob
import json
import os
import subprocess
import sys

import ml_collections
import pytest

from conftest import snapshot

from fedjax_mtl import config_doc, validate
from fedjax_mtl.defaults import VARIANTS, base_config
from fedjax_mtl.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_FILES = sorted(glob.glob(os.path.join(ROOT, 'configs', '*.py')))


def smoke(algorithm='hca2', /, **values):
  """The smoke config of `algorithm` (with the blocks it uses), `values` set by dotted
  name as a Python user could (no type safety: the config is rebuilt from a plain
  dict; a block the config lacks starts at its declared defaults)."""
  c = base_config('smoke', algorithm)
  d = c.to_dict()
  blocks = validate.block_defaults()
  for name, value in values.items():
    *path, last = name.split('.')
    if path and path[0] not in d and path[0] in blocks:
      d[path[0]] = blocks[path[0]].to_dict()
    node = d
    for p in path:
      node = node[p]
    if value is DELETE:
      del node[last]
    else:
      node[last] = value
  return ml_collections.ConfigDict(d)


DELETE = object()




# --------------------------------------------------------------------------
# Documentation.
# --------------------------------------------------------------------------

@pytest.mark.parametrize('path', CONFIG_FILES, ids=os.path.basename)
def test_every_field_of_every_config_is_documented_and_valid(path, tmp_path):
  for variant in VARIANTS:
    config = config_doc.load_config(f'{path}:{variant}')
    names = validate.leaves(config)
    undocumented = [n for n in names if n not in validate.FIELDS]
    assert not undocumented, f'{path}:{variant}: declare {undocumented} (fields.Field)'
    text = config_doc.describe(config)
    assert len(text.splitlines()) == len(names)
    for name in names:
      assert validate.FIELDS[name].meaning.strip()
      assert f'\n{name} = ' in '\n' + text
    validate.check_config(config)
    if config.data.source == 'synthetic':  # paper: real data and weights not here
      validate.check_run(config, str(tmp_path / 'wd'))
  assert not (tmp_path / 'wd').exists()


def test_declarations_are_complete_and_their_defaults_valid(tmp_path):
  assert set(validate.FIELDS) == set(validate.defaults())
  for name, field in validate.FIELDS.items():
    assert field.meaning.strip() and '\n' not in field.meaning, name
    if field.choices is not None:
      assert field.default in field.valid_choices(), name
    if field.rule is not None and not field.per_dataset:
      assert field.rule.ok(field.default), name
  # Every block at its defaults passes validation where a run uses it (its algorithm,
  # wrapper or setting named), and sits unused at its defaults anywhere.
  from fedjax_mtl import algorithms
  for name, block in algorithms.blocks().items():
    spec = f'{name}(fedavg)' if name in algorithms.WRAPPERS else name
    config = base_config('mini8' if name == 'matu' else 'smoke', spec)
    assert all(b in config for b in algorithms.used_blocks(spec) if validate.blocks()[b].fields)
    validate.check_config(config)
    if block.fields:
      validate.check_config(smoke('local', **{f'{name}.{k}': v
                                              for k, v in block.defaults().items()}))
  # Registries that live in modules the declarations do not import stay equal to theirs.
  from fedjax_mtl import data, experiment
  from fedjax_mtl.data import real
  from fedjax_mtl.manytask import feed
  assert validate.FIELDS['data.source'].valid_choices() == data.SOURCES == experiment.DATA_SOURCES
  assert validate.FIELDS['data.augment'].valid_choices() == data.AUGMENT_MODES == real.AUGMENT_MODES
  assert validate.FIELDS['many.feed'].valid_choices() == feed.FEEDS
  from fedjax_mtl import engines
  assert validate.FIELDS['setting'].valid_choices() == engines.SETTINGS


def test_a_config_carries_only_the_blocks_of_what_it_uses():
  plugins = set(validate.blocks())
  assert {b for b in base_config('smoke', 'hca2') if b in plugins} == {'hca2'}
  assert {b for b in base_config('smoke', 'fedprox') if b in plugins} == {'fedprox', 'fedavg'}
  assert {b for b in base_config('smoke', 'dea(heal(fedavg))') if b in plugins} == {
      'dea', 'heal', 'fedavg'}
  assert {b for b in base_config('smoke', 'local') if b in plugins} == set()
  assert {b for b in base_config('mini8', 'matu') if b in plugins} == {'matu', 'many', 'fedavg'}


def test_config_doc_command_prints_defaults_and_meanings(capsys):
  assert config_doc.main(['config_doc', 'configs/fedprox.py:smoke']) == 0
  out = capsys.readouterr().out
  assert 'batch_size = 4  # training batch size of every client (batch_size >= 1)' in out
  assert "fedprox.mu = 0.01  # FedProx" in out and 'hca2.' not in out
  assert "fedprox.mu = 0.01  # FedProx proximal coefficient μ (mu >= 0) [sweepable]" in out
  assert 'batch_size >= 1) [sweepable]' not in out  # a structural field
  assert config_doc.main(['config_doc']) == 0
  out = capsys.readouterr().out
  assert 'hca2.alpha_init = 0.1  #' in out and 'matfl.th = 0.0  #' in out
  assert config_doc.main(['config_doc', 'configs/nope.py']) == 2
  err = capsys.readouterr().err
  assert err == "error: config file 'configs/nope.py' does not exist; e.g. --config=configs/hca2.py\n"


# --------------------------------------------------------------------------
# Bad values.
# --------------------------------------------------------------------------

BAD = [
    # (algorithm, {field: value}, text in the message)
    ('hca2', {'batch_size': 0}, 'batch_size=0 is out of range; valid range: batch_size >= 1'),
    ('hca2', {'batch_size': True}, 'batch_size=True has the wrong type; expected an int'),
    ('hca2', {'batch_size': 4.0}, 'batch_size=4.0 has the wrong type; expected an int'),
    ('hca2', {'eval_batch_size': 0}, 'eval_batch_size=0 is out of range'),
    ('hca2', {'num_rounds': 0}, 'num_rounds=0 is out of range; valid range: num_rounds >= 1'),
    ('hca2', {'num_rounds': -2}, 'num_rounds=-2 is out of range'),
    ('hca2', {'eval_every': 0}, 'eval_every=0 is out of range'),
    ('hca2', {'checkpoint_every': 0}, 'checkpoint_every=0 is out of range'),
    ('hca2', {'seed': -1}, 'seed=-1 is out of range; valid range: 0 <= seed < 2**32'),
    ('hca2', {'seed': 2**32}, 'seed=4294967296 is out of range'),
    ('hca2', {'split_seed': -1}, 'split_seed=-1 is out of range'),
    ('hca2', {'split': 'foo'}, "unknown split 'foo'; valid choices: 'equal', 'dirichlet'"),
    ('hca2', {'split_alpha': 0.0}, 'split_alpha=0.0 is out of range; valid range: '
     'split_alpha > 0'),
    ('hca2', {'split_alpha': -1.0}, 'split_alpha=-1.0 is out of range'),
    ('hca2', {'split_alpha': 'x'}, "split_alpha='x' has the wrong type; expected a number"),
    ('hca2', {'data.seed': -5}, 'data.seed=-5 is out of range'),
    ('hca2', {'num_devices': -1}, 'num_devices=-1 is out of range'),
    ('hca2', {'optim.lr': 0.0}, 'optim.lr=0.0 is out of range; valid range: lr > 0'),
    ('hca2', {'optim.lr': float('nan')}, 'optim.lr=nan is not a finite number'),
    ('hca2', {'optim.lr': float('inf')}, 'optim.lr=inf is not a finite number'),
    ('hca2', {'optim.lr': '1e-3'}, "optim.lr='1e-3' has the wrong type; expected a number"),
    ('hca2', {'optim.weight_decay': -1e-4}, 'optim.weight_decay=-0.0001 is out of range'),
    ('hca2', {'optim.b1': 1.0}, 'optim.b1=1.0 is out of range; valid range: 0 <= b1 < 1'),
    ('hca2', {'optim.b2': -0.1}, 'optim.b2=-0.1 is out of range'),
    ('hca2', {'optim.eps': 0.0}, 'optim.eps=0.0 is out of range'),
    ('hca2', {'optim.warmup_epochs': -1}, 'optim.warmup_epochs=-1 is out of range'),
    ('hca2', {'optim.min_lr': -1.0}, 'optim.min_lr=-1.0 is out of range'),
    ('hca2', {'local_epochs': {'pascal': 0, 'nyud': 1}},
     'local_epochs.pascal=0 is out of range; valid range: local_epochs >= 1'),
    ('hca2', {'local_epochs': 2}, 'local_epochs=2 has the wrong type; expected a dict'),
    ('hca2', {'local_epochs': {'pascl': 1}}, "unknown dataset 'pascl' in local_epochs"),
    ('hca2', {'data.num_train': {'pascal': 0, 'nyud': 16}}, 'data.num_train.pascal=0 is out'),
    ('hca2', {'data.num_test': {'pascal': 8}}, "data.num_test={'pascal': 8} has no entry for 'nyud'"),
    ('hca2', {'data.resolution': {'pascal': (32, 0), 'nyud': (32, 32)}},
     'data.resolution.pascal=(32, 0) is out of range'),
    ('hca2', {'data.resolution': {'pascal': (32, 32, 3), 'nyud': (32, 32)}},
     'data.resolution.pascal=(32, 32, 3) has the wrong type; expected a tuple of 2 ints'),
    ('hca2', {'data.chunk_steps': 0}, 'data.chunk_steps=0 is out of range'),
    ('hca2', {'data.workers': -1}, 'data.workers=-1 is out of range'),
    ('hca2', {'data.threads': -1}, 'data.threads=-1 is out of range'),
    ('hca2', {'eval_edge_ods': 'sometimes'},
     "unknown eval_edge_ods 'sometimes'; valid choices: 'every', 'final', 'off'"),
    ('hca2', {'eval_edge_ods': False}, 'eval_edge_ods=False has the wrong type; expected a '
     'string'),
    ('hca2', {'eval_ods_workers': -1}, 'eval_ods_workers=-1 is out of range'),
    ('hca2', {'data.source': 'disk'}, "unknown data.source 'disk'; valid choices: 'synthetic'"),
    ('hca2', {'data.augment': 'gpu'}, "unknown data.augment 'gpu'; valid choices: 'host'"),
    ('hca2', {'model.dtype': 'float16'}, "unknown model.dtype 'float16'; valid choices"),
    ('hca2', {'model.encoder': 'resnet9'}, "unknown model 'resnet9'; valid choices"),
    ('hca2', {'model.kwargs': {'embed_dims': 8}},
     "unknown model.kwargs argument 'embed_dims' of encoder 'conv_micro'"),
    ('hca2', {'model.kwargs': {'dtype': 'bfloat16'}}, "model.kwargs sets 'dtype'"),
    ('hca2', {'algorithm': 'fedfoo'}, "unknown algorithm 'fedfoo'"),
    ('hca2', {'scenario': 'nowhere'}, "unknown scenario 'nowhere'"),
    ('hca2', {'tasks': 'semseg,colour'}, "unknown task 'colour' in config.tasks"),
    ('hca2', {'nonexistent': 1}, "unknown config field 'nonexistent'"),
    ('hca2', {'optim.lrr': 1e-3}, "unknown config field 'optim.lrr'; did you mean 'optim.lr'"),
    ('hca2', {'hca2.ca_cc': 0.2}, "unknown config field 'hca2.ca_cc'; did you mean 'hca2.ca_c'"),
    ('hca2', {'batch_size': DELETE}, "the config has no field 'batch_size'"),
    ('hca2', {'hca2.alpha_init': 1.5}, 'hca2.alpha_init=1.5 is out of range; valid range: '
     '0 <= alpha_init <= 1'),
    ('hca2', {'hca2.beta_init': -0.1}, 'hca2.beta_init=-0.1 is out of range'),
    ('hca2', {'hca2.hyper_momentum': 1.0}, 'hca2.hyper_momentum=1.0 is out of range'),
    ('hca2', {'hca2.hyper_weight_decay': -1.0}, 'hca2.hyper_weight_decay=-1.0 is out of range'),
    ('hca2', {'hca2.encoder_agg': 'mean'}, "unknown hca2.encoder_agg 'mean'; valid choices"),
    ('hca2', {'hca2.homo': 1}, 'hca2.homo=1 has the wrong type; expected a bool'),
    ('matfl', {'matfl.th': -1.0}, 'matfl.th=-1.0 is out of range; valid range: th > -1'),
    ('matfl', {'matfl.mode': 'fuzzy'}, "unknown matfl.mode 'fuzzy'"),
    ('dea(fedavg)', {'dea.rescale': 'yes'}, "dea.rescale='yes' has the wrong type"),
    ('fedavg', {'model.pretrained_path': 'no/such/weights.npz'},
     "model.pretrained_path 'no/such/weights.npz' is not a file"),
    ('fedavg', {'data.source': 'real', 'data.data_dir': '/no/such/data'},
     "data dir '/no/such/data' does not exist"),
]


@pytest.mark.parametrize('algorithm, values, expected', BAD,
                         ids=[f'{a}-{",".join(v)}' for a, v, _ in BAD])
def test_bad_value_is_one_line_naming_field_and_value(algorithm, values, expected, tmp_path):
  config = smoke(algorithm, **values)
  with pytest.raises(ConfigError) as e:
    validate.check_run(config, str(tmp_path / 'wd'))
  message = str(e.value)
  assert '\n' not in message and expected in message, message
  assert not (tmp_path / 'wd').exists()


# The ranges and choices the algorithms' build() checked before they were declared.
BUILD_CHECKS = [
    ('fedprox', {'fedprox.mu': -1.0}, 'fedprox.mu=-1.0 is out of range; valid range: mu >= 0'),
    ('ditto', {'ditto.lam': -0.1}, 'ditto.lam=-0.1 is out of range; valid range: lam >= 0'),
    ('fedamp', {'fedamp.lam': -1.0}, 'fedamp.lam=-1.0 is out of range; valid range: lam >= 0'),
    ('fedamp', {'fedamp.alpha_k': 0.0}, 'fedamp.alpha_k=0.0 is out of range; valid range: '
     'alpha_k > 0'),
    ('fedamp', {'fedamp.sigma': 0.0}, 'fedamp.sigma=0.0 is out of range; valid range: sigma > 0'),
    ('fedbabu', {'fedbabu.finetune_rounds': 3}, 'fedbabu.finetune_rounds=3 is out of range; '
     'valid range: 0 <= finetune_rounds < num_rounds=3'),
    ('fedbabu', {'fedbabu.finetune_rounds': -1}, 'fedbabu.finetune_rounds=-1 is out of range'),
    ('fedsta', {'fedsta.task_specific_rounds': 5}, 'fedsta.task_specific_rounds=5 is out of '
     'range; valid range: 0 <= task_specific_rounds < num_rounds=3'),
    ('fedsta', {'fedsta.task_specific_rounds': -1}, 'fedsta.task_specific_rounds=-1 is out of'),
    ('feddyn', {'feddyn.alpha': 0.0}, 'feddyn.alpha=0.0 is out of range; valid range: alpha > 0'),
    ('moon', {'moon.mu': -1.0}, 'moon.mu=-1.0 is out of range; valid range: mu >= 0'),
    ('moon', {'moon.tau': 0.0}, 'moon.tau=0.0 is out of range; valid range: tau > 0'),
    ('fedacg', {'fedacg.lam': 1.0}, 'fedacg.lam=1.0 is out of range; valid range: 0 <= lam < 1'),
    ('fedacg', {'fedacg.beta': -1.0}, 'fedacg.beta=-1.0 is out of range; valid range: beta >= 0'),
    ('fedga', {'fedga.step_size': -0.1}, 'fedga.step_size=-0.1 is out of range; valid range: '
     'step_size >= 0'),
    ('matfl', {'matfl.num_clusters': 0}, 'matfl.num_clusters=0 is out of range; valid range: '
     'num_clusters >= 1'),
    ('matfl', {'matfl.mode': 'ward'}, "unknown matfl.mode 'ward'; valid choices: 'hard', 'soft'"),
    ('hca2', {'hca2.ca_c': 1.0}, 'hca2.ca_c=1.0 is out of range; valid range: 0 <= ca_c < 1'),
    ('hca2', {'hca2.hyper_lr': -1.0}, 'hca2.hyper_lr=-1.0 is out of range; valid range: '
     'hyper_lr >= 0'),
    ('hca2', {'hca2.decoder_agg': 'mean'}, "unknown hca2.decoder_agg 'mean'; valid choices"),
    ('fedavg', {'fedavg.weighting': 'size'}, "unknown fedavg.weighting 'size'; valid choices: "
     "'uniform', 'examples'"),
    ('momentum(fedavg)', {'momentum.momentum': 1.0}, 'momentum.momentum=1.0 is out of range; '
     'valid range: 0 <= momentum < 1'),
    ('momentum(fedavg)', {'momentum.lr': 0.0}, 'momentum.lr=0.0 is out of range; valid range: '
     'lr > 0'),
    ('dea(fedavg)', {'dea.rho': 0.0}, 'dea.rho=0.0 is out of range; valid range: 0 < rho <= 1'),
    ('dea(fedavg)', {'dea.rho': 1.5}, 'dea.rho=1.5 is out of range; valid range: 0 < rho <= 1'),
    ('dea(fedavg)', {'dea.variant': 'largest'}, "unknown dea.variant 'largest'; valid choices"),
    ('dea(fedavg)', {'dea.server_lr': 0.0}, 'dea.server_lr=0.0 is out of range; valid range: '
     'server_lr > 0'),
    ('heal(fedavg)', {'heal.tau': 1.0}, 'heal.tau=1.0 is out of range; valid range: '
     '0 <= tau < 1'),
    ('heal(fedavg)', {'heal.beta': 1.5}, 'heal.beta=1.5 is out of range; valid range: '
     '0 <= beta <= 1'),
    ('grouped(fedavg)', {'grouped.by': 'colour'}, "unknown grouped.by 'colour'; valid choices: "
     "'dataset', 'task'"),
    ('ntkfedavg', {'ntkfedavg.server_lr': 0.0}, 'ntkfedavg.server_lr=0.0 is out of range; '
     'valid range: server_lr > 0'),
    ('ntkfedavg', {'ntkfedavg.mu': -1.0}, 'ntkfedavg.mu=-1.0 is out of range; valid range: '
     'mu >= 0'),
    ('ntkfedavg', {'ntkfedavg.point': 'middle'}, "unknown ntkfedavg.point 'middle'; valid "
     "choices: 'server', 'pretrained'"),
    ('matu', {'matu.rho': -0.1}, 'matu.rho=-0.1 is out of range; valid range: 0 <= rho <= 1'),
    ('matu', {'matu.eps': 1.5}, 'matu.eps=1.5 is out of range; valid range: 0 <= eps <= 1'),
    ('matu', {'matu.kappa': 0}, 'matu.kappa=0 is out of range; valid range: kappa >= 1'),
    ('matu', {'matu.combine': 'mean'}, "unknown matu.combine 'mean'; valid choices: 'sum', 'avg'"),
    ('matu', {'matu.cross': 'all'}, "unknown matu.cross 'all'; valid choices"),
    ('matu', {'matu.tie': 'one'}, "unknown matu.tie 'one'; valid choices: 'emr', 'zero'"),
]


@pytest.mark.parametrize('algorithm, values, expected', BUILD_CHECKS,
                         ids=[f'{a}-{",".join(v)}' for a, v, _ in BUILD_CHECKS])
def test_plugin_ranges_are_validated_before_anything_is_built(algorithm, values, expected,
                                                              tmp_path):
  config = smoke(algorithm, **values)
  with pytest.raises(ConfigError) as e:
    validate.check_run(config, str(tmp_path / 'wd'))
  assert '\n' not in str(e.value) and expected in str(e.value), str(e.value)
  assert not (tmp_path / 'wd').exists()


def test_a_block_the_run_does_not_use_is_refused_unless_at_its_defaults(tmp_path):
  wd = str(tmp_path / 'wd')
  with pytest.raises(ConfigError, match=r"^config block 'dea' is not used by algorithm 'hca2' "
                     r"\(it applies to the dea\(...\) wrapper\) but sets dea.rho=0.5 \(default "
                     r"0.25\); remove the override, or use the block: "
                     r"--config.algorithm='dea\(hca2\)'$"):
    validate.check_run(smoke('hca2', **{'dea.rho': 0.5}), wd)
  # Out of range too: that the block does nothing comes first.
  with pytest.raises(ConfigError, match="config block 'dea' is not used"):
    validate.check_run(smoke('hca2', **{'dea.rho': 2.0}), wd)
  with pytest.raises(ConfigError, match=r"config block 'fedprox' is not used by algorithm "
                     r"'hca2' \(it applies to algorithm 'fedprox'\)"):
    validate.check_run(smoke('hca2', **{'fedprox.mu': 1.0}), wd)
  with pytest.raises(ConfigError, match=r"config block 'fedavg' is not used by algorithm "
                     r"'hca2' \(it applies to algorithms 'fedavg', 'fedprox', .* and heal"):
    validate.check_run(smoke('hca2', **{'fedavg.weighting': 'examples'}), wd)
  with pytest.raises(ConfigError, match=r"config block 'many' is not used by setting='dense' "
                     r"\(it applies to setting='many_task'\) but sets many.num_clients=3"):
    validate.check_run(smoke('hca2', **{'many.num_clients': 3}), wd)
  # At its defaults an unused block is ignored (a sweep's --config.algorithm on a
  # config built for another algorithm); so is one the config lists as spare.
  validate.check_run(smoke('hca2', **{'dea.rho': 0.25, 'fedprox.mu': 0.01}), wd)
  validate.check_run(smoke('hca2', **{'dea.rho': 0.5, 'spare_blocks': 'dea'}), wd)
  validate.check_run(smoke('dea(hca2)', **{'dea.rho': 0.5}), wd)
  with pytest.raises(ConfigError, match="unknown spare_blocks entry 'daa'; valid choices"):
    validate.check_run(smoke('hca2', spare_blocks='daa'), wd)
  with pytest.raises(ConfigError, match="setting='many_task' reads the many block, which "
                     'this config lacks'):
    validate.check_run(smoke('fedavg', setting='many_task'), wd)
  assert not (tmp_path / 'wd').exists()


def test_values_at_the_edges_of_their_ranges_pass(tmp_path):
  config = smoke('hca2', **{
      'seed': 2**32 - 1, 'optim.lr': 1, 'optim.b1': 0.0, 'optim.warmup_epochs': 0,
      'local_epochs': {'nyud': 1}, 'data.workers': 0, 'data.threads': 0,
      'data.resolution': {'pascal': [33, 47], 'nyud': (1, 1)},  # lists read like tuples
      'hca2.alpha_init': 1.0, 'hca2.beta_init': 0, 'model.kwargs': {'embed_dim': 8},
      'data.num_train': {'pascal': 1, 'nyud': 1}})  # small splits: build's to refuse
  validate.check_run(config, str(tmp_path / 'wd'))


# --------------------------------------------------------------------------
# Workdir and paths.
# --------------------------------------------------------------------------

def test_workdir_must_be_a_writable_directory_or_creatable(tmp_path, monkeypatch):
  config = smoke()
  f = tmp_path / 'file'
  f.write_text('x')
  with pytest.raises(ConfigError, match=r"workdir '.*file' is a file, not a directory"):
    validate.check_run(config, str(f))
  with pytest.raises(ConfigError, match=r"cannot create workdir '.*file/sub/wd': '.*file' is a "
                     'file$'):
    validate.check_run(config, str(f / 'sub' / 'wd'))
  with pytest.raises(ConfigError, match='workdir is empty'):
    validate.check_run(config, '')
  validate.check_run(config, str(tmp_path / 'a' / 'b'))  # creatable: fine, and not created
  assert sorted(os.listdir(tmp_path)) == ['file']
  # Permissions (root writes anywhere; this pins the branch, not the OS).
  ro = tmp_path / 'ro'
  ro.mkdir()
  monkeypatch.setattr(os, 'access', lambda p, mode: os.path.abspath(p) != str(ro))
  with pytest.raises(ConfigError, match=r"workdir '.*ro' is not writable"):
    validate.check_run(config, str(ro))
  with pytest.raises(ConfigError, match=r"cannot create workdir '.*ro/new': '.*ro' is not "
                     'writable'):
    validate.check_run(config, str(ro / 'new'))


def test_pretrained_path_is_needed_only_when_starting(tmp_path):
  config = smoke('fedavg', **{'model.pretrained_path': str(tmp_path / 'w.npz')})
  wd = tmp_path / 'wd'
  with pytest.raises(ConfigError, match='model.pretrained_path .* is not a file'):
    validate.check_run(config, str(wd))
  (wd / 'checkpoints' / '4').mkdir(parents=True)  # a resumed run loads no weights
  validate.check_run(config, str(wd))
  (tmp_path / 'w.npz').write_bytes(b'')
  validate.check_run(config, str(tmp_path / 'other'))


# --------------------------------------------------------------------------
# Δm reference.
# --------------------------------------------------------------------------

def make_reference(d, config=None, rounds=None, values=(40.0, 0.5)):
  """A Local run's workdir: config.json and metrics.jsonl with final eval rows."""
  config = config or smoke('local')
  rounds = config.num_rounds if rounds is None else rounds
  d.mkdir()
  (d / 'config.json').write_text(config.to_json_best_effort(indent=2))
  rows = [{'round': 0, 'type': 'meta'}, {'round': 1, 'type': 'train', 'loss': 1.0}]
  for (client, task, metric), v in zip([('pascal_st_semseg_0', 'semseg', 'mIoU'),
                                        ('nyud_mt_mt_0', 'depth', 'RMSE')], values):
    rows.append({'round': rounds, 'type': 'eval', 'client': client, 'dataset': 'x',
                 'task': task, 'metric': metric, 'value': v})
  (d / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  return str(d)


def test_delta_m_reference_is_a_finished_comparable_run(tmp_path):
  ref = make_reference(tmp_path / 'local')
  validate.check_run(smoke('hca2', delta_m_reference=ref), str(tmp_path / 'wd'))
  # Method hyper-parameters may differ from the reference's.
  validate.check_run(smoke('hca2', delta_m_reference=ref, num_rounds=9, batch_size=2,
                           **{'optim.lr': 0.1}), str(tmp_path / 'wd'))
  bad = {
      str(tmp_path / 'none'): 'is not a directory',
      str(tmp_path): 'holds no readable config.json',
      make_reference(tmp_path / 'other', smoke('local', scenario='pascal_st')):
          r'is a run of another setting \(fields: scenario\)',
      make_reference(tmp_path / 'data', smoke('local', **{'data.num_test': {
          'pascal': 4, 'nyud': 8}, 'data.resolution': {'pascal': (48, 48), 'nyud': (32, 32)}})):
          r'another setting \(fields: data.resolution, data.num_test\)',
      make_reference(tmp_path / 'edge', smoke('local', eval_edge_ods='off')):
          r'another setting \(fields: eval_edge_ods\)',
      make_reference(tmp_path / 'split', smoke('local', split='dirichlet')):
          r'another setting \(fields: split\)',
      make_reference(tmp_path / 'unfinished', rounds=2):
          r'has no final evaluation \(round 3\) in metrics.jsonl',
      make_reference(tmp_path / 'zero', values=(0.0, 0.5)):
          "has final value 0 for 'pascal_st_semseg_0/semseg mIoU↑'",
  }
  for path, expected in bad.items():
    with pytest.raises(ConfigError, match=expected):
      validate.check_run(smoke('hca2', delta_m_reference=path), str(tmp_path / 'wd'))
  assert not (tmp_path / 'wd').exists()


def test_delta_m_reference_shares_the_partition(tmp_path):
  # A Dirichlet partition is a function of split_alpha; equal chunks do not read it.
  ref = make_reference(tmp_path / 'dir', smoke('local', split='dirichlet', split_alpha=0.1))
  validate.check_delta_m_reference(smoke('hca2', delta_m_reference=ref, split='dirichlet',
                                         split_alpha=0.1))
  with pytest.raises(ConfigError, match=r'fields: split_alpha\)'):
    validate.check_delta_m_reference(smoke('hca2', delta_m_reference=ref, split='dirichlet'))
  with pytest.raises(ConfigError, match=r'fields: split, split_alpha\)'):
    validate.check_delta_m_reference(smoke('hca2', delta_m_reference=ref))
  ref = make_reference(tmp_path / 'eq', smoke('local', split_alpha=0.1))
  validate.check_delta_m_reference(smoke('hca2', delta_m_reference=ref))
  # A reference written before the fields existed split equally.
  old = json.loads(smoke('local').to_json_best_effort())
  del old['split'], old['split_alpha']
  (tmp_path / 'eq' / 'config.json').write_text(json.dumps(old))
  validate.check_delta_m_reference(smoke('hca2', delta_m_reference=ref, split_alpha=2.0))
  with pytest.raises(ConfigError, match=r'fields: split\)'):
    validate.check_delta_m_reference(smoke('hca2', delta_m_reference=ref, split='dirichlet'))


def test_split_is_refused_in_the_many_task_setting(tmp_path):
  config = base_config('mini8', 'fedavg')
  config.split = 'dirichlet'
  with pytest.raises(ConfigError, match=r"^split='dirichlet' partitions the dense setting's "
                     'clients; the many-task setting splits with many.class_split'):
    validate.check_run(config, str(tmp_path / 'wd'))
  assert not (tmp_path / 'wd').exists()


def test_delta_m_reference_of_an_older_version_and_real_data(tmp_path):
  old = json.loads(smoke('local').to_json_best_effort())
  del old['eval_edge_ods']  # a field added later: the old run had the default
  ref = make_reference(tmp_path / 'old')
  (tmp_path / 'old' / 'config.json').write_text(json.dumps(old))
  validate.check_delta_m_reference(smoke('hca2', delta_m_reference=ref))
  with pytest.raises(ConfigError, match=r'fields: eval_edge_ods'):
    validate.check_delta_m_reference(smoke('hca2', delta_m_reference=ref, eval_edge_ods='off'))
  # Δm compares the final evaluations: odsF with 'every' and 'final' alike. A reference
  # written when the field was a bool holds true ('every') or false ('off').
  validate.check_delta_m_reference(smoke('hca2', delta_m_reference=ref, eval_edge_ods='final'))
  for value, same in ((True, ('every', 'final')), (False, ('off',))):
    old['eval_edge_ods'] = value
    (tmp_path / 'old' / 'config.json').write_text(json.dumps(old))
    for mode in ('every', 'final', 'off'):
      cfg = smoke('hca2', delta_m_reference=ref, eval_edge_ods=mode)
      if mode in same:
        validate.check_delta_m_reference(cfg)
      else:
        with pytest.raises(ConfigError, match=r'fields: eval_edge_ods'):
          validate.check_delta_m_reference(cfg)
  # Real data comes from the caches: the synthetic sizes do not matter there.
  real = {'data.source': 'real', 'data.num_test': {'pascal': 1, 'nyud': 1}}
  ref = make_reference(tmp_path / 'real', smoke('local', **{'data.source': 'real'}))
  validate.check_delta_m_reference(smoke('hca2', delta_m_reference=ref, **real))


# --------------------------------------------------------------------------
# The command line (a few subprocesses: each costs seconds).
# --------------------------------------------------------------------------

def run_main(*args):
  return subprocess.run([sys.executable, '-m', 'fedjax_mtl.main', *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)


HCA2 = '--config=configs/hca2.py:smoke'


@pytest.mark.parametrize('args, expected', [
    ([HCA2, '--config.batch_size=0'], 'error: batch_size=0 is out of range; valid range: '
     'batch_size >= 1'),
    ([HCA2, '--config.nonexistent=1'], "error: unknown config field 'nonexistent'; python -m "
     'fedjax_mtl.config_doc configs/hca2.py:smoke lists the fields'),
    ([HCA2, '--config.optim.lrr=1'], "error: unknown config field 'optim.lrr'; did you mean "
     "'optim.lr'"),
    # A block the config does not carry: added by the override, refused as unused.
    ([HCA2, '--config.dea.rho=2'], "error: config block 'dea' is not used by algorithm 'hca2' "
     "(it applies to the dea(...) wrapper) but sets dea.rho=2.0 (default 0.25)"),
    ([HCA2, '--config.batch_size=abc'], 'error: --config.batch_size=abc: expected an int like '
     'the default 4'),
    (['--config=configs/nope.py'], "error: config file 'configs/nope.py' does not exist"),
])
def test_cli_bad_input_is_one_error_line_and_leaves_the_workdir(tmp_path, args, expected):
  wd = tmp_path / 'wd'
  wd.mkdir()
  (wd / 'notes.txt').write_text('keep me')
  r = run_main(*args, f'--workdir={wd}')
  assert r.returncode == 2, r.stderr[-3000:]
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(expected), r.stderr[-3000:]
  assert snapshot(wd) == {'notes.txt': b'keep me'}


def test_cli_workdir_that_is_a_file_and_help_listing_fields(tmp_path):
  f = tmp_path / 'file'
  f.write_text('x')
  r = run_main('--config=configs/local.py:smoke', f'--workdir={f}')
  assert r.returncode == 2 and r.stderr.strip().splitlines() == [
      f"error: workdir '{f}' is a file, not a directory; give another --workdir"], r.stderr
  assert f.read_text() == 'x'
  r = run_main('--config=configs/fedprox.py:smoke', '--help')
  assert 'fedprox.mu = 0.01  # FedProx' in r.stdout
  assert 'batch_size = 4  # training batch size of every client' in r.stdout
  assert '--workdir' in r.stdout  # absl's flags follow
