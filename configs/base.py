"""Every default of a hybrid_jax run: an experiment file that takes its config from the packaged base config,
hybrid_jax/configs/base.py (where every key is documented; `--config=base` names it without this file).

It changes nothing, so `--config=configs/base.py` runs the packaged defaults. To start an experiment of your own,
copy this file (e.g. to configs/my_run.py), change keys where it says so, and run `--config=configs/my_run.py`.
"""

from hybrid_jax.config import packaged_module


def get_config(arg=None):
  c = packaged_module('base').get_config(arg)
  # An experiment's own changes go here, e.g. `c.train.steps = 1000`.
  return c
