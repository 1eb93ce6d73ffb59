"""Matrix products through oneDNN for a train step compiled for one CPU device.

XLA:CPU runs a dot whose contracting dimension is not the minor one of its left operand (every weight gradient,
x^T g) through a generic Eigen kernel at about half the speed of its canonical dots. Asking XLA to lower such dots
as oneDNN calls instead takes the mini-study's SWA-128 step from 27 to 22 ms on one core (Mamba-2 -11%, GDN -5%)
with training curves equal to within 2e-7 (docs/notebook/training_step_cpu.md, "CPU: the mini step against
PyTorch").

XLA cannot serialise a program holding oneDNN calls into the persistent compilation cache: with a cache configured
every such compile would warn and be compiled again in each process, so then the step keeps XLA's own dots and the
cache the user asked for. Multi-device CPU meshes (tests, dry runs of sharded layouts) keep
them too: there the program's speed does not matter and its collectives are what is being checked.
"""

import jax

ONEDNN_DOTS = {'xla_cpu_use_onednn': True, 'xla_cpu_experimental_onednn_custom_call': True}


def persistent_cache_configured() -> bool:
  """Whether compiled programs are written to a persistent compilation cache (jax_compilation_cache_dir)."""
  return bool(jax.config.jax_enable_compilation_cache and jax.config.jax_compilation_cache_dir)


def compiler_options(devices) -> dict | None:
  """The XLA options of a step compiled for `devices` (a sequence of devices; a Mesh's .devices.flat): oneDNN dots
  for one CPU device without a persistent compilation cache, else None (XLA's defaults)."""
  devices = list(devices)
  if len(devices) != 1 or devices[0].platform != 'cpu' or persistent_cache_configured():
    return None
  return dict(ONEDNN_DOTS)
