"""The shared checks of input: one for numbers, one for paths, used by every command's flags and the config.

A command states what a value must be (`number(..., positive=True, integer=True)`, `path(..., kind='dir',
writable=True)`) instead of coding the check again; a value that fails is one InputError line naming the flag or
key, the value and what is allowed. `flag_number` / `flag_numbers` / `flag_path` wrap the same checks as argparse
types (argparse then names the flag), and keep what they require in `.requires` so a test can generate values that
break it.
"""

import argparse
import math
import os
import pathlib
import re
import tempfile

from hybrid_jax.errors import InputError

_URL = re.compile(r'^[A-Za-z][A-Za-z0-9+.-]*://')


def _describe(integer, positive, nonnegative, low, high) -> str:
  """What a number must be, in words: 'a positive integer', 'a finite number in [0, 1]', 'an integer >= 2'."""
  base = 'an integer' if integer else 'a finite number'
  if positive and low is None and high is None:
    return 'a positive integer' if integer else 'a positive finite number'
  if low is not None and high is not None and not positive and not nonnegative:
    return f'{base} in [{low}, {high}]'
  bounds = ['> 0'] if positive else ['>= 0'] if nonnegative else []
  bounds += [f'>= {low}'] if low is not None else []
  bounds += [f'<= {high}'] if high is not None else []
  return ' and '.join([f'{base} {bounds[0]}', *bounds[1:]]) if bounds else base


def number(value, what, *, integer=False, positive=False, nonnegative=False, low=None, high=None):
  """`value` (a number, or text read as one) when it is finite and within the bounds; else InputError naming `what`.

  `low` and `high` are inclusive. Booleans are not numbers here (a config's True is a mistake, not 1).
  """
  allowed = 'must be ' + _describe(integer, positive, nonnegative, low, high)
  parsed = value
  if isinstance(value, str):
    text = value.strip()
    try:
      parsed = int(text) if integer else float(text)
    except ValueError:
      raise InputError(f'{what}={value!r} is invalid: {allowed}') from None
  if isinstance(parsed, bool) or not isinstance(parsed, (int, float)) or (integer and not isinstance(parsed, int)):
    raise InputError(f'{what}={value!r} is invalid: {allowed}')
  if not math.isfinite(parsed) or (positive and parsed <= 0) or (nonnegative and parsed < 0) or \
      (low is not None and parsed < low) or (high is not None and parsed > high):
    raise InputError(f'{what}={value!r} is invalid: {allowed}')
  return parsed


def _nearest_existing(path: pathlib.Path) -> pathlib.Path:
  path = pathlib.Path(os.path.abspath(path))
  while not path.exists() and path != path.parent:
    path = path.parent
  return path


def can_write_in(directory) -> bool:
  """Whether a file can be created in `directory` (tried, not guessed: root ignores modes but not read-only mounts)."""
  try:
    fd, probe = tempfile.mkstemp(dir=directory, prefix='.hybrid_jax_probe_')
  except OSError:
    return False
  os.close(fd)
  os.unlink(probe)
  return True


def path(value, what, *, kind=None, exists=True, writable=False, outside=None) -> pathlib.Path:
  """`value` as a Path when it passes; else InputError naming `what`.

  kind: 'file' or 'dir' (what it must be when it exists). exists: it must exist already. writable: it can be written
  (an existing file or directory, or the folders to create above it). outside: a directory it must not be inside
  (e.g. a run's checkpoints), or None.
  """
  if value is None or str(value) == '':
    raise InputError(f'{what} is empty: give a path')
  if _URL.match(str(value)):  # pathlib would fold gs://B/R into a local folder gs:/B/R.
    raise InputError(f'{what}={value} is a URL; paths are read and written through the local filesystem. Mount the '
                     'bucket on every host (Cloud Storage FUSE: gcsfuse --implicit-dirs BUCKET /mnt/BUCKET) and pass '
                     'the mounted path, e.g. /mnt/BUCKET/run1')
  p = pathlib.Path(os.path.expanduser(str(value)))
  try:
    return _checked_path(p, value, what, kind, exists, writable, outside)
  except OSError as e:  # E.g. a name longer than the filesystem allows.
    raise InputError(f'{what}={shown_path(value)}: {e.strerror or e}') from None


