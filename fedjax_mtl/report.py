"""metrics.jsonl, result tables (markdown + CSV) and plots."""

from __future__ import annotations

import csv
import io
import json
import os
from typing import Iterable

import numpy as np

from fedjax_mtl.tasks import LOWER_IS_BETTER


def atomic_write(path: str, text: str) -> None:
  """Write `text` to `path` via a temporary file and rename (never half-written)."""
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'w') as f:
    f.write(text)
  os.replace(tmp, path)


def read_jsonl(path: str) -> list[dict]:
  """All rows of a jsonl file ([] if absent)."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def append_jsonl(path: str, rows: Iterable[dict]) -> None:
  """Append rows to a jsonl file."""
  with open(path, 'a') as f:
    for r in rows:
      f.write(json.dumps(r) + '\n')


def truncate_jsonl(path: str, max_round: int) -> None:
  """Keep only rows of rounds <= max_round (used when resuming a run)."""
  rows = [r for r in read_jsonl(path) if r.get('round', 0) <= max_round]
  atomic_write(path, ''.join(json.dumps(r) + '\n' for r in rows))


def column_name(row: dict) -> str:
  arrow = '↓' if _lower(row) else '↑'
  return f"{row['client']}/{row['task']} {row['metric']}{arrow}"


def final_eval_rows(path: str) -> list[dict]:
  """Eval rows of the last evaluated round in a metrics.jsonl."""
  rows = [r for r in read_jsonl(path) if r.get('type') == 'eval']
  if not rows:
    return []
  last = max(r['round'] for r in rows)
  return [r for r in rows if r['round'] == last]


def seconds_per_round(path: str) -> float:
  """Median wall seconds of a run's rounds after the first (which compiles) and without
  evaluation, from its timing.jsonl (NaN if there are none)."""
  rows = read_jsonl(path) if os.path.exists(path) else []
  steady = [r['seconds'] for r in rows
            if 'seconds' in r and r['round'] > 1 and not r.get('eval')]
  return float(np.median(steady)) if steady else float('nan')


def lower_is_better(task: str, metric: str) -> bool:
  """Direction of a logged metric: errors and losses go down, the rest up."""
  return task in LOWER_IS_BETTER or metric == 'loss'


def _lower(row: dict) -> bool:
  return lower_is_better(row['task'], row['metric'])


def results_table(method: str, eval_rows: list[dict],
                  reference_rows: list[dict] | None = None) -> tuple[str, str]:
  """One-row table (markdown, CSV): one column per client task, Δm last.

  Δm (%) is relative to `reference_rows` (the Local run's final eval rows);
  0 for the `local` method itself, empty when no reference is given.
  """
  from fedjax_mtl.metrics.delta_m import delta_m
  cols = [column_name(r) for r in eval_rows]
  vals = [f"{r['value']:.4f}" if r['task'] == 'depth' else f"{r['value']:.2f}"
          for r in eval_rows]
  dm = ''
  if method == 'local':
    dm = 0.0
  elif reference_rows:
    mine = {column_name(r): r['value'] for r in eval_rows}
    ref = {column_name(r): r['value'] for r in reference_rows}
    lower = {column_name(r): _lower(r) for r in eval_rows}
    dm = delta_m(mine, ref, lower_is_better=lower)
  dm_text = f'{dm:.2f}' if dm != '' else '–'
  md = ('| method | ' + ' | '.join(cols) + ' | Δm (%)↑ |\n'
        + '|---' * (len(cols) + 2) + '|\n'
        + f'| {method} | ' + ' | '.join(vals) + f' | {dm_text} |\n')
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(['method'] + cols + ['delta_m'])
  w.writerow([method] + [r['value'] for r in eval_rows] + [dm])
  return md, buf.getvalue()


def plot_hyperweights(rows: list[dict], out_dir: str) -> list[str]:
  """α per client and β per decoder and layer over rounds (as FedHCA2's Figs. 6-7).

  Reads the aggregation rows of metrics.jsonl; writes `alpha.png` and
  `beta.png` to `out_dir` when the rule logged them. Returns the written paths.
  """
  agg = [r for r in rows if r.get('type') == 'agg']
  written = []
  if not agg:
    return written
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  rounds = [r['round'] for r in agg]
  meta = next((r for r in rows if r.get('type') == 'meta'), {})
  if 'alpha' in agg[0]:
    alpha = [r['alpha'] for r in agg]
    names = meta.get('clients') or [f'client {i}' for i in range(len(alpha[0]))]
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, name in enumerate(names):
      ax.plot(rounds, [a[i] for a in alpha], label=name)
    ax.set_xlabel('round')
    ax.set_ylabel('α (encoder aggregation weight)')
    ax.legend(fontsize=6)
    fig.tight_layout()
    path = os.path.join(out_dir, 'alpha.png')
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)
  if 'beta' in agg[0]:
    beta = [r['beta'] for r in agg]
    names = meta.get('decoders') or [f'decoder {k}' for k in range(len(beta[0]))]
    layers = meta.get('decoder_layers') or [f'layer {l}' for l in range(len(beta[0][0]))]
    fig, axes = plt.subplots(2, (len(layers) + 1) // 2, figsize=(12, 6), squeeze=False)
    for l, name_l in enumerate(layers):
      ax = axes.flat[l]
      for k, name_k in enumerate(names):
        ax.plot(rounds, [b[k][l] for b in beta], label=name_k)
      ax.set_title(name_l, fontsize=8)
      ax.set_xlabel('round')
    axes.flat[0].set_ylabel('β (decoder aggregation weight)')
    axes.flat[0].legend(fontsize=5)
    fig.tight_layout()
    path = os.path.join(out_dir, 'beta.png')
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)
  return written


def plot_metric_curves(rows: list[dict], out_dir: str) -> str | None:
  """`curves.png`: per client task, the train loss and the test metric over rounds."""
  train = [r for r in rows if r.get('type') == 'train']
  evals = [r for r in rows if r.get('type') == 'eval']
  if not train:
    return None
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  keys = list(dict.fromkeys((r['client'], r['task']) for r in train))
  cols = min(len(keys), 5)
  nrows = -(-len(keys) // cols)
  fig, axes = plt.subplots(nrows, cols, figsize=(3.2 * cols, 2.6 * nrows), squeeze=False)
  for ax, (client, task) in zip(axes.flat, keys):
    tr = [(r['round'], r['loss']) for r in train if (r['client'], r['task']) == (client, task)]
    ax.plot(*zip(*tr), color='tab:blue', label='train loss')
    ax.set_title(f'{client}\n{task}', fontsize=7)
    ax.set_xlabel('round', fontsize=7)
    ev = [(r['round'], r['value'], r['metric']) for r in evals
          if (r['client'], r['task']) == (client, task)]
    if ev:
      ax2 = ax.twinx()
      ax2.plot([e[0] for e in ev], [e[1] for e in ev], 'o-', color='tab:red',
               label=f'test {ev[0][2]}')
      ax2.set_ylabel(f'test {ev[0][2]}', fontsize=7, color='tab:red')
  for ax in list(axes.flat)[len(keys):]:
    ax.axis('off')
  fig.tight_layout()
  path = os.path.join(out_dir, 'curves.png')
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
