"""scripts/task_relatedness.py: sign vs cosine similarity of task vectors (MaTU Figs.
2–3), its clustering, the task vectors of a many-task state, and the script end to end."""

import json
import os
import sys
import types

import numpy as np
import pytest

from conftest import override, snapshot
from fedjax_mtl.defaults import base_config

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'scripts'))
import task_relatedness as tr  # noqa: E402


def _reference(v):
  """float64 S by loops over coordinates, cosine, and Pearson by the textbook formula."""
  v = np.asarray(v, np.float64)
  t, d = v.shape
  s = np.zeros((t, t))
  for a in range(t):
    for b in range(t):
      s[a, b] = 0.5 * (sum(np.sign(v[a, j]) * np.sign(v[b, j]) for j in range(d)) / d + 1)
  n = np.linalg.norm(v, axis=1)
  cos = (v @ v.T) / np.outer(n, n)
  iu = np.triu_indices(t, k=1)
  x, y = s[iu], cos[iu]
  r = (np.sum((x - x.mean()) * (y - y.mean()))
       / np.sqrt(np.sum((x - x.mean()) ** 2) * np.sum((y - y.mean()) ** 2)))
  return s, cos, r


def test_relatedness_matches_a_float64_reference():
  rng = np.random.default_rng(0)
  v = rng.normal(size=(5, 64))
  v[1] = v[0] + 0.3 * rng.normal(size=64)  # a related pair
  v[2, :10] = 0.  # sgn(0) = 0: these coordinates add nothing to the sums
  res = tr.relatedness(v)
  s, cos, r = _reference(v)
  np.testing.assert_allclose(res['similarity'], s, atol=1e-6)
  np.testing.assert_allclose(res['cosine'], cos, atol=1e-12)
  assert res['pearson_r'] == pytest.approx(r, abs=1e-6)
  assert 0 <= res['pearson_p'] <= 1
  np.testing.assert_array_equal(res['similarity'], res['similarity'].T)
  assert res['similarity'][2, 2] == pytest.approx(0.5 * (54 / 64 + 1))


def test_sign_similarity_special_cases():
  # Orthogonal sign patterns (rows of a Hadamard matrix): S = 0.5, cosine 0.
  h = np.array([[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]], np.float64)
  res = tr.relatedness(h * np.array([0.5, 2., 1., 3.]))  # magnitudes do not change signs
  off = ~np.eye(4, dtype=bool)
  np.testing.assert_allclose(res['similarity'][off], 0.5)
  np.testing.assert_allclose(np.diag(res['similarity']), 1.)
  # Identical vectors: S = 1, cosine 1; a negated one: S = 0, cosine -1.
  a = np.random.default_rng(1).normal(size=50)
  res = tr.relatedness(np.stack([a, a, -a]))
  assert res['similarity'][0, 1] == 1. and res['cosine'][0, 1] == pytest.approx(1.)
  assert res['similarity'][0, 2] == 0. and res['cosine'][0, 2] == pytest.approx(-1.)
  # 3 task pairs, two of which take the same values: S and cosine agree exactly in order.
  assert res['pearson_r'] == pytest.approx(1.)
  # A zero vector has no cosine (NaN), and the correlation skips its pairs.
  res = tr.relatedness(np.stack([a, a + 0.1, -a, np.zeros(50)]))
  assert np.isnan(res['cosine'][3]).all() and np.isfinite(res['cosine'][:3, :3]).all()
  assert res['similarity'][3, 0] == 0.5
  assert np.isfinite(res['pearson_r'])


def test_pearson_sees_the_planted_relations():
  """Tasks built from a few shared directions: pairs sharing more of them are related
  by both measures, so S and cosine correlate strongly."""
  rng = np.random.default_rng(2)
  base = rng.normal(size=(3, 2000))
  mix = np.array([[1, 0, 0], [.9, .3, 0], [.6, .6, 0], [0, 1, 0], [0, .5, .8], [0, 0, 1]])
  v = mix @ base + 0.1 * rng.normal(size=(6, 2000))
  res = tr.relatedness(v)
  assert res['pearson_r'] == pytest.approx(_reference(v)[2], abs=1e-6)
  assert res['pearson_r'] > 0.9 and res['pearson_p'] < 1e-4
  # A constant similarity (all pairs alike) has no correlation.
  assert np.isnan(tr.relatedness(np.eye(4))['pearson_r'])


def test_clusters_recover_planted_pairs():
  rng = np.random.default_rng(3)
  centres = rng.normal(size=(3, 400))
  order = [2, 0, 1, 2, 0, 1]  # task i is a near-duplicate of centre order[i]
  v = centres[order] + 0.2 * rng.normal(size=(6, 400))
  groups = tr.clusters(tr.relatedness(v)['similarity'], 3)
  assert groups == [[0, 3], [1, 4], [2, 5]]
  assert tr.clusters(tr.relatedness(v)['similarity'], 1) == [list(range(6))]
  assert tr.clusters(tr.relatedness(v)['similarity'], 9) == [[i] for i in range(6)]
  # The numpy fallback agrees with scipy's average linkage.
  dist = 1. - tr.relatedness(v)['similarity']
  np.fill_diagonal(dist, 0.)
  labels = tr._average_linkage(dist, 3)
  assert [labels[0], labels[1], labels[2]] == [labels[3], labels[4], labels[5]]
  assert len(set(labels)) == 3


