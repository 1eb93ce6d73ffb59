"""Portable attention in plain XLA ops: banded for sliding windows, dense masked for full causal.

A sliding window w < T is computed block by block: queries are cut into blocks of C, and each block only meets
the keys of its own block and the n = ceil((w - 1) / C) blocks before it, so memory and time grow as O(T * (w + C))
rather than O(T^2). Full causal (window None or >= T), or a band that would cover the whole sequence anyway, is
one block of T: dense masked attention, O(T^2) memory, in this version (a flash kernel replaces it later).
Softmax statistics are float32 (float64 for float64 inputs); the backward pass is written out from the saved
probabilities (`_softmax_v`). `return_lse` also returns each row's log-sum-exp of its scaled logits (differentiable
too), which learned attention sinks need (hybrid_jax.models.mixers.attention); the other implementations do not
expose it.
"""

import functools

import jax
import jax.numpy as jnp

MAX_BLOCK = 512
MIN_BLOCK = 8


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
  tail = [(0, 0), (0, nb * c - t), (0, 0), (0, 0)]
  # Blocks of a row become rows of the batch, heads-major, so every product below is one batched matmul of rank 4.
  # GQA: the G query heads of one kv head are extra rows of one matmul, q [B*nb, Hkv, G*C, D]; the key and value
  # slabs are [B*nb, Hkv, (n+1)C, D].
  heads_major = lambda x: x.transpose(0, 1, 3, 2, 4).reshape((b * nb, hkv) + x.shape[2:3] + (d,))
  qx = jnp.pad(q, tail).reshape(b, nb, c, hkv, g, d).transpose(0, 1, 3, 4, 2, 5).reshape(b * nb, hkv, g * c, d)
  kb = heads_major(_slabs(jnp.pad(k, tail).reshape(b, nb, c, hkv, d), n))
  vb = heads_major(_slabs(jnp.pad(v, tail).reshape(b, nb, c, hkv, d), n))
  # Positions: query block i holds [iC, iC + C); its key slab starts n blocks earlier. Pad rows past T are
  # dropped at the end; every row, pad rows included, sees its own key, so no row is empty.
  qpos = (jnp.arange(nb)[:, None] * c + jnp.arange(c))[:, :, None]
  kpos = ((jnp.arange(nb)[:, None] - n) * c + jnp.arange((n + 1) * c))[:, None, :]
  mask = ((kpos <= qpos) & (kpos > qpos - window) & (kpos >= 0))[None]  # [1, nb, C, (n+1)C]
  if segment_ids is not None:
    seg = jnp.pad(segment_ids, [(0, 0), (0, nb * c - t)]).reshape(b, nb, c)
    mask = mask & (seg[:, :, :, None] == _slabs(seg, n)[:, :, None, :])
  keys, values, masks = [kb], [vb], [mask]
  if sinks:
    # Sink keys get their own small slab, visible only left of the window, so no key is counted twice; each
    # block reads its own copy.
    smask = (jnp.arange(sinks) <= qpos - window)[None]
    if segment_ids is not None:
      smask = smask & (seg[:, :, :, None] == segment_ids[:, None, None, :sinks])
    keys.append(heads_major(jnp.broadcast_to(k[:, None, :sinks], (b, nb, sinks, hkv, d))))
    values.append(heads_major(jnp.broadcast_to(v[:, None, :sinks], (b, nb, sinks, hkv, d))))
    masks.append(smask)
  # Masks [B or 1, nb, C, K] -> [B*nb, 1, G*C, K], the rows of all G heads of a group (broadcast over kv heads).
  masks = [jnp.broadcast_to(m[:, :, None, None], (b, nb, 1, g, c, m.shape[-1])).reshape(b * nb, 1, g * c, -1)
           for m in masks]
  o, lse = _softmax_v(qx, keys, values, masks, scale)
  lse = lse.reshape(b, nb, hkv, g, c).transpose(0, 1, 4, 2, 3).reshape(b, nb * c, hq)[:, :t]
  o = o.reshape(b, nb, hkv, g, c, d).transpose(0, 1, 4, 2, 3, 5).reshape(b, nb * c, hq, d)[:, :t]
  return o.astype(q.dtype), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _softmax_v(q, keys, values, masks, scale):
  """Joint softmax of q [N, Hkv, X, D] over the visible keys of all (keys, values, mask) slabs, times values.

  Slabs are [N, Hkv, K, D]; masks booleans [N, 1, X, K]; every row sees at least one key. Returns
  o [N, Hkv, X, D] and the rows' log-sum-exp [N, Hkv, X, 1], both in the statistics' dtype. The backward pass is
  flash attention's, from the saved probabilities P: dS = P * (dP - rowsum(dO * O) + dlse). Autodiff of the
  forward would keep the logits and the exponentials and take more passes over them.
  """
  return _softmax_v_fwd(q, keys, values, masks, scale)[0]


def _softmax_v_fwd(q, keys, values, masks, scale):
  stat = jnp.promote_types(q.dtype, jnp.float32)
  scaled = q * jnp.asarray(scale, q.dtype)  # The scale on q [.., D] rather than on the logits [.., K].
  # The mask as an added bias, not a select: XLA:CPU then makes the matmul and the whole softmax one fusion.
  logits = [jnp.einsum('nhxd,nhkd->nhxk', scaled, kx, preferred_element_type=stat)
            + jnp.where(mask, 0, -jnp.inf).astype(stat) for kx, mask in zip(keys, masks)]
  m = functools.reduce(jnp.maximum, [jnp.max(s, axis=-1, keepdims=True) for s in logits])
  exps = [jnp.exp(s - m) for s in logits]
  total = functools.reduce(jnp.add, [jnp.sum(e, axis=-1, keepdims=True) for e in exps])
  probs = [e * (1 / total) for e in exps]
  o = functools.reduce(jnp.add, [jnp.einsum('nhxk,nhkd->nhxd', p.astype(vx.dtype), vx, preferred_element_type=stat)
                                 for p, vx in zip(probs, values)])
  return (o, m + jnp.log(total)), (scaled, keys, values, probs, o)


def _softmax_v_bwd(scale, res, cotangents):
  scaled, keys, values, probs, o = res
  do, dlse = cotangents
  stat = o.dtype
  row = dlse - jnp.sum(do * o, axis=-1, keepdims=True)
  dq, dkeys, dvalues = 0, [], []
  for kx, vx, p in zip(keys, values, probs):
    dvalues.append(jnp.einsum('nhxk,nhxd->nhkd', p, do, preferred_element_type=stat).astype(vx.dtype))
    dp = jnp.einsum('nhxd,nhkd->nhxk', do.astype(vx.dtype), vx, preferred_element_type=stat)
    ds = p * (dp + row)  # The gradient of the scaled logits: dq takes the scale after, dk through `scaled`.
    dq = dq + jnp.einsum('nhxk,nhkd->nhxd', ds, kx, preferred_element_type=stat)
    dkeys.append(jnp.einsum('nhxk,nhxd->nhkd', ds, scaled, preferred_element_type=stat).astype(kx.dtype))
  return (dq * scale).astype(scaled.dtype), dkeys, dvalues, [None] * len(probs)


_softmax_v.defvjp(_softmax_v_fwd, _softmax_v_bwd)
