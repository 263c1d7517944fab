"""Client layouts and data partitions (spec fedhca2.md §1, reference-code.md §1.4)."""

import hashlib
import itertools
import re

import numpy as np
import pytest

from fedjax_mtl import scenarios
from fedjax_mtl.defaults import base_config
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.tasks import DATASETS

PAPER_N = {'pascal': 4998, 'nyud': 795}
P_ORDER = ('semseg', 'human_parts', 'normals', 'edge', 'sal')  # released task_dict order


def config(scenario, **overrides):
  c = base_config()
  c.scenario = scenario
  for k, v in overrides.items():
    c[k] = v
  return c


def build(scenario, num_train=None, labels=None, **overrides):
  return scenarios.build_clients(
      config(scenario, **overrides), num_train or PAPER_N,
      parts_filter=None if labels is None else scenarios.label_parts_filter(labels))


def by_kind(clients, dataset, kind):
  return [c for c in clients if c.dataset == dataset and c.kind == kind]


def human_labels(rng, n, frac=0.4, hw=(3, 4)):
  """Per-dataset train labels where ~frac of the PASCAL images contain humans."""
  has = rng.uniform(size=n) < frac
  hp = np.full((n,) + hw, 255, np.uint8)
  hp[has] = rng.integers(0, 7, size=(int(has.sum()),) + hw)
  hp[has, 0, 0] = 1  # at least one part pixel
  return {'pascal': {'human_parts': hp, 'semseg': np.zeros((n,) + hw, np.uint8)},
          'nyud': {'semseg': np.zeros((1,) + hw, np.uint8)}}, has


# ----------------------------------------------------------------------------
# Layouts


def test_required_layouts_exist():
  for name in ('pascal_st_nyud_mt_1c', 'pascal_st_nyud_mt_2c', 'pascal_st_nyud_mt_4c',
               'nyud_st_pascal_mt_1c', 'mt_only'):
    assert name in scenarios.LAYOUTS
    assert scenarios.layout(name) is scenarios.LAYOUTS[name]


@pytest.mark.parametrize('name,st,mt,n_clients,n_decoders', [
    # Spec §1: N clients, K decoders.
    ('pascal_st_nyud_mt_1c', ('pascal', 5), ('nyud', 1), 6, 9),
    ('pascal_st_nyud_mt_2c', ('pascal', 10), ('nyud', 2), 12, 18),
    ('pascal_st_nyud_mt_4c', ('pascal', 20), ('nyud', 4), 24, 36),
    ('nyud_st_pascal_mt_1c', ('nyud', 4), ('pascal', 1), 5, 9),
])
def test_client_and_decoder_counts(name, st, mt, n_clients, n_decoders):
  clients = build(name)
  assert len(clients) == n_clients
  assert sum(len(c.tasks) for c in clients) == n_decoders
  st_clients = [c for c in clients if c.kind == 'st']
  mt_clients = [c for c in clients if c.kind == 'mt']
  assert len(st_clients) == st[1] and {c.dataset for c in st_clients} == {st[0]}
  assert len(mt_clients) == mt[1] and {c.dataset for c in mt_clients} == {mt[0]}
  assert all(len(c.tasks) == 1 for c in st_clients)
  # One ST client per task of the dataset per copy; MT clients hold all tasks.
  copies = st[1] // len(DATASETS[st[0]].tasks)
  counts = {t: sum(c.tasks == (t,) for c in st_clients) for t in DATASETS[st[0]].tasks}
  assert counts == {t: copies for t in DATASETS[st[0]].tasks}
  for c in mt_clients:
    assert c.tasks == tuple(sorted(DATASETS[mt[0]].tasks))


def test_mt_only_layout():
  clients = build('mt_only')
  assert [(c.dataset, c.kind, c.tasks) for c in clients] == [
      ('pascal', 'mt', ('human_parts', 'normals', 'semseg')),
      ('nyud', 'mt', ('normals', 'semseg'))]
  assert sum(len(c.tasks) for c in clients) == 5  # Tab. 5: N = 2, K = 5
  # Each MT client of 1 copy gets its whole train set.
  for c in clients:
    np.testing.assert_array_equal(c.train_indices, np.arange(PAPER_N[c.dataset]))


