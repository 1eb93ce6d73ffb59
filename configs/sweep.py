"""The study's sweeps: a sweep file that takes its runs from the packaged one, hybrid_jax/configs/sweep.py (its
sweeps are documented there; `--sweep sweep:NAME` names it without this file).

It changes nothing, so `--sweep configs/sweep.py:main` runs the packaged `sweep:main`. To sweep runs of your own,
copy this file (e.g. to configs/my_sweep.py) and return your own run strings, each one `--config` of `train`
optionally followed by `--config.KEY=VALUE` overrides, e.g.
`[f'configs/my_hybrid.py:arch={arch},scale=s1' for arch in ('full', 'gdn')]`.
"""

from hybrid_jax.config import packaged_module


def runs(name=None):
  return packaged_module('sweep', 'sweep').runs(name)
