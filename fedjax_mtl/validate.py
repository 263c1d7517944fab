"""Run validation: every config field's meaning, type and range in one table.

`check_run(config, workdir)` finds a bad value before anything is written and
raises `ConfigError` with one line naming the field, the value and the valid
range or choices. `FIELDS` documents every field (`python -m
fedjax_mtl.config_doc` prints it); a field's type is its default's type
(`defaults.base_config()`, or the algorithm block's `default_config()`).

Ranges the algorithms' `build()` already checks with a ConfigError (hca2.ca_c,
fedprox.mu, ditto.lam, fedamp.*, fedbabu/fedsta round counts, matfl.num_clusters,
momentum.*, dea.rho, dea.server_lr, heal.*, feddyn.alpha, moon.*, fedacg.*, fedga.*) are
left to them: `experiment.build` runs before the first write too. Impossible
client splits and missing data caches are also found there (they depend on the
data).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import numbers
import os
import sys
from typing import Any, Callable, Mapping

from fedjax_mtl.errors import ConfigError, check_choice


@dataclasses.dataclass(frozen=True)
class Rule:
  """A valid range: `ok(value)`, and `text` with `{name}` for the field's name."""
  ok: Callable[[Any], bool]
  text: str


def at_least(lo) -> Rule:
  """value >= lo."""
  return Rule(lambda v: v >= lo, f'{{name}} >= {lo}')


def above(lo) -> Rule:
  """value > lo."""
  return Rule(lambda v: v > lo, f'{{name}} > {lo}')


def unit(closed_hi: bool = False) -> Rule:
  """[0, 1) (or [0, 1])."""
  if closed_hi:
    return Rule(lambda v: 0 <= v <= 1, '0 <= {name} <= 1')
  return Rule(lambda v: 0 <= v < 1, '0 <= {name} < 1')


