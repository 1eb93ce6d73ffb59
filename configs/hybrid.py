"""The study's grid: an experiment file that takes its config from the packaged one, hybrid_jax/configs/hybrid.py
(its arches, scales and arguments are documented there; `--config=hybrid:ARG` names it without this file).

It changes nothing, so `--config=configs/hybrid.py:arch=gdn,scale=s1` is the packaged `hybrid:arch=gdn,scale=s1`.
To start an experiment of your own, copy this file (e.g. to configs/my_hybrid.py), change keys where it says so, and
run `--config=configs/my_hybrid.py:arch=gdn,scale=s1`.
"""

from hybrid_jax.config import packaged_module


def get_config(arg=None):
  c = packaged_module('hybrid').get_config(arg)
  # An experiment's own changes go here, e.g. `c.model.window = 64`.
  return c
