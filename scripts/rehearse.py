#!/usr/bin/env python
"""Rehearse a paper config at its real shapes: what a full paper run costs here.

    python scripts/rehearse.py --config=configs/hca2.py:paper,scenario=pascal_st_nyud_mt_1c \\
        --data_dir=/data/fake --out=runs/rehearse_hca2_1c

runs the real pipeline of the config on the data in `--data_dir` (real data, or
the format-true copy `scripts/make_fake_datasets.py` writes), with every client
capped at `--steps` local steps per round (`max_steps_per_round`):

1. cache build: each split's cache (`data/cache.py`), unless already there;
2. feed: training chunks of the first client from its cache, host augmentation and
   the raw feed of device augmentation, images per CPU second, and the device
   augmentation on the accelerator;
3. a fresh run in this process (the main job's loop, `train.run`), sent SIGTERM once
   it has compiled: it finishes round 1, saves it and stops (preemption);
4. the same run resumed in this process (its programs already compiled) for rounds 2..`--rounds` (evaluation on the
   whole test split at round 2 with the cheap metrics and at the last round with
   odsF, checkpoints every round), each client group's chunk program and the
   aggregation timed as the engine calls them (one wait per call);
5. one JSON line of figures (`<out>/rehearsal.json`) and a table row: compile
   seconds per program, peak host RSS, step seconds per group, feed images/s per
   core, evaluation seconds, checkpoint bytes and seconds, and the extrapolated wall
   time of the full paper run on this machine: the rounds, steps, evaluations and
   checkpoints of the config at the full datasets' sizes (the rehearsal's split sizes
   scaled up when the data are a `--fraction` copy).

Extra `--config.<field>=<value>` flags are passed to the run (e.g.
`--config.model.dtype=bfloat16 --config.model.remat=True` on a GPU), and so is the main
job's `--noreuse_host_memory` (freed host memory returned to the system). Bad input (no
data dir, a config that does not load, an incomplete cache) stops with one `error:`
line before anything is written.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import resource
import signal
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# The real splits' sizes (train, test) of the dense datasets: the extrapolation's.
FULL_SIZES = {'pascal': (4998, 5105), 'nyud': (795, 654)}


# The main job's flags a rehearsal passes on as they are.
MAIN_FLAGS = ('--reuse_host_memory', '--noreuse_host_memory')


def fail(message: str) -> None:
  print('error: ' + ' '.join(str(message).split()), file=sys.stderr)
  sys.exit(2)


def parse(argv):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--config', required=True, help='configs/<algorithm>.py:paper[,...]')
  p.add_argument('--data_dir', required=True, help='folder holding PASCALContext/ and NYUDv2/ '
                 '(dense) or the many-task data (many.data_dir)')
  p.add_argument('--out', required=True, help='rehearsal folder (workdir, XLA cache, figures)')
  p.add_argument('--steps', type=int, default=4, help='local steps per client per round')
  p.add_argument('--rounds', type=int, default=3, help='rounds of the rehearsal (>= 3)')
  p.add_argument('--workers', type=int, default=0, help='cache build processes (0 = all cores)')
  p.add_argument('--kill_after_s', type=float, default=0.,
                 help='SIGTERM the fresh run this long after it has compiled (default: at once)')
  p.add_argument('--no_feed', action='store_true', help='skip the feed measurement')
  a, rest = p.parse_known_args(argv)
  bad = [r for r in rest if not r.startswith('--config.') and r not in MAIN_FLAGS]
  if bad:
    fail(f'unknown argument {bad[0]!r}; valid: --config, --data_dir, --out, --steps, --rounds, '
         '--workers, --kill_after_s, --no_feed, --config.<field>=<value> overrides and the '
         'main job\'s ' + ', '.join(MAIN_FLAGS))
  if a.rounds < 3:
    fail(f'--rounds={a.rounds}: the rehearsal needs 3 (a killed round, a steady one, the last)')
  if a.steps < 1:
    fail(f'--steps={a.steps}: at least 1')
  return a, rest


def load(a, extra, workdir: str):
  """The run's config (the paper config, the rehearsal's overrides, then `extra`) as the
  main job parses it, and the main job's flags; bad input ends here with one line."""
  from fedjax_mtl import config_doc, validate
  from fedjax_mtl import main as main_lib
  from fedjax_mtl.errors import ConfigError
  try:
    paper = config_doc.load_config(a.config)
  except ConfigError as e:
    fail(e)
  flags = {'num_rounds': a.rounds, 'max_steps_per_round': a.steps, 'eval_every': 2,
           'checkpoint_every': 1, 'progress': False}
  if paper.get('setting', 'dense') == 'dense':
    flags['data.data_dir'] = a.data_dir
  else:
    flags['many.data_dir'] = a.data_dir
  # Pretrained weights not converted here: random init (the same shapes and costs).
  missing = lambda w: (w not in ('', 'warmup') and not os.path.isfile(os.path.join(ROOT, w))
                       and not os.path.isfile(w))
  if 'model' in paper and missing(paper.model.get('pretrained_path', '')):
    flags['model.pretrained_path'] = ''
  if 'many' in paper and missing(paper.many.get('pretrained', '')):
    flags['many.pretrained'] = ''
  argv = ([f'--config={a.config}', f'--workdir={workdir}']
          + [f'--config.{k}={v}' for k, v in flags.items()] + list(extra))
  saved, sys.argv = sys.argv, ['rehearse'] + argv  # ml_collections reads overrides there
  try:
    main_lib.parse_flags(sys.argv)  # one `error:` line and exit 2 on bad input
  finally:
    sys.argv = saved
  config = main_lib.FLAGS.config
  # This process compiles as the main job does (the same programs and cache keys).
  from fedjax_mtl import cpu_isa, hostmem
  if main_lib.FLAGS.reuse_host_memory:
    hostmem.reuse_freed_memory()
  cpu_isa.pin(main_lib.FLAGS.cpu_isa)
  try:
    validate.check_run(config, workdir)
  except ConfigError as e:
    fail(e)
  return paper, config, argv


