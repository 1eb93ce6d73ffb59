"""The platform kernels are chosen for: the devices a program is lowered for, not the host that traces it.

Every kernel's automatic choice (attention, the scans) and every Pallas kernel's interpret decision read
`target()`. By default that is `jax.default_backend()`, right whenever a program runs where it is traced. A program
lowered for other devices (a TPU topology compiled ahead of time from a CPU host, `compile-check`) is traced inside
`targeting(mesh)`, so a TPU program gets the Mosaic kernels even though the CPU traces it.
"""

import contextlib
import contextvars

import jax

PLATFORMS = ('cpu', 'gpu', 'tpu')
_TARGET = contextvars.ContextVar('hybrid_jax_kernel_platform', default=None)


def target() -> str:
  """The platform of the innermost `targeting(...)`, else the default backend."""
  return _TARGET.get() or jax.default_backend()


def platform_of(where) -> str:
  """'cpu' | 'gpu' | 'tpu' of a platform name, a Mesh, or a sequence of devices (all of one platform)."""
  if isinstance(where, str):
    name = where
  else:
    devices = where.devices.flat if hasattr(where, 'devices') else where
    names = {d.platform for d in devices}
    if len(names) != 1:
      raise ValueError(f'devices of one platform expected, got {sorted(names)}')
    name = names.pop()
  name = {'cuda': 'gpu', 'rocm': 'gpu'}.get(name, name)
  if name not in PLATFORMS:
    raise ValueError(f'unknown platform {name!r}; known: {", ".join(PLATFORMS)}')
  return name


@contextlib.contextmanager
def targeting(where):
  """Within this context, kernels are chosen for `where`: 'cpu' | 'gpu' | 'tpu', a Mesh or a device sequence."""
  token = _TARGET.set(platform_of(where))
  try:
    yield
  finally:
    _TARGET.reset(token)


def quiet_offline_libtpu() -> None:
  """On a host with no TPU attached, settings that let libtpu describe and compile for TPUs without error lines.

  libtpu (the `tpu` extra) expects a TPU VM: without its metadata it logs errors about TPU_ACCELERATOR_TYPE and
  TPU_WORKER_HOSTNAMES, and a second process using it at once fails on its lock file. None of that applies to
  ahead-of-time compilation or interpret-mode kernels, so on a host without TPU chips those variables get harmless
  defaults before libtpu loads (values already in the environment win). On a TPU VM nothing changes.
  """
  import os
  from jax._src import hardware_utils  # The check jax's own Cloud TPU set-up uses (PCI device ids).
  if hardware_utils.num_available_tpu_chips_and_device_id()[0]:
    return
  os.environ.setdefault('TPU_ACCELERATOR_TYPE', 'v5litepod-1')  # Only names the local host's bounds; unused.
  os.environ.setdefault('TPU_WORKER_HOSTNAMES', 'localhost')
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')  # Parallel test processes each load libtpu.


quiet_offline_libtpu()  # Before anything can load libtpu: this module is imported with the kernels.


def pallas_runner(name: str, kernel, platform: str):
  """`kernel` (a Pallas kernel written for `platform`) compiled for its platform, interpreted when the target is
  the CPU (tests; slow), and a clear error for any other target."""
  def run(*args, **kwargs):
    here = target()
    if here not in (platform, 'cpu'):
      raise RuntimeError(f'implementation={name!r} needs a {platform.upper()} target (or CPU, where it runs in '
                         f"interpret mode); the target is {here!r} (use implementation=None for the automatic "
                         'choice)')
    return kernel(*args, interpret=here == 'cpu', **kwargs)
  return run
