"""README commands, CI script and the benchmark script."""

import argparse
import importlib
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'scripts'))


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
  import bench
  out = bench.bench_engine('smoke', repeats=1)
  for k in ('round_compile_s', 'round_s', 'group_vmap_s', 'group_loop_s', 'vmap_speedup',
            'group_images_per_s', 'peak_memory_mb'):
    assert out[k] > 0, k
  assert out['vmap_speedup'] == out['group_loop_s'] / out['group_vmap_s']


def test_compare_torch_worker_protocol():
  """scripts/compare_torch.py's worker protocol: 'ready', then one duration per line."""
  import compare_torch
  code = ('import sys; sys.path.insert(0, sys.argv[1]); from compare_torch import serve; '
          'print("library noise"); serve(lambda: (lambda: sum(range(10000))))')
  w = compare_torch.Worker([sys.executable, '-c', code, os.path.join(ROOT, 'scripts')])
  try:
    times = [w.call() for _ in range(3)]
  finally:
    w.close()
  assert all(0 < t < 10 for t in times), times
  assert w.proc.returncode == 0


def test_bench_mfu_counts_model_flops_of_the_step():
  import bench
  import jax
  small, f2, f3 = (bench.model_flops(32, batch=b, encoder='swin_nano') for b in (1, 2, 3))
  # Per-image work plus a batch-independent optimizer update: linear in the batch.
  per_image = f2 - small
  assert 0 < per_image < small and abs((f3 - f2) - per_image) < 1e-3 * per_image
  out = bench.bench_mfu(32, batch=1, encoder='swin_nano', dtype='float32', repeats=1,
                        peak_tflops=1.0)
  assert out['model_tflop_per_step'] * 1e12 == small
  assert out['achieved_tflops'] == small / out['step_s'] / 1e12
  assert out['mfu'] == out['achieved_tflops'] / 1.0
  if jax.devices()[0].platform == 'cpu':
    assert bench.bench_mfu(32, batch=1, encoder='swin_nano', dtype='float32',
                           repeats=1)['peak_tflops'] == 0.0


@pytest.mark.parametrize('script', ['bench', 'compare'])
def test_script_help_prints_the_whole_description_and_explains_every_flag(
    script, monkeypatch, capsys):
  module = importlib.import_module(script)
  parsers = []
  parse = argparse.ArgumentParser.parse_args

  def keep(self, *args, **kwargs):
    parsers.append(self)
    return parse(self, *args, **kwargs)

  monkeypatch.setattr(argparse.ArgumentParser, 'parse_args', keep)
  with pytest.raises(SystemExit) as e:
    module.main(['--help'])
  assert e.value.code == 0
  out = ' '.join(capsys.readouterr().out.split())
  assert ' '.join(module.__doc__.split()) in out  # not cut after its first line
  assert [a.dest for a in parsers[0]._actions if not a.help] == []
