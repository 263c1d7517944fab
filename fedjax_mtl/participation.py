"""Partial participation in the dense engine: which clients train in a round.

`participation` is a fraction of the clients (0 < p <= 1) or a count (an integer
>= 2); 1 is every client, every round (the default, and the engine as it was).
A round trains M = ceil(p·N) clients (or the count), drawn per client group (clients
of one dataset and one number of task slots) so that each group's program sees only
a few shapes: group g of n_g clients has the quota q_g = M·n_g/N and trains
floor(q_g) or ceil(q_g) clients, the remainders given out by systematic sampling
so that every round trains exactly M and E[slots_g] = q_g. Every client's chance to
take part is then M/N, as under uniform sampling of M clients, and each group
compiles at most two programs (`slot_options`), both before round 1; a group
with no slot in a round does not train. Within a group the clients are drawn
without replacement, uniformly or with probabilities proportional to their
training examples (`participation_weighting`). Every draw comes from
`(seed, round)` alone: it needs no state, so a resumed run draws the same clients.

Stragglers (`stragglers`, `straggler_steps`): each round every participant is,
with probability `stragglers` (drawn from (seed, round, group) as well), a straggler
that completes only the first ceil(straggler_steps · its steps) local steps (the rest
are masked, like a small client's padding steps); the server sees the steps each
client took (`ServerInputs.num_steps`), which FedNova normalises by.

What a round does with them (`rounds.py`): in memory, the participants' rows of the
group state are gathered, trained, and written back; the others keep their
parameters, optimizer, client-part and personal-model state untouched. Streamed
(`real.TrainChunks`), the feed reads only the participants' images and masks every
step of the others (and a straggler's steps past its share): the same arithmetic,
without the in-memory path's saving of device time. The server part sees
every row and `ServerInputs.row_valid` ([N] bool) marking the participants; rules
aggregate over the participants only (`SUPPORTED_BASES`, README) and decide what
their per-row state does for the others; the client-part state of non-participants
stays as it was.
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


def quotas(group_sizes: tuple[int, ...], value) -> np.ndarray:
  """[groups] M·n_g/N: each group's expected participants a round."""
  n = sum(group_sizes)
  return np.asarray(group_sizes, np.float64) * total(value, n) / n


def slot_options(group_sizes: tuple[int, ...], value) -> tuple[tuple[int, ...], ...]:
  """Per group, the numbers of participants a round can give it (floor and ceil of
  its quota; the shapes its program is compiled for, 0 left out)."""
  q = quotas(group_sizes, value)
  return tuple(tuple(sorted({k for k in (int(np.floor(x + 1e-9)), int(np.ceil(x - 1e-9)))
                             if k > 0})) for x in q)


def round_slots(group_sizes: tuple[int, ...], value, seed: int, rnd: int) -> tuple[int, ...]:
  """Participants per group in round `rnd`: floor of each quota, plus one for the
  groups a systematic sample over the quotas' remainders hits (exactly M in all;
  E = the quota)."""
  q = quotas(group_sizes, value)
  base = np.floor(q + 1e-9).astype(int)
  frac = np.clip(q - base, 0., 1.)
  u = np.random.default_rng([int(seed), int(rnd), 0x51075]).random()
  edges = np.concatenate([[0.], np.cumsum(frac)])
  extra = [int(np.floor(hi - u) - np.floor(lo - u)) for lo, hi in zip(edges[:-1], edges[1:])]
  return tuple(int(min(b + e, size)) for b, e, size in zip(base, extra, group_sizes))


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

  def __init__(self, config, fed, seed: int | None = None):
    """`seed`: the draws' seed when not `config.seed` (a sweep's replica)."""
    self.sizes = tuple(g.num_real for g in fed.groups)
    self.partial = is_partial(config)
    self.value = config.get('participation', 1.0)
    self.options = (slot_options(self.sizes, self.value) if self.partial
                    else tuple((s,) for s in self.sizes))
    self.total = total(self.value, sum(self.sizes)) if self.partial else sum(self.sizes)
    self.seed = int(config.seed if seed is None else seed)
    weighting = str(config.get('participation_weighting', 'uniform'))
    if weighting not in WEIGHTINGS:
      raise ConfigError(f'unknown participation_weighting {weighting!r}; valid choices: '
                        + ', '.join(map(repr, WEIGHTINGS)))
    self.examples = ([np.asarray([fed.clients[c].num_train for c in g.client_ids])
                      for g in fed.groups] if weighting == 'examples' else None)
    self.client_ids = [np.asarray(g.client_ids) for g in fed.groups]
    self.stragglers = float(config.get('stragglers', 0.0))
    self.straggler_steps = float(config.get('straggler_steps', 0.5))
    self.num_clients = fed.num_clients

  def rows(self, rnd: int) -> list[np.ndarray]:
    """Per group, the participating rows of round `rnd` (every row without sampling)."""
    if not self.partial:
      return [np.arange(s, dtype=np.int32) for s in self.sizes]
    slots = round_slots(self.sizes, self.value, self.seed, rnd)
    return sample(self.sizes, slots, self.seed, rnd, self.examples)

  def mask(self, rnd: int) -> np.ndarray:
    """[N] bool over the federation's clients: who takes part in round `rnd`."""
    on = np.zeros(self.num_clients, bool)
    for ids, rows in zip(self.client_ids, self.rows(rnd)):
      on[ids[rows]] = True
    return on

  def step_fracs(self, rnd: int, rows: list[np.ndarray]) -> list[np.ndarray] | None:
    """Per group, over the rows it trains in round `rnd` (`rows[g]`, padding rows
    included), the share of its local steps each completes: `straggler_steps` for the
    round's stragglers (each participant one with probability `stragglers`, drawn from
    (seed, round, group)), 1 for the others; None without stragglers."""
    if not self.stragglers:
      return None
    out = []
    for g, r in enumerate(rows):
      rng = np.random.default_rng([self.seed, int(rnd), g, 0x57A6])
      late = rng.random(len(r)) < self.stragglers
      out.append(np.where(late, self.straggler_steps, 1.0).astype(np.float32))
    return out

  @property
  def active(self) -> bool:
    """Whether rounds differ from every client training all its steps."""
    return self.partial or bool(self.stragglers)

  def step_shares(self, rnd: int, rows: list[np.ndarray] | None = None) -> list[np.ndarray]:
    """Per group, over its real clients: the share of its local steps each takes in
    round `rnd`: 0 if it sits the round out, `straggler_steps` for a straggler, else 1
    (the streamed feed masks steps by it, `real.TrainChunks`; the in-memory trainers
    take it for the rows they train). `rows`: the round's `rows(rnd)`, if at hand."""
    rows = self.rows(rnd) if rows is None else rows
    fracs = self.step_fracs(rnd, rows)
    out = []
    for g, (size, r) in enumerate(zip(self.sizes, rows)):
      share = np.zeros(size, np.float32)
      share[r] = 1.0 if fracs is None else fracs[g]
      out.append(share)
    return out

  def rate(self) -> float:
    """A client's chance to take part in a round (DP's sampling rate): M/N (uniform
    draws; by examples, a client's chance varies around it)."""
    return self.total / sum(self.sizes)


