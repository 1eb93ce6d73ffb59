"""Multi-process runs on localhost (gloo collectives): same loss as one process over the same global batches,
a clear error instead of a hang when a process dies, resume after restart, the same-config check, and the
launchers' printed commands."""

import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from hybrid_jax.parallel import distributed
from hybrid_jax.train import workdir_lock
from tests.conftest import ROOT, small_config, train_command
from tests.test_loop import _logged_steps, _losses

sys.path.insert(0, str(ROOT / 'launch'))
import gpu as gpu_launch  # noqa: E402
import local_multiprocess  # noqa: E402
import tpu_pod  # noqa: E402


def _processes(n, argv, log_dir, port=None):
  """Starts the n processes of one job as local_multiprocess would; their output goes to log_dir/process_<i>.log."""
  args = local_multiprocess.argparse.Namespace(num_processes=n, devices_per_process=1, python=sys.executable,
                                               port=port or local_multiprocess.free_port(), command=argv)
  procs = []
  for pid, (env, cmd) in enumerate(local_multiprocess.commands(args)):
    log = open(pathlib.Path(log_dir) / f'process_{pid}.log', 'w')
    procs.append(subprocess.Popen(cmd, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
  return procs


def _log(log_dir, pid):
  return (pathlib.Path(log_dir) / f'process_{pid}.log').read_text()


# ------------------------------------------------------------------------------------------------ fast units
@pytest.mark.e2e
def test_settings_come_from_the_environment(monkeypatch):
  cfg = small_config().parallel.distributed
  for var in ('SLURM_NTASKS', 'TPU_WORKER_HOSTNAMES', distributed.ENV_COORDINATOR):
    monkeypatch.delenv(var, raising=False)
  assert distributed._cluster_in_environment() is None
  assert distributed.initialize(cfg) is False  # One process: nothing to join.
  monkeypatch.setenv(distributed.ENV_COORDINATOR, '10.0.0.1:1234')
  monkeypatch.setenv(distributed.ENV_NUM_PROCESSES, '4')
  monkeypatch.setenv(distributed.ENV_PROCESS_ID, '3')
  assert distributed._settings(cfg) == {'coordinator_address': '10.0.0.1:1234', 'num_processes': 4, 'process_id': 3}
  monkeypatch.delenv(distributed.ENV_COORDINATOR)
  monkeypatch.setenv('SLURM_NTASKS', '8')
  assert distributed._cluster_in_environment() == 'SLURM'


def test_config_hash_ignores_only_the_process_id():
  a, b = small_config(), small_config()
  b.parallel.distributed.process_id = 3
  assert distributed.config_hash(a) == distributed.config_hash(b)
  b.train.lr = 1e-3
  assert distributed.config_hash(a) != distributed.config_hash(b)


_HASH_CHECK = '''
import sys
from hybrid_jax.parallel import distributed
from hybrid_jax.train import workdir_lock
from tests.conftest import small_config
c = small_config()
c.parallel.distributed.initialize = 'always'
c.train.lr = float(sys.argv[1])
distributed.initialize(c.parallel.distributed)
try:
  distributed.check_same_config(c, 60)
except distributed.DistributedError as e:
  print('error:', e, flush=True)
  import os; os._exit(1)
print('same config', flush=True)
import os; os._exit(0)
'''


@pytest.mark.e2e
def test_processes_with_different_configs_fail_at_start_up(tmp_path):
  port = local_multiprocess.free_port()
  procs = []
  for pid, lr in enumerate(('0.003', '0.001')):
    env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=str(ROOT),
               HYBRID_JAX_COORDINATOR=f'127.0.0.1:{port}', HYBRID_JAX_NUM_PROCESSES='2', HYBRID_JAX_PROCESS_ID=str(pid))
    procs.append(subprocess.Popen([sys.executable, '-c', _HASH_CHECK, lr], env=env, cwd=ROOT, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
  outs = [p.communicate(timeout=300)[0] for p in procs]
  # Both stop; the first to exit takes the coordinator (process 0) or its peer down with it, so one message
  # may be cut short by the runtime's own "task failed" abort.
  assert all(p.returncode != 0 for p in procs), outs
  assert any('processes run different configs' in out for out in outs), outs


def test_preemption_checkpoints_off_is_said_at_start_and_service_errors_surface(monkeypatch, caplog):
  """Multi-process SIGTERM handling: without jax's preemption service the run says at start that SIGTERM will not
  checkpoint (once), and never asks the service; with it, an error of the service is raised, not taken as 'no'."""
  from jax.experimental import multihost_utils
  from hybrid_jax.train import loop
  monkeypatch.setattr(loop.jax, 'process_count', lambda: 2)
  asked = []

  def sync_point(step):
    asked.append(step)
    raise RuntimeError('Preemption sync manager has not been initialized.')

  monkeypatch.setattr(multihost_utils, 'reached_preemption_sync_point', sync_point)
  previous = jax.config.jax_enable_preemption_service
  try:
    jax.config.update('jax_enable_preemption_service', False)
    with caplog.at_level(logging.WARNING), loop._stop_on_sigterm() as stop:
      assert [loop._stop_requested(stop, step) for step in (1, 2, 3)] == [False] * 3
    assert asked == [] and caplog.text.count('preemption checkpoints are off') == 1
    assert 'jax_enable_preemption_service=False' in caplog.text
    jax.config.update('jax_enable_preemption_service', True)
    caplog.clear()
    with loop._stop_on_sigterm() as stop, pytest.raises(RuntimeError, match='not been initialized'):
      loop._stop_requested(stop, 1)
    assert asked == [1] and 'preemption checkpoints are off' not in caplog.text
  finally:
    jax.config.update('jax_enable_preemption_service', previous)


# ------------------------------------------------------------------------------------------- launchers (dry)
@pytest.mark.e2e
def test_local_launcher_dry_run(capsys):
  assert local_multiprocess.main(['--num_processes=2', '--dry-run', '--', 'train', '--config.train.steps=3']) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[-1] == 'wait' and len(lines) == 3
  for pid in (0, 1):
    assert lines[pid].startswith(f'HYBRID_JAX_COORDINATOR=127.0.0.1:12355 HYBRID_JAX_NUM_PROCESSES=2 '
                                 f'HYBRID_JAX_PROCESS_ID={pid} JAX_PLATFORMS=cpu ')
    assert lines[pid].endswith('-m hybrid_jax train --config.train.steps=3 &')


def test_tpu_pod_launcher_dry_run(capsys):
  common = ['--name=run1', '--zone=us-east5-a', '--accelerator=v5p-64', '--version=v2-alpha-tpuv5',
            '--project=my-proj']
  assert tpu_pod.main(['create', *common, '--dry-run']) == 0
  assert capsys.readouterr().out.strip() == (
      'gcloud compute tpus tpu-vm create run1 --project=my-proj --zone=us-east5-a --accelerator-type=v5p-64 '
      '--version=v2-alpha-tpuv5')
  assert tpu_pod.main(['run', *common, '--dry-run', '--', 'train', '--config=hybrid:arch=full,scale=s1',
                       '--workdir=/mnt/bucket/run1']) == 0
  run = capsys.readouterr().out.strip()
  assert run == ("gcloud compute tpus tpu-vm ssh run1 --project=my-proj --zone=us-east5-a --worker=all "
                 "'--command=set -o pipefail; cd hybrid_jax && .venv/bin/python -m hybrid_jax train "
                 "--config=hybrid:arch=full,scale=s1 --workdir=/mnt/bucket/run1 2>&1 | tee "
                 "~/hybrid_jax_run.log'")
  assert tpu_pod.main(['setup', *common, '--repo=https://example.com/hybrid_jax', '--bucket=bkt', '--dry-run']) == 0
  setup = capsys.readouterr().out.strip()
  assert setup.endswith("&& sudo mkdir -p /mnt/bkt && sudo chown \"$USER\" /mnt/bkt && "
                        "(mountpoint -q /mnt/bkt || gcsfuse --implicit-dirs bkt /mnt/bkt)'"), setup
  assert tpu_pod.main(['run', *common, '--slices=2', '--dry-run', '--', 'train']) == 0
  assert [line.split()[5] for line in capsys.readouterr().out.splitlines()] == ['run1-0', 'run1-1']
  assert tpu_pod.main(['delete', *common, '--dry-run']) == 0
  assert capsys.readouterr().out.strip() == (
      'gcloud compute tpus tpu-vm delete run1 --project=my-proj --zone=us-east5-a --quiet')
  assert tpu_pod.main(['create', *common, '--queued', '--slices=2', '--spot', '--dry-run']) == 0
  queued = capsys.readouterr().out.strip()
  assert queued == ('gcloud compute tpus queued-resources create run1 --project=my-proj --zone=us-east5-a '
                    '--accelerator-type=v5p-64 --runtime-version=v2-alpha-tpuv5 --node-count=2 --node-prefix=run1 '
                    '--spot')


def test_gpu_launchers_dry_run(capsys):
  assert gpu_launch.main(['local', '--gpus=4', '--dry-run', '--', 'train', '--config.train.steps=10']) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 1 and 'CUDA_VISIBLE_DEVICES=0,1,2,3' in lines[0]
  assert lines[0].endswith('-m hybrid_jax train --config.train.steps=10')
  assert gpu_launch.main(['slurm', '--nodes=2', '--gpus_per_node=8', '--job_name=big', '--dry-run', '--',
                          'train', '--config.train.steps=10']) == 0
  script = capsys.readouterr().out
  for line in ('#SBATCH --job-name=big', '#SBATCH --nodes=2', '#SBATCH --ntasks-per-node=1',
               '#SBATCH --gpus-per-node=8', 'srun python -m hybrid_jax train --config.train.steps=10'):
    assert line in script, (line, script)


# ----------------------------------------------------------------------------------- multi-process training
def _reference_losses(steps, processes):
  """One process, one device, fed the global batches the processes assemble (their rows, process by process)."""
  import jax
  from hybrid_jax.data.pipeline import make_train_dataset
  from hybrid_jax.parallel import mesh as mesh_lib, rules as rules_lib
  from hybrid_jax.train import optim, state as state_lib, step as step_lib
  cfg = small_config()
  md, tx = state_lib.make_model_def(cfg.model), optim.make_optimizer(cfg.train)
  sh = mesh_lib.train_shardings(md, tx, mesh_lib.make_mesh(cfg.parallel, jax.devices()[:1]),
                                rules_lib.parse_rules(cfg.parallel.rules))
  state = state_lib.init_sharded_train_state(cfg.model, cfg.seed, tx, sh.state)
  train_step = step_lib.make_train_step(md, tx, cfg.train, sh)
  iters = [iter(make_train_dataset(cfg, process_index=i, process_count=processes)) for i in range(processes)]
  out = {}
  for step in range(1, steps + 1):
    parts = [next(it) for it in iters]
    state, m = train_step(state, {k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
    out[step] = float(m['loss'])
  return out


@pytest.mark.e2e
def test_two_processes_match_one_and_resume_after_restart(tmp_path):
  workdir = tmp_path / 'run'
  procs = _processes(2, train_command(workdir, '--config.train.steps=6', '--config.train.checkpoint_every=3')[3:],
                     tmp_path)
  assert [p.wait(timeout=900) for p in procs] == [0, 0], _log(tmp_path, 0)[-3000:] + _log(tmp_path, 1)[-3000:]
  report = json.loads((workdir / 'report.json').read_text())
  assert report['processes'] == 2 and report['mesh'] == {'data': 2, 'fsdp': 1, 'sequence': 1, 'tensor': 1}
  lease = workdir_lock.read_lease(workdir)  # Process 0 alone held the workdir, for both.
  assert lease['pid'] == procs[0].pid and lease['state'] == 'released'
  got, expected = _losses(workdir), _reference_losses(6, 2)
  assert sorted(got) == list(range(1, 7))
  assert max(abs(got[s] - expected[s]) for s in got) < 1e-5, (got, expected)
  # Restart with more steps: both processes resume from step 6 and continue the same stream.
  procs = _processes(2, train_command(workdir, '--config.train.steps=8', '--config.train.checkpoint_every=3')[3:],
                     tmp_path)
  assert [p.wait(timeout=900) for p in procs] == [0, 0], _log(tmp_path, 0)[-3000:]
  report = json.loads((workdir / 'report.json').read_text())
  assert report['resumed_from'] == 6 and report['steps'] == 8
  assert [(s['resumed_from'], s['processes']) for s in report['sessions']] == [(None, 2), (6, 2)]
  longer = _reference_losses(8, 2)
  got = _losses(workdir)
  assert max(abs(got[s] - longer[s]) for s in (7, 8)) < 1e-5


@pytest.mark.e2e
def test_two_processes_splitting_the_sequence_read_the_same_rows(tmp_path):
  """data 1 x sequence 2 over two processes of one device each: both hold every row of the batch (half of its
  tokens each), so both read the same rows, and the losses are those of one process reading alone."""
  workdir = tmp_path / 'run'
  procs = _processes(2, train_command(workdir, '--config.train.steps=4', '--config.parallel.data=1',
                                      '--config.parallel.sequence=2')[3:], tmp_path)
  assert [p.wait(timeout=900) for p in procs] == [0, 0], _log(tmp_path, 0)[-3000:] + _log(tmp_path, 1)[-3000:]
  report = json.loads((workdir / 'report.json').read_text())
  assert report['mesh'] == {'data': 1, 'fsdp': 1, 'sequence': 2, 'tensor': 1}
  got, expected = _losses(workdir), _reference_losses(4, 1)
  assert sorted(got) == list(range(1, 5))
  assert max(abs(got[s] - expected[s]) for s in got) < 1e-5, (got, expected)


@pytest.mark.e2e
def test_sigterm_to_one_process_checkpoints_both_at_the_same_step(tmp_path):
  """SIGTERM reaches one process of two; jax's preemption service makes both stop after the same step and write
  that step's checkpoint (the interval, 100,000 steps, is never reached), then exit with status 143."""
  workdir = tmp_path / 'run'
  procs = _processes(2, train_command(workdir, '--config.train.steps=200000', '--config.train.checkpoint_every=100000')[3:],
                     tmp_path)
  deadline = time.time() + 900
  while max(_logged_steps(workdir), default=0) < 3:
    assert all(p.poll() is None for p in procs), _log(tmp_path, 0)[-3000:] + _log(tmp_path, 1)[-3000:]
    assert time.time() < deadline, 'step 3 was not logged in time'
    time.sleep(0.05)
  procs[1].send_signal(signal.SIGTERM)
  assert [p.wait(timeout=300) for p in procs] == [143, 143], _log(tmp_path, 0)[-3000:]
  report = json.loads((workdir / 'report.json').read_text())
  assert report['status'] == 'preempted' and report['processes'] == 2
  assert sorted(int(p.name) for p in (workdir / 'checkpoints').iterdir() if p.name.isdigit()) == [report['steps']]
  assert report['steps'] == max(_losses(workdir)) >= 3
  for pid in (0, 1):
    assert f'preempted at step {report["steps"]}' in _log(tmp_path, pid)


@pytest.mark.e2e
def test_killing_one_process_makes_the_other_exit_with_a_clear_error(tmp_path):
  workdir = tmp_path / 'run'
  heartbeat = 10
  argv = train_command(workdir, '--config.train.steps=100000', '--config.train.checkpoint_every=5',
              f'--config.parallel.distributed.heartbeat_timeout_s={heartbeat}')[3:]
  procs = _processes(2, argv, tmp_path)
  deadline = time.time() + 900
  while not (workdir / 'checkpoints' / '5').is_dir():
    assert all(p.poll() is None for p in procs), _log(tmp_path, 0)[-3000:]
    assert time.time() < deadline
    time.sleep(0.2)
  procs[1].send_signal(signal.SIGKILL)
  killed_at = time.time()
  code = procs[0].wait(timeout=heartbeat + 120)  # A hang fails the test here.
  assert code != 0 and time.time() - killed_at < heartbeat + 120
  log = _log(tmp_path, 0)
  assert ('error: process 0 of 2: a collective or barrier at step' in log
          or 'stopped sending heartbeats' in log), log[-3000:]
