"""Documents of a packed row as every kernel takes them: `segment_ids` [B, T], one integer per token.

A document is a maximal run of equal ids (0 marks padding, which is a run like any other): tokens see only their
own run. The public kernels accept any integer ids and pass their implementations the run index of each token
(`runs`: int32, 0 at the first token, +1 at every change), so an id that comes back later in the row is a new
document everywhere and every implementation may rely on ids that never decrease.

The recurrent scans need no kernel of their own for documents: a document start t is a decay of exactly zero,
S_t = 0 * S_{t-1} + (the token's own update), which is the recurrence's own algebra. `reset_log_decay` writes it as
the finite log decay RESET_LOG_DECAY (so no cumulative gate ever meets inf - inf, and exp of it is exactly 0 in
float32 and float64), and every chunked path (XLA, Pallas on GPU and TPU), forward and backward, then computes the
documents exactly: a pair of tokens across a start carries exp(<= RESET_LOG_DECAY) = 0, and the gradient of the
replaced gate is exactly zero (the state it would have decayed is gone). The first token of a row continues
`initial_state` (a row that starts a document passes no state, or zeros).
"""

import jax
import jax.numpy as jnp

# exp(x) == 0 for x below about -103 in float32 and -745 in float64; sums of a chunk's worth stay far from overflow.
RESET_LOG_DECAY = -1.0e4


def check(segment_ids, b: int, t: int, name: str = 'segment_ids'):
  """ValueError naming the argument unless it is an integer array of shape [B, T]."""
  if jnp.shape(segment_ids) != (b, t):
    raise ValueError(f'{name} must have shape [B, T] = {(b, t)}, got {jnp.shape(segment_ids)}')
  dtype = jnp.result_type(segment_ids)
  if not jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_:
    raise ValueError(f'{name} must be integers, got {dtype}')


def runs(segment_ids):
  """Run index [B, T] int32 of each token: 0 at t = 0, one more at every change of id."""
  seg = jnp.asarray(segment_ids)
  change = jnp.concatenate([jnp.zeros_like(seg[:, :1], jnp.int32), (seg[:, 1:] != seg[:, :-1]).astype(jnp.int32)],
                           axis=1)
  return jnp.cumsum(change, axis=1, dtype=jnp.int32)


def starts(segment_ids):
  """bool [B, T]: token t (t > 0) begins a new document; t = 0 never does (it continues the initial state)."""
  seg = jnp.asarray(segment_ids)
  return jnp.concatenate([jnp.zeros_like(seg[:, :1], bool), seg[:, 1:] != seg[:, :-1]], axis=1)


def _index(seg):
  return jnp.broadcast_to(jnp.arange(seg.shape[1], dtype=jnp.int32), seg.shape)


def first_token(segment_ids):
  """int32 [B, T]: the index in the row of the first token of each token's document."""
  seg = jnp.asarray(segment_ids)
  return jax.lax.cummax(jnp.where(starts(seg), _index(seg), 0), axis=1)


def last_token(segment_ids):
  """int32 [B, T]: the index in the row of the last token of each token's document."""
  seg = jnp.asarray(segment_ids)
  ends = jnp.concatenate([seg[:, 1:] != seg[:, :-1], jnp.ones_like(seg[:, :1], bool)], axis=1)
  return jax.lax.cummin(jnp.where(ends, _index(seg), seg.shape[1] - 1), axis=1, reverse=True)


def positions(segment_ids):
  """int32 [B, T]: each token's offset from its document's first token in the row (0 at every start)."""
  seg = jnp.asarray(segment_ids)
  return _index(seg) - first_token(seg)


def reset_log_decay(log_decay, segment_ids):
  """log_decay [B, T, H] with RESET_LOG_DECAY at every document start (see the module docstring)."""
  return jnp.where(starts(segment_ids)[..., None], jnp.asarray(RESET_LOG_DECAY, log_decay.dtype), log_decay)

