"""Every kernel runs with jax_enable_x64 on (analysis in float64 turns it on), for float32 and bfloat16 inputs, and
agrees with the portable XLA version: a Python int that becomes int64 beside int32 indices must not break one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax import kernels


def _inputs(dtype):
  rng = np.random.default_rng(0)
  q = rng.normal(size=(1, 40, 2, 16)).astype(np.float32)
  k = q / np.linalg.norm(q, axis=-1, keepdims=True)
  v = rng.normal(size=(1, 40, 2, 16)).astype(np.float32)
  g = -np.abs(rng.normal(size=(1, 40, 2))).astype(np.float32)
  beta = rng.uniform(size=(1, 40, 2)).astype(np.float32)
  return [jnp.asarray(x, dtype) for x in (q, k, v, g, beta)]


def _run_all(dtype):
  q, k, v, g, beta = _inputs(dtype)
  out = {}
  for impl in ('pallas_gpu', 'pallas_tpu', 'xla'):
    out[f'attention/{impl}'] = kernels.attention(q, k, v, window=8, sinks=2, implementation=impl)
    out[f'linear_scan/{impl}'] = kernels.linear_scan(q, k, v, g, chunk_size=16, implementation=impl)[0]
    out[f'delta_rule/{impl}'] = kernels.gated_delta_rule(q, k, v, g, beta, chunk_size=16, implementation=impl)[0]
  out['conv1d'] = kernels.causal_conv1d(v.reshape(1, 40, 32), jnp.ones((4, 32), dtype))[0]
  return {name: np.asarray(x, np.float32) for name, x in out.items()}


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_every_kernel_runs_with_x64_enabled(dtype):
  jax.config.update('jax_enable_x64', True)
  try:
    out = _run_all(dtype)
  finally:
    jax.config.update('jax_enable_x64', False)
  tol = 2e-4 if dtype == jnp.float32 else 5e-2
  for name, value in out.items():
    assert value.dtype == np.float32 and np.isfinite(value).all(), name
    if '/pallas' in name:
      np.testing.assert_allclose(value, out[name.split('/')[0] + '/xla'], rtol=tol, atol=tol, err_msg=name)
