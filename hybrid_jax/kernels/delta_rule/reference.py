"""Token-by-token gated delta rule: the oracle for the chunked UT/WY form (float64 for float64 inputs)."""

from hybrid_jax.kernels.linear_scan.reference import recurrence


def gated_delta_rule(q, k, v, log_decay, beta, *, scale, initial_state):
  """S_t = exp(g_t)(I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T ; o_t = scale * S_t^T q_t, one token at a time."""
  return recurrence(q, k, v, log_decay, beta, scale=scale, initial_state=initial_state)
