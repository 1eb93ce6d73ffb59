"""`python -m hybrid_jax train`: train (or resume) a run in the workdir and write its report."""

import os
import pathlib
import sys

from hybrid_jax import checks
from hybrid_jax.commands import config_flags


def _workdir(args, config) -> pathlib.Path:
  """The run directory: a folder that exists or can be made, checked before anything is built."""
  from hybrid_jax.train import runs
  workdir = runs.local_workdir(args.workdir or pathlib.Path('runs') / config.name)
  return checks.path(workdir, '--workdir', kind='dir', exists=False, writable=True)


def run(args, config):
  from hybrid_jax import standard_hooks
  from hybrid_jax.parallel import distributed
  from hybrid_jax.train import loop
  workdir = _workdir(args, config)
  try:  # A refusal (another trainer holds the workdir, or the config would change the run) is a user error.
    result = standard_hooks.train(config, workdir)
  except distributed.DistributedError as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)  # A normal exit would wait at jax's shutdown barrier for the dead process and abort.
  print(loop.summary_line(result))
  print(f'report: {workdir / "report.json"}')
  return 0 if result['status'] == 'completed' else 143


def _add_flags(parser):
  parser.add_argument('--workdir', default=None, type=checks.OUT_DIR,
                      help='run directory (checkpoints, metrics, report); None means runs/<config.name>')


def main(argv) -> int:
  """Train (or resume) a run in the workdir and write its report."""
  return config_flags.run('train', main.__doc__, argv, run, _add_flags)
