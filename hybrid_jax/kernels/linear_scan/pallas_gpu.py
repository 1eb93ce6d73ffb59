"""Scalar-decay scan for GPUs: Triton-style Pallas kernels (math in `pallas_scan`, drivers in `pallas_common`).

Reads [B, T, H, D] in place (strided tiles); the sequential passes run one program per (batch, value head, value
block of `block_v` columns) looping over the chunks, so B*Hv*(V/block_v) programs fill the GPU. Chunks must be
multiples of 16 (Triton dots need 16 rows). On CPU the kernels run in Pallas interpret mode (tests).
"""

from hybrid_jax.kernels import platform
from hybrid_jax.kernels.linear_scan import pallas_scan

MIN_CHUNK = 16


def linear_scan(q, k, v, log_decay, *, scale, initial_state, chunk_size, interpret=None, block_v=None):
  """Arguments as `hybrid_jax.kernels.linear_scan`; interpret defaults to True off GPU; block_v: value columns per
  sequential program (default min(V, 64))."""
  if interpret is None:
    interpret = platform.target() != 'gpu'
  return pallas_scan.linear_scan('gpu', q, k, v, log_decay, scale=scale, initial_state=initial_state,
                                 chunk_size=chunk_size, interpret=interpret, block_v=block_v, min_chunk=MIN_CHUNK)
