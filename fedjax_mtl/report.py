"""metrics.jsonl, result tables (markdown + CSV) and plots."""

from __future__ import annotations

import csv
import io
import json
import os
from typing import Iterable

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
  arrow = '↓' if row['task'] in LOWER_IS_BETTER else '↑'
  return f"{row['client']}/{row['task']} {row['metric']}{arrow}"


def results_table(method: str, eval_rows: list[dict]) -> tuple[str, str]:
  """One-row-per-method table (markdown, CSV): one column per client task."""
  cols = [column_name(r) for r in eval_rows]
  vals = [f"{r['value']:.4f}" if r['task'] == 'depth' else f"{r['value']:.2f}"
          for r in eval_rows]
  md = ('| method | ' + ' | '.join(cols) + ' |\n'
        + '|---' * (len(cols) + 1) + '|\n'
        + f'| {method} | ' + ' | '.join(vals) + ' |\n')
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(['method'] + cols)
  w.writerow([method] + [r['value'] for r in eval_rows])
  return md, buf.getvalue()
