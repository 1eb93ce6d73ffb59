"""`python -m hybrid_jax params`: print a config's parameter counts."""

import json

from hybrid_jax.commands import config_flags


def run(args, config):  # pylint: disable=unused-argument
  from hybrid_jax.models.counting import param_counts
  print(json.dumps(param_counts(config.model), indent=2))
  return 0


def main(argv) -> int:
  """Print parameter counts (non_embedding, embedding, total, per layer) as one JSON object."""
  return config_flags.run('params', main.__doc__, argv, run)
