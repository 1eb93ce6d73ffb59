"""Which runs of a sweep to start, on which backend slot, and what became of each.

A run is decided from its directory (hybrid_jax.sweep.record): completed at its configured steps, skipped; held
by a live trainer, left alone; failed on a user error with the same command, reported with its cause and not
retried (a changed command, or --retry-failed, tries again); one whose directory holds another config that the
overrides would change where `train` refuses a change, refused the same way; anything else started, which resumes
it from its newest checkpoint. Each slot of the backend runs one run at a time.
"""

import queue
import signal
import threading
import time

from hybrid_jax.train import runs as runs_lib
from hybrid_jax.sweep import outcome as outcome_lib, record
from hybrid_jax.train import config_history


def refusal(member) -> str:
  """Why `train` would refuse this run's config on its run directory ('' when it would not), in one line."""
  if not (record.has_checkpoints(member.workdir) and (member.workdir / 'config.json').exists()):
    return ''
  try:
    run = config_history.flatten(runs_lib.load_config(member.workdir))
    config_history.check_resume(member.workdir, run, config_history.flatten(member.config))
  except config_history.ConfigChangeRefused as e:
    return 'the overrides change keys that define the run: ' + '; '.join(str(e).splitlines()[1:])
  except runs_lib.RunError as e:
    return str(e).splitlines()[0]
  return ''


def decide(member, retry_failed: bool) -> tuple[str, str]:
  """('run' | 'skip' | 'refuse', why) for one run."""
  row = record.describe(member.workdir, member.config.train.steps)
  if row['state'] == 'running':
    return 'skip', f"running elsewhere ({row['where'] or 'a live trainer holds its lease'})"
  why = refusal(member)
  if why:
    return 'refuse', why
  if row['state'] == 'completed':
    return 'skip', f"completed at step {row['step']}"
  previous = record.read(member.workdir)
  if row['state'] == 'failed' and previous.get('command') == member.command() and not retry_failed:
    return 'skip', f"failed before, not retried: {row['cause']}"
  return 'run', (f"resumes from step {row['step']}" if row['step'] else 'starts')


def _loss(row) -> str:
  return '' if row['loss'] is None else f", loss {row['loss']:.4f}"


class Runner:
  """Runs `members` on `backend`; `say` prints one progress line (from any slot's thread)."""

  def __init__(self, members, backend, *, sweep: str, retry_failed=False, sink=None, say=print):
    self.members, self.backend, self.sweep = members, backend, sweep
    self.retry_failed, self.sink = retry_failed, sink
    self._say, self._lock = say, threading.Lock()
    self.results = {}  # name -> final state ('completed', 'failed', 'crashed', 'stopped', 'skipped:<state>')
    self.unlogged = {}  # name -> why the sink could not log it (the run itself is unaffected)
    self._stop = threading.Event()

  def say(self, line: str) -> None:
    with self._lock:
      self._say(line)

  def _label(self, i, member) -> str:
    return f'[{i + 1}/{len(self.members)}] {member.name}'

  def _attempt(self, i, member, slot) -> None:
    where = self.backend.where(slot)
    start = time.time()
    before = record.read(member.workdir)
    record.update(member.workdir, state='running', where=where, started_at=start, cause='',
                  attempts=before.get('attempts', 0) + 1, command=member.command())
    result = self.backend.attempt(member, slot, member.workdir / record.LOG)
    now = time.time()
    record.update(member.workdir, state=result.state, cause=result.cause, exit_status=result.code,
                  started_at=None, wall_s=before.get('wall_s', 0.0) + now - start,
                  where=getattr(result, 'where', None) or where)
    row = record.describe(member.workdir, member.config.train.steps)
    self.results[member.name] = result.state
    detail = f": {result.cause}" if result.state in ('failed', 'crashed') else ''
    self.say(f"{self._label(i, member)}: {result.state} at step {row['step']}/{row['steps']}{_loss(row)}, "
             f"{now - start:.0f} s{detail}")
    if self.sink is not None:
      try:
        self.sink.sync(member, self.sweep)
      except Exception as e:  # pylint: disable=broad-except  # Tracking must not end the slot, nor pass unseen.
        self.unlogged[member.name] = f'{type(e).__name__}: {e}'
        self.say(f'{self._label(i, member)}: not logged by the experiment tracker: {self.unlogged[member.name]}')

  def _slot(self, slot, work: queue.Queue) -> None:
    while not self._stop.is_set():
      try:
        i, member, why = work.get_nowait()
      except queue.Empty:
        return
      self.say(f'{self._label(i, member)}: {why} on {self.backend.where(slot)}')
      try:
        self._attempt(i, member, slot)
      except Exception as e:  # pylint: disable=broad-except  # A backend fault: this run crashed, the slot goes on.
        self.results[member.name] = 'crashed'
        self.say(f'{self._label(i, member)}: crashed in the sweep runner: {type(e).__name__}: {e}')

  def stop(self, signum=None, frame=None) -> None:
    del frame
    if signum is not None:
      self.say(f'signal {signum}: stopping every run (each checkpoints); rerun the same command to resume')
    self._stop.set()
    self.backend.stop()

  def run(self) -> int:
    """Runs the sweep; the exit status: 0 when every run completed, 2 when a run failed on a user error or was
    refused, 1 when one crashed or the experiment tracker could not log one, 143 when runs were stopped."""
    work = queue.Queue()
    for i, member in enumerate(self.members):
      record.update(member.workdir, sweep=self.sweep, name=member.name, tags=member.tags,
                    steps=member.config.train.steps)
      action, why = decide(member, self.retry_failed)
      if action == 'run':
        work.put((i, member, why))
        continue
      if action == 'refuse':
        self.results[member.name] = 'failed'
        why = f'refused: {why}'
      else:
        self.results[member.name] = 'skipped:' + why.split()[0]
      self.say(f'{self._label(i, member)}: {why}')
    threads = [threading.Thread(target=self._slot, args=(s, work), daemon=True) for s in range(self.backend.slots)]
    previous = {s: signal.signal(s, self.stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
      for t in threads:
        t.start()
      while any(t.is_alive() for t in threads):  # Joined in steps, so the signal handler runs.
        for t in threads:
          t.join(timeout=0.5)
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)
    if not self._stop.is_set() and hasattr(self.backend, 'release'):
      self.backend.release()  # E.g. the TPU slices, once no run is left for them.
    return self._summary()

  def _summary(self) -> int:
    states = list(self.results.values())
    done = sum(s in ('completed', 'skipped:completed') for s in states)
    counts = {}
    for s in states:
      counts[s] = counts.get(s, 0) + 1
    self.say(f'sweep {self.sweep}: {done}/{len(self.members)} completed (' +
             ', '.join(f'{n} {s}' for s, n in sorted(counts.items())) + ')' +
             (f'; {len(self.unlogged)} not logged by the experiment tracker' if self.unlogged else ''))
    if any(s == 'failed' or s == 'skipped:failed' for s in states):
      return outcome_lib.USER_ERROR
    if 'crashed' in states or self.unlogged:
      return 1
    if self._stop.is_set() or 'stopped' in states or len(states) < len(self.members):
      return 143
    return 0
