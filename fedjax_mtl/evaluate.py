"""`python -m fedjax_mtl.evaluate --workdir=W [--round=R] [--split=test] [--out=DIR]`:
evaluate a saved run's checkpoint without training.

The run's config is rebuilt from `W/config.json` (`workdir.saved_config`), the
engine of its setting is built on it, the checkpoint of round R (default: the newest)
is restored into the engine's state, and the engine evaluates it as a training run's
final evaluation does (`fedjax_mtl.evaluation`: every client and task on the whole
test split, edge by odsF with the papers' maxDist).
"""

from __future__ import annotations

import json
import os

SPLITS = ('test',)


def evaluate_checkpoint(workdir: str, round_: int = 0, split: str = 'test',
                        out: str = '') -> tuple[list[dict], str]:
  """Evaluate round `round_` (0: the newest) of the run in `workdir` without training:
  every client and task of the run's config on the whole `split`, the edge task by
  odsF (the papers' maxDist). Writes `eval.jsonl` (the rows), results.md /
  results.csv and curves.png (the run's rows up to that round with these in place of
  its own evaluation) to `out` (default `<workdir>/evaluations/round_<R>`); returns
  (rows, out). ConfigError (one line, nothing written) for a workdir without a run,
  a config this version cannot rebuild, a round that was not saved or a checkpoint
  that is not this config's."""
  from fedjax_mtl import engines, report
  from fedjax_mtl import workdir as workdir_lib
  from fedjax_mtl.checkpoint import Checkpointer
  from fedjax_mtl.errors import ConfigError, check_choice
  check_choice('split', split, SPLITS)
  config = workdir_lib.saved_config(workdir)
  ckdir = os.path.join(workdir, 'checkpoints')
  saved = Checkpointer.saved_in(ckdir)
  if not saved:
    raise ConfigError(f'{workdir!r} holds no checkpoint (checkpoints/ is empty)')
  rnd = round_ or saved[-1]
  if rnd not in saved:
    raise ConfigError(f'round {rnd} was not saved in {ckdir}; saved rounds: '
                      + ', '.join(map(str, saved)))
  out = out or os.path.join(workdir, 'evaluations', f'round_{rnd}')
  if 'eval_edge_ods' in config:  # the papers' edge metric at this evaluation
    config.eval_edge_ods = 'every' if isinstance(config.eval_edge_ods, str) else True
  config.progress = False
  engine = engines.build(config)
  ckpt = None
  try:
    engine.open(rnd)
    abstract = engine.abstract_state()
    ckpt = Checkpointer(ckdir, like=abstract)
    state = ckpt.restore(rnd, abstract)
    rows = engine.evaluate(state, rnd)
  finally:
    if ckpt is not None:
      ckpt.close()
    engine.close()
  history = [r for r in report.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
             if r.get('round', 0) <= rnd and r.get('type') not in ('eval', 'eval_linear')]
  os.makedirs(out, exist_ok=True)
  report.atomic_write(os.path.join(out, 'eval.jsonl'),
                      ''.join(json.dumps(r) + '\n' for r in rows))
  engine.write_reports(history + rows, [r for r in rows if r['type'] == 'eval'], out)
  return rows, out


def main(argv=None) -> int:
  """`python -m fedjax_mtl.evaluate --workdir=W [--round=R] [--split=test] [--out=DIR]`."""
  import argparse
  import sys
  from fedjax_mtl.errors import ConfigError
  p = argparse.ArgumentParser(
      prog='python -m fedjax_mtl.evaluate',
      description="Evaluate a saved run's checkpoint without training: every client and "
      "task on the whole test split, edge by odsF; rows and tables go to "
      '<workdir>/evaluations/round_<R>/.')
  p.add_argument('--workdir', required=True, help='workdir of a training run')
  p.add_argument('--round', type=int, default=0, help='saved round to evaluate (default: newest)')
  p.add_argument('--split', default='test', help='split to evaluate: ' + ', '.join(SPLITS))
  p.add_argument('--out', default='', help='output folder (default: '
                 '<workdir>/evaluations/round_<R>)')
  a = p.parse_args(argv)
  try:
    rows, out = evaluate_checkpoint(a.workdir, a.round, a.split, a.out)
  except ConfigError as e:
    print('error: ' + ' '.join(str(e).split()), file=sys.stderr)
    return 2
  for r in rows:
    if r['type'] == 'eval':
      print(f"{r.get('client', '-')} {r.get('dataset', '')} {r['task']} {r['metric']} "
            f"{r['value']:.2f}".replace('  ', ' '))
  print(f'written: {out}')
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
