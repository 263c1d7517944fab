"""Server rules at the paper's scale (N = 6 Swin-T encoders, K = 9 FedHCA2 decoders):
every rule's server step as the engine calls it against one read of its inputs
(`--only=rules`), and FedHCA2's aggregation (`--only=hca2`).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import peak_memory_mb, timeit


def paper_scale_views(num_clients: int = 6, num_decoders: int = 9) -> dict:
  """Round-start and uploaded rows at the paper's scale: N Swin-T encoders (27.5M
  parameters each) and K FedHCA2 decoders for Swin-T features (175,776 each),
  random updates of 1e-3 relative size; and the `FedInfo` of scenario 1c
  (5 single-task clients + one client holding the other K - 5 decoders)."""
  from fedjax_mtl.algorithms import FedInfo
  from fedjax_mtl.models import get_encoder
  from fedjax_mtl.models.decoder import DECODER_LAYERS, Decoder

  enc_model = get_encoder('swin_t')
  enc_shapes = jax.eval_shape(lambda: enc_model.init(
      jax.random.PRNGKey(0), jnp.zeros((1, 224, 224, 3)), train=False))['params']
  feats = [jnp.zeros((1, 56 // 2**i, 56 // 2**i, 96 * 2**i)) for i in range(4)]
  dec_shapes = jax.eval_shape(
      lambda: Decoder(96, train=True).init(jax.random.PRNGKey(0), feats))['params']

  def stacked(shapes, lead, key, scale):
    leaves, tdef = jax.tree.flatten(shapes)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(tdef, [
        scale * jax.random.normal(k, (lead,) + s.shape, jnp.float32)
        for k, s in zip(keys, leaves)])

  make = jax.jit(lambda k: (stacked(enc_shapes, num_clients, k, 1e-2),
                            stacked(dec_shapes, num_decoders, k, 1e-2)))
  enc_prev, dec_prev = make(jax.random.PRNGKey(0))
  d_enc, d_dec = make(jax.random.PRNGKey(1))
  add = jax.jit(lambda a, b: jax.tree.map(lambda x, d: x + 1e-3 * d, a, b))
  enc_local, dec_local = add(enc_prev, d_enc), add(dec_prev, d_dec)
  st = num_clients - 1
  owners = tuple(range(st)) + (st,) * (num_decoders - st)
  info = FedInfo(num_clients=num_clients, num_decoders=num_decoders, decoder_client=owners,
                 decoder_names=tuple(map(str, range(num_decoders))),
                 client_names=tuple(map(str, range(num_clients))),
                 homo_groups=tuple(range(num_clients)), decoder_layers=DECODER_LAYERS,
                 num_rounds=100,
                 client_keys=tuple(('pascal', str(c)) for c in range(num_clients)),
                 decoder_keys=tuple(('pascal', str(owners[k])) for k in range(num_decoders)))
  return {'prev': {'encoder': enc_prev, 'decoder': dec_prev},
          'local': {'encoder': enc_local, 'decoder': dec_local}, 'info': info,
          'encoder_params': sum(int(np.prod(s.shape)) for s in jax.tree.leaves(enc_shapes)),
          'decoder_params': sum(int(np.prod(s.shape)) for s in jax.tree.leaves(dec_shapes))}


def rule_runners(spec: str = 'hca2', views: dict | None = None, **blocks) -> dict:
  """One server step of algorithm `spec` at the paper's scale, compiled and warmed up.

  Times the jitted server part as the engine calls it on the shared roles'
  rows, from the second round on. `aggregate_s` allocates fresh output
  buffers on every call; `aggregate_donated_s` donates the server state and
  the uploaded rows and feeds the outputs back, as inside the engine's round
  (where the new parameters may reuse those buffers). `blocks` are config
  blocks, e.g. matfl={'mode': 'soft'}.

  Returns the two calls (`run`, `run_donated`), the compile time, the sizes
  and the bytes of the rows the rule reads.
  """
  import ml_collections
  from fedjax_mtl.algorithms import ServerInputs, ServerState, get_algorithm
  v = views or paper_scale_views()
  info = v['info']
  cfg = ml_collections.ConfigDict({k: dict(b) for k, b in blocks.items()})
  alg = get_algorithm(spec, info, cfg)
  roles = alg.shared_roles
  prev = {r: v['prev'][r] for r in roles}
  local_ = {r: v['local'][r] for r in roles}
  n = info.num_clients
  state = jax.jit(alg.server.init)(prev)
  const = dict(num_examples=jnp.full((n,), 100., jnp.float32),
               num_steps=jnp.full((n,), 125, jnp.int32), client_ids=jnp.arange(n),
               round=jnp.int32(1))
  inputs = ServerInputs(prev=prev, local=local_, **const)
  t0 = time.perf_counter()
  compiled = jax.jit(alg.server.apply).lower(state, inputs).compile()
  compile_s = time.perf_counter() - t0
  run = lambda: jax.block_until_ready(compiled(state, inputs))
  run()

  def apply_local(shared, rows, local_, prev):
    return alg.server.apply(ServerState(shared, rows), ServerInputs(prev=prev, local=local_,
                                                                     **const))

  donated = jax.jit(apply_local, donate_argnums=(0, 1, 2)).lower(
      state.shared, state.rows, local_, prev).compile()
  holder = {'args': jax.tree.map(jnp.copy, (state.shared, state.rows, local_))}

  def run_donated():
    new, st, logs = donated(*holder['args'], prev)
    jax.block_until_ready((new, st, logs))
    holder['args'] = (st.shared, st.rows, new)

  run_donated()
  read = sum(x.nbytes for t in (prev, local_) for x in jax.tree.leaves(t))
  return {'run': run, 'run_donated': run_donated, 'compile_s': compile_s,
          'num_clients': n, 'encoder_params': v['encoder_params'],
          'num_decoders': info.num_decoders, 'decoder_params': v['decoder_params'],
          'read_bytes': read, 'roles': roles}


def hca2_runners(num_clients: int = 6, num_decoders: int = 9) -> dict:
  """`rule_runners` of FedHCA2 (conflict-averse encoders, cross-attention decoders)."""
  return rule_runners('hca2', paper_scale_views(num_clients, num_decoders))


def bench_hca2(num_clients: int = 6, num_decoders: int = 9, repeats: int = 3) -> dict:
  """Times `hca2_runners` (fresh outputs and donated), best of `repeats`."""
  r = hca2_runners(num_clients, num_decoders)
  return {'num_clients': num_clients, 'encoder_params': r['encoder_params'],
          'num_decoders': num_decoders, 'decoder_params': r['decoder_params'],
          'compile_s': r['compile_s'], 'aggregate_s': timeit(r['run'], repeats),
          'aggregate_donated_s': timeit(r['run_donated'], repeats),
          'peak_memory_mb': peak_memory_mb()}


# Server rules timed at the paper's scale (`--only=rules`): name -> (spec, config blocks).
RULES = {
    'fedavg': ('fedavg', {}),
    'fedper (encoders only)': ('fedper', {}),
    'fedamp': ('fedamp', {}),
    'fedsta': ('fedsta', {}),
    'matfl hard': ('matfl', {'matfl': {'mode': 'hard', 'num_clusters': 2, 'th': 0.0}}),
    'matfl soft': ('matfl', {'matfl': {'mode': 'soft', 'num_clusters': 2, 'th': 0.0}}),
    'momentum(fedavg)': ('momentum(fedavg)', {}),
    'dea(fedavg) rho=0.3': ('dea(fedavg)', {'dea': {'rho': 0.3, 'variant': 'top',
                                                    'rescale': True, 'server_lr': 1.0}}),
    'hca2': ('hca2', {}),
}


def read_floor_s(views: dict, roles, repeats: int = 3) -> float:
  """Seconds of one XLA read of the rows a rule must read: sum(local - prev) per leaf."""
  prev = {r: views['prev'][r] for r in roles}
  local_ = {r: views['local'][r] for r in roles}
  f = jax.jit(lambda a, b: sum(jnp.sum(x - y) for x, y in zip(jax.tree.leaves(a),
                                                               jax.tree.leaves(b))))
  f(local_, prev).block_until_ready()
  return timeit(lambda: f(local_, prev).block_until_ready(), repeats)


def bench_rules(repeats: int = 3, names=None) -> dict:
  """Every server rule at Swin-T scale (N = 6, K = 9), donated as in the round, against
  the time of one read of its inputs."""
  views = paper_scale_views()
  out = {}
  for name in names or RULES:
    spec, blocks = RULES[name]
    r = rule_runners(spec, views, **blocks)
    t = timeit(r['run_donated'], repeats)
    floor = read_floor_s(views, r['roles'], repeats)
    out[f'{name}: donated_s'] = t
    out[f'{name}: read_floor_s'] = floor
    out[f'{name}: vs_floor'] = t / floor
    out[f'{name}: read_GB'] = r['read_bytes'] / 1e9
    print(f'{name:24s} {t:.3f} s donated, read floor {floor:.3f} s ({t / floor:.1f}x), '
          f"compile {r['compile_s']:.1f} s", flush=True)
    del r
  return out