def build_caches(config, workers: int) -> dict:
  """Each dense split's cache, built when missing (seconds, images, images/s); every
  missing dataset is found before any cache is written."""
  from fedjax_mtl import scenarios
  from fedjax_mtl.data import cache as cache_lib
  from fedjax_mtl.data import real
  todo, out = [], {}
  for d in sorted({block[0] for block in scenarios.layout(config.scenario)}):
    for split in ('train', real.TEST_SPLIT):
      path = real.cache_path(config, d, split)
      root = os.path.join(real.resolve_data_dir(config), real.DATASET_DIRS[d])
      if cache_complete(path):
        out[f'{d}_{split}'] = {'built': False, 'images': len(cache_lib.CachedDataset(path))}
      elif not os.path.isdir(root):
        fail(f'{root} does not exist (nor its cache {path}); write a format-true copy with '
             f'python scripts/make_fake_datasets.py --out={real.resolve_data_dir(config)}')
      else:
        todo.append((d, split, root, path))
  for d, split, root, path in todo:
    t0 = time.perf_counter()
    cache_lib.prepare(d, root, split, path, workers=workers or os.cpu_count() or 1,
                      verbose=False)
    dt = time.perf_counter() - t0
    n = len(cache_lib.CachedDataset(path))
    out[f'{d}_{split}'] = {'built': True, 'seconds': dt, 'images': n, 'images_per_s': n / dt}
  return out


def cache_complete(path: str) -> bool:
  from fedjax_mtl.data import cache as cache_lib
  try:
    cache_lib.CachedDataset(path)
    return True
  except Exception:  # noqa: BLE001 - absent or incomplete: (re)built
    return False


