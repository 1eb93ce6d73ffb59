"""Rows of packed documents as the benchmarks time them: every document `length` tokens (a row's last one shorter
where `length` does not divide the row), laid out as the data pipeline lays out data.packing='documents' batches
(hybrid_jax.data.pipeline: segment ids numbered from 1 in each row, positions from 0 at each document's start)."""

import numpy as np


def segment_ids(batch: int, t: int, length: int) -> np.ndarray:
  """int32 [batch, t]: documents of `length` tokens, numbered from 1."""
  return np.broadcast_to(1 + np.arange(t, dtype=np.int32) // length, (batch, t)).copy()


def lengths(t: int, length: int) -> list[int]:
  """The documents' lengths in one row of `t` tokens."""
  return [length] * (t // length) + ([t % length] if t % length else [])


def visible_pairs(t: int, window, length: int) -> int:
  """(query, key) pairs a causal window of `window` keys (None = full) lets through inside the documents of a
  row of `t` tokens: the attention work a kernel that skips other documents' blocks has to do."""
  def pairs(n):
    w = n if window is None else min(window, n)
    return w * (w + 1) // 2 + (n - w) * w
  return sum(pairs(n) for n in lengths(t, length))


def batch(tokens: np.ndarray, length: int) -> dict:
  """The train batch of `tokens` [rows, T + 1] cut into documents of `length` tokens: 'inputs', 'targets',
  'segment_ids', 'positions' and 'target_segment_ids' [rows, T] int32 (the target of a document's last token is the
  next document's first, and does not count toward the loss)."""
  rows, t1 = tokens.shape
  seg = segment_ids(rows, t1, length)
  positions = np.broadcast_to(np.arange(t1, dtype=np.int32) % length, (rows, t1))
  return {'inputs': np.ascontiguousarray(tokens[:, :-1]), 'targets': np.ascontiguousarray(tokens[:, 1:]),
          'segment_ids': np.ascontiguousarray(seg[:, :-1]), 'positions': np.ascontiguousarray(positions[:, :-1]),
          'target_segment_ids': np.ascontiguousarray(seg[:, 1:])}
