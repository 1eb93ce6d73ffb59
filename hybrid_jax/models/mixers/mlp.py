"""An MLP as a layer of its own (kind 'mlp'): Nemotron-H's blocks are each one mixer or one MLP.

With `model.block_mlp` False a block is norm -> its layer -> residual, so a cycle such as
('mamba2', 'mlp', 'full', 'mlp') is Nemotron-H's pattern "M-*-". The MLP is the one `model.mlp` names. It mixes
nothing across positions (role 'pointwise'): the receptive-field analyses leave it as it is.
"""

from flax import nnx

from hybrid_jax import errors
from hybrid_jax.models import layers
from hybrid_jax.models.mixers import registry


class Pointwise(nnx.Module):
  """The decode protocol of a layer that mixes nothing across positions: no state, every token computed alone."""

  def init_state(self, batch: int, max_len: int):
    del batch, max_len
    return ()

  def prefill(self, x, positions, state):
    return self(x, positions), state

  def step(self, x, position, state):
    return self(x, position), state


class MLPLayer(Pointwise):
  """model.mlp's MLP as a layer."""

  def __init__(self, cfg, spec, *, rngs: nnx.Rngs):
    del spec
    self.mlp = layers.make_mlp(cfg, rngs=rngs)

  def __call__(self, x, positions, segment_ids=None):
    del positions, segment_ids
    return self.mlp(x)


def mlp_layer_flops(cfg, spec, t: int) -> dict:
  del spec
  return {'projections': 2 * t * layers.mlp_params(cfg), 'core': 0, 'conv': 0}


def _check(cfg, used):
  if used and cfg.block_mlp:
    raise errors.invalid_config('model.block_mlp', cfg.block_mlp, "must be False when model.cycle has 'mlp' "
                                'layers (a block with an MLP of its own and an MLP layer is two MLPs)')


registry.register(registry.MixerKind(
    'mlp', build=MLPLayer, params=lambda cfg, spec=None: layers.mlp_params(cfg), flops=mlp_layer_flops,
    role='pointwise', validate=_check))
