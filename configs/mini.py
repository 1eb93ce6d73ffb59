"""One run of the mini-study: an experiment file that takes its config from the packaged one,
hybrid_jax/configs/mini.py (its arguments are documented there; `--config=mini:ARG` names it without this file).

It changes nothing, so `--config=configs/mini.py:arch=gdn,seed=1` is the packaged `mini:arch=gdn,seed=1`. To start
an experiment of your own, copy this file (e.g. to configs/my_mini.py), change keys where it says so, and run
`--config=configs/my_mini.py:arch=gdn`.
"""

from hybrid_jax.config import packaged_module


def get_config(arg=None):
  c = packaged_module('mini').get_config(arg)
  # An experiment's own changes go here, e.g. `c.train.lr = 1e-3`.
  return c
