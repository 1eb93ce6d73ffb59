"""The one command-line style of every `python -m hybrid_jax` command: argparse parsers whose --help lists each flag
with its default, and user errors reported as one `error: …` line with exit status 2 (no traceback).

Unexpected internal errors are not caught here and keep their traceback.
"""

import argparse
import sys

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


def user_errors() -> tuple:
  """The exception types that mean bad input (config, data, run directory, checkpoint), not a bug.

  Imported only when an exception is being handled, so the commands start without loading these modules.
  """
  from hybrid_jax.analysis.needles import NeedleError
  from hybrid_jax.analysis.scaling_law import FitDataError
  from hybrid_jax.config import ConfigError
  from hybrid_jax.data.jsonl import JsonlError
  from hybrid_jax.data.sources import DataError
  from hybrid_jax.eval.suite import EvalError
  from hybrid_jax.hf import HFError
  from hybrid_jax.parallel.mesh import MeshError
  from hybrid_jax.parallel.rules import ShardingRuleError
  from hybrid_jax.runs import RunError
  from hybrid_jax.train.checkpoint import CheckpointError
  from hybrid_jax.train.session import REFUSALS  # Another trainer holds the workdir, or a resume changes the run.
  return (ConfigError, DataError, JsonlError, RunError, HFError, MeshError, ShardingRuleError, EvalError,
          NeedleError, FitDataError, CheckpointError, *REFUSALS)


def run(fn, *args) -> int:
  """fn(*args)'s exit status; a user error becomes one `error: …` line and status 2."""
  try:
    return fn(*args)
  except Exception as e:  # pylint: disable=broad-except
    if not isinstance(e, user_errors()):
      raise
    print(f'error: {e}', file=sys.stderr, flush=True)  # A message listing several causes keeps a line for each.
    return USAGE_ERROR
