"""Orbax checkpoints of the train state and the data-iterator state, with fallback on a bad latest one.

A restore walks back from the newest step: a checkpoint that is positively unreadable (files missing or corrupt, or
arrays of another structure than the run's) is skipped with a warning and moved to `<directory>.unrestorable/`
(kept for inspection), and the run continues from the newest one that restores. Any other failure (an I/O error
that may pass, out of memory) stops the run with its cause and moves nothing: it says nothing about the checkpoint.
Background (async) save failures surface as CheckpointError at the next save or at `wait()`, never silently.
Arrays are restored into the layout of the abstract state given (its shardings), so a checkpoint written on one
mesh restores onto another mesh shape or device count.
"""

import json
import logging
import pathlib
import re
import shutil
import time

import grain
import jax
import orbax.checkpoint as ocp

from hybrid_jax.errors import UserError


class CheckpointError(UserError, RuntimeError):
  """A checkpoint could not be written or no saved checkpoint could be restored."""


# tensorstore reports failures as ValueError('<status code>: ...'); these codes mean the stored bytes are missing,
# cut short or not what the reader expected. Others (UNAVAILABLE, RESOURCE_EXHAUSTED, PERMISSION_DENIED, ...) may
# pass or need the user, so they are not taken as corruption.
_UNREADABLE_CODES = ('NOT_FOUND', 'DATA_LOSS', 'OUT_OF_RANGE', 'FAILED_PRECONDITION', 'INVALID_ARGUMENT')
_STATUS_CODE = re.compile(r'^([A-Z_]{4,}): ')
_MISSING = (FileNotFoundError, NotADirectoryError, IsADirectoryError)  # OSErrors that say a file is not there.


def _chain(error):
  """The error and the ones it was raised from or while handling."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield error
    error = error.__cause__ or error.__context__


def is_unreadable(error: BaseException) -> bool:
  """True when a restore error shows the checkpoint itself is bad: a missing file or item, bytes that do not
  decode, or arrays whose shapes or tree do not match the run's. False for anything else (e.g. an I/O error that
  may pass, out of memory), which says nothing about the checkpoint."""
  for e in _chain(error):
    if isinstance(e, OSError) and not isinstance(e, _MISSING):
      return False  # EIO, ENOSPC, EACCES, a dropped network mount: the files may be fine.
    if isinstance(e, (MemoryError, jax.errors.JaxRuntimeError)):
      return False
  if isinstance(error, (*_MISSING, KeyError, json.JSONDecodeError, UnicodeDecodeError)):
    return True
  if isinstance(error, ValueError):  # tensorstore's status, or orbax's shape / tree structure mismatch.
    code = _STATUS_CODE.match(str(error))
    return code is None or code.group(1) in _UNREADABLE_CODES
  return False


class Checkpointer:

  def __init__(self, directory, *, keep: int, async_save: bool):
    self.directory = pathlib.Path(directory).absolute()  # Orbax requires absolute paths.
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=True,
                                           cleanup_tmp_directories=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def save(self, step: int, state, data_iterator) -> None:
    """Starts writing checkpoint `step` (in the background when async); reports earlier failures first."""
    self._raise_background_errors()
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), data=grain.checkpoint.CheckpointSave(data_iterator))
    try:
      self.manager.save(step, args=args, force=True)
    except Exception as e:  # Orbax wraps I/O errors in many types; name the step and the place.
      raise CheckpointError(f'saving checkpoint at step {step} to {self.directory} failed: {e}') from e

  def wait(self) -> None:
    """Blocks until background saves finish; raises CheckpointError if one failed."""
    try:
      self.manager.wait_until_finished()
    except Exception as e:
      raise CheckpointError(f'a background checkpoint save to {self.directory} failed: {e}') from e
    self._raise_background_errors()

  def _raise_background_errors(self):
    try:
      self.manager.check_for_errors()
    except Exception as e:
      raise CheckpointError(f'a background checkpoint save to {self.directory} failed: {e}') from e

  def restore_latest(self, abstract_state, data_iterator):
    """(step, state) of the newest checkpoint that restores, also restoring `data_iterator`; None if there is none.

    Raises CheckpointError if checkpoints exist but none of them can be restored (rather than silently starting
    over and overwriting them).
    """
    steps = sorted(self.manager.all_steps(), reverse=True)
    errors = []
    for step in steps:
      args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                data=grain.checkpoint.CheckpointRestore(data_iterator))
      try:
        restored = self.manager.restore(step, args=args)
      except Exception as e:
        if not is_unreadable(e):
          raise CheckpointError(
              f'restoring the checkpoint at step {step} in {self.directory} failed with {type(e).__name__}: {e}. '
              'This is not a sign of a corrupt checkpoint, so nothing was moved or skipped; fix the cause and '
              'rerun to resume from it.') from e
        errors.append(f'step {step}: {type(e).__name__}: {e}')
        logging.warning('checkpoint at step %d in %s cannot be restored (%s: %s); falling back to an earlier one',
                        step, self.directory, type(e).__name__, e)
        continue
      self._set_aside([s for s in steps if s > step])
      return step, restored.state
    if steps:
      raise CheckpointError(f'no checkpoint in {self.directory} could be restored:\n' + '\n'.join(errors))
    return None

  def _set_aside(self, bad_steps):
    """Moves unrestorable checkpoints out of the way (kept, not deleted) so the run can save those steps again."""
    if not bad_steps:
      return
    root = self.directory
    if jax.process_index() == 0:  # One process moves; the others wait for it (multi-host runs share the directory).
      quarantine = root.parent / f'{root.name}.unrestorable' / time.strftime('%Y%m%d-%H%M%S')
      quarantine.mkdir(parents=True, exist_ok=True)
      for step in bad_steps:
        shutil.move(str(root / str(step)), str(quarantine / str(step)))
        logging.warning('moved the unrestorable checkpoint of step %d to %s', step, quarantine / str(step))
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices('hybrid_jax_checkpoint_set_aside')
    self.manager.reload()

  def close(self):
    self.manager.close()
