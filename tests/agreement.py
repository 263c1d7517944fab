"""Did two runs of one config, compiled as different programs, train the same models?

Runs on other meshes (1 vs 4 devices, 2 processes), as Flower clients or from streamed
chunks compute the same math in other matmul shapes, so XLA sums in other orders:
their parameters differ by rounding, never by more, unless something is wrong. What
makes that testable on any host is the optimizer. Adam divides each step by the
gradient's running RMS: rounding noise in a gradient that is zero in exact arithmetic
(a bias feeding a train-mode BatchNorm) or a ReLU kink that flips becomes an lr-sized
step, and such a comparison needs a tolerance tuned on one host. An SGD step (with or
without momentum) is linear in the gradient: the runs' rounding differences stay
rounding-sized through the few steps of a test. So these tests train with `SGD` and
compare every model row (a client's encoder or head, a decoder) by how far training
moved it, plus the float32 rounding of the row itself:

    |got_r - want_r| <= TOL * |want_r - init_r| + EPS * |want_r|   (L2 over row r's leaves)

EPS (about 80 float32 ulps of each value) covers parameters that training barely moves,
where one step's `p - lr * u` rounds to a neighbouring float in one run and not the
other. Measured agreement stays below a tenth of the bound (the tests print it); the
faults a sharding bug makes (`faults`: a client's row on another client's device,
padding rows averaged into a mean) exceed it many times over, and every test that uses
`assert_agree` checks that they fail it by FAULT_MARGIN.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np

# Plain momentum SGD, no warm-up: the rows train visibly in a two-round smoke run.
SGD = {'optim.name': 'sgd', 'optim.momentum': 0.9, 'optim.lr': 0.002,
       'optim.warmup_epochs': 0, 'optim.weight_decay': 0.0}
TOL = 1e-3
EPS = 1e-5
FAULT_MARGIN = 30  # a fault must exceed the bound by this factor


class Reference(NamedTuple):
  """A finished one-device engine run (`conftest.reference_run`)."""
  exp: object
  init: dict  # model_rows at round 0
  final: dict  # model_rows at the end
  result: dict  # train_and_evaluate's return value
  workdir: str


def run_reference(config, workdir: str) -> Reference:
  """`config` run to its end in `workdir` on this process's devices."""
  from fedjax_mtl import experiment, train
  exp = experiment.build(config)
  init = model_rows(exp, [gs.params for gs in experiment.init_state(exp).groups])
  result = train.train_and_evaluate(config, workdir)
  return Reference(exp, init, model_rows(exp, [gs.params for gs in result['state'].groups]),
                   result, workdir)


def model_rows(exp, group_params: list, roles=('encoder', 'decoder', 'head')) -> dict:
  """{'<part>[path]': [rows, ...]} of the real models: 'encoder' and 'decoder' rows as
  the aggregation sees them (N clients, K decoders), 'head<g>' the clients of group g."""
  from fedjax_mtl import experiment
  out = {}
  for role in roles:
    if role == 'head':
      for g, (p, spec) in enumerate(zip(group_params, exp.fed.groups)):
        heads = {k: v for k, v in p.items() if k.startswith('head_')}
        out.update(_flat(f'head{g}', jax.tree.map(lambda x, n=spec.num_real: x[:n], heads)))
    else:
      out.update(_flat(role, experiment.views(exp, group_params, role)))
  return out


def flat_tree(part: str, tree) -> dict:
  """`model_rows`' layout of one stacked tree (leading axis: rows) named `part`."""
  return _flat(part, tree)


def flat_views(views: dict) -> dict:
  """`model_rows`' layout of {role: stacked rows} (e.g. a Flower strategy's `views`)."""
  out = {}
  for role, tree in views.items():
    out.update(_flat(role, tree))
  return out


def _flat(part: str, tree) -> dict:
  return {f'{part}{jax.tree_util.keystr(path)}': np.asarray(x, np.float64)
          for path, x in jax.tree_util.tree_flatten_with_path(jax.device_get(tree))[0]}


def _parts(rows: dict) -> dict[str, list[str]]:
  parts: dict[str, list[str]] = {}
  for k in sorted(rows):
    parts.setdefault(k.split('[')[0], []).append(k)
  return parts


def row_errors(got: dict, want: dict, init: dict) -> dict[str, np.ndarray]:
  """Per part, each row's |got - want| as a fraction of its bound
  TOL * |want - init| + EPS * |want| (module docstring): <= 1 is agreement."""
  assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))[:5]
  out = {}
  for part, keys in _parts(want).items():
    diff = np.sqrt(sum(_sq(got[k] - want[k]) for k in keys))
    bound = (TOL * np.sqrt(sum(_sq(want[k] - init[k]) for k in keys))
             + EPS * np.sqrt(sum(_sq(want[k]) for k in keys)))
    with np.errstate(divide='ignore', invalid='ignore'):
      out[part] = np.where(diff == 0, 0., diff / bound)
  return out


