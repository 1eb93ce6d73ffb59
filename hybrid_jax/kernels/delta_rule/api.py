"""`gated_delta_rule(...)` and its decode step: argument checks and the choice of implementation.

Head layout, state dtype and the concreteness rule for value checks are the linear scan's, in the checks both
scans import (`hybrid_jax.kernels.scan_checks`); both Pallas implementations run `pallas_delta` with their
backend's name. k is expected L2-normalised and beta in [0, 2] (the layer ensures both;
beta > 1 gives I - beta k k^T a negative eigenvalue, OLMo Hybrid's allow_neg_eigval): then (I + L)^-1 stays
bounded; with raw keys it blows up. The endpoints are accepted because a float32 sigmoid saturates to exactly 1.
"""

import functools

from hybrid_jax.kernels import platform
from hybrid_jax.kernels.delta_rule import pallas_delta
from hybrid_jax.kernels.delta_rule import reference
from hybrid_jax.kernels.delta_rule import xla
from hybrid_jax.kernels.scan_checks import check_common
from hybrid_jax.kernels.scan_checks import check_gate
from hybrid_jax.kernels.scan_checks import check_step
from hybrid_jax.kernels.scan_checks import document_gates
from hybrid_jax.kernels.scan_checks import resolve
from hybrid_jax.kernels.scan_checks import run_step

_IMPLEMENTATIONS = {
    'reference': lambda q, k, v, g, beta, *, scale, initial_state, chunk_size: reference.gated_delta_rule(
        q, k, v, g, beta, scale=scale, initial_state=initial_state),
    'xla': xla.gated_delta_rule,
    'pallas_gpu': platform.pallas_runner('pallas_gpu', functools.partial(pallas_delta.gated_delta_rule, 'gpu'), 'gpu'),
    'pallas_tpu': platform.pallas_runner('pallas_tpu', functools.partial(pallas_delta.gated_delta_rule, 'tpu'), 'tpu'),
}
IMPLEMENTATIONS = tuple(_IMPLEMENTATIONS)


def gated_delta_rule(q, k, v, log_decay, beta, *, scale=None, initial_state=None, chunk_size=64,
                     segment_ids=None, implementation=None):
  """Gated DeltaNet: S_t = exp(g_t)(I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T, o_t = scale * S_t^T q_t.

  q/k [B,T,Hk,K] (k L2-normalised), v [B,T,Hv,V] (Hv % Hk == 0), log_decay <= 0 [B,T,Hv] (or [Hv]),
  beta in [0, 2] [B,T,Hv], initial_state [B,Hv,K,V] or None; scale defaults to K**-0.5.
  segment_ids [B,T]: the state restarts from zero at each document start, as in `linear_scan`.
  implementation: None/'auto' (best available, as `linear_scan`: 'pallas_tpu' on TPU, the measured table on GPU,
  'xla' elsewhere), 'reference', 'xla', 'pallas_gpu', 'pallas_tpu' (Pallas ones run interpreted on CPU).
  Returns o [B,T,Hv,V] in q's dtype and the final state [B,Hv,K,V] (float32, float64 for float64 inputs).
  """
  (b, t, _, dk, hv, _), chunk_size = check_common(q, k, v, initial_state, chunk_size)
  fn = resolve(implementation, _IMPLEMENTATIONS, 'gated_delta_rule', dtype=q.dtype, chunk_size=chunk_size,
               head_dims=(dk, v.shape[3]))
  log_decay = check_gate('log_decay', log_decay, (b, t, hv), hi=0, allow_per_head=True)
  beta = check_gate('beta', beta, (b, t, hv), lo=0, hi=2)
  log_decay = document_gates(log_decay, segment_ids, b, t)
  scale = dk**-0.5 if scale is None else scale
  return fn(q, k, v, log_decay, beta, scale=scale, initial_state=initial_state, chunk_size=chunk_size)


def gated_delta_rule_step(state, q_t, k_t, v_t, log_decay_t, beta_t, *, scale=None):
  """One decode token of `gated_delta_rule`: q_t/k_t [B,Hk,K], v_t [B,Hv,V], log_decay_t/beta_t [B,Hv].

  Returns (o_t [B,Hv,V] in q_t's dtype, new state [B,Hv,K,V] float32).
  """
  gates = check_step(state, q_t, k_t, v_t,
                     {'log_decay_t': (log_decay_t, dict(hi=0)), 'beta_t': (beta_t, dict(lo=0, hi=2))})
  return run_step(state, q_t, k_t, v_t, gates['log_decay_t'], gates['beta_t'], scale)
