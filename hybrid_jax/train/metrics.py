"""Metrics to TensorBoard event files and a JSONL file in the workdir (one record per write)."""

import json
import pathlib

import numpy as np
from tensorboardX import SummaryWriter


class MetricsWriter:

  def __init__(self, workdir):
    self.workdir = pathlib.Path(workdir)
    self.jsonl_path = self.workdir / 'metrics.jsonl'
    self._tb = SummaryWriter(str(self.workdir / 'tensorboard'))
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


def read_jsonl(path) -> list[dict]:
  """All records of a metrics.jsonl; for steps logged twice (a resumed run), the later record wins."""
  latest = {}
  for line in pathlib.Path(path).read_text().splitlines():
    if line.strip():
      record = json.loads(line)
      latest[(record['kind'], record['step'])] = record
  return sorted(latest.values(), key=lambda r: (r['kind'], r['step']))
