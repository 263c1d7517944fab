"""Flower adapter (`pip install ".[flower]"`): a run of this package as a Flower
federation, with the same configs, in either setting: dense (FedHCA2's hetero
clients, `configs/hca2.py`) and many-task (MaTU's, `configs/matu.py`,
`configs/fedavg.py:mini8`), one Flower node per client.

- `server.make_strategy` / `server.app`: the `ServerApp`, calling the algorithm's
  jitted server rule on the clients' uploads (`server.EngineStrategy`, dense;
  `many_task.ManyTaskStrategy`, many-task: the engine's round cut at its seam, the
  aggregation and the evaluation on the server).
- `client.app`: the `ClientApp`, training one client with the jitted local trainer
  on its own data (many-task: its (client, task) pairs' slots, `many_task.py`).
- `simulate.simulate(config)` / `python -m fedjax_mtl.flower --config=...`: both in
  Flower's simulation engine, one virtual node per client; `simulate.in_process`:
  the same message contents without Flower, one node after the other.

Flower's telemetry is off unless `FLWR_TELEMETRY_ENABLED` says otherwise (runs make
no network calls of their own), and so are Ray's usage statistics.
"""

import os

os.environ.setdefault('FLWR_TELEMETRY_ENABLED', '0')
os.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')
