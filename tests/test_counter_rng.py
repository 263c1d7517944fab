"""fedjax_mtl/algorithms/counter_rng.py: the per-entry hashes behave like independent
uniforms and normals (moments, a Kolmogorov-Smirnov test, correlation across keys and
neighbouring entries), and a row's numbers do not depend on how the rows are split."""

import jax
import numpy as np
import scipy.stats

from fedjax_mtl.algorithms import counter_rng


def test_uniforms_and_normals_have_their_distribution():
  k = counter_rng.key(0, 3, 7)
  u = np.asarray(counter_rng.uniform(k, 0, (400, 500))).ravel()
  assert 0 <= u.min() and u.max() < 1
  assert scipy.stats.kstest(u, 'uniform').pvalue > 1e-4
  z = np.asarray(counter_rng.normal(k, 0, (400, 500))).ravel()
  assert scipy.stats.kstest(z, 'norm').pvalue > 1e-4
  m = z.size
  assert abs(z.mean()) < 5 / np.sqrt(m) and abs(z.var() - 1) < 5 * np.sqrt(2 / m)
  # Neighbouring entries and other keys (seed, round) are uncorrelated.
  bound = 5 / np.sqrt(m)
  assert abs(np.corrcoef(z[:-1], z[1:])[0, 1]) < bound
  for other in (counter_rng.key(1, 3, 7), counter_rng.key(0, 4, 7)):
    z2 = np.asarray(counter_rng.normal(other, 0, (400, 500))).ravel()
    assert abs(np.corrcoef(z, z2)[0, 1]) < bound


def test_a_rows_numbers_do_not_depend_on_the_split():
  k = counter_rng.key(5)
  whole = np.asarray(counter_rng.uniform(k, 0, (6, 3, 4)))
  parts = [np.asarray(counter_rng.uniform(k, lo, (n, 3, 4))) for lo, n in ((0, 2), (2, 4))]
  np.testing.assert_array_equal(np.concatenate(parts), whole)
  assert len(np.unique(whole)) == whole.size
  assert jax.jit(lambda: counter_rng.key(5))() == k
