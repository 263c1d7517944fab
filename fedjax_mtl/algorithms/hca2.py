"""FedHCA2: hyper conflict-averse encoders, hyper cross-attention decoders, learned α/β.

Per round (spec fedhca2.md §3.5, released-code order):
  1. Δθ = local - previous personalised params, for the N encoders and K decoders;
  2. from the second round on, one SGD step on α [N] and β [K, L] with the
     closed-form hypergradients g_α_i = -<Ũ^(r-1), Δθ_i^E>, g_β_{k,l} =
     -Σ_{p∈l} <Ã^(r-1)_{k,p}, Δθ_{k,p}> (zero where the raw weight is outside [0, 1]);
  3. encoders: Ũ = conflict_averse(Δθ^E); θ_i ← θ_i + Δθ_i (homo-averaged) + clamp(α_i)·Ũ;
  4. decoders: Ã = cross_attention(Δθ^D) per tensor; θ_k ← θ_k + Δθ_k + clamp(β_{k,l})·Ã_k.
Ũ, Ã, α, β and the two SGD states are the rule's state (checkpointed).

Partial participation (`ServerInputs.row_valid`, `participation.py`): the round's
participants are the federation. Ũ is the conflict-averse update of their encoder
updates alone (gathered into `FedInfo.num_participants` rows), Ã attends over their
decoders only, α_i and β_k (and their SGD state) step only for participants, homo
averaging means over a run's participants, and the rows of the clients that sat the
round out keep their parameters and their Ã^(r-1).

Ablations (config.hca2): `encoder_agg` in {conflict_averse, fedavg, none},
`decoder_agg` in {cross_attention, fedavg, none}, `ca_c`, `ca_rescale`, `homo`,
`alpha_init`, `beta_init`, `hyper_lr`, `hyper_momentum`, `hyper_weight_decay`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from fedjax_mtl import fields
from fedjax_mtl.algorithms import hca2_math as hm
from fedjax_mtl.algorithms import rules
from fedjax_mtl.algorithms.base import (Algorithm, Blocks, Client, FedInfo, Server,
                                        ServerInputs, ServerState, keep_rows, num_rows,
                                        row_offsets, tree_sub)
from fedjax_mtl.errors import ConfigError

PyTree = Any
ENCODER_RULES = ('conflict_averse', 'fedavg', 'none')
DECODER_RULES = ('cross_attention', 'fedavg', 'none')


def conflict_averse(deltas: PyTree, c: float = 0.4, rescale: bool = True) -> PyTree:
  """Hyper conflict-averse update Ũ from stacked client updates `[N, ...]`.

  Solves the CAGrad dual min_w w·A·1/N + √φ·sqrt(w·A·w) over the simplex on the
  Gram matrix A of the flattened updates (built leaf by leaf), then returns
  Ũ = Δ̄ + √φ/‖U_w‖ · U_w with √φ = c‖Δ̄‖, divided by 1 + c² when `rescale`
  (the released code's default). Returns one unstacked pytree (a client's shape).
  """
  return hm.conflict_averse(deltas, c=c, rescale=rescale)


def cross_attention(deltas: PyTree) -> PyTree:
  """Hyper cross-attention Ã from stacked decoder updates `[K, ...]`.

  Per leaf (parameter tensor) with rows V = flattened updates:
  Ã = softmax(V Vᵀ / √d) V, d = the tensor's size, self included, no
  projections. Returns a stacked pytree with the input's structure.
  """
  return hm.cross_attention(deltas)


# FedHCA2 knobs (released-code defaults).
CONFIG = fields.Block('hca2', {
    'encoder_agg': fields.Field('conflict_averse', 'FedHCA2 encoder aggregation (ablation: '
                                'fedavg, none)', choices=ENCODER_RULES),
    'decoder_agg': fields.Field('cross_attention', 'FedHCA2 decoder aggregation (ablation: '
                                'fedavg, none)', choices=DECODER_RULES),
    'ca_c': fields.Field(0.4, 'FedHCA2 conflict-averse radius c', fields.unit(), traced=True),
    'ca_rescale': fields.Field(True, 'FedHCA2: divide the conflict-averse update by 1 + c² '
                               '(released code)'),
    'homo': fields.Field(True, 'FedHCA2: average the updates of consecutive same-task clients '
                         '(released code)'),
    'alpha_init': fields.Field(0.1, 'FedHCA2: initial encoder weight α of every client',
                               fields.unit(True), traced=True),
    'beta_init': fields.Field(0.1, 'FedHCA2: initial decoder weight β of every decoder layer',
                              fields.unit(True), traced=True),
    'hyper_lr': fields.Field(1e-2, 'FedHCA2: learning rate of α and β', fields.at_least(0),
                             traced=True),
    'hyper_momentum': fields.Field(0.9, 'FedHCA2: SGD momentum of α and β', fields.unit(),
                                   traced=True),
    'hyper_weight_decay': fields.Field(1e-4, 'FedHCA2: weight decay of α and β',
                                       fields.at_least(0), traced=True),
})


def _traced(cfg, name: str):
  """`hca2.<name>`: the replica's value in a sweep (`fields.traced_value`), else the config's."""
  return fields.traced_value(f'hca2.{name}', cfg[name])


def default_config() -> ml_collections.ConfigDict:
  return CONFIG.config()


def layer_of_leaf(decoders: PyTree, layers: tuple[str, ...]) -> PyTree:
  """Index into `layers` of every decoder leaf (the layer module on its path)."""
  def idx(path, _):
    names = [k.key for k in path if hasattr(k, 'key')]
    hit = [n for n in names if n in layers]
    if not hit:
      raise ConfigError(f'decoder leaf {jax.tree_util.keystr(path)} is in none of the '
                        f'decoder layers {layers}')
    return layers.index(hit[0])
  return jax.tree_util.tree_map_with_path(idx, decoders)


def _add_scaled(base: PyTree, weight: PyTree, agg: PyTree) -> PyTree:
  """base + clamp(weight, 0, 1) * agg per stacked row (agg stacked or shared)."""
  def one(b, w, g):
    w = jnp.clip(w, 0., 1.).reshape(w.shape + (1,) * (b.ndim - 1))
    g = g if g.ndim == b.ndim else g[None]
    return (b.astype(jnp.float32) + w * g.astype(jnp.float32)).astype(b.dtype)
  return jax.tree.map(one, base, weight, agg)


def _runs(ids) -> list[tuple[int, int]]:
  """[start, stop) of the runs of equal consecutive ids."""
  bounds = [0] + [i for i in range(1, len(ids)) if ids[i] != ids[i - 1]] + [len(ids)]
  return list(zip(bounds[:-1], bounds[1:]))


def personalize_encoders(prev: PyTree, local: PyTree, alpha: jax.Array, u: PyTree,
                         homo_ids: tuple[int, ...] | None = None,
                         valid: jax.Array | None = None) -> PyTree:
  """θ_i ← θ_i + Δθ_i + clamp(α_i)·Ũ per encoder row, written part by part.

  `prev`/`local` are stacked or `Blocks` (the output has the same form). With
  `homo_ids`, the rows of each run of two or more consecutive same-task clients
  take the run's mean update, θ_prev + mean(Δθ) (released homo aggregation);
  the mean is one elementwise pass over the run's rows (no Δθ is stored), and
  a row outside such runs is its upload exactly, so α = 0 gives Local bitwise.
  """
  parts_p, parts_l = row_offsets(prev), row_offsets(local)
  bounds = [lo for lo, _ in parts_l] + [parts_l[-1][0] + num_rows(parts_l[-1][1])]
  runs = [r for r in (_runs(homo_ids) if homo_ids is not None else []) if r[1] - r[0] > 1]
  flat_p = [jax.tree.leaves(t) for _, t in parts_p]
  flat_l = [jax.tree.leaves(t) for _, t in parts_l]

  def row(flat, leaf, i):
    j = next(j for j in range(len(bounds) - 1) if bounds[j] <= i < bounds[j + 1])
    return flat[j][leaf][i - bounds[j]]

  def base(j, leaf):
    """The part's rows of θ_prev + Δθ (homo-averaged within runs)."""
    pp, ll = flat_p[j][leaf], flat_l[j][leaf]
    lo, hi = bounds[j], bounds[j + 1]
    inside = [(max(a, lo), min(b, hi), a, b) for a, b in runs if a < hi and b > lo]
    if not inside:
      return ll
    pieces, at = [], lo
    for s0, s1, a, b in inside:
      if s0 > at:
        pieces.append(ll[at - lo:s0 - lo])
      # Over the run's participants (`valid`): the others' updates are zero.
      share = (1.0 / (b - a) if valid is None
               else 1.0 / jnp.maximum(jnp.sum(valid[a:b]).astype(jnp.float32), 1.))
      mean = sum(row(flat_l, leaf, i).astype(jnp.float32) - row(flat_p, leaf, i).astype(
          jnp.float32) for i in range(a, b)) * share
      pieces.append((pp[s0 - lo:s1 - lo].astype(jnp.float32) + mean[None]).astype(pp.dtype))
      at = s1
    if at < hi:
      pieces.append(ll[at - lo:])
    return jnp.concatenate(pieces, 0)

  out = []
  for j, (lo, t) in enumerate(parts_l):
    b = jax.tree.unflatten(jax.tree.structure(t), [base(j, k) for k in range(len(flat_l[j]))])
    out.append(_add_scaled(b, jax.tree.map(lambda _: alpha[lo:bounds[j + 1]], b), u))
  return Blocks(tuple(out)) if isinstance(local, Blocks) else out[0]


