"""Client-level differential privacy over any server rule, and its privacy accountant.

`dp(rule)` clips each client's whole update (all its rows of all shared roles) to
an L2 norm C and adds Gaussian noise before the base rule reads the uploads
(DP-FedAvg, McMahan et al. 2018, "Learning Differentially Private Recurrent
Language Models"), optionally adapting C to a quantile of the update norms
(Andrew et al. 2021, "Differentially Private Learning with Adaptive Clipping").
`epsilon`/`epsilons` turn (σ, sampling rate, rounds, δ) into ε with Google's
`dp_accounting` (an optional dependency: `pip install '.[dp]'`).

Which guarantee holds for which rule is stated in `dp`'s docstring; the short
version: `noise='sum'` is the central DP-FedAvg mechanism for rules that read the
uploads through their uniform sum or mean (FedAvg), on a trusted server;
`noise='row'` makes every upload private on its own, for any rule.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl import fields
from fedjax_mtl.algorithms import counter_rng
from fedjax_mtl.algorithms.base import (STACKABLE, Algorithm, Blocks, FedInfo, Server,
                                        ServerInputs, ServerState, Views, row_offsets)
from fedjax_mtl.errors import ConfigError

PyTree = Any

NOISE_MODES = ('sum', 'row')
ACCOUNTANTS = ('rdp', 'pld')

DP = fields.Block('dp', {
    'clip_norm': fields.Field(1.0, 'dp(...): L2 clip norm C of each client\'s whole update '
                              '(the initial C with adaptive clipping)', fields.above(0)),
    'noise_multiplier': fields.Field(1.0, 'dp(...): noise multiplier σ: Gaussian noise of std '
                                     'σ·C on the sum over the participants', fields.at_least(0)),
    'delta': fields.Field(1e-5, 'dp(...): δ of the (ε, δ) guarantee the accountant reports',
                          fields.Rule(lambda v: 0 < v < 1, '0 < {name} < 1')),
    'noise': fields.Field('sum', "dp(...): 'sum' (N(0, σ²C²/n) per participant: the central "
                          "DP-FedAvg mechanism for a uniform mean) or 'row' (N(0, σ²C²) per "
                          'participant: every upload private on its own, for any rule)',
                          choices=NOISE_MODES),
    'adaptive': fields.Field(False, 'dp(...): adapt C each round towards the target quantile of '
                             'the update norms (Andrew et al. 2021; the quantile is not noised)'),
    'target_quantile': fields.Field(0.5, 'dp(...): adaptive clipping: the fraction of updates '
                                    'C should leave unclipped', fields.unit(True)),
    'clip_lr': fields.Field(0.2, 'dp(...): adaptive clipping: the geometric step of C, '
                            'C ← C·exp(−clip_lr·(unclipped fraction − target_quantile))',
                            fields.at_least(0)),
})


def _check(name: str, value: float, ok: bool, valid: str) -> None:
  if not ok:
    raise ValueError(f'{name}={value!r} is out of range; valid range: {valid}')


def _rebuild(view: PyTree, parts: list) -> PyTree:
  """A view of the same kind (stacked or `Blocks`) as `view` from its new parts."""
  return Blocks(tuple(parts)) if isinstance(view, Blocks) else parts[0]


def _flat(x: jax.Array, rows: int) -> jax.Array:
  return x.astype(jnp.float32).reshape(rows, -1)


def _row_sq_norms(prev: PyTree, local: PyTree) -> jax.Array:
  """[rows] ‖local − prev‖² of every row over all leaves (stacked or `Blocks`), as a
  row-wise dot per leaf (XLA:CPU runs a dot near memory speed; see rules.dea_logs)."""
  out = []
  for (_, p), (_, l) in zip(row_offsets(prev), row_offsets(local)):
    pl, ll = jax.tree.leaves(p), jax.tree.leaves(l)
    if not ll:
      continue
    rows = ll[0].shape[0]
    # prev − local (the same squares as local − prev): a subtraction of its own, which
    # XLA:CPU fuses into the norm, where one shared with `_privatise` is written out.
    diffs = [_flat(a, rows) - _flat(b, rows) for a, b in zip(pl, ll)]
    out.append(sum(jnp.einsum('ri,ri->r', d, d, precision=jax.lax.Precision.HIGHEST)
                   for d in diffs))
  return jnp.concatenate(out) if out else jnp.zeros((0,), jnp.float32)


def _privatise(prev: PyTree, local: PyTree, factor: jax.Array, std: jax.Array | None,
               active: jax.Array, key: jax.Array | None) -> PyTree:
  """Per row: prev + factor·(local − prev) + std·z where `active`, else `local` bit for bit.

  z ~ N(0, 1) per entry, a `counter_rng` hash of its global index under a key per
  leaf, so a row's noise does not depend on how the rows are split into `Blocks`."""
  new_parts = []
  for ((lo, p), (_, l)) in zip(row_offsets(prev), row_offsets(local)):
    pl, ll = jax.tree.leaves(p), jax.tree.leaves(l)
    if not ll:
      new_parts.append(l)
      continue
    rows = ll[0].shape[0]
    out = []
    for i, (a, b) in enumerate(zip(pl, ll)):
      shape = (rows,) + (1,) * (b.ndim - 1)
      f = factor[lo:lo + rows].reshape(shape)
      a32 = a.astype(jnp.float32)
      v = a32 + f * (b.astype(jnp.float32) - a32)
      if std is not None:
        z = counter_rng.normal(counter_rng.key(key, i), lo, b.shape)
        v = v + std[lo:lo + rows].reshape(shape) * z
      on = active[lo:lo + rows].reshape(shape)
      out.append(jnp.where(on, v.astype(b.dtype), b))
    new_parts.append(jax.tree.unflatten(jax.tree.structure(l), out))
  return _rebuild(local, new_parts)


