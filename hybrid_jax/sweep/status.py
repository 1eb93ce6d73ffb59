"""`sweep status --root DIR`: one row per run directory under DIR, from the directories alone (hybrid_jax.sweep.record)."""

import pathlib

from hybrid_jax.sweep import record

COLUMNS = ('run', 'state', 'step', 'loss', 'wall', 'where', 'cause')


def run_dirs(root) -> list[pathlib.Path]:
  """The run directories under `root`: those the runner recorded or training wrote (sweep.json or config.json)."""
  root = pathlib.Path(root)
  return sorted(p for p in root.iterdir() if p.is_dir() and ((p / record.RECORD).exists() or
                                                             (p / 'config.json').exists()))


def _wall(seconds) -> str:
  if seconds is None:
    return '-'
  seconds = int(seconds)
  return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'


def cells(row: dict) -> list[str]:
  step = f"{row['step'] or 0}/{row['steps'] if row['steps'] is not None else '?'}"
  loss = '-' if row['loss'] is None else f"{row['loss']:.4f}"
  return [row['run'], row['state'], step, loss, _wall(row['wall_s']), row['where'] or '-', row['cause']]


def table(rows: list[dict]) -> str:
  """A plain aligned table; a failed run's one-line cause ends its row, whole."""
  lines = [list(COLUMNS)] + [cells(r) for r in rows]
  widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS) - 1)]
  out = ['  '.join([c.ljust(w) for c, w in zip(line, widths)] + [line[-1]]).rstrip() for line in lines]
  counts = {}
  for r in rows:
    counts[r['state']] = counts.get(r['state'], 0) + 1
  out.append(f'{len(rows)} runs: ' + ', '.join(f'{n} {s}' for s, n in sorted(counts.items())))
  return '\n'.join(out)


def main(root) -> int:
  rows = [record.describe(p) for p in run_dirs(root)]
  print(table(rows))
  return 0