def _layer_entropy(entropy: PyTree, layers: PyTree, num_layers: int) -> jax.Array:
  """Mean attention entropy of the tensors of each layer, [L]."""
  tot = jnp.zeros((num_layers,))
  cnt = np.zeros((num_layers,))
  for e, l in zip(jax.tree.leaves(entropy), jax.tree.leaves(layers)):
    tot = tot.at[l].add(e)
    cnt[l] += 1
  return tot / jnp.asarray(np.maximum(cnt, 1))


def _hyper_tx(cfg) -> optax.GradientTransformation:
  """torch SGD(momentum, weight_decay): coupled L2 before momentum. The
  hyper-parameters live in the optimizer state (inject_hyperparams), so sweeping
  them reuses one compiled round: the state `init` makes holds a sweep replica's
  values (built when the server's `init` is traced)."""
  return optax.chain(
      optax.inject_hyperparams(optax.add_decayed_weights)(
          weight_decay=_traced(cfg, 'hyper_weight_decay')),
      optax.inject_hyperparams(optax.sgd)(learning_rate=_traced(cfg, 'hyper_lr'),
                                          momentum=_traced(cfg, 'hyper_momentum')))


def _hyper_step(tx, w, opt, grad, on, rows=None):
  """One SGD step on a hyper weight, taken only when `on` (from round 2) and, with
  `rows` ([rows] bool over the weight's first axis), only in those rows (the round's
  participants; their momentum too)."""
  upd, new_opt = tx.update(grad, opt, w)
  new_w = optax.apply_updates(w, upd)

  def one(x, y):
    keep = on
    if rows is not None and x.shape[:1] == rows.shape:
      keep = on & rows.reshape(rows.shape + (1,) * (x.ndim - 1))
    return jnp.where(keep, x, y)

  pick = lambda a, b: jax.tree.map(one, a, b)
  return pick(new_w, w), pick(new_opt, opt)


