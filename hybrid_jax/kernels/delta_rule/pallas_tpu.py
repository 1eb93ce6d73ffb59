"""Gated delta rule for TPUs: Mosaic-style Pallas kernels (math in `pallas_delta`).

The intra-chunk inverse is the matmul-only product (I + N)(I + N^2)(I + N^4)... over the whole chunk (MXU work, no
row-by-row substitution). Layout and sequential passes as the scalar-decay scan's TPU kernels
(`hybrid_jax.kernels.linear_scan.pallas_tpu`). On CPU the kernels run in interpret mode (tests);
tests/test_tpu_compile.py compiles them for TPU topologies ahead of time through Mosaic.
"""

from hybrid_jax.kernels import platform
from hybrid_jax.kernels.delta_rule import pallas_delta

MIN_CHUNK = 8


def gated_delta_rule(q, k, v, log_decay, beta, *, scale, initial_state, chunk_size, interpret=None, block_v=None):
  """Arguments as `hybrid_jax.kernels.gated_delta_rule`; interpret defaults to True off TPU."""
  if interpret is None:
    interpret = platform.target() != 'tpu'
  return pallas_delta.gated_delta_rule('tpu', q, k, v, log_decay, beta, scale=scale, initial_state=initial_state,
                                       chunk_size=chunk_size, interpret=interpret, block_v=block_v,
                                       min_chunk=MIN_CHUNK)
