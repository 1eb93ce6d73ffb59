"""What an attempt's exit status means for the run, and the one line that says why it stopped."""

import dataclasses
import pathlib

USER_ERROR = 2  # hybrid_jax.commands.parsing.run: a UserError's `error: …` line.
STOPPED = (143, -15)  # SIGTERM: the trainer checkpointed and exited (or was killed by it).


@dataclasses.dataclass
class Outcome:
  state: str  # 'completed', 'failed' (user error), 'stopped' (preempted / SIGTERM), 'crashed'
  code: int | None
  cause: str = ''


def last_line(log_path, prefix: str = '') -> str:
  """The last line of the log that starts with `prefix` ('' if none); only the tail is read."""
  try:
    with open(log_path, 'rb') as f:
      f.seek(max(0, f.seek(0, 2) - (1 << 16)))
      lines = f.read().decode('utf-8', 'replace').splitlines()
  except OSError:
    return ''
  found = [line.strip() for line in lines if line.strip() and line.strip().startswith(prefix)]
  return found[-1] if found else ''


def classify(code: int, log_path: pathlib.Path) -> Outcome:
  if code == 0:
    return Outcome('completed', code)
  if code == USER_ERROR:  # A UserError's message may take several lines; its first says what.
    return Outcome('failed', code, last_line(log_path, 'error:').removeprefix('error:').strip() or
                   'exit status 2 (see sweep.log)')
  if code in STOPPED:
    return Outcome('stopped', code, 'stopped by SIGTERM (checkpointed)')
  return Outcome('crashed', code, f'exit status {code}: {last_line(log_path) or "no output"}')
