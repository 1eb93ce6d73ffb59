"""The packaged config files, part of every install of hybrid_jax (a wheel included):

- `base.py`: every key of a run and its default, each documented (`python -m hybrid_jax params --help` prints
  where it is installed).
- `hybrid.py`: the study's grid, one run per `arch=NAME,scale=NAME[,budget=M | tokens=T][,stage=...]`.
- `mini.py`: one run of the mini-study (`arch=NAME[,preset=NAME][,seed=K]`).
- `sweep.py`: the study's sweeps, lists of run strings for the two above.

Commands name them without a path: `--config=hybrid:arch=gdn,scale=s1`, `--sweep sweep:main`
(hybrid_jax.config.resolve_path; a file that exists at the given path always wins). They stay config files,
executed afresh by hybrid_jax.config.load_python_file each time they are read, not modules to import. The
repository's top-level configs/ holds experiment files that start from these (configs/my_experiment.py is the one
to copy for an experiment of your own).
"""