def feed_rates(config, batch: int = 8, chunks: int = 3) -> dict:
  """Images per CPU second of the first PASCAL (else NYUD) client's training chunks from
  its cache: host augmentation, and the raw feed of device augmentation, plus the device
  augmentation's images/s on the accelerator."""
  import jax
  from benchmarks.pipeline import Cycle
  from fedjax_mtl import experiment, sources
  from fedjax_mtl.data import device_augment as DA
  from fedjax_mtl.data import real
  exp = experiment.build(config)
  g = 0
  spec = sources.group_feed_spec(exp, exp.fed.groups[g])
  source = real.client_source(config, exp.fed.clients[spec.client_ids[0]])
  n = (chunks + 1) * 2 * batch
  client = [Cycle(source, n)]
  one = real.GroupFeedSpec(dataset=spec.dataset, client_ids=spec.client_ids[:1], num_total=1,
                           counts=(n,), epochs=1, batch_size=batch, chunk_steps=2, keys=spec.keys)
  ts = sources.train_transforms(exp)
  size = sources.sizes(exp)
  out = {'dataset': spec.dataset}
  k = chunks

  def per_cpu_s(c):
    c[0]
    t0 = time.process_time()
    for i in range(1, k + 1):
      c[i]
    return k * 2 * batch / (time.process_time() - t0)

  host = real.TrainChunks([one], [client], 1, size, 0, ts)
  raw = real.TrainChunks([one], [client], 1, size, 0, ts, augment='device')
  out['host_augment_images_per_cpu_s'] = per_cpu_s(host)
  out['raw_feed_images_per_cpu_s'] = per_cpu_s(raw)
  x = jax.device_put({key[2:]: v for key, v in raw[0].items() if key.startswith('x/')})
  augment = DA.make_chunk_augmenter(DA.config_from_transforms(ts[spec.dataset]), 0)
  jax.block_until_ready(augment(x))
  t0 = time.perf_counter()
  for _ in range(3):
    jax.block_until_ready(augment(x))
  out['device_augment_images_per_s'] = 3 * 2 * batch / (time.perf_counter() - t0)
  return out


class CompileLog(logging.Handler):
  """XLA's compile seconds of each program (jax_log_compiles' records)."""

  def __init__(self):
    super().__init__(logging.WARNING)
    self.compiles: list[tuple[str, float]] = []

  def emit(self, record):
    m = re.search(r'Finished XLA compilation of (.+?) in ([0-9.]+) sec', record.getMessage())
    if m:
      self.compiles.append((m.group(1), float(m.group(2))))


def fresh_run(a, config, workdir: str) -> dict:
  """The run from round 0 in this process, sent SIGTERM once it has compiled: it
  finishes round 1, saves it and stops (`preempt.Stopped`, the main job's exit 75)."""
  import threading
  import jax
  from fedjax_mtl import engines, preempt, train, validate
  from fedjax_mtl import workdir as workdir_lib
  compiles = CompileLog()
  logging.getLogger('jax').addHandler(compiles)
  jax.config.update('jax_log_compiles', True)
  timing = os.path.join(workdir, 'timing.jsonl')
  signalled, done = [], threading.Event()

  def kill_once_compiled():
    while not done.is_set():
      if os.path.isfile(timing) and os.path.getsize(timing):
        time.sleep(a.kill_after_s)
        signalled.append(time.perf_counter() - t0)
        os.kill(os.getpid(), signal.SIGTERM)
        return
      time.sleep(0.1)

  t0 = time.perf_counter()
  watcher = threading.Thread(target=kill_once_compiled, daemon=True)
  watcher.start()
  stopped, stop_line = None, ''
  try:
    validate.check_run(config, workdir)
    with workdir_lib.primary_lock(workdir):
      workdir_lib.check_config(config, workdir)
      train.run(engines.build(config), workdir)
  except preempt.Stopped as e:
    # Only the round: the exception's traceback holds the run's frames, and with them
    # its whole federation state (8 GB for hca2 4c) while the resumed run restores it.
    stopped, stop_line = e.round, str(e)
  finally:
    done.set()
    jax.config.update('jax_log_compiles', False)
    logging.getLogger('jax').removeHandler(compiles)
  if stopped != 1:
    fail(f'the fresh run was not stopped after round 1 by SIGTERM (stopped after round '
         f'{stopped}); raise --rounds '
         'or lower --kill_after_s')
  rows = [json.loads(line) for line in open(timing)]
  return {'wall_s': time.perf_counter() - t0, 'sigterm_at_s': signalled[0],
          'stopped': stop_line, 'compile_s': rows[0]['compile_s'], 'rounds': rows[1:],
          'xla_compiles': [c for c in compiles.compiles if c[1] >= 0.5]}


