"""Exclusive use of a run directory by one trainer: a lease file, `<workdir>/lock.json`, renewed while training.

The lease names its holder (host, process id, start time) and when it was last renewed. A second trainer on the
same workdir stops with a line naming the holder. A holder that died is taken over with a warning: on the holder's
own host (same machine boot and process namespace) as soon as its process is gone; seen from anywhere else (a
shared filesystem, a mounted bucket) once its lease went unrenewed for longer than its timeout, since a process on another
machine cannot be asked whether it lives.

On a local path every read-modify-write of the lease happens under `flock`, so two trainers starting together
cannot both win. Object stores (and buckets mounted as files, whose flock is per host) have no such lock: there the winner is whoever's lease is read back after writing,
and a holder that finds someone else's lease at its next renewal stops before it writes another checkpoint.
"""

import contextlib
import datetime
import json
import logging
import os
import socket
import threading
import time
import uuid

from etils import epath

from hybrid_jax import readers
from hybrid_jax.errors import DataError, UserError

LEASE_FILE = 'lock.json'
TIMEOUT_S = 120.0  # A lease not renewed for this long is stale (holders on other hosts).
RENEW_EVERY_S = 20.0


class WorkdirBusy(UserError, RuntimeError):
  """Another live trainer holds the run directory."""


class WorkdirLost(UserError, RuntimeError):
  """This trainer's lease was taken over (it went unrenewed past its timeout); it must stop writing."""


def _read_proc(path: str) -> str:
  try:
    with open(path) as f:
      return f.read().strip()
  except OSError:
    return ''


def _machine() -> str:
  """Where a process id means something: host name, boot and process namespace (containers share a host name)."""
  try:
    namespace = str(os.stat('/proc/self/ns/pid').st_ino)
  except OSError:
    namespace = ''
  return f'{socket.gethostname()}/{_read_proc("/proc/sys/kernel/random/boot_id")}/{namespace}'


def _pid_start(pid: int) -> str:
  """The start time of process `pid` (clock ticks since boot; '' where /proc is absent): tells a reused pid apart."""
  stat = _read_proc(f'/proc/{pid}/stat')
  return stat.rpartition(')')[2].split()[19] if stat else ''


