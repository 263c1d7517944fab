"""Partial participation in the dense engine: which clients train in a round.

`participation` is a fraction of the clients (0 < p <= 1) or a count (an integer
>= 2); 1 is every client, every round (the default, and the engine as it was).
A round's participants are drawn per client group (clients of one dataset and one
number of task slots), so every group trains a fixed number of clients and its
compiled program never changes shape: the M = ceil(p·N) (or the count) slots are
shared among the groups by largest remainder of M·n_g/N, at least one per group
(stratified sampling; the total can then exceed M by the number of groups that a
quota would leave empty). Within a group the clients are drawn without
replacement, uniformly or with probabilities proportional to their training
examples (`participation_weighting`), from `(seed, round, group)` alone: the draw
needs no state, so a resumed run draws the same clients.

What a round does with them (`rounds.py`): the participants' rows of the group
state are gathered, trained, and written back; the others keep their parameters,
optimizer, client-part and personal-model state untouched. The server part sees
every row and `ServerInputs.row_valid` ([N] bool) marking the participants; rules
aggregate over the participants only (`PARTICIPATION_RULES`, README), and the
per-row server state and client-part state of non-participants stay as they were.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from fedjax_mtl.errors import ConfigError

WEIGHTINGS = ('uniform', 'examples')


def check(value, num_clients: int) -> None:
  """One-line ConfigError unless `value` is a fraction in (0, 1] or a count in [2, N]."""
  ok = (not isinstance(value, bool) and isinstance(value, numbers.Real) and value > 0
        and (value <= 1 or (float(value).is_integer() and value <= num_clients)))
  if not ok:
    raise ConfigError(f'participation={value!r} is out of range; valid: a fraction in (0, 1] '
                      f'or a number of clients from 2 to {num_clients}')


def is_partial(config) -> bool:
  """Whether `config` samples clients (participation below every client)."""
  return float(config.get('participation', 1.0)) != 1.0


def total(value, num_clients: int) -> int:
  """Clients a round asks for: ceil(p·N) for a fraction p, else the count."""
  check(value, num_clients)
  if value <= 1:
    return max(1, math.ceil(float(np.round(value * num_clients, 9))))
  return int(value)


def group_slots(group_sizes: tuple[int, ...], value) -> tuple[int, ...]:
  """Participants per group: `total` shared by largest remainder of M·n_g/N, at
  least one per group, at most the group's size."""
  n = sum(group_sizes)
  m = total(value, n)
  quota = np.asarray(group_sizes, np.float64) * m / n
  slots = np.floor(quota).astype(int)
  order = np.argsort(-(quota - slots), kind='stable')  # ties: the earlier group
  for g in order[:m - int(slots.sum())]:
    slots[g] += 1
  return tuple(int(min(max(s, 1), size)) for s, size in zip(slots, group_sizes))


def sample(group_sizes: tuple[int, ...], slots: tuple[int, ...], seed: int, rnd: int,
           examples: list[np.ndarray] | None = None) -> list[np.ndarray]:
  """Per group: the sorted rows (within the group's real clients) taking part in round
  `rnd` (1-based); `examples` (per group, per client) weighs the draw by examples."""
  out = []
  for g, (size, k) in enumerate(zip(group_sizes, slots)):
    if k >= size:
      out.append(np.arange(size, dtype=np.int32))
      continue
    rng = np.random.default_rng([int(seed), int(rnd), g, 0x5A17])
    p = None
    if examples is not None:
      w = np.asarray(examples[g], np.float64)
      p = w / w.sum()
    out.append(np.sort(rng.choice(size, size=k, replace=False, p=p)).astype(np.int32))
  return out


class Sampler:
  """A run's participants per round, from its config and federation."""

  def __init__(self, config, fed):
    self.sizes = tuple(g.num_real for g in fed.groups)
    self.partial = is_partial(config)
    value = config.get('participation', 1.0)
    self.slots = group_slots(self.sizes, value) if self.partial else self.sizes
    self.seed = int(config.seed)
    weighting = str(config.get('participation_weighting', 'uniform'))
    if weighting not in WEIGHTINGS:
      raise ConfigError(f'unknown participation_weighting {weighting!r}; valid choices: '
                        + ', '.join(map(repr, WEIGHTINGS)))
    self.examples = ([np.asarray([fed.clients[c].num_train for c in g.client_ids])
                      for g in fed.groups] if weighting == 'examples' else None)
    self.client_ids = [np.asarray(g.client_ids) for g in fed.groups]
    self.num_clients = fed.num_clients

  def rows(self, rnd: int) -> list[np.ndarray]:
    """Per group, the participating rows of round `rnd` (every row without sampling)."""
    if not self.partial:
      return [np.arange(s, dtype=np.int32) for s in self.sizes]
    return sample(self.sizes, self.slots, self.seed, rnd, self.examples)

  def mask(self, rnd: int) -> np.ndarray:
    """[N] bool over the federation's clients: who takes part in round `rnd`."""
    on = np.zeros(self.num_clients, bool)
    for ids, rows in zip(self.client_ids, self.rows(rnd)):
      on[ids[rows]] = True
    return on

  def rate(self) -> float:
    """The largest inclusion probability of a client (DP's sampling rate)."""
    return max(k / s for k, s in zip(self.slots, self.sizes))


# What runs with partial participation: bases whose server reads the participants
# only (`rules.row_weights`: FedAvg's mean, FedNova, FedDyn's h over 1/m; FedHCA2's
# rules over the participants, `hca2`; Local and the personal parts need nothing),
# and wrappers that pass non-participants through.
SUPPORTED_BASES = ('local', 'fedavg', 'fedprox', 'fedper', 'fedbabu', 'ditto', 'fedbn', 'moon',
                   'fednova', 'feddyn', 'hca2')
SUPPORTED_WRAPPERS = ('dea', 'dp', 'quantize', 'sparsify')


def check_supported(config, num_clients: int, streamed: bool) -> None:
  """One-line ConfigError when `config` samples clients in a way the dense engine
  cannot run (a value out of range, streamed data, an algorithm without it)."""
  from fedjax_mtl import algorithms
  value = config.get('participation', 1.0)
  check(value, num_clients)
  if not is_partial(config):
    return
  *wrappers, base = algorithms.parse(str(config.algorithm))
  if base not in SUPPORTED_BASES:
    raise ConfigError(f'participation={value!r}: {base!r} has no partial-participation rule '
                      'yet; valid algorithms: ' + ', '.join(SUPPORTED_BASES))
  bad = [w for w in wrappers if w not in SUPPORTED_WRAPPERS]
  if bad:
    raise ConfigError(f'participation={value!r}: the {bad[0]}(...) wrapper has no '
                      'partial-participation rule yet; valid wrappers: '
                      + ', '.join(SUPPORTED_WRAPPERS))
  if streamed:
    raise ConfigError(f'participation={value!r} needs the in-memory feed; streamed (real) '
                      'data trains every client each round (participation=1)')
  if config.get('sweep'):
    raise ConfigError(f'participation={value!r} does not run in a sweep yet; run each '
                      "point on its own (sweep='')")
