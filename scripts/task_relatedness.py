"""Task relatedness of a finished many-task run (MaTU spec §1.3 "Figs. 2–3", §2.3 Eq. 5,
§7 item 13): the sign similarity of the task vectors against their cosine similarity.

    python scripts/task_relatedness.py --workdir=runs/individual [--out=DIR] [--clusters=3]

The run is usually the "Individual" baseline of the many-task setting
(`configs/local.py:mini8 many.num_clients=8 many.class_split=iid`: one client per
task holding all of it), but any many-task run whose adapters differ per task works.
Its config (RUN/config.json) is rebuilt with `fedjax_mtl.manytask.run.build_run` and
the newest checkpoint restored.

- **Task vector** τ^t: the adapters (every trainable leaf but the head), flattened
  and concatenated in sorted key order, minus their shared LoRA initialisation
  (`run.trainable`); with several (client, task) pairs per task, the mean of the
  pairs' vectors weighted by their training examples.
- **Sign similarity** (Eq. 5, `matu_math.similarity`):
  S(t, t') = ½(mean_j sgn(τ^t_j) sgn(τ^{t'}_j) + 1), in [0, 1]; 0.5 for unrelated
  sign patterns.
- **Cosine similarity** of the task vectors (NaN where a vector is 0).
- **Pearson r** (and its two-sided p) of S against the cosine over the task pairs
  t < t' (the paper reports r > 0.8).
- **Clusters**: average-linkage agglomerative clustering on the distance 1 − S cut
  into `--clusters` groups (MaTU Fig. 6a's "conflict groups" come from the task
  clusters of Fig. 2).

Writes OUT/relatedness.png (heatmaps of S and cosine, and S against cosine per task
pair), OUT/relatedness.md and OUT/relatedness.json; OUT defaults to the run's
workdir. Bad input (no config.json, no checkpoint, a dense-setting run, a config
that no longer builds) is one `error:` line on stderr, exit code 2, nothing written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

import numpy as np

FILES = ('relatedness.png', 'relatedness.md', 'relatedness.json')
_FONT = 8


# ----------------------------------------------------------------------------- math


def task_vectors(run, state) -> tuple[tuple[str, ...], np.ndarray]:
  """(task names, [T, d] float64 task vectors) of a many-task `run` at `state`.

  Each pair's adapters are its model's non-head trainable leaves (wherever its
  storage keeps them: `shared`, its task's row or its own row), flattened in sorted
  key order, minus `run.trainable`; a task's vector is the examples-weighted mean
  of its pairs' vectors (a task without pairs, or whose pairs hold no examples,
  gets the plain mean, or 0 with no pairs at all).
  """
  setting = run.setting
  keys = sorted(k for k, r in run.roles.items() if r != 'head')
  if not keys:
    raise ValueError('the run has no trainable adapters (every trainable leaf is a head)')
  shared = {k: np.asarray(v) for k, v in state.shared.items()}
  task_rows = {k: np.asarray(v) for k, v in state.task_rows.items()}
  pair_rows = {k: np.asarray(v) for k, v in state.pair_rows.items()}
  origin = np.concatenate([np.asarray(run.trainable[k], np.float64).ravel() for k in keys])

  def leaf(k, pair, task):
    if k in pair_rows:
      return pair_rows[k][pair]
    if k in task_rows:
      return task_rows[k][task]
    return shared[k]

  pairs = np.asarray(setting.pairs).reshape(-1, 2)
  counts = np.asarray(setting.counts, np.float64)
  vecs = np.stack([np.concatenate([np.asarray(leaf(k, p, t), np.float64).ravel() for k in keys])
                   - origin for p, (_, t) in enumerate(pairs)]) if len(pairs) else None
  out = np.zeros((setting.num_tasks, origin.size), np.float64)
  for t in range(setting.num_tasks):
    sel = pairs[:, 1] == t
    if not sel.any():
      continue
    w = counts[sel]
    w = w / w.sum() if w.sum() > 0 else np.full(w.shape, 1. / w.size)
    out[t] = np.tensordot(w, vecs[sel], axes=(0, 0))
  return tuple(setting.tasks), out


def _upper(m: np.ndarray) -> np.ndarray:
  return m[np.triu_indices(m.shape[0], k=1)]


def pearson(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
  """(r, two-sided p) over the entries finite in both; NaN when fewer than 2 entries
  or either side is constant."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  ok = np.isfinite(x) & np.isfinite(y)
  x, y = x[ok], y[ok]
  if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
    return float('nan'), float('nan')
  try:
    from scipy import stats
  except ImportError:  # numpy only: r, and no p
    return float(np.corrcoef(x, y)[0, 1]), float('nan')
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    res = stats.pearsonr(x, y)
  return float(res.statistic), float(res.pvalue)