class Timed:
  """A program wrapped to wait for its result and record the seconds of each call."""

  def __init__(self, fn, name: str, log: list):
    self.fn, self.name, self.log = fn, name, log

  def __call__(self, *args, **kwargs):
    import jax
    t0 = time.perf_counter()
    out = jax.block_until_ready(self.fn(*args, **kwargs))
    self.log.append((self.name, time.perf_counter() - t0))
    return out

  def __getattr__(self, name):
    return getattr(self.fn, name)


def resumed_run(config, workdir: str) -> tuple[dict, list, object]:
  """Rounds 2.. in this process, the engine's programs timed as it calls them."""
  from fedjax_mtl import engines, train, validate
  from fedjax_mtl import workdir as workdir_lib
  validate.check_run(config, workdir)
  calls: list = []
  with workdir_lib.primary_lock(workdir):
    workdir_lib.check_config(config, workdir)
    engine = engines.build(config)
    if config.get('setting', 'dense') == 'dense':
      p = engine.programs
      p.chunk_fns[:] = [Timed(f, f'group {g}', calls) for g, f in enumerate(p.chunk_fns)]
      p.__dict__['agg_fn_streamed'] = Timed(p.agg_fn_streamed, 'aggregate', calls)
    else:
      import dataclasses
      engine.run = dataclasses.replace(engine.run,
                                       round_fn=Timed(engine.run.round_fn, 'round', calls))
    t0 = time.perf_counter()
    result = train.run(engine, workdir)
    wall = time.perf_counter() - t0
  return {'wall_s': wall, 'final_rows': len(result['eval'])}, calls, engine


