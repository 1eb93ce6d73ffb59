"""Checkpoint restore: only a checkpoint that is positively unreadable is set aside and skipped; any other failure
stops with its cause and moves nothing."""

import errno
import re
import shutil

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.train import checkpoint


def _abstract():
  return {'w': jax.ShapeDtypeStruct((3,), jnp.float32)}


def _iterator():
  return iter(grain.MapDataset.range(100).to_iter_dataset())


def _saved_steps(directory, steps=(1, 2), width=3):
  """Saves `steps` (step s holds w = [s] * width and an iterator advanced s times); returns a fresh checkpointer."""
  ckpt = checkpoint.Checkpointer(directory, keep=5, async_save=False)
  data = _iterator()
  for step in range(1, max(steps) + 1):
    next(data)
    if step in steps:
      ckpt.save(step, {'w': jnp.full((width,), float(step))}, data)
  ckpt.wait()
  ckpt.close()
  return checkpoint.Checkpointer(directory, keep=5, async_save=False)


def _garble(path):
  for f in path.rglob('*'):
    if f.is_file() and f.stat().st_size > 0:
      f.write_bytes(b'\0garbage')


def _truncate_arrays(path):
  for f in (path / 'state').rglob('d/*'):
    f.write_bytes(f.read_bytes()[:f.stat().st_size // 2])


@pytest.mark.parametrize('damage', [
    _garble,
    lambda p: shutil.rmtree(p / 'state'),  # An item missing.
    _truncate_arrays,  # Array bytes cut short.
    None,  # Nothing damaged, but the run's arrays have another shape.
], ids=['garbled', 'item_missing', 'truncated', 'shape_mismatch'])
def test_unreadable_latest_checkpoint_is_set_aside_and_the_previous_one_restores(tmp_path, damage):
  ckpt = _saved_steps(tmp_path / 'ck')
  if damage is None:
    ckpt.close()
    _saved_steps(tmp_path / 'ck', steps=(3,), width=4).close()  # Written by a run with other shapes.
    ckpt, bad = checkpoint.Checkpointer(tmp_path / 'ck', keep=5, async_save=False), 3
  else:
    damage(tmp_path / 'ck' / '2')
    bad = 2
  data = _iterator()
  step, state = ckpt.restore_latest(_abstract(), data)
  assert step == bad - 1 and np.asarray(state['w']).tolist() == [bad - 1.0] * 3
  assert next(data) == bad - 1  # The data iterator resumed where step bad - 1 left it.
  assert list((tmp_path / 'ck.unrestorable').glob(f'*/{bad}')) and ckpt.all_steps() == list(range(1, bad))
  ckpt.close()


@pytest.mark.parametrize('error', [
    OSError(errno.EIO, 'Input/output error'),
    MemoryError('cannot allocate 2 GiB'),
    ValueError('UNAVAILABLE: the storage service did not answer'),
], ids=['io_error', 'out_of_memory', 'unavailable'])
def test_other_restore_failures_stop_with_their_cause_and_move_nothing(tmp_path, monkeypatch, error):
  ckpt = _saved_steps(tmp_path / 'ck')
  real_restore = ckpt.manager.restore

  def failing_restore(step, **kwargs):
    if step == 2:
      raise error
    return real_restore(step, **kwargs)

  monkeypatch.setattr(ckpt.manager, 'restore', failing_restore)
  cause = f'step 2 in {tmp_path / "ck"} failed with {type(error).__name__}: {error}'
  with pytest.raises(checkpoint.CheckpointError, match=re.escape(cause)) as info:
    ckpt.restore_latest(_abstract(), _iterator())
  assert info.value.__cause__ is error
  assert ckpt.all_steps() == [1, 2] and not (tmp_path / 'ck.unrestorable').exists()
  ckpt.close()


def test_an_io_error_inside_a_decoding_error_is_not_corruption():
  try:
    try:
      raise OSError(errno.EIO, 'Input/output error')
    except OSError as cause:
      raise ValueError('could not read the array') from cause
  except ValueError as wrapped:
    assert not checkpoint.is_unreadable(wrapped)
  assert checkpoint.is_unreadable(ValueError('NOT_FOUND: Error reading "w/.zarray"'))
  assert checkpoint.is_unreadable(FileNotFoundError('no such file: _METADATA'))


# ---------------------------------------------------------------------------------------- a real run's checkpoint
def _largest(folder, pattern):
  return max((f for f in folder.glob(pattern) if f.is_file()), key=lambda f: f.stat().st_size)


# Every kind of file a step needs, by what reads it: the arrays' bytes (OCDBT data files; the biggest holds whole
# arrays), the tree metadata, the OCDBT manifest and B-tree, and the data iterator's state.
FILE_KINDS = {
    'array_data': lambda step: _largest(step / 'state', 'ocdbt.process_0/d/*'),
    'metadata': lambda step: step / 'state' / '_METADATA',
    'manifest': lambda step: step / 'state' / 'manifest.ocdbt',
    'btree': lambda step: _largest(step / 'state', 'd/*'),
    'iterator_state': lambda step: step / 'data' / 'process_0-of-1.json',
}


def _damage(file, how):
  data = file.read_bytes()
  if how == 'missing':
    file.unlink()
  elif how == 'truncated':
    file.write_bytes(data[:len(data) // 2])
  else:  # 'corrupt': 16 bytes inverted a third of the way in (what a bad disk block or a bit rot run does).
    flipped = bytearray(data)
    for i in range(len(data) // 3, len(data) // 3 + 16):
      flipped[i] ^= 0xFF
    file.write_bytes(bytes(flipped))


@pytest.fixture(scope='module')
def run_state():
  """The abstract train state and data iterator of conftest's tiny run (what a resume restores into)."""
  from hybrid_jax.data.pipeline import make_train_dataset
  from hybrid_jax.parallel import mesh as mesh_lib, rules as rules_lib
  from hybrid_jax.train import optim, state as state_lib
  from tests.conftest import small_config
  config = small_config()
  tx = optim.make_optimizer(config.train)
  model_def = state_lib.make_model_def(config.model)
  shardings = mesh_lib.train_shardings(model_def, tx, mesh_lib.make_mesh(config.parallel),
                                       rules_lib.parse_rules(config.parallel.rules))
  abstract = state_lib.abstract_train_state(state_lib.abstract_initial_state(config.model, config.seed, tx),
                                            shardings.state)
  return abstract, lambda: iter(make_train_dataset(config))


@pytest.mark.parametrize('how', ['missing', 'truncated', 'corrupt'])
@pytest.mark.parametrize('kind', list(FILE_KINDS))
def test_a_damaged_file_of_any_kind_sets_the_step_aside_naming_the_file(tiny_run, run_state, tmp_path, caplog, kind,
                                                                        how):
  """Damage one file of the newest step (12) of a real run: the resume warns naming that file (or, for array data,
  the file and the array), sets step 12 aside and restores step 8 exactly as saved."""
  shutil.copytree(tiny_run / 'checkpoints', tmp_path / 'checkpoints')
  reference = checkpoint.Checkpointer(tiny_run / 'checkpoints', keep=5, async_save=False)
  abstract, data = run_state
  with checkpoint.quiet_restore():
    expected = reference.manager.restore(8, args=checkpoint.ocp.args.Composite(
        state=checkpoint.ocp.args.StandardRestore(abstract))).state
  reference.close()
  damaged = FILE_KINDS[kind](tmp_path / 'checkpoints' / '12')
  _damage(damaged, how)
  ckpt = checkpoint.Checkpointer(tmp_path / 'checkpoints', keep=5, async_save=False)
  with caplog.at_level('WARNING'):
    step, state = ckpt.restore_latest(abstract, data())
  ckpt.close()
  assert step == 8
  for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(expected)):
    np.testing.assert_array_equal(got, want)
  [warning] = [r.getMessage() for r in caplog.records if 'cannot be restored' in r.getMessage()]
  assert 'checkpoint at step 12' in warning and 'falling back' in warning
  assert f'{damaged} ' in warning or f'{damaged} (' in warning, warning  # Named by its path.
  assert len(warning.splitlines()) == 1 and len(warning) < 1500  # No tensorstore spec dump.
  assert list((tmp_path / 'checkpoints.unrestorable').glob('*/12')) and not (tmp_path / 'checkpoints' / '12').exists()
