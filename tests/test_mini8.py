"""mini8 benchmark: formats, determinism, relatedness structure, balance, learnability."""

import numpy as np
import pytest

from fedjax_mtl.data import mini8
from fedjax_mtl.errors import ConfigError

N = 64


@pytest.fixture(scope='module')
def full():
  """Every task at the default sizes: {task: (train images, train labels, test ...)}."""
  out = {}
  for task in mini8.TASKS:
    x, y = mini8.load(task, 'train', dtype=np.float32)
    xt, yt = mini8.load(task, 'test', dtype=np.float32)
    out[task] = (x, y, xt, yt)
  return out


# ----------------------------------------------------------------------------
# Formats


def test_task_list_and_constants():
  assert len(mini8.TASKS) == 8 and len(set(mini8.TASKS)) == 8
  for task in mini8.TASKS:
    assert 5 <= mini8.num_classes(task) <= 10
  for a, b in mini8.RELATED_PAIRS + mini8.CONFLICTING_PAIRS:
    assert a in mini8.TASKS and b in mini8.TASKS and a != b
  assert not set(mini8.RELATED_PAIRS) & set(mini8.CONFLICTING_PAIRS)
  assert len(mini8.SHAPE_NAMES) == mini8.num_classes('shapes')
  assert len(mini8.HUE_NAMES) == mini8.num_classes('colors')
  assert len(mini8.FREQUENCIES) == mini8.num_classes('texture_freq')


@pytest.mark.parametrize('task', mini8.TASKS)
def test_shapes_dtypes_and_label_ranges(task):
  x, y = mini8.load(task, 'train', num=N, seed=0)
  assert x.shape == (N, 32, 32, 3) and x.dtype == np.uint8
  assert y.shape == (N,) and y.dtype == np.int32
  assert y.min() >= 0 and y.max() < mini8.num_classes(task)
  xf, yf = mini8.load(task, 'train', num=N, seed=0, dtype=np.float32)
  assert xf.dtype == np.float32 and 0. <= xf.min() and xf.max() <= 1.
  np.testing.assert_array_equal(xf, x.astype(np.float32) / 255.)
  np.testing.assert_array_equal(yf, y)
  # Not degenerate: images vary within and across images, and use the range.
  assert x.reshape(N, -1).std(1).min() > 3
  assert len({im.tobytes() for im in x}) == N
  assert x.max() - x.min() > 150


def test_default_sizes_and_resolution():
  x, y = mini8.load('shapes', 'train')
  assert len(x) == len(y) == mini8.TRAIN_SIZE
  x, _ = mini8.load('shapes', 'test')
  assert len(x) == mini8.TEST_SIZE
  for task in mini8.TASKS:
    x, _ = mini8.load(task, 'test', num=4, resolution=48)
    assert x.shape == (4, 48, 48, 3)


# ----------------------------------------------------------------------------
# Determinism


@pytest.mark.parametrize('task', mini8.TASKS)
def test_deterministic_in_seed_and_split(task):
  x0, y0 = mini8.load(task, 'train', num=N, seed=3)
  x1, y1 = mini8.load(task, 'train', num=N, seed=3)
  np.testing.assert_array_equal(x0, x1)
  np.testing.assert_array_equal(y0, y1)
  x2, _ = mini8.load(task, 'train', num=N, seed=4)
  x3, _ = mini8.load(task, 'test', num=N, seed=3)
  assert not np.array_equal(x0, x2)
  assert not np.array_equal(x0, x3)


# ----------------------------------------------------------------------------
# Relatedness structure


@pytest.mark.parametrize('split', mini8.SPLITS)
def test_conflicting_pair_has_same_images_and_permuted_labels(split):
  for a, b in mini8.CONFLICTING_PAIRS:
    xa, ya = mini8.load(a, split, num=200, seed=1)
    xb, yb = mini8.load(b, split, num=200, seed=1)
    np.testing.assert_array_equal(xa, xb)
    assert mini8.num_classes(a) == mini8.num_classes(b)
    # A fixed permutation of the labels without fixed points: every label disagrees.
    c = mini8.num_classes(a)
    mapping = {}
    for u, v in zip(ya.tolist(), yb.tolist()):
      assert mapping.setdefault(u, v) == v
    assert sorted(mapping) == sorted(mapping.values()) == list(range(c))
    assert np.all(ya != yb)
  np.testing.assert_array_equal(
      mini8.load('digits_perm', split, num=50)[1], 9 - mini8.load('digits', split, num=50)[1])


