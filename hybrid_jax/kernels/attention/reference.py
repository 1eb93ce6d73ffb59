"""Dense masked-softmax attention: the readable oracle every faster path is checked against.

It materialises the full [B, Hkv, G, T, T] logits, so it is only for tests and small shapes. With float64 inputs
(under jax_enable_x64) every step runs in float64.
"""

import jax
import jax.numpy as jnp


def visible(t, *, window=None, sinks=0, segment_ids=None):
  """Boolean [B or 1, T, T] mask: query i (rows) may attend to key j (columns)."""
  i = jnp.arange(t)[:, None]
  j = jnp.arange(t)[None, :]
  mask = j <= i
  if window is not None:
    in_window = j > i - window
    if sinks:
      in_window = in_window | (j < sinks)
    mask = mask & in_window
  mask = mask[None]
  if segment_ids is not None:
    mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :])
  return mask


def attention(q, k, v, *, window=None, scale=None, sinks=0, segment_ids=None):
  """o = softmax(scale * q k^T + mask) v, per head, with GQA by grouping query heads over each kv head."""
  b, t, hq, d = q.shape
  hkv = k.shape[2]
  if scale is None:
    scale = d**-0.5
  stat = jnp.promote_types(q.dtype, jnp.float32)
  qg = q.reshape(b, t, hkv, hq // hkv, d).astype(stat)
  logits = jnp.einsum('bihgd,bjhd->bhgij', qg, k.astype(stat)) * scale
  mask = visible(t, window=window, sinks=sinks, segment_ids=segment_ids)[:, None, None]
  logits = jnp.where(mask, logits, -jnp.inf)
  # The diagonal key is always visible, so every row max is finite and exp never sees inf - inf.
  logits = logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  p = jnp.exp(logits)
  p = p / jnp.sum(p, axis=-1, keepdims=True)
  o = jnp.einsum('bhgij,bjhd->bihgd', p, v.astype(stat))
  return o.reshape(b, t, hq, d).astype(q.dtype)
