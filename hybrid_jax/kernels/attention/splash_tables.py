"""Splash attention's block tables for this package's masks, computed in closed form.

Splash skips masked blocks by reading per-block tables (which blocks hold any visible key, which next block to
fetch) that its own builder derives by evaluating the mask block pair by block pair in Python: 54 s at 131K tokens,
about an hour at 1M. Every mask here is causal with a window of `window` keys (no window: all earlier keys) plus
the first `sinks` keys, so whether a block pair is empty, partial or full follows from the range of q - k over the
pair; these tables are the builder's, array for array (tests compare them on small shapes), in milliseconds.
"""

import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as info_lib

EMPTY, PARTIAL, FULL = 0, 1, 2


def block_classes(t, block_q, block_kv, window=None, sinks=0):
  """int32[T/block_q, T/block_kv]: EMPTY, PARTIAL or FULL for each block pair of the [T, T] mask.

  A key k is visible to a query q when 0 <= q - k < window (window None: no upper bound), or when k < sinks and
  k <= q.
  """
  q0 = np.arange(0, t, block_q)[:, None]
  k0 = np.arange(0, t, block_kv)[None, :]
  q1, k1 = q0 + block_q - 1, k0 + block_kv - 1
  upper = np.inf if window is None else window - 1

  def classify(k_lo, k_hi, limit):
    """(any, all) of 0 <= q - k <= limit over q in [q0, q1], k in [k_lo, k_hi] (empty when k_lo > k_hi)."""
    lo, hi = q0 - k_hi, q1 - k_lo  # Every integer between them is some q - k of the pair.
    present = k_lo <= k_hi
    return present & (hi >= 0) & (lo <= limit), ~present | ((lo >= 0) & (hi <= limit))

  split = np.clip(sinks, k0, k1 + 1)  # Keys below it are sinks (seen causally), the rest windowed.
  sink_any, sink_all = classify(k0, split - 1, np.inf)
  window_any, window_all = classify(split, k1, upper)
  visible_any, visible_all = sink_any | window_any, sink_all & window_all
  return np.where(visible_all, FULL, np.where(visible_any, PARTIAL, EMPTY)).astype(np.int32)


def _next_visible(classes):
  """For each block in row-major order, the column of the first non-empty block at or after it.

  Splash wraps to the first non-empty block past the last one; here the last block (the diagonal's end) is always
  visible, so nothing wraps.
  """
  where = np.flatnonzero(classes.ravel() != EMPTY)
  chosen = where[np.searchsorted(where, np.arange(classes.size))]
  return (chosen % classes.shape[1]).reshape(classes.shape).astype(np.int32)


def _shrink_rows(classes, data_next, pad_front=False):
  """Keep each row's non-empty blocks in order, zero-padded to the fullest row (at its end, or its front)."""
  visible = classes != EMPTY
  counts = visible.sum(1, keepdims=True)
  width = int(counts.max())
  order = np.argsort(~visible, axis=1, kind='stable')  # Each row's visible columns first, ascending.
  slot = np.arange(width)[None, :] - (width - counts if pad_front else 0)
  kept = (slot >= 0) & (slot < counts)
  cols = np.take_along_axis(order, np.clip(slot, 0, width - 1), 1)
  return tuple(np.where(kept, np.take_along_axis(a, cols, 1), 0) for a in (classes, data_next))


def _smallest_int(array):
  top = int(array.max(initial=0))
  return array.astype(np.int8 if top <= np.iinfo(np.int8).max else np.int16 if top <= np.iinfo(np.int16).max
                      else np.int32)


def mask_info(t, block_q, block_kv, *, window=None, sinks=0, dkv=False):
  """The MaskInfo splash's `process_mask` (`process_mask_dkv` for dkv) builds for one head shard, one q shard and
  a mask computed inside the kernel: block mask and next-block table shrunk to the visible blocks, smallest ints.

  The dkv tables walk the grid key block by key block (the next block is a query block) and keep each key
  column's visible blocks, padded at the top.
  """
  classes = block_classes(t, block_q, block_kv, window, sinks)
  if dkv:
    block_mask, data_next = (a.T for a in _shrink_rows(classes.T, _next_visible(classes.T), pad_front=True))
  else:
    block_mask, data_next = _shrink_rows(classes, _next_visible(classes))
  return info_lib.MaskInfo(data_next=_smallest_int(data_next[None]), mask_next=None,
                           block_mask=_smallest_int(block_mask[None]), partial_mask_blocks=None,
                           q_sequence=np.arange(t, dtype=np.int32))
