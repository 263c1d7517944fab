"""Checkpoints: the newest readable step is restored, unreadable ones are set aside.

The state is a tiny FedState built like the real one (stacked client params, an
optax state, replicated round/RNG/server state); corruption is done on the files
orbax actually wrote.
"""

import asyncio
import gc
import json
import os
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_mtl import checkpoint
from fedjax_mtl.checkpoint import Checkpointer
from fedjax_mtl.errors import ConfigError
from fedjax_mtl.state import FedState, GroupState


def tiny_state(seed: int, width: int = 32) -> FedState:
  k = jax.random.PRNGKey(seed)
  params = {'encoder': {'w': jax.random.normal(k, (2, 64, width))},
            'head': {'b': jnp.arange(6.).reshape(2, 3) + seed}}
  group = GroupState(params=params, batch_stats={'bn': {'mean': jnp.full((2, 4), seed * .5)}},
                     opt_state=jax.vmap(optax.adam(1e-3).init)(params))
  return FedState(round=jnp.asarray(seed, jnp.int32), rng=k, groups=[group],
                  server={'alpha': jnp.full((2,), .25 * seed)})


def abstract_of(state: FedState) -> FedState:
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), state)


def assert_bitwise_equal(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert jax.tree.structure(a) == jax.tree.structure(b) and len(la) == len(lb)
  for x, y in zip(la, lb):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape
    assert x.tobytes() == y.tobytes()


def files_under(d):
  return [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs]


def snapshot(d):
  """{relative path: bytes} of every file under d."""
  return {os.path.relpath(p, d): open(p, 'rb').read() for p in files_under(d)}


def truncate_largest(step_dir):
  p = max(files_under(step_dir), key=os.path.getsize)
  with open(p, 'r+b') as f:
    f.truncate(os.path.getsize(p) // 2)


def corrupt_metadata(step_dir):
  with open(os.path.join(step_dir, 'default', '_METADATA'), 'r+b') as f:
    f.truncate(10)


def remove_data(step_dir):
  shutil.rmtree(os.path.join(step_dir, 'default', 'ocdbt.process_0', 'd'))


def empty_step(step_dir):
  for p in files_under(step_dir):
    os.remove(p)


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
  """A checkpoint directory holding steps 2 and 3 (1 was rotated out by max_to_keep=2)."""
  d = str(tmp_path_factory.mktemp('saved') / 'checkpoints')
  ckpt = Checkpointer(d)
  for step in (1, 2, 3):
    ckpt.save(step, tiny_state(step))
  ckpt.close()
  assert sorted(os.listdir(d)) == ['2', '3']
  return d


@pytest.fixture
def ckdir(saved, tmp_path):
  d = str(tmp_path / 'checkpoints')
  shutil.copytree(saved, d)
  return d


@pytest.mark.parametrize('corrupt', [truncate_largest, corrupt_metadata, remove_data, empty_step])
def test_unreadable_newest_step_is_set_aside_and_the_previous_one_restored(ckdir, capsys, corrupt):
  corrupt(os.path.join(ckdir, '3'))
  before = snapshot(os.path.join(ckdir, '3'))
  ckpt = Checkpointer(ckdir)
  step, state = ckpt.restore_latest(abstract_of(tiny_state(0)))
  assert step == 2
  assert_bitwise_equal(state, tiny_state(2))
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1, err
  assert f'{ckdir}/3 is unreadable (' in err[0] and f'moved to {ckdir}/3.unreadable' in err[0]
  assert 'resuming from step 2' in err[0] and len(err[0]) < 600
  # Set aside, not deleted, and no longer seen by orbax.
  assert snapshot(os.path.join(ckdir, '3.unreadable')) == before
  assert ckpt.latest_round() == 2 and Checkpointer.latest_in(ckdir) == 2
  # The run goes on: step 3 again, then 4 (which rotates step 2 out, not the set-aside one).
  ckpt.save(3, tiny_state(30))
  ckpt.save(4, tiny_state(4))
  ckpt.close()
  assert sorted(os.listdir(ckdir)) == ['3', '3.unreadable', '4']
  ckpt = Checkpointer(ckdir)
  step, state = ckpt.restore_latest(abstract_of(tiny_state(0)))
  ckpt.close()
  assert step == 4
  assert_bitwise_equal(state, tiny_state(4))
  assert capsys.readouterr().err == ''


def test_a_second_unreadable_copy_of_a_step_gets_its_own_name(ckdir, capsys):
  os.makedirs(os.path.join(ckdir, '3.unreadable'))
  truncate_largest(os.path.join(ckdir, '3'))
  ckpt = Checkpointer(ckdir)
  assert ckpt.restore_latest(abstract_of(tiny_state(0)))[0] == 2
  ckpt.close()
  assert sorted(os.listdir(ckdir)) == ['2', '3.unreadable', '3.unreadable-2']
  assert 'moved to ' + os.path.join(ckdir, '3.unreadable-2') in capsys.readouterr().err


def test_no_readable_step_is_one_error_line_and_moves_nothing(ckdir, capsys):
  truncate_largest(os.path.join(ckdir, '3'))
  corrupt_metadata(os.path.join(ckdir, '2'))
  before = snapshot(ckdir)
  ckpt = Checkpointer(ckdir)
  with pytest.raises(ConfigError) as e:
    ckpt.restore_latest(abstract_of(tiny_state(0)))
  ckpt.close()
  msg = str(e.value)
  assert '\n' not in msg and len(msg) < 700, msg
  assert msg.startswith(f'no readable checkpoint in {ckdir}: step 3: ')
  assert '; step 2: JSONDecodeError' in msg
  assert snapshot(ckdir) == before
  assert capsys.readouterr().err == ''


@pytest.mark.parametrize('other, expected', [
    (tiny_state(0, width=16), r'encoder/w has shape \(2, 64, 32\) in the checkpoint, '
                              r'\(2, 64, 16\) in the config'),
    (tiny_state(0).replace(server={}), r'1 arrays not in the config, e.g. server/alpha'),
    (tiny_state(0).replace(groups=2 * tiny_state(0).groups), r'arrays missing from the checkpoint'),
])
def test_another_configs_checkpoint_is_a_mismatch_not_corruption(ckdir, other, expected):
  truncate_largest(os.path.join(ckdir, '3'))  # even a damaged step is first checked for this
  before = snapshot(ckdir)
  ckpt = Checkpointer(ckdir)
  with pytest.raises(ConfigError, match=rf'^checkpoint {ckdir}/3 does not match the config '
                                         rf'.*: .*{expected}'):
    ckpt.restore_latest(abstract_of(other))
  ckpt.close()
  assert snapshot(ckdir) == before


def test_a_save_cut_off_midway_is_ignored(ckdir):
  # What a kill during an async save leaves: orbax's temporary folder, never finalized.
  tmp = os.path.join(ckdir, '4.orbax-checkpoint-tmp-1700000000000000')
  os.makedirs(os.path.join(tmp, 'default'))
  open(os.path.join(tmp, 'default', '_METADATA'), 'w').write('{"tree_meta')
  assert Checkpointer.latest_in(ckdir) == 3
  ckpt = Checkpointer(ckdir)
  step, state = ckpt.restore_latest(abstract_of(tiny_state(0)))
  assert step == 3
  assert_bitwise_equal(state, tiny_state(3))
  ckpt.save(4, tiny_state(4))
  ckpt.close()
  assert Checkpointer.latest_in(ckdir) == 4


def test_empty_directory_and_too_few_steps_kept(tmp_path):
  ckpt = Checkpointer(str(tmp_path / 'c'))
  with pytest.raises(ConfigError, match='no checkpoint in'):
    ckpt.restore_latest(abstract_of(tiny_state(0)))
  ckpt.close()
  with pytest.raises(ConfigError, match='max_to_keep must be >= 2'):
    Checkpointer(str(tmp_path / 'd'), max_to_keep=1)


def test_orbax_abandoned_reads_print_nothing_other_coroutines_still_do(monkeypatch):
  # orbax's array read turns the GeneratorExit closing it into an Exception; when a
  # failed restore abandons the other reads, Python would print each one's traceback.
  seen = []
  monkeypatch.setattr(sys, 'unraisablehook', lambda u: seen.append(u.object.cr_code.co_name))
  checkpoint._silence_abandoned_reads()
  checkpoint._silence_abandoned_reads()  # once per process: no second wrapper

  async def pending():
    await asyncio.sleep(0)

  def abandoned(name):
    async def read():
      try:
        await pending()
      except BaseException as e:
        raise Exception('Encountered error while reading array index') from e
    read.__code__ = read.__code__.replace(co_name=name)
    coro = read()
    coro.send(None)  # suspended inside the try, as an abandoned read is
    del coro  # closed now: GeneratorExit -> Exception -> sys.unraisablehook
    gc.collect()

  abandoned('_read_array_index_and_device_put')
  assert seen == []
  abandoned('something_else')
  assert seen == ['something_else']


def test_a_state_large_for_the_host_is_written_before_save_returns(tmp_path, monkeypatch):
  from fedjax_mtl import hostmem
  state = tiny_state(1)
  nbytes = sum(x.nbytes for x in jax.tree.leaves(state))
  assert not checkpoint.waits_for_write(state)  # a few kB of this host's memory
  monkeypatch.setattr(hostmem, 'host_memory_bytes', lambda: 4 * nbytes)
  assert checkpoint.waits_for_write(state)  # more than an eighth of it
  assert checkpoint.host_buffer_gb(state) == 1  # bounded buffers, orbax's smallest bound
  assert checkpoint.host_buffer_gb(abstract_of(state)) == 1  # sized from shapes alone
  ckpt = Checkpointer(str(tmp_path / 'ck'), like=abstract_of(state))
  assert ckpt.buffer_gb == 1
  waits = []
  real_wait = ckpt._mngr.wait_until_finished
  monkeypatch.setattr(ckpt._mngr, 'wait_until_finished', lambda: waits.append(1) or real_wait())
  ckpt.save(1, state)
  assert waits  # the write finished within save
  # The next round donates the saved buffers: the checkpoint holds what was saved.
  want = jax.tree.map(np.array, state)
  jax.block_until_ready(jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s),
                                donate_argnums=0)(state))
  step, back = ckpt.restore_latest(abstract_of(want))
  assert step == 1
  assert_bitwise_equal(back, want)
  ckpt.close()


