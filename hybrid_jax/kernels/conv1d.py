"""Short causal depthwise convolution (width 4 in Mamba-2 and Gated DeltaNet) with a decode state.

y_t = sum_i weight[i] * x_{t-W+1+i} (+ bias), per channel; inputs before the sequence come from the state, the last
W-1 inputs [B, W-1, C] (oldest first), zeros by default. W shifted multiply-adds beat a general conv for W = 4 and
keep the state handling obvious. With `segment_ids` (packed documents, hybrid_jax.kernels.segments) a tap reads
zero where its input lies in another document; the state's inputs belong to the row's first document. Accumulates in float32; y in x's dtype; the state keeps x's dtype (exact inputs).
"""

import jax.numpy as jnp

from hybrid_jax.kernels import segments


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


def _apply(xp, weight, bias, t, dtype, runs=None):
  """xp [B, W-1+T, C] -> y [B, T, C]; runs [B, W-1+T]: the document of each input (None: one document)."""
  ct = jnp.result_type(xp.dtype, weight.dtype, jnp.float32)
  w = weight.shape[0]

  def tap(i):
    x = xp[:, i:i + t].astype(ct)
    if runs is not None and i < w - 1:
      x = jnp.where((runs[:, i:i + t] == runs[:, w - 1:])[..., None], x, 0)
    return weight[i].astype(ct) * x

  y = sum(tap(i) for i in range(w))
  if bias is not None:
    y = y + bias.astype(ct)
  return y.astype(dtype)


def causal_conv1d(x, weight, *, bias=None, initial_state=None, segment_ids=None):
  """x [B,T,C], weight [W,C], bias [C], segment_ids [B,T] -> (y [B,T,C], final_state [B,W-1,C] = last W-1
  inputs)."""
  _check(x, weight, bias, initial_state, 3)
  b, t, c = x.shape
  w = weight.shape[0]
  state = jnp.zeros((b, w - 1, c), x.dtype) if initial_state is None else initial_state.astype(x.dtype)
  xp = jnp.concatenate([state, x], axis=1)
  runs = None
  if segment_ids is not None:
    segments.check(segment_ids, b, t)
    runs = jnp.pad(segments.runs(segment_ids), [(0, 0), (w - 1, 0)])  # The state continues into document 0.
  return _apply(xp, weight, bias, t, x.dtype, runs), xp[:, xp.shape[1] - (w - 1):]


def causal_conv1d_step(state, x_t, weight, *, bias=None):
  """One decode token: x_t [B,C] -> (y_t [B,C], new state [B,W-1,C])."""
  _check(x_t, weight, bias, state, 2)
  xp = jnp.concatenate([state.astype(x_t.dtype), x_t[:, None]], axis=1)
  return _apply(xp, weight, bias, 1, x_t.dtype)[:, 0], xp[:, 1:]
