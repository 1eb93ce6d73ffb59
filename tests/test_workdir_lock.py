"""The workdir lease: who counts as alive, refusal naming the holder, takeover of dead or stale holders, renewal,
loss of the lease, and release; on a local path and with the object-store protocol."""

import errno
import json
import logging
import os
import socket
import subprocess
import sys

import pytest

from hybrid_jax.train import workdir_lock
from tests.conftest import ROOT


def _forge(workdir, **fields):
  """A lease as another trainer would have written it."""
  lease = {'state': 'held', 'host': 'other-host', 'pid': 4242, 'started_at': '2026-01-01 00:00:00 UTC',
           'heartbeat_at': 1000.0, 'timeout_s': 120.0, 'machine': 'other-host/boot/ns', 'pid_start': '',
           'token': 'theirs', **fields}
  (workdir / workdir_lock.LEASE_FILE).write_text(json.dumps(lease))
  return lease


def _finished_pid():
  proc = subprocess.Popen([sys.executable, '-c', 'pass'])
  proc.wait()
  return proc.pid


def test_holder_alive_by_process_on_its_machine_and_by_heartbeat_elsewhere():
  here = workdir_lock._machine()
  mine = {'machine': here, 'pid': os.getpid(), 'pid_start': workdir_lock._pid_start(os.getpid()),
          'heartbeat_at': 0.0, 'timeout_s': 120.0}
  assert workdir_lock.holder_alive(mine, 10_000.0, here)[0]  # Alive however old its heartbeat.
  gone = dict(mine, pid=_finished_pid())
  alive, why = workdir_lock.holder_alive(gone, 0.0, here)
  assert not alive and f'process {gone["pid"]} is gone' in why
  reused = dict(mine, pid_start='1')  # Our pid, but not the process that took the lease.
  assert not workdir_lock.holder_alive(reused, 0.0, here)[0]
  elsewhere = dict(mine, machine='other-host/boot/ns', heartbeat_at=1000.0)
  assert workdir_lock.holder_alive(elsewhere, 1000.0 + 119, here)[0]
  alive, why = workdir_lock.holder_alive(elsewhere, 1000.0 + 121, here)
  assert not alive and 'last renewed 121 s ago (stale after 120 s)' in why


def test_a_second_lock_is_refused_naming_the_holder_and_release_frees_it(tmp_path):
  first = workdir_lock.WorkdirLock(tmp_path).acquire()
  lease = workdir_lock.read_lease(tmp_path)
  assert lease['state'] == 'held' and lease['pid'] == os.getpid() and lease['host'] == socket.gethostname()
  with pytest.raises(workdir_lock.WorkdirBusy) as info:
    workdir_lock.WorkdirLock(tmp_path).acquire()
  message = str(info.value)
  assert '\n' not in message
  assert f'process {os.getpid()} on host {socket.gethostname()}, started {lease["started_at"]}' in message
  assert 'another --workdir' in message
  assert workdir_lock.read_lease(tmp_path)['token'] == first.token  # The refused one wrote nothing.
  first.release()
  assert workdir_lock.read_lease(tmp_path)['state'] == 'released'
  second = workdir_lock.WorkdirLock(tmp_path).acquire()
  assert second.taken_over is None  # A released lease is free, not taken over.
  second.release()


def test_a_dead_holder_on_this_host_is_taken_over_with_a_warning(tmp_path, caplog):
  pid = _finished_pid()
  _forge(tmp_path, machine=workdir_lock._machine(), host=socket.gethostname(), pid=pid, heartbeat_at=4e9)
  with caplog.at_level(logging.WARNING):
    lock = workdir_lock.WorkdirLock(tmp_path).acquire(renew_in_background=False)
  assert f'taking over {tmp_path}' in caplog.text and f'process {pid} is gone' in caplog.text
  assert lock.taken_over['pid'] == pid and workdir_lock.read_lease(tmp_path)['token'] == lock.token
  lock.release()


@pytest.mark.parametrize('local', [True, False], ids=['local', 'object_store'])
def test_a_holder_elsewhere_counts_as_alive_until_its_lease_goes_stale(tmp_path, local):
  _forge(tmp_path, heartbeat_at=1000.0)
  with pytest.raises(workdir_lock.WorkdirBusy, match='process 4242 on host other-host'):
    workdir_lock.WorkdirLock(tmp_path, local=local, clock=lambda: 1100.0).acquire(renew_in_background=False)
  lock = workdir_lock.WorkdirLock(tmp_path, local=local, clock=lambda: 1121.0).acquire(renew_in_background=False)
  assert lock.taken_over['token'] == 'theirs' and 'stale after 120 s' in lock.taken_over['why']
  assert workdir_lock.read_lease(tmp_path)['token'] == lock.token
  lock.release()


def test_a_lease_that_cannot_be_renewed_for_half_its_timeout_stops_the_holder(tmp_path, monkeypatch):
  """Renewals failing on a full disk are retried; once they have failed for half the timeout, check() stops the
  run with one line naming the lease file and the cause; one renewal that succeeds clears it."""
  now = [1000.0]
  lock = workdir_lock.WorkdirLock(tmp_path, timeout_s=60, clock=lambda: now[0]).acquire(renew_in_background=False)
  renew = lock.renew

  def full(*_):
    raise OSError(errno.ENOSPC, 'No space left on device')
  monkeypatch.setattr(lock, 'renew', full)
  lock.try_renew()
  now[0] = 1029.0
  lock.try_renew()
  lock.check()  # 29 s of failures: retried, not yet a stop.
  now[0] = 1030.0
  with pytest.raises(workdir_lock.WorkdirLost) as error:
    lock.check()
  message = str(error.value)
  assert str(tmp_path / 'lock.json') in message and 'No space left on device' in message and 'for 30 s' in message
  monkeypatch.setattr(lock, 'renew', renew)
  lock.try_renew()
  lock.check()  # Renewed again: the run goes on.
  lock.release()


