"""Local training (no aggregation): the reference for Δm."""

from fedjax_mtl.defaults import base_config


def get_config(arg=None):
  return base_config(arg, algorithm='local')