SEED = Rule(lambda v: 0 <= v < 2**32, '0 <= {name} < 2**32')
SIZE = Rule(lambda v: all(x >= 1 for x in v), '{name} = (height, width), both >= 1')


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field: its one-line meaning, and what is valid beyond its type.

  `choices`: a callable returning the valid values (lazy: they live in modules
  that validation need not import otherwise). `per_dataset`: a dict
  {dataset: value}, the rule applying to each value. `mapping`: a free dict.
  """
  meaning: str
  rule: Rule | None = None
  choices: Callable[[], tuple] | None = None
  per_dataset: bool = False
  mapping: bool = False


def _data_sources() -> tuple:
  return ('synthetic', 'real')  # experiment.DATA_SOURCES (a test keeps them equal)


def _augment_modes() -> tuple:
  return ('host', 'device')  # data.real.AUGMENT_MODES (a test keeps them equal)


def _encoder_rules() -> tuple:
  from fedjax_mtl.algorithms import hca2
  return hca2.ENCODER_RULES


def _ntk_points() -> tuple:
  from fedjax_mtl.algorithms import ntkfedavg
  return ntkfedavg.POINTS


def _decoder_rules() -> tuple:
  from fedjax_mtl.algorithms import hca2
  return hca2.DECODER_RULES


def _dea_variants() -> tuple:
  from fedjax_mtl.algorithms import topk
  return topk.VARIANTS


def _unified_modes() -> tuple:
  from fedjax_mtl.algorithms import base
  return base.UNIFIED_MODES


def _matfl_modes() -> tuple:
  from fedjax_mtl.algorithms import matfl_math
  return matfl_math.MODES


def _sal_metrics() -> tuple:
  from fedjax_mtl.metrics import dense
  return dense.SAL_METRICS


def _optimizers() -> tuple:
  from fedjax_mtl import local
  return local.OPTIMIZERS


def _lr_schedules() -> tuple:
  from fedjax_mtl import local
  return local.LR_SCHEDULES


def _decoders() -> tuple:
  from fedjax_mtl.models import multitask
  return multitask.DECODERS


def _matu_combines() -> tuple:
  from fedjax_mtl.algorithms import matu_math
  return matu_math.COMBINES


def _matu_cross() -> tuple:
  from fedjax_mtl.algorithms import matu_math
  return matu_math.CROSS


def _matu_ties() -> tuple:
  from fedjax_mtl.algorithms import matu_math
  return matu_math.TIES


def _many_feeds() -> tuple:
  from fedjax_mtl.manytask import feed
  return feed.FEEDS


def _benchmarks() -> tuple:
  from fedjax_mtl.manytask import setting
  return setting.BENCHMARKS


def _vit_models() -> tuple:
  from fedjax_mtl.models import vit
  return tuple(vit.MODELS)


FIELDS: dict[str, Field] = {
    'algorithm': Field('algorithm name or a wrapper composition, e.g. hca2, momentum(fedavg)'),
    'scenario': Field('client layout (fedjax_mtl/scenarios.py LAYOUTS), e.g. pascal_st_nyud_mt_1c'),
    'seed': Field('seed of parameter init and training randomness', SEED),
    'tasks': Field("comma-separated subset of the scenario's tasks ('' = all)"),
    'split_seed': Field('numpy seed of the random client partition of the train sets', SEED),
    'parts_clients_humans_only': Field(
        'human_parts-only clients keep only images with humans (as the released code)'),
    'data.source': Field('synthetic (the built-in benchmark) or real (PASCAL-Context / '
                         'NYUD-v2 caches)', choices=_data_sources),
    'data.data_dir': Field("real data: folder holding PASCALContext/ and NYUDv2/ "
                           "('' = $FEDJAX_MTL_DATA_DIR)"),
    'data.cache_dir': Field("real data: caches from scripts/prepare_data.py ('' = "
                            '<data_dir>/cache)'),
    'data.chunk_steps': Field('real data: local steps per streamed host->device chunk',
                              at_least(1)),
    'data.workers': Field('real data: grain worker processes for augmentation (0 = threads '
                          'in this process)', at_least(0)),
    'data.threads': Field('real data: grain reader threads when workers = 0', at_least(0)),
    'data.augment': Field('real data: where training samples are augmented, host (grain '
                          'workers) or device (the accelerator)', choices=_augment_modes),
    'data.reproduce_parts_index_bug': Field(
        "real data: the released code's misaligned human flags (spec §1.11 bug 1)"),
    'data.seed': Field('seed of the synthetic images, and of real-data order and augmentation',
                       SEED),
    'data.resolution': Field('per dataset: (height, width) of training and test images', SIZE,
                             per_dataset=True),
    'data.num_train': Field('synthetic data, per dataset: number of train images', at_least(1),
                            per_dataset=True),
    'data.num_test': Field('synthetic data, per dataset: number of test images', at_least(1),
                           per_dataset=True),
    'model.encoder': Field('encoder name, e.g. swin_t, swin_nano, conv_micro '
                           '(fedjax_mtl/models/__init__.py ENCODERS)'),
    'model.decoder': Field("task decoders of the dense model: hca2 (FedHCA2's decoder + "
                           'head per task) or deeplab (a DeepLab-v3 ASPP head per task on the '
                           "encoder's last stage: MaT-FL's and NTKFedAvg's benchmark A)",
                           choices=_decoders),
    'model.head_width': Field("decoder='deeplab': channels of the ASPP and its projection "
                              '(256 in the reference)', at_least(1)),
    'model.kwargs': Field("keyword arguments of the encoder, e.g. {'embed_dim': 8, "
                          "'depths': (1, 1, 1, 1)}", mapping=True),
    'model.dtype': Field('compute dtype (bfloat16: bf16 compute, float32 params)',
                         choices=lambda: ('float32', 'bfloat16')),
    'model.remat': Field("recompute each encoder block's forward in the backward pass "
                         '(less memory, about one extra forward)'),
    'model.pretrained_path': Field("converted encoder weights (.npz) all clients start from "
                                   "('' = random init)"),
    'optim.name': Field("local optimizer: adamw, adam_amsgrad (MaT-FL's Adam, amsgrad, "
                        'L2 weight decay in the gradient) or sgd (torch SGD: L2 weight decay, '
                        'optim.momentum)', choices=_optimizers),
    'optim.momentum': Field('sgd: momentum (torch semantics, no dampening; 0: plain SGD)',
                            Rule(lambda v: 0 <= v < 1, '0 <= {name} < 1')),
    'optim.schedule': Field("learning rate per step: cosine (warm-up, then cosine per local "
                            "epoch) or round_decay (lr * round_decay^round, MaT-FL's)",
                            choices=_lr_schedules),
    'optim.round_decay': Field('round_decay schedule: factor per communication round',
                               Rule(lambda v: 0 < v <= 1, '0 < {name} <= 1')),
    'optim.reset_each_round': Field('a new optimizer state every round (MaT-FL) instead of '
                                    "each client's kept state"),
    'optim.lr': Field('peak learning rate of the local optimizer', above(0)),
    'optim.weight_decay': Field('weight decay (AdamW: decoupled; adam_amsgrad, sgd: L2 in the '
                                'gradient)', at_least(0)),
    'optim.b1': Field("AdamW β1", unit()),
    'optim.b2': Field("AdamW β2", unit()),
    'optim.eps': Field('AdamW ε', above(0)),
    'optim.warmup_epochs': Field('local epochs of linear learning-rate warm-up', at_least(0)),
    'optim.warmup_lr_init': Field('learning rate at the start of the warm-up', at_least(0)),
    'optim.min_lr': Field('learning rate at the end of the cosine schedule', at_least(0)),
    'local_epochs': Field("per dataset: local epochs per round (a dataset left out uses its "
                          'default)', at_least(1), per_dataset=True),
    'batch_size': Field('training batch size of every client', at_least(1)),
    'eval_batch_size': Field('test batch size', at_least(1)),
    'num_rounds': Field('communication rounds', at_least(1)),
    'eval_every': Field('evaluate every this many rounds (and after the last)', at_least(1)),
    'sal_metric': Field("saliency metric: maxF (FedHCA2's pooled F-beta) or mIoU (MaT-FL's "
                        'per-image Jaccard, averaged, max over 15 thresholds)',
                        choices=_sal_metrics),
    'eval_edge_ods': Field('edge metric: odsF (host-side matching) if true, else edge BCE '
                           'test loss'),
    'checkpoint_every': Field('checkpoint every this many rounds (and after the last)',
                              at_least(1)),
    'delta_m_reference': Field("workdir of a finished run (usually configs/local.py) of the "
                               "same scenario and data: results get Δm against it ('' = none)"),
    'num_devices': Field('devices the clients are sharded over (0 = all visible)', at_least(0)),
    'progress': Field('show a progress bar'),
    'distributed.coordinator': Field("multi-process runs: host:port of process 0's coordinator "
                                     "('' = JAX_COORDINATOR_ADDRESS, or one process)"),
    'distributed.num_processes': Field('multi-process runs: the process count (0 = '
                                       'JAX_NUM_PROCESSES, or one process)', at_least(0)),
    'distributed.process_id': Field('multi-process runs: this process, 0..num_processes-1 '
                                    '(-1 = JAX_PROCESS_ID)', at_least(-1)),
    'distributed.timeout_s': Field('multi-process runs: seconds to wait for the coordinator '
                                   'and every process to join', above(0)),
    'tensorboard': Field('also write TensorBoard event files to <workdir>/tensorboard'),
    'unified': Field("FedDEA's unified model for task-level clients: none (the hetero-client "
                     'engine), literal (one global encoder + every decoder/head, spec A1), '
                     'owner (decoders/heads updated by their owner only)',
                     choices=_unified_modes),
    # Wrappers (used when `algorithm` names them, e.g. momentum(fedavg)).
    'momentum.momentum': Field('momentum(...): server momentum of the aggregated update, '
                               'in [0, 1)'),
    'momentum.lr': Field('momentum(...): server learning rate, > 0'),
    'dea.rho': Field('dea(...): FedDEA ratio ρ, the fraction of each client update kept '
                     '(top-ρ by magnitude over the whole update), in (0, 1]'),
    'dea.variant': Field('dea(...): which entries are kept: top (FedDEA), small (ablation a), '
                         'random (ablation c)', choices=_dea_variants),
    'dea.rescale': Field('dea(...): scale the kept entries by 1/ρ (False: ablation b)'),
    'dea.server_lr': Field('dea(...): server step η_g on the aggregated update (ρ = 1 with '
                           'η_g > 1: the step-size control), > 0'),
    'heal.tau': Field('heal(...): FedHEAL keeps a coordinate whose update sign was this '
                      'consistent over past rounds (> tau), in [0, 1)'),
    'heal.beta': Field('heal(...): FedHEAL momentum of the client weights, in [0, 1]'),
    'grouped.by': Field("grouped(...): aggregate within groups of the same 'dataset' or 'task'"),
    # Algorithm blocks (configs/<algorithm>.py add their algorithm's default_config()).
    'fedavg.weighting': Field("FedAvg mean: 'uniform' or 'examples' (by local example counts)"),
    'fedprox.mu': Field('FedProx proximal coefficient μ, >= 0'),
    'feddyn.alpha': Field('FedDyn regularisation α, > 0'),
    'fedacg.lam': Field('FedACG: momentum λ of the server update and of the lookahead, '
                        'in [0, 1)'),
    'fedacg.beta': Field('FedACG: coefficient β of β/2 ‖θ − θ_lookahead‖², >= 0'),
    'fedga.step_size': Field('FedGA (FedDG-GA): initial step d of the client-weight update, '
                             'decaying linearly over the rounds, >= 0'),
    'moon.mu': Field('MOON: weight μ of the model-contrastive loss, >= 0'),
    'moon.tau': Field('MOON: temperature τ of the model-contrastive loss, > 0'),
    'ditto.lam': Field("Ditto: pull λ of the personal model to the global one, >= 0"),
    'fedamp.lam': Field('FedAMP proximal coefficient λ, >= 0'),
    'fedamp.alpha_k': Field('FedAMP step α_k of the cloud models, > 0'),
    'fedamp.sigma': Field('FedAMP similarity scale σ, > 0'),
    'fedbabu.finetune_rounds': Field('FedBABU: last rounds of local fine-tuning, < num_rounds'),
    'fedsta.task_specific_rounds': Field('FedSTA: last rounds with the encoder frozen, '
                                         '< num_rounds'),
    'matfl.mode': Field('MaT-FL grouping: hard (clustering) or soft (cosine weights)',
                        choices=_matfl_modes),
    'matfl.num_clusters': Field('MaT-FL hard mode: number of clusters, 1..number of clients'),
    'matfl.th': Field('MaT-FL soft mode: weights are max(cos + th, 0)', above(-1)),
    'matu.rho': Field('MaTU: sign-agreement threshold ρ of the soft task mask (Eq. 3)',
                      unit(True)),
    'matu.eps': Field('MaTU: similarity threshold ε of the similar-task sets', unit(True)),
    'matu.kappa': Field('MaTU: at most κ similar tasks per task (3 for 8 tasks, 5 for 30)',
                        at_least(1)),
    'matu.combine': Field("MaTU: same-task + cross-task vector: 'sum' (Eq. 7 as printed) or "
                          "'avg' (the paper's Overview: their average)", choices=_matu_combines),
    'matu.cross': Field("MaTU cross-task aggregation: 'similarity' (Eq. 6), 'none' or "
                        "'uniform' (Fig. 6b's variants)", choices=_matu_cross),
    'matu.tie': Field("MaTU unification of a zero sign sum: 'emr' (-1, EMR-Merging's code) "
                      "or 'zero' (sgn(0) = 0)", choices=_matu_ties),
    'ntkfedavg.server_lr': Field('NTKFedAvg: server step α on the mean task vector, > 0',
                                 above(0)),
    'ntkfedavg.negate': Field("NTKFedAvg: clients whose task vectors are negated (federated "
                              "unlearning), comma-separated ids ('' = none)"),
    'ntkfedavg.linearize': Field('NTKFedAvg: clients train the NTK-linearised model (False: '
                                 'the plain forward, FedAvg with this server)'),
    'ntkfedavg.point': Field("NTKFedAvg: linearisation point: server (the round's server "
                             'model) or pretrained (the initial model, every round)',
                             choices=_ntk_points),
    'ntkfedavg.mu': Field('NTKFedAvg: proximal coefficient μ of μ/2 ‖θ − θ_start‖² on the '
                          'shared parameters (1: NTKFedProx; with linearize=false, FedProx)',
                          at_least(0)),
    'ntkfedavg.tune_alpha': Field("NTKFedAvg, many-task setting: choose the server step α "
                                  'every round on a server-held validation split (spec A.3)'),
    'ntkfedavg.alpha_grid': Field("NTKFedAvg α tuning: comma-separated α values ('' = 0.25, "
                                  '0.5, ..., number of clients)'),
    'ntkfedavg.val_fraction': Field("NTKFedAvg α tuning: fraction of each task's training "
                                    'examples the server holds out', above(0)),
    'ntkfedavg.val_max': Field('NTKFedAvg α tuning: at most this many held-out examples per '
                               'task', at_least(1)),
    'ntkfedavg.freeze_heads': Field('NTKFedAvg, dense setting: the linearised clients keep their '
                                    "heads at their initial values (the paper's frozen decoder); "
                                    'False trains them'),
    'hca2.encoder_agg': Field('FedHCA2 encoder aggregation (ablation: fedavg, none)',
                              choices=_encoder_rules),
    'hca2.decoder_agg': Field('FedHCA2 decoder aggregation (ablation: fedavg, none)',
                              choices=_decoder_rules),
    'hca2.ca_c': Field('FedHCA2 conflict-averse radius c, in [0, 1)'),
    'hca2.ca_rescale': Field('FedHCA2: divide the conflict-averse update by 1 + c² '
                             '(released code)'),
    'hca2.homo': Field('FedHCA2: average the updates of consecutive same-task clients '
                       '(released code)'),
    'hca2.alpha_init': Field('FedHCA2: initial encoder weight α of every client', unit(True)),
    'hca2.beta_init': Field('FedHCA2: initial decoder weight β of every decoder layer',
                            unit(True)),
    'hca2.hyper_lr': Field('FedHCA2: learning rate of α and β, >= 0'),
    'hca2.hyper_momentum': Field('FedHCA2: SGD momentum of α and β', unit()),
    'hca2.hyper_weight_decay': Field('FedHCA2: weight decay of α and β', at_least(0)),
}

# The many-task setting (fedjax_mtl/manytask; `setting='many_task'`).
MANY_TASK_FIELDS = {
    'setting': Field("dense (FedHCA2's hetero-client dense prediction) or many_task "
                              '(ViT + LoRA classification, fedjax_mtl/manytask)',
                              choices=lambda: ('dense', 'many_task')),
    'many.benchmark': Field('many_task: mini8 (offline), tfds8 (the real 8 tasks) or folder30 '
                            "(MaTU's 30 tasks as ImageFolder trees)", choices=_benchmarks),
    'many.tasks': Field("many_task: comma-separated subset of the benchmark's tasks "
                                 "('' = all)"),
    'many.num_clients': Field('many_task: clients N', at_least(1)),
    'many.zeta_t': Field('many_task: Dirichlet task concentration ζ_t (0: one task '
                         'per client)', at_least(0)),
    'many.zeta_c': Field('many_task: Dirichlet class concentration ζ_c', above(0)),
    'many.class_split': Field("many_task: split of each task's classes over its clients: "
                              "dirichlet (ζ_c) or iid", choices=lambda: ('dirichlet', 'iid')),
    'many.tasks_per_client': Field('many_task: exactly this many tasks per client instead '
                                   'of the Dirichlet allocation (0 = off)', at_least(0)),
    'many.client_tasks': Field("many_task: explicit task groups, client n holds group n mod G "
                               "('a+b+c;d+e', '' = off)"),
    'many.feed': Field("many_task: 'device' (every training image on the device) or 'round' "
                       "(the round's samples, gathered each round)",
                       choices=_many_feeds),
    'many.participation': Field(
        'many_task: participation ξ, the fraction of clients per round',
        Rule(lambda v: 0 < v <= 1, '0 < {name} <= 1')),
    'many.local_epochs': Field('many_task: local epochs per pair and round (0 with '
                                        'local_steps)', at_least(0)),
    'many.task_epochs': Field("many_task: 'task=E,...' local epochs of these tasks' pairs in "
                              "place of local_epochs ('' = none), e.g. 'mnist=5,dtd=76'"),
    'many.local_steps': Field('many_task: local steps per pair and round instead of '
                                       'epochs (0 = use local_epochs)', at_least(0)),
    'many.model': Field('many_task: ViT (fedjax_mtl/models/vit.py MODELS)',
                                 choices=_vit_models),
    'many.resolution': Field('many_task: input resolution', at_least(8)),
    'many.lora_rank': Field('many_task: LoRA rank r', at_least(1)),
    'many.lora_alpha': Field('many_task: LoRA alpha (0: alpha = r)',
                                      at_least(0)),
    'many.lora_seed': Field('many_task: seed of the shared LoRA A', SEED),
    'many.num_train': Field('many_task: train examples per task (0 = all)',
                                     at_least(0)),
    'many.num_test': Field('many_task: test examples per task (0 = all)',
                                    at_least(0)),
    'many.data_dir': Field("many_task tfds8: TFDS data dir ('' = $TFDS_DATA_DIR or "
                           "~/tensorflow_datasets); folder30: the folder of <task>/train and "
                           "<task>/test ('' = $FEDJAX_MTL_FOLDER30_DIR)"),
    'many.heads': Field("many_task: '' (a trained linear head per task) or the .npz of "
                        'scripts/zeroshot_heads.py (frozen zero-shot heads, CLIP towers)'),
    'many.pretrained': Field("many_task: backbone: 'warmup' (mini8's cached warm-up), "
                                      "a .npz from scripts/convert_vit.py, or '' (random)"),
    'many.warmup_steps': Field('many_task: steps of the warm-up', at_least(1)),
    'many.warmup_seed': Field('many_task: seed of the warm-up', SEED),
    'many.cache_dir': Field("many_task: warm-up cache ('' = $FEDJAX_MTL_CACHE or "
                                     '~/.cache/fedjax_mtl)'),
    'many.individual_reference': Field(
        "many_task: workdir of a finished Individual run of the same tasks and data: results "
        "get accuracy normalised by it ('' = none)"),
}
FIELDS.update(MANY_TASK_FIELDS)

# Fields a Δm reference run must share with this run for its columns
# (`client/task metric`, report.column_name) to hold comparable numbers: the
# clients and tasks, their test data, the client partition and the edge metric.
DELTA_M_FIELDS = ('scenario', 'tasks', 'split_seed', 'parts_clients_humans_only',
                  'eval_edge_ods', 'data.source', 'data.resolution',
                  'data.reproduce_parts_index_bug')
# Synthetic data is generated from these; real data comes from the caches.
DELTA_M_SYNTHETIC_FIELDS = ('data.seed', 'data.num_train', 'data.num_test')


# ----------------------------------------------------------------------------
# Reading configs.
# ----------------------------------------------------------------------------

def _is_mapping(v) -> bool:
  return isinstance(v, Mapping) or (hasattr(v, 'items') and hasattr(v, 'keys'))


def leaves(config, prefix: str = '') -> dict[str, Any]:
  """{dotted name: value} of a config's fields (a documented dict field is one leaf)."""
  out = {}
  for k, v in config.items():
    name = f'{prefix}{k}'
    if _is_mapping(v) and name not in FIELDS:
      out.update(leaves(v, f'{name}.'))
    else:
      out[name] = v
  return out


