"""What travels in Flower messages: pytrees as `ArrayRecord`s, one client's rows of
the stacked role views, and the config fields two parties compare.

A client's rows of a role's stacked view (`experiment.views`: encoders and heads
one row per client, decoders one row per task decoder) are the same rows the
engine gathers from its client group: `client_piece` cuts them out of a one-client
group tree, `row_slice` finds them in the stacked view.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import numpy as np
from flwr.app import Array, ArrayRecord

from fedjax_mtl import workdir
from fedjax_mtl.federation import Federation

PyTree = Any

# Fields that may differ between the server and a client: where each keeps its data
# and caches, and how many devices each trains on (one client's rows train alike on
# any number of devices); in the many-task setting also how the engine would feed
# the training set (a Flower client gathers its own samples).
LOCAL_FIELDS = ('num_devices', 'data.data_dir', 'data.cache_dir', 'data.workers',
                'data.threads', 'progress', 'tensorboard', 'many.data_dir', 'many.cache_dir',
                'many.feed')


def to_record(tree: PyTree) -> ArrayRecord:
  """`tree`'s leaves as an `ArrayRecord`, keyed by their paths."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return ArrayRecord(array_dict={jax.tree_util.keystr(p): Array(np.asarray(x))
                                 for p, x in leaves})


def from_record(record: ArrayRecord, like: PyTree) -> PyTree:
  """`to_record`'s inverse: the tree of `like`'s structure and dtypes, leaves read
  from `record`. KeyError naming the first missing path."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(like)
  out = []
  for p, x in leaves:
    key = jax.tree_util.keystr(p)
    if key not in record:
      raise KeyError(f'the message has no array {key!r}')
    value = record[key].numpy()
    if value.shape != tuple(np.shape(x)):
      raise ValueError(f'array {key!r} has shape {value.shape}, expected {np.shape(x)}')
    out.append(value.astype(np.dtype(x.dtype)))
  return jax.tree_util.tree_unflatten(treedef, out)


def row_slice(fed: Federation, role: str, client: int) -> slice:
  """Rows of `client` in `role`'s stacked view (its decoders: consecutive rows)."""
  if role != 'decoder':
    return slice(client, client + 1)
  rows = [k for k, c in enumerate(fed.decoder_client) if c == client]
  return slice(rows[0], rows[-1] + 1)


def client_piece(tree: PyTree, role: str) -> PyTree:
  """A one-client group tree of `role` (leading axis 1; decoders `[1, slots, ...]`)
  as its rows of the stacked view."""
  if role != 'decoder':
    return tree
  return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), tree)


def group_piece(rows: PyTree, role: str) -> PyTree:
  """`client_piece`'s inverse."""
  if role != 'decoder':
    return rows
  return jax.tree.map(lambda x: x.reshape((1,) + x.shape), rows)


def shared_fields(config) -> str:
  """The config fields server and clients must agree on, as JSON (what the server
  sends at the handshake): every run field except `LOCAL_FIELDS`."""
  flat = workdir.flat_fields(workdir.run_fields(config))
  keep = {k: v for k, v in flat.items()
          if not any(k == f or k.startswith(f + '.') for f in LOCAL_FIELDS)}
  return json.dumps(keep, sort_keys=True)


def differing_fields(config, server_fields: str) -> list[str]:
  """Dotted config fields in which `config` differs from the server's
  (`shared_fields`), sorted; [] when they agree."""
  mine, theirs = json.loads(shared_fields(config)), json.loads(server_fields)
  return sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
  """Integer codes in 0..2^bits − 1 as a bit stream, `bits` bits each (uint8 bytes,
  most significant bit first; the last byte zero-padded)."""
  flat = np.asarray(codes).reshape(-1).astype(np.uint32)
  if bits == 8:
    return flat.astype(np.uint8)
  planes = (flat[:, None] >> np.arange(bits - 1, -1, -1, dtype=np.uint32)) & 1
  return np.packbits(planes.astype(np.uint8).reshape(-1))


