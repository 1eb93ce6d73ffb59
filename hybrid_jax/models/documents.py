"""The documents of the rows a model is called on: `segment_ids` [B, T] and the positions RoPE reads.

`model(tokens, positions=None, segment_ids=None)`: without segment ids every row is one document at positions
0..T-1 (or the positions given). With them every token sees only its own document (a maximal run of equal ids,
hybrid_jax.kernels.segments) in every mixer. Positions given beside segment ids must count up by one inside each
document (a document's first token may start anywhere: the tail of a document cut at a row's start continues its
numbering, or restarts at 0).

Positions enter the model only through RoPE, whose attention scores depend on the difference of two positions, and
with documents no score spans two documents: every numbering that counts up by one inside each document gives the
same function. So with segment ids the model rotates by the row index 0..T-1, one [T] table for the whole batch as
without documents, whatever positions were given (they are checked, then not needed): a [B, T] position array
would be carried into every attention layer and, measured on S1 at 16K on v5p, kept a third more memory live.
"""

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_jax.kernels import segments


def _concrete(x):
  """x as a NumPy array, or None while tracing (values unknown)."""
  try:
    return np.asarray(x)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return None


def resolve(tokens, positions=None, segment_ids=None):
  """(positions [B, T] or [T] int32, segment_ids [B, T] or None) for int tokens [B, T], checked.

  Raises ValueError naming the argument: segment ids or positions of the wrong shape or dtype, and (on concrete
  arrays) positions that do not count up by one inside a document. With segment ids the positions returned are
  0..T-1 (see the module docstring).
  """
  b, t = tokens.shape
  if segment_ids is not None:
    segments.check(segment_ids, b, t)
  if positions is None:
    return jnp.arange(t, dtype=jnp.int32), segment_ids
  if jnp.shape(positions) not in ((t,), (b, t)):
    raise ValueError(f'positions must have shape [B, T] = {(b, t)} or [T], got {jnp.shape(positions)}')
  if not jnp.issubdtype(jnp.result_type(positions), jnp.integer):
    raise ValueError(f'positions must be integers, got {jnp.result_type(positions)}')
  if segment_ids is not None:
    pos, seg = _concrete(positions), _concrete(segment_ids)
    if pos is not None and seg is not None:
      pos = np.broadcast_to(pos, (b, t))
      inside = np.asarray(segments.starts(seg)) == 0
      inside[:, 0] = False
      bad = inside[:, 1:] & (np.diff(pos, axis=1) != 1)
      if bad.any():
        row, col = map(int, np.argwhere(bad)[0])
        raise ValueError(f'positions do not match segment_ids: row {row}, tokens {col} and {col + 1} are in one '
                         f'document at positions {pos[row, col]} and {pos[row, col + 1]} (positions count up by one '
                         'inside a document)')
    return jnp.arange(t, dtype=jnp.int32), segment_ids
  return positions, segment_ids
