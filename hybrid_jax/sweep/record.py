"""What a run directory says about its run, read from the directory alone (so any machine that sees it can tell).

Training writes config.json, metrics.jsonl, report.json, checkpoints/ and its lease (lock.json); the sweep runner
adds `sweep.json` (the sweep's command for the run, where it runs, attempts, wall time, and a user error's one-line
cause) and `sweep.log` (the output of each attempt). States:
  pending    nothing trained yet
  running    a live trainer holds the lease
  completed  report.json says completed at the configured number of steps, or stopped early by a hook
  failed     the last attempt stopped on a user error (exit status 2); not retried with the same command
  crashed    the last attempt died otherwise (a bug, a lost machine); a rerun resumes it
  stopped    trained part-way (preempted, killed); a rerun resumes it
"""

import json
import os
import pathlib
import time

from hybrid_jax import readers
from hybrid_jax.errors import DataError
from hybrid_jax.train import workdir_lock

RECORD = 'sweep.json'
LOG = 'sweep.log'
_TAIL_BYTES = 1 << 16


def read(workdir) -> dict:
  """The runner's record of the run ({} if none or unreadable)."""
  try:
    return readers.read_json(pathlib.Path(workdir) / RECORD)
  except DataError:
    return {}


def update(workdir, **fields) -> dict:
  """Merges `fields` into the record (written whole through a rename: a reader never sees half of one)."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  record = {**read(workdir), **fields, 'updated_at': time.time()}
  partial = workdir / f'{RECORD}.{os.getpid()}.partial'
  partial.write_text(json.dumps(record, indent=2) + '\n')
  os.replace(partial, workdir / RECORD)
  return record


def _json(path: pathlib.Path) -> dict:
  """The JSON object of a file of the run; {} when it is missing or unreadable (the run is then described by the
  rest)."""
  try:
    return readers.read_json(path)
  except DataError:
    return {}


def last_train_record(workdir) -> dict:
  """The last whole `train` record of metrics.jsonl ({} if none); only the file's tail is read."""
  path = pathlib.Path(workdir) / 'metrics.jsonl'
  try:
    with open(path, 'rb') as f:
      f.seek(max(0, f.seek(0, os.SEEK_END) - _TAIL_BYTES))
      lines = f.read().decode('utf-8', 'replace').split('\n')[:-1]  # The last piece may be a line being written.
  except OSError:
    return {}
  for line in reversed(lines):
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      continue
    if isinstance(record, dict) and record.get('kind') == 'train':
      return record
  return {}


def configured_steps(workdir, record: dict) -> int | None:
  """train.steps of the run: the runner's record, else config.json with its resumes' changes."""
  if record.get('steps'):
    return int(record['steps'])
  config = _json(pathlib.Path(workdir) / 'config.json')
  steps = config.get('train', {}).get('steps')
  for session in _json(pathlib.Path(workdir) / 'config_history.json').get('sessions', []):
    steps = session.get('changes', {}).get('train.steps', {}).get('to', steps)
  return steps


def lease_alive(workdir) -> bool:
  lease = workdir_lock.read_lease(workdir)
  if not lease or lease.get('state') == 'released':
    return False
  alive, _ = workdir_lock.holder_alive(lease, time.time(), workdir_lock._machine())  # pylint: disable=protected-access
  return alive


def has_checkpoints(workdir) -> bool:
  root = pathlib.Path(workdir) / 'checkpoints'
  return root.is_dir() and any(p.name.isdigit() for p in root.iterdir())


def describe(workdir, steps: int | None = None) -> dict:
  """One status row: run, state, step, steps, loss, wall_s, where, cause. `steps`: the configured steps when the
  caller knows them (a sweep whose overrides changed train.steps)."""
  workdir = pathlib.Path(workdir)
  record = read(workdir)
  report = _json(workdir / 'report.json')
  last = last_train_record(workdir)
  steps = steps or configured_steps(workdir, record)
  step = last.get('step', report.get('steps', 0))
  running = lease_alive(workdir)
  if running:
    state = 'running'
  elif report.get('status') == 'completed' and (report.get('steps') == steps or report.get('stopped_early')):
    state, step = 'completed', report['steps']
  elif record.get('state') in ('failed', 'crashed'):
    state = record['state']
  elif step or has_checkpoints(workdir) or record.get('attempts'):
    state = 'stopped'
  else:
    state = 'pending'
  wall = record.get('wall_s')
  if wall is None and report.get('wall_time_s') is not None:
    wall = report['wall_time_s']  # A run trained by `train` itself: its last session's time.
  if running and record.get('started_at'):
    wall = (wall or 0) + time.time() - record['started_at']
  loss = last.get('loss', report.get('final_train_loss'))
  return {'run': workdir.name, 'state': state, 'step': step, 'steps': steps, 'loss': loss, 'wall_s': wall,
          'where': record.get('where', ''), 'cause': record.get('cause', '') if state in ('failed', 'crashed') else ''}
