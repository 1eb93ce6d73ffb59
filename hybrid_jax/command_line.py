"""The one command-line style of every `python -m hybrid_jax` command: argparse parsers whose --help lists each flag
with its default, and user errors reported as one `error: …` line with exit status 2 (no traceback).

The one place that catches user errors is `run`: every user-facing error class derives from
hybrid_jax.errors.UserError. Unexpected internal errors are not caught and keep their traceback.
"""

import argparse
import sys

from hybrid_jax.errors import UserError

USAGE_ERROR = 2


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
  """Shows each flag's default and keeps the description's line breaks."""


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


def run(fn, *args) -> int:
  """fn(*args)'s exit status; a user error becomes one `error: …` line and status 2."""
  try:
    return fn(*args)
  except UserError as e:
    print(f'error: {e}', file=sys.stderr, flush=True)  # A message listing several causes keeps a line for each.
    return USAGE_ERROR
