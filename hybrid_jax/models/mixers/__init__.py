"""Token mixers: attention (full, sliding-window, head-wise) and the recurrent Lightning, Mamba-2 and GDN."""

from hybrid_jax.models.mixers.attention import Attention
from hybrid_jax.models.mixers.gated_deltanet import GatedDeltaNet
from hybrid_jax.models.mixers.lightning import Lightning
from hybrid_jax.models.mixers.mamba2 import Mamba2

_RECURRENT = {'lightning': Lightning, 'mamba2': Mamba2, 'gdn': GatedDeltaNet}


def make_mixer(model_cfg, spec, *, rngs):
  """The mixer module for one layer spec (see hybrid_jax.models.pattern)."""
  if spec.kind in ('full', 'swa', 'headwise'):
    return Attention(model_cfg, spec, rngs=rngs)
  if spec.kind in _RECURRENT:
    return _RECURRENT[spec.kind](model_cfg, spec, rngs=rngs)
  raise ValueError(f'no mixer for layer kind {spec.kind!r}')
