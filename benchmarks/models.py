"""Model steps: the Swin-T local training step (`--only=swin`), its model FLOPs and MFU
(`--only=mfu`), its memory (`--only=swin_memory`, and ResNet-18's: `--only=memory`),
the ViT-B/32 LoRA step (`--only=vit_lora`), and conv steps inside one `lax.scan`
against one call each (`--only=scan_conv`).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import peak_flops, peak_memory_mb, timeit


def _swin_task(encoder: str, dtype=jnp.float32, remat: bool = False):
  """(init, loss_fn, step) of a local step: `encoder` + one decoder/head (21 classes), AdamW."""
  import optax
  from fedjax_mtl.models import get_encoder
  from fedjax_mtl.models.multitask import MultiTaskNet
  model = MultiTaskNet(get_encoder(encoder, dtype=dtype, remat=remat), (21,), train=True,
                       dtype=dtype)
  tx = optax.adamw(1e-4)

  def init(key, x):
    variables = model.init({'params': key, 'dropout': key}, x[:1])
    return variables['params'], variables['batch_stats'], tx.init(variables['params'])

  def loss_fn(params, bs, x, y, key):
    out, st = model.apply({'params': params, 'batch_stats': bs}, x, rngs={'dropout': key},
                          mutable=['batch_stats'])
    return optax.softmax_cross_entropy_with_integer_labels(out[0], y).mean(), st

  def step(params, bs, opt, x, y, key):
    (loss, st), g = jax.value_and_grad(loss_fn, has_aux=True)(params, bs, x, y, key)
    upd, opt = tx.update(g, opt, params)
    return optax.apply_updates(params, upd), st['batch_stats'], opt, loss

  return init, loss_fn, step


def _abstract_step(encoder: str, resolution: int, batch: int, dtype=jnp.float32,
                   remat: bool = False):
  """(loss_fn, step, args) of `_swin_task`, with args (params, batch_stats, opt_state, x,
  y, key) as shapes: for lowering without allocating."""
  init, loss_fn, step = _swin_task(encoder, dtype, remat)
  x = jax.ShapeDtypeStruct((batch, resolution, resolution, 3), jnp.float32)
  y = jax.ShapeDtypeStruct((batch, resolution, resolution), jnp.int32)
  key = jax.random.PRNGKey(1)
  return loss_fn, step, (*jax.eval_shape(init, key, x), x, y, key)


def swin_step_runner(resolution: int, batch: int = 8, encoder: str = 'swin_t',
                     dtype=jnp.float32, remat: bool = False):
  """(run, compile_s): one compiled, warmed-up local training step of `_swin_task`."""
  from fedjax_mtl.experiment import KEEP_REMAT_ON_CPU
  init, _, step = _swin_task(encoder, dtype, remat)
  x = jnp.zeros((batch, resolution, resolution, 3), jnp.float32)
  y = jnp.zeros((batch, resolution, resolution), jnp.int32)
  args = list(jax.jit(init)(jax.random.PRNGKey(0), x))
  f = jax.jit(step, donate_argnums=(0, 1, 2))
  options = KEEP_REMAT_ON_CPU if remat and jax.default_backend() == 'cpu' else None
  t0 = time.perf_counter()
  c = f.lower(*args, x, y, jax.random.PRNGKey(1)).compile(compiler_options=options)
  compile_s = time.perf_counter() - t0

  def run():
    args[0], args[1], args[2], loss = c(*args, x, y, jax.random.PRNGKey(1))
    jax.block_until_ready(loss)

  run()
  return run, compile_s


def model_flops(resolution: int, batch: int = 8, encoder: str = 'swin_t') -> float:
  """FLOPs of one local training step (`_swin_task`: forward + backward + AdamW), from
  XLA's cost analysis of the float32 step without remat (recomputation is not model work)."""
  _, step, args = _abstract_step(encoder, resolution, batch)
  cost = jax.jit(step).lower(*args).cost_analysis()
  return float((cost[0] if isinstance(cost, (list, tuple)) else cost)['flops'])


