"""Gated delta rule for GPUs: Triton-style Pallas kernels (math in `pallas_delta`).

The intra-chunk inverse (I + L)^-1 uses forward substitution on 16x16 diagonal blocks and a block merge, so every
product is a 16-row Triton dot; chunks must be multiples of 16. Layout and sequential passes as the scalar-decay
scan's GPU kernels (`hybrid_jax.kernels.linear_scan.pallas_gpu`). On CPU the kernels run in interpret mode (tests).
"""

from hybrid_jax.kernels import platform
from hybrid_jax.kernels.delta_rule import pallas_delta

MIN_CHUNK = pallas_delta.SUB


def gated_delta_rule(q, k, v, log_decay, beta, *, scale, initial_state, chunk_size, interpret=None, block_v=None):
  """Arguments as `hybrid_jax.kernels.gated_delta_rule`; interpret defaults to True off GPU."""
  if interpret is None:
    interpret = platform.target() != 'gpu'
  return pallas_delta.gated_delta_rule('gpu', q, k, v, log_decay, beta, scale=scale, initial_state=initial_state,
                                       chunk_size=chunk_size, interpret=interpret, block_v=block_v,
                                       min_chunk=MIN_CHUNK)
