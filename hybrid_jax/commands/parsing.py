"""The one command-line style of every `python -m hybrid_jax` command: argparse parsers whose --help lists each flag
with its default, and user errors reported as one `error: …` line with exit status 2 (no traceback).

The one place that catches user errors is `run`: every user-facing error class derives from
hybrid_jax.errors.UserError. Unexpected internal errors are not caught and keep their traceback.
"""

import argparse
import errno
import sys

from hybrid_jax import checks
from hybrid_jax.errors import UserError

USAGE_ERROR = 2


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
  """Shows each flag's default and keeps the description's line breaks. A help text that says its default itself
  (`(default: the newest)`), or a flag whose default is None, gets no second, meaningless `(default: None)`."""

  def _get_help_string(self, action):
    if action.default is None or '(default' in (action.help or ''):
      return action.help
    return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
  """argparse with defaults in --help and a one-line `error: …` (status 2) for a bad command line."""

  def __init__(self, *args, **kwargs):
    kwargs.setdefault('formatter_class', HelpFormatter)
    super().__init__(*args, **kwargs)

  def error(self, message):
    fail(f'{self.prog}: {message} (see {self.prog} --help)')


def fail(message: str):
  """Prints `error: message` on stderr and exits with the usage-error status."""
  print(f'error: {message}', file=sys.stderr, flush=True)
  sys.exit(USAGE_ERROR)


# Filesystem refusals that name a path: the path or the machine is at fault (a name too long, no space, no
# permission, a read-only or missing folder), not the program, so they are one line like any user error.
_PATH_ERRNOS = {errno.ENAMETOOLONG, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT,
                errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENOTEMPTY, errno.ELOOP, errno.EFBIG}


def run(fn, *args) -> int:
  """fn(*args)'s exit status; a user error, or a filesystem refusal naming a path, becomes one `error: …` line and
  status 2."""
  try:
    return fn(*args)
  except UserError as e:
    print(f'error: {e}', file=sys.stderr, flush=True)  # A message listing several causes keeps a line for each.
    return USAGE_ERROR
  except OSError as e:
    if e.errno not in _PATH_ERRNOS or not e.filename:
      raise
    print(f'error: {checks.shown_path(e.filename)}: {e.strerror}', file=sys.stderr, flush=True)
    return USAGE_ERROR
