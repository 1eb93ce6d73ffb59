"""layers.projections: matmuls of one input whose backward, on CPU only, makes the outputs' gradients and the
transposed input whole behind one optimization barrier (row-major weight gradients); layers.rope's tables, made
whole on CPU alike."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.kernels import platform
from hybrid_jax.models import layers


def _loss(x, w1, w2):
  """Two projections of one input, one feeding an activation: the shape whose gradient XLA:CPU would fuse into a
  transpose."""
  a, b = layers.projections(x, (w1, w2))
  return jnp.sum(jax.nn.silu(a) * jnp.arange(w1.shape[1])) + jnp.sum(jnp.square(b))


def _plain(x, w1, w2):
  return jnp.sum(jax.nn.silu(x @ w1) * jnp.arange(w1.shape[1])) + jnp.sum(jnp.square(x @ w2))


@pytest.mark.parametrize('where', ['cpu', 'tpu'])
def test_values_and_gradients_are_the_plain_ones(where):
  """Inputs of rank 3 (the model's [B, T, d]), both weights' gradients and the input's (summed over the two)."""
  rng = np.random.default_rng(0)
  x, w1, w2 = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((2, 16, 8), (8, 12), (8, 5)))
  with platform.targeting(where):
    got = jax.jit(jax.value_and_grad(_loss, (0, 1, 2)))(x, w1, w2)
  want = jax.jit(jax.value_and_grad(_plain, (0, 1, 2)))(x, w1, w2)
  for g, h in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, h, rtol=1e-5, atol=1e-5)


def test_heads_projections_shapes_and_names():
  """[d, heads, dim] and [d, n] weights alike, outputs [..., heads, dim] / [..., n], each named for remat."""
  x = jnp.ones((2, 3, 8))
  ws = (jnp.ones((8, 2, 4)), jnp.ones((8, 5)))
  with platform.targeting('cpu'):
    ys = layers.heads_projections(x, ws, jnp.float32, ('a', 'b'))
    jaxpr = str(jax.make_jaxpr(lambda x: layers.heads_projections(x, ws, jnp.float32, ('a', 'b')))(x))
  assert [y.shape for y in ys] == [(2, 3, 2, 4), (2, 3, 5)]
  assert 'name=a' in jaxpr and 'name=b' in jaxpr


def _barrier_operand_shapes(jaxpr):
  """The operand shapes of every optimization_barrier in a jaxpr, its sub-jaxprs (custom_vjp, pjit) included."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'optimization_barrier':
      found.append([tuple(v.aval.shape) for v in eqn.invars])
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      found += _barrier_operand_shapes(sub)
  return found


@pytest.mark.parametrize('where,barrier', [('cpu', True), ('tpu', False), ('gpu', False)])
def test_one_barrier_holds_the_gradients_and_the_transposed_input_on_cpu_only(where, barrier):
  x, w1, w2 = jnp.ones((2, 16, 8)), jnp.ones((8, 12)), jnp.ones((8, 5))
  with platform.targeting(where):
    forward = jax.make_jaxpr(_loss)(x, w1, w2)
    backward = jax.make_jaxpr(jax.grad(_loss, (0, 1, 2)))(x, w1, w2)
  assert not _barrier_operand_shapes(forward.jaxpr)
  # Both gradients as rows [B*T, n] and the input transposed [d, B*T], once.
  assert _barrier_operand_shapes(backward.jaxpr) == ([[(32, 12), (32, 5), (8, 32)]] if barrier else [])


@pytest.mark.parametrize('where,barrier', [('cpu', True), ('tpu', False)])
def test_rope_makes_its_tables_whole_on_cpu_only(where, barrier):
  x, positions = jnp.ones((1, 6, 2, 8)), jnp.arange(6)
  with platform.targeting(where):
    jaxpr = str(jax.make_jaxpr(lambda x: layers.rope(x, positions, base=100.0))(x))
  assert ('optimization_barrier' in jaxpr) == barrier


@pytest.mark.parametrize('arch,barriers,rope_layers', [('swa128', 2 + 2, 2), ('gdn', 1 + 1 + 2, 1),
                                                        ('mamba2', 1 + 1 + 2, 1), ('lightning', 1 + 1 + 2, 1)])
def test_the_model_computes_each_inputs_projections_together_on_cpu(arch, barriers, rope_layers):
  """The mini hybrids: one barrier per input read by projections (attention's q/k/v, a recurrent mixer's inputs,
  each MLP's gate and up), and RoPE's tables, whose barrier shows in both passes."""
  from flax import nnx
  from hybrid_jax.config import load_config_file, resolve_spec
  from hybrid_jax.models.model import HybridLM
  model = HybridLM(load_config_file(resolve_spec(f"mini:arch={arch}")).model, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  loss = lambda s: jnp.sum(nnx.merge(graphdef, s)(jnp.zeros((1, 8), jnp.int32)))
  def count(where):
    with platform.targeting(where):
      return str(jax.make_jaxpr(jax.grad(loss))(state)).count('optimization_barrier')
  assert count('tpu') == 0
  assert count('cpu') == barriers + 2 * rope_layers