def participant_rows(view: PyTree, valid: jax.Array, m: int) -> PyTree:
  """The `m` rows of `view` (stacked or `Blocks`) where `valid` ([rows] bool, exactly
  `m` True) is set, in row order, stacked: each part gives its valid rows first (at
  most m of them, a gather in place), then the m are picked from those."""
  picked, flags = [], []
  for lo, part in row_offsets(view):
    rows = num_rows(part)
    k = min(rows, m)
    on = valid[lo:lo + rows]
    idx = jnp.nonzero(on, size=k, fill_value=0)[0]
    picked.append(jax.tree.map(lambda x: jnp.take(x, idx, axis=0), part))
    flags.append(jnp.arange(k) < jnp.sum(on))
  flags = jnp.concatenate(flags)
  final = jnp.nonzero(flags, size=m, fill_value=0)[0]
  return jax.tree.map(lambda *xs: jnp.take(jnp.concatenate(xs, 0), final, axis=0), *picked)


def _scatter(values: jax.Array, valid: jax.Array, m: int) -> jax.Array:
  """[rows] from the m participants' `values` (in row order), 0 elsewhere."""
  idx = jnp.nonzero(valid, size=m, fill_value=0)[0]
  return jnp.zeros(valid.shape + values.shape[1:], values.dtype).at[idx].set(values)


