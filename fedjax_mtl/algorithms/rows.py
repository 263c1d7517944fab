"""Rows of stacked pytrees: the `Blocks` view, stacking, and the chunked Gram pass.

Aggregation rules see a role's parameters as rows (one per client or decoder):
a stacked tree `[rows, ...]`, or `Blocks` that leave each client group's rows in
the group's own arrays. This module depends on JAX alone, so every rule, the
engine and the Flower server can share it.

The Gram pass (`delta_gram`, `deviation_gram`, `gram`) reads each leaf once, in
cache-sized column chunks, and never forms a row difference, a row mix or the
stacked rows at full size.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any


class Blocks(NamedTuple):
  """A role's rows left in the client groups' own arrays: `parts[g]` holds the
  rows of group g (leading axis), in stacked-row order, so `stack(blocks)` is
  the `[rows, ...]` view. A pytree: an elementwise `jax.tree.map` over views of
  one structure works on it as on stacked rows, without the concatenated copy
  (at Swin-T scale, 110 MB per client and view)."""
  parts: tuple


def stack(view: PyTree) -> PyTree:
  """The `[rows, ...]` tree of a `Blocks` view (other views pass through)."""
  if not isinstance(view, Blocks):
    return view
  if len(view.parts) == 1:
    return view.parts[0]
  return jax.tree.map(lambda *xs: jnp.concatenate(xs, 0), *view.parts)


def block_rows(view: Blocks) -> tuple[int, ...]:
  """Rows in each part of a `Blocks` view."""
  return tuple(num_rows(p) if jax.tree.leaves(p) else 0 for p in view.parts)


def unstack(stacked: PyTree, sizes: tuple[int, ...]) -> Blocks:
  """`[rows, ...]` rows split into `Blocks` of `sizes` rows (the inverse of `stack`)."""
  if len(sizes) == 1:
    return Blocks((stacked,))
  bounds = [0]
  for n in sizes:
    bounds.append(bounds[-1] + n)
  return Blocks(tuple(jax.tree.map(lambda x, lo=lo, hi=hi: x[lo:hi], stacked)
                      for lo, hi in zip(bounds[:-1], bounds[1:])))


def row_offsets(view: PyTree) -> list[tuple[int, PyTree]]:
  """`(first row, part)` of every part of a view (one part for a stacked tree)."""
  if not isinstance(view, Blocks):
    return [(0, view)]
  out, lo = [], 0
  for p, n in zip(view.parts, block_rows(view)):
    out.append((lo, p))
    lo += n
  return out


def where_rows(on: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
  """`a` on the rows where `on` ([rows] bool) holds, `b` (in `a`'s dtype) elsewhere."""
  return jnp.where(on.reshape((-1,) + (1,) * (a.ndim - 1)), a, b.astype(a.dtype))


def keep_rows(new: PyTree, old: PyTree, on: jax.Array) -> PyTree:
  """`new` on the rows where `on` ([rows] bool over all rows) holds, `old` elsewhere;
  stacked trees or `Blocks` of one structure (each part reads its slice of `on`)."""
  parts = [jax.tree.map(lambda a, b, lo=lo: where_rows(on[lo:lo + a.shape[0]], a, b), n, o)
           for (lo, n), (_, o) in zip(row_offsets(new), row_offsets(old))]
  return Blocks(tuple(parts)) if isinstance(new, Blocks) else parts[0]


def num_rows(stacked: PyTree) -> int:
  """The (static) leading axis every leaf of a stacked pytree shares."""
  leaves = jax.tree.leaves(stacked)
  if not leaves:
    raise ValueError('empty stacked pytree')
  sizes = {jnp.shape(x)[0] if jnp.ndim(x) else None for x in leaves}
  if len(sizes) != 1 or None in sizes:
    raise ValueError(f'leaves must share a leading rows axis, got sizes {sizes}')
  return sizes.pop()


def _leaves(tree: PyTree) -> list[jax.Array]:
  return jax.tree_util.tree_leaves(tree)


def row_leaves(tree: PyTree) -> list[list[jax.Array]]:
  """Per leaf, the arrays holding its rows in order: one for a stacked tree, one per
  part for `Blocks` (the client groups' own arrays, never concatenated)."""
  if isinstance(tree, Blocks):
    return [list(seg) for seg in zip(*[_leaves(p) for p in tree.parts], strict=True)]
  return [[x] for x in _leaves(tree)]


def segment_rows(segs: list[jax.Array]) -> int:
  """Rows of a leaf held in `segs` (one entry of `row_leaves`)."""
  return sum(x.shape[0] for x in segs)


def _flat(x: jax.Array) -> jax.Array:
  """[N, ...] -> [N, d] in float32 (a reshape, not a copy, for float32 input)."""
  return jnp.reshape(x, (x.shape[0], -1)).astype(jnp.float32)


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
  return jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST)


