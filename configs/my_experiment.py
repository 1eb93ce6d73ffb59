"""An experiment file to copy: `cp configs/my_experiment.py configs/my_run.py`, edit, then
`python -m hybrid_jax train --config=configs/my_run.py:arch=swa128,scale=tiny`.

`get_config(ARG)` returns the run's config. Start from a packaged config (`hybrid`, the study's grid, takes the
arguments documented in hybrid_jax/configs/hybrid.py; every key and its default is in hybrid_jax/configs/base.py) and
change only what the experiment needs, each change with its reason. Command-line overrides still apply on top.
"""

from hybrid_jax.config import packaged_module


def get_config(arg=None):
  c = packaged_module('hybrid').get_config(arg or 'arch=swa128,scale=tiny')
  c.name = f'my_{c.name}'  # A name of its own: the run directory (runs/<name>) is not the grid run's.
  c.model.window = 64  # Half the SWA-128 window, so more of the text's dependencies reach past the SWA layers.
  c.data.seq_len *= 2  # Twice the grid's context: longer-range dependencies for the full-attention layers to learn.
  c.train.steps *= 2  # Twice the grid's steps (warmup, evaluations and checkpoints follow where the grid derives them).
  return c