@pytest.mark.parametrize('name,dataset', [('nyud_st', 'nyud'), ('pascal_st', 'pascal')])
def test_st_only_layouts(name, dataset):
  clients = build(name)
  assert all(c.kind == 'st' and c.dataset == dataset for c in clients)
  assert sorted(c.tasks[0] for c in clients) == sorted(DATASETS[dataset].tasks)


def test_st_order_follows_task_order_repeated_per_copy():
  clients = build('pascal_st_nyud_mt_2c')
  st = [c.tasks[0] for c in clients if c.kind == 'st']
  assert st == [t for t in P_ORDER for _ in range(2)]
  st1 = [c.tasks[0] for c in build('nyud_st_pascal_mt_1c') if c.kind == 'st']
  assert st1 == ['semseg', 'normals', 'edge', 'depth']


@pytest.mark.parametrize('name', sorted(scenarios.LAYOUTS))
def test_st_clients_listed_before_mt_and_mt_tasks_sorted(name):
  clients = build(name)
  kinds = [c.kind for c in clients]
  assert kinds == sorted(kinds, key=lambda k: k != 'st')
  for c in clients:
    if c.kind == 'mt':
      assert list(c.tasks) == sorted(c.tasks) and len(c.tasks) > 1
    for t in c.tasks:
      assert t in DATASETS[c.dataset].tasks
  names = [c.name for c in clients]
  assert len(set(names)) == len(names)


def test_st_before_mt_even_if_layout_lists_mt_first(monkeypatch):
  blocks = [scenarios._mt('nyud', ('semseg', 'depth')), scenarios._st('pascal', ('sal', 'edge'))]
  monkeypatch.setitem(scenarios.LAYOUTS, 'mt_first', blocks)
  num = {'pascal': 40, 'nyud': 30}
  clients = build('mt_first', num_train=num, split_seed=5)
  assert [(c.dataset, c.kind, c.tasks) for c in clients] == [
      ('pascal', 'st', ('sal',)), ('pascal', 'st', ('edge',)),
      ('nyud', 'mt', ('depth', 'semseg'))]
  # ST permutation is drawn first from the split RNG, MT second.
  rs = np.random.RandomState(5)
  st_chunks = np.array_split(rs.permutation(40), 2)
  mt_chunks = np.array_split(rs.permutation(30), 1)
  for c, want in zip(clients, st_chunks + mt_chunks):
    np.testing.assert_array_equal(c.train_indices, np.sort(want))


# ----------------------------------------------------------------------------
# Partitions


@pytest.mark.parametrize('name,sizes', [
    # Spec §1 [R]: chunk sizes of the paper's splits.
    ('pascal_st_nyud_mt_1c', {('pascal', 'st'): [1000] * 3 + [999] * 2, ('nyud', 'mt'): [795]}),
    ('pascal_st_nyud_mt_2c', {('pascal', 'st'): [500] * 8 + [499] * 2,
                              ('nyud', 'mt'): [398, 397]}),
    ('pascal_st_nyud_mt_4c', {('pascal', 'st'): [250] * 18 + [249] * 2,
                              ('nyud', 'mt'): [199] * 3 + [198]}),
    ('nyud_st_pascal_mt_1c', {('nyud', 'st'): [199] * 3 + [198], ('pascal', 'mt'): [4998]}),
])
def test_paper_chunk_sizes(name, sizes):
  clients = build(name)
  for (dataset, kind), want in sizes.items():
    got = sorted((c.num_train for c in by_kind(clients, dataset, kind)), reverse=True)
    assert got == want


