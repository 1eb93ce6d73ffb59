"""The one base class of user errors: bad input (a config, a flag, data, a run directory, a checkpoint), not a bug.

This module sits at the bottom of the package and imports nothing from it, so every layer raises its own subclass
(ConfigError, DataError, RunError, ...) without importing the command line or another layer's errors. The command
line catches UserError alone (hybrid_jax.commands.parsing.run): one `error: <message>` line, exit status 2. Any other
exception is a bug and keeps its traceback.
"""


class UserError(Exception):
  """Bad input; the message names the thing (a key, a flag, a file) and what is allowed."""


class InputError(UserError, ValueError):
  """A command-line value or path failed a shared check (hybrid_jax.checks)."""


class ConfigError(UserError, ValueError):
  """A config value or a config file is invalid; the message names the key, the value and what is allowed."""


class DataError(UserError, ValueError):
  """An input file (data, a table, a run directory's record) is missing or malformed; the message names the file
  and, where known, the line or key (hybrid_jax.readers raises it for every structured format)."""


def invalid_config(key: str, value, allowed: str) -> ConfigError:
  """The one wording of a bad config value: `config.KEY=VALUE is invalid: ALLOWED` (raise what it returns)."""
  return ConfigError(f'config.{key}={value!r} is invalid: {allowed}')
