"""The MLP's hand-written piece against its definition: SwiGLU's backward pass, and where it is made whole."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.kernels import platform
from hybrid_jax.models import layers


def _swiglu_vjp(gate, up, dout, where):
  with platform.targeting(where):
    return jax.vjp(layers.swiglu, gate, up)


@pytest.mark.parametrize('where', ['cpu', 'tpu'])
@pytest.mark.parametrize('dtype,tol', [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)])
def test_swiglu_value_and_gradients_match_the_derivative(where, dtype, tol):
  rng = np.random.default_rng(0)
  g, u, dout = (rng.standard_normal((3, 7, 40)) * 3 for _ in range(3))
  sig = 1 / (1 + np.exp(-g))
  want = (g * sig * u, dout * u * (sig + g * sig * (1 - sig)), dout * g * sig)
  out, vjp = _swiglu_vjp(*(jnp.asarray(x, dtype) for x in (g, u)), None, where)
  got = (out, *vjp(jnp.asarray(dout, dtype)))
  for name, x, w in zip(('value', 'd gate', 'd up'), got, want):
    assert x.dtype == dtype, name
    assert np.linalg.norm(np.asarray(x, np.float64) - w) <= tol * np.linalg.norm(w), name


@pytest.mark.parametrize('where,barrier', [('cpu', True), ('tpu', False), ('gpu', False)])
def test_swiglu_gradients_are_made_whole_only_on_cpu(where, barrier):
  """On CPU the gradients pass an optimization barrier (XLA:CPU would fuse them into transposing copies)."""
  x = jnp.ones((4, 8))
  with platform.targeting(where):
    jaxpr = jax.make_jaxpr(jax.grad(lambda g, u: jnp.sum(layers.swiglu(g, u)), (0, 1)))(x, x)
  assert ('optimization_barrier' in str(jaxpr)) == barrier