# Columns per step of the chunked Gram loop. Large enough that XLA:CPU splits
# each step's elementwise work over the threads, small enough for the stacked
# rows of one step to stay in the last-level cache.
GRAM_CHUNK = 131072
GRAM_CHUNK_SMALL = 8192


def _leaf_gram(
    local: list[jax.Array], prev: list[jax.Array] | None, probe: jax.Array | None,
    mix: jax.Array | None
) -> jax.Array:
  """Gram matrix of the rows [mix @ (local - prev); probe] of one leaf, [R, R].

  `local` and `prev` are the leaf's row segments (`row_leaves`). The leaf is
  read once, in column chunks: each step forms the rows of one chunk (the
  segments' slices stacked, cache-sized) and contracts them with themselves,
  and the partial Grams are summed. Neither the difference nor the row mix nor
  the stacked rows are materialised at full size (XLA:CPU cannot fuse them
  into a dot; a leaf-sized temporary would cost an extra write and read of the
  leaf, and fresh pages on every call).
  """
  xs = [_flat(x) for x in local]
  ys = None if prev is None else [_flat(y) for y in prev]
  v = None if probe is None else jnp.reshape(probe, (1, -1)).astype(jnp.float32)
  d = xs[0].shape[1]
  r = segment_rows(xs) if mix is None else mix.shape[0]

  def gram_of(start: Any, size: int) -> jax.Array:
    take = lambda a: jax.lax.dynamic_slice_in_dim(a, start, size, axis=1)
    segs = [take(x) if ys is None else take(x) - take(y)
            for x, y in zip(xs, ys or [None] * len(xs))]
    rows = segs[0] if len(segs) == 1 else jnp.concatenate(segs, axis=0)
    if mix is not None:
      rows = _dot(mix, rows)
    if v is not None:
      rows = jnp.concatenate([rows, take(v)], axis=0)
    return _row_products(rows)

  # Mid-sized leaves also loop, over smaller chunks: leaf-sized temporaries
  # would add up, as XLA keeps many of them alive at once.
  chunk, steps = chunking(d, GRAM_CHUNK if d >= 2 * GRAM_CHUNK else GRAM_CHUNK_SMALL)
  if steps < 2:
    return gram_of(0, d)
  acc = jax.lax.fori_loop(
      0, steps, lambda i, a: a + gram_of(i * chunk, chunk),
      jnp.zeros((r + (v is not None),) * 2, jnp.float32))
  tail = d - steps * chunk
  return acc + gram_of(steps * chunk, tail) if tail else acc


# Up to this many rows the Gram matrix of a chunk is taken as R(R+1)/2 separate
# row-pair reductions: XLA:CPU compiles each into a vectorised loop over the
# cache-resident chunk, where its matmul of a [R, c] by [c, R] operand (tiny R,
# huge contraction) runs at a fraction of that rate; on a 2-core machine the
# Gram pass of the Swin-T-scale benchmark took 0.21 s this way against 0.34-0.50 s
# as one dot (read floor 0.15 s). Beyond it the pair count grows quadratically.
_PAIRWISE_MAX_ROWS = 16