def bench_mfu(resolution: int = 512, batch: int = 8, encoder: str = 'swin_t',
              dtype: str = 'bfloat16', remat: bool = False, repeats: int = 3,
              peak_tflops: float = 0.0) -> dict:
  """Model FLOPs utilisation of one client's local step: model FLOPs per second over the
  device's peak (`PEAK_BF16_FLOPS` by device kind, or `peak_tflops`; none on CPU)."""
  flops = model_flops(resolution, batch, encoder)
  run, compile_s = swin_step_runner(resolution, batch, encoder, jnp.dtype(dtype), remat)
  dt = timeit(run, repeats)
  peak = peak_flops(peak_tflops)
  return {'encoder': encoder, 'resolution': resolution, 'batch': batch, 'dtype': dtype,
          'remat': remat, 'compile_s': compile_s, 'model_tflop_per_step': flops / 1e12,
          'step_s': dt, 'images_per_s': batch / dt, 'achieved_tflops': flops / dt / 1e12,
          'peak_tflops': peak / 1e12, 'mfu': flops / dt / peak if peak else float('nan'),
          'peak_memory_mb': peak_memory_mb()}


def bench_swin_step(resolution: int, batch: int = 8, repeats: int = 3,
                    encoder: str = 'swin_t') -> dict:
  """Local training step (forward + backward + AdamW) of `encoder` + one decoder/head."""
  run, compile_s = swin_step_runner(resolution, batch, encoder)
  dt = timeit(run, repeats)
  return {'resolution': resolution, 'batch': batch, 'compile_s': compile_s, 'step_s': dt,
          'images_per_s': batch / dt}


def bench_swin_memory(resolution: int = 512, batch: int = 8, encoder: str = 'swin_t') -> dict:
  """Memory of one client's local step (as `bench_swin_step`), fp32/bf16 x remat; nothing runs.

  Per variant, in GiB:
  * `activations`: the values JAX keeps for the backward pass (the memory remat
    trades for recompute), summed over the step's saved residuals minus its
    arguments. Backend-independent.
  * `temp` (and `args`, `outputs`): XLA's buffer assignment of the compiled
    step, `jit(step).lower(...).compile().memory_analysis()`: peak temporary
    memory on top of the donated params/optimizer state. Compiled with the
    `cse_barrier_expander` pass disabled: XLA:CPU otherwise drops the
    optimization barriers of `jax.checkpoint` before CSE, which folds the
    recomputation back into the forward pass (remat is a no-op on CPU; GPU and
    TPU keep the barriers). XLA:CPU computes bf16 through float32 copies, so
    its bf16 `temp` overstates an accelerator's; `activations` does not.
  """
  from jax._src.ad_checkpoint import saved_residuals
  from fedjax_mtl.experiment import KEEP_REMAT_ON_CPU
  out = {'encoder': encoder, 'resolution': resolution, 'batch': batch}
  for dtype in (jnp.float32, jnp.bfloat16):
    for remat in (False, True):
      loss_fn, step, args = _abstract_step(encoder, resolution, batch, dtype, remat)
      key = args[-1]
      res = saved_residuals(lambda *a: loss_fn(*a, key)[0], *args[:2], *args[3:5])
      activations = sum(a.size * a.dtype.itemsize for a, src in res
                        if not src.startswith('from the argument'))
      mem = jax.jit(step, donate_argnums=(0, 1, 2)).lower(*args).compile(
          compiler_options=KEEP_REMAT_ON_CPU).memory_analysis()
      name = f'{jnp.dtype(dtype).name}{"_remat" if remat else ""}'
      out.update({f'{name}_activations_gib': activations / 2**30,
                  f'{name}_temp_gib': mem.temp_size_in_bytes / 2**30,
                  f'{name}_args_gib': mem.argument_size_in_bytes / 2**30,
                  f'{name}_outputs_gib': mem.output_size_in_bytes / 2**30})
  return out


def bench_memory(encoders=('swin_t', 'resnet18')) -> dict:
  """`bench_swin_memory` at 512x512, batch 8, for each of `encoders`, keys prefixed by it."""
  return {f'{e}_{k}': v for e in encoders for k, v in bench_swin_memory(encoder=e).items()}