def conflict_averse_encoders(info: FedInfo, cfg) -> Server:
  """Encoders: θ_i ← θ_i + Δθ_i (homo-averaged) + clamp(α_i)·Ũ, Ũ = CA(Δθ), learned α [N]."""
  tx = _hyper_tx(cfg)
  homo_ids = info.homo_groups if cfg.homo else tuple(range(info.num_clients))
  homo_active = len(set(homo_ids)) < len(homo_ids)

  def init(views):
    alpha = jnp.full((info.num_clients,), _traced(cfg, 'alpha_init'), jnp.float32)
    prev_u = jax.tree.map(lambda x: jnp.zeros(x.shape[1:], jnp.float32), views['encoder'])
    return ServerState(shared={'alpha': alpha, 'alpha_opt': _hyper_tx(cfg).init(alpha),
                               'prev_u': prev_u})

  def apply(state: ServerState, x: ServerInputs):
    st = state.shared
    prev, local = x.prev['encoder'], x.local['encoder']  # Blocks: the groups' own arrays
    valid, m = x.row_valid, info.num_participants
    ca_args = (local, prev) if valid is None else (participant_rows(local, valid, m),
                                                   participant_rows(prev, valid, m))
    # The encoder deltas (N x 27.5M for Swin-T) are never materialised: the Gram
    # matrix and the α inner products <Ũ^(r-1), Δθ_i> share one read pass.
    u, aux = hm.conflict_averse_from(*ca_args, c=_traced(cfg, 'ca_c'),
                                     rescale=cfg.ca_rescale, probe=st['prev_u'],
                                     diagnostics=False)
    dots, ca_w = aux['probe_dots'], aux['w']
    if valid is not None:
      dots, ca_w = _scatter(dots, valid, m), _scatter(ca_w, valid, m)
    g_alpha = hm.hyper_grad(dots, st['alpha'])
    alpha, alpha_opt = _hyper_step(tx, st['alpha'], st['alpha_opt'], g_alpha, x.round >= 1,
                                   valid)
    enc = personalize_encoders(prev, local, alpha, u, homo_ids if homo_active else None,
                               valid)
    if valid is not None:
      enc = keep_rows(enc, prev, valid)
    logs = dict(alpha=alpha, alpha_grad=g_alpha, ca_w=ca_w,
                ca_conflict_rate=aux['conflict_rate'])
    return ({'encoder': enc},
            state._replace(shared={'alpha': alpha, 'alpha_opt': alpha_opt, 'prev_u': u}), logs)

  return Server(init=init, apply=apply, blocks=True)


def cross_attention_decoders(info: FedInfo, cfg) -> Server:
  """Decoders: θ_k ← θ_k + Δθ_k + clamp(β_{k,l})·Ã_k, Ã per tensor over all K, learned β [K, L]."""
  tx = _hyper_tx(cfg)
  num_layers = len(info.decoder_layers)

  def init(views):
    beta = jnp.full((info.num_decoders, num_layers), _traced(cfg, 'beta_init'), jnp.float32)
    prev_a = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), views['decoder'])
    return ServerState(shared={'beta': beta, 'beta_opt': _hyper_tx(cfg).init(beta),
                               'prev_a': prev_a})

  def apply(state: ServerState, x: ServerInputs):
    st = state.shared
    prev, local = x.prev['decoder'], x.local['decoder']
    valid = None if x.row_valid is None else x.row_valid[jnp.asarray(info.decoder_client)]
    d_dec = tree_sub(local, prev)
    layers = layer_of_leaf(prev, info.decoder_layers)
    g_beta = hm.beta_grad(st['prev_a'], d_dec, st['beta'], layers)
    beta, beta_opt = _hyper_step(tx, st['beta'], st['beta_opt'], g_beta, x.round >= 1, valid)
    a, att = hm.cross_attention(d_dec, return_attention=True, valid=valid)
    dec = _add_scaled(local, hm.beta_per_leaf(beta, layers), a)
    if valid is not None:
      dec, a = keep_rows(dec, prev, valid), keep_rows(a, st['prev_a'], valid)
    logs = dict(beta=beta, beta_grad=g_beta,
                attention_entropy=_layer_entropy(att['entropy'], layers, num_layers))
    return ({'decoder': dec},
            state._replace(shared={'beta': beta, 'beta_opt': beta_opt, 'prev_a': a}), logs)

  return Server(init=init, apply=apply)


def build(info: FedInfo, config=None) -> Algorithm:
  """FedHCA2 from `config.hca2` (see `CONFIG`): the two hyper rules by role;
  the ablations put FedAvg (`rules.mean`) or nothing (the role stays personal) in
  either place."""
  cfg = CONFIG.of(config)
  enc = {'conflict_averse': lambda: conflict_averse_encoders(info, cfg),
         'fedavg': lambda: rules.mean('uniform', info)}.get(cfg.encoder_agg)
  dec = {'cross_attention': lambda: cross_attention_decoders(info, cfg),
         'fedavg': lambda: rules.mean('uniform', info)}.get(cfg.decoder_agg)
  parts = {r: f() for r, f in (('encoder', enc), ('decoder', dec)) if f is not None}
  return Algorithm(
      name='hca2', client=Client(), server=rules.by_role(parts),
      roles={'encoder': 'shared' if enc else 'personal',
             'decoder': 'shared' if dec else 'personal', 'head': 'personal'})
