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


def make_model_def(model_cfg) -> ModelDef:
  """The ModelDef without materialising any parameter (shapes and metadata only)."""
  graphdef, state = nnx.split(nnx.eval_shape(lambda: HybridLM(model_cfg, rngs=nnx.Rngs(params=0))))
  return ModelDef(graphdef, state)


def init_params(model_cfg, seed):
  """Freshly initialised params (a pure dict); call under jit or eval_shape."""
  return nnx.to_pure_dict(nnx.split(HybridLM(model_cfg, rngs=nnx.Rngs(params=seed)))[1])


def init_model(model_cfg, seed: int, shardings=None):
  """(ModelDef, params) with params initialised from `seed`, created directly with `shardings` when given."""
  params = jax.jit(lambda: init_params(model_cfg, seed), out_shardings=shardings)()
  return make_model_def(model_cfg), params


def init_train_state(params, tx) -> dict:
  return {'step': jnp.zeros((), jnp.int32), 'params': params, 'opt_state': tx.init(params)}


def init_sharded_train_state(model_cfg, seed: int, tx, shardings: dict) -> dict:
  """The initial train state, each array created on its devices (no full copy on one device first)."""
  return jax.jit(lambda: init_train_state(init_params(model_cfg, seed), tx), out_shardings=shardings)()


def abstract_initial_state(model_cfg, seed: int, tx) -> dict:
  """Shapes and dtypes of the initial train state, computed without allocating it."""
  return jax.eval_shape(lambda: init_train_state(init_params(model_cfg, seed), tx))


def abstract_train_state(state, shardings=None) -> dict:
  """Shapes, dtypes (and target shardings) of a train state: the restore target for checkpoints.

  With `shardings` a checkpoint written on any mesh is read straight into this one's layout.
  """
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))
                          if not isinstance(x, jax.ShapeDtypeStruct) else x, state)
  if shardings is None:
    return abstract
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
