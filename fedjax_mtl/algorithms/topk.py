"""Exact per-client top-ρ magnitude masks without sorting (FedDEA, spec §2.1–2.3).

A client's mask keeps its ⌊ρ·d⌋ largest |Δ| over its whole update: every row of
every role it owns (its encoder row and its decoder rows), all leaves together
(spec §2.1: one global top-k, not per layer). The threshold is the exact k-th
largest |Δ|, found by *selection on the int32 bit pattern of |Δ|* (the key,
ordered like |Δ| for non-negative floats), never by a sort:

- A **counting pass** reads the update once and counts, per client, its entries
  in 8 buckets cut by 7 thresholds. The 8 counts of 15 entries (15 chunks of a
  leaf, a column) are packed in one int32 (4-bit fields), so the pass is one
  integer sum over a major axis of 15: the one integer reduction XLA:CPU
  vectorizes (compares, selects, scatters, `cumsum`, `lax.top_k` and float sorts
  are 3× to 1000× slower there).
- The bracket `[lo, hi]` holding the k-th key shrinks pass by pass. The first
  thresholds span the k-th quantile ±3σ of a sorted strided sample (16384 entries
  per client); the next ones its predicted position inside the bracket (count
  density linear in value, its slope from the neighbouring buckets) ±3σ of its
  count, or, after a miss, split the bracket evenly.
- Once a client's bracket holds few entries, one **compaction pass** keeps, per
  column of 16 entries, the largest key inside the bracket (1/16 of the data),
  and the last passes count on that, snapping the bracket to the keys it holds.
  A client with two bracket entries in one column (rare; detected by count)
  compacts again in columns of 15, which never pair the same two entries; if
  that fails too, it goes on with counting passes over the whole update.
Typically 2 counting passes and 1 compaction pass over the update, then 1–3
passes over 1/16 of it. Leaves under 65536 entries per row (and the last <1920
entries of larger ones) are gathered once into one key block per part, so a
pass has one fusion per large leaf, not per leaf.

Updates of at most 2^16 entries per client (`_SORT_UP_TO`: tests, small models) take
one sort of each client's keys instead, the same exact threshold: the passes'
program takes seconds to compile, the sort's a tenth of one.

Semantics: an entry's order is that of its key: NaN counts as larger than +inf,
denormals are ordered exactly (no flush to zero), -0 equals +0.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_mtl.algorithms.base import Blocks, Views, row_offsets

PyTree = Any

VARIANTS = ('top', 'small', 'random')

_ROWS = 15  # entries summed into one counting column: a 4-bit field holds the count
_FIELD = 4  # bits per packed bucket count (8 fields fill an int32)
_NT = 7  # thresholds per counting pass: 8 buckets
_HEIGHTS = (16, 15)  # column heights of the compaction and of its retry
_SPLIT = 8  # a row's block is reduced as 8 rows: XLA:CPU splits a reduction over
            # threads by its leading axis, and 5 clients' rows split 3 + 2 on 2 cores
_BLOCK = _SPLIT * 240  # key blocks are multiples of 8 · 15 · 16 (every height divides)
_BIG = 1 << 16  # entries per row from which a leaf is its own block
_COLLISIONS = 0.05  # expected same-column bracket pairs at which a client compacts
_SAMPLE = 16384  # sampled entries per client for the first thresholds
_Z = 3.0  # half-width of a predicted k-th position, in standard deviations
_MODEL_ERR = 0.002  # ... plus this fraction of the bracket (density not linear)
_MAX_PASSES = 64  # far above need: every two passes shrink a bracket 4× or more
_TOP = 0x7FFFFFFF  # |x| bit mask; also the largest key (a NaN)
# Up to this many entries per client, one sort of each client's keys: exact and the same
# threshold, and its program compiles in a tenth of a second against about two for the
# passes below (tests and small-model runs compile more than they run); a sort's cost
# per entry grows with log d, so larger updates take the passes.
_SORT_UP_TO = 1 << 16


class _Part(NamedTuple):
  """Rows that share leaves (one stacked view, or one `Blocks` part)."""
  leaves: tuple  # the original arrays, leading rows axis (sampled; sizes)
  blocks: tuple  # (array [rows, n], L, holds keys already): its first L entries per row,
                 # L a multiple of 1920 (sliced inside each pass: a slice carried into
                 # the loops would be a copy of the whole update)
  owners: np.ndarray  # owner client of every row
  keyed: bool = False  # the leaves hold keys already (random keys)


class _Bracket(NamedTuple):
  """Per client: the k-th largest key lies in [lo, hi]; c_lo = #(key ≥ lo) ≥ k and
  c_above = #(key > hi) < k."""
  lo: jax.Array
  hi: jax.Array
  c_lo: jax.Array
  c_above: jax.Array
  miss: jax.Array  # the last pass's prediction missed (count not halved)
  dens_below: jax.Array  # entries per value unit just below lo (-1: unknown)
  dens_above: jax.Array  # ... just above hi
  below_grid: jax.Array  # the last pass found the k-th below all its thresholds
  tried_sample: jax.Array  # the last grid sat on the sample's k-th key (ties)


# ----------------------------------------------------------------------------
# Rows, owners and keys.
# ----------------------------------------------------------------------------

def _abs_bits(x: jax.Array) -> jax.Array:
  """Key of |x|: its bit pattern as int32, non-negative, ordered like |x|."""
  return jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32) & _TOP


