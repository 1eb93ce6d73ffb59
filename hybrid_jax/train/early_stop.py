"""The record of a run that a hook stopped before train.steps: `stopped_early.json` in the run directory.

Process 0 writes it before the checkpoint of the step it stopped at, so the record applies exactly when that
checkpoint is the one a later session resumes from (an unwritten checkpoint leaves an earlier one, and the run
trains on to the stop again). A resume from it with the same cap (train.steps) or a lower one finds the run
finished and trains nothing; a raised cap trains on, with the hooks' rules deciding afresh.
"""

import json
import logging
import os
import pathlib

from hybrid_jax import readers
from hybrid_jax.errors import DataError
from hybrid_jax.train import hooks, metrics

FILE = 'stopped_early.json'


def record(workdir, step: int, reason: str, cap: int) -> None:
  """Notes that the run stopped at `step` for `reason` while train.steps was `cap` (written whole, via a rename)."""
  path = pathlib.Path(workdir) / FILE
  partial = path.with_name(path.name + '.partial')
  with metrics.storage(path, 'the early-stop record'):
    partial.write_text(json.dumps({'step': int(step), 'reason': reason, 'train_steps': int(cap)}) + '\n')
    os.replace(partial, path)


def finished_at(workdir, start: int, cap: int) -> hooks.Stop | None:
  """The stop a session resuming from step `start` under train.steps=`cap` is bound by, or None: the run stopped
  early at `start` under a cap at least as large."""
  path = pathlib.Path(workdir) / FILE
  if not path.exists():
    return None
  try:
    saved = readers.read_json(path, 'early-stop record', required=('step', 'reason', 'train_steps'))
  except DataError as e:
    logging.warning('%s; the run trains on, and its hooks decide again whether to stop', e)
    return None
  if saved['step'] == start and cap <= saved['train_steps']:
    return hooks.Stop(str(saved['reason']))
  return None
