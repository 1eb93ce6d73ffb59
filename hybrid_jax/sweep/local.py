"""The local backend: each run's `train` in a child process on this machine, `--parallel N` at a time.

With several GPUs each of the N slots gets its own share of them (CUDA_VISIBLE_DEVICES), so runs never share a
device; with one GPU the slots split its memory; with none the slots split this process's CPU cores (each child is
bound to its own cores, so XLA sizes its thread pool to them: two 2-thread pools on 2 cores time-share each core and
ran 13% slower than one core each: docs/notebook/mini_study.md, "CPU: the mini-study's step on a CPU"). A child
asks the kernel for SIGTERM when the runner dies, so a killed runner leaves no trainer behind: each checkpoints and
exits, and the rerun resumes it.
"""

import ctypes
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from hybrid_jax import checks, cores
from hybrid_jax.sweep import outcome


def gpu_ids() -> list[str]:
  """The GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else what nvidia-smi lists (none without it)."""
  visible = os.environ.get('CUDA_VISIBLE_DEVICES')
  if visible is not None:
    return [g for g in visible.split(',') if g.strip()]
  if not shutil.which('nvidia-smi'):
    return []
  try:
    out = subprocess.run(['nvidia-smi', '-L'], capture_output=True, text=True, timeout=30, check=False).stdout
  except (OSError, subprocess.SubprocessError):
    return []
  return [str(i) for i, line in enumerate(l for l in out.splitlines() if l.startswith('GPU '))]


def slot_envs(gpus: list[str], parallel: int) -> list[dict]:
  """The environment of each slot: a disjoint share of `gpus` when there are several, a share of one GPU's memory
  when there is one, nothing on CPU."""
  if len(gpus) > 1:
    if parallel > len(gpus):
      raise checks.InputError(f'--parallel={parallel} is invalid: at most the {len(gpus)} GPUs here, one or more '
                              'per run')
    share = len(gpus) // parallel
    return [{'CUDA_VISIBLE_DEVICES': ','.join(gpus[i * share:(i + 1) * share])} for i in range(parallel)]
  if len(gpus) == 1 and parallel > 1:
    return [{'XLA_PYTHON_CLIENT_MEM_FRACTION': f'{0.9 / parallel:.3f}'} for _ in range(parallel)]
  return [{} for _ in range(parallel)]


try:  # Looked up here, not in the forked child (a lookup there could wait on a lock another thread held).
  _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # Not Linux.
  _PRCTL = None


def _start_child(cores):
  """In the child before exec: SIGTERM when the runner dies (prctl PR_SET_PDEATHSIG), and bound to `cores` (None:
  left as inherited)."""
  if _PRCTL is not None:
    _PRCTL(1, signal.SIGTERM)
  if cores:
    os.sched_setaffinity(0, cores)


def slot_cores(cores, gpus: list[str], parallel: int) -> list[frozenset | None]:
  """The CPU cores each slot's child is bound to: disjoint, contiguous shares of `cores` (sizes differing by at most
  one) when the runs train on the CPU (no GPU) and there are at least as many cores as slots; None (no binding)
  otherwise."""
  cores = sorted(cores)
  if gpus or parallel < 2 or len(cores) < parallel:
    return [None] * parallel
  bounds = [len(cores) * i // parallel for i in range(parallel + 1)]
  return [frozenset(cores[lo:hi]) for lo, hi in zip(bounds, bounds[1:])]


class LocalBackend:
  """Runs `python -m hybrid_jax train ...` here, one child per slot."""

  name = 'local'

  def __init__(self, parallel: int = 1, gpus: list[str] | None = None):
    self.slots = parallel
    gpus = gpu_ids() if gpus is None else gpus
    self.envs = slot_envs(gpus, parallel)
    self.cores = slot_cores(cores.available(), gpus, parallel)
    self._children, self._lock, self._stopping = set(), threading.Lock(), False

  def where(self, slot: int) -> str:
    gpus = self.envs[slot].get('CUDA_VISIBLE_DEVICES')
    cores = self.cores[slot]
    return (f'{socket.gethostname()}' + (f' gpu {gpus}' if gpus else '') +
            (f' cpu {",".join(map(str, sorted(cores)))}' if cores else ''))

  def commands(self, member) -> list[str]:
    return [f'python -m hybrid_jax {member.command()}']

  def attempt(self, member, slot: int, log_path) -> outcome.Outcome:
    env = {**os.environ, **self.envs[slot]}
    with open(log_path, 'a') as log:
      log.write(f'--- {time.strftime("%Y-%m-%d %H:%M:%S")} {self.where(slot)}: {member.command()}\n')
      log.flush()
      with self._lock:
        if self._stopping:
          return outcome.Outcome('stopped', None, 'the sweep was stopped before this run started')
        child = subprocess.Popen([sys.executable, '-m', 'hybrid_jax', *member.train_args()], stdout=log,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                 preexec_fn=functools.partial(_start_child, self.cores[slot]))
        self._children.add(child)
      try:
        code = child.wait()
      finally:
        with self._lock:
          self._children.discard(child)
    return outcome.classify(code, log_path)

  def stop(self) -> None:
    """SIGTERM to every child (each checkpoints and exits); no new run starts."""
    with self._lock:
      self._stopping = True
      for child in self._children:
        child.send_signal(signal.SIGTERM)