def test_related_digit_tasks_share_label_space_but_not_images():
  xa, ya = mini8.load('digits', 'train', num=N)
  xb, yb = mini8.load('digits_clutter', 'train', num=N)
  assert mini8.num_classes('digits') == mini8.num_classes('digits_clutter') == 10
  assert not np.array_equal(xa, xb)
  # digits are grey (equal channels up to noise), digits_clutter is coloured.
  spread = lambda x: np.abs(x.astype(float) - x.mean(-1, keepdims=True)).mean()
  assert spread(xa) < 1. < 10. < spread(xb)


def test_glyph_font_renders_every_digit_distinctly():
  assert mini8.FONT.shape == (10, 7, 5)
  flat = mini8.FONT.reshape(10, -1)
  assert len({row.tobytes() for row in flat}) == 10


# ----------------------------------------------------------------------------
# Class balance


def test_classes_exactly_balanced(full):
  for task, (_, y, _, yt) in full.items():
    for labels in (y, yt):
      counts = np.bincount(labels, minlength=mini8.num_classes(task))
      assert counts.max() - counts.min() <= 1, (task, counts)


# ----------------------------------------------------------------------------
# Bad inputs


@pytest.mark.parametrize('kwargs,match', [
    (dict(task='mnist'), r"unknown mini8 task 'mnist'; valid choices: 'digits'"),
    (dict(task='digits', split='val'), r"unknown split 'val'; valid choices: 'train', 'test'"),
    (dict(task='digits', num=0), r'mini8 num must be >= 1'),
    (dict(task='digits', dtype=np.int16), r"unknown mini8 dtype 'int16'"),
    (dict(task='digits', resolution=8), r'mini8 resolution must be >= 16'),
])
def test_bad_inputs_raise(kwargs, match):
  with pytest.raises(ConfigError, match=match):
    mini8.load(**kwargs)
  with pytest.raises(ValueError, match='unknown mini8 task'):
    mini8.num_classes('nope')


# ----------------------------------------------------------------------------
# Learnability: a tiny patch network (NumPy, hand-written backprop) per task.
#
# 4x4 patches -> dense 32 + ReLU -> 2x2 patch merge -> dense 64 + ReLU ->
# [mean, max] pooling -> linear head; Adam, 300 steps of 32 images. NumPy rather
# than JAX: under the suite's XLA flags (no LLVM optimisation) this trains several
# times faster. Products are stacked per image, small enough that OpenBLAS runs
# them on one thread (threaded tiny products crawl on a busy 2-core machine).


def _tokens(x):
  """[n, 32, 32, 3] -> [n, 16 cells of 8x8, 4 * 48]: the 4x4 patches of a cell side by side."""
  n = x.shape[0]
  x = x.reshape(n, 4, 2, 4, 4, 2, 4, 3)  # cell y, patch y, pixel y, cell x, patch x, pixel x
  return np.ascontiguousarray(x.transpose(0, 1, 4, 2, 5, 3, 6, 7)).reshape(n, 16, 4 * 48)


def _init(rng, c, d1=32, d2=64):
  f32 = lambda a: a.astype(np.float32)
  return {'w1': f32(rng.normal(0, np.sqrt(2 / 48), (48, d1))), 'b1': np.zeros(d1, np.float32),
          'w2': f32(rng.normal(0, np.sqrt(2 / (4 * d1)), (4 * d1, d2))),
          'b2': np.zeros(d2, np.float32),
          'w3': f32(rng.normal(0, .05, (2 * d2, c))), 'b3': np.zeros(c, np.float32)}


