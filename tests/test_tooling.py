"""README commands, CI script, the scripts' --help pages and the benchmarks (benchmarks/)."""

import argparse
import ast
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme_commands():
  text = open(os.path.join(ROOT, 'README.md')).read()
  return re.findall(r'```bash\n(.*?)\n```', text, re.S)


def test_ci_runs_exactly_the_readme_test_command():
  cmds = _readme_commands()
  test_cmd = [c for c in cmds if 'pytest' in c]
  assert len(test_cmd) == 1
  ci = open(os.path.join(ROOT, '.ci', 'run')).read().strip().splitlines()
  assert ci[-1] == test_cmd[0]
  assert os.access(os.path.join(ROOT, '.ci', 'run'), os.X_OK)


def test_readme_main_command_names_an_existing_config():
  run = [c for c in _readme_commands() if 'fedjax_mtl.main' in c][0]
  cfg = re.search(r'--config=(\S+)', run).group(1)
  assert os.path.exists(os.path.join(ROOT, cfg)) and 'pip install -e .' in run
  r = subprocess.run([sys.executable, '-m', 'fedjax_mtl.main', '--help'], cwd=ROOT,
                     capture_output=True, text=True)
  assert '--workdir' in r.stdout and '--config' in r.stdout  # absl exits 1 after --help


def test_bench_engine_reports_every_figure():
  from benchmarks import engine
  out = engine.bench_engine('smoke', repeats=1)
  for k in ('round_compile_s', 'round_s', 'group_vmap_s', 'group_loop_s', 'vmap_speedup',
            'group_images_per_s', 'peak_memory_mb'):
    assert out[k] > 0, k
  assert out['vmap_speedup'] == out['group_loop_s'] / out['group_vmap_s']


def test_bench_script_runs_from_any_directory_and_lists_every_benchmark(tmp_path):
  """scripts/bench.py is `python -m benchmarks` from any working directory; the help
  names every --only mode."""
  from benchmarks import __main__ as cli
  r = subprocess.run([sys.executable, os.path.join(ROOT, 'scripts', 'bench.py'), '--help'],
                     cwd=tmp_path, capture_output=True, text=True)
  assert r.returncode == 0, r.stderr
  assert set(cli.RUNS) | {'all'} == set(cli.CHOICES) and set(cli.ALL) <= set(cli.RUNS)
  for name in cli.RUNS:
    assert f'--only={name} ' in cli.__doc__ and name in r.stdout, name


def test_compare_torch_worker_protocol():
  """scripts/compare_torch.py's worker protocol: 'ready', then one duration per line."""
  from benchmarks import torch_compare
  code = ('import sys; sys.path.insert(0, sys.argv[1]); from benchmarks.torch_compare import '
          'serve; print("library noise"); serve(lambda: (lambda: sum(range(10000))))')
  w = torch_compare.Worker([sys.executable, '-c', code, ROOT])
  try:
    times = [w.call() for _ in range(3)]
  finally:
    w.close()
  assert all(0 < t < 10 for t in times), times
  assert w.proc.returncode == 0


def test_bench_mfu_counts_model_flops_of_the_step():
  import jax
  from benchmarks import common, models
  small, f2, f3 = (models.model_flops(32, batch=b, encoder='swin_nano') for b in (1, 2, 3))
  # Per-image work plus a batch-independent optimizer update: linear in the batch.
  per_image = f2 - small
  assert 0 < per_image < small and abs((f3 - f2) - per_image) < 1e-3 * per_image
  out = models.bench_mfu(32, batch=1, encoder='swin_nano', dtype='float32', repeats=1,
                         peak_tflops=1.0)
  assert out['model_tflop_per_step'] * 1e12 == small
  assert out['achieved_tflops'] == small / out['step_s'] / 1e12
  assert out['mfu'] == out['achieved_tflops'] / 1.0
  if jax.devices()[0].platform == 'cpu':  # no peak is known for a CPU: no MFU claimed
    assert common.peak_flops(0.0) == 0.0


SCRIPTS = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, 'scripts')) if f.endswith('.py'))


def _rows_without_help(help_text: str) -> list[str]:
  """Argument rows of an argparse --help page that carry no explanation."""
  lines = help_text.splitlines()
  # The argument sections come after the description, which may itself hold '  -' lines.
  start = next(i for i, line in enumerate(lines)
               if re.fullmatch(r'(positional arguments|options|optional arguments):', line))
  missing = []
  for i, line in enumerate(lines[start:], start):
    if not re.match(r'  \S', line):
      continue
    beside = re.search(r'\S {2,}\S', line.strip())  # help after the invocation, 2+ spaces apart
    below = i + 1 < len(lines) and re.match(r' {4,}\S', lines[i + 1])  # help on the next line
    if not (beside or below):
      missing.append(line.split()[0].rstrip(','))
  return missing


def test_help_check_finds_a_flag_without_help():
  p = argparse.ArgumentParser(prog='x', description='Example:\n  --fake\n',
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--explained', help='a flag with help')
  p.add_argument('--bare')
  p.add_argument('--a_very_long_flag_name_that_wraps', help='help on the next line')
  p.add_argument('--last_bare', action='store_true')
  assert _rows_without_help(p.format_help()) == ['--bare', '--last_bare']


@pytest.mark.parametrize('script', SCRIPTS)
def test_script_help_prints_the_whole_description_and_explains_every_flag(script):
  # A subprocess, as a user runs it: bench_torch.py's optional torch must not be needed.
  path = os.path.join(ROOT, 'scripts', script + '.py')
  r = subprocess.run([sys.executable, path, '--help'], cwd=ROOT, capture_output=True, text=True)
  assert r.returncode == 0, r.stderr
  doc = ast.get_docstring(ast.parse(open(path).read()))
  assert ' '.join(doc.split()) in ' '.join(r.stdout.split())  # not cut after its first line
  assert _rows_without_help(r.stdout) == []


def test_gpu_linearised_step_matches_plain_at_the_linearisation_point():
  """`benchmarks/gpu.py` times NTKFedAvg's linearised step against the plain one:
  at φ = c both steps see the same loss and make the same first update; the
  linearised step costs more FLOPs; `report` gives per-client memory and MFU."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from benchmarks import gpu
  tasks = [gpu.clip_task(32, 2, jnp.float32, linear=lin, model='clip_tiny_test')
           for lin in (False, True)]
  outs = []
  for t in tasks:
    state = jax.jit(t.init)(jax.random.PRNGKey(0))
    x = jax.random.uniform(jax.random.PRNGKey(1), t.x.shape) * 255
    y = jnp.arange(t.y.shape[0]) % 10
    outs.append(jax.jit(t.step)(*state, *t.consts(state), x, y, jax.random.PRNGKey(2)))
  np.testing.assert_allclose(outs[0][3], outs[1][3], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(outs[0][0]), jax.tree.leaves(outs[1][0])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  plain, linear = (gpu.step_flops(t) for t in tasks)
  assert 1.2 * plain < linear < 3 * plain
  r = gpu.report(tasks[1], repeats=1, model_flops=linear, peak=1e12)
  assert r['loss_finite'] and r['client_gib'] > r['args_gib'] > 0
  assert r['mfu'] == linear / r['step_s'] / 1e12
