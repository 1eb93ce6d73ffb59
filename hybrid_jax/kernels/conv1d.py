"""Short causal depthwise convolution (width 4 in Mamba-2 and Gated DeltaNet) with a decode state.

y_t = sum_i weight[i] * x_{t-W+1+i} (+ bias), per channel; inputs before the sequence come from the state, the last
W-1 inputs [B, W-1, C] (oldest first), zeros by default. W shifted multiply-adds beat a general conv for W = 4 and
keep the state handling obvious. Accumulates in float32; y in x's dtype; the state keeps x's dtype (exact inputs).
"""

import jax.numpy as jnp


def _check(x, weight, bias, state, rank):
  if jnp.ndim(x) != rank:
    raise ValueError(f"x must have rank {rank} ({'[B, T, C]' if rank == 3 else '[B, C]'}), got {jnp.shape(x)}")
  if jnp.ndim(weight) != 2 or weight.shape[1] != x.shape[-1] or weight.shape[0] < 1:
    raise ValueError(f'weight must have shape [W, C] with C={x.shape[-1]}, got {jnp.shape(weight)}')
  if bias is not None and jnp.shape(bias) != (x.shape[-1],):
    raise ValueError(f'bias must have shape [C] = {(x.shape[-1],)}, got {jnp.shape(bias)}')
  want = (x.shape[0], weight.shape[0] - 1, x.shape[-1])
  if state is not None and jnp.shape(state) != want:
    raise ValueError(f'state must have shape [B, W-1, C] = {want}, got {jnp.shape(state)}')


def _apply(xp, weight, bias, t, dtype):
  """xp [B, W-1+T, C] -> y [B, T, C]."""
  ct = jnp.result_type(xp.dtype, weight.dtype, jnp.float32)
  y = sum(weight[i].astype(ct) * xp[:, i:i + t].astype(ct) for i in range(weight.shape[0]))
  if bias is not None:
    y = y + bias.astype(ct)
  return y.astype(dtype)


def causal_conv1d(x, weight, *, bias=None, initial_state=None):
  """x [B,T,C], weight [W,C], bias [C] -> (y [B,T,C], final_state [B,W-1,C] = last W-1 inputs)."""
  _check(x, weight, bias, initial_state, 3)
  b, t, c = x.shape
  w = weight.shape[0]
  state = jnp.zeros((b, w - 1, c), x.dtype) if initial_state is None else initial_state.astype(x.dtype)
  xp = jnp.concatenate([state, x], axis=1)
  return _apply(xp, weight, bias, t, x.dtype), xp[:, xp.shape[1] - (w - 1):]


def causal_conv1d_step(state, x_t, weight, *, bias=None):
  """One decode token: x_t [B,C] -> (y_t [B,C], new state [B,W-1,C])."""
  _check(x_t, weight, bias, state, 2)
  xp = jnp.concatenate([state.astype(x_t.dtype), x_t[:, None]], axis=1)
  return _apply(xp, weight, bias, 1, x_t.dtype)[:, 0], xp[:, 1:]