def _views(rows: PyTree, row_client: Mapping[str, Sequence[int]] | None) -> dict:
  """role -> (view, owner of each row); a bare pytree is one role of one row per client."""
  if row_client is None:
    n = sum(jax.tree.leaves(p)[0].shape[0] for _, p in row_offsets(rows)
            if jax.tree.leaves(p))
    return {'': (rows, np.arange(n))}
  return {r: (v, np.asarray(row_client[r])) for r, v in rows.items()}


def _blocks(leaves: tuple, keyed: bool) -> tuple:
  """Key blocks of a part: each large leaf's first multiple of 1920 entries, and one
  block gathering the small leaves and the large leaves' ends (padded with -1, a key
  below every threshold and outside every bracket)."""
  keys = (lambda x: x) if keyed else _abs_bits
  big, small = [], []
  for x in leaves:
    flat = x.reshape(x.shape[0], -1)
    n = flat.shape[1]
    cut = n - n % _BLOCK if n >= _BIG else 0
    if cut:
      big.append((flat, cut, keyed))
    if cut < n:
      small.append(keys(flat[:, cut:]))
  if small:
    r = small[0].shape[0]
    n = sum(s.shape[1] for s in small)
    small.append(jnp.full((r, -n % _BLOCK), -1, jnp.int32))
    small = jnp.concatenate(small, axis=1)
    big.append((small, small.shape[1], True))
  return tuple(big)


def _parts(views: dict, keyed: bool = False) -> list[_Part]:
  """Every part of every view, with its key blocks and the owner of each row."""
  out = []
  for view, owners in views.values():
    for lo, part in row_offsets(view):
      leaves = tuple(x for x in jax.tree.leaves(part) if x.size)
      if leaves:
        out.append(_Part(leaves, _blocks(leaves, keyed), owners[lo:lo + leaves[0].shape[0]],
                         keyed))
  return out