@pytest.mark.parametrize('name', sorted(scenarios.LAYOUTS))
@pytest.mark.parametrize('num_train', [{'pascal': 173, 'nyud': 91}, PAPER_N])
def test_splits_disjoint_cover_and_equal_within_dataset_kind(name, num_train):
  clients = build(name, num_train=num_train, batch_size=2)
  groups = {}
  for c in clients:
    assert c.num_train == len(c.train_indices)
    assert np.all(np.diff(c.train_indices) > 0)  # sorted, no duplicates
    assert c.train_indices.min() >= 0 and c.train_indices.max() < num_train[c.dataset]
    groups.setdefault((c.dataset, c.kind), []).append(c)
  for (dataset, _), members in groups.items():
    for a, b in itertools.combinations(members, 2):
      assert not np.intersect1d(a.train_indices, b.train_indices).size
    union = np.concatenate([m.train_indices for m in members])
    np.testing.assert_array_equal(np.sort(union), np.arange(num_train[dataset]))
    sizes = [m.num_train for m in members]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize('name,first,second', [
    ('pascal_st_nyud_mt_1c', 'pascal', 'nyud'),
    ('pascal_st_nyud_mt_4c', 'pascal', 'nyud'),
    ('nyud_st_pascal_mt_1c', 'nyud', 'pascal'),
])
@pytest.mark.parametrize('seed', [0, 3])
def test_partition_matches_released_rng_order(name, first, second, seed):
  # Released utils.py: np.random.seed(seed); per ST dataset then per MT dataset,
  # permutation(N) and array_split into the number of clients.
  clients = build(name, split_seed=seed)
  st = [c for c in clients if c.kind == 'st']
  mt = [c for c in clients if c.kind == 'mt']
  rs = np.random.RandomState(seed)
  want = (np.array_split(rs.permutation(PAPER_N[first]), len(st))
          + np.array_split(rs.permutation(PAPER_N[second]), len(mt)))
  for c, w in zip(st + mt, want):
    np.testing.assert_array_equal(c.train_indices, np.sort(w))


def test_deterministic_by_split_seed():
  a = build('pascal_st_nyud_mt_2c', split_seed=7)
  b = build('pascal_st_nyud_mt_2c', split_seed=7)
  c = build('pascal_st_nyud_mt_2c', split_seed=8)
  assert [x.name for x in a] == [x.name for x in b] == [x.name for x in c]
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x.train_indices, y.train_indices)
  assert any(not np.array_equal(x.train_indices, z.train_indices) for x, z in zip(a, c))
  # The global NumPy RNG is neither used nor disturbed.
  np.random.seed(123)
  before = np.random.rand()
  np.random.seed(123)
  build('pascal_st_nyud_mt_1c', split_seed=7)
  assert np.random.rand() == before


def test_local_epochs_from_config_with_dataset_defaults():
  clients = build('pascal_st_nyud_mt_1c')  # the default config's: 2 PASCAL epochs a round
  assert {c.dataset: c.local_epochs for c in clients} == {'pascal': 2, 'nyud': 4}
  clients = build('pascal_st_nyud_mt_1c', local_epochs={'pascal': 3, 'nyud': 2})
  assert {c.dataset: c.local_epochs for c in clients} == {'pascal': 3, 'nyud': 2}
  clients = build('pascal_st_nyud_mt_1c', local_epochs={'pascal': 2})
  assert {c.dataset: c.local_epochs for c in clients} == {
      'pascal': 2, 'nyud': DATASETS['nyud'].default_local_epochs}


# ----------------------------------------------------------------------------
# Human filter for human_parts-only clients


@pytest.mark.parametrize('name', ['pascal_st_nyud_mt_1c', 'pascal_st_nyud_mt_2c'])
def test_parts_only_clients_keep_only_images_with_humans(name):
  rng = np.random.default_rng(0)
  labels, has = human_labels(rng, PAPER_N['pascal'])
  plain = build(name)
  filtered = build(name, labels=labels)
  assert [c.name for c in plain] == [c.name for c in filtered]
  n_parts = 0
  for p, f in zip(plain, filtered):
    if p.tasks == ('human_parts',):
      n_parts += 1
      # The filter applies to the client's own equal chunk, after the split.
      np.testing.assert_array_equal(f.train_indices, p.train_indices[has[p.train_indices]])
      assert 0 < f.num_train < p.num_train
    else:
      np.testing.assert_array_equal(f.train_indices, p.train_indices)
  assert n_parts == (1 if name.endswith('1c') else 2)


