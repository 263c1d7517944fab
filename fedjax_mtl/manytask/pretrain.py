"""The backbone a many-task run starts from: a checkpoint, or mini8's warm-up.

`many.pretrained`:
- `'warmup'` (the offline default): a short centralised training of the whole
  ViT (no LoRA) on a mixture of tasks disjoint from the benchmark's: coarser
  questions about the same kinds of images, on samples the benchmark never uses
  (mini8 drawn with another seed), as a real pretraining corpus holds related
  but different labels (`WARMUP_TASKS`): digit parity (plain and cluttered
  digits), round / angular / cross shapes, warm / cool hue, few / many dots,
  grating orientation within 90 degrees, low / high texture frequency; 15
  classes in all (no task of the benchmark is one of them). Cached as `.npz`
  under `many.cache_dir` (default `$FEDJAX_MTL_CACHE` or
  `~/.cache/fedjax_mtl`), keyed by model, resolution, steps and seed; later runs
  load it.
- a path to a `.npz` of backbone params (`scripts/convert_vit.py` writes them):
  loaded, shapes checked against the model;
- `''`: the model's random initialisation.
"""

from __future__ import annotations

import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_mtl.data import image_preprocess, mini8
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.manytask import model as model_lib
from fedjax_mtl.models import vit

WARMUP_SEED = 7_919  # mini8 samples of the warm-up (the benchmark uses the run's data seed)
WARMUP_BATCH = 64
WARMUP_LR = 1e-3
WARMUP_IMAGES = 1500  # per generator


def cache_dir(cfg) -> str:
  return (cfg.cache_dir or os.environ.get('FEDJAX_MTL_CACHE')
          or os.path.join(os.path.expanduser('~'), '.cache', 'fedjax_mtl'))


def warmup_path(cfg) -> str:
  name = (f'warmup2_{cfg.model}_r{int(cfg.resolution)}_s{int(cfg.warmup_steps)}'
          f'_seed{int(cfg.warmup_seed)}.npz')
  return os.path.join(cache_dir(cfg), name)


# generator -> coarse label of each of its benchmark labels (the warm-up's tasks);
# digits_perm shares digits' images and is left out.
WARMUP_TASKS = {
    'digits': np.arange(10) % 2,  # parity
    'digits_clutter': np.arange(10) % 2,
    'shapes': np.array([0, 1, 1, 2, 0, 1]),  # round (circle, ring) / angular / cross
    'colors': np.array([0, 0, 0, 1, 1, 1, 1, 0]),  # warm / cool hue
    'count_dots': (np.arange(6) >= 3).astype(int),  # 1-3 / 4-6 dots
    'gratings': np.arange(8) // 4,  # orientation in [0, 90) / [90, 180) degrees
    'texture_freq': (np.arange(5) >= 2).astype(int),  # low / high frequency
}
WARMUP_CLASSES = sum(int(m.max()) + 1 for m in WARMUP_TASKS.values())


def _mixture(resolution: int) -> tuple[np.ndarray, np.ndarray]:
  """Warm-up images (another seed than the benchmark's) and their coarse labels."""
  images, labels, offset = [], [], 0
  for task, coarse in WARMUP_TASKS.items():
    x, y = mini8.load(task, 'train', WARMUP_IMAGES, WARMUP_SEED, resolution=resolution)
    images.append(x)
    labels.append((offset + coarse[y]).astype(np.int32))
    offset += int(coarse.max()) + 1
  return np.concatenate(images), np.concatenate(labels)


def warmup(cfg) -> dict:
  """Train the backbone on the warm-up mixture (see module docstring); returns it."""
  model = vit.get_model(cfg.model, image_size=int(cfg.resolution), num_classes=WARMUP_CLASSES)
  params = vit.init_params(model, jax.random.PRNGKey(int(cfg.warmup_seed)))
  images, labels = _mixture(int(cfg.resolution))
  tx = optax.adamw(optax.cosine_decay_schedule(WARMUP_LR, int(cfg.warmup_steps)),
                   weight_decay=1e-4)
  norm = model_lib.checkpoint_norm(model)

  def loss_fn(p, x, y):
    _, logits = model.apply({'params': p}, image_preprocess.normalize(x, norm))
    return model_lib.cross_entropy(logits.astype(jnp.float32), y)

  @jax.jit
  def train(params, images, labels, key):
    def step(carry, k):
      p, opt = carry
      i = jax.random.randint(k, (WARMUP_BATCH,), 0, images.shape[0])
      loss, g = jax.value_and_grad(loss_fn)(p, images[i], labels[i])
      upd, opt = tx.update(g, opt, p)
      return (optax.apply_updates(p, upd), opt), loss
    keys = jax.random.split(key, int(cfg.warmup_steps))
    (params, _), losses = jax.lax.scan(step, (params, tx.init(params)), keys)
    return params, losses

  params, _ = train(params, images, labels, jax.random.PRNGKey(int(cfg.warmup_seed) + 1))
  backbone = {k: v for k, v in params.items() if k != vit.HEAD_NAME}
  return jax.device_get(backbone)


def _save(path: str, backbone: dict, model: str) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix='.npz', dir=os.path.dirname(path))
  os.close(fd)
  np.savez(tmp, **{k: np.asarray(v) for k, v in vit.flatten_params(backbone).items()},
           **{vit.META_PREFIX + 'activation': np.asarray(vit.activation(vit.get_model(model))),
              vit.META_PREFIX + 'model': np.asarray(model)})
  os.replace(tmp, path)


def load_backbone(cfg, like: dict) -> dict:
  """The backbone tree (structure and shapes of `like`, the model's own backbone)."""
  if not cfg.pretrained:
    return like
  if cfg.pretrained == 'warmup':
    path = warmup_path(cfg)
    if not os.path.exists(path):
      _save(path, warmup(cfg), cfg.model)
  else:
    path = cfg.pretrained  # checked to be a file by run.check
  # The file's recorded activation must be the model's (a CLIP tower's must be recorded).
  vit.check_activation(vit.get_model(cfg.model), vit.npz_meta(path), f'backbone {path}',
                       repr(cfg.model))
  flat = {k: v for k, v in vit.flatten_params(vit.load_npz(path)).items()
          if not k.startswith(vit.HEAD_NAME + '/')}
  want = vit.flatten_params(like)
  missing, extra = sorted(set(want) - set(flat)), sorted(set(flat) - set(want))
  wrong = [f'{k} {tuple(np.shape(flat[k]))} vs model {tuple(np.shape(want[k]))}'
           for k in sorted(set(want) & set(flat)) if np.shape(flat[k]) != np.shape(want[k])]
  if missing or extra or wrong:
    parts = ([f'missing {", ".join(missing[:5])}'] if missing else []) + (
        [f'unexpected {", ".join(extra[:5])}'] if extra else []) + (
        [f'shape {"; ".join(wrong[:3])}'] if wrong else [])
    raise ConfigError(f'backbone {path} does not fit model {cfg.model!r} at resolution '
                      f'{int(cfg.resolution)}: ' + '; '.join(parts))
  return vit.unflatten_params({k: jnp.asarray(flat[k], jnp.float32) for k in want})
