"""`attention(...)`: argument checks and the choice of implementation.

Every implementation receives already-validated arguments ('cudnn' also the bound of its packed documents). A new
kernel is one entry in `_IMPLEMENTATIONS` (and, to become the automatic choice, one name in `_AUTO` or, on GPU, in
the per-window table `_GPU_BY_WINDOW`).
"""

import operator
import warnings

import jax
import jax.numpy as jnp

from hybrid_jax.kernels import platform
from hybrid_jax.kernels import segments
from hybrid_jax.kernels.attention import cudnn_documents
from hybrid_jax.kernels.attention import pallas_gpu
from hybrid_jax.kernels.attention import pallas_tpu
from hybrid_jax.kernels.attention import reference
from hybrid_jax.kernels.attention import xla


def _cudnn(q, k, v, *, window, scale, sinks, segment_ids, max_documents=None):
  """cuDNN fused attention: the plain causal sliding window through jax.nn; documents through cuDNN's packed layout
  (cudnn_documents), whose rows of more than `max_documents` run the next kernel of _FALLBACK instead."""
  if platform.target() != 'gpu':
    raise RuntimeError(f"implementation='cudnn' needs a GPU target; the target is {platform.target()!r} "
                       "(use implementation='xla' or None)")
  local = None if window is None or window >= q.shape[1] else (window - 1, 0)
  if sinks and local is not None:  # Sinks are moot under full causal.
    raise ValueError("implementation='cudnn' does not support sinks; use 'xla'")
  if segment_ids is not None:
    name = next(n for n in _FALLBACK[:1] + ('xla',) if _unsupported(n, q, window, 0, None) is None)
    fallback = lambda *args, **kwargs: _IMPLEMENTATIONS[name](*args, **kwargs)  # Looked up when traced.
    return cudnn_documents.attention(q, k, v, window=window, scale=scale, segment_ids=segment_ids,
                                     max_documents=max_documents or cudnn_documents.DEFAULT_MAX_DOCUMENTS,
                                     fallback=fallback, fallback_name=name)
  return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True, local_window_size=local,
                                      implementation='cudnn')


_IMPLEMENTATIONS = {
    'reference': reference.attention,
    'xla': xla.attention,
    'cudnn': _cudnn,
    'pallas_gpu': platform.pallas_runner('pallas_gpu', pallas_gpu.attention, 'gpu'),
    'pallas_tpu': platform.pallas_runner('pallas_tpu', pallas_tpu.attention, 'tpu'),
}
IMPLEMENTATIONS = tuple(_IMPLEMENTATIONS)

# Automatic choice on GPU by window bucket: (largest window in the bucket, None = full causal or window >= T,
# implementation). Filled from `python -m hybrid_jax bench attention` on an H200; until measured it is cuDNN
# everywhere, the fastest known anchor (docs/BENCHMARKING.md, "Anchors"). Calls the preferred kernel cannot run
# fall back in _FALLBACK order.
_GPU_BY_WINDOW = ((128, 'cudnn'), (512, 'cudnn'), (2048, 'cudnn'), (None, 'cudnn'))
_AUTO = {'tpu': 'pallas_tpu', 'cpu': 'xla'}  # Other backends; anything not listed gets 'xla'.
_FALLBACK = ('pallas_gpu', 'cudnn', 'xla')
_warned = set()


def _unsupported(name, q, window, sinks, segment_ids):
  """Why the automatic choice may not use `name` on the current GPU for this call; None when it may."""
  d = q.shape[3]
  if name == 'cudnn':
    if q.dtype not in (jnp.bfloat16, jnp.float16) or d % 8 or d > 128:
      return f'dtype {q.dtype}, head dim {d}'
    if sinks and window is not None and window < q.shape[1]:
      return f'sinks {sinks} beside a window'
    if segment_ids is not None:
      return cudnn_documents.unsupported()
    return None
  if name == 'pallas_gpu':
    return None if d >= 16 and not d & (d - 1) else f'head dim {d}'
  return None if name == 'xla' else f'{name} is not chosen automatically'


