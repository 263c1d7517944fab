"""FedAvg: uniform mean of encoders over all clients and of decoders over all tasks."""

from fedjax_mtl.defaults import base_config


def get_config(arg=None):
  return base_config(arg, algorithm='fedavg')
