"""Causal (sliding-window) attention kernels behind one entry point, `attention`."""

from hybrid_jax.kernels.attention.api import IMPLEMENTATIONS
from hybrid_jax.kernels.attention.api import attention

__all__ = ['IMPLEMENTATIONS', 'attention']
