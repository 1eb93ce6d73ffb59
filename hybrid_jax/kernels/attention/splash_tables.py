"""Splash attention's block tables for this package's masks, computed in closed form.

Splash skips masked blocks by reading per-block tables (which blocks hold any visible key, which block to fetch
next) that its own builder derives by evaluating the mask block pair by block pair in Python: 54 s at 131K tokens,
about an hour at 1M. Every mask here is causal with a window of `window` keys (None: all earlier keys) plus the
first `sinks` keys, so whether a block pair is empty, partial or full follows from the range of q - k over the
pair. These tables are the builder's, array for array (tests compare them), in milliseconds.

The tables sit in the kernel's scalar memory, which they outgrow on long causal rows (T^2 / block^2 entries); the
TPU path then attends in query chunks (`query_chunk`): rows [q_start, q_start + q_len) of the mask against keys
[0, q_start + q_len).
"""

import functools

import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as info_lib

EMPTY, PARTIAL, FULL = 0, 1, 2


def visible(q, k, window=None, sinks=0):
  """The mask itself, at global positions: causal within the window, plus the first `sinks` keys."""
  near = q >= k if window is None else (q >= k) & (q - k < window)
  return near | ((k < sinks) & (q >= k)) if sinks else near


def block_classes(q_start, q_len, kv_len, block_q, block_kv, window=None, sinks=0):
  """int32[q_len/block_q, kv_len/block_kv]: EMPTY, PARTIAL or FULL for each block pair of `visible` over queries
  [q_start, q_start + q_len) and keys [0, kv_len)."""
  q0 = q_start + np.arange(0, q_len, block_q)[:, None]
  k0 = np.arange(0, kv_len, block_kv)[None, :]
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
  seen_any, seen_all = sink_any | window_any, sink_all & window_all
  return np.where(seen_all, FULL, np.where(seen_any, PARTIAL, EMPTY)).astype(np.int32)


def _next_visible(classes):
  """For each block in row-major order, the column of the first non-empty block at or after it.

  Splash wraps to the first non-empty block past the last one; here a grid's keys end where its queries end, so
  its last block (on the diagonal) is visible and nothing wraps.
  """
  where = np.flatnonzero(classes.ravel() != EMPTY)
  chosen = where[np.searchsorted(where, np.arange(classes.size))]
  return (chosen % classes.shape[1]).reshape(classes.shape).astype(np.int32)


def _shrink_rows(classes, data_next, pad_front=False):
  """Keep each row's non-empty blocks in order, zero-padded to the fullest row (at its end, or its front)."""
  seen = classes != EMPTY
  counts = seen.sum(1, keepdims=True)
  width = int(counts.max())
  order = np.argsort(~seen, axis=1, kind='stable')  # Each row's visible columns first, ascending.
  slot = np.arange(width)[None, :] - (width - counts if pad_front else 0)
  kept = (slot >= 0) & (slot < counts)
  cols = np.take_along_axis(order, np.clip(slot, 0, width - 1), 1)
  return tuple(np.where(kept, np.take_along_axis(a, cols, 1), 0) for a in (classes, data_next))


def _int_for(top):
  """The smallest of int8/16/32 holding 0..top, as splash stores its tables."""
  return np.int8 if top <= np.iinfo(np.int8).max else np.int16 if top <= np.iinfo(np.int16).max else np.int32


def _smallest_int(array):
  return array.astype(_int_for(int(array.max(initial=0))))


def mask_info(q_start, q_len, block_q, block_kv, *, window=None, sinks=0, dkv=False):
  """The MaskInfo splash's `process_mask` (`process_mask_dkv` for dkv) builds for queries [q_start, q_start +
  q_len) against keys [0, q_start + q_len) with one head shard, one q shard and the mask computed in the kernel
  from the queries' positions (q_sequence): block mask and next-block table shrunk to the visible blocks, in the
  smallest ints.

  The dkv tables walk the grid key block by key block (the next block is a query block) and keep each key
  column's visible blocks, padded at the top.
  """
  classes = block_classes(q_start, q_len, q_start + q_len, block_q, block_kv, window, sinks)
  if dkv:
    block_mask, data_next = (a.T for a in _shrink_rows(classes.T, _next_visible(classes.T), pad_front=True))
  else:
    block_mask, data_next = _shrink_rows(classes, _next_visible(classes))
  return info_lib.MaskInfo(data_next=_smallest_int(data_next[None]), mask_next=None,
                           block_mask=_smallest_int(block_mask[None]), partial_mask_blocks=None,
                           q_sequence=np.arange(q_start, q_start + q_len, dtype=np.int32))


@functools.lru_cache(maxsize=256)
def table_bytes(q_start, q_len, block, window=None, sinks=0):
  """Scalar-memory bytes of the larger of the forward and dkv kernels' tables (next block and block mask) of
  `mask_info` in square blocks, without building them."""
  seen = block_classes(q_start, q_len, q_start + q_len, block, block, window, sinks) != EMPTY
  nq, nk = seen.shape
  fwd = nq * int(seen.sum(1).max()) * (np.dtype(_int_for(nk - 1)).itemsize + 1)
  dkv = nk * int(seen.sum(0).max()) * (np.dtype(_int_for(nq - 1)).itemsize + 1)
  return max(fwd, dkv)


@functools.lru_cache(maxsize=256)
def query_chunk(t, block, budget, window=None, sinks=0):
  """The most queries (a multiple of `block`, at most T) one splash call takes so that the tables of every chunk
  of a [T, T] mask fit `budget` bytes; the last chunk, whose rows see the most keys, is the largest."""
  chunk = t
  while chunk > block and table_bytes(t - chunk, chunk, block, window, sinks) > budget:
    chunk = max(block, chunk // 2 // block * block)
  return chunk
