"""Local training: no aggregation; every client keeps its own model."""

from fedjax_mtl.aggregators.base import AggInfo, Aggregator


def local(info: AggInfo, config=None) -> Aggregator:
  """The identity rule (the reference for Δm)."""
  del info, config
  return Aggregator(init=lambda enc, dec: {},
                    apply=lambda state, x: (x.enc_local, x.dec_local, state, {}))