def block_defaults() -> dict[str, Any]:
  """Algorithm blocks by name: each algorithm's and wrapper's `default_config()`."""
  from fedjax_mtl import algorithms
  out = {}
  for name, build in algorithms.ALGORITHMS.items():
    default_config = getattr(sys.modules[build.__module__], 'default_config', None)
    if default_config is not None:
      out[name] = default_config()
  out.update(momentum=algorithms.momentum_config(), dea=algorithms.dea_config(),
             heal=algorithms.heal_config(),
             grouped=algorithms.grouped_config())
  return out


@functools.cache
def defaults() -> dict[str, Any]:
  """Every field's default: `base_config()` and every algorithm block."""
  from fedjax_mtl.defaults import base_config
  out = leaves(base_config())
  for block, cfg in block_defaults().items():
    out.update(leaves(cfg, f'{block}.'))
  return out


def _plain(v):
  """ConfigDicts as dicts, for messages and comparisons."""
  return v.to_dict() if hasattr(v, 'to_dict') else v


def show(v) -> str:
  """A value as messages show it (ConfigDicts as dicts)."""
  return repr(_plain(v))


def unknown_field(name: str, known, listing: str = '') -> ConfigError:
  """'unknown config field' with the closest known names (else the command `listing`)."""
  close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
  if close:
    hint = '; did you mean ' + ' or '.join(map(repr, close)) + '?'
  else:
    hint = f'; {listing or "python -m fedjax_mtl.config_doc CONFIG_FILE"} lists the fields'
  return ConfigError(f'unknown config field {name!r}{hint}')