def test_human_filter_can_be_disabled_and_skips_mt_clients():
  rng = np.random.default_rng(1)
  labels, _ = human_labels(rng, PAPER_N['pascal'])
  plain = build('pascal_st_nyud_mt_1c')
  off = build('pascal_st_nyud_mt_1c', labels=labels, parts_clients_humans_only=False)
  for p, o in zip(plain, off):
    np.testing.assert_array_equal(p.train_indices, o.train_indices)
  # MT clients holding human_parts (scenario 2, mt_only) keep all their images.
  for name in ('nyud_st_pascal_mt_1c', 'mt_only'):
    for p, f in zip(build(name), build(name, labels=labels)):
      np.testing.assert_array_equal(p.train_indices, f.train_indices)


# ----------------------------------------------------------------------------
# Errors


def test_unknown_scenario_lists_valid_choices():
  with pytest.raises(ConfigError) as e:
    build('pascal_st_nyud_mt_3c')
  msg = str(e.value)
  assert 'pascal_st_nyud_mt_3c' in msg
  for name in scenarios.LAYOUTS:
    assert repr(name) in msg


def test_more_clients_than_images_is_a_config_error():
  # The message names both counts (not just an empty client further down).
  with pytest.raises(ConfigError, match=r'impossible split: 20 .*pascal.* 19 '):
    build('pascal_st_nyud_mt_4c', num_train={'pascal': 19, 'nyud': 100}, batch_size=1)
  with pytest.raises(ConfigError, match=r'impossible split: 4 .*nyud.* 3 '):
    build('pascal_st_nyud_mt_4c', num_train={'pascal': 100, 'nyud': 3}, batch_size=1)
  build('pascal_st_nyud_mt_4c', num_train={'pascal': 20, 'nyud': 4}, batch_size=1)


def test_fewer_images_than_batch_size_is_a_config_error():
  # 5 ST clients over 39 images -> chunks of 8 and 7 < batch_size 8.
  with pytest.raises(ConfigError, match='batch_size=8'):
    build('pascal_st_nyud_mt_1c', num_train={'pascal': 39, 'nyud': 100}, batch_size=8)
  build('pascal_st_nyud_mt_1c', num_train={'pascal': 40, 'nyud': 100}, batch_size=8)
  # The human filter can push the parts client below the batch size.
  labels, has = human_labels(np.random.default_rng(2), 40, frac=0.3)
  with pytest.raises(ConfigError, match='human_parts'):
    build('pascal_st_nyud_mt_1c', num_train={'pascal': 40, 'nyud': 100}, labels=labels,
          batch_size=8)


# ----------------------------------------------------------------------------
# split='equal' (the default) and split='dirichlet'


def digest(clients):
  h = hashlib.sha256()
  for c in clients:
    h.update(c.name.encode())
    h.update(np.asarray(c.train_indices, np.int64).tobytes())
    h.update(np.asarray(c.draw_indices, np.int64).tobytes())
  return h.hexdigest()[:16]


@pytest.mark.parametrize('name,seed,want', [
    # Computed with the code before config.split existed (the same names, train and
    # draw indices, human filter included).
    ('pascal_st_nyud_mt_2c', 0, '5a1a4aaa0172b0c6'),
    ('nyud_st_pascal_mt_1c', 3, '58885d84c488c3b4'),
    ('pascal_st_nyud_mt_4c', 11, '34d7d7625166441e'),
])
def test_equal_split_is_bit_identical_to_before(name, seed, want):
  labels, _ = human_labels(np.random.default_rng(0), PAPER_N['pascal'])
  assert digest(build(name, labels=labels, split_seed=seed)) == want
  assert digest(build(name, labels=labels, split_seed=seed, split='equal',
                      split_alpha=0.01)) == want


# A PASCAL-sized attribute: 20 values (-1 = no object, as `dominant_class` gives), one
# of them (the person) at 30 %, as in the synthetic scenes.
ATTR = np.random.default_rng(0).choice(
    np.arange(-1, 19), size=PAPER_N['pascal'], p=np.r_[0.3, np.full(19, 0.7 / 19)])


def attr_of(dataset, idx):
  return ATTR[idx] if dataset == 'pascal' else np.asarray(idx) % 3


def dirichlet(scenario='pascal_st_nyud_mt_2c', alpha=0.5, labels=None, **overrides):
  return scenarios.build_clients(
      config(scenario, split='dirichlet', split_alpha=alpha, **overrides), PAPER_N,
      parts_filter=None if labels is None else scenarios.label_parts_filter(labels),
      attribute=attr_of)


