"""Aggregation rules by name; each is `rule(info, config) -> Aggregator`.

Modules stay importable under their own names, e.g.
`fedjax_mtl.aggregators.hca2.conflict_averse`.
"""

from __future__ import annotations

from typing import Callable

from fedjax_mtl.aggregators import fedavg, hca2, local
from fedjax_mtl.aggregators.base import AggInfo, AggInputs, Aggregator
from fedjax_mtl.errors import check_choice

RULES: dict[str, Callable[..., Aggregator]] = {
    'local': local.local,
    'fedavg': fedavg.fedavg,
    'hca2': hca2.hca2,
}


def get_aggregator(name: str, info: AggInfo, config=None) -> Aggregator:
  """The aggregation rule `name`, with a clear error listing the valid ones."""
  check_choice('algorithm', name, RULES)
  return RULES[name](info, config)


__all__ = ['AggInfo', 'AggInputs', 'Aggregator', 'RULES', 'get_aggregator']
