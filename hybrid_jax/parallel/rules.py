"""Logical axis names -> mesh axes, from `config.parallel.rules`.

Parameters carry logical axis names (`logical_axes` metadata); the rules say which mesh axes each name is split
over, so one model definition serves data parallel, FSDP and tensor parallel alike. A tensor whose rules would
use one mesh axis twice is a configuration error (it cannot be laid out), reported with the tensor's name.
A dimension that the mesh axes do not divide, or whose logical name has no rule, stays replicated and is flagged
in the sharding report.
"""

import dataclasses

from hybrid_jax.errors import UserError

# Outer to inner: the inner axes get the nearest chips. The batch's axes (data, fsdp, expert) come first, so each
# host holds one contiguous block of rows; 'expert' sits inside them since its exchange runs every MoE layer.
MESH_AXES = ('data', 'fsdp', 'expert', 'sequence', 'tensor')
LOGICAL_AXES = ('batch', 'seq', 'embed', 'heads', 'kv_heads', 'head_dim', 'mlp', 'vocab', 'state', 'layers', 'expert')


class ShardingRuleError(UserError, ValueError):
  """The logical-axis rules cannot lay out a tensor (or name unknown axes)."""


def parse_rules(rules_cfg) -> dict[str, tuple[str, ...]]:
  """{'embed': ('fsdp',), ...} from the config's {logical name: 'mesh_axis[,mesh_axis]' or ''}."""
  out = {}
  for name, value in dict(rules_cfg).items():
    if name not in LOGICAL_AXES:
      raise ShardingRuleError(f'config.parallel.rules.{name}: unknown logical axis; known: {", ".join(LOGICAL_AXES)}')
    axes = tuple(a.strip() for a in str(value or '').split(',') if a.strip())
    for a in axes:
      if a not in MESH_AXES:
        raise ShardingRuleError(f'config.parallel.rules.{name}={value!r}: unknown mesh axis {a!r}; '
                                f'mesh axes: {", ".join(MESH_AXES)}')
    if len(set(axes)) != len(axes):
      raise ShardingRuleError(f'config.parallel.rules.{name}={value!r} names a mesh axis twice')
    out[name] = axes
  return out


# Logical axes that occur together in one parameter (with a possible leading 'layers') or in the token inputs:
# rules that put two of them on the same mesh axis are rejected when the config is validated. (Activations may
# share a mesh axis between batch and embed: FSDP splits the batch of activations and the width of weights.)
CO_OCCURRING = (
    ('layers', 'vocab', 'embed'), ('layers', 'embed', 'mlp'), ('layers', 'expert', 'embed', 'mlp'), ('layers', 'embed', 'heads', 'head_dim'),
    ('layers', 'embed', 'kv_heads', 'head_dim'), ('layers', 'heads', 'head_dim', 'state'), ('batch', 'seq'),
)


def check_rules(rules: dict) -> None:
  """Raises ShardingRuleError when two logical axes of one tensor map to the same mesh axis."""
  for group in CO_OCCURRING:
    used = {}
    for logical in group:
      for a in rules.get(logical, ()):
        if a in used:
          raise ShardingRuleError(
              f'config.parallel.rules: {used[a]!r} and {logical!r} both map to mesh axis {a!r}, but they are '
              f'dimensions of one tensor ({", ".join(group)}); a mesh axis can split only one of them')
        used[a] = logical


@dataclasses.dataclass(frozen=True)
class Layout:
  """The PartitionSpec of one tensor, and the dimensions left replicated although a rule asked to split them."""
  spec: object  # jax.sharding.PartitionSpec
  unsplit: tuple[str, ...] = ()  # 'vocab (257 % 2 != 0)'-style notes.


def layout(name: str, shape, logical_axes, rules: dict, mesh_shape: dict) -> Layout:
  """Maps `logical_axes` of the tensor `name` (with `shape`) to a PartitionSpec over a mesh of `mesh_shape`."""
  from jax.sharding import PartitionSpec as P
  if logical_axes is None or len(logical_axes) != len(shape):
    raise ShardingRuleError(f'{name}: logical axes {logical_axes} do not match its shape {tuple(shape)}')
  used, spec, unsplit = {}, [], []
  for dim, logical in zip(shape, logical_axes):
    if logical is not None and logical not in rules and logical not in LOGICAL_AXES:
      unsplit.append(f'{logical} (no rule for this logical axis)')  # Replicated, and the report says why.
    for a in rules.get(logical, ()):  # Checked on every mesh, so a 1-device run catches what a pod would hit.
      if a in used:
        raise ShardingRuleError(
            f'{name}: logical axes {used[a]!r} and {logical!r} both map to mesh axis {a!r} '
            f'(config.parallel.rules); a mesh axis can split only one dimension of a tensor')
      used[a] = logical
    axes = tuple(a for a in rules.get(logical, ()) if mesh_shape.get(a, 1) > 1)
    size = 1
    for a in axes:
      size *= mesh_shape[a]
    if axes and dim % size:
      unsplit.append(f'{logical} ({dim} % {size} != 0)')
      axes = ()
    spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
  return Layout(P(*spec), tuple(unsplit))