@pytest.mark.parametrize('local', [True, False], ids=['local', 'object_store'])
def test_renewal_moves_the_heartbeat_and_a_lost_lease_stops_the_holder(tmp_path, local):
  now = [1000.0]
  lock = workdir_lock.WorkdirLock(tmp_path, local=local, clock=lambda: now[0]).acquire(renew_in_background=False)
  now[0] = 1050.0
  lock.renew()
  assert workdir_lock.read_lease(tmp_path)['heartbeat_at'] == 1050.0
  lock.check()  # Still ours.
  _forge(tmp_path, heartbeat_at=1200.0)  # Someone took it over (this holder's lease had gone stale).
  lock.renew()
  with pytest.raises(workdir_lock.WorkdirLost, match='taken over by process 4242 on host other-host'):
    lock.check()
  lock.release()
  assert workdir_lock.read_lease(tmp_path)['token'] == 'theirs'  # Their lease is left alone, still held.
  assert workdir_lock.read_lease(tmp_path)['state'] == 'held'


def test_object_store_protocol_loses_to_a_lease_written_at_the_same_moment(tmp_path, monkeypatch):
  lock = workdir_lock.WorkdirLock(tmp_path, local=False)
  real_write = workdir_lock._RemoteLeaseFile.write

  def write_then_overwritten(self, text):
    real_write(self, text)
    _forge(tmp_path, heartbeat_at=4e9)  # Another trainer's write lands right after ours.

  monkeypatch.setattr(workdir_lock._RemoteLeaseFile, 'write', write_then_overwritten)
  with pytest.raises(workdir_lock.WorkdirBusy, match='at the same moment'):
    lock.acquire(renew_in_background=False)


def test_a_malformed_held_lease_is_taken_over_not_a_crash(tmp_path, caplog):
  (tmp_path / workdir_lock.LEASE_FILE).write_text(json.dumps({'state': 'held', 'host': 'h'}))
  with caplog.at_level(logging.WARNING):
    lock = workdir_lock.WorkdirLock(tmp_path).acquire(renew_in_background=False)
  assert "lacks the holder's process or heartbeat" in caplog.text
  lock.release()


MOUNTS = """sysfs /sys sysfs rw 0 0
/dev/root / ext4 rw 0 0
/dev/sdb /mnt/bkt/local\\040disk ext4 rw 0 0
bkt /mnt/bkt fuse.gcsfuse rw,nosuid 0 0
"""


@pytest.mark.parametrize('path, kind', [('/home/u/runs/x', 'ext4'), ('/mnt/bkt', 'fuse.gcsfuse'),
                                        ('/mnt/bkt/run1/deeper', 'fuse.gcsfuse'), ('/mnt/bktx/run', 'ext4'),
                                        ('/mnt/bkt/local disk/run', 'ext4')])
def test_the_filesystem_of_a_path_is_its_longest_mount_point(path, kind):
  assert workdir_lock.filesystem_type(path, MOUNTS) == kind


def test_a_bucket_mounted_as_files_takes_the_object_store_protocol(tmp_path, monkeypatch):
  """flock on Cloud Storage FUSE is per host, so there the lease is written and read back."""
  monkeypatch.setattr(workdir_lock, 'filesystem_type', lambda path: 'fuse.gcsfuse')
  assert not workdir_lock.is_local(tmp_path)
  assert isinstance(workdir_lock.WorkdirLock(tmp_path)._file, workdir_lock._RemoteLeaseFile)
  monkeypatch.setattr(workdir_lock, 'filesystem_type', lambda path: 'ext4')
  assert workdir_lock.is_local(tmp_path) and not workdir_lock.is_local('gs://bkt/run')


_RELEASE_AFTER_READ_ONLY = '''
import json, os, pathlib, sys
from hybrid_jax.train import workdir_lock
workdir = pathlib.Path(sys.argv[1])
lock = workdir_lock.WorkdirLock(workdir).acquire(renew_in_background=False)
os.chmod(workdir / workdir_lock.LEASE_FILE, 0o444)  # The workdir turns read-only mid-run (chmod -R a-w).
os.chmod(workdir, 0o555)
lock.renew()
lock.release()
print(json.loads((workdir / workdir_lock.LEASE_FILE).read_text())['state'])
'''


def test_a_lease_is_released_after_the_workdir_turns_read_only(tmp_path):
  """The holder keeps its lease file open, so neither renewal nor release needs write permission any more. Root
  ignores file modes, so the check runs without the capability that lets it (where setpriv can drop it)."""
  drop = []
  if os.geteuid() == 0:
    if subprocess.run(['setpriv', '--version'], capture_output=True).returncode != 0:
      pytest.skip('running as root without setpriv: file modes cannot be made to apply')
    drop = ['setpriv', '--inh-caps=-dac_override,-dac_read_search', '--bounding-set=-dac_override,-dac_read_search']
  workdir = tmp_path / 'run'
  workdir.mkdir()
  try:
    out = subprocess.run([*drop, sys.executable, '-c', _RELEASE_AFTER_READ_ONLY, str(workdir)], capture_output=True,
                         text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
  finally:
    workdir.chmod(0o755)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == 'released', out.stdout
