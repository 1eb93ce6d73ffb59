#!/usr/bin/env python3
"""A stand-in for gcloud in the sweep tests: queued resources as files, ssh run locally, failures on a script.

FAKE_GCLOUD_DIR holds calls.log (one line per call), state/<name> (a queued resource's state) and script.json:
{"create": ["fail", ...], "run": ["preempt", ...]}, consumed in order ("ok" once a list is empty). A created
resource waits one look before it is ACTIVE. `ssh --command=...` of a run executes the command with bash in $HOME
(where the test links hybrid_jax to the checkout); "preempt" sends SIGTERM to the trainer once it has logged a
step, marks the resource SUSPENDED and exits 255, as ssh does when its machine goes away.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

HOME = pathlib.Path(os.environ['FAKE_GCLOUD_DIR'])


def next_outcome(kind):
  path = HOME / 'script.json'
  script = json.loads(path.read_text()) if path.exists() else {}
  todo = script.get(kind, [])
  outcome = todo.pop(0) if todo else 'ok'
  path.write_text(json.dumps(script))
  return outcome


def _logged_a_step(workdir: pathlib.Path) -> bool:
  """Whether the trainer has logged a training step (metrics.jsonl exists from the start, before any step)."""
  try:
    return '"kind": "train"' in (workdir / 'metrics.jsonl').read_text()
  except OSError:
    return False


def trainer_pid(pid):
  """The `hybrid_jax train` process below `pid`, or None."""
  try:
    children = pathlib.Path(f'/proc/{pid}/task/{pid}/children').read_text().split()
  except OSError:
    return None
  for child in map(int, children):
    try:
      if b'hybrid_jax\x00train' in pathlib.Path(f'/proc/{child}/cmdline').read_bytes():
        return child
    except OSError:
      continue
    found = trainer_pid(child)
    if found:
      return found
  return None


def main(argv):
  with open(HOME / 'calls.log', 'a') as log:
    log.write(' '.join(argv[1:]) + '\n')
  state = HOME / 'state'
  state.mkdir(exist_ok=True)
  verb, name = argv[4], argv[5]  # gcloud compute tpus GROUP VERB NAME ...
  if argv[3] == 'queued-resources' and verb == 'create':
    if next_outcome('create') == 'fail':
      print('ERROR: (gcloud) no capacity', file=sys.stderr)
      return 1
    (state / name).write_text('WAITING_FOR_RESOURCES')
    return 0
  if verb == 'describe':
    path = state / name
    current = path.read_text() if path.exists() else ''
    if current == 'WAITING_FOR_RESOURCES':
      path.write_text('ACTIVE')
    print(current or 'NOT_FOUND')
    return 0 if current else 1
  if verb == 'delete':
    (state / name).unlink(missing_ok=True)
    return 0
  if verb == 'ssh':
    command = next(a for a in argv if a.startswith('--command=')).removeprefix('--command=')
    if 'hybrid_jax train' not in command:
      return 0  # setup
    outcome = next_outcome('run')
    proc = subprocess.Popen(['bash', '-c', command], cwd=os.environ['HOME'])
    if outcome == 'preempt':
      workdir = pathlib.Path(command.split('--workdir=')[1].split()[0])
      while proc.poll() is None and not _logged_a_step(workdir):
        time.sleep(0.05)
      pid = trainer_pid(proc.pid)
      if pid:
        os.kill(pid, signal.SIGTERM)
      proc.wait()
      (state / name).write_text('SUSPENDED')
      return 255
    return proc.wait()
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
