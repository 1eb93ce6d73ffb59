"""Running a whole sweep in one command (`python -m hybrid_jax sweep run|status`): one run directory per run under a
root, completed runs skipped, stopped ones resumed, user errors reported once and not retried.

members: the sweep's runs and their run directories. record: what a run directory says about its run (the
runner's `sweep.json` beside what training writes). runner: which runs to start and what became of them.
local / tpu: where a run's `train` command runs. status: the table. wandb_sink: optional experiment tracking.
"""
