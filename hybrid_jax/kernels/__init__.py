"""Mixer kernels with stable public contracts (see docs/KERNELS.md, "Kernel contracts")."""

from hybrid_jax.kernels.attention import attention
from hybrid_jax.kernels.conv1d import causal_conv1d
from hybrid_jax.kernels.conv1d import causal_conv1d_step
from hybrid_jax.kernels.delta_rule import gated_delta_rule
from hybrid_jax.kernels.delta_rule import gated_delta_rule_step
from hybrid_jax.kernels.linear_scan import linear_scan
from hybrid_jax.kernels.linear_scan import linear_scan_step

__all__ = ['attention', 'causal_conv1d', 'causal_conv1d_step', 'gated_delta_rule', 'gated_delta_rule_step',
           'linear_scan', 'linear_scan_step']
