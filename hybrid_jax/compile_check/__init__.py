"""`python -m hybrid_jax compile-check`: the train step compiled for a target mesh from shapes alone (a tool).

It sits above the train step and the model (it builds and compiles them), so nothing below imports it: `fit.py`
compiles a step and judges its memory; `estimate.py` prices a configuration's step time on a chip.
"""
