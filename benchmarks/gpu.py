"""One client's local training step of each paper configuration, and its NTK-linearised twin.

`--only=gpu` (MFU and per-client memory of the paper configs on whatever
accelerator it finds) and `--only=ntk_step` (NTKFedAvg's linearised step against
the plain one, spec ntkfedavg §2.6).

Every workload is a `Task`: `init(key) -> state` (params, batch statistics,
optimizer state), `step(*state, *consts, x, y, key) -> (*state, loss)` with the
state donated, and the shapes of one batch. `report` lowers it once for XLA's
cost analysis (FLOPs) and memory analysis (per-client bytes: the step's
arguments plus its temporary buffers), compiles it, and times the best of
`repeats` calls after a warm-up.

The linearised steps follow NTKFedAvg spec §2.5–2.6: the backbone's output is
g(x; c) + J_c(x)(φ − c) by one `jax.jvp` around the round's start c (a
constant argument), with batch norm of the backbone in inference mode on c's
statistics (decision A8); the heads stay non-linear. Benchmark A's DeepLab head
is trained (decision A2's default), benchmark B's zero-shot head is frozen.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.common import peak_flops


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  init: Callable  # key -> state tuple
  step: Callable  # (*state, *consts, x, y, key) -> (*state, loss)
  x: jax.ShapeDtypeStruct
  y: jax.ShapeDtypeStruct
  consts: Callable = lambda state: ()  # state -> constant arguments (the linearisation point)


def scaled(n: int, scale: float) -> int:
  """Resolution `n` scaled by `scale`, a multiple of 32 (at least 32)."""
  return max(32, int(round(n * scale / 32)) * 32)


def _ce(logits, labels):
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32),
                                                         labels).mean()


def _adam_step(tx, loss_fn, params, opt, *args):
  (loss, aux), g = jax.value_and_grad(loss_fn, has_aux=True)(params, *args)
  upd, opt = tx.update(g, opt, params)
  return optax.apply_updates(params, upd), opt, loss, aux


def deeplab_task(resolution: int = 512, batch: int = 16, dtype=jnp.bfloat16,
                 remat: bool = False, linear: bool = False, classes: int = 21) -> Task:
  """Benchmark A (NTKFedAvg spec §1.2): dilated ResNet-18 (output stride 8) + one
  DeepLab head, semantic segmentation, MaT-FL's Adam (amsgrad), batch 16."""
  from fedjax_mtl.models import deeplab, resnet
  enc = resnet.resnet18_os8(dtype=dtype, remat=remat)
  head = deeplab.DeepLabHead(classes, dtype=dtype)
  tx = optax.amsgrad(1e-4)
  size = (resolution, resolution)

  def init(key):
    x = jnp.zeros((1, resolution, resolution, 3), jnp.float32)
    ve = enc.init(key, x, train=False)
    feat = jax.eval_shape(lambda: enc.apply(ve, x)[-1])
    vh = head.init({'params': key, 'dropout': key}, jnp.zeros(feat.shape, feat.dtype), size)
    params = {'encoder': ve['params'], 'head': vh['params']}
    return params, {'encoder': ve['batch_stats'], 'head': vh['batch_stats']}, tx.init(params)

  def loss_fn(params, bs, c, x, y, key):
    if linear:  # backbone in inference mode on c's statistics, linearised around c
      g = lambda p: enc.apply({'params': p, 'batch_stats': bs['encoder']}, x, train=False)[-1]
      delta = jax.tree.map(jnp.subtract, params['encoder'], c)
      z0, dz = jax.jvp(g, (c,), (delta,))
      feat, new_enc = z0 + dz, bs['encoder']
    else:
      feats, st = enc.apply({'params': params['encoder'], 'batch_stats': bs['encoder']}, x,
                            train=True, mutable=['batch_stats'])
      feat, new_enc = feats[-1], st['batch_stats']
    out, st = head.apply({'params': params['head'], 'batch_stats': bs['head']}, feat, size,
                         train=True, rngs={'dropout': key}, mutable=['batch_stats'])
    return _ce(out, y), {'encoder': new_enc, 'head': st['batch_stats']}

  def step(params, bs, opt, c, x, y, key):
    params, opt, loss, bs = _adam_step(tx, loss_fn, params, opt, bs, c, x, y, key)
    return params, bs, opt, loss

  return Task(f"resnet18_os8_deeplab_{resolution}{'_linear' if linear else ''}"
              f"{'_remat' if remat else ''}", init, step,
              jax.ShapeDtypeStruct((batch, resolution, resolution, 3), jnp.float32),
              jax.ShapeDtypeStruct((batch, resolution, resolution), jnp.int32),
              consts=lambda state: (jax.tree.map(jnp.copy, state[0]['encoder']),))


