"""Where analysis results go (`<workdir>/analysis/`) and how they are written (JSON, PNG through matplotlib's
object API: no pyplot, so no global backend state)."""

import json
import math
import pathlib

import numpy as np


def output_dir(workdir, out=None) -> pathlib.Path:
  """`out` if given, else `<workdir>/analysis`; created if missing."""
  path = pathlib.Path(out) if out else pathlib.Path(workdir) / 'analysis'
  path.mkdir(parents=True, exist_ok=True)
  return path


def _plain(value):
  """JSON-safe: numpy to Python, non-finite floats to None."""
  if isinstance(value, dict):
    return {str(k): _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  if isinstance(value, np.ndarray):
    return _plain(value.tolist())
  if isinstance(value, np.generic):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, pathlib.Path):
    return str(value)
  return value


def write_json(path, data) -> pathlib.Path:
  path = pathlib.Path(path)
  path.write_text(json.dumps(_plain(data), indent=2) + '\n')
  return path


def figure(width: float, height: float):
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top  (no pyplot: no global backend)
  return Figure(figsize=(width, height))


def save(fig, path) -> pathlib.Path:
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  return pathlib.Path(path)
