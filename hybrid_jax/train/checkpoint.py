"""Orbax checkpoints of the train state and the data-iterator state, with fallback on a bad latest one.

A restore walks back from the newest step: a checkpoint that is positively unreadable (a file missing, truncated or
corrupt, or arrays of another structure than the run's) is skipped with a warning naming the file and moved to
`<directory>.unrestorable/` (kept for inspection), and the run continues from the newest one that restores. Array
data has no checksum of its own, so each save also stores a fingerprint of every array, checked on restore. Any other failure (an I/O error
that may pass, out of memory) stops the run with its cause and moves nothing: it says nothing about the checkpoint.
Background (async) save failures surface as CheckpointError at the next save or at `wait()`, never silently.
Arrays are restored into the layout of the abstract state given (its shardings), so a checkpoint written on one
mesh restores onto another mesh shape or device count.
"""

import contextlib
import json
import logging
import pathlib
import re
import shutil
import time

import grain
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from hybrid_jax import checks
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
  may pass, out of memory), which says nothing about the checkpoint.

  Orbax wraps a failed array read in a bare Exception whose cause is tensorstore's status, so the chain decides:
  any I/O or memory error in it clears the checkpoint; else the first error that says what was read decides.
  """
  chain = list(_chain(error))
  for e in chain:
    if isinstance(e, OSError) and not isinstance(e, _MISSING):
      return False  # EIO, ENOSPC, EACCES, a dropped network mount: the files may be fine.
    if isinstance(e, (MemoryError, jax.errors.JaxRuntimeError)):
      return False
  for e in chain:
    if isinstance(e, (*_MISSING, KeyError, json.JSONDecodeError, UnicodeDecodeError)):
      return True
    if isinstance(e, ValueError):  # tensorstore's status, or orbax's shape / tree structure mismatch.
      code = _STATUS_CODE.match(str(e))
      return code is None or code.group(1) in _UNREADABLE_CODES
  return False


def short(error: BaseException, limit: int = 300) -> str:
  """`Type: message` on one line, without the tensorstore specs that orbax and tensorstore append (dozens of
  lines each); orbax's bare Exception around a failed array read gives way to its cause."""
  while type(error) is Exception and (error.__cause__ or error.__context__) is not None:  # pylint: disable=C0123
    error = error.__cause__ or error.__context__
  text = re.split(r' See full TensorStore details| \[tensorstore_spec=', str(error))[0]
  text = ' '.join(text.split())
  return f'{type(error).__name__}: {text[:limit]}{"..." if len(text) > limit else ""}'


# The files a step needs to restore (relative to the step's folder), by what reads them.
_REQUIRED = ('state/_METADATA', 'state/manifest.ocdbt')
_JSON_FILES = ('state/_METADATA', 'state/array_metadatas/*', 'data/*.json')


def damaged_part(step_dir, error: BaseException) -> str | None:
  """The file (or array) a restore error points at, for the warning; found in the error chain, else by looking for
  a needed file that is missing or a JSON file that does not parse; None if neither says (e.g. arrays of other
  shapes than the run's)."""
  step_dir = pathlib.Path(step_dir)
  for e in _chain(error):
    if isinstance(e, CorruptArrays):
      file = _file_of_key(str(step_dir / 'state'), e.arrays.split(',')[0] + '/')
      return f'{file} (data of array(s) {e.arrays})' if file else f'the data of array(s) {e.arrays} in ' \
          f'{step_dir / "state"}'
    if isinstance(e, OSError) and e.filename:
      return str(e.filename)
    text = str(e)
    files = [f for f in re.findall(r'local file "([^"]+)"', text) if not f.endswith('/')]
    if files:
      return files[-1]
    missing = re.search(r'File (\S+) does not exist', text)
    if missing:
      return missing.group(1)
    array = re.search(r'Error reading "([^"]+)" in OCDBT database at local file "([^"]+)"', text)
    if array:
      file = _file_of_key(array.group(2), array.group(1))
      return f'{file} (data of array {array.group(1)})' if file else f'the data of array {array.group(1)} in ' \
          f'{array.group(2)}'
  for name in _REQUIRED:
    if not (step_dir / name).is_file():
      return f'{step_dir / name} (missing)'
  for pattern in _JSON_FILES:
    for file in sorted(step_dir.glob(pattern)):
      try:
        json.loads(file.read_bytes())
      except ValueError:  # JSONDecodeError, UnicodeDecodeError.
        return str(file)
  return None


