"""A mixer defined outside the package, in this one file: causal mean pooling.

y_t = W_out · mean_{s <= t} W_in x_s. It exists to prove that a new mixer is a one-file change: the registry entry
at the bottom is everything the project learns about it (tests/test_mixer_registry.py), loaded by naming this
module in `model.mixer_modules`.
"""

import jax.numpy as jnp
from flax import nnx

from hybrid_jax.models import layers
from hybrid_jax.models.mixers import registry


class MeanPool(nnx.Module):
  """Causal mean of a projection of the inputs; its decode state is the running sum."""

  def __init__(self, cfg, spec, *, rngs: nnx.Rngs):
    del spec
    pdt = layers.dtype_of(cfg.param_dtype)
    std, out_std = layers.init_stds(cfg)
    self.w_in = layers.param(rngs, (cfg.d_model, cfg.meanpool.width), ('embed', 'mlp'), std=std, dtype=pdt)
    self.w_out = layers.param(rngs, (cfg.meanpool.width, cfg.d_model), ('mlp', 'embed'), std=out_std, dtype=pdt)
    self.dtype = layers.dtype_of(cfg.dtype)

  def _project(self, x):
    return (x.astype(self.dtype) @ self.w_in[...].astype(self.dtype)).astype(jnp.float32)

  def _out(self, mean):
    return layers.checkpoint_name(mean.astype(self.dtype) @ self.w_out[...].astype(self.dtype), layers.MIXER_OUT)

  def __call__(self, x, positions, segment_ids=None):
    """With segment_ids [B, T] the mean runs over the token's own document only."""
    del positions
    v = self._project(x)
    if segment_ids is None:
      count = jnp.arange(1, x.shape[1] + 1, dtype=jnp.float32)[:, None]
      return self._out(jnp.cumsum(v, axis=1) / count)
    same = segment_ids[:, :, None] == segment_ids[:, None, :]  # [B, T, S]: query t, key s.
    visible = (same & jnp.tril(jnp.ones((x.shape[1],) * 2, bool)))[..., None].astype(v.dtype)
    return self._out(jnp.sum(visible * v[:, None], axis=2) / jnp.sum(visible, axis=2))

  def init_state(self, batch: int, max_len: int):
    del max_len
    return {'sum': jnp.zeros((batch, self.w_in.shape[-1]), jnp.float32)}

  def prefill(self, x, positions, state):
    del positions
    return self(x, None), {'sum': state['sum'] + self._project(x).sum(axis=1)}

  def step(self, x, position, state):
    total = state['sum'] + self._project(x)[:, 0]
    return self._out(total / (position + 1.0))[:, None], {'sum': total}


def _params(cfg, spec):
  del spec
  return 2 * cfg.d_model * cfg.meanpool.width


def _flops(cfg, spec, t):
  del spec
  width = cfg.meanpool.width
  return {'projections': 2 * t * 2 * cfg.d_model * width, 'core': 2 * t * width, 'conv': 0}  # Running sum, divide.


registry.register(registry.MixerKind(
    'meanpool', build=MeanPool, params=_params, flops=_flops, section='meanpool',
    fields={'width': registry.positive_int(24, 'Width of the pooled projection.')}))
