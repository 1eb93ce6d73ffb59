"""A run directory is one run's record, through `python -m hybrid_jax train`: a second trainer is refused while the
first runs, a resume that changes the model is refused before restoring, and one that changes the learning rate
is recorded with its step (config history, report, collect). With two processes (the local launcher's
environment): process 0 alone takes over a dead holder's workdir and judges the config; both stop alike."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from hybrid_jax.train import runs
from hybrid_jax.study import collect
from hybrid_jax import standard_hooks
from hybrid_jax.train import config_history, optim, session as session_lib, workdir_lock
from tests.conftest import ROOT, small_config, train_command, wait_for

ENV = dict(os.environ, JAX_PLATFORMS='cpu')


def _train(workdir, *overrides):
  return subprocess.run(train_command(workdir, *overrides), env=ENV, capture_output=True, text=True, cwd=ROOT, timeout=600)


def _errors(stderr):
  return [line for line in stderr.splitlines() if line.startswith('error:')]


@pytest.mark.e2e
def test_a_second_trainer_is_refused_while_the_first_runs(tmp_path):
  """(A dead holder's takeover through the entry point: test_loop's kill -9 test and the two-process test here.)"""
  workdir = tmp_path / 'run'
  first = subprocess.Popen(train_command(workdir, '--config.train.steps=100000', '--config.train.checkpoint_every=20'),
                           env=ENV, stderr=subprocess.PIPE, text=True, cwd=ROOT)
  try:
    wait_for(lambda: (workdir / 'checkpoints' / '20').is_dir(), first, 'checkpoint 20')
    lease = workdir_lock.read_lease(workdir)
    assert lease['state'] == 'held' and lease['pid'] == first.pid

    second = _train(workdir, '--config.train.steps=100000', '--config.train.checkpoint_every=20')
    assert second.returncode == 2, second.stderr[-3000:]
    errors = _errors(second.stderr)
    assert len(errors) == 1 and 'is in use by another trainer' in errors[0], second.stderr[-3000:]
    assert f'process {first.pid} on host {socket.gethostname()}, started {lease["started_at"]}' in errors[0]
    assert 'Traceback' not in second.stderr
    assert first.poll() is None and workdir_lock.read_lease(workdir)['pid'] == first.pid  # Left alone.
    assert runs.load_config(workdir).train.steps == 100000  # Reading a held run needs no lease.
    wait_for(lambda: len(runs.checkpoint_steps(workdir)) > 3, first, 'more checkpoints')  # Still training.
  finally:
    first.send_signal(signal.SIGKILL)
    first.wait()


def test_a_model_change_is_refused_and_a_learning_rate_change_is_recorded_with_its_step(tmp_path):
  workdir = tmp_path / 'run'
  common = ['--config.train.checkpoint_every=4']
  first = _train(workdir, '--config.train.steps=12', *common)
  assert first.returncode == 0, first.stderr[-3000:]
  config_json = (workdir / 'config.json').read_text()

  refused = _train(workdir, '--config.train.steps=16', '--config.model.d_model=48', *common)
  assert refused.returncode == 2, refused.stderr[-3000:]
  assert _errors(refused.stderr) == [f'error: cannot resume the run in {workdir} with this config: these keys '
                                     'define the run and must not change on resume '
                                     '(hybrid_jax/train/config_history.py lists which may)']
  assert ('model.d_model: run has 32, this command says 48; use a new --workdir or drop the override'
          in refused.stderr.splitlines())
  assert 'Traceback' not in refused.stderr and 'orbax' not in refused.stderr.lower()
  assert runs.checkpoint_steps(workdir) == [4, 8, 12] and (workdir / 'config.json').read_text() == config_json
  assert workdir_lock.read_lease(workdir)['state'] == 'released'

  resumed = _train(workdir, '--config.train.steps=16', '--config.train.lr=1e-2', *common)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert 'train.lr: the run had 0.003, this command says 0.01; in effect from step 13 on' in resumed.stderr
  assert (workdir / 'config.json').read_text() == config_json  # Still the config of step 1.
  sessions = config_history.read_sessions(workdir)
  assert [(s['first_step'], s['resumed_from']) for s in sessions] == [(1, None), (13, 12)]
  assert sessions[1]['changes'] == {'train.lr': {'from': 0.003, 'to': 0.01, 'class': 'training'},
                                    'train.steps': {'from': 12, 'to': 16, 'class': 'training'}}
  assert json.loads((workdir / 'report.json').read_text())['sessions'] == sessions
  assert runs.load_config(workdir).train.lr == 0.01

  # The logged learning rate is each step's own config's schedule: the old one to step 12, the new one after.
  old, new = small_config(), small_config()
  new.train.update(lr=1e-2, steps=16)
  old_lr, new_lr = optim.make_schedule(old.train), optim.make_schedule(new.train)
  logged = {r['step']: r['lr'] for r in map(json.loads, (workdir / 'metrics.jsonl').read_text().splitlines())
            if r['kind'] == 'train'}
  assert [logged[s] for s in range(1, 17)] == pytest.approx(
      [float(old_lr(s - 1)) for s in range(1, 13)] + [float(new_lr(s - 1)) for s in range(13, 17)])
  assert collect.collect_run(workdir)['config_changed'] == 'train.lr@13,train.steps@13'


@pytest.mark.e2e
def test_a_trainer_whose_lease_was_taken_over_stops_before_its_next_checkpoint(small, tmp_path, monkeypatch):
  original_start = session_lib.Session.start

  def start_then_lose_the_lease(self, resumed_from):
    original_start(self, resumed_from)
    lease = dict(workdir_lock.read_lease(tmp_path), token='taker', pid=4242, host='other-host')
    (tmp_path / workdir_lock.LEASE_FILE).write_text(json.dumps(lease))  # As if suspended past its timeout.
    self.lock.renew()  # What the renewal thread does next.

  monkeypatch.setattr(session_lib.Session, 'start', start_then_lose_the_lease)
  with pytest.raises(workdir_lock.WorkdirLost, match='taken over by process 4242 on host other-host'):
    standard_hooks.train(small, tmp_path)
  assert runs.checkpoint_steps(tmp_path) == []
  assert workdir_lock.read_lease(tmp_path)['token'] == 'taker'


@pytest.mark.e2e
def test_two_processes_take_over_once_and_stop_together(tmp_path):
  """Process 0 alone holds the workdir and judges the config; both processes stop with its message."""
  sys.path.insert(0, str(ROOT / 'launch'))
  import local_multiprocess  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'run'
  (workdir / 'checkpoints' / '4').mkdir(parents=True)  # Never read: a resume is judged before restoring.
  (workdir / 'config.json').write_text(small_config().to_json_best_effort())
  holder = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
  wait_for(lambda: workdir_lock._pid_start(holder.pid), holder, 'the holder process')
  (workdir / workdir_lock.LEASE_FILE).write_text(json.dumps({
      'state': 'held', 'host': socket.gethostname(), 'pid': holder.pid, 'started_at': 'earlier',
      'heartbeat_at': time.time(), 'timeout_s': 120.0, 'machine': workdir_lock._machine(),
      'pid_start': workdir_lock._pid_start(holder.pid), 'token': 'holder'}))

  def job(*overrides):
    args = local_multiprocess.argparse.Namespace(num_processes=2, devices_per_process=1, python=sys.executable,
                                                 port=local_multiprocess.free_port(),
                                                 command=train_command(workdir, *overrides)[3:])
    procs = []
    for pid, (env, cmd) in enumerate(local_multiprocess.commands(args)):
      with open(tmp_path / f'process_{pid}.log', 'w') as log:
        procs.append(subprocess.Popen(cmd, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                                      cwd=ROOT))
    codes = [p.wait(timeout=600) for p in procs]
    return codes, [p.pid for p in procs], [(tmp_path / f'process_{i}.log').read_text() for i in range(2)]

  try:
    codes, _, logs = job('--config.train.steps=8')
    assert codes == [2, 2], logs
    for log in logs:  # Both stop with process 0's message, naming the live holder.
      assert [e for e in _errors(log) if f'process {holder.pid} on host' in e and 'in use' in e], log[-3000:]
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()

  codes, pids, logs = job('--config.train.steps=8', '--config.model.d_model=48')
  assert codes == [2, 2], logs
  for log in logs:
    assert 'model.d_model: run has 32, this command says 48; use a new --workdir or drop the override' in log
    assert 'Traceback' not in log
  assert f'process {holder.pid} is gone' in logs[0] and 'taking over' not in logs[1]  # Process 0 took over.
  lease = workdir_lock.read_lease(workdir)
  assert lease['pid'] == pids[0] and lease['state'] == 'released'


@pytest.mark.parametrize('content, why', [('not json {', 'not JSON'), ('[1, 2]', 'a JSON list where a JSON object'),
                                          ('{"model": {}}', "missing key(s) 'data', 'train'"),
                                          (b'\xff\xfe', 'is not UTF-8')])
def test_a_config_json_this_project_did_not_write_is_refused_not_overwritten(small, tmp_path, content, why):
  path = tmp_path / 'config.json'
  path.write_bytes(content if isinstance(content, bytes) else content.encode())
  before = path.read_bytes()
  with pytest.raises(runs.RunError) as error:
    standard_hooks.train(small, tmp_path)
  assert why in str(error.value) and str(path) in str(error.value) and '\n' not in str(error.value)
  assert path.read_bytes() == before and not (tmp_path / 'checkpoints').exists()


@pytest.mark.parametrize('entries', [['notes.txt'], ['report.json', 'data/'], ['checkpoints/', 'a', 'b', 'c', 'd']])
def test_a_fresh_run_refuses_a_directory_holding_files_it_did_not_write(small, tmp_path, entries):
  """A directory without a run (no config.json, no checkpoint) may hold only what comes before a run (the lease,
  the sweep runner's record and log); anything else is named and left as it was."""
  for name in entries:
    path = tmp_path / name.rstrip('/')
    path.mkdir() if name.endswith('/') else path.write_text('mine')
  before = sorted(p.name for p in tmp_path.iterdir())
  with pytest.raises(runs.RunError) as error:
    standard_hooks.train(small, tmp_path)
  message = str(error.value)
  assert 'not a run of this project' in message and repr(sorted(before)[0]) in message and '\n' not in message
  assert sorted(p.name for p in tmp_path.iterdir() if p.name != 'lock.json') == before
  assert not (tmp_path / 'config.json').exists()


def test_what_comes_before_a_run_does_not_stop_it(small, tmp_path):
  from hybrid_jax.sweep import record  # pylint: disable=g-import-not-at-top
  assert {record.RECORD, record.LOG} <= set(session_lib.BEFORE_THE_RUN)
  record.update(tmp_path, state='running')
  (tmp_path / record.LOG).write_text('attempt 1\n')
  small.train.steps = 4
  standard_hooks.train(small, tmp_path)
  assert runs.checkpoint_steps(tmp_path) == [4]
