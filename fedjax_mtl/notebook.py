"""What the notebooks in `notebooks/` share: find the checkout, set JAX up, show runs.

    from fedjax_mtl import notebook
    backend = notebook.setup()          # 'gpu', 'tpu' or 'cpu'
    config = notebook.load_config('configs/hca2.py:paper', {'num_rounds': 10})
    notebook.show('runs/x/results.md')  # a table or a plot of a run
    notebook.compare_figure({'fedavg': 'runs/a', 'fedhca2': 'runs/b'})

`setup()` is what `python -m fedjax_mtl.main` does before a run (keep freed host
memory on a CPU-only machine, the persistent XLA cache), plus: the working directory
becomes the repository root (the folder holding `configs/`), so the notebooks' paths
(`configs/hca2.py`, `scripts/compare.py`) hold wherever the notebook was opened.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping

from fedjax_mtl import hostmem, report


def repo_root(start: str | None = None) -> str:
  """The nearest folder at or above `start` (default: the working directory) that holds
  `configs/hca2.py`; ValueError naming `start` when there is none."""
  here = os.path.abspath(start or os.getcwd())
  d = here
  while True:
    if os.path.isfile(os.path.join(d, 'configs', 'hca2.py')):
      return d
    parent = os.path.dirname(d)
    if parent == d:
      raise ValueError(f'no fedjax_mtl checkout (a folder with configs/hca2.py) at or above '
                       f'{here!r}; open the notebook inside the repository')
    d = parent


def setup(cache_dir: str = '~/.cache/fedjax_mtl/xla') -> str:
  """Prepare this process for runs; returns JAX's backend ('gpu', 'tpu' or 'cpu').

  Changes the working directory to the repository root and puts the root and its
  `scripts/` on `sys.path`; on a CPU-only machine keeps freed host memory for reuse
  (before JAX creates its backends; see `fedjax_mtl.hostmem`); sets the persistent
  compilation cache to `cache_dir` unless it is 'none' or `JAX_COMPILATION_CACHE_DIR`
  names one; prints the devices.
  """
  root = repo_root()
  os.chdir(root)
  for p in (os.path.join(root, 'scripts'), root):
    if p not in sys.path:
      sys.path.insert(0, p)
  hostmem.reuse_freed_memory()
  from fedjax_mtl import compare  # the cache as every script sets it
  compare.use_xla_cache(cache_dir)
  import jax
  devices = jax.devices()
  kinds = sorted({d.device_kind for d in devices})
  print(f'JAX {jax.__version__}: {len(devices)} {jax.default_backend()} device(s) '
        f'({", ".join(kinds)}); working directory {root}')
  return jax.default_backend()


def load_config(spec: str, overrides: Mapping[str, object] | None = None):
  """The config of `configs/x.py[:arg]` (as `--config` loads it) with dotted fields set
  to Python values, e.g. `{'num_rounds': 10, 'data.resolution': {'pascal': (256, 256)}}`.
  ConfigError with the near or valid names (as `scripts/compare.py`) when a field is
  unknown."""
  from fedjax_mtl import config_doc
  config = config_doc.load_config(spec)
  for key, value in (overrides or {}).items():
    node, last = config_doc.field_parent(config, key)
    node[last] = value
  return config


def show(path: str):
  """A run's output as the notebook displays it: a `.png` as an image, a `.md` table as
  Markdown, anything else as text. FileNotFoundError when `path` does not exist."""
  if not os.path.exists(path):
    raise FileNotFoundError(f'{path} does not exist (has the run finished?)')
  from IPython import display
  if path.endswith('.png'):
    return display.Image(filename=path)
  with open(path) as f:
    text = f.read()
  return display.Markdown(text) if path.endswith('.md') else display.Pretty(text)


def eval_curves(workdir: str) -> dict[str, tuple[list[int], list[float]]]:
  """{'client/task metric↑': (rounds, values)} of a run's evaluations (metrics.jsonl);
  'task metric↑' in the many-task setting, which evaluates per task, not per client."""
  rows = [r for r in report.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
          if r.get('type') == 'eval']
  out: dict[str, tuple[list[int], list[float]]] = {}
  for r in sorted(rows, key=lambda r: r['round']):
    rounds, values = out.setdefault(report.column_name(r), ([], []))
    rounds.append(r['round'])
    values.append(float('nan') if r['value'] is None else float(r['value']))
  return out


def compare_figure(runs: Mapping[str, str], columns: int = 4):
  """A matplotlib Figure with one panel per evaluated (client, task, metric) and one line
  per run: `runs` maps a label to a workdir. ValueError when no run has evaluations."""
  curves = {name: eval_curves(w) for name, w in runs.items()}
  keys = list(dict.fromkeys(k for c in curves.values() for k in c))
  if not keys:
    raise ValueError('no evaluations in ' + ', '.join(runs.values()))
  from matplotlib.figure import Figure
  from matplotlib.ticker import MaxNLocator
  ncols = min(columns, len(keys))
  nrows = -(-len(keys) // ncols)
  fig = Figure(figsize=(3.2 * ncols, 2.6 * nrows + 0.5), layout='constrained')
  axes = fig.subplots(nrows, ncols, squeeze=False)
  for ax in axes.flat[len(keys):]:
    ax.set_visible(False)
  for ax, key in zip(axes.flat, keys):
    for name, c in curves.items():
      if key in c:
        ax.plot(*c[key], marker='o', ms=3, lw=1.2, label=name)
    ax.set_title(key, fontsize=9)
    ax.set_xlabel('round', fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
  handles, labels = axes.flat[0].get_legend_handles_labels()
  fig.legend(handles, labels, loc='outside lower center', ncol=len(labels), frameon=False)
  return fig
