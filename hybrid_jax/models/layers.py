"""Building blocks shared by every architecture: parameters with logical axes, RMSNorm, the MLPs, RoPE.

Parameters carry `logical_axes` metadata (names from ARCHITECTURE.md: embed, heads, kv_heads, head_dim, mlp,
vocab, layers); hybrid_jax.parallel maps them onto mesh axes. Weights are stored in `param_dtype` and cast to the
compute dtype at use, so the optimizer always sees float32 masters.
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from hybrid_jax.kernels import platform

# Names of the tensors that remat policy 'minimal' keeps (hybrid_jax.models.model): the weight matmuls' outputs
# that the backward needs, named where they are made. Naming is free outside jax.checkpoint.
QUERY, KEY, VALUE = 'query_proj', 'key_proj', 'value_proj'  # Attention, after RoPE.
MIXER_OUT = 'out_proj'  # Every mixer's output projection.
MIXER_IN = 'mixer_proj'  # The recurrent mixers' input projections (q/k/v, gates, decay, B/C, dt).
MLP_GATE, MLP_UP, MLP_DOWN = 'mlpwi_0', 'mlpwi_1', 'mlpwo'


def dtype_of(name: str):
  return jnp.dtype(name)


def init_stds(cfg) -> tuple[float, float]:
  """(std of projections reading the residual stream, std of those writing into it): writers are scaled by
  1/sqrt(2 * num_layers) (GPT-2), so the stream's variance at init does not grow with depth."""
  return cfg.init_std, cfg.init_std / (2 * cfg.num_layers) ** 0.5


def param(rngs: nnx.Rngs, shape, axes, *, std: float, dtype) -> nnx.Param:
  """A normal(0, std) parameter annotated with its logical axis names."""
  if len(shape) != len(axes):
    raise ValueError(f'shape {shape} and logical axes {axes} differ in rank')
  return nnx.Param(std * jax.random.normal(rngs.params(), shape, dtype), logical_axes=tuple(axes))


def project_heads(x, w, dtype, name: str | None = None):
  """x [..., d] through w [d, heads, head_dim]: [..., heads, head_dim] (`heads_projections` of one weight);
  `name` makes remat policy 'minimal' keep its flat output."""
  (y,) = heads_projections(x, (w,), dtype, None if name is None else (name,))
  return y


def heads_projections(x, ws, dtype, names=None):
  """x [..., d] through each w [d, heads, head_dim] of `ws`: a tuple of [..., heads, head_dim], each computed as one
  [d, heads*head_dim] matmul (`projections`) whose flat output is what remat keeps ('save_dots' keeps matmul outputs;
  `names`, one per weight, make 'minimal' keep them too).

  Why flat: a kept [..., heads, head_dim] tensor has head_dim as its minor dimension, which a TPU lays out in
  128 lanes, so head_dim 64 would hold twice its bytes through the backward (docs/TPU_FIT.md).
  """
  ws = tuple(w.astype(dtype) for w in ws)
  ys = projections(x.astype(dtype), tuple(w.reshape(w.shape[0], -1) for w in ws))
  if names is not None:
    ys = tuple(checkpoint_name(y, name) for y, name in zip(ys, names))
  return tuple(y.reshape(*x.shape[:-1], *w.shape[1:]) for y, w in zip(ys, ws))


def project(x, w):
  """x [..., d] @ w [d, n] (`projections` of one weight)."""
  (y,) = projections(x, (w,))
  return y


def projections(x, ws):
  """(x @ w for w in ws), x [..., d] and each w [d, n]: the projections that read one input.

  On CPU their backward first makes the outputs' gradients g and the transposed input x^T whole (one optimization
  barrier), so every weight gradient is the row-major product x^T @ g, and x^T is made once for all of them. Left
  to itself, XLA:CPU computes each from a transposing copy of its g, with whatever produces g (an activation's
  backward, RoPE, a split) fused into that copy and evaluated in column order. Elsewhere plain matmuls.
  """
  ws = tuple(ws)
  return _cpu_projections(x, ws) if platform.target() == 'cpu' else _matmuls(x, ws)