def shown_path(value, limit: int = 120) -> str:
  """A path as a message shows it: whole, or its start and end with its length when longer than `limit`."""
  text = str(value)
  return text if len(text) <= limit else f'{text[:60]}...{text[-40:]} ({len(text)} characters)'


def _checked_path(p: pathlib.Path, value, what, kind, exists, writable, outside) -> pathlib.Path:
  if p.exists():
    if kind == 'dir' and not p.is_dir():
      raise InputError(f'{what}={value}: is a file, not a directory')
    if kind == 'file' and p.is_dir():
      raise InputError(f'{what}={value}: is a directory, not a file')
  elif exists:
    raise InputError(f'{what}={value}: does not exist')
  if outside is not None:
    inner, outer = pathlib.Path(os.path.abspath(p)), pathlib.Path(os.path.abspath(outside))
    if inner == outer or outer in inner.parents:
      raise InputError(f'{what}={value}: is inside {outside}; choose a path outside it')
  if writable:
    base = _nearest_existing(p)
    if not base.is_dir() and base != pathlib.Path(os.path.abspath(p)):
      raise InputError(f'{what}={value}: {base} is a file, so no folder can be made under it')
    folder = base if base.is_dir() else base.parent
    if (p.exists() and p.is_file() and not os.access(p, os.W_OK)) or not can_write_in(folder):
      raise InputError(f'{what}={value}: cannot be written ({folder} is not writable)')
  return p


def _flag(check, requires: dict, name: str):
  """An argparse type running `check(text)`; its failure becomes argparse's one-line error naming the flag."""

  def parse(text):
    try:
      return check(text)
    except InputError as e:
      raise argparse.ArgumentTypeError(str(e).replace('<flag>=', '', 1).replace('<flag> ', '', 1)) from None

  parse.__name__ = name
  parse.requires = requires
  return parse


def flag_number(**bounds):
  """argparse `type=` for one number with `number`'s bounds (integer, positive, nonnegative, low, high)."""
  return _flag(lambda text: number(text, '<flag>', **bounds), {'number': bounds}, 'number')


def flag_numbers(words=(), **bounds):
  """argparse `type=` for a comma-separated list (at least one) of numbers, each with `number`'s bounds; an item
  in `words` (e.g. 'full') stands for None."""

  def check(text):
    parts = [part.strip() for part in text.split(',') if part.strip()]
    if not parts:
      raise InputError(f'<flag>={text!r} is invalid: give a comma-separated list, e.g. 1,2')
    out = []
    for part in parts:
      try:
        out.append(None if part in words else number(part, '<flag>', **bounds))
      except InputError as e:
        also = f' (or {" / ".join(repr(w) for w in words)})' if words else ''
        item = str(e).replace('<flag>=', '', 1)
        raise InputError(f'<flag>={item}{also}' if len(parts) == 1 else f'<flag>={text!r}: {item}{also}') from None
    return out

  return _flag(check, {'numbers': bounds, 'words': words}, 'numbers')


def flag_choices(allowed, what='values'):
  """argparse `type=` for a comma-separated list (at least one) of names, each one of `allowed`."""
  allowed = tuple(allowed)

  def check(text):
    parts = [part.strip() for part in text.split(',') if part.strip()]
    if not parts:
      raise InputError(f'<flag>={text!r} is invalid: give a comma-separated list of {what} ({", ".join(allowed)})')
    unknown = [part for part in parts if part not in allowed]
    if unknown:
      raise InputError(f'<flag>={text!r} is invalid: {", ".join(map(repr, unknown))} not among the {what} '
                       f'{", ".join(allowed)}')
    return parts

  return _flag(check, {'choices': allowed}, 'choices')


def flag_path(**rules):
  """argparse `type=` for a path with `path`'s rules (kind, exists, writable); the value stays a string."""
  return _flag(lambda text: str(path(text, '<flag>', **rules)), {'path': rules}, 'path')


# The flag types most commands share.
POSITIVE_INT = flag_number(integer=True, positive=True)
NONNEGATIVE_INT = flag_number(integer=True, nonnegative=True)
NONNEGATIVE = flag_number(nonnegative=True)
IN_FILE = flag_path(kind='file')
IN_DIR = flag_path(kind='dir')
OUT_FILE = flag_path(kind='file', exists=False, writable=True)
OUT_DIR = flag_path(kind='dir', exists=False, writable=True)
