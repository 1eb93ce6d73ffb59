"""Metrics to TensorBoard event files and a JSONL file in the workdir (one record per write).

Both are written on the caller's thread, synchronously: a write that fails (disk full, a directory made read-only,
a lost mount) raises StorageError at the step that logged it, naming the file and the cause. TensorBoard's own
writer thread would die on such an error and leave the next write blocked forever on its full queue, a run that
hangs without using a CPU; here nothing waits on another thread. The events are tensorboardX's records, flushed at
every write (a few scalars every train.log_every steps).
"""

import contextlib
import json
import math
import os
import pathlib
import time

import numpy as np
from tensorboardX import summary as tb_summary
from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto.event_pb2 import Event, SessionLog

from hybrid_jax import readers
from hybrid_jax.errors import UserError
from hybrid_jax.parallel import chips


class StorageError(UserError):
  """A file of the run could not be written: the message names it and the cause (e.g. no space left on device)."""


@contextlib.contextmanager
def storage(path, what: str):
  """Turns an OSError while writing `path` into a StorageError naming `what`, the path and the cause."""
  try:
    yield
  except OSError as e:
    cause = e.strerror or str(e)
    raise StorageError(f'cannot write {what} to {path}: {cause}') from e


class MetricsWriter:
  """Appends to the run's metrics; a run resumed from step S first drops what was logged after S (the steps it will
  train again), so every step keeps one record: metrics.jsonl is rewritten, TensorBoard purges from S + 1."""

  def __init__(self, workdir, resumed_from: int = 0):
    self.workdir = pathlib.Path(workdir)
    self.jsonl_path = self.workdir / 'metrics.jsonl'
    self.tensorboard_dir = self.workdir / 'tensorboard'
    self._failed = False
    with storage(self.jsonl_path, 'the metrics'):
      _drop_after(self.jsonl_path, resumed_from)
      self._jsonl = open(self.jsonl_path, 'a')
    with storage(self.tensorboard_dir, 'the TensorBoard events'):
      self.tensorboard_dir.mkdir(parents=True, exist_ok=True)
      # The suffix keeps two sessions started in one second apart (the file is named by the second), in order.
      self._events = EventsWriter(str(self.tensorboard_dir / 'events'), f'.{time.time_ns()}')
      # A session that starts at step S hides what an earlier one logged from S on (TensorBoard's purge).
      self._events.write_event(Event(step=resumed_from + 1, file_version='brain.Event:2'))
      self._events.write_event(Event(step=resumed_from + 1, session_log=SessionLog(status=SessionLog.START)))
      self._events.flush()

  def write(self, step: int, metrics: dict, *, prefix: str) -> None:
    """Writes scalars as `prefix/name` to TensorBoard and as one JSON record {'step', 'kind', ...}."""
    scalars = {k: float(np.asarray(v)) for k, v in metrics.items() if np.ndim(v) == 0}
    record = {'step': int(step), 'kind': prefix, **scalars}
    record.update({k: v for k, v in metrics.items() if isinstance(v, (list, dict))})
    try:
      with storage(self.jsonl_path, 'the metrics'):
        self._jsonl.write(json.dumps(record) + '\n')
        self._jsonl.flush()
      with storage(self.tensorboard_dir, 'the TensorBoard events'):
        now = time.time()
        for name, value in scalars.items():
          self._events.write_event(Event(wall_time=now, step=int(step),
                                         summary=tb_summary.scalar(f'{prefix}/{name}', value)))
        self._events.flush()
    except StorageError:
      self._failed = True
      raise

  def close(self):
    """Closes both files; after a failed write, closing keeps quiet (the write already said what failed)."""
    for close in (self._events.close, self._jsonl.close):
      try:
        close()
      except OSError:
        if not self._failed:
          raise


def _drop_after(path: pathlib.Path, step: int) -> None:
  """Rewrites the JSONL file at `path` without its records of steps after `step` (atomically; kept if none)."""
  if not path.exists():
    return
  lines = path.read_text().splitlines(keepends=True)
  kept = [line for line in lines if _step_of(line) <= step]
  if len(kept) == len(lines):
    return
  partial = path.with_name(path.name + '.partial')
  partial.write_text(''.join(kept))
  os.replace(partial, path)


def _step_of(line: str) -> float:
  """A record's step; a line that does not parse (cut short by a kill) counts as after every step."""
  try:
    return int(json.loads(line)['step'])
  except (ValueError, KeyError, TypeError):
    return math.inf


def read_jsonl(path) -> list[dict]:
  """All records of a metrics.jsonl; for steps logged twice (a resumed run), the later record wins."""
  latest = {}
  for record in readers.read_jsonl(path, required={'kind': str, 'step': int}):
    latest[(record['kind'], record['step'])] = record
  return sorted(latest.values(), key=lambda r: (r['kind'], r['step']))


def peak_tflops(device_kind: str, override: float = 0.0) -> float | None:
  """Peak bf16 TFLOP/s of one device: `override` when > 0 (train.peak_tflops), else the chip table
  (hybrid_jax.parallel.chips); None if unknown (e.g. CPU), in which case MFU is not reported."""
  if override and override > 0:
    return float(override)
  spec = chips.chip(device_kind)
  return spec.peak_bf16_tflops if spec else None


def throughput(flops_per_step: float, step_time_s: float, num_devices: int, peak: float | None) -> dict:
  """Model TFLOP/s per device and, when the peak is known, MFU (model FLOPs utilisation, a fraction)."""
  tflops = flops_per_step / step_time_s / num_devices / 1e12
  out = {'tflops_per_device': tflops}
  if peak:
    out['mfu'] = tflops / peak
  return out
