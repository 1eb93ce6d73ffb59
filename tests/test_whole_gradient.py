"""layers.whole_gradient: the identity, whose gradient passes an optimization barrier on CPU and nothing elsewhere;
layers.rope's tables, made whole on CPU alike."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.kernels import platform
from hybrid_jax.models import layers


def _loss(x, w):
  """A matmul whose output feeds an activation: the shape whose gradient XLA:CPU would fuse into a transpose."""
  return jnp.sum(jax.nn.silu(layers.whole_gradient(x @ w)) * jnp.arange(w.shape[1]))


@pytest.mark.parametrize('where', ['cpu', 'tpu'])
def test_value_and_gradients_are_the_plain_ones(where):
  rng = np.random.default_rng(0)
  x, w = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((16, 8), (8, 12)))
  with platform.targeting(where):
    got = jax.jit(jax.value_and_grad(_loss, (0, 1)))(x, w)
  plain = lambda x, w: jnp.sum(jax.nn.silu(x @ w) * jnp.arange(w.shape[1]))
  want = jax.jit(jax.value_and_grad(plain, (0, 1)))(x, w)
  for g, h in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, h, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('where,barrier', [('cpu', True), ('tpu', False), ('gpu', False)])
def test_the_barrier_is_in_the_backward_on_cpu_only(where, barrier):
  x = jnp.ones((4, 8))
  with platform.targeting(where):
    forward = str(jax.make_jaxpr(_loss)(x, x.T))
    backward = str(jax.make_jaxpr(jax.grad(_loss, (0, 1)))(x, x.T))
  assert 'optimization_barrier' not in forward
  assert ('optimization_barrier' in backward) == barrier


@pytest.mark.parametrize('where,barrier', [('cpu', True), ('tpu', False)])
def test_rope_makes_its_tables_whole_on_cpu_only(where, barrier):
  x, positions = jnp.ones((1, 6, 2, 8)), jnp.arange(6)
  with platform.targeting(where):
    jaxpr = str(jax.make_jaxpr(lambda x: layers.rope(x, positions, base=100.0))(x))
  assert ('optimization_barrier' in jaxpr) == barrier


@pytest.mark.parametrize('arch,projections,rope_layers', [('swa128', 2 * 3 + 2 * 2, 2), ('gdn', 6 + 3 + 2 * 2, 1)])
def test_the_model_makes_every_projections_gradient_whole_on_cpu(arch, projections, rope_layers):
  """The mini hybrids: attention q/k/v, the MLPs' gate and up, GDN's q/k/v/gate, beta and decay projections (and
  RoPE's tables, whose barrier shows in both passes)."""
  from flax import nnx
  from hybrid_jax.config import load_config_file, resolve_spec
  from hybrid_jax.models.model import HybridLM
  model = HybridLM(load_config_file(resolve_spec(f"mini:arch={arch}")).model, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  loss = lambda s: jnp.sum(nnx.merge(graphdef, s)(jnp.zeros((1, 8), jnp.int32)))
  def barriers(where):
    with platform.targeting(where):
      return str(jax.make_jaxpr(jax.grad(loss))(state)).count('optimization_barrier')
  assert barriers('tpu') == 0
  assert barriers('cpu') == projections + 2 * rope_layers
