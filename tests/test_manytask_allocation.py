"""Many-task allocation: Dirichlet task assignment, NIID-Bench label split, participation."""

import math

import numpy as np
import pytest

from fedjax_mtl.manytask import allocation as mt
from fedjax_mtl.errors import ConfigError

LABELS = np.arange(2000) % 10  # a balanced 10-class training set


def _entropy(labels, parts):
  """Mean over clients of the entropy of the client's label distribution (nats)."""
  out = []
  for p in parts:
    q = np.bincount(labels[p]) / len(p)
    q = q[q > 0]
    out.append(-(q * np.log(q)).sum())
  return float(np.mean(out))


def _niid_bench_reference(labels, num_clients, beta, seed, min_require_size):
  """NIID-Bench's `partition_data(..., 'noniid-labeldir')` loop, transcribed (its

  global np.random swapped for one Generator, `shuffle` for `permutation`).
  """
  rng = np.random.default_rng(seed)
  n = labels.shape[0]
  min_size = 0
  while min_size < min_require_size:
    idx_batch = [[] for _ in range(num_clients)]
    for k in np.unique(labels):
      idx_k = rng.permutation(np.where(labels == k)[0])
      proportions = rng.dirichlet(np.repeat(beta, num_clients))
      proportions = np.array([p * (len(idx_j) < n / num_clients)
                              for p, idx_j in zip(proportions, idx_batch)])
      proportions = proportions / proportions.sum()
      proportions = (np.cumsum(proportions) * len(idx_k)).astype(int)[:-1]
      idx_batch = [idx_j + idx.tolist()
                   for idx_j, idx in zip(idx_batch, np.split(idx_k, proportions))]
      min_size = min(len(idx_j) for idx_j in idx_batch)
  return [rng.permutation(np.array(b)) for b in idx_batch]


# ----------------------------------------------------------------------------
# Task assignment


@pytest.mark.parametrize('n,t', [(30, 8), (8, 8), (10, 3), (31, 30)])
def test_zeta_t_zero_gives_one_task_per_client_spread_evenly(n, t):
  a = mt.assign_tasks(n, t, 0., seed=3)
  assert a.shape == (n, t) and a.dtype == bool
  np.testing.assert_array_equal(a.sum(1), 1)
  per_task = a.sum(0)
  assert per_task.min() == n // t and per_task.max() == math.ceil(n / t)


def test_zeta_t_zero_paper_layout():
  # Table 1: 30 clients, 8 tasks -> 3 or 4 clients per task.
  per_task = mt.assign_tasks(30, 8, 0, seed=0).sum(0)
  assert sorted(per_task.tolist()) == [3, 3, 4, 4, 4, 4, 4, 4]


@pytest.mark.parametrize('zeta_t', [0.05, 0.1, 0.5, 1., 10.])
def test_dirichlet_assignment_covers_every_task_and_client(zeta_t):
  for seed in range(20):
    a = mt.assign_tasks(30, 8, zeta_t, seed=seed)
    assert a.any(0).all() and a.any(1).all()


def test_more_tasks_than_clients_is_fine_when_clients_may_hold_several():
  a = mt.assign_tasks(5, 30, 0.2, seed=0)
  assert a.any(0).all() and a.any(1).all()


def test_mean_tasks_per_client_matches_spec_simulation():
  # spec matu §7 item 10 (2,000 draws): T=8 -> 1.85, 2.25, 2.8; T=30 -> 5.6, 7.4, 9.8.
  table = {(8, .1): 1.85, (8, .2): 2.25, (8, .5): 2.8, (30, .1): 5.6, (30, .2): 7.4,
           (30, .5): 9.8}
  for (t, zeta_t), want in table.items():
    k = np.mean([mt.assign_tasks(30, t, zeta_t, seed=s).sum(1).mean() for s in range(200)])
    assert abs(k - want) < .05 * want, (t, zeta_t, k)
  # A lower threshold gives more tasks per client (spec: 0.75/T -> about 3.37 at T=8, 0.5).
  k = np.mean([mt.assign_tasks(30, 8, .5, seed=s, task_threshold=.75).sum(1).mean()
               for s in range(200)])
  assert 3.2 < k < 3.6


def test_infinite_zeta_t_gives_every_task_to_every_client():
  for zeta_t in (None, float('inf')):
    assert mt.assign_tasks(7, 3, zeta_t).all()


def test_assignment_is_deterministic_in_the_seed():
  np.testing.assert_array_equal(mt.assign_tasks(30, 8, .5, seed=1),
                                mt.assign_tasks(30, 8, .5, seed=1))
  assert not np.array_equal(mt.assign_tasks(30, 8, .5, seed=1), mt.assign_tasks(30, 8, .5, seed=2))
  assert not np.array_equal(mt.assign_tasks(30, 8, 0, seed=1), mt.assign_tasks(30, 8, 0, seed=2))


