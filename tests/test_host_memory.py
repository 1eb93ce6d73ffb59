"""hybrid_jax.host_memory: a freed block of the size of a step's temporaries is reused, not faulted in again."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

# Allocates, fills and frees a 64 MiB block (above glibc's largest automatic mmap threshold, 32 MiB) as XLA's CPU
# runtime does with a step's temporaries, five times, and prints the page faults those five took.
# With 'thread', a thread of a process bound to one core does the same with a 100 MiB block (above the 64 MiB heaps
# of glibc's per-thread arenas), as an XLA worker thread can.
_CHILD = '''
import ctypes, os, resource, sys, threading
mode, where = sys.argv[1:]
if where == 'thread':
  os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
if mode == 'keep':
  from hybrid_jax import host_memory
  assert host_memory.keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = (100 if where == 'thread' else 64) << 20
def step():
  block = libc.malloc(size)
  ctypes.memset(block, 1, size)
  libc.free(block)
def steps():
  step()
  before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
  for _ in range(5):
    step()
  print(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
if where == 'thread':
  worker = threading.Thread(target=steps)
  worker.start()
  worker.join()
else:
  steps()
'''


def _faults(mode: str, where: str = 'main') -> int:
  out = subprocess.run([sys.executable, '-c', _CHILD, mode, where], capture_output=True, text=True, check=True,
                       cwd=ROOT)
  return int(out.stdout.strip())


def test_a_freed_step_sized_block_is_reused_instead_of_faulted_in_again():
  pages = 5 * (64 << 20) // 4096
  assert _faults('default') > pages // 2  # glibc's default: each block is a fresh mapping, every page faults.
  assert _faults('keep') < pages // 100  # Kept in the heap: the pages are already there.


@pytest.mark.skipif(not hasattr(os, 'sched_setaffinity'), reason='needs sched_setaffinity (Linux)')
def test_on_one_core_a_threads_step_sized_block_is_reused_too():
  pages = 5 * (100 << 20) // 4096
  assert _faults('default', 'thread') > pages // 2  # A per-thread arena maps a block over its heap size anew.
  assert _faults('keep', 'thread') < pages // 100  # One core: every thread allocates from the main heap.
