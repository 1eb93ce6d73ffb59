"""`python -m hybrid_jax shardings`: each parameter's sharding on the configured mesh."""

from hybrid_jax.commands import config_flags


def run(args, config):
  import jax
  from hybrid_jax.parallel import mesh as mesh_lib, rules as rules_lib
  from hybrid_jax.train import state as state_lib
  ici, dcn = mesh_lib.mesh_shape(config.parallel, args.devices or jax.device_count())
  shape = {a: ici[a] * dcn[a] for a in ici}  # The mesh's axes: 'expert' only when it has several devices.
  _, text = mesh_lib.sharding_report(state_lib.make_model_def(config.model), rules_lib.parse_rules(
      config.parallel.rules), shape)
  print(text)
  return 0


def main(argv) -> int:
  """Print each parameter's sharding on the configured mesh and flag tensors left replicated."""
  return config_flags.run('shardings', main.__doc__, argv, run, lambda parser: config_flags.add_devices_flag(parser, ''))
