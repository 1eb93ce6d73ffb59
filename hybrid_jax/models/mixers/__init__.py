"""Token mixers: attention (full, sliding-window, head-wise) and the recurrent Lightning, Mamba-2 and GDN.

Every kind is declared in its own module's registry entry (registry.py says what an entry holds).
"""

from hybrid_jax.models.mixers import registry


def make_mixer(model_cfg, spec, *, rngs):
  """The mixer module for one layer spec (see hybrid_jax.models.pattern)."""
  return registry.get(spec.kind).build(model_cfg, spec, rngs=rngs)