# ----------------------------------------------------------------------------
# Within-task label split


@pytest.mark.parametrize('zeta_c', [0.1, 1., 100., None, float('inf')])
def test_split_is_a_partition_with_min_size(zeta_c):
  parts = mt.split_by_label(LABELS, 6, zeta_c, seed=0)
  assert len(parts) == 6
  assert all(p.dtype == np.int64 for p in parts)
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))
  assert min(len(p) for p in parts) >= mt.DEFAULT_MIN_SIZE


def test_iid_split_is_equal():
  sizes = [len(p) for p in mt.split_by_label(LABELS, 7, None, seed=0)]
  assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_split_matches_niid_bench_loop(seed):
  ours = mt.split_by_label(LABELS[:700], 5, 0.3, seed=seed, min_size=10)
  ref = _niid_bench_reference(LABELS[:700], 5, 0.3, seed, 10)
  for a, b in zip(ours, ref):
    np.testing.assert_array_equal(a, b)


def test_smaller_zeta_c_skews_labels_more():
  ent = {z: np.mean([_entropy(LABELS, mt.split_by_label(LABELS, 5, z, seed=s))
                     for s in range(3)]) for z in (0.1, 1., 100.)}
  print('mean per-client label entropy (nats, max %.3f):' % np.log(10), ent)
  assert ent[0.1] < ent[1.] < ent[100.]
  assert ent[100.] > .95 * np.log(10)  # nearly uniform
  assert ent[0.1] < .7 * np.log(10)


def test_balancing_caps_client_sizes():
  # Each client stops receiving once it holds n / N_t samples, so it can exceed that
  # by at most one class's worth of samples.
  n, k = len(LABELS), 5
  for seed in range(5):
    sizes = [len(p) for p in mt.split_by_label(LABELS, k, 0.1, seed=seed)]
    assert max(sizes) < n / k + n / 10


def test_split_is_deterministic_in_the_seed():
  a = mt.split_by_label(LABELS, 4, .5, seed=7)
  b = mt.split_by_label(LABELS, 4, .5, seed=7)
  c = mt.split_by_label(LABELS, 4, .5, seed=8)
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c))


# ----------------------------------------------------------------------------
# Full allocation


@pytest.mark.parametrize('zeta_t,zeta_c', [(0., .1), (.5, .1), (.5, None), (None, 1.)])
def test_allocation_partitions_every_task_among_its_clients(zeta_t, zeta_c):
  sizes = [1500, 1200, 900, 1500, 1000, 1500, 1300, 1500]
  labels = [np.arange(n) % c for n, c in zip(sizes, [10, 10, 10, 6, 8, 6, 8, 5])]
  al = mt.allocate(labels, 12, zeta_t, zeta_c, seed=0)
  assert al.num_clients == 12 and al.num_tasks == 8
  for n in range(12):
    assert sorted(al.indices[n]) == al.tasks_of(n).tolist()
    assert len(al.tasks_of(n)) >= 1
  for t, y in enumerate(labels):
    clients = al.clients_of(t)
    assert len(clients) >= 1
    idx = np.concatenate([al.indices[n][t] for n in clients])
    np.testing.assert_array_equal(np.sort(idx), np.arange(len(y)))  # disjoint and covering
    assert min(len(al.indices[n][t]) for n in clients) >= mt.DEFAULT_MIN_SIZE
  if zeta_t == 0:
    np.testing.assert_array_equal(al.assignment.sum(1), 1)


def test_allocation_is_deterministic():
  labels = [np.arange(1000) % 10, np.arange(800) % 5]
  a = mt.allocate(labels, 6, .5, .1, seed=4)
  b = mt.allocate(labels, 6, .5, .1, seed=4)
  c = mt.allocate(labels, 6, .5, .1, seed=5)
  np.testing.assert_array_equal(a.assignment, b.assignment)
  for x, y in zip(a.indices, b.indices):
    assert x.keys() == y.keys() and all(np.array_equal(x[t], y[t]) for t in x)
  assert not (np.array_equal(a.assignment, c.assignment)
              and all(np.array_equal(a.indices[n][t], c.indices[n][t])
                      for n in range(6) for t in a.indices[n]))


# ----------------------------------------------------------------------------
# Participation


def test_participants_size_sorted_distinct():
  for n, xi, m in [(30, .2, 6), (30, 1., 30), (10, .25, 3), (7, .01, 1), (30, 1 / 3, 10)]:
    assert mt.num_participants(n, xi) == m
    for r in range(5):
      p = mt.sample_participants(n, xi, r, seed=0)
      assert p.shape == (m,)
      assert np.all(np.diff(p) > 0) and p.min() >= 0 and p.max() < n


