"""Device-synchronised timing, per-measurement time limits and row-by-row reporting shared by the benchmarks."""

import contextlib
import datetime
import json
import signal
import statistics
import threading
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


def run_meta(args: dict) -> dict:
  """A benchmark run's header: when, jax, the backend and device, and its arguments."""
  device = jax.devices()[0]
  return dict(time=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'), jax=jax.__version__,
              backend=jax.default_backend(), device=getattr(device, 'device_kind', str(device)), args=args)


def row_line(head: str, row: dict) -> str:
  """One progress line of a timed row: its error's headline, or its times and compile times."""
  if 'error' in row:
    return f"{head}: {headline(row['error'])}"
  parts = [f'{k}={row[k]:.3f}' for k in ('fwd_ms', 'fwd_bwd_ms') if k in row]
  parts += [f'{k}={row[k]:.1f}' for k in ('fwd_compile_s', 'fwd_bwd_compile_s') if k in row]
  return f'{head}: ' + ', '.join(parts)


class MeasurementTimeout(TimeoutError):
  """A measurement ran past its time limit (`deadline`)."""


@contextlib.contextmanager
def deadline(seconds):
  """Raises MeasurementTimeout in the body once `seconds` have passed (None or <= 0: no limit).

  A POSIX interval timer interrupts Python code (the timing loops) at once and a long compile or device call as
  soon as it returns to Python, so one stuck measurement becomes an error row instead of ending the run. Only in
  the main thread (elsewhere the body runs unlimited).
  """
  if not seconds or seconds <= 0 or threading.current_thread() is not threading.main_thread():
    yield
    return

  def expire(signum, frame):
    del signum, frame
    raise MeasurementTimeout(f'timed out after {seconds:g} s')

  previous = signal.signal(signal.SIGALRM, expire)
  signal.setitimer(signal.ITIMER_REAL, seconds)
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def measured(row, timeout, fn):
  """Runs fn(row) (which fills timings into row) under `deadline(timeout)`; a failure or timeout is recorded in
  the row (`failure`) with the seconds it took. Returns the row."""
  start = time.perf_counter()
  try:
    with deadline(timeout):
      fn(row)
  except Exception as e:  # pylint: disable=broad-except  # One failing measurement must not end the run.
    row.update(failure(e))
    row['timed_out'] = isinstance(e, MeasurementTimeout)
  row['wall_s'] = round(time.perf_counter() - start, 3)
  return row


class Report:
  """Rows of a benchmark run, each printed and written to `path` (JSON: meta and every list of rows so far) the
  moment it is added, so a run cut short keeps every finished measurement."""

  def __init__(self, path, meta):
    self.path, self.out = path, dict(meta=meta)

  def rows(self, key='rows'):
    return self.out.setdefault(key, [])

  def add(self, row, line=None, key='rows'):
    """Appends and writes `row` under `key`; prints `line` (default: the row's JSON without its traceback)."""
    self.rows(key).append(row)
    print(line if line is not None else json.dumps({k: v for k, v in row.items() if k != 'traceback'},
                                                   default=str), flush=True)
    self.write()
    return row

  def write(self):
    if self.path:
      with open(self.path, 'w') as fh:
        json.dump(self.out, fh, indent=1, default=str)