def _file_of_key(database: str, key: str, max_nodes: int = 1000) -> str | None:
  """The data file holding `key`'s value (or, for a key ending in '/', the first such value under it) in an OCDBT
  database folder (its B-tree says where), or None."""
  try:
    import tensorstore as ts  # pylint: disable=g-import-not-at-top  (installed with orbax)
    store = ts.KvStore.open({'driver': 'file', 'path': database.rstrip('/') + '/'}).result()
    todo = [v['root']['location'] for v in ts.ocdbt.dump(store).result()['versions'][-1:]]
    for _ in range(max_nodes):
      if not todo:
        break
      for entry in ts.ocdbt.dump(store, todo.pop()).result().get('entries', []):
        todo += [v for v in entry.values() if isinstance(v, str) and v.startswith('btreenode::')]
        name = entry.get('key', b'')
        if (name == key.encode() or key.endswith('/') and name.startswith(key.encode())) and 'indirect_value' in entry:
          _, prefix, path, *_ = entry['indirect_value'].split(':')  # value:<prefix>:<path>:<offset>:<length>
          return str(pathlib.Path(database) / prefix / path)
  except Exception:  # pylint: disable=broad-except  # Only a better name for the warning; the key still names it.
    return None
  return None


class _QuietShutdown(logging.Filter):
  """Drops asyncio's 'unhandled exception during asyncio.run() shutdown' records: after failed reads of a damaged
  checkpoint, orbax can leave sibling reads failing too (seen when restores failed repeatedly in one process), each
  logged with a full tensorstore spec."""

  def filter(self, record):
    return 'during asyncio.run() shutdown' not in record.getMessage()


@contextlib.contextmanager
def quiet_restore():
  """While restoring: the failure is reported once, by the caller, not as pages of asyncio logs."""
  quiet, log = _QuietShutdown(), logging.getLogger('asyncio')
  log.addFilter(quiet)
  try:
    yield
  finally:
    log.removeFilter(quiet)


FINGERPRINT = 'fingerprint'  # The item holding the state's per-array fingerprints, beside 'state' and 'data'.


class CorruptArrays(ValueError):
  """Arrays restored without an error whose values differ from the fingerprints saved with them."""

  def __init__(self, message, arrays):
    super().__init__(message)
    self.arrays = arrays


def _bits_sum(x):
  """The sum (mod 2**32) of an array's bit patterns: any flipped bit changes it (zarr and zstd keep no checksum,
  so a corrupt chunk of array data otherwise restores silently as other values)."""
  x = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x
  bits = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]  # 8 bytes: two words each.
  return jnp.sum(jax.lax.bitcast_convert_type(x, bits), dtype=jnp.uint32)


@jax.jit
def _fingerprint_arrays(tree):
  return jax.tree.map(_bits_sum, tree)


def fingerprint(tree) -> dict:
  """{'path.to.array': int} of every array in `tree` (computed where the arrays live, across hosts too)."""
  sums = jax.device_get(_fingerprint_arrays(tree))
  return {jax.tree_util.keystr(path, simple=True, separator='.'): int(value)
          for path, value in jax.tree_util.tree_flatten_with_path(sums)[0]}


def check_fingerprint(tree, saved: dict | None, where: str) -> None:
  """Raises CorruptArrays naming the arrays of `tree` whose values differ from `saved` (None: not recorded)."""
  if not saved:
    return
  got = fingerprint(tree)
  bad = sorted(k for k, v in got.items() if k in saved and saved[k] != v)
  if bad:
    names = f'{", ".join(bad[:5])}{" ..." if len(bad) > 5 else ""}'
    raise CorruptArrays(f'the data of array(s) {names} in {where} read back as other values than were saved (a '
                        'corrupt chunk)', names)


def read_fingerprint(step_dir) -> dict | None:
  """The fingerprints saved in a step's folder, or None (older checkpoints have none; a damaged file is None too:
  the arrays it would check are then read unchecked)."""
  try:
    return json.loads((pathlib.Path(step_dir) / FINGERPRINT / 'metadata').read_bytes())
  except (OSError, ValueError):
    return None


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
    if not checks.can_write_in(self.directory):  # Orbax would fail in a background thread, after a timeout.
      raise CheckpointError(f'saving checkpoint at step {step} to {self.directory} failed: the folder is not '
                            'writable (permissions, a read-only or full filesystem); the run stops here, its '
                            'earlier checkpoints are kept')
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), data=grain.checkpoint.CheckpointSave(data_iterator),
                              **{FINGERPRINT: ocp.args.JsonSave(fingerprint(state))})
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
        with quiet_restore():
          restored = self.manager.restore(step, args=args)
        check_fingerprint(restored.state, read_fingerprint(self.directory / str(step)), f'step {step}')
      except Exception as e:
        if not is_unreadable(e):
          raise CheckpointError(
              f'restoring the checkpoint at step {step} in {self.directory} failed with {short(e)}. '
              'This is not a sign of a corrupt checkpoint, so nothing was moved or skipped; fix the cause and '
              'rerun to resume from it.') from e
        part = damaged_part(self.directory / str(step), e)
        why = f'{part} is missing or damaged ({short(e)})' if part else short(e)
        errors.append(f'step {step}: {why}')
        logging.warning('the checkpoint at step %d in %s cannot be restored: %s; setting it aside and falling back '
                        'to an earlier one', step, self.directory, why)
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
