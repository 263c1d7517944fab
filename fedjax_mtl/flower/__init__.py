"""Flower adapter (`pip install ".[flower]"`): a run of this package as a Flower
federation, with the same configs.

- `server.EngineStrategy` / `server.app`: the `ServerApp`, calling the algorithm's
  jitted server rule on the clients' uploads.
- `client.app`: the `ClientApp`, training one client with the jitted local trainer
  on its own data.
- `simulate.simulate(config)` / `python -m fedjax_mtl.flower --config=...`: both in
  Flower's simulation engine, one virtual node per client; `simulate.in_process`:
  the same message contents without Flower, one node after the other.

Flower's telemetry is off unless `FLWR_TELEMETRY_ENABLED` says otherwise (runs make
no network calls of their own), and so are Ray's usage statistics.
"""

import os

os.environ.setdefault('FLWR_TELEMETRY_ENABLED', '0')
os.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')
