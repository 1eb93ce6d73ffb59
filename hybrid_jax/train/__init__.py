"""Training: optimizer and schedules, the pure train step, checkpoints, metrics and the loop."""
