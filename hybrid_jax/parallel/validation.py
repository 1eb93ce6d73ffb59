"""The parallel section of a run config (config.parallel), checked by the layer that builds meshes: the mesh
sizes, the logical-axis rules (names, mesh axes) and the batch against the mesh's fixed batch split. The expert
axis against the model (MoE layers, their expert count) is checked above, in hybrid_jax.config."""

from hybrid_jax import config_keys as keys
from hybrid_jax.errors import ConfigError
from hybrid_jax.parallel import rules as rules_lib


def validate(c) -> None:
  """Checks config.parallel of the run config `c` (and train.batch_size against its batch split)."""
  p = c.parallel
  for prefix in ('', 'dcn_'):
    free = []
    for axis in rules_lib.MESH_AXES:
      key = f'parallel.{prefix}{axis}'
      value = keys.value(c, key)
      if axis == 'expert' and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        keys.fail(key, value, 'must be a positive integer (its ways must divide model.moe.num_experts: no -1)')
      if isinstance(value, bool) or not isinstance(value, int) or (value <= 0 and value != -1):
        keys.fail(key, value, 'must be a positive integer or -1 (the devices the other axes leave)')
      free += [key] if value == -1 else []
    if len(free) > 1:
      keys.fail(free[1], -1, f'only one of {", ".join(free)} may be -1')
  try:
    rules = rules_lib.parse_rules(p.rules)
    rules_lib.check_rules(rules)
  except rules_lib.ShardingRuleError as e:
    raise ConfigError(str(e)) from None
  fixed = 1
  for axis in rules.get('batch', ()):
    fixed *= max(p[axis], 1) * max(p[f'dcn_{axis}'], 1)
  if c.train.batch_size % fixed:
    keys.fail('train.batch_size', c.train.batch_size, f'must be divisible by the batch split of the mesh '
              f'({"*".join(rules["batch"])} = {fixed} at least)')
  ways = p.sequence * p.dcn_sequence
  if 'sequence' in rules.get('seq', ()) and ways > 1 and c.data.seq_len % ways:
    keys.fail('data.seq_len', c.data.seq_len, f'must be divisible by the sequence ways of the mesh '
              f'(parallel.sequence * parallel.dcn_sequence = {ways})')
  keys.choice(c, 'parallel.distributed.initialize', ('auto', 'always', 'never'))
  keys.choice(c, 'parallel.distributed.cpu_collectives', ('gloo', 'mpi', 'none'))
  for key in ('initialization_timeout_s', 'heartbeat_timeout_s', 'barrier_timeout_s'):
    keys.positive_int(c, f'parallel.distributed.{key}')
  keys.number(c, 'parallel.distributed.num_processes', integer=True, nonnegative=True)  # 0 = from the environment.
  keys.number(c, 'parallel.distributed.process_id', integer=True, low=-1)  # -1 = from the environment.
  address = p.distributed.coordinator_address
  if address and ':' not in address:
    keys.fail('parallel.distributed.coordinator_address', address, 'must be host:port')
