"""The study as runnable experiments: the planner (`python -m hybrid_jax plan`) sizes a sweep before it runs."""