def unpack_codes(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
  """`pack_codes`' inverse: `count` codes (uint32)."""
  if bits == 8:
    return np.asarray(packed[:count], np.uint32)
  planes = np.unpackbits(np.asarray(packed, np.uint8))[:count * bits].reshape(count, bits)
  return planes.astype(np.uint32) @ (1 << np.arange(bits - 1, -1, -1, dtype=np.uint32))


def quantized_record(codes: dict[str, list], scales: dict[str, list], bits: int) -> ArrayRecord:
  """A client's quantised upload (role -> its leaves' codes [rows, d] and scales
  [rows, 1]) as the arrays it sends: per leaf the packed codes and the float32 scales."""
  out = {}
  for role in codes:
    for i, (c, sc) in enumerate(zip(codes[role], scales[role])):
      out[f'{role}/{i}/codes'] = Array(pack_codes(np.asarray(c), bits))
      out[f'{role}/{i}/scales'] = Array(np.asarray(sc, np.float32).reshape(-1))
  return ArrayRecord(array_dict=out)


def read_quantized(record: ArrayRecord, like: dict[str, PyTree],
                   bits: int) -> tuple[dict[str, list], dict[str, list]]:
  """`quantized_record`'s codes and scales (role -> per leaf [rows, d], [rows, 1]),
  shaped by `like` (role -> the client's rows)."""
  codes, scales = {}, {}
  for role, tree in like.items():
    codes[role], scales[role] = [], []
    for i, x in enumerate(jax.tree.leaves(tree)):
      rows, count = x.shape[0], int(np.prod(x.shape))
      for kind in ('codes', 'scales'):
        if f'{role}/{i}/{kind}' not in record:
          raise KeyError(f'the message has no array {role}/{i}/{kind!r}')
      codes[role].append(unpack_codes(record[f'{role}/{i}/codes'].numpy(), bits, count)
                         .reshape(rows, -1))
      scales[role].append(record[f'{role}/{i}/scales'].numpy().reshape(rows, 1))
  return codes, scales


def sparse_record(sent: dict[str, list]) -> ArrayRecord:
  """A client's top-k upload (role -> its leaves' sparse(u), [rows, ...] float32 with
  zeros off the mask) as the arrays it sends: per leaf the kept values (float32) and
  their positions, as a bitmap (one bit per entry) or as int32 indices, whichever is
  smaller over the client's whole update (`compress.position_bits`). An entry kept
  at the value 0 is not told apart from one not kept; either way the server adds 0."""
  flats = {r: [np.asarray(x, np.float32).reshape(-1) for x in leaves]
           for r, leaves in sent.items()}
  d = sum(f.size for fs in flats.values() for f in fs)
  k = sum(int(np.count_nonzero(f)) for fs in flats.values() for f in fs)
  bitmap = d <= 32 * k
  out = {}
  for role, fs in flats.items():
    for i, f in enumerate(fs):
      on = f != 0
      out[f'{role}/{i}/values'] = Array(f[on])
      out[f'{role}/{i}/' + ('bitmap' if bitmap else 'indices')] = Array(
          np.packbits(on) if bitmap else np.flatnonzero(on).astype(np.int32))
  return ArrayRecord(array_dict=out)


def read_sparse(record: ArrayRecord, like: dict[str, PyTree]) -> dict[str, PyTree]:
  """`sparse_record`'s dense sparse(u) (float32, shaped by `like`: role -> the
  client's rows)."""
  out = {}
  for role, tree in like.items():
    leaves, tdef = jax.tree.flatten(tree)
    dense = []
    for i, x in enumerate(leaves):
      name = f'{role}/{i}'
      if f'{name}/values' not in record:
        raise KeyError(f'the message has no array {name}/values')
      flat = np.zeros(int(np.prod(x.shape)), np.float32)
      if f'{name}/bitmap' in record:
        at = np.flatnonzero(np.unpackbits(record[f'{name}/bitmap'].numpy())[:flat.size])
      elif f'{name}/indices' in record:
        at = record[f'{name}/indices'].numpy()
      else:
        raise KeyError(f'the message has no positions for {name} (bitmap or indices)')
      flat[at] = record[f'{name}/values'].numpy()
      dense.append(flat.reshape(x.shape))
    out[role] = jax.tree.unflatten(tdef, dense)
  return out


def sent_server_rows(rows: dict, encoding: str | None) -> dict:
  """The per-row server state a client receives: every row's, except, when clients
  sparsify their own updates (`compress.encoding` 'sparsify'), the residual rows of
  the `sparsify` wrapper's state ({'inner', 'residual'} per role), which the clients
  keep themselves (the server's stay 0)."""
  if encoding != 'sparsify':
    return rows
  return {r: {'inner': v['inner']} for r, v in rows.items()}