# ----------------------------------------------------------------------------
# Types.
# ----------------------------------------------------------------------------

def type_name(default) -> str:
  """'an int', 'a tuple of 2 ints', ...: the type a field with this default takes."""
  if isinstance(default, bool):
    return 'a bool (true/false)'
  if isinstance(default, numbers.Integral):
    return 'an int'
  if isinstance(default, numbers.Real):
    return 'a number'
  if isinstance(default, str):
    return 'a string'
  if isinstance(default, (tuple, list)):
    return f'a tuple of {len(default)} ' + type_name(default[0]).split(' ', 1)[1] + 's'
  if _is_mapping(default):
    return 'a dict'
  return type(default).__name__


def type_ok(value, default) -> bool:
  """Whether `value` has the type of `default`: ints are not bools, numbers accept ints,
  tuples (or lists) match element-wise, mappings are mappings."""
  if isinstance(default, bool):
    return isinstance(value, bool)
  if isinstance(default, numbers.Integral):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
  if isinstance(default, numbers.Real):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
  if isinstance(default, str):
    return isinstance(value, str)
  if isinstance(default, (tuple, list)):
    return (isinstance(value, (tuple, list)) and len(value) == len(default)
            and all(type_ok(v, d) for v, d in zip(value, default)))
  if _is_mapping(default):
    return _is_mapping(value)
  return isinstance(value, type(default))