def _row_products(rows: jax.Array) -> jax.Array:
  """rows @ rows.T, [R, R], in float32."""
  r = rows.shape[0]
  if r > _PAIRWISE_MAX_ROWS or rows.shape[1] < 1024:
    return _dot(rows, rows.T)
  iu = np.triu_indices(r)
  upper = jnp.stack([jnp.sum(rows[i] * rows[j]) for i, j in zip(*iu)])
  g = jnp.zeros((r, r), jnp.float32).at[iu].set(upper)
  return g + jnp.triu(g, 1).T


def chunking(d: int, target: int) -> tuple[int, int]:
  """(chunk, steps) covering d columns: an exact split into chunks of target/2..target
  columns when one exists (no tail), else `target`-sized chunks plus a tail."""
  lo = max(1, -(-d // target))
  for steps in range(lo, 2 * lo + 1):
    if d % steps == 0:
      return d // steps, steps
  return target, d // target


# Leaves of fewer columns than PACK_MAX_COLUMNS are packed side by side (one
# float32 copy of them, per row segment) before the Gram pass, so that the pass
# is a few chunked loops instead of one reduction chain per leaf: the compiled
# program of a rule over a Swin encoder otherwise grows with its ~100-200 leaves
# (biases, norms, small tables), most of the rule's compile time. The next
# smallest leaves (under PACK_WIDE_COLUMNS) join them while the packed operand
# stays within PACK_BUDGET_COLUMNS: at a small model that is nearly every leaf,
# at Swin-T a few stage-1 tables. Larger leaves are read in place: packing every
# leaf under 65,536 columns copied Swin-T's stage 1-2 projections and made the
# 1c aggregation 1.4x slower per round (BENCHMARKS.md).
PACK_MAX_COLUMNS = 4096
PACK_WIDE_COLUMNS = 65536
PACK_BUDGET_COLUMNS = 1 << 18


def packed_indices(cols: list[int]) -> list[int]:
  """The leaves (indices into `cols`, their column counts, in order) that are packed:
  every one under `PACK_MAX_COLUMNS`, then the smallest under `PACK_WIDE_COLUMNS`
  while the packed columns stay within `PACK_BUDGET_COLUMNS`."""
  small = [i for i, d in enumerate(cols) if d < PACK_MAX_COLUMNS]
  total = sum(cols[i] for i in small)
  for i in sorted((i for i, d in enumerate(cols) if PACK_MAX_COLUMNS <= d < PACK_WIDE_COLUMNS),
                  key=lambda i: (cols[i], i)):
    if total + cols[i] > PACK_BUDGET_COLUMNS:
      break
    small.append(i)
    total += cols[i]
  return sorted(small)


class Packed(NamedTuple):
  """Gram operands of a tree's leaves (`pack_small`): `ops[k]` = (local segments,
  prev segments or None, probe or None); `leaves[k]` = the leaf indices it holds,
  side by side along the columns when more than one."""
  ops: list
  leaves: list


def pack_small(leaves: list[list[jax.Array]], prevs: list, probes: list) -> Packed:
  """The Gram operands of `row_leaves` lists `leaves`/`prevs` (entries None when
  there is no prev) and `probes` (arrays or Nones): the leaves `packed_indices`
  chooses flattened to float32 and concatenated along their columns into one
  operand, in leaf order; every other leaf on its own (read in place)."""
  cols = [int(np.prod(x[0].shape[1:], dtype=np.int64)) for x in leaves]
  small = packed_indices(cols)
  if len(small) < 2:
    return Packed([(leaves[i], prevs[i], probes[i]) for i in range(len(leaves))],
                  [[i] for i in range(len(leaves))])
  chosen = set(small)
  big = [i for i in range(len(leaves)) if i not in chosen]

  def cat(arrays):
    return jnp.concatenate([_flat(a) for a in arrays], axis=1)

  nseg = len(leaves[small[0]])
  xs = [cat([leaves[i][j] for i in small]) for j in range(nseg)]
  ys = None if prevs[small[0]] is None else [cat([prevs[i][j] for i in small])
                                             for j in range(nseg)]
  v = (None if probes[small[0]] is None else
       jnp.concatenate([jnp.reshape(probes[i], (-1,)).astype(jnp.float32) for i in small]))
  return Packed([(xs, ys, v)] + [(leaves[i], prevs[i], probes[i]) for i in big],
                [small] + [[i] for i in big])


def unpack(packed: Packed, outs: list[jax.Array], like: list[jax.Array]) -> list[jax.Array]:
  """Per-leaf arrays from one output per operand: a one-leaf operand's output is
  the leaf's own; a packed operand's has the packed columns last (e.g. [d] or
  [R, d]) and is split into its leaves, shaped like `like[i]` without the rows
  axis."""
  res = [None] * len(like)
  for out, idx in zip(outs, packed.leaves):
    if len(idx) == 1:
      res[idx[0]] = out
      continue
    lo = 0
    for i in idx:
      d = int(np.prod(like[i].shape[1:], dtype=np.int64))
      res[i] = out[..., lo:lo + d].reshape(out.shape[:-1] + like[i].shape[1:])
      lo += d
  return res


def pack(local: PyTree, prev: PyTree | None = None, probe: PyTree | None = None) -> Packed:
  """`pack_small` of stacked trees or `Blocks` `local`/`prev` and one client's `probe`."""
  leaves = row_leaves(local)
  if not leaves:
    raise ValueError("gram: empty pytree")
  prevs = [None] * len(leaves) if prev is None else row_leaves(prev)
  probes = [None] * len(leaves) if probe is None else _leaves(probe)
  return pack_small(leaves, prevs, probes)


def packed_gram(packed: Packed, mix: jax.Array | None = None
                ) -> tuple[jax.Array, jax.Array | None]:
  """`delta_gram` of packed operands: the Gram matrix of their rows (or of mix @ rows)
  and the probe's inner products (None without a probe), summed over the operands."""
  g = sum(_leaf_gram(x, y, v, mix) for x, y, v in packed.ops)
  local, _, probe = packed.ops[0]
  r = segment_rows(local) if mix is None else mix.shape[0]
  return g[:r, :r], (None if probe is None else g[r, :r])


def delta_gram(
    local: PyTree,
    prev: PyTree | None = None,
    probe: PyTree | None = None,
    mix: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array | None]:
  """Gram matrix of the flattened updates Δ = local - prev (Δ = local if `prev` is None).

  Returns the [N, N] Gram matrix of the rows of Δ, or with `mix` [R, N] the
  [R, R] Gram matrix of the rows mix @ Δ (e.g. mix = wᵀ gives ‖Σ_i w_i Δ_i‖²
  without cancellation). With `probe` (one client's structure) also returns the
  inner products <probe, row> [R] (else None), from the same single read pass
  over `local` and `prev`. Accumulated leaf by leaf.
  """
  return packed_gram(pack(local, prev, probe), mix)


def deviation_gram(stacked: PyTree, valid: jax.Array | None = None) -> jax.Array:
  """Gram matrix [N, N] of the flattened rows' deviations from their mean, in one
  chunked read pass (the deviations are formed per cache-sized chunk, never at full
  size); exactly symmetric. With `valid` [N] bool the mean is over the valid rows
  (entries of invalid rows are then meaningless); row 0 must be valid."""
  n = num_rows(stacked)
  # Δ = w - w_0 first (exact for close rows, Sterbenz), then the centring matrix
  # C = I - 11ᵀ/N as the row mix: C(w - 1w_0ᵀ) = Cw, with rounding that scales
  # with the deviations, not with |w|. The broadcast row is fused into the pass.
  row0 = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x[:1], x.shape), stacked)
  if valid is None:
    centre = jnp.eye(n, dtype=jnp.float32) - 1.0 / n
  else:
    v = jnp.asarray(valid, jnp.float32)
    centre = jnp.eye(n, dtype=jnp.float32) - v[None, :] / jnp.maximum(jnp.sum(v), 1.)
  g = delta_gram(stacked, row0, mix=centre)[0]
  return 0.5 * (g + g.T)


def gram(deltas: PyTree) -> jax.Array:
  """Gram matrix [N, N] of the flattened per-client updates, accumulated per leaf."""
  return delta_gram(deltas)[0]
