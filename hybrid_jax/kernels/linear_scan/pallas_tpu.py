"""Scalar-decay scan for TPUs: Mosaic-style Pallas kernels (math in `pallas_scan`, drivers in `pallas_common`).

Works on [B, H, T, D] (transposed by XLA around the kernels) so tiles are (chunk, head dim); the sequential passes
make the chunk the last, "arbitrary" grid axis and carry the fp32 state in VMEM scratch. Chunks must be multiples of
8 (sublanes). On CPU the kernels run in Pallas interpret mode (tests); tests/test_tpu_compile.py compiles them for
TPU topologies ahead of time through Mosaic.
"""

from hybrid_jax.kernels import platform
from hybrid_jax.kernels.linear_scan import pallas_scan

MIN_CHUNK = 8


def linear_scan(q, k, v, log_decay, *, scale, initial_state, chunk_size, interpret=None, block_v=None):
  """Arguments as `hybrid_jax.kernels.linear_scan`; interpret defaults to True off TPU; block_v defaults to V."""
  if interpret is None:
    interpret = platform.target() != 'tpu'
  return pallas_scan.linear_scan('tpu', q, k, v, log_decay, scale=scale, initial_state=initial_state,
                                 chunk_size=chunk_size, interpret=interpret, block_v=block_v, min_chunk=MIN_CHUNK)
