"""Communication accounting: the bytes each client uploads and downloads in a round.

**Upload.** A client sends its rows of the algorithm's shared roles: its encoder
row, the decoder rows of its task slots, its head row where heads are shared
(`Algorithm.roles`), less the leaves the algorithm keeps with every client
(FedBN's batch norms, `Algorithm.local_modules`), at the parameters' own width
(float32: 32 bits a value). The wrappers of `config.algorithm` change what is
sent, outermost first (the order they see the update):

- `dea(...)` (ρ < 1): the k = max(⌊ρ·d⌋, 1) kept values of the client's d
  entries, plus their positions as a d-bit bitmap or 32-bit indices, whichever
  is smaller (ties at the threshold, which keep a few more, are not counted);
- `sparsify(...)`: likewise with its fraction (`compress.sparsify_payload`);
- `quantize(...)`: each value at `bits` bits plus one float32 scale per tensor
  (`compress.quantize_payload`);
- the others (`momentum`, `grouped`, `pcgrad`, `heal`, `dp`) send the update as it is.

**Download.** A client receives its rows of the aggregated shared roles at full
width (a personalised rule sends each client its own rows; a global model's rows
are the same size), uncompressed.

Scalars a rule also exchanges (step counts, losses, FedHCA2's hyper weights stay
on the server) are not counted. The figures come from shapes and hyper-parameters,
so they are exact for every round and cost nothing on device; clients that do not
take part in a round send and receive nothing.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from fedjax_mtl import algorithms
from fedjax_mtl.algorithms import compress
from fedjax_mtl.algorithms.base import role_view
from fedjax_mtl.algorithms.plugin_math import path_names


@dataclasses.dataclass(frozen=True)
class Sizes:
  """Per client (`[N]`): shared entries, their bits each, and tensors (row-leaves)."""
  entries: np.ndarray  # int64, values in the client's shared rows
  value_bits: np.ndarray  # int64, bits of one value (the widest leaf's dtype)
  tensors: np.ndarray  # int64, number of (row, leaf) tensors


def shared_sizes(exp) -> Sizes:
  """`Sizes` of every client's shared rows (the upload before any wrapper)."""
  fed, alg = exp.fed, exp.algorithm
  entries = np.zeros(fed.num_clients, np.int64)
  tensors = np.zeros(fed.num_clients, np.int64)
  bits = np.zeros(fed.num_clients, np.int64)
  groups = exp.init_program.state_shapes.groups
  for gs, lab, spec in zip(groups, exp.labels, fed.groups):
    n_ent = n_ten = width = 0
    for role in alg.shared_roles:
      view = role_view(gs.params, lab, role)
      if view is None:
        continue
      for path, x in jax.tree_util.tree_leaves_with_path(view):
        if path_names(path)[:-1] in alg.local_modules:
          continue
        # Decoder leaves are [clients, slots, ...]: a tensor per slot.
        per_client = int(np.prod(x.shape[1:]))
        n_ent += per_client
        n_ten += x.shape[1] if role == 'decoder' else 1
        width = max(width, np.dtype(x.dtype).itemsize * 8)
    for cid in spec.client_ids:
      entries[cid], tensors[cid], bits[cid] = n_ent, n_ten, width
  return Sizes(entries, bits, tensors)


def upload_bits(sizes: Sizes, algorithm: str, config) -> np.ndarray:
  """[N] bits each client uploads in a round it takes part in (module docstring)."""
  values, value_bits = sizes.entries.astype(np.int64), sizes.value_bits.astype(np.int64)
  positions = scales = np.zeros_like(values)
  for name in algorithms.parse(algorithm)[:-1]:  # wrappers, outermost first
    frac = (algorithms.DEA.of(config).rho if name == 'dea'
            else compress.SPARSIFY.of(config).fraction if name == 'sparsify' else 1)
    if frac < 1:  # k values and their positions
      k = compress.kept_count(values, frac)
      positions = positions + compress.position_bits(values, k)
      values = k
    if name == 'quantize':  # `bits` a value, and a float32 scale per tensor
      scales = scales + compress.SCALE_BITS * sizes.tensors
      value_bits = np.full_like(values, int(compress.QUANTIZE.of(config).bits))
  return values * value_bits + positions + scales


def download_bits(sizes: Sizes) -> np.ndarray:
  """[N] bits each client downloads in a round it takes part in: its shared rows at
  full width."""
  return sizes.entries * sizes.value_bits


def comm_row(rnd: int, up, down) -> dict:
  """The metrics.jsonl 'comm' row of round `rnd` from each client's bytes up and down
  (the engines' accounts and the Flower strategy's real messages alike)."""
  up, down = np.asarray(up, np.int64), np.asarray(down, np.int64)
  return {'round': rnd, 'type': 'comm', 'up_bytes': up.tolist(), 'down_bytes': down.tolist(),
          'up_mb': float(up.sum()) / 1e6, 'down_mb': float(down.sum()) / 1e6}


@dataclasses.dataclass(frozen=True)
class Account:
  """A run's per-round bytes per client (clients in the federation's order)."""
  up: np.ndarray  # [N] bytes a participant uploads
  down: np.ndarray  # [N] bytes a participant downloads

  def row(self, rnd: int, participants: np.ndarray | None = None) -> dict:
    """The round's metrics.jsonl row: bytes per client (0 for clients that sat out)."""
    on = np.ones(len(self.up), bool) if participants is None else np.asarray(participants, bool)
    return comm_row(rnd, np.where(on, self.up, 0), np.where(on, self.down, 0))


def account(exp, config=None) -> Account:
  """The dense run's `Account` (`config`: the run's, default the experiment's)."""
  config = exp.config if config is None else config
  sizes = shared_sizes(exp)
  up = upload_bits(sizes, str(config.algorithm), config)
  return Account(up=-(-up // 8), down=-(-download_bits(sizes) // 8))


def totals(rows: list[dict]) -> dict | None:
  """{'mb_per_round', 'total_mb', 'up_mb', 'down_mb', 'rounds'}: upload + download
  over a run's 'comm' rows (all clients; MB = 10^6 bytes), or None when it has none."""
  comm = [r for r in rows if r.get('type') == 'comm']
  if not comm:
    return None
  up, down = sum(r['up_mb'] for r in comm), sum(r['down_mb'] for r in comm)
  return {'mb_per_round': (up + down) / len(comm), 'total_mb': up + down, 'up_mb': up,
          'down_mb': down, 'rounds': len(comm)}


def summary(t: dict) -> str:
  """One line of `totals` for results.md."""
  return (f"Communication: {t['mb_per_round']:.3f} MB a round over all clients "
          f"(upload {t['up_mb'] / t['rounds']:.3f}, download {t['down_mb'] / t['rounds']:.3f}), "
          f"{t['total_mb']:.2f} MB in {t['rounds']} rounds.")


def cumulative_mb(rows: list[dict]) -> dict[int, float]:
  """Round -> megabytes sent and received up to and including that round."""
  out, total = {}, 0.0
  for r in sorted((r for r in rows if r.get('type') == 'comm'), key=lambda r: r['round']):
    total += r['up_mb'] + r['down_mb']
    out[r['round']] = total
  return out