def dp(rule: Server, info: FedInfo, clip_norm: float, noise_multiplier: float,
       noise: str = 'sum', adaptive: bool = False, target_quantile: float = 0.5,
       clip_lr: float = 0.2, seed: int = 0) -> Server:
  """Client-level DP over any rule: each participant's whole update clipped to C and noised.

  Per client k, Δ_k = local − prev over ALL its rows of all shared roles (its
  encoder row and the decoder rows it owns, `info.row_client`), one L2 norm; the
  clipped update Δ_k·min(1, C/‖Δ_k‖) plus Gaussian noise, and the base rule reads
  prev + that as client k's upload (like `rules.dea`). In the many-task round
  (`ServerInputs.row_client` given) the unit is the real client: all the rows of
  one client segment share one norm.

  Participants: the clients whose rows hold a real upload (`ServerInputs.row_valid`,
  None: all). Every row of a non-participant passes through bit for bit, and n
  counts participants only. The noise comes from `counter_rng` under a key of
  (seed, round, a stream tag of its own, the role, the leaf), one hash per entry of
  its global index (deterministic; independent of how the rows are split into
  `Blocks`; simulation-grade, not a cryptographic generator).

  Guarantees (client level: one client's whole data added or removed; ε from
  `epsilon`):

  - `noise='sum'` (DP-FedAvg): each participant gets independent N(0, σ²C²/n) per
    entry, so the noise summed over the participants is exactly N(0, σ²C²). When the
    base rule reads the uploads only through their uniform sum or mean over the
    clients, with one row per client in every role it averages (`rules.mean()`:
    encoders, heads, decoders where each client owns one), its output IS the
    central mechanism (Σ clip(Δ_k) + N(0, σ²C²))/n, with (ε, δ) =
    `epsilon(σ, q, rounds, δ)`, q the fraction of clients sampled per round; the
    mean's denominator (rows or participants) is treated as public (McMahan et al.'s
    fixed-denominator estimator divides by the expected cohort instead). This is a CENTRAL
    guarantee, against whoever sees the aggregated models, not against the server,
    which sees each noised upload with only a 1/√n share of the noise: the wrapper
    and the base rule must run on a trusted server (or under secure aggregation).
    It does NOT hold for rules that read rows individually or weight them by data
    (example weighting, personalised or similarity-based aggregation, FedDEA's
    top-ρ mask after this wrapper), nor for a role where a client owns several rows
    that the rule sums (their sum can reach √m·C): use 'row' there.
  - `noise='row'`: each participant gets N(0, σ²C²) per entry, so every noised
    upload on its own is a Gaussian mechanism of sensitivity C (a client's data
    removed: its update zero) and noise multiplier σ; anything the base rule does
    with the rows is post-processing, so the guarantee holds for ANY rule and even
    against the server. Account it as `epsilon(σ, 1.0, rounds_k, δ)`, rounds_k the
    rounds client k took part in: the server sees who took part, so sampling does
    not amplify. The noise on a mean over n participants is then σC/√n.
  - Adaptive clipping (`adaptive=True`, Andrew et al. 2021): C lives in the server
    state and moves each round as C ← C·exp(−clip_lr·(b̄ − target_quantile)), b̄ the
    fraction of participants with ‖Δ_k‖ ≤ C (unchanged in a round without
    participants). Andrew et al. noise the count behind b̄; this wrapper does NOT,
    so the sequence of clip norms is a non-private statistic of the update norms:
    the guarantees above hold for fixed clipping, and with adaptive clipping only
    given the clip norms (which leak a quantile of the norms).

  Logs: `dp_norm` [num_clients] pre-clip norms (0 for non-participants; many-task:
  at each client's segment id),
  `dp_clipped` [num_clients] float (1: clipped), `dp_clip` (the C used),
  `dp_participants` (n).
  """
  if noise not in NOISE_MODES:
    raise ValueError(f'unknown dp noise mode {noise!r}; valid choices: '
                     + ', '.join(map(repr, NOISE_MODES)))
  _check('clip_norm', clip_norm, clip_norm > 0, 'clip_norm > 0')
  _check('noise_multiplier', noise_multiplier, noise_multiplier >= 0, 'noise_multiplier >= 0')
  _check('target_quantile', target_quantile, 0 <= target_quantile <= 1,
         '0 <= target_quantile <= 1')
  _check('clip_lr', clip_lr, clip_lr >= 0, 'clip_lr >= 0')
  n_clients = info.num_clients
  owners = {r: np.asarray(info.row_client(r), np.int32) for r in STACKABLE}
  # Keys by role name (as `topk`'s random masks), under a stream of their own: a random
  # DEA mask drawn from the same seed and round stays independent of this noise.
  stream = zlib.crc32(b'dp') & 0x7FFFFFFF
  role_tag = {r: zlib.crc32(r.encode()) & 0x7FFFFFFF for r in STACKABLE}
  sigma = float(noise_multiplier)

  def privatise(x: ServerInputs, clip: jax.Array) -> tuple[Views, jax.Array, dict]:
    valid = (jnp.ones((n_clients,), bool) if x.row_valid is None
             else jnp.asarray(x.row_valid).astype(bool))
    unit = (jnp.arange(n_clients, dtype=jnp.int32) if x.row_client is None
            else jnp.asarray(x.row_client).astype(jnp.int32))
    takes_part = jax.ops.segment_max(valid.astype(jnp.int32), unit, num_segments=n_clients) > 0
    n = jnp.sum(takes_part).astype(jnp.float32)
    roles = [r for r in x.local if jax.tree.leaves(x.local[r])]
    sq = jnp.zeros((n_clients,), jnp.float32)
    for r in roles:
      per_row = _row_sq_norms(x.prev[r], x.local[r]) * valid[owners[r]]
      sq = sq + jax.ops.segment_sum(per_row, unit[owners[r]], num_segments=n_clients)
    norm = jnp.sqrt(sq)
    factor = clip / jnp.maximum(norm, clip)  # min(1, C/‖Δ‖), 1 for a zero update
    clipped = takes_part & (norm > clip)
    if sigma == 0:
      std, key = None, None
    else:
      scale = 1.0 / jnp.sqrt(jnp.maximum(n, 1.)) if noise == 'sum' else 1.0
      std = jnp.broadcast_to(sigma * clip * scale, (n_clients,)).astype(jnp.float32)
      key = counter_rng.key(seed, x.round, stream)
    local = dict(x.local)
    for r in roles:
      rows_unit = unit[owners[r]]
      local[r] = _privatise(
          x.prev[r], x.local[r], factor[rows_unit], None if std is None else std[rows_unit],
          valid[owners[r]], None if key is None else counter_rng.key(key, role_tag[r]))
    logs = {'dp_norm': jnp.where(takes_part, norm, 0.), 'dp_clipped': clipped.astype(jnp.float32),
            'dp_clip': jnp.asarray(clip, jnp.float32), 'dp_participants': n}
    unclipped = jnp.sum(takes_part & (norm <= clip)).astype(jnp.float32)
    frac = unclipped / jnp.maximum(n, 1.)
    new_clip = jnp.where(n > 0, clip * jnp.exp(-clip_lr * (frac - target_quantile)), clip)
    return local, new_clip.astype(jnp.float32), logs

  if not adaptive:
    def apply(state: ServerState, x: ServerInputs):
      local, _, logs = privatise(x, jnp.float32(clip_norm))
      new, st, inner_logs = rule.apply(state, x._replace(local=local))
      return new, st, {**inner_logs, **logs}

    return Server(init=rule.init, apply=apply, blocks=rule.blocks)

  def init(views: Views) -> ServerState:
    inner = rule.init(views)
    return ServerState(shared={'inner': inner.shared, 'clip': jnp.float32(clip_norm)},
                       rows=inner.rows)

  def apply_adaptive(state: ServerState, x: ServerInputs):
    local, new_clip, logs = privatise(x, jnp.asarray(state.shared['clip'], jnp.float32))
    new, st, inner_logs = rule.apply(ServerState(state.shared['inner'], state.rows),
                                     x._replace(local=local))
    return new, ServerState({'inner': st.shared, 'clip': new_clip}, st.rows), {
        **inner_logs, **logs}

  return Server(init=init, apply=apply_adaptive, blocks=rule.blocks)