def relatedness(vectors) -> dict:
  """Sign similarity (Eq. 5), cosine similarity and the Pearson correlation of their
  entries t < t' for task vectors [T, d]: dict(similarity [T, T], cosine [T, T],
  pearson_r, pearson_p) (float64 arrays; cosine NaN where a vector is 0)."""
  from fedjax_mtl.algorithms import matu_math
  v = np.asarray(vectors, np.float64)
  if v.ndim != 2 or v.shape[1] == 0:
    raise ValueError(f'task vectors must be [T, d] with d > 0, got shape {v.shape}')
  # Eq. 5 as MaTU's server computes it; the float32 sign products sum exactly (|sum| <= d).
  sim = np.asarray(matu_math.similarity(np.sign(v).astype(np.float32)), np.float64)
  sim = 0.5 * (sim + sim.T)
  norm = np.linalg.norm(v, axis=1)
  safe = np.where(norm > 0, norm, 1.)
  cos = (v @ v.T) / safe[:, None] / safe[None, :]
  cos = np.where((norm[:, None] > 0) & (norm[None, :] > 0), np.clip(cos, -1., 1.), np.nan)
  cos[np.diag_indices_from(cos)] = np.where(norm > 0, 1., np.nan)  # not 1 - 1e-16
  r, p = pearson(_upper(sim), _upper(cos))
  return {'similarity': sim, 'cosine': cos, 'pearson_r': r, 'pearson_p': p}


def clusters(similarity, k: int) -> list[list[int]]:
  """Average-linkage agglomerative clustering of the tasks on the distance 1 − S into
  min(k, T) groups: lists of task indices, each sorted, ordered by first member."""
  s = np.asarray(similarity, np.float64)
  n = s.shape[0]
  if k < 1:
    raise ValueError(f'clusters: k must be >= 1, got {k}')
  k = min(int(k), n)
  if n == 0:
    return []
  if k == n:
    return [[i] for i in range(n)]
  if k == 1:
    return [list(range(n))]
  dist = np.clip(1. - 0.5 * (s + s.T), 0., None)
  np.fill_diagonal(dist, 0.)
  try:
    from scipy.cluster import hierarchy
    from scipy.spatial.distance import squareform
  except ImportError:
    labels = _average_linkage(dist, k)
  else:
    z = hierarchy.linkage(squareform(dist, checks=False), method='average')
    labels = hierarchy.cut_tree(z, n_clusters=k).ravel()
  groups: dict[int, list[int]] = {}
  for i, lab in enumerate(labels):
    groups.setdefault(int(lab), []).append(i)
  return sorted(groups.values(), key=lambda g: g[0])


def _average_linkage(dist: np.ndarray, k: int) -> list[int]:
  """Cluster label per item by merging, until k remain, the two clusters with the
  smallest mean pairwise distance (ties: the lowest indices)."""
  groups = [[i] for i in range(dist.shape[0])]
  while len(groups) > k:
    best = None
    for a in range(len(groups)):
      for b in range(a + 1, len(groups)):
        d = float(np.mean(dist[np.ix_(groups[a], groups[b])]))
        if best is None or d < best[0]:
          best = (d, a, b)
    _, a, b = best
    groups[a] = sorted(groups[a] + groups.pop(b))
  labels = [0] * dist.shape[0]
  for g, members in enumerate(groups):
    for i in members:
      labels[i] = g
  return labels


# ----------------------------------------------------------------------------- loading


def _tuples(x):
  """JSON lists back as tuples (ConfigDict fields are tuples where JSON has lists)."""
  if isinstance(x, dict):
    return {k: _tuples(v) for k, v in x.items()}
  if isinstance(x, list):
    return tuple(_tuples(v) for v in x)
  return x


def _merge(base: dict, over: dict) -> dict:
  out = dict(base)
  for k, v in over.items():
    out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
  return out


def load_config(workdir: str):
  """The run's ConfigDict from WORKDIR/config.json (fields it lacks take today's
  defaults); ConfigError when it is missing, unreadable or not a many-task run."""
  import ml_collections
  from fedjax_mtl.defaults import base_config
  from fedjax_mtl.errors import ConfigError
  path = os.path.join(workdir, 'config.json')
  if not os.path.isdir(workdir):
    raise ConfigError(f'--workdir {workdir!r} is not a directory; give the workdir of a '
                      'finished many-task run')
  try:
    with open(path) as f:
      saved = json.load(f)
  except FileNotFoundError:
    raise ConfigError(f'{workdir!r} holds no config.json; give the workdir of a finished '
                      'many-task run') from None
  except (OSError, ValueError) as e:
    raise ConfigError(f'{path} is not readable JSON ({e})') from None
  if not isinstance(saved, dict):
    raise ConfigError(f'{path} holds no config (a JSON object expected)')
  if saved.get('setting', 'dense') != 'many_task':
    raise ConfigError(f'{workdir!r} is a run of the {saved.get("setting", "dense")!r} setting; '
                      "task relatedness needs a many-task run (setting='many_task', e.g. "
                      'configs/local.py:mini8)')
  defaults = base_config('mini8', str(saved.get('algorithm', 'local'))).to_dict()
  config = ml_collections.ConfigDict(_tuples(_merge(defaults, saved)))
  # The normalised-accuracy reference is not needed here (and may have moved).
  config.many.individual_reference = ''
  return config


