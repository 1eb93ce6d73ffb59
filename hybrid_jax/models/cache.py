"""Decode states for attention: a KV cache of max_len entries (full) or a ring buffer of w entries (SWA).

Entry s of a ring of size S holds the newest position p' <= p with p' = s (mod S); a full cache is the ring with
S = max_len. A sliding window of w therefore keeps only w entries: decode memory is O(w), not O(context).
"""

import jax.numpy as jnp


def init_kv(batch: int, size: int, kv_heads: int, head_dim: int, dtype) -> dict:
  shape = (batch, size, kv_heads, head_dim)
  return {'k': jnp.zeros(shape, dtype), 'v': jnp.zeros(shape, dtype)}  # Two buffers: steps donate the state.


def write_prefix(cache: dict, k, v) -> dict:
  """Stores the prompt's keys/values [B, T, H, D] (positions 0..T-1); a ring keeps the newest S of them."""
  size, t = cache['k'].shape[1], k.shape[1]
  keep = min(size, t)
  positions = jnp.arange(t - keep, t)
  slots = positions % size
  return {'k': cache['k'].at[:, slots].set(k[:, t - keep:].astype(cache['k'].dtype)),
          'v': cache['v'].at[:, slots].set(v[:, t - keep:].astype(cache['v'].dtype))}


def write_one(cache: dict, k_t, v_t, position) -> dict:
  """Stores one token's keys/values [B, H, D] at `position` (a traced scalar is fine)."""
  slot = position % cache['k'].shape[1]
  return {'k': cache['k'].at[:, slot].set(k_t.astype(cache['k'].dtype)),
          'v': cache['v'].at[:, slot].set(v_t.astype(cache['v'].dtype))}


def slot_positions(size: int, position):
  """The token position each slot of a ring of `size` holds once `position` is written (negative = empty)."""
  slots = jnp.arange(size)
  return position - (position - slots) % size
