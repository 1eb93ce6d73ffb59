"""hybrid_jax: train, evaluate and dissect hybrid language models in JAX."""

__version__ = '0.1.0'