def wrap_dp(alg: Algorithm, info: FedInfo, config) -> Server:
  """The `dp(...)` wrapper of `alg`'s server from `config.dp` (and `config.seed`)."""
  if not alg.shared_roles:
    raise ConfigError(f'dp(...) needs a rule with shared parameters; {alg.name} shares none')
  cfg = DP.of(config)
  seed = int(config.get('seed', 0)) if config is not None else 0
  return dp(alg.server, info, float(cfg.clip_norm), float(cfg.noise_multiplier), str(cfg.noise),
            bool(cfg.adaptive), float(cfg.target_quantile), float(cfg.clip_lr), seed)


# ----------------------------------------------------------------------------
# The accountant.
# ----------------------------------------------------------------------------

def _check_accounting(noise_multiplier: float, sampling_rate: float, rounds: int, delta: float,
                      accountant: str) -> None:
  if accountant not in ACCOUNTANTS:
    raise ValueError(f'unknown accountant {accountant!r}; valid choices: '
                     + ', '.join(map(repr, ACCOUNTANTS)))
  _check('noise_multiplier', noise_multiplier, noise_multiplier >= 0, 'noise_multiplier >= 0')
  _check('sampling_rate', sampling_rate, 0 < sampling_rate <= 1, '0 < sampling_rate <= 1')
  _check('rounds', rounds, int(rounds) == rounds and rounds >= 0, 'an integer >= 0')
  _check('delta', delta, 0 < delta < 1, '0 < delta < 1')