def load_run(workdir: str):
  """(run, state, round) of the run in `workdir` at its newest checkpoint."""
  import jax
  from fedjax_mtl.checkpoint import Checkpointer
  from fedjax_mtl.errors import ConfigError
  from fedjax_mtl.manytask import run as run_lib
  config = load_config(workdir)
  ckpt_dir = os.path.join(workdir, 'checkpoints')
  if Checkpointer.latest_in(ckpt_dir) is None:
    raise ConfigError(f'{workdir!r} holds no checkpoint (no {ckpt_dir}/<round>); let the run '
                      'finish at least one checkpointed round')
  run = run_lib.build_run(config)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                          run_lib.init_state(run))
  ckpt = Checkpointer(ckpt_dir, like=abstract)
  try:
    step, state = ckpt.restore_latest(abstract)
  finally:
    ckpt.close()
  return run, state, int(step)


# ----------------------------------------------------------------------------- outputs


def _fmt(v: float, digits: int = 3) -> str:
  return f'{v:.{digits}f}' if np.isfinite(v) else '–'


def markdown(names, res: dict, groups: list[list[int]], info: dict) -> str:
  """relatedness.md: both matrices (3 decimals), Pearson r and p, the clusters."""
  def table(m):
    head = '| task | ' + ' | '.join(names) + ' |'
    rows = [f'| {n} | ' + ' | '.join(_fmt(v) for v in row) + ' |' for n, row in zip(names, m)]
    return '\n'.join([head, '|' + '---|' * (len(names) + 1)] + rows)
  p = res['pearson_p']
  lines = [
      f'# Task relatedness of `{info["workdir"]}`', '',
      f'{info["algorithm"]}, round {info["round"]}, {len(names)} tasks, task vectors of '
      f'{info["dim"]} adapter values ({info["pairs"]} (client, task) pairs).', '',
      '## Sign similarity S (MaTU Eq. 5)', '', table(res['similarity']), '',
      '## Cosine similarity', '', table(res['cosine']), '',
      '## Correlation over task pairs t < t\'', '',
      f'Pearson r = {_fmt(res["pearson_r"])}, p = '
      + (f'{p:.3g}' if np.isfinite(p) else '–') + f' ({info["num_task_pairs"]} pairs)', '',
      f'## Clusters (average linkage on 1 − S, {len(groups)} groups)', '']
  lines += [f'{i + 1}. ' + ', '.join(names[j] for j in g) for i, g in enumerate(groups)]
  return '\n'.join(lines) + '\n'


