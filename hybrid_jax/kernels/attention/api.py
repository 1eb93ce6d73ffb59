"""`attention(...)`: argument checks and the choice of implementation.

Every implementation receives already-validated arguments. A new kernel is one entry in `_IMPLEMENTATIONS`
(and, to become the automatic choice on a backend, one name in `_AUTO`).
"""

import operator

import jax
import jax.numpy as jnp

from hybrid_jax.kernels.attention import reference
from hybrid_jax.kernels.attention import xla


def _cudnn(q, k, v, *, window, scale, sinks, segment_ids):
  """cuDNN fused attention through jax.nn; supports the plain causal sliding window only."""
  if jax.default_backend() != 'gpu':
    raise RuntimeError(f"implementation='cudnn' needs a GPU backend; the current backend is "
                       f"{jax.default_backend()!r} (use implementation='xla' or None)")
  if sinks or segment_ids is not None:
    raise ValueError("implementation='cudnn' supports neither sinks nor segment_ids; use 'xla'")
  local = None if window is None or window >= q.shape[1] else (window - 1, 0)
  return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True, local_window_size=local,
                                      implementation='cudnn')


def _not_yet(name):
  def unavailable(*args, **kwargs):
    del args, kwargs
    raise NotImplementedError(f'implementation={name!r} is not available yet in this version; use '
                              f"'xla' (portable) or 'cudnn' (GPU)")
  return unavailable


_IMPLEMENTATIONS = {
    'reference': reference.attention,
    'xla': xla.attention,
    'cudnn': _cudnn,
    'pallas_gpu': _not_yet('pallas_gpu'),
    'pallas_tpu': _not_yet('pallas_tpu'),
}
_AUTO = {'gpu': 'xla', 'tpu': 'xla'}  # Backend -> automatic choice; anything else gets 'xla'.
IMPLEMENTATIONS = tuple(_IMPLEMENTATIONS)


def attention(q, k, v, *, window=None, scale=None, sinks=0, segment_ids=None, implementation=None):
  """Causal attention, optionally sliding-window, with GQA, sink positions and document masking.

  q [B,T,Hq,D], k/v [B,T,Hkv,D] with Hq % Hkv == 0. Key j is visible to query i iff j <= i and
  (i - window < j or j < sinks); window None (or >= T) is full causal. With segment_ids [B,T], only keys of the
  query's own segment are visible. scale defaults to D**-0.5.
  implementation: None/'auto' (best available), 'reference', 'xla', 'cudnn', 'pallas_gpu', 'pallas_tpu'.
  Returns o [B,T,Hq,D] in q's dtype.
  """
  window, sinks = _check(q, k, v, window, sinks, segment_ids)
  if implementation in (None, 'auto'):
    implementation = _AUTO.get(jax.default_backend(), 'xla')
  if implementation not in _IMPLEMENTATIONS:
    raise ValueError(f'unknown attention implementation {implementation!r}; allowed: None, '
                     f"'auto', {', '.join(map(repr, IMPLEMENTATIONS))}")
  return _IMPLEMENTATIONS[implementation](q, k, v, window=window, scale=scale, sinks=sinks,
                                          segment_ids=segment_ids)


def _check(q, k, v, window, sinks, segment_ids):
  """Raises ValueError naming the offending argument; returns window and sinks as ints."""
  for name, x in (('q', q), ('k', k), ('v', v)):
    if jnp.ndim(x) != 4:
      raise ValueError(f'{name} must have rank 4 [B, T, H, D], got shape {jnp.shape(x)}')
  if k.shape != v.shape:
    raise ValueError(f'k and v must have the same shape, got k {k.shape} and v {v.shape}')
  b, t, hq, d = q.shape
  if (k.shape[0], k.shape[1], k.shape[3]) != (b, t, d):
    raise ValueError(f'k/v [B, T, Hkv, D] must match q [B, T, Hq, D] in B, T and D, got q {q.shape} and '
                     f'k {k.shape}')
  if hq % k.shape[2]:
    raise ValueError(f'query heads Hq={hq} must be a multiple of kv heads Hkv={k.shape[2]}')
  if not (q.dtype == k.dtype == v.dtype) or not jnp.issubdtype(q.dtype, jnp.floating):
    raise ValueError(f'q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}')
  if window is not None:
    window = _as_int('window', window)
    if window <= 0:
      raise ValueError(f'window must be a positive number of keys (or None for full causal), got {window}')
  sinks = _as_int('sinks', sinks)
  if sinks < 0:
    raise ValueError(f'sinks must be >= 0, got {sinks}')
  if segment_ids is not None:
    if jnp.shape(segment_ids) != (b, t):
      raise ValueError(f'segment_ids must have shape [B, T] = {(b, t)}, got {jnp.shape(segment_ids)}')
    if not jnp.issubdtype(jnp.result_type(segment_ids), jnp.integer):
      raise ValueError(f'segment_ids must be integers, got {jnp.result_type(segment_ids)}')
  return window, sinks


def _as_int(name, value):
  if isinstance(value, bool):
    raise ValueError(f'{name} must be an int, got {value!r}')
  try:
    return operator.index(value)
  except TypeError:
    raise ValueError(f'{name} must be a static Python int, got {value!r}') from None
