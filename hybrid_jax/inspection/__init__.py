"""Looking inside a model: a block-by-block forward pass that returns attention rows and residuals, restricts
receptive fields and scales heads (forward.py, windowed.py). Evaluations (hybrid_jax.eval) and analyses
(hybrid_jax.analysis) both read models through it, so it sits below both."""
