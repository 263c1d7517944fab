"""metrics.jsonl, result tables (markdown + CSV) and plots."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from fedjax_mtl.tasks import LOWER_IS_BETTER

if TYPE_CHECKING:
  from matplotlib.figure import Figure

DASH = '–'  # shown for a value that is missing or not finite


def atomic_write(path: str, text: str) -> None:
  """Write `text` to `path` via a temporary file and rename (never half-written)."""
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'w') as f:
    f.write(text)
  os.replace(tmp, path)


def write_table(folder: str, stem: str, md: str, csv_text: str) -> None:
  """`folder`/`stem`.md and .csv (the folder made if needed), then the markdown on stdout."""
  os.makedirs(folder, exist_ok=True)
  atomic_write(os.path.join(folder, f'{stem}.md'), md)
  atomic_write(os.path.join(folder, f'{stem}.csv'), csv_text)
  print(md)


def read_jsonl(path: str) -> list[dict]:
  """All rows of a jsonl file ([] if absent)."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def jsonable(x: Any) -> Any:
  """`x` with numpy/JAX arrays and scalars as Python values and non-finite floats as None."""
  if isinstance(x, dict):
    return {k: jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [jsonable(v) for v in x]
  if hasattr(x, '__array__') and not isinstance(x, (str, bytes)):
    return jsonable(np.asarray(x).tolist())
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x


def json_line(row: dict) -> str:
  """One strict-JSON line (no NaN/Infinity tokens: non-finite values become null)."""
  return json.dumps(jsonable(row), allow_nan=False) + '\n'


def append_jsonl(path: str, rows: Iterable[dict]) -> None:
  """Append rows to a jsonl file as strict JSON."""
  text = ''.join(json_line(r) for r in rows)  # all rows convert before any is written
  with open(path, 'a') as f:
    f.write(text)


def truncate_jsonl(path: str, max_round: int) -> None:
  """Keep only rows of rounds <= max_round (used when resuming a run)."""
  rows = [r for r in read_jsonl(path) if r.get('round', 0) <= max_round]
  atomic_write(path, ''.join(json_line(r) for r in rows))


def column_name(row: dict) -> str:
  """'client/task metric↑' of an eval row; 'task metric↑' for a row without a client
  (the many-task setting evaluates per task)."""
  arrow = '↓' if _lower(row) else '↑'
  client = f"{row['client']}/" if 'client' in row else ''
  return f"{client}{row['task']} {row['metric']}{arrow}"


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


def _finite(v) -> float | None:
  """`v` as a float, or None when it is missing or not finite."""
  if v is None:
    return None
  v = float(v)
  return v if math.isfinite(v) else None


def results_table(method: str, eval_rows: list[dict],
                  reference_rows: list[dict] | None = None) -> tuple[str, str]:
  """One-row table (markdown, CSV): one column per client task, Δm last.

  Δm (%) is relative to `reference_rows` (the Local run's final eval rows);
  0 for the `local` method itself, empty when no reference is given or a value
  it needs is missing or not finite (shown as – in markdown, an empty CSV cell).
  """
  from fedjax_mtl.metrics.delta_m import delta_m
  cols = [column_name(r) for r in eval_rows]
  values = [_finite(r['value']) for r in eval_rows]
  texts = [DASH if v is None else f'{v:.4f}' if r['task'] == 'depth' else f'{v:.2f}'
           for r, v in zip(eval_rows, values)]
  mine = dict(zip(cols, values))
  dm = None
  if method == 'local':
    dm = 0.0 if None not in values else None
  elif reference_rows:
    ref = {column_name(r): _finite(r['value']) for r in reference_rows}
    if None not in values and None not in ref.values():
      lower = {column_name(r): _lower(r) for r in eval_rows}
      dm = _finite(delta_m(mine, ref, lower_is_better=lower))
  dm_text = DASH if dm is None else f'{dm:.2f}'
  md = ('| method | ' + ' | '.join(cols) + ' | Δm (%)↑ |\n'
        + '|---' * (len(cols) + 2) + '|\n'
        + f'| {method} | ' + ' | '.join(texts) + f' | {dm_text} |\n')
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(['method'] + cols + ['delta_m'])
  w.writerow([method] + ['' if v is None else v for v in values] + ['' if dm is None else dm])
  return md, buf.getvalue()


def final_metrics(workdir: str) -> dict[str, float]:
  """{'client/task metric': value} of the last evaluated round of a run."""
  rows = final_eval_rows(os.path.join(workdir, 'metrics.jsonl'))
  # metrics.jsonl writes a non-finite value as null: NaN here, '–' in the table.
  return {f"{r['client']}/{r['task']} {r['metric']}":
          float('nan') if r['value'] is None else r['value'] for r in rows}


def column_lower_is_better(key: str) -> bool:
  """Whether lower is better in a 'client/task metric' column of final_metrics."""
  client_task, metric = key.rsplit(' ', 1)
  return lower_is_better(client_task.rsplit('/', 1)[-1], metric)


def mean_std(vals, digits: int = 2) -> str:
  """mean ± std over seeds ('–' when any is not finite; no std for one seed)."""
  vals = np.asarray(vals, np.float64)
  if not np.isfinite(vals).all():
    return '–'
  mean = f'{vals.mean():.{digits}f}'
  return mean if len(vals) == 1 else f'{mean} ± {vals.std():.{digits}f}'


def comparison_table(results: dict[str, list[dict[str, float]]],
                     reference: str, seconds: dict[str, list[float]] | None = None,
                     pairs: dict[str, str] | None = None,
                     traffic: dict[str, list[dict]] | None = None,
                     epsilons: dict[str, float | None] | None = None) -> tuple[str, str]:
  """Markdown and CSV: methods x client tasks (mean ± std over seeds), Δm, then the
  seconds per round when `seconds` (method -> per-seed values) is given, then the
  megabytes a round and in all when `traffic` (method -> per-seed `comm.totals`) is,
  then the privacy spent (ε at the runs' δ, '–' without DP) when `epsilons` holds one.

  Δm of a method is against `reference`, or against `pairs[method]` where given
  (e.g. each +DEA row against its base, as FedDEA's tables report it). Runs of
  different scenarios (FedHCA2 Tab. 4: single-task clients alone, and with
  multi-task ones) share one table: the columns are every run's client tasks ('–'
  where a method has none), and a method's Δm is over the client tasks it shares
  with its reference, said below the table."""
  from fedjax_mtl.metrics.delta_m import delta_m
  cols = list(dict.fromkeys(k for runs in results.values() for r in runs for k in r))
  notes = []
  pairs = pairs or {}
  # Only when every run of every method has its 'comm' rows (a dense run).
  traffic = traffic if traffic and all(traffic.get(m) and None not in traffic[m]
                                       for m in results) else None
  epsilons = epsilons if epsilons and any(v is not None for v in epsilons.values()) else None
  md = io.StringIO()
  arrows = [c + ('↓' if column_lower_is_better(c) else '↑') for c in cols]
  extra = ((' s/round |' if seconds else '') + (' MB/round | total MB |' if traffic else '')
           + (' ε |' if epsilons else ''))
  dm_head = 'Δm (%) ↑ (vs)' if pairs else 'Δm (%) ↑'
  md.write('| method | ' + ' | '.join(arrows) + f' | {dm_head} |' + extra + '\n')
  md.write('|---' * (len(cols) + 2 + bool(seconds) + 2 * bool(traffic) + bool(epsilons))
           + '|\n')
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(['method'] + cols + ['delta_m'] + (['seconds_per_round'] if seconds else [])
             + (['mb_per_round', 'total_mb'] if traffic else [])
             + (['epsilon'] if epsilons else []))

  for name, runs in results.items():
    per_col = [[r.get(c, float('nan')) for r in runs] for c in cols]
    ref_name = pairs.get(name, reference)
    ref_runs = results.get(ref_name)
    shared = ([k for k in cols if k in runs[0] and k in ref_runs[0]]
              if ref_runs is not None else [])
    if shared:
      # Δm per seed against the reference run of the same seed, over their shared tasks.
      dms = [delta_m({k: r[k] for k in shared}, {k: ref[k] for k in shared},
                     lower_is_better=column_lower_is_better)
             for r, ref in zip(runs, ref_runs)]
      if len(shared) < max(len(runs[0]), len(ref_runs[0])):
        notes.append(f'Δm of {name}: over the {len(shared)} client tasks it shares with '
                     f'{ref_name}.')
    else:
      dms = [float('nan')]
    sec = [f' {np.median(seconds[name]):.2f} |'] if seconds else []
    mb = ([float(np.mean([t['mb_per_round'] for t in traffic[name]])),
           float(np.mean([t['total_mb'] for t in traffic[name]]))] if traffic else [])
    dm_text = mean_std(dms) + (f' ({ref_name})' if pairs and ref_runs is not None else '')
    eps = epsilons.get(name) if epsilons else None
    eps_md = ([' – |' if eps is None else f' {eps:.3g} |'] if epsilons else [])
    md.write(f'| {name} | ' + ' | '.join(mean_std(v) for v in per_col) + f' | {dm_text} |'
             + ''.join(sec) + ''.join(f' {v:.3f} |' for v in mb) + ''.join(eps_md) + '\n')
    w.writerow([name] + [float(np.mean(v)) for v in per_col] + [float(np.mean(dms))]
               + ([float(np.median(seconds[name]))] if seconds else []) + mb
               + (['' if eps is None else eps] if epsilons else []))
  if notes:
    md.write('\n' + '\n'.join(notes) + '\n')
  return md.getvalue(), buf.getvalue()


# ---------------------------------------------------------------- many-task results


def final_accuracy(workdir: str) -> dict[str, float]:
  """{task: top-1 accuracy %} of the last evaluated round of a many-task run."""
  rows = final_eval_rows(os.path.join(workdir, 'metrics.jsonl'))
  return {r['task']: float('nan') if r['value'] is None else r['value']
          for r in rows if r['metric'] == 'accuracy'}


def bits_per_task(workdir: str) -> float:
  """Mean over rounds of a many-task run's uploaded bits per task (0 when none)."""
  rows = read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  bits = [r['bits_per_task'] for r in rows if r.get('type') == 'agg']
  return float(np.mean(bits)) if bits else 0.


def format_bits(bits: float) -> str:
  """'147.9 k', '6.32 M'; '–' for no upload (e.g. Individual)."""
  if not np.isfinite(bits) or bits == 0:
    return '–'
  if bits >= 1e6:
    return f'{bits / 1e6:.2f} M'
  return f'{bits / 1e3:.1f} k' if bits >= 1e3 else f'{bits:.0f}'


def many_task_table(results: dict[str, list[dict[str, float]]], reference: str,
                    bits: dict[str, list[float]],
                    seconds: dict[str, list[float]] | None = None) -> tuple[str, str]:
  """Markdown and CSV of MaTU's Table 1/2 (spec matu §5): methods x tasks (top-1
  accuracy %, mean ± std over seeds), the mean over tasks, the accuracy normalised by
  the `reference` run of the same seed (mean over tasks of 100·acc / acc_ref), the bits
  per task (`bits`: method -> per-seed means over rounds) and the seconds per round."""
  tasks = list(next(iter(results.values()))[0])
  ref_runs = results.get(reference)
  md, buf = io.StringIO(), io.StringIO()
  head = ([t + ' ↑' for t in tasks] + ['avg ↑', f'normalised avg (% of {reference}) ↑',
                                        'bits/task ↓'] + (['s/round'] if seconds else []))
  md.write('| method | ' + ' | '.join(head) + ' |\n' + '|---' * (len(head) + 1) + '|\n')
  w = csv.writer(buf)
  w.writerow(['method'] + tasks + ['avg', 'normalised_avg', 'bits_per_task']
             + (['seconds_per_round'] if seconds else []))
  for name, runs in results.items():
    acc = np.array([[r.get(t, np.nan) for t in tasks] for r in runs], np.float64)  # [seeds, T]
    if ref_runs is not None:
      ref = np.array([[r.get(t, np.nan) for t in tasks] for r in ref_runs], np.float64)
      with np.errstate(divide='ignore', invalid='ignore'):
        norm = (100. * acc / ref).mean(axis=1)  # per seed, against the same seed's reference
    else:
      norm = np.array([np.nan])
    # The reference is 100 by definition: one value, no spread.
    norm_text = (mean_std([norm.mean()], 1) if name == reference
                 else mean_std(norm, 1))
    mean_bits = float(np.mean(bits[name]))
    sec = [f'{np.median(seconds[name]):.2f}'] if seconds else []
    md.write(f'| {name} | ' + ' | '.join([mean_std(acc[:, i]) for i in range(len(tasks))]
                                         + [mean_std(acc.mean(axis=1)), norm_text,
                                            format_bits(mean_bits)] + sec) + ' |\n')
    w.writerow([name] + [float(v) for v in acc.mean(axis=0)]
               + [float(acc.mean()), float(norm.mean()), mean_bits]
               + ([float(np.median(seconds[name]))] if seconds else []))
  return md.getvalue(), buf.getvalue()



# ---------------------------------------------------------------------------- plots

_FONT = 7  # legend and tick font size: the plots hold many lines and long client names


def _floats(values) -> np.ndarray:
  """A (nested) list with None as NaN, so matplotlib draws a gap there."""
  return np.array(values, dtype=np.float64)


def _styles(n: int) -> list[tuple[Any, str]]:
  """(colour, linestyle) for n lines that stay distinguishable past 10 and 20 lines."""
  from matplotlib import colormaps
  if n <= 10:
    return [(colormaps['tab10'](i), '-') for i in range(n)]
  # tab20's strong tones first, then their light partners: neighbours differ in hue.
  tab20 = [colormaps['tab20'](i) for i in list(range(0, 20, 2)) + list(range(1, 20, 2))]
  if n <= 20:
    return [(tab20[i], '-') for i in range(n)]
  if n <= 40:
    return [(tab20[i % 20], '-' if i < 20 else '--') for i in range(n)]
  turbo = colormaps['turbo']
  return [(turbo(0.05 + 0.9 * i / (n - 1)), ('-', '--', ':')[i % 3]) for i in range(n)]


def _plain_axes(ax, ylabel: str, xlabel: str | None = 'round') -> None:
  """Labels, integer rounds and plain tick labels (no `1e-5+3.048` offset text)."""
  from matplotlib.ticker import MaxNLocator
  ax.set_ylabel(ylabel, fontsize=_FONT + 1)
  if xlabel:
    ax.set_xlabel(xlabel, fontsize=_FONT + 1)
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.ticklabel_format(axis='y', style='plain', useOffset=False)
  ax.tick_params(labelsize=_FONT)
  ax.grid(alpha=0.3)


def _legend_columns(n: int, per_column: int = 20) -> int:
  """Columns of a figure legend for n entries, at most `per_column` rows high."""
  return max(1, -(-n // per_column))


def _fitting_columns(labels: list[str], width_in: float, most: int = 2) -> int:
  """Legend columns (up to `most`) whose estimated width fits in `width_in` inches."""
  entry_in = 0.055 * max(len(l) for l in labels) + 0.5  # text at _FONT pt + handle
  fits = max(1, int(width_in // entry_in))
  return max(1, min(most, fits, len(labels)))


def curves_figure(rows: list[dict]) -> Figure | None:
  """The Figure of `curves.png` (None without train rows): one panel per (dataset, task),
  train loss above and test metric below, one line per client holding that task."""
  train = [r for r in rows if r.get('type') == 'train']
  evals = [r for r in rows if r.get('type') == 'eval']
  if not train:
    return None
  from matplotlib.figure import Figure
  # Panels and legends in the evaluation's order (every client, every evaluation),
  # then any the train rows add: with partial participation a client's first train
  # row can come in any round.
  both = evals + train
  keys = list(dict.fromkeys((r.get('dataset', ''), r['task']) for r in both
                            if (r.get('dataset', ''), r['task']) in
                            {(t.get('dataset', ''), t['task']) for t in train}))
  ncols = min(len(keys), 5)
  nrows = -(-len(keys) // ncols)
  clients_of = {k: list(dict.fromkeys(r['client'] for r in both
                                      if (r.get('dataset', ''), r['task']) == k
                                      and 'client' in r))
                for k in keys}
  train_rounds = sorted({r['round'] for r in train})
  panel_w = 3.1  # inches
  legend_cols = {k: _fitting_columns(c, panel_w) for k, c in clients_of.items()}
  most = max(-(-len(c) // legend_cols[k]) for k, c in clients_of.items())
  legend_in = 0.16 * most + 0.2  # inches below each panel for its legend
  fig = Figure(figsize=(panel_w * ncols, (4.1 + legend_in) * nrows), layout='constrained')
  subs = fig.subfigures(nrows, ncols, squeeze=False)
  for sub in subs.flat[len(keys):]:
    sub.set_visible(False)
  for sub, key in zip(subs.flat, keys):
    dataset, task = key
    ax_loss, ax_metric = sub.subplots(2, 1, sharex=True)
    clients = clients_of[key]
    metric = None
    for client, (colour, ls) in zip(clients, _styles(len(clients))):
      mine = {r['round']: r['loss'] for r in train
              if (r.get('dataset', ''), r['task'], r['client']) == (*key, client)}
      # A round the client sat out (partial participation) is a gap, and its rounds
      # get markers, so that a lone round still shows.
      gaps = len(mine) < len(train_rounds)
      ax_loss.plot(train_rounds, _floats([mine.get(t) for t in train_rounds]),
                   color=colour, ls=ls, lw=1.4, label=client,
                   marker='o' if gaps else None, ms=3)
      ev = [r for r in evals if (r.get('dataset', ''), r['task'], r['client']) == (*key, client)]
      # The last evaluation's metric only (eval_edge_ods='final': odsF at the last
      # evaluation, the edge test loss at those before it).
      ev = [r for r in ev if r['metric'] == ev[-1]['metric']]
      if ev:
        metric = ev[0]['metric']
        ax_metric.plot([r['round'] for r in ev], _floats([r['value'] for r in ev]),
                       color=colour, ls=ls, lw=1.2, marker='o', ms=3.5)
    sub.suptitle(f'{dataset} · {task}' if dataset else task, fontsize=_FONT + 2)
    _plain_axes(ax_loss, 'train loss', xlabel=None)
    ax_loss.tick_params(labelbottom=True)
    if metric is None:
      ax_metric.text(0.5, 0.5, 'not evaluated yet', ha='center', va='center',
                     transform=ax_metric.transAxes, fontsize=_FONT, color='0.4')
      _plain_axes(ax_metric, 'test metric')
    else:
      arrow = '↓' if lower_is_better(task, metric) else '↑'
      _plain_axes(ax_metric, f'test {metric} {arrow}')
    sub.legend(*ax_loss.get_legend_handles_labels(), loc='outside lower center',
               ncol=legend_cols[key], fontsize=_FONT, frameon=False,
               handlelength=2.2, columnspacing=1.0)
  return fig


def hyperweight_figures(rows: list[dict]) -> dict[str, Figure]:
  """{'alpha': Figure, 'beta': Figure} for the aggregation weights the rule logged:
  α per client, and β per decoder in one panel per decoder layer."""
  agg = [r for r in rows if r.get('type') == 'agg']
  meta = next((r for r in rows if r.get('type') == 'meta'), {})
  figs = {}
  alpha_rows = [r for r in agg if r.get('alpha') is not None]
  if alpha_rows:
    figs['alpha'] = _alpha_figure(alpha_rows, meta)
  beta_rows = [r for r in agg if r.get('beta') is not None]
  if beta_rows:
    figs['beta'] = _beta_figure(beta_rows, meta)
  return figs


def _alpha_figure(agg: list[dict], meta: dict) -> Figure:
  from matplotlib.figure import Figure
  rounds = [r['round'] for r in agg]
  alpha = _floats([r['alpha'] for r in agg])  # [rounds, N]
  n = alpha.shape[1]
  names = meta.get('clients') or [f'client {i}' for i in range(n)]
  ncol = _legend_columns(n)
  fig = Figure(figsize=(6.5 + 1.9 * ncol, max(4.0, 0.17 * min(n, 20) + 1.2)),
               layout='constrained')
  ax = fig.subplots()
  for i, (name, (colour, ls)) in enumerate(zip(names, _styles(n))):
    ax.plot(rounds, alpha[:, i], color=colour, ls=ls, lw=1.4, label=name)
  _plain_axes(ax, 'α (encoder aggregation weight)')
  ax.set_title('α per client', fontsize=_FONT + 2)
  fig.legend(loc='outside right upper', ncol=ncol, fontsize=_FONT, frameon=False,
             handlelength=2.2)
  return fig


def _beta_figure(agg: list[dict], meta: dict) -> Figure:
  from matplotlib.figure import Figure
  rounds = [r['round'] for r in agg]
  beta = _floats([r['beta'] for r in agg])  # [rounds, K, L]
  k, layers = beta.shape[1], beta.shape[2]
  names = meta.get('decoders') or [f'decoder {i}' for i in range(k)]
  layer_names = meta.get('decoder_layers') or [f'layer {l}' for l in range(layers)]
  ncols = min(layers, 3)
  nrows = -(-layers // ncols)
  ncol = _legend_columns(k)
  fig = Figure(figsize=(3.3 * ncols + 2.4 * ncol, max(2.8 * nrows, 0.17 * min(k, 20) + 1.2)),
               layout='constrained')
  axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True)
  styles = _styles(k)
  for l, ax in enumerate(axes.flat):
    if l >= layers:
      ax.set_visible(False)
      continue
    for i, (name, (colour, ls)) in enumerate(zip(names, styles)):
      ax.plot(rounds, beta[:, i, l], color=colour, ls=ls, lw=1.2,
              label=name if l == 0 else None)
    ax.set_title(layer_names[l], fontsize=_FONT + 1)
    _plain_axes(ax, 'β' if l % ncols == 0 else '', xlabel='round' if l >= layers - ncols else None)
    ax.tick_params(labelbottom=True)
  fig.suptitle('β (decoder aggregation weight) per decoder, one panel per decoder layer',
               fontsize=_FONT + 2)
  fig.legend(loc='outside right upper', ncol=ncol, fontsize=_FONT, frameon=False,
             handlelength=2.2)
  return fig


def _import_plotting() -> None:
  import matplotlib.figure  # noqa: F401
  from matplotlib import colormaps, ticker  # noqa: F401
  from matplotlib.backends import backend_agg  # noqa: F401


def import_plotting_in_background():
  """Import matplotlib's figure, colour maps and Agg backend (about 0.4 s) in a daemon
  thread, so that the plots at the end of a run do not wait for them; returns the
  started thread. A run starts it when its rounds begin and joins it when they end,
  before anything of its own imports matplotlib (two threads importing one package
  at once can meet it half initialised)."""
  import threading
  thread = threading.Thread(target=_import_plotting, name='import-plotting', daemon=True)
  thread.start()
  return thread


def _save(fig: Figure, path: str, dpi: int = 120) -> str:
  fig.savefig(path, dpi=dpi)
  return path


def plot_hyperweights(rows: list[dict], out_dir: str) -> list[str]:
  """α per client and β per decoder and layer over rounds (as FedHCA2's Figs. 6-7).

  Reads the aggregation rows of metrics.jsonl; writes `alpha.png` and
  `beta.png` to `out_dir` when the rule logged them. Returns the written paths.
  """
  return [_save(fig, os.path.join(out_dir, f'{name}.png'))
          for name, fig in hyperweight_figures(rows).items()]


def task_curves_figure(rows: list[dict]) -> Figure | None:
  """The Figure of a many-task run's `curves.png`: train loss per task (mean over the
  round's pairs of that task) and test accuracy per task over rounds, one line per
  task (None without train rows)."""
  train = [r for r in rows if r.get('type') == 'train']
  if not train:
    return None
  from matplotlib.figure import Figure
  acc = [r for r in rows if r.get('type') == 'eval' and r.get('metric') == 'accuracy']
  tasks = list(dict.fromkeys([r['task'] for r in acc] + [r['task'] for r in train]))
  fig = Figure(figsize=(11, 4.2), layout='constrained')
  ax_loss, ax_acc = fig.subplots(1, 2)
  for task, (colour, ls) in zip(tasks, _styles(len(tasks))):
    by_round = {}
    for r in train:
      if r['task'] == task:
        by_round.setdefault(r['round'], []).append(r['loss'])
    ax_loss.plot(sorted(by_round), [np.mean(by_round[k]) for k in sorted(by_round)],
                 color=colour, ls=ls, lw=1.4, label=task)
    mine = [r for r in acc if r['task'] == task]
    ax_acc.plot([r['round'] for r in mine], [r['value'] for r in mine], color=colour, ls=ls,
                lw=1.2, marker='o', ms=3.5)
  _plain_axes(ax_loss, 'train loss (mean over the task\'s pairs)')
  _plain_axes(ax_acc, 'test top-1 accuracy % ↑')
  fig.legend(*ax_loss.get_legend_handles_labels(), loc='outside right upper', fontsize=_FONT,
             frameon=False)
  return fig


def plot_metric_curves(rows: list[dict], out_dir: str) -> str | None:
  """`curves.png`: per (dataset, task), every client's train loss and test metric over rounds."""
  fig = curves_figure(rows)
  return None if fig is None else _save(fig, os.path.join(out_dir, 'curves.png'), dpi=110)


def plot_task_curves(rows: list[dict], out_dir: str) -> str | None:
  """A many-task run's `curves.png`: per task, train loss and test accuracy over rounds."""
  fig = task_curves_figure(rows)
  return None if fig is None else _save(fig, os.path.join(out_dir, 'curves.png'), dpi=110)


def delta_m_by_round(rows: list[dict], reference_rows: list[dict]) -> dict[int, float]:
  """Round -> Δm (%) of a dense run's evaluation against the reference run's
  evaluation of the same round (rounds both evaluated, on the same columns)."""
  from fedjax_mtl.metrics.delta_m import delta_m

  def by_round(rs):
    out = {}
    for r in rs:
      if r.get('type') == 'eval':
        out.setdefault(r['round'], {})[column_name(r)] = _finite(r['value'])
    return out

  mine, ref = by_round(rows), by_round(reference_rows)
  out = {}
  for rnd in sorted(set(mine) & set(ref)):
    a, b = mine[rnd], ref[rnd]
    if set(a) == set(b) and None not in a.values() and None not in b.values():
      out[rnd] = float(delta_m(a, b, lower_is_better=lambda c: c.endswith('↓')))
  return out


def traffic_figure(curves: dict[str, tuple[list[float], list[float]]],
                   ylabel: str = 'Δm (%) ↑') -> Figure | None:
  """Δm (or `ylabel`'s quantity) against cumulative megabytes, one line per method
  (`curves`: method -> (cumulative MB at each evaluated round, the value there));
  None without points."""
  curves = {m: c for m, c in curves.items() if c[0]}
  if not curves:
    return None
  from matplotlib.figure import Figure
  fig = Figure(figsize=(5.2, 3.6), layout='constrained')
  ax = fig.subplots()
  for (name, (mb, dm)), (colour, ls) in zip(curves.items(), _styles(len(curves))):
    ax.plot(mb, dm, color=colour, ls=ls, lw=1.4, marker='o', ms=3.5, label=name)
  _plain_axes(ax, ylabel, xlabel='cumulative MB sent and received (all clients)')
  from matplotlib.ticker import AutoLocator
  ax.xaxis.set_major_locator(AutoLocator())  # megabytes, not whole rounds
  ax.legend(fontsize=_FONT, frameon=False, ncol=_legend_columns(len(curves), 10))
  return fig


def plot_traffic(curves: dict, out_dir: str, stem: str = 'comparison_traffic',
                 ylabel: str = 'Δm (%) ↑') -> str | None:
  """`<stem>.png`: `traffic_figure(curves, ylabel)` in `out_dir`."""
  fig = traffic_figure(curves, ylabel)
  return None if fig is None else _save(fig, os.path.join(out_dir, f'{stem}.png'))
