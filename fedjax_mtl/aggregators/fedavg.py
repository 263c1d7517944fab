"""FedAvg for hetero clients: uniform mean of encoders over N and decoders over all K.

As in the released code, the mean is not weighted by data size, and decoders
are averaged across all tasks, so after aggregation only the heads differ.
"""

from fedjax_mtl.aggregators.base import AggInfo, Aggregator, tree_mean_broadcast


def fedavg(info: AggInfo, config=None) -> Aggregator:
  """Uniform FedAvg of encoders and of all task decoders."""
  del info, config
  return Aggregator(
      init=lambda enc, dec: {},
      apply=lambda state, x: (tree_mean_broadcast(x.enc_local),
                              tree_mean_broadcast(x.dec_local), state, {}))
