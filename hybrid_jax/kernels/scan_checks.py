"""What `linear_scan` and `gated_delta_rule` share in front of their kernels: argument checks, document gates,
the choice of implementation and the decode step (one module both api modules import, so neither scan depends on
the other's api).

Head layout (GVA): q and k have Hk heads, v has Hv heads with Hv % Hk == 0; value head h reads key head
h // (Hv // Hk). The state, the log decay (and beta for the delta rule) belong to value heads: states are
[B, Hv, K, V], per-token gates [B, T, Hv], constant gates [Hv]. States are float32 (float64 for float64 inputs).
Value checks (log_decay <= 0, beta in [0, 2]) run only on concrete arrays; under jit they are skipped.
"""

import operator
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_jax.kernels import gpu_smem
from hybrid_jax.kernels import pallas_scan_common as pc
from hybrid_jax.kernels import platform
from hybrid_jax.kernels import segments
from hybrid_jax.kernels.linear_scan import reference

IMPLEMENTATION_NAMES = ('reference', 'xla', 'pallas_gpu', 'pallas_tpu')
_AUTO = {'tpu': 'pallas_tpu', 'cpu': 'xla'}  # Backend -> automatic choice; GPU below; anything else gets 'xla'.
# Automatic choice on GPU, per kernel. 'pallas_gpu' goes here only once `python -m hybrid_jax bench scan` on the GPU
# machine (scripts/device/measure.sh) has measured it faster than 'xla' in the same run, with its parity checks
# passing. No GPU measurement exists yet, so both stay on the chunked XLA path.
GPU_MEASURED_CHOICE = {'linear_scan': 'xla', 'gated_delta_rule': 'xla'}
_PALLAS = {'pallas_gpu': 'gpu', 'pallas_tpu': 'tpu'}  # Implementation -> Pallas backend.
_PALLAS_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
_warned = set()


def supports(name, dtype, chunk_size, head_dims=(64, 64), kernel='linear_scan'):
  """Whether implementation `name` can run a call with these inputs (the automatic choice checks this); for
  'pallas_gpu' that includes a chunk whose kernels fit the GPU's shared memory (`gpu_smem.scan_chunk`)."""
  if name not in _PALLAS:
    return True
  ok = chunk_size % pc.MIN_CHUNK[_PALLAS[name]] == 0 and any(jnp.dtype(dtype) == jnp.dtype(d) for d in _PALLAS_DTYPES)
  if name == 'pallas_gpu':  # Triton tiles: powers of two, at least 16.
    ok = ok and all(n >= 16 and not n & (n - 1) for n in (chunk_size, *head_dims))
    itemsize = jnp.dtype(dtype).itemsize
    ok = ok and gpu_smem.scan_chunk(kernel, chunk_size, *head_dims, pc.GPU_BLOCK_V, itemsize) is not None
  return ok


def resolve(implementation, table, kernel, *, dtype=jnp.float32, chunk_size=64, head_dims=(64, 64)):
  """The callable for an implementation name (None/'auto' -> per-backend default, falling back to 'xla' with one
  warning when the preferred Pallas kernel cannot take this call)."""
  if implementation in (None, 'auto'):
    backend = platform.target()
    implementation = GPU_MEASURED_CHOICE[kernel] if backend == 'gpu' else _AUTO.get(backend, 'xla')
    if not supports(implementation, dtype, chunk_size, head_dims, kernel):
      if (kernel, implementation) not in _warned:
        _warned.add((kernel, implementation))
        warnings.warn(f'{kernel}: {implementation!r} cannot run dtype {jnp.dtype(dtype).name}, chunk_size '
                      f"{chunk_size}, head dims {tuple(head_dims)}; using 'xla'")
      implementation = 'xla'
  if not isinstance(implementation, str) or implementation not in table:
    raise ValueError(f'unknown {kernel} implementation {implementation!r}; allowed: None, '
                     f"'auto', {', '.join(map(repr, table))}")
  return table[implementation]


def _concrete(x):
  """x as a NumPy array, or None while tracing (values unknown)."""
  try:
    return np.asarray(x)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return None


def check_gate(name, x, shape, *, lo=None, hi=None, allow_per_head=False):
  """Shape (and, when concrete, range) check of log_decay / beta; returns x broadcast to `shape`."""
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f'{name} must be floating point, got {x.dtype}')
  if allow_per_head and x.shape == shape[-1:]:
    x = jnp.broadcast_to(x, shape)
  if x.shape != shape:
    allowed = f'{shape} [B, T, Hv]' + (f' or {shape[-1:]} [Hv]' if allow_per_head else '')
    raise ValueError(f'{name} must have shape {allowed} (one value per value head), got {x.shape}')
  values = _concrete(x)
  if values is not None:
    if np.isnan(values).any():
      raise ValueError(f'{name} contains NaN')
    if lo is not None and (values < lo).any():
      raise ValueError(f'{name} must be >= {lo}, got min {values.min()}')
    if hi is not None and (values > hi).any():
      raise ValueError(f'{name} must be <= {hi}' + (' (a log decay; exp(g) <= 1)' if hi == 0 else '') +
                       f', got max {values.max()}')
  return x


