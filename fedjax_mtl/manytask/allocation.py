"""The many-task client setting: which client holds which task, and which samples.

MaTU (spec matu §1.3) splits both tasks and data with Dirichlet draws "following
Li et al. (2021)" (NIID-Bench) without giving the procedure; this module fixes
it (spec §7 items 10 and 11). N clients, T tasks, seed s; every draw comes from
``np.random.default_rng([s, stream, ...])``, so the result is a pure function of
the arguments.

1. Task allocation, a binary matrix A [N, T] (A[n, t] = client n holds task t),
   ``assign_tasks``:
   - zeta_t = 0 (one task per client, no overlap; needs N >= T): shuffle the
     clients and the tasks with one permutation each; the i-th shuffled client
     gets the (i mod T)-th shuffled task. Every task gets floor(N/T) or
     ceil(N/T) clients (30 clients, 8 tasks: six tasks with 4, two with 3).
   - zeta_t > 0: for each client draw p_n ~ Dir(zeta_t * 1_T); the client holds
     task t iff p_n[t] >= task_threshold / T, and always its argmax task. Then
     every task that no client holds is given to the client with the largest
     p_n[t] (tasks in index order). Small zeta_t gives few tasks per client.
   - zeta_t = inf (or None): every client holds every task.
   - Fixed k tasks per client (``fixed_tasks``, MaTU's Fig. 5): one permutation
     of the tasks; client n holds the k tasks at positions (n·k + j) mod T,
     j < k, so the clients walk round the permutation and every task is held
     by floor or ceil(N·k / T) clients (when N·k >= T, all of them are).
   - Explicit groups (``grouped_tasks``, Fig. 6a's conflict groups): client n
     holds group n mod G.
2. Within-task data split, ``split_by_label`` (NIID-Bench's "noniid-labeldir"):
   the training set of task t (n samples, C classes) is split among the N_t
   clients holding t. For each class k in order: shuffle the class's sample
   indices, draw q ~ Dir(zeta_c * 1_{N_t}), zero q_j for every client j that
   already has >= n / N_t samples (balancing), renormalise (uniform over the
   clients below n / N_t should every remaining q_j be 0), and cut the class's
   indices at the cumulative proportions. Redraw everything until every client
   has >= ``min_size`` samples (default 10, as NIID-Bench; at most ``max_tries``
   times), then shuffle each client's indices. zeta_c = inf (or None) is IID
   (NIID-Bench's "homo"): a random permutation of the n indices split into N_t
   near-equal consecutive parts (``np.array_split``). Either way the parts are
   disjoint and together cover the whole training set.
3. Participation, ``sample_participants``: each round, ceil(xi * N) distinct
   clients uniformly at random without replacement (sorted), a fixed number so
   compiled shapes stay fixed; xi = 1 is every client.

Random streams: task allocation ``[seed, 0]``, task t's data split
``[seed, 1, t]``, round r's participants ``[seed, 2, r]``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import numbers
from typing import Sequence

import numpy as np

from fedjax_mtl.errors import ConfigError

DEFAULT_MIN_SIZE = 10  # NIID-Bench's min_require_size
_TASK_STREAM, _SPLIT_STREAM, _ROUND_STREAM = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class Allocation:
  """Who holds what: `assignment` A [N, T] bool, `indices[n][t]` = client n's sample

  indices into task t's training set (only for the tasks client n holds).
  """
  assignment: np.ndarray
  indices: tuple[dict[int, np.ndarray], ...]

  @property
  def num_clients(self) -> int:
    return self.assignment.shape[0]

  @property
  def num_tasks(self) -> int:
    return self.assignment.shape[1]

  def clients_of(self, task: int) -> np.ndarray:
    """Sorted ids of the clients holding `task`."""
    return np.flatnonzero(self.assignment[:, task])

  def tasks_of(self, client: int) -> np.ndarray:
    """Sorted ids of the tasks `client` holds."""
    return np.flatnonzero(self.assignment[client])


def _is_iid(zeta) -> bool:
  return zeta is None or math.isinf(zeta)


def _check_zeta(name: str, zeta) -> None:
  if zeta is None:
    return
  if isinstance(zeta, bool) or not isinstance(zeta, numbers.Real) or math.isnan(zeta) or zeta < 0:
    raise ConfigError(f'{name} must be a number >= 0 or inf/None (IID), got {zeta!r}')


def _check_count(name: str, value, low: int = 1) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
    raise ConfigError(f'{name} must be an integer >= {low}, got {value!r}')
  return int(value)


def assign_tasks(num_clients: int, num_tasks: int, zeta_t: float | None, seed: int = 0,
                 task_threshold: float = 1.) -> np.ndarray:
  """Binary task allocation A [N, T] from Dir(zeta_t) (module docstring, step 1)."""
  n = _check_count('num_clients', num_clients)
  t = _check_count('num_tasks', num_tasks)
  _check_zeta('zeta_t', zeta_t)
  if (isinstance(task_threshold, bool) or not isinstance(task_threshold, numbers.Real)
      or not task_threshold > 0):
    raise ConfigError(f'task_threshold must be > 0 (a multiple of 1/T), got {task_threshold!r}')
  if _is_iid(zeta_t):
    return np.ones((n, t), bool)
  rng = np.random.default_rng([int(seed), _TASK_STREAM])
  a = np.zeros((n, t), bool)
  if zeta_t == 0:
    if t > n:
      raise ConfigError(f'zeta_t = 0 gives one task per client and needs num_tasks <= '
                        f'num_clients, got {t} tasks for {n} clients')
    clients = rng.permutation(n)
    tasks = rng.permutation(t)
    a[clients, tasks[np.arange(n) % t]] = True
    return a
  p = rng.dirichlet(np.full(t, float(zeta_t)), size=n)
  a = p >= task_threshold / t
  a[np.arange(n), p.argmax(1)] = True
  for task in range(t):
    if not a[:, task].any():
      a[p[:, task].argmax(), task] = True
  return a


def fixed_tasks(num_clients: int, num_tasks: int, k: int, seed: int = 0) -> np.ndarray:
  """A [N, T] with exactly k tasks per client (module docstring, step 1)."""
  n = _check_count('num_clients', num_clients)
  t = _check_count('num_tasks', num_tasks)
  if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= t:
    raise ConfigError(f'tasks per client must be an integer in 1..{t} (the tasks), got {k!r}')
  perm = np.random.default_rng([int(seed), _TASK_STREAM]).permutation(t)
  a = np.zeros((n, t), bool)
  for c in range(n):
    a[c, perm[(c * k + np.arange(k)) % t]] = True
  return a


def grouped_tasks(num_clients: int, groups: Sequence[Sequence[int]], num_tasks: int
                  ) -> np.ndarray:
  """A [N, T]: client n holds the tasks of `groups[n mod G]`."""
  n = _check_count('num_clients', num_clients)
  if not groups or any(not g for g in groups):
    raise ConfigError('task groups must be non-empty lists of tasks')
  a = np.zeros((n, num_tasks), bool)
  for c in range(n):
    a[c, list(groups[c % len(groups)])] = True
  return a


def split_by_label(labels: np.ndarray, num_clients: int, zeta_c: float | None, seed: int = 0,
                   min_size: int = DEFAULT_MIN_SIZE, max_tries: int = 1000,
                   fields: str = '') -> list[np.ndarray]:
  """NIID-Bench Dirichlet label split of one training set (module docstring, step 2).

  Returns `num_clients` disjoint int64 index arrays covering range(len(labels)).
  `seed` may be a sequence of ints (an `np.random.default_rng` seed). `fields`
  prefixes the setting names an error advises changing (e.g. 'many.').
  """
  labels = np.asarray(labels)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer) or (labels < 0).any():
    raise ConfigError(f'labels must be a 1-d array of non-negative integers, got '
                      f'{labels.dtype} of shape {labels.shape}')
  k = _check_count('num_clients', num_clients)
  _check_zeta('zeta_c', zeta_c)
  min_size = _check_count('min_size', min_size, 0)
  n = len(labels)
  if n < k * max(min_size, 1):
    raise ConfigError(f'a training set of {n} samples cannot give {k} clients at least '
                      f'{max(min_size, 1)} samples each; lower {fields}min_size or use fewer '
                      f'clients')
  rng = np.random.default_rng(seed)
  if _is_iid(zeta_c):
    return [part.astype(np.int64) for part in np.array_split(rng.permutation(n), k)]
  if zeta_c == 0:
    raise ConfigError('zeta_c must be > 0 (Dir(0) is undefined) or inf/None (IID), got 0')
  members = [np.flatnonzero(labels == c) for c in np.unique(labels)]  # once, not per try
  for _ in range(max_tries):
    parts = [[] for _ in range(k)]
    sizes = np.zeros(k, np.int64)
    for of_class in members:
      idx = rng.permutation(of_class)
      q = rng.dirichlet(np.full(k, float(zeta_c)))
      below = sizes < n / k
      q = q * below
      # With tiny zeta_c every remaining proportion can underflow to 0.
      q = q / q.sum() if q.sum() > 0 else below / below.sum()
      cuts = (np.cumsum(q) * len(idx)).astype(np.int64)[:-1]
      for j, chunk in enumerate(np.split(idx, cuts)):
        parts[j].append(chunk)
        sizes[j] += len(chunk)
    if sizes.min() >= min_size:
      return [rng.permutation(np.concatenate(p)).astype(np.int64) for p in parts]
  raise ConfigError(f'no Dirichlet({zeta_c}) split of {n} samples over {k} clients gave every '
                    f'client >= {min_size} samples in {max_tries} tries; raise {fields}zeta_c, '
                    f'lower {fields}min_size or use fewer clients per task')


def allocate(train_labels: Sequence[np.ndarray], num_clients: int, zeta_t: float | None,
             zeta_c: float | None, seed: int = 0, min_size: int = DEFAULT_MIN_SIZE,
             task_threshold: float = 1., assignment: np.ndarray | None = None,
             names: Sequence[str] | None = None, fields: str = '',
             max_tries: int = 1000) -> Allocation:
  """Tasks to clients (Dir(zeta_t), or the given `assignment` A [N, T]), then each
  task's training set to its clients (Dir(zeta_c), at most `max_tries` draws a task:
  `split_by_label`).

  `train_labels[t]` are task t's training labels; indices refer to that array.
  A split that fails names its task (`names[t]`, else its index) and the settings
  to change (`fields` prefixes their names, e.g. 'many.' for a run's config).
  """
  if len(train_labels) == 0:
    raise ConfigError('allocate needs at least one task (train_labels is empty)')
  if assignment is None:
    a = assign_tasks(num_clients, len(train_labels), zeta_t, seed, task_threshold)
  else:
    a = np.asarray(assignment, bool)
    if a.shape != (num_clients, len(train_labels)) or not a.any(1).all():
      raise ConfigError(f'task assignment of shape {a.shape} must be ({num_clients}, '
                        f'{len(train_labels)}) with at least one task per client')
    if not a.any(0).all():
      raise ConfigError('tasks ' + ', '.join(map(str, np.flatnonzero(~a.any(0))))
                        + ' are held by no client')
  indices = [dict() for _ in range(a.shape[0])]
  for t, labels in enumerate(train_labels):
    holders = np.flatnonzero(a[:, t])
    try:
      parts = split_by_label(labels, len(holders), zeta_c, [int(seed), _SPLIT_STREAM, t],
                             min_size, max_tries, fields=fields)
    except ConfigError as e:
      raise ConfigError(f'task {names[t] if names is not None else t}: {e}') from None
    for client, part in zip(holders, parts):
      indices[client][t] = part
  return Allocation(assignment=a, indices=tuple(indices))


def num_participants(num_clients: int, xi: float) -> int:
  """ceil(xi * N), the fixed number of clients per round (0.2 * 30 -> 6)."""
  n = _check_count('num_clients', num_clients)
  if isinstance(xi, bool) or not isinstance(xi, numbers.Real) or not 0 < xi <= 1:
    raise ConfigError(f'participation rate xi must be in (0, 1], got {xi!r}')
  # Round first so float error (0.2 * 30 = 6.000000000000001) does not add a client.
  return max(1, math.ceil(float(np.round(xi * n, 9))))


def sample_participants(num_clients: int, xi: float, round: int, seed: int = 0) -> np.ndarray:
  """Sorted ids of the ceil(xi * N) distinct clients of `round` (uniform, no replacement).

  `round` (0-based) shadows the builtin on purpose: it is the paper's round index.
  """
  m = num_participants(num_clients, xi)
  r = _check_count('round', round, 0)
  if m == num_clients:
    return np.arange(num_clients)
  rng = np.random.default_rng([int(seed), _ROUND_STREAM, r])
  return np.sort(rng.choice(num_clients, size=m, replace=False))


def conflict_groups(clusters: Sequence[Sequence[str]], level: int, num_clients: int,
                    group_size: int = 3) -> list[list[str]]:
  """MaTU Fig. 6a's conflict groups: up to `num_clients` groups of `group_size` tasks
  spanning max(level, 1) of the task `clusters` (level 0: one cluster, no conflict;
  2: two; 3: three), chosen greedily (in `itertools.combinations` order) to cover
  the most tasks not yet held; once every task such groups can hold is held, no
  more are added (clients take the groups in turn, `grouped_tasks`)."""
  spans = 1 if level == 0 else level
  if level == 1 or not 1 <= spans <= len(clusters):
    raise ConfigError(f'conflict level {level} needs {spans} clusters; the relatedness file '
                      f'has {len(clusters)}; valid levels: 0, '
                      + ', '.join(str(c) for c in range(2, len(clusters) + 1)))
  where = {t: i for i, c in enumerate(clusters) for t in c}
  tasks = [t for c in clusters for t in c]
  combos = [g for g in itertools.combinations(tasks, group_size)
            if len({where[t] for t in g}) == spans]
  if not combos:
    raise ConfigError(f'no group of {group_size} tasks spans {spans} clusters of {clusters}')
  groups, held = [], set()
  while len(groups) < num_clients:
    best = max(combos, key=lambda g: (len(set(g) - held), -combos.index(g)))
    if not set(best) - held:  # everything coverable is held: repeat the groups
      break
    groups.append(list(best))
    held |= set(best)
  return groups