def _sq(x: np.ndarray) -> np.ndarray:
  return (x.reshape(x.shape[0], -1) ** 2).sum(1)


def select(rows: dict, roles) -> dict:
  """The entries of `rows` of the given parts ('encoder', 'decoder', ...)."""
  return {k: v for k, v in rows.items() if k.split('[')[0] in roles}


def worst(got: dict, want: dict, init: dict) -> float:
  """The largest row error of `row_errors`."""
  return max(float(e.max()) for e in row_errors(got, want, init).values())


def faults(want: dict, init: dict, num_real: int, num_padded: int) -> dict[str, dict]:
  """What sharding faults would have made of `want`: every part's rows shifted by one
  (each client's row on the next client's device), and every update shrunk by
  num_real / num_padded (zero-update padding rows averaged into a mean)."""
  shifted = {k: np.roll(v, 1, axis=0) for k, v in want.items()}
  scale = num_real / num_padded
  padded = {k: init[k] + (want[k] - init[k]) * scale for k in want}
  return {'rows on the wrong device': shifted, 'padding averaged in': padded}


def assert_within_bound(got: dict, want: dict, init: dict) -> str:
  """Every row of `got` within its bound of `want` (no fault check: for comparisons of
  two computations of one thing, not of a sharded run). Returns the worst row."""
  assert all(np.all(np.isfinite(v)) for v in got.values())
  for part, e in row_errors(got, want, init).items():
    assert np.all(e <= 1), f'{part}: rows apart by {e} of their bound (agreement.py)'
  return f'worst row: {worst(got, want, init):.3f} of its bound'


def assert_agree(got: dict, want: dict, init: dict, num_real: int, num_padded: int) -> str:
  """`got` trained the models `want` did (every row within its bound), and the criterion
  is strict: each of `faults(want)` exceeds the bound FAULT_MARGIN times. Returns a line
  with the worst row of `got` and of each fault, as fractions of their bounds."""
  assert all(np.all(np.isfinite(v)) for v in got.values())
  for part, e in row_errors(got, want, init).items():
    assert np.all(e <= 1), f'{part}: rows apart by {e} of their bound (agreement.py)'
  line = f'worst row: {worst(got, want, init):.3f} of its bound'
  for name, broken in faults(want, init, num_real, num_padded).items():
    err = worst(broken, want, init)
    assert err > FAULT_MARGIN, (name, err)
    line += f'; {name}: {err:.0f}'
  return line


def many_task_rows(state) -> dict:
  """A many-task state's trainable rows in `model_rows`' layout, each leaf its own part
  (`storage/path[]`): 'shared' (one row), 'task_rows', 'pair_rows' (float64 host arrays)."""
  state = jax.device_get(state)
  return {f'{part}/{k}[]': np.asarray(v, np.float64)[None] if part == 'shared'
          else np.asarray(v, np.float64)
          for part in ('shared', 'task_rows', 'pair_rows')
          for k, v in getattr(state, part).items()}


def assert_many_task_agree(got: dict, want: dict, init: dict) -> str:
  """`many_task_rows` of another program's run agree with `want`'s (every row within its
  bound), and the criterion is strict: the fault a server weighing padding slots in
  would make (every update shrunk by 5/8) exceeds the bound FAULT_MARGIN times on every
  leaf training moved beyond rounding (LoRA's B factors and the heads; the A factors
  barely move while B is near 0). Returns a line with the worst row and fault."""
  errors = row_errors({k: got[k] for k in want}, want, init)
  assert all(np.all(e <= 1) for e in errors.values()), {p: e.max() for p, e in errors.items()}
  moved = [k for k, w in want.items()
           if np.linalg.norm(w - init[k]) > 1e3 * EPS * np.linalg.norm(w)]
  assert any('lora_b' in k for k in moved) and any('head' in k for k in moved), moved
  pick = lambda d: {k: d[k] for k in moved}
  fault = {k: init[k] + 5 / 8 * (want[k] - init[k]) for k in moved}
  faults = row_errors(fault, pick(want), pick(init))
  assert all(e.max() > FAULT_MARGIN for e in faults.values()), {
      p: e.max() for p, e in faults.items()}
  return (f'worst row: {max(float(e.max()) for e in errors.values()):.3g} of its bound; '
          f'shrunk updates: {min(float(e.max()) for e in faults.values()):.0f}')