def _forward(p, t):
  n = t.shape[0]
  x = ((t - .5) / .25).reshape(n, 64, 48)
  z1 = np.matmul(x, p['w1']) + p['b1']
  h1 = np.maximum(z1, 0).reshape(n, 16, -1)  # merge each cell's 2x2 patches
  z2 = np.matmul(h1, p['w2']) + p['b2']
  h2 = np.maximum(z2, 0)
  arg = h2.argmax(1)
  f = np.concatenate([h2.mean(1), np.take_along_axis(h2, arg[:, None], 1)[:, 0]], -1)
  return f @ p['w3'] + p['b3'], (x, z1, h1, z2, h2, arg, f)


def _loss_and_grad(p, t, y):
  logits, (x, z1, h1, z2, h2, arg, f) = _forward(p, t)
  n = len(y)
  e = np.exp(logits - logits.max(1, keepdims=True))
  prob = e / e.sum(1, keepdims=True)
  loss = -np.log(prob[np.arange(n), y]).mean()
  dl = prob
  dl[np.arange(n), y] -= 1
  dl /= n
  g = {'w3': f.T @ dl, 'b3': dl.sum(0)}
  df = dl @ p['w3'].T
  d2 = h2.shape[-1]
  dh2 = np.repeat(df[:, None, :d2] / h2.shape[1], h2.shape[1], 1)
  np.put_along_axis(dh2, arg[:, None], np.take_along_axis(dh2, arg[:, None], 1)
                    + df[:, None, d2:], 1)
  dz2 = dh2 * (z2 > 0)
  g['w2'] = np.matmul(h1.transpose(0, 2, 1), dz2).sum(0)
  g['b2'] = dz2.sum((0, 1))
  dz1 = np.matmul(dz2, p['w2'].T).reshape(z1.shape) * (z1 > 0)
  g['w1'] = np.matmul(x.transpose(0, 2, 1), dz1).sum(0)
  g['b1'] = dz1.sum((0, 1))
  return loss, g


def _train(t, y, c, steps=300, batch=32, lr=3e-3, seed=0):
  rng = np.random.default_rng(seed)
  p = _init(rng, c)
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v = {k: np.zeros_like(a) for k, a in p.items()}
  for step in range(1, steps + 1):
    i = rng.integers(0, len(y), batch)
    _, g = _loss_and_grad(p, t[i], y[i])
    for k in p:
      m[k] = .9 * m[k] + .1 * g[k]
      v[k] = .999 * v[k] + .001 * g[k] ** 2
      p[k] -= lr * (m[k] / (1 - .9 ** step)) / (np.sqrt(v[k] / (1 - .999 ** step)) + 1e-8)
  return p


def test_tiny_network_gradient_matches_finite_differences():
  rng = np.random.default_rng(0)
  p = {k: v.astype(np.float64) for k, v in _init(rng, 6).items()}
  t = _tokens(rng.uniform(size=(4, 32, 32, 3)))
  y = rng.integers(0, 6, 4)
  _, g = _loss_and_grad(p, t, y)
  eps = 1e-6
  for k in p:
    for _ in range(3):
      j = tuple(rng.integers(0, s) for s in p[k].shape)
      old = p[k][j]
      p[k][j] = old + eps
      up = _loss_and_grad(p, t, y)[0]
      p[k][j] = old - eps
      down = _loss_and_grad(p, t, y)[0]
      p[k][j] = old
      np.testing.assert_allclose(g[k][j], (up - down) / (2 * eps), rtol=1e-4, atol=1e-8)


def test_every_task_is_learnable_but_not_degenerate(full):
  acc = {}
  for task, (x, y, xt, yt) in full.items():
    c = mini8.num_classes(task)
    p = _train(_tokens(x), y, c)
    acc[task] = float((_forward(p, _tokens(xt))[0].argmax(1) == yt).mean())
  print('\nmini8 test accuracy of a tiny patch network (300 steps):')
  for task, a in acc.items():
    c = mini8.num_classes(task)
    print(f'  {task:15s} {a:.3f}  (chance {1 / c:.3f}, {a * c:.1f}x)')
  for task, a in acc.items():
    assert a >= 1.5 / mini8.num_classes(task), (task, a)
  assert min(acc.values()) < .9  # not all trivially solved
