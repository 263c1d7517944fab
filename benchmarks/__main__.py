"""Benchmarks of fedjax_mtl: throughput, round time, compile time and memory (BENCHMARKS.md).

    python -m benchmarks                       # engine, pipeline, hca2 and swin
    python -m benchmarks --variant=smoke --repeats=2
    python -m benchmarks --only=NAME           # one benchmark, of the list below

`python scripts/bench.py` takes the same flags. By subject (module of benchmarks/):

  engine      --only=engine       engine round of the synthetic default config: compile,
                                  round time, the vmapped group step vs a Python loop
              --only=algorithms   round and local step of every algorithm
              --only=engine_agg   the round's aggregation as the engine calls it
  rules       --only=hca2         FedHCA2 aggregation at paper scale
              --only=rules        every server rule at paper scale vs a read
  models      --only=swin         Swin-T local step, 128 and 224, batch 8
              --only=mfu          Swin-T step at 512, batch 8, bf16: MFU (GPU)
              --only=swin_memory  Swin-T step memory at 512, fp32/bf16 x remat
              --only=memory       one client's step memory, Swin-T and ResNet-18, 512
              --only=vit_lora     ViT-B/32 + LoRA step at 224, batch 32
              --only=scan_conv    conv steps in one lax.scan vs one call each
  feddea      --only=top_rho      FedDEA's top-ρ mask vs FedAvg and a sort, K = 4, 5
                                  (and dea_engine after it)
              --only=dea_engine   the engine's aggregation: FedAvg vs dea(fedavg)
              --only=unified_memory  the unified round's memory at the paper's sizes
  many_task   --only=matu_server  MaTU's server at N = 30, ViT-B/32 LoRA, vs MaT-FL
              --only=matu_client  MaTU's unify/mask/rescale vs a mini8 round
              --only=many_memory  the many-task round's memory at MaTU's scale
              --only=ntk_alpha    NTKFedAvg's server-α grid: one linearize vs 20 forwards
  pipeline    --only=pipeline     training input pipeline alone at 512x512
              --only=augment      host augmentation vs raw feed + device augment
  multihost   --only=multihost    2 processes x 2 CPU devices vs 1 x 4: round time and
                                  the collectives of a round
              --only=flower       the smoke round in Flower's simulation engine vs the
                                  engine's, and where its time goes
  replicas    --only=replicas     the default config's 3 seeds as 3 cold runs vs one
                                  sweep (config.sweep='seed=0,1,2'): wall, compile,
                                  round throughput per replica
              --only=many_replicas  the same for MaTU on mini8 (configs/matu.py), each
                                  seed with its own client split (seed+split_seed)
              --only=replica_scaling  sweeps of R = --replicas seeds (default 1,4,16) of the
                                  default config and of it at Swin-T 224²: rounds/s, MFU
  edge        --only=odsf         host-side edge odsF at PASCAL size (500x375): seconds per
                                  image, the worker pool's throughput on 1..all cores and
                                  the time for 5,105 test images per edge client
  fl          --only=wrappers     the engine's aggregation with each wrapper (quantize, dp,
                                  sparsify, dea) around FedAvg vs FedAvg, Swin-T, N = 6
              --only=participation  the dense round on the 4c layout (24 clients) at
                                  participation 1, 0.5 and 0.1
  gpu         --only=gpu          MFU and per-client memory of every paper config's
                                  client step on the accelerator found (bf16)
              --only=ntk_step     NTKFedAvg's linearised step vs the plain one

All ratios compare measurements from one run in one process. Timings are taken
after compilation, with `block_until_ready` only at the end of each timed call.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

import jax

from benchmarks import (edge, engine, feddea, fl, gpu, many_task, models, multihost, pipeline,
                        replicas, rules)
from benchmarks.common import jsonl_log
from benchmarks.torch_compare import serve
from fedjax_mtl import cpu_isa, hostmem

# --serve workloads (scripts/compare_torch.py, scripts/compare_versions.py): name -> a
# builder of one warmed-up call.
SERVE = {
    'fedavg_round': lambda: engine.round_runner('fedavg')[0],
    'swin_t_128': lambda: models.swin_step_runner(128)[0],
    'swin_t_224': lambda: models.swin_step_runner(224)[0],
    'hca2': lambda: rules.hca2_runners()['run_donated'],
    'vit_lora': lambda: models.vit_lora_runner()[0],
}


def _gpu(a):
  return {'gpu': gpu.bench_gpu(a.repeats, a.peak_tflops, jsonl_log(a.json), a.gpu_scale,
                               tuple(filter(None, a.gpu_rows.split(','))))}


def _ntk_step(a):
  res = lambda n: gpu.scaled(n, a.gpu_scale)
  return {'ntk_step': gpu.bench_ntk_step(a.repeats, deeplab=(res(512), 16), clip=(res(224), 32),
                                         log=jsonl_log(a.json))}


# --only=NAME -> a function of the parsed flags giving {result part: its figures}, in the
# order of --only's choices.
RUNS = {
    'engine': lambda a: {'engine': engine.bench_engine(a.variant, a.repeats)},
    'hca2': lambda a: {'hca2': rules.bench_hca2(repeats=a.repeats)},
    'swin': lambda a: {f'swin_t_{res}': models.bench_swin_step(res, repeats=a.repeats)
                       for res in (128, 224)},
    'swin_memory': lambda a: {'swin_memory': models.bench_swin_memory()},
    'pipeline': lambda a: {'pipeline': pipeline.bench_pipeline()},
    'mfu': lambda a: {'mfu': models.bench_mfu(a.mfu_resolution, dtype=a.mfu_dtype,
                                              remat=a.mfu_remat, repeats=a.repeats,
                                              peak_tflops=a.peak_tflops)},
    'algorithms': lambda a: {'algorithms': engine.bench_algorithms(
        a.variant, a.repeats, tuple(a.algorithms.split(',')))},
    'rules': lambda a: {'rules': rules.bench_rules(
        a.repeats, a.rules.split(',') if a.rules else None)},
    'engine_agg': lambda a: {'engine_agg': engine.bench_engine_agg(
        tuple(a.scenarios.split(',')), a.repeats)},
    'augment': lambda a: {'augment': pipeline.bench_augment(repeats=a.repeats)},
    # The aggregation the engine runs around the mask comes after it.
    'top_rho': lambda a: {'top_rho': feddea.bench_top_rho(a.repeats), **RUNS['dea_engine'](a)},
    'dea_engine': lambda a: {'dea_engine': feddea.bench_dea_engine(repeats=max(a.repeats, 5))},
    'memory': lambda a: {'memory': models.bench_memory()},
    'unified_memory': lambda a: {'unified_memory': feddea.bench_unified_memory()},
    'many_memory': lambda a: {'many_memory': many_task.bench_many_memory()},
    'vit_lora': lambda a: {'vit_lora': models.bench_vit_lora(a.repeats)},
    'matu_server': lambda a: {'matu_server': many_task.bench_matu_server()},
    'matu_client': lambda a: {'matu_client': many_task.bench_matu_client()},
    'gpu': _gpu,
    'ntk_step': _ntk_step,
    'ntk_alpha': lambda a: {'ntk_alpha': many_task.bench_ntk_alpha(a.repeats)},
    'scan_conv': lambda a: {'scan_conv': models.bench_scan_conv(a.repeats)},
    'multihost': lambda a: {'multihost': multihost.bench_multihost()},
    'flower': lambda a: {'flower': multihost.bench_flower()},
    'odsf': lambda a: {'odsf': edge.bench(a)},
    'replicas': lambda a: {'replicas': replicas.bench_replicas()},
    'many_replicas': lambda a: {'many_replicas': replicas.bench_many_replicas()},
    'wrappers': lambda a: {'wrappers': fl.bench_wrappers(a.repeats)},
    'participation': lambda a: {'participation': fl.bench_participation(a.repeats)},
    'replica_scaling': lambda a: {'replica_scaling': replicas.bench_replica_scaling(
        tuple(int(r) for r in a.replicas.split(',')), peak_tflops=a.peak_tflops,
        log=jsonl_log(a.json))},
}
# --only=all (the default). The others are left out of it: they compile at paper scale,
# take minutes on a CPU, start processes or need an accelerator or an extra.
ALL = ('engine', 'pipeline', 'hca2', 'swin')
# The order in which the result parts are printed.
PARTS = ('engine', 'pipeline', 'hca2', 'swin_t_128', 'swin_t_224', 'swin_memory', 'mfu',
         'algorithms', 'rules', 'engine_agg', 'augment', 'top_rho', 'dea_engine', 'memory',
         'unified_memory', 'many_memory', 'vit_lora', 'matu_server', 'matu_client', 'gpu',
         'ntk_step', 'ntk_alpha', 'scan_conv', 'multihost', 'flower', 'odsf', 'replicas',
         'many_replicas', 'replica_scaling', 'wrappers', 'participation')
CHOICES = (*RUNS, 'all')


def main(argv=None, prog=None, epilog=None):
  p = argparse.ArgumentParser(prog=prog, description=__doc__, epilog=epilog,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--variant', default='default',
                 help='config variant of the engine and algorithm benchmarks: default, smoke '
                      'or paper (default: %(default)s)')
  p.add_argument('--repeats', type=int, default=3,
                 help='timed calls per measurement after compilation; the best is reported '
                      '(default: %(default)s)')
  p.add_argument('--only', default='all', choices=CHOICES,
                 help='one benchmark (see the list above); all = engine, pipeline, hca2 and '
                      'swin (default: %(default)s)')
  p.add_argument('--algorithms', default=','.join(engine.ALGORITHMS),
                 help='--only=algorithms: comma-separated algorithm configs to time '
                      '(default: %(default)s)')
  p.add_argument('--rules', default='',
                 help='--only=rules: comma-separated server rules to time, of: '
                      + ', '.join(rules.RULES).replace('%', '%%') + ' (default: all)')
  p.add_argument('--scenarios', default='1c,4c',
                 help='--only=engine_agg: comma-separated scenarios of 1c, 2c, 4c '
                      '(default: %(default)s)')
  p.add_argument('--mfu_resolution', type=int, default=512,
                 help='--only=mfu: input height and width of the Swin-T step '
                      '(default: %(default)s)')
  p.add_argument('--mfu_dtype', default='bfloat16', choices=['bfloat16', 'float32'],
                 help='--only=mfu: compute dtype of the step (default: %(default)s)')
  p.add_argument('--mfu_remat', action='store_true',
                 help='--only=mfu: recompute activations in the backward pass '
                      '(jax.checkpoint) instead of storing them')
  p.add_argument('--peak_tflops', type=float, default=0.0,
                 help="--only=mfu: the device's peak TFLOP/s that MFU divides by (default: "
                      "the bf16 peak of a known accelerator: H100, H200, A100; none on CPU)")
  p.add_argument('--gpu_scale', type=float, default=1.0,
                 help='--only=gpu / ntk_step: scale of the paper resolutions (e.g. 0.125 for a '
                      'CPU dry run; default: %(default)s)')
  p.add_argument('--gpu_rows', default='',
                 help='--only=gpu: comma-separated workloads of fedhca2_swin_t, ntk_a_deeplab, '
                      'ntk_a_deeplab_linear, ntk_b_clip, ntk_b_clip_linear, many_vit_b32_lora, '
                      'feddea_resnet18 (default: all)')
  p.add_argument('--replicas', default='1,4,16',
                 help='--only=replica_scaling: comma-separated replica counts R '
                      '(default: %(default)s)')
  p.add_argument('--json', default='', help='also write the results to this JSON file')
  p.add_argument('--reuse_host_memory', action=argparse.BooleanOptionalAction, default=True,
                 help='keep freed host memory mapped on CPU-only runs (fedjax_mtl.hostmem), '
                      'as fedjax_mtl.main does by default')
  p.add_argument('--cpu_isa', default='AVX2', choices=cpu_isa.ISAS,
                 help="cap XLA:CPU's code generation (fedjax_mtl.cpu_isa), as fedjax_mtl.main "
                      "does by default; 'native': the host's widest vector instructions")
  p.add_argument('--serve', default='', choices=['', *SERVE],
                 help='build one workload, then time one call per stdin line '
                      '(for scripts/compare_torch.py); empty: benchmark as --only says')
  a = p.parse_args(argv)
  # Before anything runs on a backend.
  reuse = a.reuse_host_memory and hostmem.reuse_freed_memory()
  cpu_isa.pin(a.cpu_isa)
  if a.serve:
    serve(SERVE[a.serve])
    return {}
  dev = jax.devices()[0]
  results = {'device': f'{dev.platform}:{dev.device_kind}', 'num_devices': jax.device_count(),
             'jax': jax.__version__, 'python': platform.python_version(),
             'reuse_host_memory': reuse}
  for name in ALL if a.only == 'all' else (a.only,):
    results.update(RUNS[name](a))
  print(f"reuse_host_memory{'':17s} {reuse}")
  for part in PARTS:
    for k, v in results.get(part, {}).items():
      print(f'{part}.{k:24s} {v:.3f}' if isinstance(v, float) else f'{part}.{k:24s} {v}')
  if a.json:
    with open(a.json, 'w') as f:
      json.dump(results, f, indent=2)
  return results


if __name__ == '__main__':
  main(sys.argv[1:], prog='python -m benchmarks')
