"""Argument parsing shared by the launchers: launcher flags, then `--`, then the hybrid_jax command."""

import sys


def parse(parser, argv, default_command=()):
  """Parses the launcher's own flags (before `--`); `.command` holds what follows `--` (or default_command)."""
  argv = list(sys.argv[1:] if argv is None else argv)
  cut = argv.index('--') if '--' in argv else len(argv)
  args = parser.parse_args(argv[:cut])
  args.command = argv[cut + 1:] or list(default_command)  # The hybrid_jax command and its flags, after --.
  return args