def dir_bytes(path: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def extrapolate(config, engine, figures: dict) -> dict:
  """The full paper run's wall time on this machine from the rehearsal's figures."""
  rounds_full = int(figures['paper_rounds'])
  out = {}
  if config.get('setting', 'dense') == 'dense':
    exp = engine.exp
    scale = {d: FULL_SIZES[d][0] / max(1, figures['train_images'][d]) for d in FULL_SIZES
             if any(c.dataset == d for c in exp.fed.clients)}
    full_steps = []
    for g, spec in enumerate(exp.fed.groups):
      per_epoch = int(max(spec.counts) * scale[spec.dataset]) // int(config.batch_size)
      full_steps.append(spec.local_epochs * per_epoch)
    train_round = sum(n * figures['step_s'][f'group {g}'] for g, n in enumerate(full_steps))
    test_scale = sum(FULL_SIZES[d][1] for d in scale) / max(1, sum(
        figures['test_images'][d] for d in scale))
    out['full_steps_per_round'] = full_steps
  else:  # every slot of a round runs the same number of (masked) steps
    many = figures['many']
    per_step = figures['step_s']['round'] / max(1, many['steps_per_round'])
    full = many['full_steps_per_round']
    # The round's host work outside the program (the round feed's gather and transfer)
    # grows with the examples it moves.
    train_round = per_step * full + many['host_s_per_round'] * many['train_scale']
    test_scale = many['test_scale']
    out['full_steps_per_round'] = [full]
  from fedjax_mtl.train import every_and_last
  evals = len(every_and_last(rounds_full, int(figures['paper_eval_every'])))
  ckpts = len(every_and_last(rounds_full, int(figures['paper_checkpoint_every'])))
  cheap, final = figures['eval_s']['cheap'] * test_scale, figures['eval_s']['final'] * test_scale
  compile_total = sum(s for _, s in figures['xla_compiles']) or sum(figures['compile_s'].values())
  total = (compile_total + rounds_full * (train_round + figures['agg_s'])
           + (evals - 1) * cheap + final + ckpts * figures['checkpoint_s'])
  out.update({'train_s_per_round': train_round, 'eval_s_cheap_full': cheap,
              'eval_s_final_full': final, 'evaluations': evals, 'checkpoints': ckpts,
              'wall_hours': total / 3600})
  out['h100_estimate'] = gpu_estimate(config, figures, rounds_full * train_round,
                                      (evals - 1) * cheap + min(cheap, final),
                                      max(0., final - cheap),
                                      rounds_full * figures['agg_s'] + ckpts * figures['checkpoint_s'])
  return out


# One client's training step on the GPU, ms (bf16, remat; BENCHMARKS.md, "the client
# step of each paper configuration", H200: the same dense peak as an H100), and the
# step it is compared with here: one client's step of the rehearsal's first group.
GPU_CLIENT_STEP_MS = {'swin_t': 19.3, 'resnet18_os8': 40.7, 'resnet18_os8 linear': 44.1,
                      'vit_b32 lora': 5.8}


def gpu_estimate(config, figures: dict, train_s: float, eval_s: float, odsf_s: float,
                 other_s: float) -> dict | None:
  """The full run on one H100, an estimate: this CPU's training and evaluation seconds
  divided by the speed-up the GPU has on one client's step of the same model (its
  measured GPU step over the client step measured here), odsF on 16 host cores instead
  of this machine's, aggregation and checkpoints as here; compilation not included."""
  linear = 'ntkfedavg' in str(config.algorithm)
  if config.get('setting', 'dense') == 'dense':
    key = str(config.model.encoder)
    clients = figures['group_clients'][0]
    cpu_step = figures['step_s']['group 0'] / clients
  else:
    key = str(config.many.model) + ' lora'  # the many-task setting trains LoRA adapters
    cpu_step = figures['step_s']['round'] / max(1, figures['many']['steps_per_round'])
    cpu_step /= max(1, figures['many']['slots'])
  key = key + (' linear' if linear and key + ' linear' in GPU_CLIENT_STEP_MS else '')
  if key not in GPU_CLIENT_STEP_MS:
    return None
  speedup = cpu_step / (GPU_CLIENT_STEP_MS[key] / 1e3)
  odsf_16 = odsf_s * (figures['host_cores'] / 16)  # the odsF pool on 16 host cores
  hours = ((train_s + eval_s) / speedup + odsf_16 + other_s) / 3600
  return {'model': key, 'gpu_client_step_ms': GPU_CLIENT_STEP_MS[key],
          'cpu_client_step_s': cpu_step, 'speedup': speedup, 'hours': hours}


def many_task_scale(config, engine, data_dir: str, rounds: dict, calls: list) -> dict:
  """The many-task run's steps per round here and at the full datasets' sizes, and the
  scale of its train and test examples: from `fake_datasets.json` (written by
  `scripts/make_fake_datasets.py` beside or above `data_dir`) for a `--fraction`
  copy, 1 for real data."""
  import math
  import numpy as np
  run = engine.run
  s = run.setting
  scale = {t: 1.0 for t in s.tasks}
  test_scale_of = {}  # tasks whose test split was written on its own (--test_fraction)
  bench = {'tfds8': 'tasks8', 'folder30': 'tasks30'}.get(str(config.many.benchmark))
  for folder in (data_dir, os.path.dirname(os.path.abspath(data_dir))):
    path = os.path.join(folder, 'fake_datasets.json')
    if bench and os.path.isfile(path):
      entry = json.load(open(path)).get(bench, {})
      for t in s.tasks:
        if t in entry.get('counts', {}):
          counts, full = entry['counts'][t], entry['full'][t]
          scale[t] = full['train'] / max(1, counts['train'])
          if 'test' in counts:
            test_scale_of[t] = full['test'] / max(1, counts['test'])
      break
  batch = int(config.batch_size)
  m = config.many
  from fedjax_mtl.manytask import setting as setting_lib
  epochs = setting_lib.task_epochs(m, s.tasks)
  epochs = int(np.max(epochs)) if epochs is not None else int(m.local_epochs)

  def steps(counts):
    return int(m.local_steps) or epochs * max(1, math.ceil(max(counts) / batch))
  here = steps(s.counts)  # the steps a round ran here (capped by max_steps_per_round)
  here = min(here, int(config.max_steps_per_round)) if int(config.max_steps_per_round) else here
  full = steps([c * scale[s.tasks[t]] for c, (_, t) in zip(s.counts, s.pairs)])
  train = sum(s.counts)
  train_scale = sum(c * scale[s.tasks[t]] for c, (_, t) in zip(s.counts, s.pairs)) / train
  test = [len(y) for _, y in run.data.test]
  # A task without a test split of its own (RESISC45, EuroSAT) tests on a part of train.
  test_scale = sum(n * test_scale_of.get(t, scale[t])
                   for n, t in zip(test, s.tasks)) / max(1, sum(test))
  # Host seconds of a steady round outside its program: the round's wall less the
  # program, its evaluation and its checkpoint (the resumed run's rounds after its first).
  resumed = [rounds[k] for k in sorted(rounds) if k >= 2]
  prog = [dt for name, dt in calls if name == 'round']
  host = [r['seconds'] - r.get('eval_s', 0.) - r.get('checkpoint_s', 0.) - dt
          for r, dt in list(zip(resumed, prog))[1:]]
  return {'task_scale': scale, 'steps_per_round': here, 'full_steps_per_round': full,
          'slots': int(s.num_slots),
          'train_scale': train_scale, 'test_scale': test_scale,
          'host_s_per_round': max(0., min(host)) if host else 0.}


def main(argv=None) -> int:
  a, extra = parse(sys.argv[1:] if argv is None else argv)
  from fedjax_mtl.errors import ConfigError
  if not os.path.isdir(a.data_dir):
    fail(f'data dir {a.data_dir!r} does not exist; write a format-true copy with python '
         f'scripts/make_fake_datasets.py --out={a.data_dir}')
  workdir = os.path.join(a.out, 'workdir')
  if os.path.exists(workdir) and os.listdir(workdir):
    fail(f'{workdir} holds an earlier rehearsal; choose another --out or remove it')
  paper, config, run_argv = load(a, extra, workdir)
  import jax
  figures = {'config': a.config, 'flags': run_argv[2:],
             'device': jax.devices()[0].device_kind, 'host_cores': os.cpu_count(),
             'paper_rounds': int(paper.num_rounds), 'paper_eval_every': int(paper.eval_every),
             'paper_checkpoint_every': int(paper.checkpoint_every)}
  dense = config.get('setting', 'dense') == 'dense'
  try:
    if dense:
      print('rehearse: caches', flush=True)
      figures['caches'] = build_caches(config, a.workers)
      if not a.no_feed:
        print('rehearse: feed', flush=True)
        figures['feed'] = feed_rates(config)
  except ConfigError as e:
    fail(e)
  os.makedirs(a.out, exist_ok=True)
  print('rehearse: fresh run (SIGTERM once compiled)', flush=True)
  fresh = fresh_run(a, config, workdir)
  figures['fresh'] = fresh
  import gc
  from fedjax_mtl import hostmem
  gc.collect()
  hostmem.release_freed_memory()  # the fresh run's freed buffers (8 GB of state for hca2 4c)
  print(f'rehearse: resumed run, rounds 2..{a.rounds}', flush=True)
  t0 = time.perf_counter()
  resumed, calls, engine = resumed_run(config, workdir)
  figures['resumed'] = resumed
  rows = [json.loads(line) for line in open(os.path.join(workdir, 'timing.jsonl'))]
  resume_compile = [r for r in rows if 'compile_s' in r][-1]['compile_s']
  timed = {r['round']: r for r in rows if 'seconds' in r}
  # The fresh run compiled every program cold: XLA's seconds of each (JAX_LOG_COMPILES;
  # the streamed chunk trainers and the aggregation compile on their first call, after
  # the compile report's programs), and the compile report's seconds.
  firsts, steady = set(), {}
  for name, dt in calls:  # the first call of each program compiles (or loads) it
    if name in firsts:
      steady.setdefault(name, []).append(dt)
    firsts.add(name)
  chunk = int(config.data.get('chunk_steps', 2)) if dense else 1
  figures['step_s'] = {name: min(v) / (chunk if name.startswith('group') else 1)
                       for name, v in steady.items() if name != 'aggregate'}
  figures['agg_s'] = min(steady.get('aggregate', [0.]))
  first_call = {}
  for name, dt in calls:
    first_call.setdefault(name, dt)
  figures['compile_s'] = fresh['compile_s']
  figures['xla_compiles'] = fresh['xla_compiles']
  figures['first_call_s'] = first_call  # the resumed run's first calls (compiled already)
  figures['resume_compile_s'] = resume_compile
  last = a.rounds
  figures['round_s'] = {r: timed[r]['seconds'] for r in sorted(timed)}
  figures['eval_s'] = {'cheap': timed[2]['eval_s'], 'final': timed[last]['eval_s']}
  figures['checkpoint_s'] = max(r['checkpoint_s'] for r in timed.values())
  ckdir = os.path.join(workdir, 'checkpoints')
  steps_saved = sorted(int(s) for s in os.listdir(ckdir) if s.isdigit())
  figures['checkpoint_bytes'] = dir_bytes(os.path.join(ckdir, str(steps_saved[-1])))
  figures['peak_rss_gib'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
  stats = jax.devices()[0].memory_stats() or {}
  if 'peak_bytes_in_use' in stats:
    figures['peak_device_gib'] = stats['peak_bytes_in_use'] / 2**30
  if dense:
    from fedjax_mtl.data import real
    figures['train_images'] = {d: len(real.open_split(config, d, 'train'))
                               for d in FULL_SIZES if f'{d}_train' in figures['caches']}
    figures['test_images'] = {d: len(real.open_split(config, d, real.TEST_SPLIT))
                              for d in FULL_SIZES if f'{d}_train' in figures['caches']}
    figures['group_clients'] = [g.num_real for g in engine.exp.fed.groups]
  else:
    figures['many'] = many_task_scale(config, engine, a.data_dir, timed, calls)
  figures['extrapolated'] = extrapolate(config, engine, figures)
  figures['mfu'] = mfu(config, engine, figures) if dense else None
  figures['rehearsal_wall_s'] = time.perf_counter() - t0 + fresh['wall_s']
  figures['table_row'] = table_row(figures)
  with open(os.path.join(a.out, 'rehearsal.json'), 'w') as f:
    json.dump(figures, f, indent=1, default=str)
  print(json.dumps(figures, default=str))
  print(figures['table_row'])
  return 0


def mfu(config, engine, figures: dict) -> dict | None:
  """Each group step's model FLOPs utilisation, from the per-client FLOPs of one Swin-T
  step at 512², batch 8 (docs/benchmarks/step_flops.json) and the device's peak."""
  from benchmarks.common import peak_flops
  peak = peak_flops()
  path = os.path.join(ROOT, 'docs', 'benchmarks', 'step_flops.json')
  if not peak or config.model.encoder != 'swin_t' or not os.path.isfile(path):
    return None
  per_client = json.load(open(path))['fedhca2_swin_t'] * int(config.batch_size) / 8
  return {f'group {g}': per_client * n / figures['step_s'][f'group {g}'] / peak
          for g, n in enumerate(figures['group_clients'])
          if f'group {g}' in figures['step_s']}


def table_row(f: dict) -> str:
  """One row of BENCHMARKS.md's rehearsal table."""
  comp = [s for _, s in f['xla_compiles']] or list(f['compile_s'].values())
  steps = ', '.join(f'{v:.2f}' for v in f['step_s'].values())
  feed = f.get('feed') or {}
  ex = f['extrapolated']
  return (f"| {f['config']} | {f['device']} | {max(comp):.0f} ({sum(comp):.0f}) "
          f"| {f['peak_rss_gib']:.1f} | {steps} | {f['agg_s']:.2f} "
          f"| {feed.get('host_augment_images_per_cpu_s', float('nan')):.1f} / "
          f"{feed.get('raw_feed_images_per_cpu_s', float('nan')):.1f} "
          f"| {f['eval_s']['cheap']:.0f} / {f['eval_s']['final']:.0f} "
          f"| {f['checkpoint_bytes'] / 2**20:.0f} MiB, {f['checkpoint_s']:.1f} s "
          f"| {ex['wall_hours']:.1f} |")


def run_main() -> int:
  from fedjax_mtl.errors import ConfigError
  try:
    return main()
  except ConfigError as e:  # found while the runs open their data or restore
    fail(e)


if __name__ == '__main__':
  sys.exit(run_main())
