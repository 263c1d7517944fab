"""Aggregation rules by name; each is `rule(info, config) -> Aggregator`."""

from __future__ import annotations

from typing import Callable

from fedjax_mtl.aggregators.base import AggInfo, AggInputs, Aggregator
from fedjax_mtl.aggregators.fedavg import fedavg
from fedjax_mtl.aggregators.local import local
from fedjax_mtl.errors import check_choice

RULES: dict[str, Callable[..., Aggregator]] = {
    'local': local,
    'fedavg': fedavg,
}


def get_aggregator(name: str, info: AggInfo, config=None) -> Aggregator:
  """The aggregation rule `name`, with a clear error listing the valid ones."""
  check_choice('algorithm', name, RULES)
  return RULES[name](info, config)


__all__ = ['AggInfo', 'AggInputs', 'Aggregator', 'RULES', 'get_aggregator']