def pid_running(pid: int, start: str) -> bool:
  """Whether process `pid` on this machine is alive and still the process that started at `start`."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Alive, owned by another user.
    pass
  return not start or _pid_start(pid) in ('', start)


def holder_alive(lease: dict, now: float, machine: str, running=pid_running) -> tuple[bool, str]:
  """(alive, why) for the holder of `lease`, judged from a process on `machine` at time `now`."""
  if lease.get('machine') == machine:
    if running(int(lease['pid']), lease.get('pid_start', '')):
      return True, 'its process is running on this host'
    return False, f'its process {lease["pid"]} is gone'
  age = now - float(lease['heartbeat_at'])
  if age > float(lease['timeout_s']):
    return False, f'its lease was last renewed {age:.0f} s ago (stale after {float(lease["timeout_s"]):.0f} s)'
  return True, f'its lease was renewed {age:.0f} s ago'


def describe(lease: dict) -> str:
  return f'process {lease.get("pid", "?")} on host {lease.get("host", "?")}, started {lease.get("started_at", "?")}'


def _utc(t: float) -> str:
  return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')


# Filesystems that present an object store as files (Cloud Storage FUSE, s3fs): flock there is not shared
# between hosts, so leases on them use the object-store protocol (write, then read back).
OBJECT_STORE_FILESYSTEMS = ('fuse.gcsfuse', 'fuse.s3fs')


def filesystem_type(path, mounts: str | None = None) -> str:
  """The type of the filesystem holding `path` (its longest mount point in /proc/self/mounts), or ''."""
  if mounts is None:
    try:
      with open('/proc/self/mounts') as f:
        mounts = f.read()
    except OSError:  # Not Linux: no mount table to read.
      return ''
  target, best, kind = os.path.realpath(path), '', ''
  for line in mounts.splitlines():
    fields = line.split()
    if len(fields) < 3:
      continue
    point = fields[1].replace('\\040', ' ')
    inside = target == point or target.startswith(point.rstrip('/') + '/')
    if inside and len(point) >= len(best):
      best, kind = point, fields[2]
  return kind


def is_local(workdir) -> bool:
  """Whether flock on `workdir` excludes every other trainer: not a URL, nor an object store mounted as files."""
  return '://' not in str(workdir) and filesystem_type(workdir) not in OBJECT_STORE_FILESYSTEMS


class _LocalLeaseFile:
  """The lease on a local (or NFS) path: every read-modify-write under an exclusive flock of the file itself.

  The file stays open from the first use to close(): permissions are checked when a file is opened, so a holder
  whose workdir is made read-only mid-run can still renew and, above all, release its lease.
  """

  def __init__(self, path: epath.Path):
    self.path = path
    self._fd = None

  @contextlib.contextmanager
  def locked(self):
    import fcntl  # pylint: disable=g-import-not-at-top
    if self._fd is None:
      self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(self._fd, fcntl.LOCK_EX)
    try:
      yield _LocalIO(self._fd)
    finally:
      if self._fd is not None:  # (close() inside the block has dropped the flock with the file.)
        fcntl.flock(self._fd, fcntl.LOCK_UN)

  def close(self):
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None


class _LocalIO:

  def __init__(self, fd):
    self.fd = fd

  def read(self) -> str:
    os.lseek(self.fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(self.fd, 65536):
      chunks.append(chunk)
    return b''.join(chunks).decode()

  def write(self, text: str) -> None:
    os.lseek(self.fd, 0, os.SEEK_SET)
    os.ftruncate(self.fd, 0)
    os.write(self.fd, text.encode())
    os.fsync(self.fd)


class _RemoteLeaseFile:
  """The lease on an object store (gs://): plain whole-object reads and writes through etils epath."""

  def __init__(self, path: epath.Path):
    self.path = path

  @contextlib.contextmanager
  def locked(self):
    yield self

  def close(self):
    pass

  def read(self) -> str:
    return self.path.read_text() if self.path.exists() else ''

  def write(self, text: str) -> None:
    self.path.write_text(text)


def read_lease(workdir) -> dict | None:
  """The lease in `workdir` (held or released), or None if there is none or it is unreadable."""
  path = epath.Path(workdir) / LEASE_FILE
  try:
    return readers.read_json(path, 'lease') if path.exists() else None
  except DataError:
    return None


class WorkdirLock:
  """The lease of one trainer on one workdir: `acquire()` once, `check()` before writing, `release()` at the end."""

  def __init__(self, workdir, *, timeout_s: float = TIMEOUT_S, renew_every_s: float = RENEW_EVERY_S,
               local: bool | None = None, clock=time.time):
    self.workdir = epath.Path(workdir)
    self.timeout_s, self.renew_every_s, self.clock = timeout_s, renew_every_s, clock
    path = self.workdir / LEASE_FILE
    self._file = _LocalLeaseFile(path) if (is_local(workdir) if local is None else local) else _RemoteLeaseFile(path)
    self.machine = _machine()
    self.token = uuid.uuid4().hex
    self.taken_over = None  # The dead holder's lease, when this lock replaced one.
    self._lost = None
    self._failing = None  # (time of the first failed renewal in a row, its error) while renewals fail.
    self._stop = threading.Event()
    self._thread = None
    self._started = None

  def _lease(self, **extra) -> dict:
    return {'state': 'held', 'host': socket.gethostname(), 'pid': os.getpid(), 'started_at': _utc(self._started),
            'heartbeat_at': self.clock(), 'timeout_s': self.timeout_s, 'machine': self.machine,
            'pid_start': _pid_start(os.getpid()), 'token': self.token, **extra}

  @staticmethod
  def _parse(text: str) -> dict | None:
    try:
      return readers.parse_json(text, 'lease') if text.strip() else None
    except DataError:  # Cut short by a crash mid-write: nobody's lease.
      return None

  def acquire(self, *, renew_in_background: bool = True) -> 'WorkdirLock':
    """Takes the workdir, or raises WorkdirBusy naming its live holder; a dead holder is taken over (warned)."""
    self.workdir.mkdir(parents=True, exist_ok=True)
    self._started = self.clock()
    with self._file.locked() as io:
      current = self._parse(io.read())
      if current and current.get('state') == 'held':
        try:
          alive, why = holder_alive(current, self.clock(), self.machine)
        except (KeyError, TypeError, ValueError):  # Edited by hand or by another program.
          alive, why = False, 'its lease lacks the holder\'s process or heartbeat'
        if alive:
          self._file.close()  # Not this trainer's lease: nothing more to write through it.
          raise WorkdirBusy(self._busy_message(current, why))
        logging.warning('taking over %s from the trainer that held it (%s): %s', self.workdir, describe(current), why)
        self.taken_over = dict(current, why=why)
      io.write(json.dumps(self._lease(), indent=2) + '\n')
    if not isinstance(self._file, _LocalLeaseFile):  # No lock on an object store: the lease read back wins.
      winner = self._parse(self._file.read())
      if not winner or winner.get('token') != self.token:
        raise WorkdirBusy(self._busy_message(winner or {}, 'it wrote its lease at the same moment'))
    if renew_in_background:
      self._thread = threading.Thread(target=self._renew_loop, name='hybrid_jax-workdir-lease', daemon=True)
      self._thread.start()
    return self

  def _busy_message(self, holder: dict, why: str) -> str:
    who = describe(holder) if 'pid' in holder else 'another trainer'
    return (f'{self.workdir} is in use by another trainer: {who} ({why}); wait for it to finish or stop it, or '
            f'train into another --workdir (a holder that dies is taken over: at once on its own host, after '
            f'{float(holder.get("timeout_s", self.timeout_s)):.0f} s without renewal from elsewhere)')

  def renew(self) -> None:
    """Refreshes the lease's heartbeat; notes the loss (raised by check()) if another trainer holds it now."""
    with self._file.locked() as io:
      current = self._parse(io.read())
      if not current or current.get('token') != self.token:
        self._lost = current or {}
        return
      io.write(json.dumps(self._lease(), indent=2) + '\n')

  def _renew_loop(self):
    while not self._stop.wait(self.renew_every_s):
      self.try_renew()
      if self._lost is not None:
        return

  def try_renew(self) -> None:
    """renew(), noting a storage error instead of raising it: a transient one is retried at the next renewal (the
    timeout leaves room for several misses); check() stops the run once they have lasted half the timeout."""
    try:
      self.renew()
      self._failing = None
    except OSError as e:
      logging.warning('could not renew the lease on %s: %s', self.workdir, e)
      if self._failing is None:
        self._failing = (self.clock(), e)

  def check(self) -> None:
    """Raises WorkdirLost when another trainer has taken the workdir over, or when the lease has not been renewed
    for half its timeout because its file cannot be written (a full disk, a read-only mount): another trainer
    could take the run over soon, so this one stops before it writes more."""
    failing = self._failing
    if failing is not None and self.clock() - failing[0] >= self.timeout_s / 2:
      raise WorkdirLost(f'cannot renew the lease {self.workdir / LEASE_FILE} for {self.clock() - failing[0]:.0f} s: '
                        f'{failing[1]}; stopping before another trainer may take the run over (free space or fix '
                        'the directory, then run the same command to resume from the newest checkpoint)')
    if self._lost is not None:
      who = describe(self._lost) if 'pid' in self._lost else 'someone'
      raise WorkdirLost(f'{self.workdir} was taken over by {who}: this trainer\'s lease went unrenewed for over '
                        f'{self.timeout_s:.0f} s (was the process suspended?); stopping without writing more')

  def release(self) -> None:
    """Marks the lease released (kept as the record of the last holder) unless another trainer holds it now."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    try:
      with self._file.locked() as io:
        current = self._parse(io.read())
        if current and current.get('token') == self.token:
          io.write(json.dumps(dict(current, state='released', released_at=_utc(self.clock())), indent=2) + '\n')
    finally:
      self._file.close()