def clip_task(resolution: int = 224, batch: int = 32, dtype=jnp.bfloat16, remat: bool = False,
              linear: bool = False, classes: int = 10, model: str = 'ViT-B-32-quickgelu') -> Task:
  """Benchmark B (NTKFedAvg spec §1.3): the whole CLIP ViT-B/32 image tower trained
  under a frozen zero-shot head (100 · normalise(z) @ W), AdamW, batch 32."""
  from fedjax_mtl.models import vit, zeroshot
  net = vit.get_model(model, image_size=resolution, dtype=dtype, remat=remat)
  tx = optax.adamw(1e-5, weight_decay=0.1)
  width = net.output_dim

  def init(key):
    params = vit.init_params(net, key)
    return params, (), tx.init(params)

  def loss_fn(params, bs, c, w, x, y, key):
    del key
    f = lambda p: net.apply({'params': p}, x)[0]
    if linear:
      z0, dz = jax.jvp(f, (c,), (jax.tree.map(jnp.subtract, params, c),))
      z = z0 + dz
    else:
      z = f(params)
    return _ce(zeroshot.zeroshot_logits(z.astype(jnp.float32), w, jnp.log(100.)), y), bs

  def step(params, bs, opt, c, w, x, y, key):
    params, opt, loss, bs = _adam_step(tx, loss_fn, params, opt, bs, c, w, x, y, key)
    return params, bs, opt, loss

  head = jax.random.normal(jax.random.PRNGKey(7), (width, classes), jnp.float32)
  return Task(f"{model}_{resolution}{'_linear' if linear else ''}{'_remat' if remat else ''}",
              init, step,
              jax.ShapeDtypeStruct((batch, resolution, resolution, 3), jnp.float32),
              jax.ShapeDtypeStruct((batch,), jnp.int32),
              consts=lambda state: (jax.tree.map(jnp.copy, state[0]), head / jnp.linalg.norm(
                  head, axis=0, keepdims=True)))


def swin_task(resolution: int = 512, batch: int = 8, dtype=jnp.bfloat16, remat: bool = False,
              encoder: str = 'swin_t', classes: int = 21) -> Task:
  """A FedHCA2 / FedDEA client's step: `encoder` + one FedHCA2 decoder and head, AdamW."""
  from fedjax_mtl.models import get_encoder
  from fedjax_mtl.models.multitask import MultiTaskNet
  model = MultiTaskNet(get_encoder(encoder, dtype=dtype, remat=remat), (classes,), train=True,
                       dtype=dtype)
  tx = optax.adamw(1e-4)

  def init(key):
    v = model.init({'params': key, 'dropout': key},
                   jnp.zeros((1, resolution, resolution, 3), jnp.float32))
    return v['params'], v.get('batch_stats', {}), tx.init(v['params'])

  def loss_fn(params, bs, x, y, key):
    out, st = model.apply({'params': params, 'batch_stats': bs}, x, rngs={'dropout': key},
                          mutable=['batch_stats'])
    return _ce(out[0], y), st.get('batch_stats', {})

  def step(params, bs, opt, x, y, key):
    params, opt, loss, bs = _adam_step(tx, loss_fn, params, opt, bs, x, y, key)
    return params, bs, opt, loss

  return Task(f"{encoder}_{resolution}{'_remat' if remat else ''}", init, step,
              jax.ShapeDtypeStruct((batch, resolution, resolution, 3), jnp.float32),
              jax.ShapeDtypeStruct((batch, resolution, resolution), jnp.int32))