def _accounting() -> Any:
  try:
    import dp_accounting  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError("the privacy accountant needs dp-accounting: pip install '.[dp]'") from e
  return dp_accounting


def _round_event(dpa: Any, noise_multiplier: float, sampling_rate: float) -> Any:
  """One round: the Gaussian mechanism, Poisson-sampled unless every client takes part."""
  gaussian = dpa.GaussianDpEvent(noise_multiplier)
  return gaussian if sampling_rate == 1 else dpa.PoissonSampledDpEvent(sampling_rate, gaussian)


def _new_accountant(dpa: Any, accountant: str) -> Any:
  return dpa.rdp.RdpAccountant() if accountant == 'rdp' else dpa.pld.PLDAccountant()


def epsilon(noise_multiplier: float, sampling_rate: float, rounds: int, delta: float,
            accountant: str = 'rdp') -> float:
  """ε of `rounds` Poisson-sampled Gaussian rounds at δ (`dp_accounting`'s RDP or PLD)."""
  _check_accounting(noise_multiplier, sampling_rate, rounds, delta, accountant)
  if noise_multiplier == 0:
    return float('inf')
  if rounds == 0:
    return 0.0
  dpa = _accounting()
  acc = _new_accountant(dpa, accountant)
  acc.compose(_round_event(dpa, noise_multiplier, sampling_rate), int(rounds))
  return float(acc.get_epsilon(delta))


