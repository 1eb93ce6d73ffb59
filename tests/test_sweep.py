"""`sweep run` / `sweep status`: a killed local sweep resumed by its rerun, the TPU backend against a stand-in for
gcloud (a failed create, a preempted slice re-queued, a user error reported once), and the W&B sink."""

import json
import os
import pathlib
import signal
import struct
import subprocess
import sys
import time
import zlib

import pytest

from hybrid_jax.config import CONFIG_DIR
from hybrid_jax.commands import sweep as sweep_cli
from hybrid_jax.sweep import local, outcome as outcome_lib, record, runner, status, tpu
from hybrid_jax.sweep import wandb_sink
from hybrid_jax.train import metrics
from tests.conftest import ROOT, SMALL, wait_for

# The seconds-fast run of conftest.SMALL, in float32, without the whole-document evaluation.
OVERRIDES = [f'--config.{section}.{key}={value}' for section, values in SMALL.items() for key, value in values.items()]
OVERRIDES += ['--config.eval.documents=0', '--config.model.dtype=float32', '--config.train.checkpoint_every=1000']
BASE = 'hybrid:arch=swa128_nope,scale=tiny'
EXPERIMENT = f'{ROOT}/configs/nope_fix.py:scale=tiny'  # A checkout's own config file.


def _sweep_file(tmp_path, runs):
  path = tmp_path / 'sweep.py'
  path.write_text(f'RUNS = {runs!r}\n\n\ndef runs(name):\n  return RUNS\n')
  return f'{path}:tiny'


def _command(sweep, root, *extra):
  return [sys.executable, '-m', 'hybrid_jax', 'sweep', 'run', f'--sweep={sweep}', f'--root={root}', *OVERRIDES,
          *extra]


def _losses(workdir):
  lines = (workdir / 'metrics.jsonl').read_text().splitlines()
  return {r['step']: r['loss'] for r in map(json.loads, lines) if r['kind'] == 'train'}


def _sessions(workdir):
  return json.loads((workdir / 'config_history.json').read_text())['sessions']


def _logged_a_step(workdir) -> bool:
  try:
    return '"kind": "train"' in (workdir / 'metrics.jsonl').read_text()
  except OSError:
    return False


