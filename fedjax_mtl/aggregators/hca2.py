"""FedHCA2: hyper conflict-averse encoders, hyper cross-attention decoders, learned α/β.

Per round (spec fedhca2.md §3.5, released-code order):
  1. Δθ = local - previous personalised params, for the N encoders and K decoders;
  2. from the second round on, one SGD step on α [N] and β [K, L] with the
     closed-form hypergradients g_α_i = -<Ũ^(r-1), Δθ_i^E>, g_β_{k,l} =
     -Σ_{p∈l} <Ã^(r-1)_{k,p}, Δθ_{k,p}> (zero where the raw weight is outside [0, 1]);
  3. encoders: Ũ = conflict_averse(Δθ^E); θ_i ← θ_i + Δθ_i (homo-averaged) + clamp(α_i)·Ũ;
  4. decoders: Ã = cross_attention(Δθ^D) per tensor; θ_k ← θ_k + Δθ_k + clamp(β_{k,l})·Ã_k.
Ũ, Ã, α, β and the two SGD states are the rule's state (checkpointed).

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

from fedjax_mtl.aggregators import hca2_math as hm
from fedjax_mtl.aggregators.base import AggInfo, AggInputs, Aggregator, tree_mean_broadcast
from fedjax_mtl.errors import check_choice
from fedjax_mtl.models.decoder import DECODER_LAYERS

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


def default_config() -> ml_collections.ConfigDict:
  """FedHCA2 knobs (released-code defaults)."""
  c = ml_collections.ConfigDict()
  c.encoder_agg = 'conflict_averse'
  c.decoder_agg = 'cross_attention'
  c.ca_c = 0.4
  c.ca_rescale = True  # released code divides Ũ by 1 + c²
  c.homo = True  # released code: average the updates of consecutive same-task clients
  c.alpha_init = 0.1
  c.beta_init = 0.1
  c.hyper_lr = 1e-2
  c.hyper_momentum = 0.9
  c.hyper_weight_decay = 1e-4
  return c


def layer_of_leaf(decoders: PyTree) -> PyTree:
  """Index into DECODER_LAYERS of every decoder leaf (by its top-level module name)."""
  def idx(path, _):
    name = path[0].key
    check_choice('decoder layer', name, DECODER_LAYERS)
    return DECODER_LAYERS.index(name)
  return jax.tree_util.tree_map_with_path(idx, decoders)


def _delta(local: PyTree, prev: PyTree) -> PyTree:
  return jax.tree.map(lambda a, b: a.astype(jnp.float32) - b.astype(jnp.float32), local, prev)


def _add_scaled(base: PyTree, weight: PyTree, agg: PyTree) -> PyTree:
  """base + clamp(weight, 0, 1) * agg per stacked row (agg stacked or shared)."""
  def one(b, w, g):
    w = jnp.clip(w, 0., 1.).reshape(w.shape + (1,) * (b.ndim - 1))
    g = g if g.ndim == b.ndim else g[None]
    return (b.astype(jnp.float32) + w * g.astype(jnp.float32)).astype(b.dtype)
  return jax.tree.map(one, base, weight, agg)


def _layer_entropy(entropy: PyTree, layers: PyTree, num_layers: int) -> jax.Array:
  """Mean attention entropy of the tensors of each layer, [L]."""
  tot = jnp.zeros((num_layers,))
  cnt = np.zeros((num_layers,))
  for e, l in zip(jax.tree.leaves(entropy), jax.tree.leaves(layers)):
    tot = tot.at[l].add(e)
    cnt[l] += 1
  return tot / jnp.asarray(np.maximum(cnt, 1))


def hca2(info: AggInfo, config=None) -> Aggregator:
  """The FedHCA2 rule, configured by `config.hca2` (see `default_config`)."""
  cfg = default_config()
  if config is not None and 'hca2' in config:
    cfg.update(config.hca2)
  check_choice('hca2.encoder_agg', cfg.encoder_agg, ENCODER_RULES)
  check_choice('hca2.decoder_agg', cfg.decoder_agg, DECODER_RULES)
  # torch SGD(momentum, weight_decay): coupled L2 before momentum. The
  # hyper-parameters live in the optimizer state (inject_hyperparams), so
  # sweeping them reuses one compiled round.
  tx = optax.chain(
      optax.inject_hyperparams(optax.add_decayed_weights)(
          weight_decay=cfg.hyper_weight_decay),
      optax.inject_hyperparams(optax.sgd)(learning_rate=cfg.hyper_lr,
                                          momentum=cfg.hyper_momentum))
  num_layers = len(DECODER_LAYERS)
  homo_ids = info.homo_groups if cfg.homo else tuple(range(info.num_clients))
  homo_active = len(set(homo_ids)) < len(homo_ids)
  ca = cfg.encoder_agg == 'conflict_averse'
  xa = cfg.decoder_agg == 'cross_attention'

  def init(enc: PyTree, dec: PyTree) -> PyTree:
    alpha = jnp.full((info.num_clients,), cfg.alpha_init, jnp.float32)
    beta = jnp.full((info.num_decoders, num_layers), cfg.beta_init, jnp.float32)
    return {
        'alpha': alpha, 'beta': beta,
        'alpha_opt': tx.init(alpha), 'beta_opt': tx.init(beta),
        # Last round's aggregated updates (zero before the first aggregation).
        'prev_u': jax.tree.map(lambda x: jnp.zeros(x.shape[1:], jnp.float32), enc),
        'prev_a': jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), dec),
    }

  def hyper_step(w, opt, grad, on):
    upd, new_opt = tx.update(grad, opt, w)
    new_w = optax.apply_updates(w, upd)
    pick = lambda a, b: jax.tree.map(lambda x, y: jnp.where(on, x, y), a, b)
    return pick(new_w, w), pick(new_opt, opt)

  def apply(state: PyTree, x: AggInputs):
    d_dec = _delta(x.dec_local, x.dec_prev)
    layers = layer_of_leaf(x.dec_prev)
    on = x.round >= 1  # no hyper step in the first round
    new, logs = dict(state), {}

    if ca:
      # The encoder deltas (N x 27.5M for Swin-T) are never materialised: the Gram
      # matrix and the α inner products <Ũ^(r-1), Δθ_i> share one read pass.
      u, aux = hm.conflict_averse_from(x.enc_local, x.enc_prev, c=cfg.ca_c,
                                       rescale=cfg.ca_rescale, probe=state['prev_u'])
      g_alpha = hm.hyper_grad(aux['probe_dots'], state['alpha'])
      new['alpha'], new['alpha_opt'] = hyper_step(state['alpha'], state['alpha_opt'],
                                                   g_alpha, on)
      if homo_active:
        base = jax.tree.map(lambda p, d: (p.astype(jnp.float32) + d).astype(p.dtype),
                            x.enc_prev, hm.homo_average(_delta(x.enc_local, x.enc_prev),
                                                        homo_ids))
      else:
        base = x.enc_local  # θ_prev + Δθ exactly, so α = 0 gives Local bitwise
      alpha_leaves = jax.tree.map(lambda _: new['alpha'], base)
      enc = _add_scaled(base, alpha_leaves, u)
      new['prev_u'] = u
      logs.update(alpha=new['alpha'], alpha_grad=g_alpha, ca_w=aux['w'],
                  ca_conflict_rate=aux['conflict_rate'])
    elif cfg.encoder_agg == 'fedavg':
      enc = tree_mean_broadcast(x.enc_local)
    else:
      enc = x.enc_local

    if xa:
      g_beta = hm.beta_grad(state['prev_a'], d_dec, state['beta'], layers)
      new['beta'], new['beta_opt'] = hyper_step(state['beta'], state['beta_opt'], g_beta, on)
      a, att = hm.cross_attention(d_dec, return_attention=True)
      dec = _add_scaled(x.dec_local, hm.beta_per_leaf(new['beta'], layers), a)
      new['prev_a'] = a
      logs.update(beta=new['beta'], beta_grad=g_beta,
                  attention_entropy=_layer_entropy(att['entropy'], layers, num_layers))
    elif cfg.decoder_agg == 'fedavg':
      dec = tree_mean_broadcast(x.dec_local)
    else:
      dec = x.dec_local
    return enc, dec, new, logs

  return Aggregator(init=init, apply=apply)
