"""One training session's use of its run directory: hold it, check the config against the run's, record the session.

Opened before anything is restored, so a second trainer or a config that would turn the run into another one
stops before it touches a checkpoint. In a multi-process run process 0 holds the lease and decides for every
process (they all stop with its message). Read-only commands (eval, analyze, collect) never open a session.
"""

import contextlib
import itertools
import logging
import os
import socket

import jax

from hybrid_jax import readers

from hybrid_jax.errors import DataError
from hybrid_jax.parallel import distributed
from hybrid_jax.train import config_history, runs, workdir_lock

# What stops a session for the sake of its workdir's record (one line for the user, exit status 2): another
# trainer holds it, the config would change the run, or (while training) another trainer took it over.
REFUSALS = (workdir_lock.WorkdirBusy, config_history.ConfigChangeRefused, workdir_lock.WorkdirLost)


# What may be in a run directory before its first session writes config.json: the lease, and the sweep runner's
# record and log of the run (hybrid_jax.sweep.record), with the temporary files they are written through. Anything
# else there belongs to someone else: a fresh run refuses the directory rather than write beside it.
BEFORE_THE_RUN = (workdir_lock.LEASE_FILE, 'sweep.json', 'sweep.log')

_OPENED = itertools.count()  # Sessions opened by this process: each decision has its own key in multi-process runs.


class Session:
  """The session of this process; only process 0 holds the lease and writes config.json / config_history.json."""

  def __init__(self, config, workdir):
    self.config, self.workdir = config, workdir
    self.lead = jax.process_index() == 0
    self.lock = None
    self.allowed = {}  # Config changes from the run's latest config: {key: (old, new)}.
    self.sessions = []  # The run's sessions, this one last, once start() has run.

  def claim(self) -> None:
    """Takes the workdir and checks the config against the run's (process 0); a config.json this project did not
    write is refused, never overwritten."""
    self.lock = workdir_lock.WorkdirLock(self.workdir).acquire()
    try:
      _check_config_file(self.lock.workdir / 'config.json')
      has_checkpoints = bool(runs.checkpoint_steps(self.workdir))
      if not has_checkpoints and not (self.lock.workdir / 'config.json').exists():
        _check_fresh_workdir(self.lock.workdir)
      if has_checkpoints and (self.lock.workdir / 'config.json').exists():
        run = config_history.flatten(runs.load_config(self.workdir))  # Its latest config, changes applied.
        self.allowed = config_history.check_resume(self.workdir, run, config_history.flatten(self.config))
    except BaseException:
      self.release()
      raise

  def start(self, resumed_from: int) -> None:
    """Records this session (process 0): config.json for a fresh run, an entry in the config history for all."""
    if not self.lead:
      return
    fresh = resumed_from == 0
    config_json = self.lock.workdir / 'config.json'
    if not fresh and not config_json.exists():
      logging.warning('%s has checkpoints but no config.json: writing this session\'s config; the config of the '
                      'steps before %d is unknown', self.workdir, resumed_from + 1)
    if fresh or not config_json.exists():
      config_json.write_text(self.config.to_json_best_effort(indent=2) + '\n')
    about = {'host': socket.gethostname(), 'pid': os.getpid(), 'processes': jax.process_count()}
    if self.lock.taken_over:
      about['took_over_from'] = f'{workdir_lock.describe(self.lock.taken_over)}: {self.lock.taken_over["why"]}'
    earlier = [] if fresh else config_history.read_sessions(self.workdir)
    entry = config_history.session_entry(resumed_from + 1, None if fresh else resumed_from,
                                         {} if fresh else self.allowed, **about)
    self.sessions = earlier + [entry]
    config_history.write_sessions(self.workdir, self.sessions)
    if not fresh:
      config_history.log_changes(self.workdir, self.allowed, resumed_from + 1)

  def check(self) -> None:
    """Raises WorkdirLost if another trainer took the workdir over (call before writing a checkpoint)."""
    if self.lock is not None:
      self.lock.check()

  def release(self) -> None:
    if self.lock is not None:
      try:
        self.lock.release()
      except OSError as e:  # The lease then goes stale and is taken over; nothing of the run is lost.
        logging.warning('could not release the lease on %s: %s', self.workdir, e)
      self.lock = None


@contextlib.contextmanager
def open_session(config, workdir):
  """The session of a training run in `workdir`; raises one of REFUSALS (on every process) if it may not train."""
  session = Session(config, workdir)
  distributed.lead_decides(f'workdir_session/{next(_OPENED)}', session.claim, REFUSALS,
                           config.parallel.distributed.barrier_timeout_s)
  try:
    yield session
  finally:
    session.release()


def _check_config_file(path) -> None:
  """RunError unless `path` is absent or a run config (a JSON object with model, data and train sections): a fresh
  run writes config.json, so a file of another kind there would be lost."""
  if not path.exists():
    return
  try:
    readers.read_json(path, 'run config', required=runs.RUN_CONFIG_SECTIONS)
  except DataError as e:
    raise runs.RunError(f'{e}; not a run config: move it away or choose another --workdir, training would write its '
                        'own config.json there') from None


def _check_fresh_workdir(workdir) -> None:
  """RunError naming what is there when a directory without a run holds files this project did not put there:
  a new run would write its config, metrics, report and checkpoints beside (or over) them."""
  foreign = sorted(entry.name for entry in workdir.iterdir()
                   if entry.name not in BEFORE_THE_RUN and not entry.name.endswith('.partial'))
  if foreign:
    shown = ', '.join(repr(name) for name in foreign[:3]) + (f' and {len(foreign) - 3} more' if len(foreign) > 3 else '')
    raise runs.RunError(f'--workdir {workdir} holds files that are not a run of this project ({shown}): a new run '
                        'would write its config.json, metrics, report and checkpoints among them; choose a new or '
                        'empty directory (or move those files away)')
