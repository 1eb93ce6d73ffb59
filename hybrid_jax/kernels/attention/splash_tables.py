"""Splash attention's block tables for this package's masks, computed in closed form.

Splash skips masked blocks by reading per-block tables (which blocks hold any visible key, which block to fetch
next) that its own builder derives by evaluating the mask block pair by block pair in Python: 54 s at 131K tokens,
about an hour at 1M. Every mask here is causal with a window of `window` keys (None: all earlier keys) plus the
first `sinks` keys, so whether a block pair is empty, partial or full follows from the range of q - k over the
pair. These tables are the builder's, array for array (tests compare them), in milliseconds: only the visible
blocks are built (each query block's keys are the sink keys' and the window's ranges, each key block's queries one
range), so a window's tables cost what their band holds, not the (T / block)^2 grid.

Splash computes every block its tables list whole; `work_ratio` reads from the tables how many pairs that is per
visible (query, key) pair, which the TPU path's choice of block size keeps near 1 (`pallas_tpu.block_for`).

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


def _classes(q0, k0, block_q, block_kv, window, sinks):
  """EMPTY, PARTIAL or FULL of `visible` over the block pairs whose first query and key are q0 and k0 (arrays
  that broadcast together)."""
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


def block_classes(q_start, q_len, kv_len, block_q, block_kv, window=None, sinks=0):
  """int32[q_len/block_q, kv_len/block_kv]: EMPTY, PARTIAL or FULL for each block pair of `visible` over queries
  [q_start, q_start + q_len) and keys [0, kv_len): the whole grid (the tables below visit only its visible
  blocks)."""
  q0 = q_start + np.arange(0, q_len, block_q)[:, None]
  k0 = np.arange(0, kv_len, block_kv)[None, :]
  return _classes(q0, k0, block_q, block_kv, window, sinks)


def _row_columns(q_start, q_len, block_q, block_kv, window, sinks):
  """Per query block, its visible key blocks in order, as (columns [rows, width], kept [rows, width]): the union
  of the sink keys' blocks [0, min(sinks, q1 + 1)) and the window's [q0 - window + 1, q1], without the grid."""
  q0 = q_start + np.arange(0, q_len, block_q)
  q1 = q0 + block_q - 1
  sink = (np.minimum(sinks, q1 + 1) - 1) // block_kv + 1 if window is not None and sinks else np.zeros_like(q0)
  lo = np.zeros_like(q0) if window is None else np.maximum(q0 - window + 1, 0) // block_kv
  lo = np.maximum(lo, sink)  # The window's blocks the sinks' did not already list.
  count = sink + np.maximum(q1 // block_kv - lo + 1, 0)
  slot = np.arange(int(count.max()))[None, :]
  columns = np.where(slot < sink[:, None], slot, lo[:, None] + slot - sink[:, None])
  return q0, columns, slot < count[:, None]


def _column_rows(q_start, q_len, kv_len, block_q, block_kv, window, sinks):
  """Per key block, the query blocks that see any of its keys, in order and padded at the front (splash's dkv
  layout), as (rows [width, columns], kept [width, columns]): queries [k0, k1 + window - 1], or every later query
  for a block holding a sink key, within [q_start, q_start + q_len)."""
  k0 = np.arange(0, kv_len, block_kv)
  q_end = q_start + q_len - 1
  last = np.full_like(k0, q_end)
  if window is not None:
    last = np.where(k0 < sinks, q_end, np.minimum(k0 + block_kv - 1 + window - 1, q_end))
  first = np.maximum(k0, q_start)
  count = np.where(first <= last, (last - q_start) // block_q - (first - q_start) // block_q + 1, 0)
  width = max(int(count.max()), 1)
  slot = np.arange(width)[:, None] - (width - count)[None, :]
  return k0, (first - q_start)[None, :] // block_q + slot, slot >= 0


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

  The forward tables list each query block's visible key blocks in order, padded at the end with zeros; the next
  block of a visible block is its own column. The dkv tables walk the grid key block by key block (the next block
  is a query block) and list each key column's visible blocks, padded at the top. Only visible blocks are built,
  so memory grows with them, not with the grid (a window's tables are a band).
  """
  if dkv:
    k0, rows, kept = _column_rows(q_start, q_len, q_start + q_len, block_q, block_kv, window, sinks)
    classes = _classes(q_start + rows * block_q, k0[None, :], block_q, block_kv, window, sinks)
    data_next = rows
  else:
    q0, columns, kept = _row_columns(q_start, q_len, block_q, block_kv, window, sinks)
    classes = _classes(q0[:, None], columns * block_kv, block_q, block_kv, window, sinks)
    data_next = columns
  block_mask, data_next = np.where(kept, classes, EMPTY), np.where(kept, data_next, 0)
  return info_lib.MaskInfo(data_next=_smallest_int(data_next[None]), mask_next=None,
                           block_mask=_smallest_int(block_mask[None]), partial_mask_blocks=None,
                           q_sequence=np.arange(q_start, q_start + q_len, dtype=np.int32))


