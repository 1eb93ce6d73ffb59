"""Sharding constraints on activations by logical axis names, active only while a sharded step is traced.

Parameters get their layouts from the rules; activations between blocks get them here, so GSPMD does not have
to guess the residual stream's layout at scan boundaries (which it can get wrong, e.g. gathering the batch).
The model calls `constrain(x, axes)` unconditionally; outside `sharded(...)` (one device, decoding, analysis)
it returns x untouched, so no model code depends on a mesh.
"""

import contextlib
import contextvars
import math

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from hybrid_jax.parallel import rules as rules_lib
from hybrid_jax.parallel import sequence

# Logical axes of the activations the model constrains. The residual width stays unsplit (None): FSDP splits
# weights by 'embed' and the batch of activations, never both on one tensor.
RESIDUAL = ('batch', 'seq', None)
LOGITS = ('batch', 'seq', 'vocab')

_ACTIVE = contextvars.ContextVar('hybrid_jax_activation_sharding', default=None)


@contextlib.contextmanager
def sharded(mesh, rules: dict):
  """Within this context (around tracing a step), `constrain` lays activations out on `mesh` by `rules`."""
  token = _ACTIVE.set((mesh, rules))
  try:
    yield
  finally:
    _ACTIVE.reset(token)


def active_step():
  """(mesh, rules) of the sharded step being traced (within `sharded`), or None outside one."""
  return _ACTIVE.get()


def constrain(x, logical_axes):
  """`x` constrained to the layout of `logical_axes`, or `x` itself when no sharded step is being traced."""
  active = _ACTIVE.get()
  if active is None:
    return x
  mesh, rules = active
  spec = rules_lib.layout('activation', x.shape, logical_axes, rules, dict(mesh.shape)).spec
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def shard_local(fn, args, in_axes, out_axes, *, tied=()):
  """`fn(*args, shards=...)` computed shard by shard (shard_map) over the active mesh, or with `shards=None`
  outside `sharded(...)`.

  Kernels that are custom calls (Pallas, cuDNN) are opaque to GSPMD, which would gather their operands whole onto
  every device; here each device runs the kernel on its own part. Operand i is split by its logical axes
  `in_axes[i]` (None operands pass through whole); an output dimension is split as the input dimensions of the same
  logical name. Logical names in `tied` (e.g. query and kv heads, whose grouping the kernel relies on) are split only
  when every operand dimension that carries them splits the same way; otherwise they all stay whole. When the
  operands' 'seq' dimension is split, `fn` gets the split as `shards` (hybrid_jax.parallel.sequence.Shards) and
  must exchange what its math needs across it; otherwise `shards` is None and each device holds whole rows.
  """
  active = _ACTIVE.get()
  if active is None:
    return fn(*args, shards=None)
  mesh, rules = active
  shape = dict(mesh.shape)
  present = [i for i, a in enumerate(args) if a is not None]
  specs = {i: list(rules_lib.layout('kernel operand', args[i].shape, in_axes[i], rules, shape).spec)
           for i in present}
  tied_splits = {specs[i][d] for i in present for d, name in enumerate(in_axes[i]) if name in tied}
  if len(tied_splits) > 1:
    for i in present:
      specs[i] = [None if name in tied else s for s, name in zip(specs[i], in_axes[i])]
  split_of = {name: specs[i][d] for i in present for d, name in enumerate(in_axes[i]) if name is not None}

  local = _on_present(fn, args, present, _shards(split_of.get('seq'), shape))
  out_specs = jax.tree.map(lambda axes: P(*(split_of.get(name) for name in axes)), out_axes,
                           is_leaf=lambda x: isinstance(x, tuple) and all(isinstance(n, (str, type(None))) for n in x))
  return jax.shard_map(local, mesh=mesh, in_specs=tuple(P(*specs[i]) for i in present), out_specs=out_specs,
                       check_vma=False)(*(args[i] for i in present))


def _shards(axes, mesh_shape: dict):
  """The Shards of a 'seq' dimension split over mesh `axes` (a name, a tuple of names, or None: whole rows)."""
  if axes is None:
    return None
  return sequence.Shards(axes, math.prod(mesh_shape[a] for a in ((axes,) if isinstance(axes, str) else axes)))


def _on_present(fn, args, present, shards):
  """fn over the operands that are not None (`present`, as shard_map passes them), the others None, with `shards`."""
  def local(*xs):
    full = list(args)
    for i, x in zip(present, xs):
      full[i] = x
    return fn(*full, shards=shards)
  return local


def _sequence_split(length: int):
  """(mesh, Shards) of a sequence of `length` split in the active sharded step, or None (whole rows)."""
  active = _ACTIVE.get()
  if active is None:
    return None
  mesh, rules = active
  axes = rules_lib.layout('sequence', (1, length), (None, 'seq'), rules, dict(mesh.shape)).spec[1]
  return None if axes is None else (mesh, _shards(axes, dict(mesh.shape)))


def sequence_ways(length: int) -> int:
  """Into how many shards the active sharded step splits a sequence of `length` (1: whole rows)."""
  split = _sequence_split(length)
  return 1 if split is None else split[1].count


def sequence_local(fn, args, out_ranks):
  """`fn(*args, shards=...)` with only the sequence split manual (shard_map over the mesh axes of the `seq` rule,
  every other axis left to GSPMD), or with `shards=None` when no sharded step splits the sequence.

  For element-wise-in-time layers that need a few neighbouring tokens (short convolutions): each operand is
  [B, T, ...] split on T; each output of rank 0 < r is split on T, outputs listed with rank -r are whole rows
  (the same on every shard)."""
  split = _sequence_split(next(a.shape[1] for a in args if a is not None))
  if split is None:
    return fn(*args, shards=None)
  mesh, shards = split
  axes = shards.axis
  names = (axes,) if isinstance(axes, str) else tuple(axes)
  present = [i for i, a in enumerate(args) if a is not None]
  local = _on_present(fn, args, present, shards)
  out_specs = tuple(P(None, axes) if r > 0 else P() for r in out_ranks)
  return jax.shard_map(local, mesh=mesh, in_specs=tuple(P(None, axes) for _ in present), out_specs=out_specs,
                       axis_names=frozenset(names), check_vma=False)(*(args[i] for i in present))