# What runs with partial participation: bases whose server reads the participants
# only (`rules.row_weights`: FedAvg's mean, FedNova, FedDyn's h over 1/m; FedHCA2's
# rules over the participants, `hca2`; FedAMP's cloud models mixing participants;
# FedSTA's shared body; FedGA's weights moved by the gaps of returning participants;
# NTKFedAvg's c + α·mean of the participants' signed task vectors, and the averaged
# batch-norm statistics of MaT-FL and NTKFedAvg over the participants (`rounds`);
# MaT-FL's grouping of the participants' encoders, as in the
# many-task setting; FedACG's and `momentum`'s server momentum, a global quantity
# kept per row that every row follows; Local and the personal parts need nothing),
# and wrappers that pass non-participants through (`pcgrad`: a client that sat out has
# Δ = 0, which no projection involves, so the participants are projected off each
# other only, in their order of the round's permutation; `heal`: FedHEAL over its
# online clients, `plugin_math.heal_terms`; `grouped`: each group's rule over the
# group's participants, `rules.group_info`, except FedHCA2's, which gathers a fixed
# number of participants a round while a group's number varies).
SUPPORTED_BASES = ('local', 'fedavg', 'fedprox', 'fedper', 'fedbabu', 'ditto', 'fedbn', 'moon',
                   'fednova', 'feddyn', 'hca2', 'fedamp', 'fedsta', 'fedacg', 'matfl', 'fedga',
                   'ntkfedavg')
SUPPORTED_WRAPPERS = ('dea', 'dp', 'quantize', 'sparsify', 'momentum', 'pcgrad', 'heal',
                      'grouped')


def check_supported(config, num_clients: int) -> None:
  """One-line ConfigError when `config` samples clients in a way the dense engine
  cannot run (a value out of range, an algorithm without it; a sweep is refused by
  `sweep.check`)."""
  from fedjax_mtl import algorithms
  value = config.get('participation', 1.0)
  check(value, num_clients)
  if not is_partial(config):
    return
  *wrappers, base = algorithms.parse(str(config.algorithm))
  if base not in SUPPORTED_BASES:
    raise ConfigError(f'participation={value!r}: {base!r} has no partial-participation rule '
                      'yet; valid algorithms: ' + ', '.join(SUPPORTED_BASES))
  if 'grouped' in wrappers and base == 'hca2':
    raise ConfigError(f'participation={value!r}: grouped(...) over hca2 has no '
                      "partial-participation rule (a group's participants vary in number "
                      'from round to round); valid: hca2 without grouped, or grouped over '
                      + ', '.join(b for b in SUPPORTED_BASES if b != 'hca2'))
  bad = [w for w in wrappers if w not in SUPPORTED_WRAPPERS]
  if bad:
    raise ConfigError(f'participation={value!r}: the {bad[0]}(...) wrapper has no '
                      'partial-participation rule yet; valid wrappers: '
                      + ', '.join(SUPPORTED_WRAPPERS))
