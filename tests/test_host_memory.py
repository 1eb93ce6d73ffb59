"""hybrid_jax.host_memory: a freed block of the size of a step's temporaries is reused, not faulted in again."""

import subprocess
import sys

from tests.conftest import ROOT

# Allocates, fills and frees a 64 MiB block (above glibc's largest automatic mmap threshold, 32 MiB) as XLA's CPU
# runtime does with a step's temporaries, five times, and prints the page faults those five took.
_CHILD = '''
import ctypes, resource, sys
if sys.argv[1] == 'keep':
  from hybrid_jax import host_memory
  assert host_memory.keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 64 << 20
def step():
  block = libc.malloc(size)
  ctypes.memset(block, 1, size)
  libc.free(block)
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
  step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
'''


def _faults(mode: str) -> int:
  out = subprocess.run([sys.executable, '-c', _CHILD, mode], capture_output=True, text=True, check=True, cwd=ROOT)
  return int(out.stdout.strip())


def test_a_freed_step_sized_block_is_reused_instead_of_faulted_in_again():
  pages = 5 * (64 << 20) // 4096
  assert _faults('default') > pages // 2  # glibc's default: each block is a fresh mapping, every page faults.
  assert _faults('keep') < pages // 100  # Kept in the heap: the pages are already there.
