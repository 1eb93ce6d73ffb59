"""Token mixers: attention (full, sliding-window, head-wise); the recurrent mixers arrive later."""

from hybrid_jax.models.mixers.attention import Attention


def make_mixer(model_cfg, spec, *, rngs):
  """The mixer module for one layer spec (see hybrid_jax.models.pattern)."""
  if spec.kind in ('full', 'swa', 'headwise'):
    return Attention(model_cfg, spec, rngs=rngs)
  raise ValueError(f'no mixer for layer kind {spec.kind!r}')