def vit_lora_task(resolution: int = 224, batch: int = 32, dtype=jnp.bfloat16, remat: bool = False,
                  rank: int = 16, classes: int = 10) -> Task:
  """A many-task (client, task) pair's step (MaTU / many-task paper setting): LoRA r = 16
  on a frozen ViT-B/32 plus a head, through `manytask.model.make_forward`, AdamW."""
  from fedjax_mtl.manytask import model as many_model
  from fedjax_mtl.models import vit
  # `many_model.make_model`'s network, with the dtype and remat the engine's config lacks.
  model = vit.get_model('vit_b32', image_size=resolution, num_classes=classes, lora_rank=rank,
                        lora_seed=0, dtype=dtype, remat=remat)
  forward = many_model.make_forward(model, np.array([classes]))
  tx = optax.adamw(1e-3)

  def init(key):
    backbone, trainable = many_model.split(vit.init_params(model, key))
    return trainable, backbone, tx.init(trainable)

  def loss_fn(params, backbone, x, y, key):
    del key
    return _ce(forward(backbone, params, x, 0), y), backbone

  def step(params, backbone, opt, x, y, key):
    params, opt, loss, backbone = _adam_step(tx, loss_fn, params, opt, backbone, x, y, key)
    return params, backbone, opt, loss

  return Task(f"vit_b32_lora{rank}_{resolution}{'_remat' if remat else ''}", init, step,
              jax.ShapeDtypeStruct((batch, resolution, resolution, 3), jnp.uint8),
              jax.ShapeDtypeStruct((batch,), jnp.int32))


def _flops(lowered) -> float:
  cost = lowered.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float((cost or {}).get('flops', float('nan')))


def report(task: Task, repeats: int = 3, model_flops: float | None = None,
           peak: float = 0.0) -> dict:
  """Compile, memory analysis and best-of-`repeats` time of one step of `task`.

  `model_flops`: the FLOPs MFU counts (default: this step's own, from XLA's cost
  analysis; pass the step without remat's figure so recomputation is not counted)."""
  from fedjax_mtl.experiment import KEEP_REMAT_ON_CPU
  key = jax.random.PRNGKey(0)
  state = list(jax.jit(task.init)(key))
  consts = tuple(task.consts(state))
  x = jnp.asarray(np.random.default_rng(0).integers(0, 255, task.x.shape), task.x.dtype)
  y = jnp.zeros(task.y.shape, task.y.dtype)
  fn = jax.jit(task.step, donate_argnums=(0, 1, 2))
  lowered = fn.lower(*state, *consts, x, y, key)
  flops = _flops(lowered)
  options = KEEP_REMAT_ON_CPU if jax.default_backend() == 'cpu' else None
  t0 = time.perf_counter()
  compiled = lowered.compile(compiler_options=options)
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  gib = lambda b: float(b) / 2**30

  def run():
    out = compiled(*state, *consts, x, y, key)
    state[:] = out[:3]
    jax.block_until_ready(out[3])
    return out[3]

  loss = run()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    run()
    times.append(time.perf_counter() - t0)
  dt = min(times)
  mflops = flops if model_flops is None else model_flops
  out = {'compile_s': compile_s, 'step_s': dt, 'images_per_s': task.x.shape[0] / dt,
         'tflop_per_step': flops / 1e12, 'achieved_tflops': mflops / dt / 1e12,
         'loss_finite': bool(np.isfinite(float(loss)))}
  if peak:
    out['mfu'] = mflops / dt / peak
  if mem is not None:
    out.update({'args_gib': gib(mem.argument_size_in_bytes),
                'temp_gib': gib(mem.temp_size_in_bytes),
                'client_gib': gib(mem.argument_size_in_bytes + mem.temp_size_in_bytes)})
  del state[:]
  return out


def step_flops(task: Task) -> float:
  """XLA's FLOP count of one step of `task`, from shapes alone (nothing allocated),
  lowered for the CPU (GPU backends report no FLOPs from cost analysis)."""
  state = jax.eval_shape(task.init, jax.random.PRNGKey(0))
  consts = jax.eval_shape(task.consts, state)
  traced = jax.jit(task.step).trace(*state, *consts, task.x, task.y, jax.random.PRNGKey(0))
  return _flops(traced.lower(lowering_platforms=('cpu',)))


