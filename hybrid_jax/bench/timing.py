"""Device-synchronised timing shared by the benchmark programs."""

import statistics
import time
import traceback

import jax


def timed(fn, args, repeats, min_seconds=1.0):
  """(compile seconds, median milliseconds) of jit(fn) on args, after one warm-up call.

  Fast configurations run more than `repeats` times (until min_seconds) so the median is not one noisy sample.
  """
  start = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - start
  jax.block_until_ready(compiled(*args))
  times = []
  while len(times) < repeats or (sum(times) < min_seconds and len(times) < 1000):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
  return compile_s, 1e3 * statistics.median(times)


def failure(error: BaseException) -> dict:
  """A failed measurement as a row records it: the whole error (type and full message) and its traceback, so the
  JSON says why without a rerun; tables and logs show `headline` of it."""
  return {'error': f'{type(error).__name__}: {error}', 'traceback': ''.join(traceback.format_exception(error))}


def headline(error_text: str, width: int = 200) -> str:
  """The first line of a recorded error, cut to `width` characters, for one-line logs and table cells."""
  first = error_text.splitlines()[0] if error_text else ''
  return first if len(first) <= width else first[:width - 3] + '...'