def _bucket(window, t):
  """The _GPU_BY_WINDOW key of a window: the smallest bound >= window, None for full causal."""
  full = window is None or window >= t
  return next(bound for bound, _ in _GPU_BY_WINDOW if bound is None or (not full and window <= bound))


def _auto(q, window, sinks, segment_ids, preferred=None):
  """The automatic choice; `preferred` (a GPU kernel asked for by name that cannot run the call) is tried first."""
  backend = platform.target()
  if backend != 'gpu':
    return _AUTO.get(backend, 'xla')
  preferred = preferred or dict(_GPU_BY_WINDOW)[_bucket(window, q.shape[1])]
  reason = None
  for name in (preferred,) + _FALLBACK:
    why = _unsupported(name, q, window, sinks, segment_ids)
    if why is None:
      if name != preferred and (preferred, name, reason) not in _warned:  # One warning per reason, not per call.
        _warned.add((preferred, name, reason))
        warnings.warn(f'attention: {preferred!r} cannot run this call ({reason}); using {name!r}')
      return name
    reason = reason or why
  return 'xla'


def attention(q, k, v, *, window=None, scale=None, sinks=0, segment_ids=None, implementation=None,
              max_documents=None):
  """Causal attention, optionally sliding-window, with GQA, sink positions and document masking.

  q [B,T,Hq,D], k/v [B,T,Hkv,D] with Hq % Hkv == 0. Key j is visible to query i iff j <= i and
  (i - window < j or j < sinks); window None (or >= T) is full causal. With segment_ids [B,T], only keys of the
  query's own document are visible: a document is a run of equal ids (an id that comes back later in the row
  starts another document). scale defaults to D**-0.5.
  implementation: None/'auto' (best available: 'pallas_tpu' on TPU, per-window table on GPU, 'xla' on CPU),
  'reference', 'xla', 'cudnn', 'pallas_gpu', 'pallas_tpu' (the Pallas ones run in interpret mode on CPU).
  'cudnn' runs documents through its packed layout (cudnn_documents: cuDNN >= 9.6, Hopper or later), sized for
  `max_documents` per row (None: cudnn_documents.DEFAULT_MAX_DOCUMENTS); a call with a row of more runs
  'pallas_gpu' instead, and a GPU that cannot run the layout falls back as the automatic choice does, warning once.
  Returns o [B,T,Hq,D] in q's dtype.
  """
  window, sinks = _check(q, k, v, window, sinks, segment_ids)
  if max_documents is not None and (_as_int('max_documents', max_documents) <= 0):
    raise ValueError(f'max_documents must be a positive number of documents per row, got {max_documents}')
  if implementation in (None, 'auto'):
    implementation = _auto(q, window, sinks, segment_ids)
  elif implementation == 'cudnn' and segment_ids is not None and platform.target() == 'gpu':
    implementation = _auto(q, window, sinks, segment_ids, preferred='cudnn')
  if segment_ids is not None:
    segment_ids = segments.runs(segment_ids)
  if implementation not in _IMPLEMENTATIONS:
    raise ValueError(f'unknown attention implementation {implementation!r}; allowed: None, '
                     f"'auto', {', '.join(map(repr, IMPLEMENTATIONS))}")
  extra = dict(max_documents=max_documents) if implementation == 'cudnn' else {}
  return _IMPLEMENTATIONS[implementation](q, k, v, window=window, scale=scale, sinks=sinks,
                                          segment_ids=segment_ids, **extra)


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
    segments.check(segment_ids, b, t)
  return window, sinks


def _as_int(name, value):
  if isinstance(value, bool):
    raise ValueError(f'{name} must be an int, got {value!r}')
  try:
    return operator.index(value)
  except TypeError:
    raise ValueError(f'{name} must be a static Python int, got {value!r}') from None
