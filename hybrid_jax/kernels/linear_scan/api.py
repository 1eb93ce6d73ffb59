"""`linear_scan(...)` and its decode step: the choice of implementation over the checks of
`hybrid_jax.kernels.scan_checks` (head layout, state dtype and the concreteness rule for value checks are there).

Both Pallas implementations run `pallas_scan` with their backend's name; what differs between backends lives in
`hybrid_jax.kernels.pallas_scan_common`.
"""

import functools

from hybrid_jax.kernels import platform
from hybrid_jax.kernels.linear_scan import pallas_scan
from hybrid_jax.kernels.linear_scan import reference
from hybrid_jax.kernels.linear_scan import xla
from hybrid_jax.kernels.scan_checks import check_common
from hybrid_jax.kernels.scan_checks import check_gate
from hybrid_jax.kernels.scan_checks import check_step
from hybrid_jax.kernels.scan_checks import document_gates
from hybrid_jax.kernels.scan_checks import resolve
from hybrid_jax.kernels.scan_checks import run_step

_IMPLEMENTATIONS = {
    'reference': lambda q, k, v, g, *, scale, initial_state, chunk_size: reference.linear_scan(
        q, k, v, g, scale=scale, initial_state=initial_state),
    'xla': xla.linear_scan,
    'pallas_gpu': platform.pallas_runner('pallas_gpu', functools.partial(pallas_scan.linear_scan, 'gpu'), 'gpu'),
    'pallas_tpu': platform.pallas_runner('pallas_tpu', functools.partial(pallas_scan.linear_scan, 'tpu'), 'tpu'),
}
IMPLEMENTATIONS = tuple(_IMPLEMENTATIONS)


def linear_scan(q, k, v, log_decay, *, scale=None, initial_state=None, chunk_size=64, segment_ids=None,
                implementation=None):
  """Scalar-decay linear scan (Lightning attention, Mamba-2 SSD): S_t = exp(g_t) S_{t-1} + k_t v_t^T,
  o_t = scale * S_t^T q_t.

  q/k [B,T,Hk,K], v [B,T,Hv,V] (Hv % Hk == 0), log_decay <= 0 of shape [B,T,Hv] or [Hv] (constant per head),
  initial_state [B,Hv,K,V] or None (zeros); scale defaults to K**-0.5. T need not be a multiple of chunk_size.
  segment_ids [B,T] (integers): the state restarts from zero at each token whose id differs from the previous
  token's (packed documents; the row's first token continues initial_state).
  implementation: None/'auto' (best available: 'pallas_tpu' on TPU, scan_checks.GPU_MEASURED_CHOICE on GPU, 'xla'
  elsewhere), 'reference', 'xla', 'pallas_gpu', 'pallas_tpu' (the Pallas ones run in interpret mode on CPU).
  Returns o [B,T,Hv,V] in q's dtype and the final state [B,Hv,K,V] (float32, float64 for float64 inputs).
  """
  (b, t, _, dk, hv, _), chunk_size = check_common(q, k, v, initial_state, chunk_size)
  fn = resolve(implementation, _IMPLEMENTATIONS, 'linear_scan', dtype=q.dtype, chunk_size=chunk_size,
               head_dims=(dk, v.shape[3]))
  log_decay = check_gate('log_decay', log_decay, (b, t, hv), hi=0, allow_per_head=True)
  log_decay = document_gates(log_decay, segment_ids, b, t)
  scale = dk**-0.5 if scale is None else scale
  return fn(q, k, v, log_decay, scale=scale, initial_state=initial_state, chunk_size=chunk_size)


def linear_scan_step(state, q_t, k_t, v_t, log_decay_t, *, scale=None):
  """One decode token of `linear_scan`: q_t/k_t [B,Hk,K], v_t [B,Hv,V], log_decay_t [B,Hv] or [Hv].

  Returns (o_t [B,Hv,V] in q_t's dtype, new state [B,Hv,K,V] float32).
  """
  g = check_step(state, q_t, k_t, v_t, {'log_decay_t': (log_decay_t, dict(hi=0))})['log_decay_t']
  return run_step(state, q_t, k_t, v_t, g, None, scale)
