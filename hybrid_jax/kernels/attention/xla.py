"""Portable attention in plain XLA ops: banded for sliding windows, dense masked for full causal.

A sliding window w < T is computed block by block: queries are cut into blocks of C, and each block only meets
the keys of its own block and the n = ceil((w - 1) / C) blocks before it, so memory and time grow as O(T * (w + C))
rather than O(T^2). Full causal (window None or >= T), or a band that would cover the whole sequence anyway, is
one block of T: dense masked attention, O(T^2) memory, in this version (a flash kernel replaces it later).
Softmax statistics are float32 (float64 for float64 inputs); differentiation is plain autodiff. `return_lse` also
returns each row's log-sum-exp of its scaled logits (differentiable too), which learned attention sinks need
(hybrid_jax.models.mixers.attention); the other implementations do not expose it.
"""

import functools

import jax
import jax.numpy as jnp

MAX_BLOCK = 512
MIN_BLOCK = 16


def default_block_size(window):
  """A power of two near the window, so each query block reads about 2w keys: little waste, few blocks."""
  c = 1 << max(window - 1, 1).bit_length()
  return int(min(MAX_BLOCK, max(MIN_BLOCK, c)))


def attention(q, k, v, *, window=None, scale=None, sinks=0, segment_ids=None, block_size=None, return_lse=False):
  """Causal (sliding-window) attention; shapes and arguments as `hybrid_jax.kernels.attention`.

  With `return_lse`: (o, lse), lse [B, T, Hq] the log-sum-exp over each query's visible keys of the scaled logits,
  in the softmax statistics' dtype.
  """
  t, d = q.shape[1], q.shape[3]
  scale = d**-0.5 if scale is None else scale
  if window is None or window >= t:
    window, sinks = t, 0  # Full causal: every earlier key is in the window already.
  c = block_size or default_block_size(window)
  n = -(-(window - 1) // c)
  if (n + 1) * c >= t:  # The band would cover the whole sequence: one dense block is cheaper.
    c, n = t, 0
  o, lse = _blocked(q, k, v, window, scale, min(sinks, t), segment_ids, c, n)
  return (o, lse) if return_lse else o


def _slabs(x, n):
  """[B, nb, C, ...] blocks -> [B, nb, (n+1)C, ...]: each block preceded by its n predecessors (zeros before 0)."""
  if n == 0:
    return x
  nb = x.shape[1]
  pad = [(0, 0)] * x.ndim
  pad[1] = (n, 0)
  xp = jnp.pad(x, pad)
  views = jnp.stack([xp[:, i:i + nb] for i in range(n + 1)], axis=2)
  return views.reshape(x.shape[:2] + ((n + 1) * x.shape[2],) + x.shape[3:])


def _blocked(q, k, v, window, scale, sinks, segment_ids, c, n):
  """Query blocks of C against key slabs of (n+1)C, plus an optional slab of sink keys."""
  b, t, hq, d = q.shape
  hkv = k.shape[2]
  g = hq // hkv
  nb = -(-t // c)
  stat = jnp.promote_types(q.dtype, jnp.float32)
  tail = [(0, 0), (0, nb * c - t), (0, 0), (0, 0)]
  # GQA: the G query heads of one kv head become extra rows of one matmul, [B, nb, Hkv, G*C, D].
  qx = jnp.pad(q, tail).reshape(b, nb, c, hkv, g, d).transpose(0, 1, 3, 4, 2, 5).reshape(b, nb, hkv, g * c, d)
  kb = _slabs(jnp.pad(k, tail).reshape(b, nb, c, hkv, d), n)
  vb = _slabs(jnp.pad(v, tail).reshape(b, nb, c, hkv, d), n)
  # Positions: query block i holds [iC, iC + C); its key slab starts n blocks earlier. Pad rows past T are
  # dropped at the end; every row, pad rows included, sees its own key, so no row is empty.
  qpos = (jnp.arange(nb)[:, None] * c + jnp.arange(c))[:, :, None]
  kpos = ((jnp.arange(nb)[:, None] - n) * c + jnp.arange((n + 1) * c))[:, None, :]
  mask = ((kpos <= qpos) & (kpos > qpos - window) & (kpos >= 0))[None]  # [1, nb, C, (n+1)C]
  if segment_ids is not None:
    seg = jnp.pad(segment_ids, [(0, 0), (0, nb * c - t)]).reshape(b, nb, c)
    mask = mask & (seg[:, :, :, None] == _slabs(seg, n)[:, :, None, :])
  parts = [(jnp.einsum('bnhxd,bnkhd->bnhxk', qx, kb, preferred_element_type=stat), mask, vb, 'bnhxk,bnkhd->bnhxd')]
  if sinks:
    # Sink keys get their own small slab, visible only left of the window, so no key is counted twice.
    smask = (jnp.arange(sinks) <= qpos - window)[None]
    if segment_ids is not None:
      smask = smask & (seg[:, :, :, None] == segment_ids[:, None, None, :sinks])
    slogits = jnp.einsum('bnhxd,bshd->bnhxs', qx, k[:, :sinks], preferred_element_type=stat)
    parts.append((slogits, smask, v[:, :sinks], 'bnhxs,bshd->bnhxd'))
  o, lse = _softmax_v(parts, scale, (b, nb, hkv, g, c))
  lse = lse[..., 0].transpose(0, 1, 4, 2, 3).reshape(b, nb * c, hq)[:, :t]
  return o.transpose(0, 1, 4, 2, 3, 5).reshape(b, nb * c, hq, d)[:, :t].astype(q.dtype), lse


def _softmax_v(parts, scale, rows):
  """Joint softmax over the keys of all (logits, mask, values, einsum) parts, times values; no concatenation.

  Logits come as [..., G*C, K] and masks as [B or 1, nb, C, K]; the mask is applied before exp and each row
  holds its own key, so the row max is finite. Returns o [B, nb, Hkv, G, C, D] and the rows' log-sum-exp
  [B, nb, Hkv, G, C, 1] (its gradient flows through the sum; the stopped max cancels out of it exactly).
  """
  masked = []
  for logits, mask, vals, spec in parts:
    logits = logits.reshape(rows + logits.shape[-1:]) * scale
    masked.append((jnp.where(mask[:, :, None, None], logits, -jnp.inf), vals, spec))
  m = functools.reduce(jnp.maximum, [jnp.max(logits, axis=-1, keepdims=True) for logits, _, _ in masked])
  m = jax.lax.stop_gradient(m)
  o = total = 0
  for logits, vals, spec in masked:
    e = jnp.exp(logits - m)
    total = total + jnp.sum(e, axis=-1, keepdims=True)
    e = e.astype(vals.dtype).reshape(e.shape[:3] + (-1, e.shape[-1]))
    o = o + jnp.einsum(spec, e, vals, preferred_element_type=m.dtype).reshape(rows + vals.shape[-1:])
  return o / total, m + jnp.log(total)