def mean_tv(clients, dataset='pascal'):
  """Mean total-variation distance of the clients' attribute histograms from the pooled."""
  pooled = np.bincount(ATTR + 1, minlength=20) / len(ATTR)
  tv = [0.5 * np.abs(np.bincount(ATTR[c.train_indices] + 1, minlength=20) / c.num_train
                     - pooled).sum() for c in clients if c.dataset == dataset]
  return float(np.mean(tv))


@pytest.mark.parametrize('alpha', [0.05, 1.0, 1000.0])
def test_dirichlet_shares_are_disjoint_and_cover_all_but_the_filtered(alpha):
  labels, has = human_labels(np.random.default_rng(3), PAPER_N['pascal'])
  clients = dirichlet(alpha=alpha, labels=labels, batch_size=4)
  assert [c.name for c in clients] == [c.name for c in build('pascal_st_nyud_mt_2c')]
  for (dataset, kind) in (('pascal', 'st'), ('nyud', 'mt')):
    members = by_kind(clients, dataset, kind)
    drawn = np.concatenate([c.draw_indices for c in members])
    np.testing.assert_array_equal(np.sort(drawn), np.arange(PAPER_N[dataset]))
    kept = np.concatenate([c.train_indices for c in members])
    assert len(np.unique(kept)) == len(kept)
    for c in members:
      assert np.all(np.diff(c.train_indices) > 0) and c.num_train >= 4
      want = np.sort(c.draw_indices)
      if c.tasks == ('human_parts',):  # the filter applies to the client's share, after
        want = want[has[want]]
      np.testing.assert_array_equal(c.train_indices, want)


def test_dirichlet_skew_follows_alpha():
  # 10 clients, 20 values, 3 seeds each. Measured over 30 seeds: alpha = 0.05 gives a
  # mean TV of 0.69-0.82 (most values on one client each), alpha = 1000 0.012-0.015
  # (Dir(1000) shares vary by sqrt(9 / 10001) ~ 3 % around 1/10, TV ~ 0.5 * 0.8 * 3 %),
  # and random equal chunks 0.062-0.075 (sampling noise): the low bound cannot be met
  # without dividing each value separately, the high one not without skew.
  for seed in range(3):
    skewed = mean_tv(dirichlet(alpha=0.05, split_seed=seed))
    iid = mean_tv(dirichlet(alpha=1000.0, split_seed=seed))
    chunks = mean_tv(build('pascal_st_nyud_mt_2c', split_seed=seed))
    assert skewed > 0.5, skewed
    assert iid < 0.03 < chunks < 0.1, (iid, chunks)


def test_dirichlet_is_deterministic_in_split_seed():
  a, b, c = (dirichlet(alpha=0.3, split_seed=s) for s in (7, 7, 8))
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x.train_indices, y.train_indices)
    np.testing.assert_array_equal(x.draw_indices, y.draw_indices)
  assert any(not np.array_equal(x.train_indices, z.train_indices) for x, z in zip(a, c))
  np.random.seed(123)
  before = np.random.rand()
  np.random.seed(123)
  dirichlet(alpha=0.3, split_seed=7)
  assert np.random.rand() == before


def test_dirichlet_single_client_gets_everything_as_the_equal_split():
  # A (dataset, kind) of one client draws one permutation, as the equal split does.
  for e, d in zip(build('mt_only', split_seed=4), dirichlet('mt_only', split_seed=4)):
    np.testing.assert_array_equal(e.draw_indices, d.draw_indices)
    np.testing.assert_array_equal(d.train_indices, np.arange(PAPER_N[d.dataset]))
  (nyud,) = by_kind(dirichlet('pascal_st_nyud_mt_1c', alpha=0.1), 'nyud', 'mt')
  np.testing.assert_array_equal(nyud.train_indices, np.arange(PAPER_N['nyud']))


def test_dirichlet_tiny_alpha_puts_each_value_on_one_client():
  # Below alpha ~ 1e-3 the legacy sampler's gammas underflow (0/0): the limit is used.
  clients = by_kind(dirichlet('pascal_st_nyud_mt_1c', alpha=1e-6, batch_size=1),
                    'pascal', 'st')
  for v in np.unique(ATTR):
    assert sum(np.any(ATTR[c.train_indices] == v) for c in clients) == 1