def test_task_vectors_weigh_pairs_by_examples_wherever_they_are_stored():
  """Two pairs of task 0 (3 and 1 examples), one of task 1; one adapter per pair, one
  per task row, one shared; the head never counts."""
  trainable = {'a': np.zeros((2,), np.float32), 'b': np.ones((1,), np.float32),
               'c': np.full((1, 1), 2., np.float32), 'head/kernel': np.zeros((3,), np.float32)}
  roles = {'a': 'encoder', 'b': 'decoder', 'c': 'encoder', 'head/kernel': 'head'}
  setting = types.SimpleNamespace(tasks=('x', 'y'), num_tasks=2,
                                  pairs=np.array([[0, 0], [1, 0], [2, 1]]),
                                  counts=np.array([3, 1, 5]))
  run = types.SimpleNamespace(setting=setting, trainable=trainable, roles=roles)
  state = types.SimpleNamespace(
      shared={'c': np.array([[5.]])},
      task_rows={'b': np.array([[2.], [4.]])},
      pair_rows={'a': np.array([[1., 2.], [5., 6.], [-1., 0.], [9., 9.]]),
                 'head/kernel': np.ones((4, 3))})
  names, v = tr.task_vectors(run, state)
  assert names == ('x', 'y')
  # sorted keys a, b, c; minus the init (0, 0 | 1 | 2)
  np.testing.assert_allclose(v, [[0.75 * 1 + 0.25 * 5, 0.75 * 2 + 0.25 * 6, 1., 3.],
                                 [-1., 0., 3., 3.]])


# ----------------------------------------------------------------------------- end to end


def _tiny_individual():
  c = base_config('mini8', 'local')
  c.progress = False
  c.num_rounds = 1
  c.eval_every = 1
  c.batch_size = 8
  c.eval_batch_size = 16
  return override(c, **{
      'many.tasks': 'digits,digits_perm,shapes', 'many.num_clients': 3, 'many.zeta_t': 0.0,
      'many.class_split': 'iid', 'many.participation': 1.0, 'many.model': 'vit_micro',
      'many.resolution': 16, 'many.lora_rank': 2, 'many.num_train': 48, 'many.num_test': 16,
      'many.pretrained': ''})


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
  from fedjax_mtl import train
  workdir = str(tmp_path_factory.mktemp('individual'))
  train.train_and_evaluate(_tiny_individual(), workdir)
  return workdir


def test_script_on_a_tiny_individual_run(tiny_run, tmp_path, capsys):
  out = tmp_path / 'out'
  res = tr.main([f'--workdir={tiny_run}', f'--out={out}', '--clusters=2'])
  printed = capsys.readouterr().out
  assert sorted(os.listdir(out)) == sorted(tr.FILES)
  assert res['paths'] == [str(out / f) for f in tr.FILES]
  assert 'Pearson r(S, cosine)' in printed
  with open(out / 'relatedness.json') as f:
    saved = json.load(f)
  assert saved['tasks'] == ['digits', 'digits_perm', 'shapes'] and saved['round'] == 1
  s = np.array(saved['similarity'])
  cos = np.array(saved['cosine'])
  assert s.shape == cos.shape == (3, 3)
  np.testing.assert_array_equal(s, s.T)
  np.testing.assert_allclose(cos, cos.T, atol=1e-12)
  assert ((0 <= s) & (s <= 1)).all() and np.allclose(np.diag(cos), 1.)
  assert sorted(i for g in saved['cluster_indices'] for i in g) == [0, 1, 2]
  assert len(saved['clusters']) == 2
  md = (out / 'relatedness.md').read_text()
  assert '## Sign similarity S' in md and '## Cosine similarity' in md and 'Pearson r =' in md
  assert md.count('\n| digits_perm | ') == 2  # one row in each matrix
  # Each task's vector is its single pair's adapters minus the shared initialisation.
  run, state, _ = tr.load_run(tiny_run)
  names, v = tr.task_vectors(run, state)
  keys = sorted(k for k, r in run.roles.items() if r != 'head')
  for p, (_, t) in enumerate(run.setting.pairs):
    want = np.concatenate([(np.asarray(state.pair_rows[k][p], np.float64)
                            - np.asarray(run.trainable[k], np.float64)).ravel() for k in keys])
    np.testing.assert_allclose(v[t], want)
  assert np.abs(v).sum(1).min() > 0  # every task trained
  np.testing.assert_allclose(s, tr.relatedness(v)['similarity'])
  # The default output folder is the run's workdir.
  tr.main([f'--workdir={tiny_run}'])
  assert set(tr.FILES) <= set(os.listdir(tiny_run))


def _fails(argv, capsys, message):
  with pytest.raises(SystemExit) as e:
    tr.main(argv)
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and err.startswith('error: ') and message in err, err


def test_bad_input_is_one_line_and_writes_nothing(tiny_run, tmp_path, capsys):
  out = tmp_path / 'out'
  empty = tmp_path / 'empty'
  empty.mkdir()
  _fails([f'--workdir={empty}', f'--out={out}'], capsys, 'holds no config.json')
  _fails([f'--workdir={tmp_path / "missing"}', f'--out={out}'], capsys, 'not a directory')
  # A config without a checkpoint.
  nockpt = tmp_path / 'nockpt'
  nockpt.mkdir()
  (nockpt / 'config.json').write_text(open(os.path.join(tiny_run, 'config.json')).read())
  _fails([f'--workdir={nockpt}', f'--out={out}'], capsys, 'holds no checkpoint')
  # A run of the dense setting.
  dense = tmp_path / 'dense'
  dense.mkdir()
  (dense / 'config.json').write_text(base_config('smoke', 'fedavg').to_json_best_effort())
  _fails([f'--workdir={dense}', f'--out={out}'], capsys, "'dense' setting")
  _fails([f'--workdir={dense}'], capsys, "'dense' setting")
  assert not out.exists()
  assert snapshot(str(empty)) == {} and sorted(snapshot(str(nockpt))) == ['config.json']
  assert sorted(snapshot(str(dense))) == ['config.json']
