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
  leaves = row_leaves(local)
  if not leaves:
    raise ValueError("gram: empty pytree")
  prevs = [None] * len(leaves) if prev is None else row_leaves(prev)
  probes = [None] * len(leaves) if probe is None else _leaves(probe)
  g = sum(_leaf_gram(x, y, v, mix) for x, y, v in zip(leaves, prevs, probes, strict=True))
  r = segment_rows(leaves[0]) if mix is None else mix.shape[0]
  return g[:r, :r], (None if probe is None else g[r, :r])


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
