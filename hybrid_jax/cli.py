"""Command-line entry: `python -m hybrid_jax <command> [--config=FILE[:ARG]] [--config.key=value ...]`.

Commands are a registry (name -> function of the parsed flags); each validates its config before anything
compiles. `python -m hybrid_jax help` lists them.
"""

import json
import pathlib
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from hybrid_jax.config import ConfigError, validate

DEFAULT_CONFIG = str(pathlib.Path(__file__).resolve().parents[1] / 'configs' / 'hybrid.py') + \
    ':arch=swa128_nope,scale=tiny'

_CONFIG = config_flags.DEFINE_config_file('config', DEFAULT_CONFIG, 'Config file[:arg] (ml_collections).',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory (checkpoints, metrics, report). '
                               'Default: runs/<config.name>.')


def _workdir(config) -> pathlib.Path:
  return pathlib.Path(_WORKDIR.value or pathlib.Path('runs') / config.name)


def cmd_train(config):
  """Train (or resume) a run in the workdir and write its report."""
  from hybrid_jax.train import loop
  result = loop.train(config, _workdir(config))
  print(loop.summary_line(result))
  print(f'report: {_workdir(config) / "report.json"}')
  return 0 if result['status'] == 'completed' else 143


def cmd_params(config):
  """Print parameter counts (non_embedding, embedding, total, per layer) as one JSON object."""
  from hybrid_jax.models.counting import param_counts
  print(json.dumps(param_counts(config.model), indent=2))
  return 0


COMMANDS = {'train': cmd_train, 'params': cmd_params}
# Commands with their own argument parsing (no --config): name -> 'module:function(argv)'.
RAW_COMMANDS = {'bench': 'hybrid_jax.bench:main', 'build-tfds': 'hybrid_jax.data.tfds_local:main'}


def _usage() -> str:
  lines = ['usage: python -m hybrid_jax <command> [flags]', 'commands:']
  lines += [f'  {name:8s} {fn.__doc__.strip().splitlines()[0]}' for name, fn in COMMANDS.items()]
  lines += [f'  {name:8s} see python -m hybrid_jax {name} --help' for name in RAW_COMMANDS]
  return '\n'.join(lines)


def main(argv=None):
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] in ('help', '-h', '--help'):
    print(_usage())
    sys.exit(0 if len(argv) >= 2 else 2)
  command, rest = argv[1], argv[2:]
  if command in RAW_COMMANDS:
    module_name, fn_name = RAW_COMMANDS[command].split(':')
    module = __import__(module_name, fromlist=[fn_name])
    sys.exit(getattr(module, fn_name)(rest))
  if command not in COMMANDS:
    print(f'unknown command {command!r}\n{_usage()}', file=sys.stderr)
    sys.exit(2)

  def run(_):
    try:
      config = validate(_CONFIG.value)
    except ConfigError as e:
      print(f'error: {e}', file=sys.stderr)
      return 2
    return COMMANDS[command](config)

  logging.set_verbosity(logging.WARNING)
  app.run(run, argv=[f'{argv[0]} {command}'] + rest)