@pytest.mark.e2e
def test_a_killed_local_sweep_resumes_on_rerun(tmp_path):
  """Runs 0 and 1 train alike (keep_checkpoints does not change a loss): run 1, killed with the runner, must end
  as run 0 did."""
  sweep = _sweep_file(tmp_path, [f'{BASE} --config.seed=0', f'{BASE} --config.seed=0 --config.train.keep_checkpoints=2',
                                 f'{BASE} --config.seed=1', f'{BASE} --config.seed=2'])
  root = tmp_path / 'root'
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  args = ['--config.train.steps=24']
  runner = subprocess.Popen(_command(sweep, root, *args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
  wait_for(lambda: root.is_dir() and len(status.run_dirs(root)) == 4, runner, 'the run directories')
  dirs = status.run_dirs(root)
  victim = next(d for d in dirs if 'keep_checkpoints' in d.name)
  # A logged step, not the file (it exists before any step): killed while compiling, nothing would be resumed.
  wait_for(lambda: _logged_a_step(victim), runner, 'the second run training')
  runner.send_signal(signal.SIGKILL)  # The runner alone: its trainer gets SIGTERM from the kernel and checkpoints.
  runner.wait()
  deadline = time.time() + 120  # Its trainer, orphaned, checkpoints on the kernel's SIGTERM and writes its report.
  while not (victim / 'report.json').exists():
    assert time.time() < deadline, 'the killed runner\'s trainer did not stop'
    time.sleep(0.05)
  assert json.loads((victim / 'report.json').read_text())['status'] == 'preempted'
  table = subprocess.run([sys.executable, '-m', 'hybrid_jax', 'sweep', 'status', f'--root={root}'],
                         capture_output=True, text=True, check=True).stdout
  assert '1 completed' in table and '1 stopped' in table and '2 pending' in table, table

  rerun = subprocess.run(_command(sweep, root, *args), env=env, capture_output=True, text=True)
  assert rerun.returncode == 0, rerun.stdout + rerun.stderr
  assert 'completed at step 24\n' in rerun.stdout and 'resumes from step' in rerun.stdout, rerun.stdout
  for d in dirs:  # Completed exactly once: one session each, two for the resumed run.
    assert json.loads((d / 'report.json').read_text())['status'] == 'completed'
    assert len(_sessions(d)) == (2 if d == victim else 1), d.name
  reference = next(d for d in dirs if d.name.endswith('seed-0'))
  assert _losses(victim) == _losses(reference)
  assert json.loads((victim / 'report.json').read_text())['resumed_from'] > 0

  # A changed override that defines the runs is refused for each of them; nothing trains.
  refused = subprocess.run(_command(sweep, root, *args, '--config.model.d_ff=128'), env=env, capture_output=True,
                           text=True)
  assert refused.returncode == 2, refused.stdout + refused.stderr
  assert refused.stdout.count('refused: the overrides change keys that define the run: model.d_ff') == 4
  assert all(len(_sessions(d)) == (2 if d == victim else 1) for d in dirs)


def _fake_gcloud(tmp_path, script):
  bin_dir, home, state = tmp_path / 'bin', tmp_path / 'home', tmp_path / 'gcloud'
  for d in (bin_dir, state, home / 'hybrid_jax' / '.venv' / 'bin'):
    d.mkdir(parents=True)
  (bin_dir / 'gcloud').symlink_to(ROOT / 'tests' / 'data' / 'fake_gcloud.py')
  (home / 'hybrid_jax' / 'configs').symlink_to(ROOT / 'configs')  # The slice's clone, as far as train reads it.
  python = home / 'hybrid_jax' / '.venv' / 'bin' / 'python'
  python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
  python.chmod(0o755)
  (state / 'script.json').write_text(json.dumps(script))
  return dict(os.environ, PATH=f'{bin_dir}:{os.environ["PATH"]}', HOME=str(home), FAKE_GCLOUD_DIR=str(state),
              JAX_PLATFORMS='cpu')


TPU_FLAGS = ['--backend=tpu', '--zone=us-east5-a', '--repo=https://example.com/hybrid_jax', '--bucket=bkt', '--spot',
             '--poll-s=0.05']


@pytest.mark.e2e
def test_the_tpu_backend_requeues_a_preempted_slice_and_reports_a_user_error_once(tmp_path):
  sweep = _sweep_file(tmp_path, [f'{BASE} --config.seed=0', f'{BASE} --config.seed=1 --config.train.init_from=/nowhere'])
  env = _fake_gcloud(tmp_path, {'create': ['fail'], 'run': ['preempt']})
  root = tmp_path / 'root'
  out = subprocess.run(_command(sweep, root, '--config.train.steps=24', *TPU_FLAGS), env=env, capture_output=True,
                       text=True)
  assert out.returncode == 2, out.stdout + out.stderr
  calls = (tmp_path / 'gcloud' / 'calls.log').read_text().splitlines()
  creates = [c for c in calls if 'queued-resources create' in c]
  assert len(creates) == 3 and all('--spot' in c and '--accelerator-type=v5p-8' in c for c in creates), calls
  assert 'create failed' in out.stdout and 're-queueing it to resume the run' in out.stdout, out.stdout
  good, bad = sorted(status.run_dirs(root))
  report = json.loads((good / 'report.json').read_text())
  assert report['status'] == 'completed' and report['steps'] == 24 and report['resumed_from'] > 0
  trains = [c for c in calls if 'hybrid_jax train' in c]
  assert sum(bad.name in c for c in trains) == 1 and sum(good.name in c for c in trains) == 2, trains
  (line,) = [line for line in out.stdout.splitlines() if bad.name in line and 'failed at step 0/24' in line]
  assert line.endswith("config.train.init_from='/nowhere' is invalid: no checkpoints under /nowhere/checkpoints")
  assert calls[-1].startswith('compute tpus queued-resources delete')  # The slice is given back at the end.

  rerun = subprocess.run(_command(sweep, root, '--config.train.steps=24', *TPU_FLAGS), env=env, capture_output=True,
                         text=True)
  assert rerun.returncode == 2 and 'failed before, not retried' in rerun.stdout, rerun.stdout
  assert (tmp_path / 'gcloud' / 'calls.log').read_text().splitlines() == calls  # Nothing was queued again.


def test_tpu_dry_run_prints_each_runs_gcloud_lines_with_its_fit_topology(tmp_path, capsys):
  fit = tmp_path / 'fit.json'
  fit.write_text(json.dumps([{'target': 'v5p:4x4x4', 'chips': 64, 'arch': 'swa128_nope', 'scale': 'tiny',
                              'seq_len': 64, 'batch_size': 2, 'fits': True}]))
  sweep = _sweep_file(tmp_path, [f'{EXPERIMENT} --config.seed=0'])
  code = sweep_cli.main(['run', f'--sweep={sweep}', '--root=/mnt/bkt/sweep', *OVERRIDES, *TPU_FLAGS, f'--fit={fit}',
                         '--dry-run'])
  lines = capsys.readouterr().out.splitlines()
  assert code == 0 and lines[0].endswith(': starts')
  assert lines[1].startswith('gcloud compute tpus queued-resources create hj-sweep-0 --zone=us-east5-a '
                             '--accelerator-type=v5p-128 ')
  assert lines[1].endswith('--spot')
  run = next(line for line in lines if 'hybrid_jax train' in line)
  assert '--config=configs/nope_fix.py:scale=tiny' in run and '--workdir=/mnt/bkt/sweep/' in run  # The clone's path.
  assert not pathlib.Path('/mnt/bkt').exists()


def test_the_slice_runs_a_packaged_config_by_name_and_a_checkouts_file_by_its_path(monkeypatch):
  monkeypatch.chdir(ROOT / 'docs')  # Inside the checkout, but a name is not a path in it.
  assert tpu.remote_spec('hybrid:arch=gdn,scale=s1') == 'hybrid:arch=gdn,scale=s1'
  assert tpu.remote_spec(f'{CONFIG_DIR / "mini.py"}:arch=gdn') == 'mini:arch=gdn'  # The slice's package has it.
  assert tpu.remote_spec(f'{ROOT}/configs/nope_fix.py:scale=s1') == 'configs/nope_fix.py:scale=s1'  # In the clone.
  assert tpu.remote_spec('/elsewhere/mine.py:x') == '/elsewhere/mine.py:x'


def test_slots_get_disjoint_gpus():
  assert local.slot_envs(['0', '1', '2', '3'], 2) == [{'CUDA_VISIBLE_DEVICES': '0,1'}, {'CUDA_VISIBLE_DEVICES': '2,3'}]
  assert local.slot_envs([], 2) == [{}, {}]
  assert local.slot_envs(['0'], 2)[0] == {'XLA_PYTHON_CLIENT_MEM_FRACTION': '0.450'}
  with pytest.raises(local.checks.InputError, match='--parallel=3'):
    local.slot_envs(['0', '1'], 3)
  assert tpu.accelerator_type('v5p:4x4x4', 64) == 'v5p-128' and tpu.accelerator_type('v6e:4x4', 16) == 'v6e-16'


class _StandInMember:

  def train_args(self):
    return ['train']

  def command(self):
    return 'train'


def _cpu_list(text: str) -> set[int]:
  """The cores of a /proc Cpus_allowed_list value such as '0-3,6'."""
  out = set()
  for part in text.strip().split(','):
    lo, _, hi = part.partition('-')
    out.update(range(int(lo), int(hi or lo) + 1))
  return out


@pytest.mark.e2e
def test_on_cpu_the_slots_split_the_cores_and_each_child_is_bound_to_its_share(tmp_path, monkeypatch):
  assert local.slot_cores({0, 1, 2, 3}, [], 2) == [frozenset({0, 1}), frozenset({2, 3})]
  assert local.slot_cores({4, 5, 6}, [], 2) == [frozenset({4}), frozenset({5, 6})]
  assert local.slot_cores({0, 1}, ['0'], 2) == [None, None]  # On a GPU the runs share its memory instead.
  assert local.slot_cores({0}, [], 2) == [None, None]  # Fewer cores than slots: nothing to split.
  assert local.slot_cores({0, 1}, [], 1) == [None]
  # A child really starts bound: a stand-in interpreter prints the cores it may run on into the run's log.
  cores = sorted(os.sched_getaffinity(0))
  fake_python = tmp_path / 'python'
  fake_python.write_text('#!/bin/sh\ngrep Cpus_allowed_list /proc/self/status\n')
  fake_python.chmod(0o755)
  monkeypatch.setattr(local.sys, 'executable', str(fake_python))
  backend = local.LocalBackend(parallel=2, gpus=[])
  member = _StandInMember()
  for slot in range(2):
    log = tmp_path / f'slot{slot}.log'
    backend.attempt(member, slot, log)
    allowed = _cpu_list(log.read_text().strip().splitlines()[-1].split(':')[1])
    if len(cores) >= 2:
      share = sorted(backend.cores[slot])
      assert share and set(share) <= set(cores) and allowed == set(share)
      assert f'cpu {",".join(map(str, share))}' in log.read_text()
    else:
      assert allowed == set(cores)
  if len(cores) >= 2:
    assert not backend.cores[0] & backend.cores[1]


class _FakeRun:

  def __init__(self, logged, run_id):
    self.logged, self.id = logged, run_id or 'abc123'

  def log(self, values, step):
    self.logged.append((step, values))

  def finish(self):
    pass


class _FakeWandb:
  """Records what the sink sends (wandb itself is an optional extra)."""

  def __init__(self):
    self.inits, self.logged = [], []

  def init(self, **kwargs):
    self.inits.append(kwargs)
    return _FakeRun(self.logged, kwargs['id'])


def test_the_wandb_sink_logs_the_metrics_records_once_each(tmp_path, monkeypatch):
  fake = _FakeWandb()
  monkeypatch.setitem(sys.modules, 'wandb', fake)
  sweep = _sweep_file(tmp_path, [f'{BASE} --config.seed=0'])
  (member,) = sweep_cli.members_lib.load(sweep, tmp_path / 'root', OVERRIDES)
  member.workdir.mkdir(parents=True)
  records = [{'step': s, 'kind': 'train', 'loss': 5.0 - s} for s in (1, 2)]
  (member.workdir / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
  sink = wandb_sink.WandbSink('proj')
  assert sink.sync(member, 'tiny') == 2
  with open(member.workdir / 'metrics.jsonl', 'a') as f:  # A resumed attempt logs step 3.
    f.write(json.dumps({'step': 3, 'kind': 'train', 'loss': 1.5}) + '\n')
  assert sink.sync(member, 'tiny') == 1
  assert fake.logged == [(1, {'train/loss': 4.0}), (2, {'train/loss': 3.0}), (3, {'train/loss': 1.5})]
  assert [i['id'] for i in fake.inits] == [None, 'abc123']  # W&B's id for the first attempt, resumed after.
  assert fake.inits[0]['name'] == member.name and fake.inits[0]['group'] == 'tiny'
  assert 'sweep:tiny' in fake.inits[0]['tags'] and fake.inits[0]['config']['seed'] == 0


class _StandInBackend:
  """One slot that 'completes' each run at once, except that it fails with a fault on the runs named `broken`."""
  slots = 1

  def __init__(self, broken):
    self.broken, self.attempted = broken, []

  def where(self, slot):
    return f'stand-in slot {slot}'

  def attempt(self, member, slot, log_path):
    del slot, log_path
    self.attempted.append(member.name)
    if member.name in self.broken:
      raise OSError('the slot lost its machine')
    return outcome_lib.Outcome('completed', 0)

  def stop(self):
    pass


class _FailingSink:

  def __init__(self, failing):
    self.failing, self.synced = failing, []

  def sync(self, member, sweep):
    del sweep
    if member.name in self.failing:
      raise RuntimeError('the tracker is unreachable')
    self.synced.append(member.name)
    return 0


def test_a_tracker_or_backend_fault_is_reported_and_the_sweep_goes_on(tmp_path):
  """A sink that raises, or a backend that raises, must neither end the slot (the next runs still run) nor let the
  sweep exit 0: the fault is said in one line and the exit status is 1."""
  sweep = _sweep_file(tmp_path, [f'{BASE} --config.seed={k}' for k in range(3)])
  members = sweep_cli.members_lib.load(sweep, tmp_path / 'root', OVERRIDES)
  names = [m.name for m in members]
  backend, sink, lines = _StandInBackend({names[1]}), _FailingSink({names[0]}), []
  runner_ = runner.Runner(members, backend, sweep='tiny', sink=sink, say=lines.append)
  assert runner_.run() == 1
  assert backend.attempted == names and sink.synced == [names[2]]
  assert any(names[0] in line and 'not logged by the experiment tracker: RuntimeError' in line for line in lines)
  assert any(names[1] in line and 'crashed in the sweep runner: OSError: the slot lost its machine' in line
             for line in lines)
  assert runner_.results == {names[0]: 'completed', names[1]: 'crashed', names[2]: 'completed'}


_WANDB_BLOCK = 32 * 1024


def _wandb_records(path):
  """The records of a .wandb file, parsed with wandb's own Record message (wandb ships no reader of the file): after
  a 7-byte header (':W&B', magic, version) a LevelDB-style log of 32 KiB blocks whose records come in chunks, each
  with a checksum (CRC-32 of its type and data), a length and a type (1 whole, 2 first, 3 middle, 4 last)."""
  from wandb.proto import wandb_internal_pb2  # pylint: disable=g-import-not-at-top
  data = path.read_bytes()
  assert data[:4] == b':W&B', data[:7]
  records, pos, pending = [], 7, b''
  while pos + 7 <= len(data):
    if _WANDB_BLOCK - pos % _WANDB_BLOCK < 7:  # Too little of the block left for a header: padding.
      pos += _WANDB_BLOCK - pos % _WANDB_BLOCK
      continue
    checksum, length, kind = struct.unpack('<IHB', data[pos:pos + 7])
    chunk = data[pos + 7:pos + 7 + length]
    if kind == 0:  # Zeros: the end of what was written.
      break
    assert checksum == zlib.crc32(chunk, zlib.crc32(bytes([kind]))), f'{path}: bad chunk at byte {pos}'
    pending, pos = pending + chunk, pos + 7 + length
    if kind in (1, 4):
      records.append(wandb_internal_pb2.Record.FromString(pending))
      pending = b''
  return records


@pytest.mark.e2e
def test_the_wandb_sink_logs_each_metrics_record_once_in_offline_mode(tmp_path):
  """Real wandb, offline: a sweep's run, then its resumption to more steps, log into one W&B run named and tagged
  by the sweep; the history read back from the .wandb files is the run's metrics.jsonl, each step once."""
  sweep = _sweep_file(tmp_path, [f'{BASE} --config.seed=0'])
  root = tmp_path / 'root'
  env = dict(os.environ, JAX_PLATFORMS='cpu', WANDB_MODE='offline', WANDB_DIR=str(tmp_path / 'wandb'),
             WANDB_SILENT='true')
  for steps in (6, 10):
    out = subprocess.run(_command(sweep, root, f'--config.train.steps={steps}', '--wandb=hj-test'), env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
  (workdir,) = status.run_dirs(root)
  files = sorted(workdir.glob('wandb/offline-run-*/run-*.wandb'))
  assert len(files) == 2, files  # One per attempt, both of the same W&B run.
  records = [r for f in files for r in _wandb_records(f)]
  run_id = record.read(workdir)['wandb']['id']
  runs = {(r.run.run_id, r.run.project, r.run.display_name, r.run.run_group, tuple(r.run.tags))
          for r in records if r.WhichOneof('record_type') == 'run'}
  assert runs == {(run_id, 'hj-test', workdir.name, 'tiny', ('sweep:tiny', 'arch:swa128_nope', 'scale:tiny'))}
  logged = []
  for r in records:
    if r.WhichOneof('record_type') == 'history':
      items = {'/'.join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
      logged.append((r.history.step.num, {k: v for k, v in items.items() if not k.startswith('_')}))
  expected = {}
  for r in metrics.read_jsonl(workdir / 'metrics.jsonl'):
    expected.setdefault(r['step'], {}).update({f"{r['kind']}/{k}": v for k, v in r.items()
                                               if k not in ('step', 'kind') and isinstance(v, (int, float))})
  assert [step for step, _ in logged] == sorted(expected) and max(expected) == 10
  assert dict(logged) == expected