def _check_type(name: str, value, default) -> None:
  if not type_ok(value, default):
    raise ConfigError(f'{name}={show(value)} has the wrong type; expected {type_name(default)} '
                      f'like the default {show(default)}')
  for x in (value if isinstance(value, (tuple, list)) else (value,)):
    if isinstance(x, numbers.Real) and not isinstance(x, bool) and not math.isfinite(x):
      raise ConfigError(f'{name}={show(value)} is not a finite number')


def _check_value(name: str, value, default, field: Field, short: str = '') -> None:
  """Type, then range or choices, of one value (`short`: its name in the range text)."""
  _check_type(name, value, default)
  if field.choices is not None:
    check_choice(name, value, field.choices())
  if field.rule is not None and not field.rule.ok(value):
    raise ConfigError(f'{name}={show(value)} is out of range; valid range: '
                      + field.rule.text.format(name=short or name.rsplit('.', 1)[-1]))


# ----------------------------------------------------------------------------
# The checks.
# ----------------------------------------------------------------------------

def check_fields(config) -> None:
  """Every field known, present where required, of its default's type and in range."""
  known = defaults()
  values = leaves(config)
  for name in values:
    if name not in FIELDS:
      raise unknown_field(name, FIELDS)
  blocks = set(block_defaults())
  for name in known:
    if name not in values and name.split('.')[0] not in blocks:
      raise ConfigError(f'the config has no field {name!r}; start it from '
                        'fedjax_mtl.defaults.base_config()')
  from fedjax_mtl.tasks import DATASETS
  for name, value in values.items():
    field, default = FIELDS[name], known[name]
    if field.per_dataset:
      _check_type(name, value, default)
      sample = next(iter(default.values()))
      for d, v in value.items():
        check_choice('dataset', d, DATASETS, f' in {name}')
        _check_value(f'{name}.{d}', v, sample, field, short=name.rsplit('.', 1)[-1])
    elif field.mapping:
      _check_type(name, value, default)
    else:
      _check_value(name, value, default, field)