def test_dirichlet_redraws_until_every_client_has_a_batch_then_refuses():
  # alpha = 0.3 over 10 clients: the first draw (the RNG's first, ST before MT) leaves
  # a client below 250 images; a later one leaves none.
  first = scenarios.dirichlet_split(np.random.RandomState(0), ATTR, 10, 0.3)
  assert min(len(s) for s in first) < 250
  clients = dirichlet(alpha=0.3, batch_size=250)
  assert min(c.num_train for c in clients) >= 250
  with pytest.raises(ConfigError) as e:
    dirichlet(alpha=0.05, batch_size=400)
  msg = str(e.value)
  assert '\n' not in msg
  assert re.search(r"^split='dirichlet' with split_alpha=0\.05 leaves client pascal/st/\w+ at "
                   r'best \d+ images \(< batch_size=400\) in 100 draws of 10 ST clients on '
                   r"'pascal'; use a larger split_alpha or fewer clients$", msg), msg
  size = int(re.search(r'at best (\d+)', msg).group(1))
  assert size < 400


def test_dominant_class_ignores_background_and_ignore_pixels():
  sem = np.zeros((5, 4, 4), np.uint8)  # background everywhere
  sem[1, :3] = 255
  sem[1, 3, :2] = 7  # 8 ignore, 6 background, 2 of class 7
  sem[2, :2] = 1
  sem[2, 2, 0] = 9  # class 1 (NYUD's floor) 8 pixels, class 9 one
  sem[3] = 255  # no labelled pixel
  sem[4, :, :3] = 4
  sem[4, :, 3] = 5
  hist = scenarios.label_histograms(sem)
  np.testing.assert_array_equal(hist.sum(axis=1), 16)
  assert hist[1, 255] == 12 and hist[1, 7] == 2
  labels = {'pascal': {'semseg': sem}, 'nyud': {'semseg': sem}}
  attribute = scenarios.label_attribute(labels)
  np.testing.assert_array_equal(attribute('pascal', np.arange(5)), [-1, 7, 1, -1, 4])
  # NYUD's wall (0) and floor (1) fill most rooms: the objects decide.
  np.testing.assert_array_equal(attribute('nyud', np.array([2, 4, 0])), [9, 4, -1])


def test_split_summary_reports_counts_and_top_share():
  clients = dirichlet('pascal_st_nyud_mt_1c', alpha=0.1, split_seed=1)
  text = scenarios.split_summary(clients, attr_of)
  assert '\n' not in text
  items = text.split('; ')
  assert len(items) == len(clients)
  for c, item in zip(clients, items):
    values, counts = np.unique(attr_of(c.dataset, c.train_indices), return_counts=True)
    share = counts.max() / c.num_train
    assert item == f'{c.name} {c.num_train} (class {values[counts.argmax()]}: {share:.0%})'


def test_real_data_attribute_reads_the_cached_semseg(tmp_path):
  from fake_datasets import make_pascal
  from fedjax_mtl.data import cache as cache_lib
  from fedjax_mtl.data import real
  ids = [f'2008_{i:06d}' for i in range(1, 9)]
  make_pascal(str(tmp_path / 'PASCALContext'), ids=ids)
  out = cache_lib.prepare('pascal', str(tmp_path / 'PASCALContext'), 'train',
                          str(tmp_path / 'cache' / 'pascal_train'), verbose=False)
  ds = cache_lib.CachedDataset(out, tasks=('semseg',))
  want = scenarios.dominant_class(
      np.stack([np.bincount(ds[i]['semseg'].ravel(), minlength=256) for i in range(len(ds))]),
      'pascal')
  c = config('pascal_st', split='dirichlet')
  c.data.source, c.data.data_dir = 'real', str(tmp_path)
  attribute = real.semseg_attribute(c)
  np.testing.assert_array_equal(attribute('pascal', np.arange(len(ds))), want)
  np.testing.assert_array_equal(attribute('pascal', np.array([5, 2])), want[[5, 2]])
