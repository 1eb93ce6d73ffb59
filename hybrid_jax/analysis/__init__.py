"""Analyses of trained models and of sweeps: scaling laws, and the mechanistic tools of `python -m hybrid_jax analyze`
(retrieval heads, tracing, receptive-field restriction, probing, gradient influence; the `analyze` command: hybrid_jax/commands/analyze.py)."""
