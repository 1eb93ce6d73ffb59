"""Scalar-decay linear scan (Lightning, Mamba-2 SSD) behind one entry point, plus its decode step."""

from hybrid_jax.kernels.linear_scan.api import IMPLEMENTATIONS
from hybrid_jax.kernels.linear_scan.api import linear_scan
from hybrid_jax.kernels.linear_scan.api import linear_scan_step

__all__ = ['IMPLEMENTATIONS', 'linear_scan', 'linear_scan_step']
