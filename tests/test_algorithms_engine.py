"""Every baseline for two rounds in the engine (smoke config, three clients): the
workdir run with an interruption after round 1 and its resumption, and what each
algorithm promises about the state (what is shared, personal, frozen)."""

import jax
import numpy as np
import pytest

from conftest import tiny_config
from fedjax_mtl import algorithms, experiment, federation, report, train


def _rows_equal(tree):
  """Whether every real client's rows of a stacked view are identical."""
  return all(np.allclose(x, x[:1], rtol=1e-6, atol=1e-7) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize('name', ['fedprox', 'fedper', 'ditto', 'fedamp', 'fedbabu', 'fedsta',
                                  'matfl', 'fedacg'])
def test_two_round_run(name, tmp_path):
  mod = getattr(algorithms, name)
  blocks = {name: mod.default_config()} if hasattr(mod, 'default_config') else {}
  # Three clients (two single-task in one group, one multi-task), K = 4 decoders.
  cfg = tiny_config(name, num_rounds=2, eval_every=2, tasks='semseg,sal,depth', **blocks)
  wd = str(tmp_path / name)
  exp = experiment.build(cfg)
  first = train.train_and_evaluate(cfg, wd, stop_after=1)['state']
  out = train.train_and_evaluate(cfg, wd)
  assert out['eval'] and all(np.isfinite(r['value']) for r in out['eval'])
  view = lambda st, role: jax.device_get(experiment.views(exp, [g.params for g in st.groups], role))
  enc1, enc2 = view(first, 'encoder'), view(out['state'], 'encoder')
  dec1, dec2 = view(first, 'decoder'), view(out['state'], 'decoder')
  if name in ('fedprox', 'fedper', 'ditto'):
    assert _rows_equal(enc2)
  if name == 'fedprox':
    assert _rows_equal(dec2)
  if name in ('fedper', 'matfl', 'fedsta'):
    assert not _rows_equal(dec2)  # decoders stay personal
  if name == 'ditto':  # the personal models are trained, differ, and are what is evaluated
    personal = jax.device_get(experiment.views(
        exp, [g.personal[0] for g in out['state'].groups], 'encoder'))
    assert not _rows_equal(personal)
    assert not np.allclose(jax.tree.leaves(personal)[0], jax.tree.leaves(enc2)[0])
  if name == 'fedamp':  # own models persist; the cloud models are sharded per-row state
    assert not _rows_equal(enc2)
    centre = out['state'].groups[0].server_rows['encoder']['center']
    leaf = jax.tree.leaves(centre)[0]
    assert leaf.sharding.is_equivalent_to(exp.client_sharding, leaf.ndim)
  if name == 'fedbabu':  # frozen decoders in the federated round, fine-tuned in the last
    dec0 = view(jax.device_get(experiment.init_state(exp)), 'decoder')
    jax.tree.map(np.testing.assert_array_equal, dec1, dec0)
    assert _rows_equal(enc1) and not _rows_equal(enc2)
    assert not np.allclose(jax.tree.leaves(dec2)[0], jax.tree.leaves(dec0)[0])
  if name == 'fedsta':  # one shared body, then frozen while the heads tune
    assert _rows_equal(enc1)
    jax.tree.map(np.testing.assert_array_equal, enc2, enc1)
  if name == 'matfl':
    rows = [r for r in report.read_jsonl(f'{wd}/metrics.jsonl') if r['type'] == 'agg']
    w = np.asarray(rows[-1]['matfl_encoder_weights'])
    np.testing.assert_allclose(w.sum(1), 1., rtol=1e-5)
  if name == 'fedacg':  # m^1 = θ^1 − θ^0 (the first lookahead is θ^0); kept per client row
    m = jax.device_get(federation.gather_rows(
        [g.server_rows['encoder']['acg_momentum'] for g in first.groups], exp.fed, 'encoder'))
    enc0 = view(jax.device_get(experiment.init_state(exp)), 'encoder')
    jax.tree.map(lambda a, b, c: np.testing.assert_allclose(a, b - c, rtol=1e-5, atol=1e-6),
                 m, enc1, enc0)
    assert _rows_equal(enc2)
