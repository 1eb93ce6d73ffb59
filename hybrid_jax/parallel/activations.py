"""Sharding constraints on activations by logical axis names, active only while a sharded step is traced.

Parameters get their layouts from the rules; activations between blocks get them here, so GSPMD does not have
to guess the residual stream's layout at scan boundaries (which it can get wrong, e.g. gathering the batch).
The model calls `constrain(x, axes)` unconditionally; outside `sharded(...)` (one device, decoding, analysis)
it returns x untouched, so no model code depends on a mesh.
"""

import contextlib
import contextvars

import jax
from jax.sharding import NamedSharding

from hybrid_jax.parallel import rules as rules_lib

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


def constrain(x, logical_axes):
  """`x` constrained to the layout of `logical_axes`, or `x` itself when no sharded step is being traced."""
  active = _ACTIVE.get()
  if active is None:
    return x
  mesh, rules = active
  spec = rules_lib.layout('activation', x.shape, logical_axes, rules, dict(mesh.shape)).spec
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
