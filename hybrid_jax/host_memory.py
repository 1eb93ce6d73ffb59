"""Host memory: freed blocks stay in the process heap for the next step instead of going back to the kernel.

XLA's CPU runtime allocates an executable's temporary buffers on every call and frees them when it returns. glibc
serves each block above its mmap threshold (128 KiB, raised on its own to at most 32 MiB) with a fresh mapping and
unmaps it when freed, so every training step on a CPU faults all its temporaries in again, page by page, and the
kernel zeroes each page. On the mini-study's model that was a fifth of the step (docs/notebook/mini_study.md,
"CPU: the mini-study's step on a CPU"). With the thresholds raised, blocks come from the heap and are reused; a
process keeps up to TRIM_THRESHOLD of freed memory at the top of its heap.

That holds for the main heap only. A thread allocating in one of glibc's per-thread arenas gets a block above the
arena heap size (64 MiB) as a fresh mapping whatever the thresholds, and XLA runs a step on whichever thread it
picks, so a trainer could switch, mid-run, to faulting in every step's temporaries (a mini-study run went from 85
to 150 ms a step). A process bound to one core therefore allocates from the main heap alone (M_ARENA_MAX 1): its
threads never run at once, so they lose nothing by sharing one arena. Results do not change: only where buffers
live does.
"""

import ctypes
import logging

from hybrid_jax import cores

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD = 1 << 30  # Blocks of at least 1 GiB are still mapped on their own (and unmapped when freed).
TRIM_THRESHOLD = 1 << 30

log = logging.getLogger(__name__)


def keep_freed_memory() -> bool:
  """Raises glibc's mmap and trim thresholds for this process (later allocations) and, in a process bound to one
  core, keeps every thread on the main heap; call it before threads start. False where the C library has no mallopt
  (not glibc) or refuses the values."""
  try:
    mallopt = ctypes.CDLL(None).mallopt
  except (OSError, AttributeError):
    return False
  mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
  done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
  if done and cores.count() == 1:
    done = bool(mallopt(_M_ARENA_MAX, 1))
  if not done:
    log.info('mallopt refused the heap settings; freed host buffers go back to the kernel')
  return done
