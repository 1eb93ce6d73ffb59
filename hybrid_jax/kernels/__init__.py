"""Mixer kernels with stable public contracts (see MIXERS.md, "Kernel contracts")."""

from hybrid_jax.kernels.attention import attention

__all__ = ['attention']
