"""The train state as a plain pytree: {'step', 'params', 'opt_state'}; the model's graph stays outside.

Params are a nested dict of arrays (nnx pure dict), which optax, orbax and sharding rules all treat alike;
`bind` turns them back into a module inside a jitted function.
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax.models.model import HybridLM


@dataclasses.dataclass(frozen=True)
class ModelDef:
  """Everything static about a model: its graph and the abstract nnx state (with logical-axis metadata)."""
  graphdef: nnx.GraphDef
  abstract_state: nnx.State

  def bind(self, params) -> HybridLM:
    """A module view of `params` (a pure dict of arrays); safe inside jit."""
    state = jax.tree.map(lambda x: x, self.abstract_state)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(self.graphdef, state)


def init_model(model_cfg, seed: int):
  """(ModelDef, params) with params initialised from `seed`."""
  model = HybridLM(model_cfg, rngs=nnx.Rngs(params=seed))
  graphdef, state = nnx.split(model)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
  return ModelDef(graphdef, abstract), nnx.to_pure_dict(state)


def init_train_state(params, tx) -> dict:
  return {'step': jnp.zeros((), jnp.int32), 'params': params, 'opt_state': tx.init(params)}


def abstract_train_state(state) -> dict:
  """Shapes and dtypes of a train state: the restore target for checkpoints."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), state)