def _sizes(views: dict, num_clients: int) -> np.ndarray:
  """Entries per client over all its rows of all views (static shapes only)."""
  d = np.zeros(num_clients, np.int64)
  for view, owners in views.values():
    for lo, part in row_offsets(view):
      leaves = [x for x in jax.tree.leaves(part) if x.size]
      if leaves:
        rows = leaves[0].shape[0]
        np.add.at(d, owners[lo:lo + rows], sum(x.size // rows for x in leaves))
  if d.max(initial=0) >= 2**31:
    raise ValueError(f'a client has {int(d.max())} entries; at most 2^31 - 1 are supported')
  return d


def _per_row(values: jax.Array, owners: np.ndarray, ndim: int) -> jax.Array:
  """Per-client values for every row, shaped to broadcast over `ndim`-d row data."""
  return values[jnp.asarray(owners)].reshape((-1,) + (1,) * (ndim - 1))


def _per_split(values: jax.Array, owners: np.ndarray) -> jax.Array:
  """Per-client values for the split rows `_columns` hands its `fn` ([rows · 8, h, m])."""
  return _per_row(values, np.repeat(owners, _SPLIT), 3)


# ----------------------------------------------------------------------------
# Passes over the key blocks.
# ----------------------------------------------------------------------------

def _columns(block: tuple, fn: Callable, reduce: Callable, height: int) -> jax.Array:
  """reduce(fn(keys)) over `height` chunks of each eighth of a block's rows ("split
  rows", `fn` sees keys [rows · 8, height, m]): [rows · 8, L / (8·height)]. The chunks
  lie m apart, so the reduction runs over a major axis (vectorized); XLA:CPU splits it
  over threads by its leading axis, which the split rows balance (5 clients' rows would
  split 3 + 2 on 2 cores)."""
  x, n, keyed = block
  r = x.shape[0]
  x = x[:, :n] if n < x.shape[1] else x
  keys = x if keyed else _abs_bits(x)
  return reduce(fn(keys.reshape(r * _SPLIT, height, -1)), axis=1)


def _decode(cols: list) -> jax.Array:
  """Per-row totals [rows, 8] of packed columns (a list of [rows, M_b], 4-bit fields,
  each <= 15; every M_b a multiple of 16, as `_columns` gives for key blocks).

  Each block's columns are first summed in groups of 16 with their fields spread to
  bytes (16 · 15 = 240 < 2^8), so only these sixteenths are concatenated, not the
  whole columns (2–3 % of a mask call, BENCHMARKS.md); then they are spread to 16
  bits before the next sums over 16 (16 · 240 < 2^16). The last (ΣM_b / 16) mod 16
  byte words are unpacked directly.
  """
  # The barrier keeps XLA from fusing the sums below into the counting reductions
  # (nested sums become unvectorized reduce-windows).
  cols = jax.lax.optimization_barrier(cols)
  r = cols[0].shape[0]
  # Reshape first, then mask: XLA fuses the masking into the sums only that way; the
  # barriers keep it from merging nested sums into unvectorized reduce-windows.
  group = lambda x, fn: jnp.sum(fn(x.reshape(r, 16, -1)), axis=1)
  even = [group(v, lambda x: x & 0x0F0F0F0F) for v in cols]  # fields 0, 2, 4, 6 in bytes 0..3
  odd = [group(v, lambda x: (x >> 4) & 0x0F0F0F0F) for v in cols]  # fields 1, 3, 5, 7
  even, odd = jax.lax.optimization_barrier((even, odd))
  join = lambda xs: xs[0] if len(xs) == 1 else jnp.concatenate(xs, axis=1)
  even, odd = join(even), join(odd)
  n = even.shape[1]
  cut = n - n % 16
  tail = [jnp.sum((x[:, cut:] >> (8 * b)) & 0xFF, axis=1) for b in range(4) for x in (even, odd)]
  total = jnp.stack(tail, axis=1)  # fields 0, 1, ..., 7
  if not cut:
    return total
  words = [group(x[:, :cut], fn) for x in (even, odd)
           for fn in (lambda y: y & 0x00FF00FF, lambda y: (y >> 8) & 0x00FF00FF)]
  words = jax.lax.optimization_barrier(words)
  lo = [jnp.sum(w & 0xFFFF, axis=1) for w in words]  # fields 0, 2, 1, 3
  hi = [jnp.sum(w >> 16, axis=1) for w in words]  # fields 4, 6, 5, 7
  return total + jnp.stack([lo[0], lo[2], lo[1], lo[3], hi[0], hi[2], hi[1], hi[3]], axis=1)


class _Grid(NamedTuple):
  """Thresholds t_j = base + ceil(j·2^24 / mul), j < 7, per client: an entry's bucket is
  (clip(key - base, -1, t_6 - base) · mul) >> 24, one int32 multiply (a per-client
  shift would be a variable vector shift, 2× slower on some x86 cores)."""
  base: jax.Array
  mul: jax.Array  # in [1, 2^24]: thresholds 2^24 / mul apart, 1 to 2^24 key units

  def offsets(self) -> jax.Array:
    """[K, 7] t_j - base."""
    j = jnp.arange(_NT, dtype=jnp.int32)[None]
    return (j * (1 << 24) + self.mul[:, None] - 1) // self.mul[:, None]


def _count_pass(parts: list[_Part], num_clients: int, grid: _Grid) -> jax.Array:
  """[K, 8] entries per client in buckets (-inf, t0), [t0, t1), ..., [t6, inf)."""
  top = grid.offsets()[:, -1]
  total = jnp.zeros((num_clients, _NT + 1), jnp.int32)
  for p in parts:
    def one_hot(b, p=p):
      row = lambda v: _per_split(v, p.owners)
      g = (jnp.clip(b - row(grid.base), -1, row(top)) * row(grid.mul)) >> 24  # -1 .. 6
      return jnp.left_shift(jnp.int32(1), _FIELD * (g + 1))
    per_split = _decode([_columns(b, one_hot, jnp.sum, _ROWS) for b in p.blocks])
    owners = jnp.asarray(np.repeat(p.owners, _SPLIT))
    total = total + jax.ops.segment_sum(per_split, owners, num_clients)
  return total


def _compact(parts: list[_Part], br: _Bracket, retry: jax.Array) -> list[_Part]:
  """Per column of 16 entries (of 15 if `retry`), the largest key inside its client's
  bracket (else -1): one key block per part, 15 to 16 times smaller (both shaped as
  the 15 one, so the passes after either are one program)."""
  out = []
  for p in parts:
    def inside(b, p=p):
      lo, hi = _per_split(br.lo, p.owners), _per_split(br.hi, p.owners)
      keep = ~(((b - lo) >> 31) | ((hi - b) >> 31))  # -1 where lo <= b <= hi, else 0
      return (b & keep) | ~keep

    width = sum(b[1] // _HEIGHTS[1] for b in p.blocks)
    width += -width % _BLOCK

    def columns(height, p=p, inside=inside, width=width):
      cols = [_columns(b, inside, jnp.max, height) for b in p.blocks]
      cols = list(jax.lax.optimization_barrier(cols))  # as in _decode
      r, n = cols[0].shape[0], sum(c.shape[1] for c in cols)
      pad = jnp.full((r, width // _SPLIT - n), -1, jnp.int32)
      return jnp.concatenate(cols + [pad], axis=1).reshape(len(p.owners), width)

    keys = jax.lax.cond(retry, lambda: columns(_HEIGHTS[1]), lambda: columns(_HEIGHTS[0]))
    out.append(p._replace(blocks=((keys, width, True),)))
  return out


def _row_reduce(part: _Part, fn: Callable, reduce: Callable) -> jax.Array:
  """reduce(fn(keys)) over a compacted part's keys, per row [rows]."""
  cols = jax.lax.optimization_barrier(_columns(part.blocks[0], fn, reduce, 16))
  return reduce(reduce(cols, axis=1).reshape(len(part.owners), _SPLIT), axis=1)


def _captured(parts: list[_Part], br: _Bracket, num_clients: int) -> jax.Array:
  """Entries per client at or above its `lo` in compacted parts."""
  total = jnp.zeros((num_clients,), jnp.int32)
  for p in parts:
    n = _row_reduce(p, lambda x, p=p: ~((x - _per_split(br.lo, p.owners)) >> 31) & 1,
                    jnp.sum)
    total = total + jax.ops.segment_sum(n, jnp.asarray(p.owners), num_clients)
  return total


def _snap(parts: list[_Part], br: _Bracket, k: jax.Array, num_clients: int,
          active: jax.Array) -> _Bracket:
  """The bracket shrunk to the keys it holds in compacted parts, and closed where the
  k-th is its largest or its smallest key."""
  top = jnp.full((num_clients,), -1, jnp.int32)
  bottom = jnp.full((num_clients,), _TOP, jnp.int32)
  for p in parts:
    row = lambda v, x, p=p: _per_split(v, p.owners)

    def largest(x, row=row):  # x where x <= hi, else -1
      return x | ((row(br.hi, x) - x) >> 31)

    def smallest(x, row=row):  # x where x >= lo, else TOP (empty columns: -1 < lo)
      under = (x - row(br.lo, x)) >> 31
      return (x & ~under) | (under & _TOP)

    owners = jnp.asarray(p.owners)
    top = jnp.maximum(top, jax.ops.segment_max(_row_reduce(p, largest, jnp.max), owners,
                                               num_clients))
    bottom = jnp.minimum(bottom, jax.ops.segment_min(_row_reduce(p, smallest, jnp.min),
                                                     owners, num_clients))
  r, m = k - br.c_above, br.c_lo - br.c_above
  new = br._replace(lo=jnp.where(r == 1, top, bottom), hi=jnp.where(r == m, bottom, top),
                    dens_below=jnp.full_like(br.dens_below, -1.0),
                    dens_above=jnp.full_like(br.dens_above, -1.0))
  return jax.tree.map(lambda a, b: jnp.where(active, a, b), new, br)


def _sample(parts: list[_Part], sizes: np.ndarray) -> tuple[jax.Array, np.ndarray]:
  """Sorted keys [K, S] of every `stride`-th entry of each client's rows (leaves in
  order, padded at the front with -1), and the real sample size per client."""
  stride = max(1, int(sizes.max()) // _SAMPLE)
  pieces, owners = [], []
  for p in parts:
    start, cols = 0, []
    for x in p.leaves:
      flat = x.reshape(x.shape[0], -1)
      n = flat.shape[1]
      first = (stride // 2 - start) % stride
      if first < n:
        s = flat[:, first::stride]
        cols.append(s if p.keyed else _abs_bits(s))
      start += n
    if cols:
      s = jnp.concatenate(cols, axis=1)
      pieces.append(s.reshape(-1))
      owners.extend(np.repeat(p.owners, s.shape[1]).tolist())
  flat = jnp.concatenate(pieces + [jnp.full((1,), -1, jnp.int32)])
  owners = np.asarray(owners, np.int64)
  counts = np.bincount(owners, minlength=len(sizes))
  width = max(int(counts.max(initial=0)), 1)
  index = np.full((len(sizes), width), flat.shape[0] - 1, np.int64)  # -> the -1 pad
  for c in range(len(sizes)):
    pos = np.flatnonzero(owners == c)
    index[c, width - len(pos):] = pos
  return jnp.sort(flat[jnp.asarray(index)], axis=1), counts


# ----------------------------------------------------------------------------
# Choosing thresholds and narrowing the bracket.
# ----------------------------------------------------------------------------

def _value(key: jax.Array) -> jax.Array:
  """The float32 |x| of a key."""
  return jax.lax.bitcast_convert_type(key, jnp.float32)


def _key(value: jax.Array) -> jax.Array:
  """The key of a float32 value (negative values clipped to 0)."""
  return jax.lax.bitcast_convert_type(jnp.maximum(value, 0.0), jnp.int32)


def _mul_for(spacing: jax.Array) -> jax.Array:
  """The multiplier whose thresholds are at least `spacing` (float) apart."""
  return jnp.clip(jnp.floor((1 << 24) / jnp.maximum(spacing, 1.0)), 1, 1 << 24).astype(jnp.int32)


class _Sample(NamedTuple):
  """A client's sorted sample and what the k-th largest key is in it."""
  keys: jax.Array  # [K, S] ascending, padded at the front with -1
  n: jax.Array  # [K] real sample sizes (float)
  q: jax.Array  # [K] expected sample entries >= the k-th key (float)

  def at(self, rank: jax.Array) -> jax.Array:
    """The key of 1-based descending `rank` (clipped into the sample)."""
    width = self.keys.shape[1]
    i = jnp.clip(width - rank, 0, width - 1).astype(jnp.int32)
    return jnp.take_along_axis(self.keys, i[:, None], 1)[:, 0]


def _sample_grid(sample: _Sample, br: _Bracket) -> _Grid:
  """Thresholds spanning the sample's k-th quantile ±3σ."""
  q, n = sample.q, sample.n
  sd = jnp.sqrt(q * jnp.maximum(1.0 - q / n, 0.0)) + 1.0
  low = jnp.where(q + _Z * sd >= n, 0, sample.at(jnp.floor(q + _Z * sd)))
  high = jnp.where(q - _Z * sd < 1.0, _TOP, sample.at(jnp.ceil(q - _Z * sd)))
  high = jnp.maximum(high, low)
  spacing = (high.astype(jnp.float32) - low.astype(jnp.float32)) / (_NT - 1)
  # Too wide for thresholds 2^24 apart (a k-th near the largest or smallest entry):
  # centre them on the sample's k-th entry instead.
  mid = sample.at(jnp.clip(jnp.round(q), 1.0, n)).astype(jnp.float32)
  centred = jnp.clip(mid - (_NT - 1) / 2 * float(1 << 24), 1.0, 2147483520.0)
  base = jnp.where(spacing > float(1 << 24), centred.astype(jnp.int32), low)
  return _Grid(jnp.clip(base, br.lo + 1, br.hi), _mul_for(spacing))


def _grid(br: _Bracket, k: jax.Array, sample: _Sample) -> tuple[_Grid, jax.Array]:
  """The k-th position predicted inside the bracket (count density linear across it,
  its slope from the neighbouring buckets of the last pass) ±3σ of its count plus a
  model error; after a miss, the bracket split evenly, or (ties suspected: the count
  did not halve though the prediction should have) unit thresholds around the
  sample's k-th key. Also returns whether the latter was chosen."""
  width = (br.hi - br.lo).astype(jnp.float32) + 1.0
  even_mul = _mul_for(width / (_NT + 1))
  even_base = br.lo + (((1 << 24) + even_mul - 1) // even_mul)
  # Thresholds at most 2^24 apart cover 2^27: in a wider bracket, start next to the
  # last pass's thresholds, where the k-th just fell outside.
  short = (width > (_NT + 1) * float(1 << 24)) & br.below_grid
  even_base = jnp.where(short, jnp.maximum(br.lo + 1, br.hi - _NT * (1 << 24) + 1), even_base)
  even = _Grid(even_base, even_mul)
  # The prediction works on values, not keys: a key unit is twice as wide in value
  # in the next binade up, so densities per key unit jump at binade edges.
  m = jnp.maximum(br.c_lo - br.c_above, 1).astype(jnp.float32)
  r = jnp.clip((k - br.c_above).astype(jnp.float32), 1.0, m)
  v_lo, v_hi = _value(br.lo), _value(jnp.minimum(br.hi, _TOP - 1) + 1)
  span = v_hi - v_lo
  finite = jnp.isfinite(span) & (span > 0)
  span = jnp.where(finite, span, 1.0)
  mean = m / span
  below = jnp.where(br.dens_below >= 0, br.dens_below, mean)
  above = jnp.where(br.dens_above >= 0, br.dens_above, mean)
  known = (br.dens_below >= 0).astype(jnp.float32) + (br.dens_above >= 0)
  slope = (above - below) / (span * jnp.maximum(known, 1.0))
  slope = jnp.clip(slope, -1.8 * mean / span, 1.8 * mean / span)  # density > 0 inside
  # u: distance below the top at which r - 0.5 entries lie above (a quadratic's root).
  top = mean + slope * span / 2
  c = r - 0.5
  u = 2 * c / (top + jnp.sqrt(jnp.maximum(top * top - 2 * slope * c, 0.0)))
  local = jnp.maximum(mean + slope * (span / 2 - u), 1e-3 * mean)
  model = jnp.where(known > 0, _MODEL_ERR, 4 * _MODEL_ERR) * m
  half = (_Z * (jnp.sqrt(r * (m - r) / m) + 1.0) + model) / local
  first, last = _key(v_hi - u - half), _key(v_hi - u + half)
  near_mul = _mul_for((last - first).astype(jnp.float32) / (_NT - 1))
  near = _Grid(jnp.clip(first, br.lo + 1, br.hi), near_mul)
  # Ties: a key the sample holds, in the bracket, next to the k-th sample rank.
  tie = sample.at(jnp.clip(jnp.round(sample.q), 1.0, sample.n))
  tie_ok = br.miss & ~br.tried_sample & (tie >= br.lo) & (tie <= br.hi) & (width > _NT + 1)
  tie_grid = _Grid(jnp.clip(tie - (_NT // 2 - 1), br.lo + 1, br.hi),
                   jnp.full_like(near_mul, 1 << 24))
  use_even = br.miss | ~finite | (even_mul >= near_mul)
  pick = lambda a, b, c: jax.tree.map(
      lambda x, y, z: jnp.where(tie_ok, x, jnp.where(use_even, y, z)), a, b, c)
  return pick(tie_grid, even, near), tie_ok


def _narrow(br: _Bracket, k: jax.Array, grid: _Grid, buckets: jax.Array,
            offset: jax.Array, active: jax.Array, tried: jax.Array) -> _Bracket:
  """The bracket after a counting pass (clients not `active` keep theirs)."""
  off = grid.offsets()
  above = jnp.flip(jnp.cumsum(jnp.flip(buckets, 1), 1), 1)[:, 1:] + offset[:, None]
  valid = off <= (br.hi - grid.base)[:, None]  # t_j <= hi (t_j > lo already)
  t = grid.base[:, None] + jnp.where(valid, off, 0)
  up = valid & (above >= k[:, None])
  down = valid & (above < k[:, None])
  lo = jnp.max(jnp.where(up, t, br.lo[:, None]), 1)
  hi = jnp.min(jnp.where(down, t - 1, br.hi[:, None]), 1)
  c_lo = jnp.min(jnp.where(up, above, br.c_lo[:, None]), 1)
  c_above = jnp.max(jnp.where(down, above, br.c_above[:, None]), 1)
  # Densities of the inner buckets next to the new bracket, for the next prediction.
  a = jnp.sum(up, 1) - 1  # index of the threshold at lo (-1: none)
  idx = lambda x, i: jnp.take_along_axis(x, jnp.clip(i, 0, _NT - 1)[:, None], 1)[:, 0]
  ok = lambda i: (i >= 0) & (i < _NT) & idx(valid, i)

  def dens(i):  # entries per value unit in [t_i, t_{i+1}), or -1
    span = _value(idx(t, i + 1)) - _value(idx(t, i))
    d = (idx(above, i) - idx(above, i + 1)).astype(jnp.float32) / span
    return jnp.where(jnp.isfinite(d) & (span > 0), d, -1.0)

  new = _Bracket(lo=lo, hi=hi, c_lo=c_lo, c_above=c_above,
                 miss=2 * (c_lo - c_above) > br.c_lo - br.c_above,
                 dens_below=jnp.where(ok(a - 1) & ok(a), dens(a - 1), -1.0),
                 dens_above=jnp.where(ok(a + 1) & ok(a + 2), dens(a + 1), -1.0),
                 below_grid=~jnp.any(up, 1), tried_sample=tried)
  return jax.tree.map(lambda a, b: jnp.where(active, a, b), new, br)


def _sorted_kth(parts: list[_Part], k: jax.Array, sizes: np.ndarray) -> jax.Array:
  """The k-th largest key per client by one sort of each client's keys (all its rows
  of all parts, padded at the front with -1 to the largest client's size)."""
  width = max(int(sizes.max(initial=0)), 1)
  rows = [[] for _ in sizes]
  for p in parts:
    keys = [x.reshape(x.shape[0], -1) for x in p.leaves]
    keys = [x if p.keyed else _abs_bits(x) for x in keys]
    flat = keys[0] if len(keys) == 1 else jnp.concatenate(keys, axis=1)
    for i, c in enumerate(p.owners):
      rows[c].append(flat[i])
  table = jnp.stack([jnp.concatenate([jnp.full((width - int(n),), -1, jnp.int32)] + r)
                     for n, r in zip(sizes, rows)])
  kth = jnp.take_along_axis(jnp.sort(table, axis=1), (width - k)[:, None], 1)[:, 0]
  return jnp.where(jnp.asarray(sizes == 0), 0, kth)


def _kth_keys(parts: list[_Part], k: jax.Array, sizes: np.ndarray,
              stats: bool = False):
  """The exact k-th largest key per client (int32 [K]); with `stats`, also the number
  of counting passes over the update and over compacted columns (both 0 when every
  client has at most `_SORT_UP_TO` entries: one sort then)."""
  num_clients = len(sizes)
  k = jnp.clip(jnp.broadcast_to(jnp.asarray(k, jnp.int32), (num_clients,)), 1,
               jnp.asarray(np.maximum(sizes, 1), jnp.int32))
  if sizes.max(initial=0) <= _SORT_UP_TO:
    kth = _sorted_kth(parts, k, sizes)
    return (kth, {'passes': jnp.int32(0), 'compacted_passes': jnp.int32(0)}) if stats else kth
  none = jnp.zeros(num_clients, bool)
  unknown = jnp.full((num_clients,), -1.0, jnp.float32)
  br = _Bracket(lo=jnp.zeros(num_clients, jnp.int32),
                hi=jnp.where(jnp.asarray(sizes == 0), 0, _TOP).astype(jnp.int32),
                c_lo=jnp.asarray(sizes, jnp.int32), c_above=jnp.zeros(num_clients, jnp.int32),
                miss=none, dens_below=unknown, dens_above=unknown, below_grid=none,
                tried_sample=none)
  keys, counts = _sample(parts, sizes)
  n = jnp.asarray(np.maximum(counts, 1), jnp.float32)
  sample = _Sample(keys, n, k.astype(jnp.float32) * n
                   / jnp.asarray(np.maximum(sizes, 1), jnp.float32))
  # Compact once a bracket's entries would rarely share a column of 16.
  pairs_ok = jnp.asarray(_COLLISIONS * np.maximum(sizes - 1, 1) / (_HEIGHTS[0] - 1),
                         jnp.float32)
  zero = jnp.zeros(num_clients, jnp.int32)

  def compactable(b):
    m = (b.c_lo - b.c_above).astype(jnp.float32)
    return m * (m - 1) / 2 <= pairs_ok

  def full_pass(c):
    it, b, force, done, small = c
    active = (b.hi > b.lo) & (~compactable(b) | force)
    grid, tried = _grid(b, k, sample)
    grid = jax.tree.map(lambda s, g: jnp.where(it == 0, s, g), _sample_grid(sample, b), grid)
    b = _narrow(b, k, grid, _count_pass(parts, num_clients, grid), zero, active, tried)
    return it + 1, b, force, done, small

  def compact_stage(c):
    """Counting passes over compacted columns for the clients whose bracket entries
    all landed in different columns: of 16, then (for the others) of 15."""
    it, b, force, done, small = c

    def attempt(retry, cc):
      b, todo, small = cc

      def run(b):
        cparts = _compact(parts, b, retry == 1)
        ok = todo & (_captured(cparts, b, num_clients) == b.c_lo - b.c_above)
        offset = b.c_above

        def cond(cc):
          j, bb = cc
          return jnp.any((bb.hi > bb.lo) & ok) & (j < _MAX_PASSES)

        def body(cc):
          j, bb = cc
          bb = _snap(cparts, bb, k, num_clients, (bb.hi > bb.lo) & ok)
          live = (bb.hi > bb.lo) & ok
          grid, tried = _grid(bb, k, sample)
          return j + 1, _narrow(bb, k, grid, _count_pass(cparts, num_clients, grid), offset,
                                live, tried)

        j, b = jax.lax.while_loop(cond, body, (jnp.int32(0), b))
        return b, ok, j

      b, ok, j = jax.lax.cond(jnp.any(todo), run, lambda b: (b, none, jnp.int32(0)), b)
      return b, todo & ~ok, small + j

    b, _, small = jax.lax.fori_loop(0, len(_HEIGHTS), attempt, (b, b.hi > b.lo, small))
    return it, b, force | (b.hi > b.lo), True, small  # the rest: full passes

  def cond(c):
    it, b, *_ = c
    return jnp.any(b.hi > b.lo) & (it < _MAX_PASSES)

  def body(c):
    it, b, force, done, *_ = c
    need_full = jnp.any((b.hi > b.lo) & (~compactable(b) | force)) | done | (it == 0)
    return jax.lax.cond(need_full, full_pass, compact_stage, c)

  init = (jnp.int32(0), br, none, jnp.asarray(False), jnp.int32(0))
  passes, br, _, _, small = jax.lax.while_loop(cond, body, init)
  if stats:
    return br.lo, {'passes': passes, 'compacted_passes': small}
  return br.lo


# ----------------------------------------------------------------------------
# Public API.
# ----------------------------------------------------------------------------

def kth_largest_abs(rows: PyTree, k: jax.Array | int,
                    row_client: Mapping[str, Sequence[int]] | None = None,
                    num_clients: int | None = None) -> jax.Array:
  """The exact k-th largest |x| per client over all its entries, float32 [K].

  `rows` is a pytree whose leaves have a leading client axis (row i is client i;
  `Blocks` allowed), or, with `row_client`, a mapping role -> view (stacked rows or
  `Blocks`) whose rows belong to clients `row_client[role]`: a client's value is taken
  over all its rows of all roles together. `k` (int, or traced scalar or [K]) is
  clipped to [1, d_client]. NaN counts as the largest value; a client without entries
  gets 0.
  """
  return _value(kth_threshold(rows, k, row_client, num_clients))


def kth_threshold(rows: PyTree, k: jax.Array | int,
                  row_client: Mapping[str, Sequence[int]] | None = None,
                  num_clients: int | None = None, stats: bool = False):
  """The selection `kth_largest_abs` runs, as keys: the exact k-th largest |x| per
  client as its key, int32 [K] (the bit pattern of |x|, ordered like |x|; a client
  without entries gets 0). Arguments as `kth_largest_abs`'s.

  With `stats`, (keys, {'passes', 'compacted_passes'}): the counting passes over the
  whole update and over compacted columns (both 0 when every client has at most
  2^16 entries: one sort then). benchmarks/feddea.py times the selection alone with it.
  """
  views = _views(rows, row_client)
  if num_clients is None:
    num_clients = max(int(o.max(initial=-1)) for _, o in views.values()) + 1
  return _kth_keys(_parts(views), k, _sizes(views, num_clients), stats=stats)


def client_sizes(deltas: Views, row_client: Mapping[str, Sequence[int]],
                 num_clients: int) -> np.ndarray:
  """Entries per client over all its rows of all roles (static)."""
  return _sizes(_views(deltas, row_client), num_clients)


def _random_keys(deltas: Views, key: jax.Array) -> dict:
  """role -> int32 random keys in [0, 2^31) shaped like the role's rows. A row's keys
  depend on (key, role, leaf position, row index), not on how rows are split in parts."""
  out = {}
  for role, view in deltas.items():
    rkey = jax.random.fold_in(key, zlib.crc32(role.encode()) & 0x7FFFFFFF)

    def part_keys(lo, part, rkey=rkey):
      leaves, tdef = jax.tree.flatten(part)
      new = []
      for i, x in enumerate(leaves):
        lkey = jax.random.fold_in(rkey, i)
        bits = jax.vmap(lambda r, shape=x.shape[1:], lkey=lkey: jax.random.bits(
            jax.random.fold_in(lkey, r), shape, jnp.uint32))(jnp.arange(lo, lo + x.shape[0]))
        new.append(jax.lax.bitcast_convert_type(bits >> 1, jnp.int32))
      return jax.tree.unflatten(tdef, new)

    parts = [part_keys(lo, p) for lo, p in row_offsets(view)]
    out[role] = Blocks(tuple(parts)) if isinstance(view, Blocks) else parts[0]
  return out


def _map_rows(view: PyTree, owners: np.ndarray, values: jax.Array, fn: Callable) -> PyTree:
  """fn(leaf, its rows' `values` shaped to broadcast over it) on every leaf of a view,
  keeping `Blocks` parts. A part's per-row values are taken once, outside the leaves'
  loops (a gather fused into an elementwise loop runs per entry, unvectorized)."""
  def part(lo, p):
    leaves = jax.tree.leaves(p)
    if not leaves:
      return p
    rows = jax.lax.optimization_barrier(values[jnp.asarray(owners[lo:lo + leaves[0].shape[0]])])
    return jax.tree.map(lambda x: fn(x, rows.reshape((-1,) + (1,) * (x.ndim - 1))), p)

  parts = [part(lo, p) for lo, p in row_offsets(view)]
  return Blocks(tuple(parts)) if isinstance(view, Blocks) else parts[0]


def top_rho_mask(deltas: Views, row_client: Mapping[str, Sequence[int]], num_clients: int,
                 rho: float, variant: str = 'top', key: jax.Array | None = None,
                 dtype=jnp.float32) -> Views:
  """Per client, a 0/1 mask of `dtype` (float32, or int32/bool for consumers that
  select or count) shaped like `deltas` (`Blocks` kept) over its whole update: all its rows of all
  roles together, k = ⌊ρ·d_client⌋ (at least 1).

  - `'top'` (FedDEA): |Δ| ≥ the exact k-th largest |Δ|. Ties at the threshold are all
    kept, so at least k entries (more only on ties; spec §6 A4).
  - `'small'` (ablation a): |Δ| ≤ the exact k-th smallest |Δ|; at least k, ties kept.
  - `'random'` (ablation c, needs `key`): a uniformly random subset of k entries, the
    k largest of independent 31-bit random keys; exactly k unless two keys tie at the
    threshold (chance about d / 2^31). Exactly k rather than Bernoulli(ρ) entries keeps
    the count of `'top'`, so only the selection rule changes. Deterministic in `key`.
  ρ = 1 gives all ones. NaN counts as the largest |Δ|.
  """
  if variant not in VARIANTS:
    raise ValueError(f'unknown mask variant {variant!r}; valid choices: '
                     + ', '.join(repr(v) for v in VARIANTS))
  if not 0 < rho <= 1:
    raise ValueError(f'rho={rho} is out of range; valid range: 0 < rho <= 1')
  if variant == 'random' and key is None:
    raise ValueError("mask variant 'random' needs a PRNG key")
  if rho == 1:
    return {r: jax.tree.map(lambda x: jnp.ones(x.shape, dtype), v) for r, v in deltas.items()}
  views = _views(deltas, row_client)
  sizes = client_sizes(deltas, row_client, num_clients)
  k = np.maximum(np.floor(rho * sizes).astype(np.int64), 1)
  # 0/1 int32 by sign bits, not compares (which XLA:CPU does not vectorize in the
  # reductions that consume the mask); keys and thresholds lie in [0, 2^31).
  at_least = lambda b, t: ((t - 1 - b) >> 31) & 1  # b >= t
  if variant == 'random':
    views = _views(_random_keys(deltas, key), row_client)
    keys, keep = (lambda x: x), at_least
  elif variant == 'small':
    k = np.maximum(sizes - k + 1, 1)  # the k-th smallest is the (d - k + 1)-th largest
    keys, keep = _abs_bits, (lambda b, t: ((t - b) >> 31) + 1)  # b <= t
  else:
    keys, keep = _abs_bits, at_least
  thr = _kth_keys(_parts(views, keyed=variant == 'random'), jnp.asarray(k, jnp.int32), sizes)
  return {r: _map_rows(v, own, thr, lambda x, t: keep(keys(x), t).astype(dtype))
          for r, (v, own) in views.items()}


# ----------------------------------------------------------------------------
# Kept sets as bits (FedDEA's logs).
# ----------------------------------------------------------------------------

def _pack(bits: jax.Array) -> jax.Array:
  """[rows, 32·m] 0/1 int32 -> [rows, m] int32 words: entry j·m + c is bit j of word c.
  Integer sums over a major axis of 16 (the reduction XLA:CPU vectorizes; over 32 it
  stops vectorizing and runs 7x slower), one per half row, then the halves joined."""
  rows = bits.shape[0]
  shift = jnp.arange(16, dtype=jnp.int32)[None, :, None]
  half = jnp.sum(bits.reshape(rows * 2, 16, -1) << shift, axis=1)
  half = jax.lax.optimization_barrier(half).reshape(rows, 2, -1)
  return half[:, 0] | (half[:, 1] << 16)


def packed_rows(mask: PyTree) -> list[tuple[int, jax.Array]]:
  """A 0/1 mask view (bool, float, or integer 0/1; stacked rows or `Blocks`) as bits: per part,
  (first row, int32 words [rows, W]), 32 entries a word. Leaves of at least 2^16
  entries per row are packed where they lie (their first multiple of 32 entries);
  the small leaves and the big ones' ends are gathered into one block, padded with
  zeros. The layout depends only on the leaf shapes, so parts of one role line up
  word for word (bit b of word w is the same entry in every row)."""
  out = []
  for lo, part in row_offsets(mask):
    leaves = [x for x in jax.tree.leaves(part) if x.size]
    if not leaves:
      continue
    rows = leaves[0].shape[0]
    words, small = [], []
    for x in leaves:
      flat = x.reshape(rows, -1)
      # Integer masks are taken as 0/1 (a compare here would keep XLA:CPU from
      # vectorizing the packing sum).
      flat = (flat & 1) if jnp.issubdtype(x.dtype, jnp.integer) else (flat != 0).astype(jnp.int32)
      n = flat.shape[1]
      cut = n - n % 32 if n >= _BIG else 0
      if cut:
        words.append(_pack(flat[:, :cut]))
      if cut < n:
        small.append(flat[:, cut:])
    if small:
      n = sum(s.shape[1] for s in small)
      small.append(jnp.zeros((rows, -n % 32), jnp.int32))
      words.append(_pack(jnp.concatenate(small, axis=1)))
    out.append((lo, jnp.concatenate(words, axis=1) if len(words) > 1 else words[0]))
  return out


def popcount_rows(words: jax.Array) -> jax.Array:
  """[rows] set bits per row of int32 words [rows, W]."""
  return jnp.sum(jax.lax.population_count(words), axis=1, dtype=jnp.int32)


def popcount_gram(words: jax.Array) -> jax.Array:
  """[rows, rows] int32 Σ_w popcount(words[i, w] & words[j, w]): the sizes of the
  pairwise intersections of the rows' bit sets (the diagonal: each set's size)."""
  return jnp.sum(jax.lax.population_count(words[:, None, :] & words[None, :, :]), axis=2,
                 dtype=jnp.int32)