def check_common(q, k, v, initial_state, chunk_size):
  """Shapes and dtypes shared by both scans; returns (B, T, Hk, K, Hv, V) and chunk_size as an int."""
  for name, x in (('q', q), ('k', k), ('v', v)):
    if jnp.ndim(x) != 4:
      raise ValueError(f'{name} must have rank 4 [B, T, H, D], got shape {jnp.shape(x)}')
  if q.shape != k.shape:
    raise ValueError(f'q and k must have the same shape [B, T, Hk, K], got q {q.shape} and k {k.shape}')
  b, t, hk, dk = q.shape
  _, _, hv, dv = v.shape
  if v.shape[:2] != (b, t):
    raise ValueError(f'v [B, T, Hv, V] must match q [B, T, Hk, K] in B and T, got q {q.shape}, v {v.shape}')
  if hv % hk:
    raise ValueError(f'value heads Hv={hv} must be a multiple of key heads Hk={hk}')
  if not (q.dtype == k.dtype == v.dtype) or not jnp.issubdtype(q.dtype, jnp.floating):
    raise ValueError(f'q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}')
  if initial_state is not None:
    if jnp.shape(initial_state) != (b, hv, dk, dv):
      raise ValueError(f'initial_state must have shape [B, Hv, K, V] = {(b, hv, dk, dv)}, got '
                       f'{jnp.shape(initial_state)}')
  if isinstance(chunk_size, bool):
    raise ValueError(f'chunk_size must be a positive int, got {chunk_size!r}')
  try:
    chunk_size = operator.index(chunk_size)
  except TypeError:
    raise ValueError(f'chunk_size must be a static positive int, got {chunk_size!r}') from None
  if chunk_size <= 0:
    raise ValueError(f'chunk_size must be positive, got {chunk_size}')
  return (b, t, hk, dk, hv, dv), chunk_size


def document_gates(log_decay, segment_ids, b, t):
  """log_decay [B, T, Hv] with every document start of `segment_ids` [B, T] as a decay to zero (None: unchanged).

  This is how every implementation, forward and backward, keeps documents apart (hybrid_jax.kernels.segments).
  """
  if segment_ids is None:
    return log_decay
  segments.check(segment_ids, b, t)
  return segments.reset_log_decay(log_decay, segment_ids)


def check_step(state, q_t, k_t, v_t, gates):
  """Shapes for one decode token; returns gates broadcast to [B, Hv] (name -> array or None)."""
  for name, x in (('q_t', q_t), ('k_t', k_t), ('v_t', v_t)):
    if jnp.ndim(x) != 3:
      raise ValueError(f'{name} must have rank 3 [B, H, D], got shape {jnp.shape(x)}')
  if q_t.shape != k_t.shape:
    raise ValueError(f'q_t and k_t must have the same shape, got {q_t.shape} and {k_t.shape}')
  b, hk, dk = q_t.shape
  _, hv, dv = v_t.shape
  if v_t.shape[0] != b or hv % hk:
    raise ValueError(f'v_t [B, Hv, V] must match q_t [B, Hk, K] in B with Hv % Hk == 0, got q_t '
                     f'{q_t.shape}, v_t {v_t.shape}')
  if jnp.shape(state) != (b, hv, dk, dv):
    raise ValueError(f'state must have shape [B, Hv, K, V] = {(b, hv, dk, dv)}, got {jnp.shape(state)}')
  out = {}
  for name, (x, kw) in gates.items():
    out[name] = check_gate(name, x, (b, hv), allow_per_head=name.startswith('log_decay'), **kw)
  return out


def run_step(state, q_t, k_t, v_t, g_t, beta_t, scale):
  """Shared decode step: expands key heads to value heads by index and applies one token."""
  hk, dk = q_t.shape[1:]
  hv = v_t.shape[1]
  ct = reference.compute_dtype(q_t.dtype, v_t.dtype)
  heads = jnp.arange(hv) // (hv // hk)
  scale = dk**-0.5 if scale is None else scale
  cast = lambda x: None if x is None else x.astype(ct)
  o_t, state = reference.step(cast(state), cast(q_t[:, heads]), cast(k_t[:, heads]), cast(v_t), cast(g_t),
                              cast(beta_t), scale)
  return o_t.astype(q_t.dtype), state