def check_names(config) -> None:
  """Algorithm, scenario, tasks and encoder names; the scenario's datasets in the
  per-dataset fields; the encoder's keyword arguments."""
  from fedjax_mtl import algorithms, scenarios
  algorithms.check(config.algorithm)
  blocks = scenarios.select_tasks(scenarios.layout(config.scenario), config.tasks)
  used = sorted({b[0] for b in blocks})
  required = ['data.resolution']
  if config.data.source == 'synthetic':
    required += ['data.num_train', 'data.num_test']
  for name in required:
    node, _, key = name.partition('.')
    missing = [d for d in used if d not in config[node][key]]
    if missing:
      raise ConfigError(f'{name}={show(config[node][key])} has no entry for {missing[0]!r}; '
                        f'scenario {config.scenario!r} uses ' + ', '.join(map(repr, used)))
  _check_encoder(config.model.encoder, _plain(config.model.kwargs))


def _check_encoder(name: str, kwargs: dict) -> None:
  from fedjax_mtl.models import ENCODERS
  check_choice('model', name, ENCODERS)  # the message of models.get_encoder
  if 'dtype' in kwargs:
    raise ConfigError("model.kwargs sets 'dtype'; use model.dtype instead")
  module = ENCODERS[name]()
  valid = sorted(f.name for f in dataclasses.fields(module)
                 if f.init and f.name not in ('parent', 'name', 'dtype'))
  for k in kwargs:
    check_choice('model.kwargs argument', k, valid, f' of encoder {name!r}')