def bench_ntk_step(repeats: int = 3, deeplab=(512, 16), clip=(224, 32), dtype=jnp.bfloat16,
                   log=print) -> dict:
  """NTKFedAvg's linearised step against the plain step, with and without remat, for
  benchmark A (ResNet-18-DeepLab) and B (CLIP ViT-B/32): FLOPs, time and per-client
  memory, and their ratios (NTKFedAvg issue: ≤ 3x time, ≤ 2x memory with remat)."""
  out = {}
  for name, make, (res, batch) in (('deeplab', deeplab_task, deeplab),
                                   ('clip', clip_task, clip)):
    rows = {}
    for linear in (False, True):
      for remat in (False, True):
        t = make(res, batch, dtype, remat=remat, linear=linear)
        rows[(linear, remat)] = r = report(t, repeats)
        log(f'{t.name}: {r}')
        out.update({f'{name}_{"linear" if linear else "plain"}{"_remat" if remat else ""}_{k}': v
                    for k, v in r.items()})
    plain, lin, lin_remat = rows[(False, False)], rows[(True, False)], rows[(True, True)]
    out[f'{name}_time_ratio'] = lin['step_s'] / plain['step_s']
    out[f'{name}_flops_ratio'] = lin['tflop_per_step'] / plain['tflop_per_step']
    if 'client_gib' in plain:
      out[f'{name}_memory_ratio'] = lin['client_gib'] / plain['client_gib']
      out[f'{name}_memory_ratio_remat'] = lin_remat['client_gib'] / plain['client_gib']
      out[f'{name}_time_ratio_remat'] = lin_remat['step_s'] / plain['step_s']
  return out


def bench_gpu(repeats: int = 5, peak_tflops: float = 0.0, log=print, scale: float = 1.0,
              only: tuple[str, ...] = ()) -> dict:
  """MFU and per-client memory of each paper configuration's client step on the
  first device, bf16: FedHCA2 (Swin-T, 512, batch 8), FedDEA (ResNet-18, 512,
  batch 8), NTKFedAvg A (dilated ResNet-18 + DeepLab, 512, batch 16) and B (CLIP
  ViT-B/32, 224, batch 32, plain and linearised), many-task / MaTU (ViT-B/32
  LoRA r = 16, 224, batch 32); each with and without remat where it has blocks.
  MFU counts the model FLOPs of the step without remat. `scale` shrinks the
  resolutions (a CPU dry run); `only` picks rows by name (default: all)."""
  peak = peak_flops(peak_tflops)
  r = lambda n: scaled(n, scale)
  both, plain = (False, True), (False,)
  rows = [
      ('fedhca2_swin_t', lambda remat: swin_task(r(512), 8, remat=remat), both),
      ('ntk_a_deeplab', lambda remat: deeplab_task(r(512), 16, remat=remat), both),
      ('ntk_a_deeplab_linear', lambda remat: deeplab_task(r(512), 16, remat=remat, linear=True),
       both),
      ('ntk_b_clip', lambda remat: clip_task(r(224), 32, remat=remat), both),
      ('ntk_b_clip_linear', lambda remat: clip_task(r(224), 32, remat=remat, linear=True), both),
      ('many_vit_b32_lora', lambda remat: vit_lora_task(r(224), 32, remat=remat), plain),
      ('feddea_resnet18', lambda remat: swin_task(r(512), 8, remat=remat, encoder='resnet18'),
       plain),
  ]
  out = {'device_kind': jax.devices()[0].device_kind, 'peak_tflops': peak / 1e12}
  for name, make, remats in rows:
    if only and name not in only:
      continue
    flops = step_flops(make(False))
    for remat in remats:
      try:
        res = report(make(remat), repeats, model_flops=flops, peak=peak)
      except Exception as e:  # one workload failing (e.g. out of memory) must not hide the rest
        res = {'error': f'{type(e).__name__}: {str(e).splitlines()[0][:200]}'}
      key = f'{name}{"_remat" if remat else ""}'
      log(f'{key}: {res}')
      out.update({f'{key}.{k}': v for k, v in res.items()})
  for b in ('ntk_a_deeplab', 'ntk_b_clip'):  # the linearised step against the plain one
    get = lambda k, f: out.get(f'{b}{k}.{f}', float('nan'))
    out[f'{b}.linear_time_ratio'] = get('_linear', 'step_s') / get('', 'step_s')
    out[f'{b}.linear_remat_time_ratio'] = get('_linear_remat', 'step_s') / get('', 'step_s')
    out[f'{b}.linear_flops_ratio'] = get('_linear', 'tflop_per_step') / get('', 'tflop_per_step')
    out[f'{b}.linear_memory_ratio'] = get('_linear', 'client_gib') / get('', 'client_gib')
    out[f'{b}.linear_remat_memory_ratio'] = (get('_linear_remat', 'client_gib')
                                             / get('', 'client_gib'))
  return out
