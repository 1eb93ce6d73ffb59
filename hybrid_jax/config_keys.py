"""Reading and checking one key of a run config: the helpers each layer's validation uses (models, data, parallel,
and the top-level sections in hybrid_jax.config), so every error names the key, the value and what is allowed in
one wording (`config.KEY=VALUE is invalid: ALLOWED`)."""

from hybrid_jax import checks
from hybrid_jax.errors import ConfigError, InputError, invalid_config


def fail(key, value, allowed):
  raise invalid_config(key, value, allowed)


def value(c, key):
  """The value at dotted `key`; ConfigError saying the config does not start from the base config if absent."""
  node = c
  for part in key.split('.'):
    if part not in node:
      raise ConfigError(f'config.{key} is missing (start from the packaged base config, '
                        'hybrid_jax/configs/base.py, which defines every key)')
    node = node[part]
  return node


def number(c, key, **bounds):
  """The number at `key` checked by hybrid_jax.checks.number (finite, within `bounds`); ConfigError naming it."""
  try:
    return checks.number(value(c, key), f'config.{key}', **bounds)
  except InputError as e:
    raise ConfigError(str(e)) from None


def positive_int(c, key):
  return number(c, key, integer=True, positive=True)


def nonnegative(c, key):
  return number(c, key, nonnegative=True)


def choice(c, key, allowed):
  found = value(c, key)
  if found not in allowed:
    fail(key, found, f'allowed: {", ".join(allowed)}')
  return found


def boolean(c, key):
  found = value(c, key)
  if not isinstance(found, bool):
    fail(key, found, 'must be True or False')
  return found