def figure(names, res: dict):
  """relatedness.png: heatmaps of S and cosine (values in the cells) and S against the
  cosine over the task pairs, with the Pearson r in the title."""
  from matplotlib.figure import Figure
  n = len(names)
  side = max(3.6, 0.55 * n + 1.6)
  fig = Figure(figsize=(2 * side + 4.4, side), layout='constrained')
  ax_s, ax_c, ax_p = fig.subplots(1, 3, width_ratios=[side, side, 4.4])
  off = ~np.eye(n, dtype=bool)
  for ax, m, title, cmap in ((ax_s, res['similarity'], 'sign similarity S (Eq. 5)', 'viridis'),
                             (ax_c, res['cosine'], 'cosine similarity', 'magma')):
    vals = m[off & np.isfinite(m)]
    # The colours span the off-diagonal entries (the diagonal's 1 would flatten them).
    lo, hi = (float(vals.min()), float(vals.max())) if vals.size else (0., 1.)
    if hi <= lo:
      lo, hi = lo - 0.5, hi + 0.5
    im = ax.imshow(np.ma.masked_invalid(m), cmap=cmap, vmin=lo, vmax=hi)
    for i in range(n):
      for j in range(n):
        v = m[i, j]
        light = np.isfinite(v) and (np.clip(v, lo, hi) - lo) / (hi - lo) > 0.6
        ax.text(j, i, _fmt(v, 2), ha='center', va='center', fontsize=_FONT - 1,
                color='black' if light else 'white')
    ax.set_xticks(range(n), names, rotation=45, ha='right', fontsize=_FONT)
    ax.set_yticks(range(n), names, fontsize=_FONT)
    ax.set_title(title, fontsize=_FONT + 2)
    fig.colorbar(im, ax=ax, shrink=0.8).ax.tick_params(labelsize=_FONT)
  iu = np.triu_indices(n, k=1)
  x, y = res['similarity'][iu], res['cosine'][iu]
  ax_p.scatter(x, y, s=22, color='tab:blue', alpha=0.85, zorder=3)
  # Pair labels: all of a few pairs, else the 5 most and 2 least sign-similar (the rest
  # crowd near S = 0.5).
  order = np.argsort(-x, kind='stable')
  shown = order if x.size <= 10 else np.concatenate([order[:5], order[-2:]])
  for i in shown:
    if np.isfinite(y[i]):
      ax_p.annotate(f'{names[iu[0][i]]}–{names[iu[1][i]]}', (x[i], y[i]), fontsize=_FONT - 2,
                    color='0.35', xytext=(3, 2), textcoords='offset points')
  ax_p.set_xlabel('sign similarity S', fontsize=_FONT + 1)
  ax_p.set_ylabel('cosine similarity', fontsize=_FONT + 1)
  ax_p.ticklabel_format(style='plain', useOffset=False)
  ax_p.tick_params(labelsize=_FONT)
  ax_p.grid(alpha=0.3)
  ax_p.margins(x=0.25, y=0.1)  # room for the pair labels
  ax_p.set_title(f'task pairs: Pearson r = {_fmt(res["pearson_r"])}', fontsize=_FONT + 2)
  return fig


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--workdir', required=True, help='workdir of a finished many-task run')
  p.add_argument('--out', default='', help="output folder ('' = the run's workdir)")
  p.add_argument('--clusters', type=int, default=3,
                 help='task clusters to cut the average-linkage tree into (at most T)')
  a = p.parse_args(argv)
  from fedjax_mtl.errors import ConfigError
  try:
    return _main(a)
  except ConfigError as e:
    print('error: ' + ' '.join(str(e).split()), file=sys.stderr)
    raise SystemExit(2) from None


def _main(a: argparse.Namespace) -> dict:
  from fedjax_mtl import report
  from fedjax_mtl.errors import ConfigError
  if a.clusters < 1:
    raise ConfigError(f'--clusters={a.clusters}: must be >= 1')
  out = a.out or a.workdir
  if os.path.exists(out) and not os.path.isdir(out):
    raise ConfigError(f'--out {out!r} is a file, not a directory')
  run, state, step = load_run(a.workdir)
  names, vectors = task_vectors(run, state)
  if len(names) < 2:
    raise ConfigError(f'the run has {len(names)} task; relatedness needs at least 2')
  res = relatedness(vectors)
  groups = clusters(res['similarity'], a.clusters)
  info = {'workdir': a.workdir, 'algorithm': run.config.algorithm, 'round': step,
          'dim': int(vectors.shape[1]), 'pairs': int(run.setting.num_pairs),
          'num_task_pairs': len(names) * (len(names) - 1) // 2}
  summary = {'tasks': list(names), **info, 'similarity': res['similarity'],
             'cosine': res['cosine'], 'pearson_r': res['pearson_r'],
             'pearson_p': res['pearson_p'], 'clusters': [[names[i] for i in g] for g in groups],
             'cluster_indices': groups}
  md = markdown(names, res, groups, info)
  text = json.dumps(report.jsonable(summary), indent=2, allow_nan=False) + '\n'
  fig = figure(names, res)
  os.makedirs(out, exist_ok=True)
  paths = [os.path.join(out, f) for f in FILES]
  fig.savefig(paths[0], dpi=120)
  report.atomic_write(paths[1], md)
  report.atomic_write(paths[2], text)
  print(f'{len(names)} tasks, d = {info["dim"]}, round {step} of {a.workdir}')
  if np.all(vectors == vectors[:1]):
    print(f'note: every task has the same vector ({run.config.algorithm} shares its adapters '
          'across tasks); use an Individual (local) run')
  pv = res['pearson_p']
  print(f'Pearson r(S, cosine) = {_fmt(res["pearson_r"])}, p = '
        + (f'{pv:.3g}' if np.isfinite(pv) else '–')
        + f' over {info["num_task_pairs"]} task pairs')
  print('clusters: ' + ' | '.join(', '.join(c) for c in summary['clusters']))
  print('wrote ' + ', '.join(paths))
  return {**summary, 'paths': paths}


if __name__ == '__main__':
  from fedjax_mtl import cpu_isa, hostmem
  hostmem.reuse_freed_memory()  # as fedjax_mtl.main does on CPU-only runs
  cpu_isa.pin('AVX2')  # the same kernels on every AVX2 host (fedjax_mtl.cpu_isa)
  main(sys.argv[1:])
