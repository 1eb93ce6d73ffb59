"""Held-out loss and perplexity, overall and per position bucket.

Loss falling with position means the model uses long context; a flat curve means it does not.
"""

import math

import numpy as np


def loss_by_position(nll_sum, counts, buckets: int) -> list[dict]:
  """Equal-width position buckets: [{'start', 'end', 'loss'}] from per-position NLL sums and token counts."""
  nll_sum, counts = np.asarray(nll_sum, np.float64), np.asarray(counts, np.float64)
  edges = np.linspace(0, len(nll_sum), buckets + 1).round().astype(int)
  return [{'start': int(a), 'end': int(b), 'loss': float(nll_sum[a:b].sum() / counts[a:b].sum())}
          for a, b in zip(edges[:-1], edges[1:]) if b > a]


def evaluate(eval_step, params, batches, *, buckets: int) -> dict:
  """{'loss', 'perplexity', 'tokens', 'loss_by_position'} over `batches` with a jitted eval step."""
  if not batches:
    raise ValueError('evaluation needs at least one batch')
  nll_sum, counts = None, None
  for batch in batches:
    s, c = (np.asarray(x, np.float64) for x in eval_step(params, batch))
    nll_sum, counts = (s, c) if nll_sum is None else (nll_sum + s, counts + c)
  loss = float(nll_sum.sum() / counts.sum())
  return {'loss': loss, 'perplexity': math.exp(min(loss, 700.0)), 'tokens': int(counts.sum()),
          'loss_by_position': loss_by_position(nll_sum, counts, buckets)}