@jax.custom_vjp
def _cpu_projections(x, ws):
  return _matmuls(x, ws)


def _matmuls(x, ws):
  return tuple(x @ w for w in ws)


def _cpu_projections_bwd(residuals, gs):
  x, ws = residuals
  rows = tuple(g.reshape(-1, g.shape[-1]) for g in gs)
  rows, x_t = jax.lax.optimization_barrier((rows, x.reshape(-1, x.shape[-1]).T))
  dx = sum(g @ w.T for g, w in zip(rows, ws))
  return dx.reshape(x.shape), tuple(x_t @ g for g in rows)


_cpu_projections.defvjp(lambda x, ws: (_matmuls(x, ws), (x, ws)), _cpu_projections_bwd)


def name_heads(t, name: str):
  """t [..., heads, head_dim] named for remat as its flat [..., heads*head_dim] view (see project_heads)."""
  return checkpoint_name(t.reshape(*t.shape[:-2], -1), name).reshape(t.shape)


def rms_norm(x, scale, eps):
  """x / rms(x) * scale over the last axis, in float32 (per head when x is [..., H, D] and scale [D])."""
  x32 = x.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return x32 * scale.astype(jnp.float32)


class RMSNorm(nnx.Module):
  """x / rms(x) * scale, computed in float32."""

  def __init__(self, dim: int, *, eps: float, param_dtype, dtype):
    self.scale = nnx.Param(jnp.ones((dim,), param_dtype), logical_axes=('embed',))
    self.eps = eps
    self.dtype = dtype

  def __call__(self, x):
    return rms_norm(x, self.scale[...], self.eps).astype(self.dtype)


class SwiGLU(nnx.Module):
  """down(silu(gate(x)) * up(x)), no biases."""

  def __init__(self, d_model: int, d_ff: int, *, std: float, out_std: float, param_dtype, dtype, rngs):
    self.gate = param(rngs, (d_model, d_ff), ('embed', 'mlp'), std=std, dtype=param_dtype)
    self.up = param(rngs, (d_model, d_ff), ('embed', 'mlp'), std=std, dtype=param_dtype)
    self.down = param(rngs, (d_ff, d_model), ('mlp', 'embed'), std=out_std, dtype=param_dtype)
    self.dtype = dtype

  def __call__(self, x):
    x = x.astype(self.dtype)
    gate, up = projections(x, (self.gate[...].astype(self.dtype), self.up[...].astype(self.dtype)))
    gate, up = checkpoint_name(gate, MLP_GATE), checkpoint_name(up, MLP_UP)
    return checkpoint_name((jax.nn.silu(gate) * up) @ self.down[...].astype(self.dtype), MLP_DOWN)


class ReluSquared(nnx.Module):
  """down(relu(up(x))**2), no gate and no biases (Nemotron-H's MLP)."""

  def __init__(self, d_model: int, d_ff: int, *, std: float, out_std: float, param_dtype, dtype, rngs):
    self.up = param(rngs, (d_model, d_ff), ('embed', 'mlp'), std=std, dtype=param_dtype)
    self.down = param(rngs, (d_ff, d_model), ('mlp', 'embed'), std=out_std, dtype=param_dtype)
    self.dtype = dtype

  def __call__(self, x):
    up = checkpoint_name(project(x.astype(self.dtype), self.up[...].astype(self.dtype)), MLP_UP)
    return checkpoint_name(jnp.square(jax.nn.relu(up)) @ self.down[...].astype(self.dtype), MLP_DOWN)


# model.mlp -> (its module, its weight matrices of d_model x d_ff each).
MLPS = {'swiglu': (SwiGLU, 3), 'relu2': (ReluSquared, 2)}


