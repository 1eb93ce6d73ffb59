"""Token-by-token recurrences: the readable oracle every chunked path is checked against.

One `lax.scan` step per token, so it is slow for long sequences but has no algebra to get wrong. With float64
inputs (under jax_enable_x64) every step runs in float64. The same step function serves the decode API.
"""

import jax
import jax.numpy as jnp


def compute_dtype(*dtypes):
  """float32 for half/single inputs, float64 when any input is float64."""
  return jnp.result_type(*dtypes, jnp.float32)


def step(state, q_t, k_t, v_t, g_t, beta_t, scale):
  """One token for every (batch, value head): q_t/k_t [B,Hv,K], v_t [B,Hv,V], g_t/beta_t [B,Hv].

  beta_t None is the scalar-decay scan S = e^g S + k v^T; otherwise the gated delta rule
  S = e^g (I - b k k^T) S + b k v^T, written as S' = e^g S; S' += b k (v - k^T S')^T.
  """
  state = jnp.exp(g_t)[..., None, None] * state
  if beta_t is None:
    update = v_t
  else:
    update = beta_t[..., None] * (v_t - jnp.einsum('bhk,bhkv->bhv', k_t, state))
  state = state + k_t[..., :, None] * update[..., None, :]
  o_t = scale * jnp.einsum('bhk,bhkv->bhv', q_t, state)
  return o_t, state


def recurrence(q, k, v, log_decay, beta, *, scale, initial_state):
  """Runs `step` over T. q/k [B,T,Hk,K], v [B,T,Hv,V], log_decay/beta [B,T,Hv] (beta may be None)."""
  b, _, hk, dk = q.shape
  hv, dv = v.shape[2:]
  ct = compute_dtype(q.dtype, v.dtype)
  heads = jnp.arange(hv) // (hv // hk)  # Value head -> key head.
  tm = lambda x: jnp.moveaxis(x.astype(ct), 1, 0)
  xs = (tm(q[:, :, heads]), tm(k[:, :, heads]), tm(v), tm(log_decay),
        None if beta is None else tm(beta))
  state = (jnp.zeros((b, hv, dk, dv), ct) if initial_state is None else initial_state.astype(ct))

  def body(s, x):
    q_t, k_t, v_t, g_t, b_t = x
    o_t, s = step(s, q_t, k_t, v_t, g_t, b_t, scale)
    return s, o_t

  state, o = jax.lax.scan(body, state, xs)
  return jnp.moveaxis(o, 0, 1).astype(q.dtype), state


def linear_scan(q, k, v, log_decay, *, scale, initial_state):
  """S_t = exp(g_t) S_{t-1} + k_t v_t^T ; o_t = scale * S_t^T q_t, one token at a time."""
  return recurrence(q, k, v, log_decay, None, scale=scale, initial_state=initial_state)