def epsilons(noise_multiplier: float, sampling_rate: float, rounds: int, delta: float,
             accountant: str = 'rdp') -> list[float]:
  """ε at δ after each round 1..`rounds`, one round composed onto the last."""
  _check_accounting(noise_multiplier, sampling_rate, rounds, delta, accountant)
  if noise_multiplier == 0:
    return [math.inf] * int(rounds)
  dpa = _accounting()
  event = _round_event(dpa, noise_multiplier, sampling_rate)
  if accountant == 'rdp':
    # RDP composes by addition: one round's curve once (the subsampled Gaussian's RDP at
    # every order is the costly part), then t·RDP₁ after round t, which is exactly what
    # the accountant holds after composing the round t times (so the last entry is
    # `epsilon(...)` bit for bit).
    one = dpa.rdp.RdpAccountant()
    one.compose(event)
    return [float(dpa.rdp.compute_epsilon(one.orders, t * one.rdp, delta)[0])
            for t in range(1, int(rounds) + 1)]
  acc = _new_accountant(dpa, accountant)
  out = []
  for _ in range(int(rounds)):
    acc.compose(event)
    out.append(float(acc.get_epsilon(delta)))
  return out


def run_epsilons(config, sampling_rate: float = 1.0) -> list[float] | None:
  """ε at `dp.delta` after each of the run's rounds when `config.algorithm` has a
  `dp(...)` wrapper (None otherwise): `noise='sum'` accounted with the sampling rate
  (every client each round: 1); `noise='row'` for a client that took part in every
  round (its ε after round t; a client that sat out rounds has spent less)."""
  from fedjax_mtl import algorithms  # (the registry imports this module)
  if 'dp' not in algorithms.parse(str(config.algorithm))[:-1]:
    return None
  cfg = DP.of(config)
  q = sampling_rate if cfg.noise == 'sum' else 1.0
  return epsilons(float(cfg.noise_multiplier), q, int(config.num_rounds), float(cfg.delta))


def privacy_row(config, epsilons: list[float] | None, rnd: int) -> dict:
  """The privacy spent after round `rnd` as an agg row's fields ({'dp_epsilon',
  'dp_delta'}; {} without DP); `epsilons`: `run_epsilons`'s list."""
  if epsilons is None:
    return {}
  return {'dp_epsilon': epsilons[rnd - 1], 'dp_delta': float(DP.of(config).delta)}