def _resuming(workdir: str) -> bool:
  """Whether `workdir` holds a checkpoint (a resumed run loads no pretrained weights).
  Orbax names a step's folder by its bare number (checkpoint.Checkpointer)."""
  d = os.path.join(workdir, 'checkpoints')
  return os.path.isdir(d) and any(n.isdigit() for n in os.listdir(d))


def check_paths(config, workdir: str) -> None:
  """Files the run reads: the pretrained weights (unless resuming) and the real-data dir."""
  path = config.model.pretrained_path
  if path and not os.path.isfile(path) and not _resuming(workdir):
    raise ConfigError(f'model.pretrained_path {path!r} is not a file; convert the weights '
                      'with scripts/convert_swin.py, or set it to \'\' for a random init')
  if config.data.source == 'real':
    from fedjax_mtl.data import real
    real.resolve_data_dir(config)
  if config.get('tensorboard', False):
    import importlib.util
    if importlib.util.find_spec('tensorboardX') is None:
      raise ConfigError('tensorboard=True needs tensorboardX: pip install ".[tensorboard]" '
                        '(or set --config.tensorboard=false)')


def check_workdir(workdir: str) -> None:
  """`workdir` is a writable directory, or can be created."""
  if not workdir:
    raise ConfigError('workdir is empty; give --workdir=DIR')
  if os.path.exists(workdir):
    if not os.path.isdir(workdir):
      raise ConfigError(f'workdir {workdir!r} is a file, not a directory; give another '
                        '--workdir')
    if not os.access(workdir, os.W_OK | os.X_OK):
      raise ConfigError(f'workdir {workdir!r} is not writable; give another --workdir')
    return
  parent = os.path.dirname(os.path.abspath(workdir))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise ConfigError(f'cannot create workdir {workdir!r}: {parent!r} is a file')
  if not os.access(parent, os.W_OK | os.X_OK):
    raise ConfigError(f'cannot create workdir {workdir!r}: {parent!r} is not writable')