def test_participants_vary_by_round_and_are_deterministic():
  rounds = [tuple(mt.sample_participants(30, .2, r, seed=0)) for r in range(20)]
  assert len(set(rounds)) > 15
  assert rounds == [tuple(mt.sample_participants(30, .2, r, seed=0)) for r in range(20)]
  assert rounds != [tuple(mt.sample_participants(30, .2, r, seed=1)) for r in range(20)]
  np.testing.assert_array_equal(mt.sample_participants(30, 1., 3), np.arange(30))


def test_participation_is_uniform():
  counts = np.zeros(30)
  for r in range(2000):
    counts[mt.sample_participants(30, .2, r, seed=0)] += 1
  freq = counts / 2000
  assert np.abs(freq - .2).max() < .04  # binomial std is about 0.009


# ----------------------------------------------------------------------------
# Bad inputs


@pytest.mark.parametrize('call,match', [
    (lambda: mt.assign_tasks(30, 8, -0.1), r'zeta_t must be a number >= 0'),
    (lambda: mt.assign_tasks(30, 8, float('nan')), r'zeta_t must be'),
    (lambda: mt.assign_tasks(30, 8, '0.1'), r'zeta_t must be'),
    (lambda: mt.assign_tasks(5, 8, 0.), r'num_tasks <= num_clients'),
    (lambda: mt.assign_tasks(0, 8, .5), r'num_clients must be an integer >= 1'),
    (lambda: mt.assign_tasks(30, 0, .5), r'num_tasks must be an integer >= 1'),
    (lambda: mt.assign_tasks(30, 8, .5, task_threshold=0), r'task_threshold must be > 0'),
    (lambda: mt.split_by_label(LABELS, 5, -1.), r'zeta_c must be a number >= 0'),
    (lambda: mt.split_by_label(LABELS, 5, 0.), r'zeta_c must be > 0'),
    (lambda: mt.split_by_label(LABELS, 300, 1.), r'cannot give 300 clients at least 10'),
    (lambda: mt.split_by_label(LABELS - 1, 5, 1.), r'non-negative integers'),
    (lambda: mt.split_by_label(LABELS * .5, 5, 1.), r'non-negative integers'),
    (lambda: mt.split_by_label(LABELS[:200], 15, .01, max_tries=5), r'raise zeta_c'),
    (lambda: mt.allocate([], 5, .5, .5), r'at least one task'),
    (lambda: mt.sample_participants(30, 0., 0), r'xi must be in \(0, 1\]'),
    (lambda: mt.sample_participants(30, 1.5, 0), r'xi must be in \(0, 1\]'),
    (lambda: mt.sample_participants(30, -.2, 0), r'xi must be in \(0, 1\]'),
    (lambda: mt.sample_participants(30, True, 0), r'xi must be in \(0, 1\]'),
    (lambda: mt.sample_participants(30, .2, -1), r'round must be an integer >= 0'),
    (lambda: mt.sample_participants(0, .2, 0), r'num_clients must be an integer >= 1'),
])
def test_bad_inputs_raise_one_clear_line(call, match):
  with pytest.raises(ValueError, match=match) as e:
    call()
  assert isinstance(e.value, ConfigError) and '\n' not in str(e.value)


def test_conflict_groups_span_the_asked_number_of_clusters():
  """MaTU Fig. 6a's groups: level 0 = one cluster, 2 = two, 3 = three; greedy cover."""
  clusters = [['a', 'b', 'c', 'd'], ['e', 'f', 'g'], ['h']]
  where = {t: i for i, c in enumerate(clusters) for t in c}
  for level, spans in ((0, 1), (2, 2), (3, 3)):
    groups = mt.conflict_groups(clusters, level, 10)
    assert groups and len(groups) <= 10
    for g in groups:
      assert len(g) == 3 and len({where[t] for t in g}) == spans
    held = {t for g in groups for t in g}
    if level:  # every task is in some group of 2 or 3 clusters
      assert held == set(where)
    else:  # 'h' (a cluster of one) cannot be in a group of one cluster
      assert held == set(where) - {'h'}
  for bad in (1, 4):
    with pytest.raises(ConfigError, match='valid levels: 0, 2, 3'):
      mt.conflict_groups(clusters, bad, 10)


def test_a_failed_split_names_its_task_and_the_settings_to_change():
  # One example per class (a small copy of a 397-class task): every class's single
  # example goes to one client, so no Dirichlet(0.1) split over 10 clients gives each 10.
  labels = [np.arange(1000) % 5, np.arange(397)]
  with pytest.raises(ConfigError, match=r'^task sun397: no Dirichlet\(0\.1\) split of 397 '
                     r'samples over 10 clients .* in 50 tries; raise many\.zeta_c, lower '
                     r'many\.min_size'):
    mt.allocate(labels, 10, None, 0.1, seed=0, names=['mnist', 'sun397'], fields='many.',
                max_tries=50)
  a = mt.allocate(labels, 10, None, 0.1, seed=0, min_size=0, names=['mnist', 'sun397'])
  assert sorted(np.concatenate([a.indices[c][1] for c in range(10)]).tolist()) == list(range(397))