@functools.lru_cache(maxsize=256)
def table_bytes(q_start, q_len, block, window=None, sinks=0):
  """Scalar-memory bytes of the larger of the forward and dkv kernels' tables (next block and block mask) of
  `mask_info` in square blocks, from the visible blocks' counts alone."""
  nq, nk = q_len // block, (q_start + q_len) // block
  _, _, row_kept = _row_columns(q_start, q_len, block, block, window, sinks)
  _, _, column_kept = _column_rows(q_start, q_len, q_start + q_len, block, block, window, sinks)
  fwd = nq * row_kept.shape[1] * (np.dtype(_int_for(nk - 1)).itemsize + 1)
  dkv = nk * column_kept.shape[0] * (np.dtype(_int_for(nq - 1)).itemsize + 1)
  return max(fwd, dkv)


def visible_pairs(t, window=None, sinks=0):
  """(query, key) pairs `visible` lets through in a row of t tokens, in closed form: min(i + 1, window) keys for
  query i, plus the sink keys j < sinks that lie outside its window (j <= i - window)."""
  w = t if window is None else min(window, t)
  pairs = w * (w + 1) // 2 + (t - w) * w
  # Query w - 1 + m (m = 1 .. t - w) sees min(sinks, m) sink keys outside its window.
  n, s = t - w, (min(sinks, t) if window is not None else 0)
  return pairs + (n * (n + 1) // 2 if n <= s else s * (s + 1) // 2 + (n - s) * s)


def computed_pairs(infos, block_q, block_kv):
  """(query, key) pairs splash computes from tables `infos` (MaskInfo, one per query chunk) of blocks
  block_q x block_kv: every block a block mask lists (partial or full) is computed whole."""
  return sum(int(np.count_nonzero(np.asarray(info.block_mask))) * block_q * block_kv for info in infos)


@functools.lru_cache(maxsize=256)
def work_ratio(t, block, window=None, sinks=0, chunk=None, dkv=False):
  """Pairs computed per visible pair for a row of t tokens zero-padded to square blocks of `block`, attended in
  query chunks of `chunk` rows (None: whole), from the forward's tables (dkv: the backward's, which list the same
  blocks). 1 is no waste; padding and the blocks' masked corners raise it."""
  tp = -(-t // block) * block
  chunk = chunk or tp
  infos = [mask_info(start, min(chunk, tp - start), block, block, window=window, sinks=sinks, dkv=dkv)
           for start in range(0, tp, chunk)]
  return computed_pairs(infos, block, block) / visible_pairs(t, window, sinks)


@functools.lru_cache(maxsize=256)
def query_chunk(t, block, budget, window=None, sinks=0):
  """The most queries (a multiple of `block`, at most T) one splash call takes so that the tables of every chunk
  of a [T, T] mask fit `budget` bytes; the last chunk, whose rows see the most keys, is the largest."""
  chunk = t
  while chunk > block and table_bytes(t - chunk, chunk, block, window, sinks) > budget:
    chunk = max(block, chunk // 2 // block * block)
  return chunk