def test_a_small_state_keeps_orbaxs_unbounded_background_save(tmp_path):
  state = tiny_state(1)
  assert checkpoint.host_buffer_gb(state) is None and checkpoint.host_buffer_gb(None) is None
  ckpt = Checkpointer(str(tmp_path / 'ck'), like=state)
  assert ckpt.buffer_gb is None
  ckpt.close()


def test_the_host_buffer_bound_holds_the_largest_array(monkeypatch):
  from fedjax_mtl import hostmem
  big = {'w': jax.ShapeDtypeStruct((3, 10**9 // 4), jnp.float32),  # 3 GB
         'b': jax.ShapeDtypeStruct((4,), jnp.float32)}
  monkeypatch.setattr(hostmem, 'host_memory_bytes', lambda: 16 * 10**9)
  assert checkpoint.host_buffer_gb(big) == 7  # 2 x 3 GB + 1 byte, not 16 / 8 = 2
  monkeypatch.setattr(hostmem, 'host_memory_bytes', lambda: 20 * 10**9)
  assert checkpoint.host_buffer_gb(big) == 7
  monkeypatch.setattr(hostmem, 'host_memory_bytes', lambda: 100 * 10**9)
  assert checkpoint.host_buffer_gb(big) is None  # 3 GB of 100: saved in the background
  many = {f'w{i}': jax.ShapeDtypeStruct((10**9 // 8,), jnp.float32) for i in range(10)}
  monkeypatch.setattr(hostmem, 'host_memory_bytes', lambda: 30 * 10**9)
  assert checkpoint.host_buffer_gb(many) == 4  # 5 GB of 30: an eighth (3.75 GB), rounded up


def test_small_arrays_are_saved_packed_and_large_ones_as_they_are(tmp_path, monkeypatch):
  import orbax.checkpoint as ocp
  from etils import epath
  # 1 kB: the encoder's w (2 x 64 x 32 float32, 16 kB) and its Adam moments stay arrays.
  monkeypatch.setattr(checkpoint, 'PACK_MAX_BYTES', 1024)
  state = tiny_state(3)
  state = state.replace(server={**state.server, 'h': jnp.arange(5, dtype=jnp.bfloat16)})
  d = str(tmp_path / 'ck')
  ckpt = Checkpointer(d)
  ckpt.save(1, state)
  ckpt.close()
  handler = ocp.StandardCheckpointHandler()
  stored = checkpoint._leaf_shapes(handler.metadata(epath.Path(d) / '1' / 'default').tree)
  handler.close()
  arrays = sorted(k for k in stored if not k.startswith(checkpoint.PACKED))
  assert arrays == ['groups/0/opt_state/0/mu/encoder/w', 'groups/0/opt_state/0/nu/encoder/w',
                    'groups/0/params/encoder/w']
  assert sorted(k for k in stored if k.startswith(checkpoint.PACKED)) == [
      f'{checkpoint.PACKED}/{t}' for t in ('bfloat16', 'float32', 'int32', 'uint32')]
  with open(os.path.join(d, '1', checkpoint._STEP_METADATA)) as f:
    layout = json.load(f)['custom_metadata'][checkpoint._LAYOUT_KEY]
  assert layout['bfloat16'] == [['server/h', [5]]] and ['round', []] in layout['int32']
  assert ['groups/0/params/head/b', [2, 3]] in layout['float32']
  # Every packed leaf and every array: their number is the state's.
  assert len(arrays) + sum(len(v) for v in layout.values()) == len(jax.tree.leaves(state))
  ckpt = Checkpointer(d)
  step, back = ckpt.restore_latest(abstract_of(state))
  ckpt.close()
  assert step == 1
  assert_bitwise_equal(back, state)
  want = jax.tree.leaves(abstract_of(state))
  assert [x.sharding for x in jax.tree.leaves(back)] == [x.sharding for x in want]


def test_a_step_saved_array_by_array_still_restores(tmp_path):
  # What checkpoints written before packing (or by a multi-process run) hold.
  import orbax.checkpoint as ocp
  from fedjax_mtl.state import to_dict
  d = str(tmp_path / 'ck')
  mngr = ocp.CheckpointManager(d, options=ocp.CheckpointManagerOptions(create=True))
  mngr.save(2, args=ocp.args.StandardSave(to_dict(tiny_state(2))))
  mngr.close()
  ckpt = Checkpointer(d)
  step, back = ckpt.restore_latest(abstract_of(tiny_state(0)))
  with pytest.raises(ConfigError, match=r'encoder/w has shape \(2, 64, 32\) in the checkpoint, '
                                        r'\(2, 64, 16\) in the config'):
    ckpt.restore(2, abstract_of(tiny_state(0, width=16)))
  ckpt.close()
  assert step == 2
  assert_bitwise_equal(back, tiny_state(2))
