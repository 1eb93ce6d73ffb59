"""Gated delta rule (Gated DeltaNet) behind one entry point, plus its decode step."""

from hybrid_jax.kernels.delta_rule.api import IMPLEMENTATIONS
from hybrid_jax.kernels.delta_rule.api import gated_delta_rule
from hybrid_jax.kernels.delta_rule.api import gated_delta_rule_step

__all__ = ['IMPLEMENTATIONS', 'gated_delta_rule', 'gated_delta_rule_step']
