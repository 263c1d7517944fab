"""Optional metric sinks beside metrics.jsonl: TensorBoard event files."""

from __future__ import annotations

import math

from fedjax_mtl.errors import ConfigError


def _value(v) -> float | None:
  """`v` as a float, or None when it is missing, not a number or not finite."""
  if v is None or isinstance(v, (bool, str)):
    return None
  try:
    v = float(v)
  except (TypeError, ValueError):
    return None
  return v if math.isfinite(v) else None


def scalars(rows: list[dict], meta: dict | None = None) -> list[tuple[str, float, int]]:
  """(tag, value, round) of metrics.jsonl rows as TensorBoard scalars (missing values dropped).

  Train rows give `train/<client>/<task>/loss`, eval rows `eval/<client>/<task>/<metric>`
  (`eval/<task>/<metric>` for rows without a client: the many-task setting's),
  agg rows `agg/alpha/<client>`, `agg/beta/<decoder>/<layer>` (names from the `meta` row,
  indices without it) and `agg/<key>` for their other scalar fields. A sweep's rows
  (`replica`) are tagged under their replica's label (`<label>/train/...`).
  """
  meta = meta or {}
  labels = meta.get('replicas')
  out = []
  for r in rows:
    kind, rnd = r.get('type'), r.get('round', 0)
    n = len(out)
    if kind == 'train':
      out.append((f"train/{r['client']}/{r['task']}/loss", r.get('loss'), rnd))
    elif kind == 'eval':  # the many-task setting's rows are per task (no client)
      who = f"{r['client']}/" if 'client' in r else ''
      out.append((f"eval/{who}{r['task']}/{r['metric']}", r.get('value'), rnd))
    elif kind == 'agg':
      out += _agg_scalars(r, meta)
    if 'replica' in r:
      label = labels[r['replica']] if labels else f"replica{r['replica']}"
      out[n:] = [(f'{label}/{t}', v, s) for t, v, s in out[n:]]
  return [(tag, v, int(rnd)) for tag, v, rnd in ((t, _value(v), s) for t, v, s in out)
          if v is not None]


def _agg_scalars(row: dict, meta: dict) -> list[tuple[str, object, int]]:
  rnd = row['round']
  out = []
  alpha = row.get('alpha')
  if alpha is not None:
    names = _names(meta.get('clients'), len(alpha))
    out += [(f'agg/alpha/{n}', a, rnd) for n, a in zip(names, alpha)]
  beta = row.get('beta')
  if beta is not None:
    names = _names(meta.get('decoders'), len(beta))
    layers = _names(meta.get('decoder_layers'), len(beta[0]) if len(beta) else 0)
    out += [(f'agg/beta/{n}/{l}', b, rnd)
            for n, per_layer in zip(names, beta) for l, b in zip(layers, per_layer)]
  for key, v in row.items():
    if (key not in ('round', 'type', 'alpha', 'beta', 'replica')
        and not isinstance(v, (list, tuple, dict))):
      out.append((f'agg/{key}', v, rnd))
  return out


def _names(names, n: int) -> list[str]:
  # Indices when the meta row is missing or does not match (e.g. another federation).
  return list(names) if names is not None and len(names) == n else [str(i) for i in range(n)]


class TensorBoardSink:
  """Writes metrics.jsonl rows as TensorBoard scalars (step = round) with tensorboardX."""

  def __init__(self, logdir: str, purge_step: int | None = None):
    """Event files go to `logdir`; `purge_step` hides a resumed run's old steps >= it."""
    try:
      from tensorboardX import SummaryWriter
    except ImportError:
      raise ConfigError('config.tensorboard=True needs tensorboardX: pip install '
                        '".[tensorboard]" (or set tensorboard=False)') from None
    self._writer = SummaryWriter(logdir=logdir, purge_step=purge_step)
    self._meta: dict | None = None

  def write(self, rows: list[dict]) -> None:
    """Log the rows' values; a meta row names the clients and decoders of later agg rows."""
    for r in rows:
      if r.get('type') == 'meta':
        self._meta = r
    for tag, value, step in scalars(rows, self._meta):
      self._writer.add_scalar(tag, value, global_step=step)
    self._writer.flush()

  def close(self) -> None:
    """Flush and close the event file."""
    self._writer.close()