def vit_lora_runner(batch: int = 32, resolution: int = 224, rank: int = 16):
  """(run, step): one training step of LoRA (rank 16 on q/v) + a 10-class head on a
  frozen ViT-B/32 at 224, batch 32, AdamW, as one (client, task) pair of the
  many-task round trains (`manytask.model.make_forward`, `local.sgd_step`);
  params and optimizer state donated, one call per step."""
  import ml_collections
  from fedjax_mtl.local_training import sgd_step, make_optimizer
  from fedjax_mtl.manytask import model as many_model
  from fedjax_mtl.models import vit
  cfg = ml_collections.ConfigDict({'model': 'vit_b32', 'resolution': resolution,
                                   'lora_rank': rank, 'lora_alpha': 0.0, 'lora_seed': 0})
  model = many_model.make_model(cfg, 10)
  backbone, trainable = many_model.split(vit.init_params(model, jax.random.PRNGKey(0)))
  forward = many_model.make_forward(model, np.array([10]))
  optim = ml_collections.ConfigDict({'weight_decay': 0.0, 'b1': 0.9, 'b2': 0.999, 'eps': 1e-8})
  tx = make_optimizer(optim)

  def step(params, opt, backbone, images, labels):
    loss, grads = jax.value_and_grad(
        lambda p: many_model.cross_entropy(forward(backbone, p, images, 0), labels))(params)
    return sgd_step(tx, 1e-3, grads, opt, params, None) + (loss,)

  fn = jax.jit(step, donate_argnums=(0, 1))
  key = jax.random.PRNGKey(1)
  images = jax.random.randint(key, (batch, resolution, resolution, 3), 0, 256).astype(jnp.uint8)
  labels = jax.random.randint(key, (batch,), 0, 10)
  holder = {'p': trainable, 'o': tx.init(trainable)}

  def run():
    holder['p'], holder['o'], loss = fn(holder['p'], holder['o'], backbone, images, labels)
    jax.block_until_ready(loss)

  run()
  return run, fn


def bench_vit_lora(repeats: int = 3) -> dict:
  run, _ = vit_lora_runner()
  best = timeit(run, repeats)
  return {'step_s': best, 'images_per_s': 32 / best}


def bench_scan_conv(repeats: int = 2, clients: int = 5, steps: int = 4, batch: int = 16,
                    resolution: int = 64, width: int = 16, head_width: int = 64) -> dict:
  """Local steps of a conv model inside one `lax.scan` (as the engine's client scan
  runs them) against the same steps as one jitted call each: `clients` vmapped
  clients of a `width`-wide dilated ResNet-18 (output stride 8) + DeepLab head,
  SGD, batch `batch` at `resolution`². On XLA:CPU the scanned convolutions run
  several times slower than the same step dispatched on its own."""
  from fedjax_mtl.models import deeplab, resnet
  net = deeplab.DeepLabNet(resnet.ResNet(width=width, output_stride=8), (21,), train=True,
                           head_width=head_width)
  x = jax.random.normal(jax.random.PRNGKey(0), (steps, clients, batch, resolution, resolution, 3))
  v = net.init(jax.random.PRNGKey(1), x[0, 0])
  bs = jax.tree.map(lambda a: jnp.stack([a] * clients), v['batch_stats'])
  p0 = jax.tree.map(lambda a: jnp.stack([a] * clients), v['params'])

  def loss(p, b, x):
    out, _ = net.apply({'params': p, 'batch_stats': b}, x, mutable=['batch_stats'],
                       rngs={'dropout': jax.random.PRNGKey(0)})
    return jnp.mean(out[0] ** 2)

  step = jax.vmap(lambda p, b, x: jax.tree.map(lambda a, g: a - 1e-3 * g, p,
                                               jax.grad(loss)(p, b, x)))
  one = jax.jit(step)
  scan = jax.jit(lambda p, b, xs: jax.lax.scan(lambda c, x: (step(c, b, x), None), p, xs)[0])

  def each(p):
    for i in range(steps):
      p = one(p, bs, x[i])
    return p

  out = {'clients': clients, 'steps': steps, 'batch': batch, 'resolution': resolution,
         'width': width, 'head_width': head_width}
  for name, fn in (('separate_calls', lambda: each(p0)), ('one_scan', lambda: scan(p0, bs, x))):
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      jax.block_until_ready(fn())
      times.append(time.perf_counter() - t0)
    out[f'{name}_s'] = min(times)
  out['scan_vs_separate'] = out['one_scan_s'] / out['separate_calls_s']
  return out
