"""Evaluation: held-out loss and loss by position (more evaluators arrive with the evaluation suite)."""
