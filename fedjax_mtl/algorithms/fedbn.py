"""FedBN (Li et al. 2021; FedDEA spec §2.4): FedAvg, except that the parameters of
every batch-norm layer (scale and bias) stay with their client, as their running
statistics already do in every algorithm here.

Which layers are batch norms comes from the model's `batch_stats` collection
(`FedInfo.norm_modules`), so it is exact for any encoder: the decoders' `fuse_bn`
with Swin, and every BatchNorm of ResNet-18 too. Under `dea(fedbn)` the mask
covers the aggregated parameters only (the batch-norm ones never leave the
client): `keep_norm_local` goes around the composed rule.
"""

import jax

from fedjax_mtl import fields
from fedjax_mtl.algorithms import fedavg
from fedjax_mtl.algorithms.plugin_math import path_names
from fedjax_mtl.algorithms.base import Algorithm, Client, FedInfo, Server, ServerInputs, Views

CONFIG = fields.Block('fedbn', {}, reads=('fedavg',))  # no knobs; FedAvg's weights


def split_norm(views: Views, modules: frozenset) -> tuple[Views, Views]:
  """(views without the batch-norm leaves, the batch-norm leaves alone), each role a
  flat dict 'a/b/leaf' -> rows."""
  def part(view, keep_norm):
    flat = jax.tree_util.tree_flatten_with_path(view)[0]
    return {'/'.join(path_names(p)): x for p, x in flat
            if (path_names(p)[:-1] in modules) == keep_norm}
  return ({r: part(v, False) for r, v in views.items()},
          {r: part(v, True) for r, v in views.items()})


def keep_norm_local(rule: Server, info: FedInfo) -> Server:
  """`rule` on every shared leaf except the batch-norm ones, which keep each row's
  upload (and are not seen by `rule`)."""
  modules = info.norm_modules

  def rebuild(view, parts):
    paths = ['/'.join(path_names(p)) for p, _ in jax.tree_util.tree_flatten_with_path(view)[0]]
    merged = {**parts[0], **parts[1]}
    return jax.tree.unflatten(jax.tree.structure(view), [merged[p] for p in paths])

  def init(views):
    return rule.init(split_norm(views, modules)[0])

  def apply(state, x: ServerInputs):
    prev, _ = split_norm(x.prev, modules)
    local, norm = split_norm(x.local, modules)
    new, st, logs = rule.apply(state, x._replace(prev=prev, local=local))
    return {r: rebuild(x.local[r], (new[r], norm[r])) for r in x.local}, st, logs

  return Server(init=init, apply=apply, blocks=False)


def build(info: FedInfo, config=None) -> Algorithm:
  """FedAvg's roles, client and server; batch-norm parameters kept local around the
  composed server (outside any wrapper)."""
  base = fedavg.build(info, config)
  return Algorithm(name='fedbn', client=Client(), server=base.server, roles=base.roles,
                   outermost=lambda server: keep_norm_local(server, info),
                   local_modules=info.norm_modules)
