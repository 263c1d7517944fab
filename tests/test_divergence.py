"""Non-finite rounds: detected on device with the round, named, never committed."""

import os

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
from fedjax_mtl import experiment, rounds, train
from fedjax_mtl.engines import dense
from fedjax_mtl.checkpoint import Checkpointer
from fedjax_mtl.errors import DivergedError
from fedjax_mtl.report import read_jsonl


def test_finite_rows_flags_each_client_row():
  tree = {'a': jnp.ones((3, 2, 2)), 'b': {'c': jnp.ones((3, 4))}, 'i': jnp.zeros((3,), int)}
  tree['a'] = tree['a'].at[1, 0, 1].set(jnp.nan)
  tree['b']['c'] = tree['b']['c'].at[2, 3].set(jnp.inf)
  assert rounds.finite_rows(tree, 3).tolist() == [True, False, False]
  assert rounds.finite_rows({}, 2).tolist() == [True, True]
  # Small leaves are checked packed side by side, large ones alone; bfloat16 too.
  from fedjax_mtl.algorithms import rows as row_lib
  big = jnp.ones((3, row_lib.PACK_WIDE_COLUMNS))
  tree = {'big': big.at[0, 5].set(-jnp.inf), 'half': jnp.ones((3, 2), jnp.bfloat16).at[2, 1].set(
      jnp.nan), 'ok': jnp.ones((3, 4))}
  assert rounds.finite_rows(tree, 3).tolist() == [False, True, False]
  h = rounds.health([{'loss': jnp.ones((1, 1))}], [{'w': jnp.ones((1, 3))}],
                    [{'w': jnp.ones((1, 3))}], {'u': big[0].at[7].set(jnp.nan), 'a': jnp.ones(2)})
  assert not bool(h['server'])


def test_health_flags_losses_params_aggregates_and_server():
  metrics = [{'loss': jnp.array([[1., jnp.nan], [2., 3.]])}]
  ok = [{'w': jnp.ones((2, 3))}]
  h = rounds.health(metrics, ok, ok, {'alpha': jnp.array([0.5, jnp.nan])})
  assert np.asarray(h['loss'][0]).tolist() == [[True, False], [True, True]]
  assert np.asarray(h['params'][0]).all() and not bool(h['server'])


@pytest.fixture(scope='module')
def exp_and_config():
  # A data seed of its own: the test poisons this experiment's (cached) arrays.
  config = tiny_config('fedavg', **{'data.seed': 11})
  return experiment.build(config), config


def test_divergence_message_names_round_clients_and_tasks(exp_and_config):
  exp, _ = exp_and_config
  fed = exp.fed
  health = {'loss': [np.ones((g.num_total, g.num_slots), bool) for g in fed.groups],
            'params': [np.ones(g.num_total, bool) for g in fed.groups],
            'agg': [np.ones(g.num_total, bool) for g in fed.groups],
            'server': np.bool_(True)}
  assert dense.divergence(exp, 3, health) is None
  health['agg'][0][1] = False
  c = fed.clients[fed.groups[0].client_ids[1]]
  msg = dense.divergence(exp, 3, health)
  assert msg == f'round 3: non-finite aggregated parameters of client {c.name} ({c.tasks[0]})'
  health['loss'][0][1, 0] = False  # losses are named first: they point at the cause
  assert 'training loss' in dense.divergence(exp, 3, health)
  health = {k: [np.ones_like(x) for x in v] if isinstance(v, list) else v
            for k, v in health.items()}
  health['server'] = np.bool_(False)
  assert 'server state' in dense.divergence(exp, 3, health)


def test_poisoned_client_stops_the_run_and_keeps_the_last_checkpoint(exp_and_config, tmp_path):
  exp, config = exp_and_config
  wd = str(tmp_path / 'wd')
  train.train_and_evaluate(config, wd, stop_after=1)
  before = open(os.path.join(wd, 'metrics.jsonl')).read()
  depth = exp.data['nyud']['train']['depth']
  saved = depth.copy()
  depth[:] = np.nan  # round 2 reads poisoned labels (the feed copies them to device anew)
  try:
    with pytest.raises(DivergedError) as e:
      train.train_and_evaluate(config, wd)
  finally:
    depth[:] = saved
  nyud = [c for c in exp.fed.clients if c.dataset == 'nyud'][0]
  msg = str(e.value)
  assert msg.startswith(f'round 2: non-finite training loss of client {nyud.name} (depth)')
  assert 'newest checkpoint: round 1' in msg and '\n' not in msg
  assert all(c.name not in msg for c in exp.fed.clients if c.dataset == 'pascal')
  # Nothing of round 2 is committed: rows, checkpoint.
  assert open(os.path.join(wd, 'metrics.jsonl')).read() == before
  assert Checkpointer.latest_in(os.path.join(wd, 'checkpoints')) == 1
  assert max(r['round'] for r in read_jsonl(os.path.join(wd, 'metrics.jsonl'))) == 1
