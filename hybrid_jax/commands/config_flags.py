"""What every command that reads a run config shares: `--config=FILE[:ARG]` with any number of `--config.KEY=VALUE`
overrides after it, the config loaded and validated once before the command runs, and the --devices flag."""

from absl import logging

from hybrid_jax import checks
from hybrid_jax.commands import parsing
from hybrid_jax.config import BASE_CONFIG, apply_overrides, load_config_file, resolve_spec, validate

DEFAULT_CONFIG = 'hybrid:arch=swa128_nope,scale=tiny'  # The packaged study grid (hybrid_jax/configs/hybrid.py).
OVERRIDES_HELP = ('Any config key is overridden with --config.KEY=VALUE (e.g. --config.train.steps=100 '
                  '--config.model.window=64); the keys and their defaults are in the packaged base config, '
                  f'{BASE_CONFIG}.')


def parser(command: str, description: str, add_flags=None):
  """The parser of config-reading `command`: --config, then the command's own flags."""
  p = parsing.ArgumentParser(prog=f'python -m hybrid_jax {command}', description=description.strip(),
                             epilog=OVERRIDES_HELP)
  p.add_argument('--config', default=DEFAULT_CONFIG, metavar='FILE[:ARG]',
                 help='a packaged config (hybrid, base, mini) or a config file, and its argument '
                 '(get_config(ARG)), e.g. hybrid:arch=gdn,scale=s1 or configs/nope_fix.py:scale=s1')
  if add_flags:
    add_flags(p)
  return p


def add_devices_flag(p, what):
  p.add_argument('--devices', type=checks.POSITIVE_INT, default=None,
                 help=f'device count of the target mesh (None: the devices present{what})')


def load_config(spec: str, overrides):
  """The validated config of `--config=FILE[:ARG]` and its `--config.KEY=VALUE` overrides, in order."""
  config = load_config_file(resolve_spec(spec))
  apply_overrides(config, overrides)
  config.lock()
  return validate(config)


def run(command: str, description: str, argv, run_fn, add_flags=None) -> int:
  """Parses `argv` for `command` (described by `description`: its main's docstring), loads its config and returns
  `run_fn(args, config)`."""
  p = parser(command, description, add_flags)
  args, rest = p.parse_known_args(argv)
  if rest and not rest[0].startswith('--config.'):
    p.error(f'unrecognized arguments: {" ".join(rest)}')
  logging.set_verbosity(logging.WARNING)
  return run_fn(args, load_config(args.config, rest))