def _lookup(d: dict, name: str, default):
  for k in name.split('.'):
    if not isinstance(d, dict) or k not in d:
      return default
    d = d[k]
  return d


def _json_value(v):
  """A value as it reads back from config.json (tuples become lists)."""
  return json.loads(json.dumps(_plain(v)))


def check_delta_m_reference(config) -> None:
  """`delta_m_reference` is a finished run of a comparable setting with usable values."""
  ref = config.get('delta_m_reference', '')
  if not ref:
    return
  what = f'delta_m_reference {ref!r}'
  hint = 'give the workdir of a finished run (usually configs/local.py) of the same scenario'
  if not os.path.isdir(ref):
    raise ConfigError(f'{what} is not a directory; {hint}')
  path = os.path.join(ref, 'config.json')
  try:
    with open(path) as f:
      old = json.load(f)
  except (OSError, ValueError):
    raise ConfigError(f'{what} holds no readable config.json; {hint}') from None
  names = DELTA_M_FIELDS + (DELTA_M_SYNTHETIC_FIELDS if config.data.source == 'synthetic'
                            else ())
  known, mine = defaults(), leaves(config)
  diffs = [n for n in names
           if _lookup(old, n, _json_value(known[n])) != _json_value(mine[n])]
  if diffs:
    raise ConfigError(f'{what} is a run of another setting (fields: {", ".join(diffs)}); '
                      'its Δm columns would not compare the same clients and data')
  from fedjax_mtl import report
  rounds = old.get('num_rounds')
  try:
    rows = [r for r in report.read_jsonl(os.path.join(ref, 'metrics.jsonl'))
            if r.get('type') == 'eval' and r.get('round') == rounds]
  except (OSError, ValueError):
    rows = []
  if not rows:
    raise ConfigError(f'{what} has no final evaluation (round {rounds}) in metrics.jsonl; '
                      'let that run finish first')
  zero = [report.column_name(r) for r in rows if r['value'] == 0]
  if zero:
    raise ConfigError(f'{what} has final value 0 for {zero[0]!r}; Δm (relative to it) is '
                      'undefined, use a longer reference run')


def check_config(config) -> None:
  """Everything about `config` that can be known without data: ConfigError on the first
  bad field."""
  check_fields(config)
  check_names(config)
  check_delta_m_reference(config)


def check_run(config, workdir: str) -> None:
  """ConfigError (one line) for the first bad config value, path or workdir; writes nothing."""
  check_config(config)
  check_workdir(workdir)
  check_paths(config, workdir)
