"""Held-out loss and perplexity over packed rows (what training optimises), and per position bucket of given sums.

Packed rows cut held-out text into fixed-length pieces regardless of document boundaries, so a row's position p is
not a document's p-th token: loss by position is measured on whole documents instead (hybrid_jax.eval.position).
"""

import math

import numpy as np

from hybrid_jax.parallel import distributed
from hybrid_jax.train import step as step_lib


def perplexity(loss: float) -> float:
  return math.exp(min(loss, 700.0))


def loss_by_position(nll_sum, counts, buckets: int) -> list[dict]:
  """Equal-width position buckets: [{'start', 'end', 'loss'}] from per-position NLL sums and token counts."""
  nll_sum, counts = np.asarray(nll_sum, np.float64), np.asarray(counts, np.float64)
  edges = np.linspace(0, len(nll_sum), buckets + 1).round().astype(int)
  return [{'start': int(a), 'end': int(b), 'loss': float(nll_sum[a:b].sum() / counts[a:b].sum())}
          for a, b in zip(edges[:-1], edges[1:]) if b > a]


def evaluate_packed(eval_step, params, batches) -> dict:
  """{'packed_loss', 'packed_perplexity', 'packed_tokens'} over packed held-out `batches` with a jitted eval step;
  with documents, over the targets the training loss counts (`step.target_weights`)."""
  if not batches:
    raise ValueError('evaluation needs at least one batch')
  total, tokens = 0.0, 0
  for batch in batches:
    nll = np.asarray(eval_step(params, batch), np.float64)
    weights = step_lib.target_weights({k: distributed.host_array(v) for k, v in batch.items()})
    if weights is None:
      total, tokens = total + nll.sum(), tokens + nll.size
    else:
      weights = np.asarray(weights, np.float64)
      total, tokens = total + (nll * weights).sum(), tokens + int(weights.sum())
  loss = total / tokens
  return {'packed_loss': loss, 'packed_perplexity': perplexity(loss), 'packed_tokens': tokens}
