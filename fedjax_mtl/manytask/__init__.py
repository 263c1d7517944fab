"""The many-task classification setting (MaTU spec §1, NTKFedAvg spec §1.3).

N clients hold T classification tasks (a Dirichlet task allocation and a
Dirichlet class split, `fedjax_mtl.manytask.allocation`); a ViT backbone is frozen
and stored once; each (client, task) pair trains LoRA adapters and a task head.
Each round a fixed number of clients take part; all their (client, task) pairs
train in one vmapped program (padded to the most pairs any round has, so one
compiled round serves every round), then the algorithm's server part
aggregates them.

- `setting`: the static tables (tasks, allocation, pairs, the round schedule)
  and the data;
- `model`: the ViT split into the frozen backbone and the trainable pytree
  (adapters + head), the parameter roles the algorithms read;
- `engine`: the jitted round and evaluation;
- `run`: the run loop behind `python -m fedjax_mtl.main --config=configs/fedavg.py:mini8`.
"""
