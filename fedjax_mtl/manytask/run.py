"""Building a many-task run (`config.setting = 'many_task'`, e.g. `configs/fedavg.py:mini8`)
and its pieces the many-task engine (`engines/many_task.py`) calls:

    build (tasks, data, allocation, schedule, backbone, algorithm) -> `Run`
    round-0 state; evaluation (per-task top-1 accuracy and test loss);
    results.md / results.csv: per-task accuracy, the mean, bits per task, and
    accuracy normalised by an Individual run (`many.individual_reference`)

Algorithms (`SUPPORTED`): FedAvg, FedProx, FedPer, MaT-FL (its groups mix the
round's pairs; each pair keeps its grouped adapters; padding slots join no
group) and Local, which with one client per task holding all of it is the
"Individual" baseline. FedAvg-family means weigh
each (client, task) pair by its examples (`fedavg.weighting='examples'`,
spec matu §3), which also gives the padding slots weight 0.

**Communication** (logged per round, spec matu §3 "bits per task"): a
participating pair uploads its shared-role leaves (the LoRA adapters an
algorithm aggregates) and, when heads are averaged per task, its task's head
(the columns of its own classes), all float32: 32 bits per value.
`bits_per_task` is the mean upload of the round's pairs, `upload_bits` their sum.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedjax_mtl import algorithms, distributed, report
from fedjax_mtl.algorithms import matu_math
from fedjax_mtl.algorithms.base import config_block, linearized_forward, role_view
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.local_training import make_optimizer
from fedjax_mtl.manytask import engine, pretrain
from fedjax_mtl.manytask import model as model_lib
from fedjax_mtl.manytask import setting as setting_lib
from fedjax_mtl.models import vit

# algorithm -> whether its server gives every row of a shared role the same value
SUPPORTED = {'fedavg': True, 'fedprox': True, 'fedper': True, 'local': True, 'matfl': False,
             'matu': False, 'ntkfedavg': True}


def check(config) -> None:
  """The many-task fields and their combinations (one ConfigError line each)."""
  cfg = config.many
  *wrappers, base = algorithms.check(config.algorithm)
  if wrappers or base not in SUPPORTED:
    raise ConfigError(f'algorithm {config.algorithm!r} does not run in the many-task setting; '
                      'valid choices: ' + ', '.join(map(repr, SUPPORTED)))
  if base in ('fedavg', 'fedprox') and config.get('fedavg', {}).get('weighting',
                                                                   'uniform') != 'examples':
    raise ConfigError("many-task FedAvg weighs each (client, task) pair by its examples; set "
                      "fedavg.weighting='examples' (configs/<algorithm>.py:mini8 does)")
  if (cfg.local_epochs > 0) == (cfg.local_steps > 0):
    raise ConfigError(f'many.local_epochs={cfg.local_epochs} and many.local_steps='
                      f'{cfg.local_steps}: set exactly one of them > 0')
  if cfg.get('task_epochs', '') and cfg.local_steps > 0:
    raise ConfigError(f'many.task_epochs={cfg.task_epochs!r} sets epochs, but many.local_steps='
                      f'{cfg.local_steps} asks for steps; set many.local_steps=0')
  if base == 'ntkfedavg':
    from fedjax_mtl.algorithms import ntkfedavg
    bad = [c for c in ntkfedavg.negated_clients(config_block(config, 'ntkfedavg',
                                                                 ntkfedavg.default_config()))
           if c >= cfg.num_clients]
    if bad:
      raise ConfigError(f'ntkfedavg.negate names client {bad[0]}, which does not exist; valid '
                        f'ids: 0..{cfg.num_clients - 1}')
  tasks = setting_lib.selected_tasks(cfg)
  setting_lib.task_epochs(cfg, tasks)
  explicit = setting_lib.task_assignment(cfg, tasks, int(config.split_seed)) is not None
  if cfg.zeta_t == 0 and cfg.num_clients < len(tasks) and not explicit:
    raise ConfigError(f'many.zeta_t=0 gives one task per client and needs num_clients >= '
                      f'{len(tasks)} tasks, got {cfg.num_clients}')
  if cfg.pretrained == 'warmup' and cfg.benchmark != 'mini8':
    raise ConfigError("many.pretrained='warmup' is mini8's; give the converted backbone "
                      '(.npz from scripts/convert_vit.py) for tfds8')
  if cfg.pretrained not in ('', 'warmup') and not os.path.isfile(cfg.pretrained):
    raise ConfigError(f'many.pretrained={cfg.pretrained!r} is not a file; convert a '
                      "checkpoint with scripts/convert_vit.py, or use 'warmup' or ''")
  if cfg.heads and not os.path.isfile(cfg.heads):
    raise ConfigError(f'many.heads={cfg.heads!r} is not a file; make the zero-shot heads with '
                      "scripts/zeroshot_heads.py, or use '' for trained linear heads")
  clip = [m for m in vit.MODELS if isinstance(vit.get_model(m), vit.CLIPVisionTower)]
  if cfg.heads and cfg.model not in clip:
    raise ConfigError(f'many.heads (zero-shot heads) needs a CLIP tower; many.model='
                      f'{cfg.model!r}; valid choices: ' + ', '.join(map(repr, clip)))
  ref = cfg.individual_reference
  if ref and not os.path.isfile(os.path.join(ref, 'results.csv')):
    raise ConfigError(f'many.individual_reference {ref!r} holds no results.csv; give the '
                      'workdir of a finished Individual run')


@dataclasses.dataclass(frozen=True, eq=False)
class Run:
  """Everything static about a many-task run."""
  config: ml_collections.ConfigDict
  setting: setting_lib.Setting
  data: setting_lib.TaskData
  model: object
  backbone: dict
  trainable: dict
  roles: dict
  where: dict
  algorithm: algorithms.Algorithm
  round_fn: object
  eval_fn: object
  eval_pairs: np.ndarray
  # Evaluation B of a linearised client forward (NTKFedAvg; `engine.make_eval(linear=True)`),
  # else None.
  eval_linear_fn: object = None
  # NTKFedAvg's in-run server-α tuning (spec A.3): the server-held validation split
  # (`concat_split` layout), the grid and `engine.make_alpha_tuner`'s program; else None.
  val: object = None
  alphas: np.ndarray | None = None
  alpha_tune_fn: object = None
  # The devices the round's slots are spread over (`distributed.client_mesh`).
  mesh: Mesh | None = None
  # `round_fn`'s pieces as plain functions (`engine.round_parts`: the Flower adapter
  # trains slots on the clients and aggregates on the server with them).
  round_parts: object = None
  # (args, keywords) of `engine.round_parts` (a sweep's replicas build their round from
  # them, `engines/many_replicas.py`).
  round_spec: tuple = ()


def pad_slots(setting: setting_lib.Setting, n: int) -> setting_lib.Setting:
  """`setting` with each round's slots padded by the dummy pair to a multiple of `n`
  devices (a padding slot trains on nothing and weighs 0); itself when they divide."""
  extra = -setting.num_slots % n
  if not extra:
    return setting
  schedule = np.pad(setting.schedule, ((0, 0), (0, extra)), constant_values=setting.num_pairs)
  return dataclasses.replace(setting, schedule=schedule)


def place(mesh: Mesh, tree):
  """Host arrays on the run's devices: on one device as `jax.device_put` places them,
  else replicated over the mesh (of every process)."""
  if mesh.size == 1:
    return jax.device_put(tree)
  return distributed.put_replicated(tree, NamedSharding(mesh, P()))


def eval_pairs(run: Run) -> jax.Array:
  """The evaluated pair ids as the evaluation programs take them."""
  return place(run.mesh, jnp.asarray(run.eval_pairs))


def slot_info(setting: setting_lib.Setting, config) -> algorithms.FedInfo:
  """The algorithm's view of a round: S slots, each one (client, task) pair with one
  "decoder" row (its last block's adapters)."""
  s = setting.num_slots
  names = tuple(f'slot{i}' for i in range(s))
  return algorithms.FedInfo(
      num_clients=s, num_decoders=s, decoder_client=tuple(range(s)), decoder_names=names,
      client_names=names, homo_groups=(s,), num_rounds=int(config.num_rounds),
      client_keys=tuple((config.many.benchmark, 'pair') for _ in range(s)),
      decoder_keys=tuple((config.many.benchmark, 'pair') for _ in range(s)),
      num_tasks=setting.num_tasks)


def build_run(config) -> Run:
  """Validate and build the run (loads data, makes or loads the backbone); writes
  nothing but the warm-up cache."""
  check(config)
  cfg = config.many
  tasks = setting_lib.selected_tasks(cfg)
  data = setting_lib.load_data(cfg, tasks, int(config.data.seed))
  tune = _tune_block(config)
  val = None
  if tune is not None:  # the server's validation examples leave the clients' data
    data, val = setting_lib.hold_out(data, float(tune.val_fraction), int(tune.val_max),
                                     int(config.data.seed))
  setting = setting_lib.build_setting(tasks, data, cfg, int(config.num_rounds),
                                      int(config.split_seed), cfg.benchmark)
  mesh = distributed.client_mesh(config)
  setting = pad_slots(setting, mesh.size)
  model = model_lib.make_model(cfg, setting.max_classes)
  params = vit.init_params(model, jax.random.PRNGKey(int(config.seed)))
  backbone, trainable = model_lib.split(params)
  backbone = place(mesh, pretrain.load_backbone(cfg, backbone))
  roles = model_lib.roles(trainable)
  heads = zeroshot_heads(cfg, setting, model) if cfg.heads else None
  alg = algorithms.get_algorithm(config.algorithm, slot_info(setting, config), config)
  where = engine.storage(alg, roles, SUPPORTED[algorithms.parse(config.algorithm)[-1]])
  steps = int(cfg.local_steps)
  round_args = (setting, model, alg, make_optimizer(config.optim), roles, where)
  round_kw = dict(lr=float(config.optim.lr), batch_size=int(config.batch_size),
                  local_epochs=0 if steps else int(cfg.local_epochs), local_steps=steps,
                  heads=heads, origin=trainable,
                  task_epochs=setting_lib.task_epochs(cfg, setting.tasks),
                  max_steps=int(config.get('max_steps_per_round', 0)))
  round_fn = engine.make_round(*round_args, mesh=mesh, **round_kw,
                               max_parallel=int(config.get('max_parallel_clients', 0)))
  test_counts = np.array([len(lab) for _, lab in data.test])
  eval_fn = engine.make_eval(setting, model, test_counts, int(config.eval_batch_size), heads)
  linear = alg.client.forward is linearized_forward  # evaluation B of the linearised model
  eval_linear_fn = (engine.make_eval(setting, model, test_counts, int(config.eval_batch_size),
                                     heads, linear=True) if linear else None)
  tune_fn, alphas = None, None
  if tune is not None:
    from fedjax_mtl.algorithms.ntkfedavg import alpha_grid
    alphas = alpha_grid(tune, int(cfg.num_clients))
    tune_fn = engine.make_alpha_tuner(setting, model, np.array([len(y) for _, y in val]),
                                      int(config.eval_batch_size), alphas, heads)
  return Run(config=config, setting=setting, data=data, model=model, backbone=backbone,
             val=place(mesh, concat_split(val)) if val is not None else None, alphas=alphas,
             mesh=mesh,
             alpha_tune_fn=tune_fn,
             trainable=trainable, roles=roles, where=where, algorithm=alg, round_fn=round_fn,
             eval_fn=eval_fn, eval_pairs=engine.eval_models(setting, where),
             eval_linear_fn=eval_linear_fn,
             round_parts=engine.round_parts(*round_args, **round_kw),
             round_spec=(round_args, round_kw))


def _tune_block(config):
  """The `ntkfedavg` block when the run tunes the server's α in the run, else None;
  ConfigError for a combination that cannot (one line)."""
  if algorithms.parse(config.algorithm)[-1] != 'ntkfedavg':
    return None
  from fedjax_mtl.algorithms import ntkfedavg
  cfg = config_block(config, 'ntkfedavg', ntkfedavg.default_config())
  if not cfg.tune_alpha:
    return None
  if not cfg.linearize:
    raise ConfigError('ntkfedavg.tune_alpha sweeps the linear model the task vectors were '
                      'trained in; it needs ntkfedavg.linearize=True')
  if float(cfg.server_lr) != 1.0:
    raise ConfigError(f'ntkfedavg.tune_alpha chooses the server step itself; leave '
                      f'ntkfedavg.server_lr at 1 (got {cfg.server_lr})')
  if not 0 < float(cfg.val_fraction) < 1 or int(cfg.val_max) < 1:
    raise ConfigError(f'ntkfedavg.val_fraction={cfg.val_fraction} and val_max={cfg.val_max}: '
                      'need 0 < val_fraction < 1 and val_max >= 1')
  ntkfedavg.alpha_grid(cfg, 1)  # the grid's entries are checked here
  return cfg


def zeroshot_heads(cfg, setting: setting_lib.Setting, model) -> np.ndarray:
  """[T, E, C_max] frozen heads of `many.heads`, scaled by exp(logit_scale), zero-padded."""
  from fedjax_mtl.models import zeroshot
  heads = zeroshot.load_heads(cfg.heads, setting.tasks, scaled=True)
  out = np.zeros((setting.num_tasks, model.output_dim, setting.max_classes), np.float32)
  for t, task in enumerate(setting.tasks):
    w = heads[task]
    if w.shape != (model.output_dim, setting.num_classes[t]):
      raise ConfigError(f'zero-shot head {task!r} in {cfg.heads} has shape {w.shape}; model '
                        f'{cfg.model!r} and the task need ({model.output_dim}, '
                        f'{setting.num_classes[t]})')
    out[t, :, :w.shape[1]] = w
  return out


def init_state(run: Run) -> engine.ManyState:
  s = run.setting.num_slots
  views = {r: jax.tree.map(lambda v: jnp.broadcast_to(v, (s,) + v.shape),
                          role_view(run.trainable, run.roles, r))
           for r in run.algorithm.shared_roles}
  server = run.algorithm.server.init(views)
  if server.rows:
    raise ConfigError(f'algorithm {run.config.algorithm!r} keeps per-client server state, '
                      'which the many-task setting does not hold')
  return engine.init_state(run.setting, run.trainable, run.where, int(run.config.seed),
                           server.shared)


def upload_bits(run: Run) -> np.ndarray:
  """[M + 1] bits each pair uploads per round (module docstring); the dummy 0."""
  shared = set(run.algorithm.shared_roles)
  adapters = sum(int(np.prod(v.shape)) for k, v in run.trainable.items()
                 if run.roles[k] in shared)
  heads_up = any(w == 'task' for w in run.where.values())
  head_values = {k: v for k, v in run.trainable.items() if run.roles[k] == 'head'}
  matu = algorithms.parse(run.config.algorithm)[-1] == 'matu'
  bits = []
  for client, t in run.setting.pairs:
    c = run.setting.num_classes[t]
    head = sum(int(np.prod(v.shape[:-1])) * c for v in head_values.values()) if heads_up else 0
    if matu:  # one unified vector per client, plus a mask and a rescaler per task
      k = len(run.setting.allocation.tasks_of(client))
      bits.append(matu_math.upload_bits(adapters, k) / k + 32 * head)
    else:
      bits.append(32 * (adapters + head))
  return np.array(bits + [0], np.float64)


def concat_split(split) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  images = np.concatenate([x for x, _ in split])
  labels = np.concatenate([y for _, y in split]).astype(np.int32)
  offsets = np.concatenate([[0], np.cumsum([len(y) for _, y in split])[:-1]]).astype(np.int32)
  return images, labels, offsets


def tune_alpha(run: Run, state, start) -> tuple[object, dict]:
  """NTKFedAvg's server-α tuning (spec A.3, A10) after a round whose server stepped
  with α = 1: the α of the grid with the best mean validation accuracy over the
  evaluated models (the first on ties) gives the shared leaves c + α·τ̄. Returns the
  new state and the round's log ('alpha', and the accuracy of every α)."""
  pairs = eval_pairs(run)
  right = np.asarray(distributed.host_get(run.alpha_tune_fn(state, start, run.backbone, pairs,
                                                      *run.val)), np.float64)  # [E, A]
  counts = np.diff(np.append(np.asarray(run.val[2]), run.val[1].shape[0]))
  acc = 100. * right / counts[run.setting.pairs[run.eval_pairs, 1]][:, None]
  mean = acc.mean(0)
  best = int(np.argmax(mean))
  alpha = float(run.alphas[best])
  shared = _scale_step(start, state.shared, jnp.float32(alpha))
  return state.replace(shared=shared), {'alpha': alpha,
                                        'alpha_val_accuracy': [float(a) for a in mean]}


@jax.jit
def _scale_step(c, theta, alpha):
  """c + α (θ − c), leaf by leaf."""
  return jax.tree.map(lambda a, b: a + alpha * (b - a), c, theta)


def evaluate(run: Run, state, test, start=None) -> list[dict]:
  """Per task: top-1 accuracy (%) and test loss, averaged over the evaluated models.
  With `start` (the shared leaves at the round's start), the linearised model's
  too (NTKFedAvg's evaluation B): `accuracy_linear` and `loss_linear`."""
  pairs = eval_pairs(run)
  outs = [('', distributed.host_get(run.eval_fn(state, run.backbone, pairs, *test)))]
  if start is not None:
    outs.append(('_linear', distributed.host_get(run.eval_linear_fn(state, start, run.backbone, pairs,
                                                              *test))))
  return eval_rows(run, outs)


def eval_rows(run: Run, outs: list[tuple[str, tuple]]) -> list[dict]:
  """`evaluate`'s rows of the evaluation programs' host outputs: (suffix, (correct
  [E], loss [E])) per program ('' and, for evaluation B, '_linear')."""
  counts = [len(y) for _, y in run.data.test]
  rows = []
  for t, task in enumerate(run.setting.tasks):
    sel = run.setting.pairs[run.eval_pairs, 1] == t
    for suffix, (right, loss) in outs:
      acc = 100. * float(np.mean(right[sel])) / counts[t]
      rows.append({'task': task, 'metric': 'accuracy' + suffix, 'value': acc,
                   'models': int(sel.sum())})
      rows.append({'task': task, 'metric': 'loss' + suffix, 'value': float(np.mean(loss[sel]))})
  return rows


def _individual(ref: str) -> dict[str, float]:
  rows = report.read_jsonl(os.path.join(ref, 'metrics.jsonl'))
  last = max((r['round'] for r in rows if r.get('type') == 'eval'), default=None)
  return {r['task']: r['value'] for r in rows if r.get('type') == 'eval'
          and r['round'] == last and r['metric'] == 'accuracy'}


def results(run: Run, final: list[dict], bits: float) -> tuple[str, str]:
  """(results.md, results.csv): accuracy per task, mean, normalised accuracy, bits per task."""
  acc = {r['task']: r['value'] for r in final if r['metric'] == 'accuracy'}
  ref = (_individual(run.config.many.individual_reference)
         if run.config.many.individual_reference else {})
  tasks = list(run.setting.tasks)
  head = ['method'] + tasks + ['avg', 'bits/task']
  row = [run.config.algorithm] + [f'{acc[t]:.2f}' for t in tasks] + [
      f'{np.mean(list(acc.values())):.2f}', f'{bits:.3g}']
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head), '| ' + ' | '.join(row) + ' |']
  csv = [','.join(head), ','.join(row)]
  if ref:
    norm = [100. * acc[t] / ref[t] if ref.get(t) else float('nan') for t in tasks]
    nrow = ['normalised %'] + [f'{v:.1f}' for v in norm] + [f'{np.nanmean(norm):.1f}', '']
    lines.append('| ' + ' | '.join(nrow) + ' |')
    csv.append(','.join(nrow))
  return '\n'.join(lines) + '\n', '\n'.join(csv) + '\n'