def make_mlp(cfg, *, rngs: nnx.Rngs):
  """The MLP that model.mlp names, d_model -> d_ff -> d_model."""
  std, out_std = init_stds(cfg)
  return MLPS[cfg.mlp][0](cfg.d_model, cfg.d_ff, std=std, out_std=out_std, param_dtype=dtype_of(cfg.param_dtype),
                          dtype=dtype_of(cfg.dtype), rngs=rngs)


def mlp_params(cfg) -> int:
  return MLPS[cfg.mlp][1] * cfg.d_model * cfg.d_ff


def yarn_inv_freq(dims: int, base: float, yarn) -> tuple[jax.Array, float]:
  """YaRN's inverse frequencies [dims/2] (float32) and cos/sin factor, for `yarn` = (factor f, original context
  L0, beta_fast, beta_slow, truncate, attention factor; 0 = 1 + 0.1 ln f). With r(n) = dims ln(L0 / (2 pi n)) /
  (2 ln base), low = r(beta_fast), high = r(beta_slow) (floor / ceil when truncating), clamped to [0, dims - 1],
  ramp_j = clamp((j - low) / (high - low), 0, 1): w'_j = w_j / f * ramp_j + w_j * (1 - ramp_j), w_j =
  base^(-2j/dims) (transformers' _compute_yarn_parameters, in its order of float32 operations)."""
  factor, original, beta_fast, beta_slow, truncate, attention_factor = yarn
  correction = lambda n: dims * math.log(original / (n * 2 * math.pi)) / (2 * math.log(base))
  low, high = correction(beta_fast), correction(beta_slow)
  if truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dims - 1)
  if low == high:
    high += 0.001  # As transformers: no division by zero.
  pos_freqs = base ** (jnp.arange(0, dims, 2, dtype=jnp.float32) / dims)
  ramp = jnp.clip((jnp.arange(dims // 2, dtype=jnp.float32) - low) / (high - low), 0, 1)
  extrapolation = 1 - ramp
  inv_freq = 1.0 / (factor * pos_freqs) * (1 - extrapolation) + 1.0 / pos_freqs * extrapolation
  return inv_freq, float(attention_factor) or (1.0 + 0.1 * math.log(factor) if factor > 1 else 1.0)


def rope(x, positions, *, base: float, dims: int = 0, yarn=None):
  """Rotary position embedding (rotate-half form) of x [B, T, H, D] at integer positions [B, T] or [T].

  `dims` > 0 rotates only the first `dims` channels of each head (partial RoPE: frequencies base**(-2i/dims)) and
  passes the rest through; 0 rotates the whole head. `yarn` (a tuple, `yarn_inv_freq`): YaRN's frequencies, with
  cos and sin times its attention factor (gpt-oss); None = plain RoPE.
  """
  head_dim = x.shape[-1]
  dims = dims or head_dim
  if yarn is None:
    inv_freq, factor = 1.0 / (base ** (jnp.arange(0, dims, 2, dtype=jnp.float32) / dims)), 1.0
  else:
    inv_freq, factor = yarn_inv_freq(dims, base, yarn)
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [..., T, dims/2]
  if angles.ndim == 2:
    angles = angles[None]
  sin, cos = jnp.sin(angles), jnp.cos(angles)
  if factor != 1.0:
    sin, cos = sin * factor, cos * factor
  if platform.target() == 'cpu':
    # The tables made once: XLA:CPU fuses them into their consumers, evaluating sin and cos again for every head,
    # for q and k apart, in both passes (a tenth of the mini-study's train step). Elsewhere they stay free to fuse.
    sin, cos = jax.lax.optimization_barrier((sin, cos))
  sin, cos = sin[:, :, None, :], cos[:, :, None, :]
  x1, x2 = jnp.split(x[..., :dims].astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)
  return rotated if dims == head_dim else jnp.concatenate([rotated, x[..., dims:]], axis=-1)
