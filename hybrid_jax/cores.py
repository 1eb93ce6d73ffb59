"""The CPU cores this process may run on: its affinity where the OS has one (Linux), else every core.

Several parts size themselves to it: the local sweep backend splits the cores between its runs, and a process
bound to a single core reads input in its own thread (hybrid_jax.data.pipeline) and keeps one heap
(hybrid_jax.host_memory).
"""

import os


def available() -> set[int]:
  if hasattr(os, 'sched_getaffinity'):
    return os.sched_getaffinity(0)
  return set(range(os.cpu_count() or 1))


def count() -> int:
  return len(available())
