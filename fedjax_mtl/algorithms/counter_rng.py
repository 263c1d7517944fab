"""Counter-based random numbers for per-entry randomness at model scale.

Stochastic rounding (`compress.quantize`) and the Gaussian mechanism (`dp.dp`) draw
one number per parameter entry of every client: 170 M a round for six Swin-T
clients. `jax.random` (threefry) takes ~2 s for that on a 2-core CPU, seven times
FedAvg's whole aggregation; here each number is one integer hash of its entry's
global index (row · row size + position, so a row's numbers do not depend on how
the rows are split into `Blocks`), ~10 integer operations that fuse into the
elementwise pass that uses them (`scripts/bench.py --only=wrappers`).

The hash is MurmurHash3's 32-bit finaliser of (index · golden ratio) XOR a key
derived from (seed, round, tags) by the same finaliser: a bijection of the index for
each key, with the finaliser's full avalanche. It is a simulation-grade generator,
as a federated-learning simulator needs (uniformity and independence across
entries, rounds and seeds: `tests/test_compress.py`, `tests/test_dp.py` check the
moments they rely on); it is not a cryptographic generator, and a deployed DP
mechanism should draw its noise from one.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

_GOLDEN = 0x9E3779B9


def fmix32(h: jax.Array) -> jax.Array:
  """MurmurHash3's 32-bit finaliser (a bijection with full avalanche), uint32."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def key(*words) -> jax.Array:
  """A uint32 key from integers (Python or traced scalars: seed, round, tags), each
  folded in by the finaliser."""
  k = jnp.uint32(0x3C6EF372)
  for w in words:
    k = fmix32(k ^ (jnp.asarray(w).astype(jnp.uint32) * jnp.uint32(_GOLDEN)))
  return k


def bits(k: jax.Array, lo: int, shape: tuple[int, ...]) -> jax.Array:
  """uint32 hashes of the entries of rows lo.. (a [rows, ...] part whose first row is
  global row `lo`), one per entry, from key `k`."""
  per_row = math.prod(shape[1:])
  idx = jax.lax.iota(jnp.uint32, math.prod(shape)).reshape(shape) + jnp.uint32(lo * per_row)
  return fmix32((idx * jnp.uint32(_GOLDEN)) ^ k)


def uniform(k: jax.Array, lo: int, shape: tuple[int, ...]) -> jax.Array:
  """float32 uniforms in [0, 1) on a 2^-24 grid (`bits`' top 24 bits)."""
  return (bits(k, lo, shape) >> 8).astype(jnp.float32) * (1.0 / (1 << 24))


def normal(k: jax.Array, lo: int, shape: tuple[int, ...]) -> jax.Array:
  """float32 standard normals, √2·erfinv(2u − 1) of uniforms u in (0, 1) (the grid's
  midpoints: never 0 or 1), as `jax.random.normal` forms them."""
  u = ((bits(k, lo, shape) >> 8).astype(jnp.float32) + 0.5) * (2.0 / (1 << 24)) - 1.0
  return jnp.float32(math.sqrt(2.0)) * jax.lax.erf_inv(u)
