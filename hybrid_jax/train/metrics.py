"""Metrics to TensorBoard event files and a JSONL file in the workdir (one record per write)."""

import json
import math
import os
import pathlib
import time

import numpy as np
from tensorboardX import SummaryWriter

from hybrid_jax.data import jsonl
from hybrid_jax.parallel import chips


class MetricsWriter:
  """Appends to the run's metrics; a run resumed from step S first drops what was logged after S (the steps it will
  train again), so every step keeps one record: metrics.jsonl is rewritten, TensorBoard purges from S + 1."""

  def __init__(self, workdir, resumed_from: int = 0):
    self.workdir = pathlib.Path(workdir)
    self.jsonl_path = self.workdir / 'metrics.jsonl'
    _drop_after(self.jsonl_path, resumed_from)
    # The suffix keeps two sessions started in one second apart (the event file is named by the second), in order.
    self._tb = SummaryWriter(str(self.workdir / 'tensorboard'), purge_step=resumed_from + 1,
                             filename_suffix=f'.{time.time_ns()}')
    self._jsonl = open(self.jsonl_path, 'a')

  def write(self, step: int, metrics: dict, *, prefix: str) -> None:
    """Writes scalars as `prefix/name` to TensorBoard and as one JSON record {'step', 'kind', ...}."""
    scalars = {k: float(np.asarray(v)) for k, v in metrics.items() if np.ndim(v) == 0}
    for name, value in scalars.items():
      self._tb.add_scalar(f'{prefix}/{name}', value, step)
    record = {'step': int(step), 'kind': prefix, **scalars}
    record.update({k: v for k, v in metrics.items() if isinstance(v, (list, dict))})
    self._jsonl.write(json.dumps(record) + '\n')
    self._jsonl.flush()

  def close(self):
    self._tb.close()
    self._jsonl.close()


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
  for record in jsonl.read_records(path, {'kind': str, 'step': int}):
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
