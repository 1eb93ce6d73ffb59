"""The training loop end to end, and its reliability: kill -9 and resume bit for bit, SIGTERM, corrupt
checkpoints, NaN loss, failed background saves, and the CLI."""

import json
import logging
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

from hybrid_jax.data import pipeline, sources
from hybrid_jax import standard_hooks
from hybrid_jax.train import checkpoint, loop, metrics, report
from tests.conftest import ROOT, small_config, train_command, wait_for


def _losses(workdir):
  return {r['step']: r['loss'] for r in metrics.read_jsonl(pathlib.Path(workdir) / 'metrics.jsonl')
          if r['kind'] == 'train'}


def test_train_writes_report_metrics_and_checkpoints(small, tmp_path):
  small.train.eval_every = 6
  result = standard_hooks.train(small, tmp_path)
  assert result['status'] == 'completed' and result['steps'] == 12
  report = json.loads((tmp_path / 'report.json').read_text())
  assert report['eval']['packed_loss'] == pytest.approx(result['eval']['packed_loss'])
  assert report['eval']['loss'] == pytest.approx(result['eval']['loss'])
  assert len(report['eval']['loss_by_position']) == 4
  assert report['eval']['documents'] == small.eval.documents == len(set(report['eval']['document_ids']))
  assert report['eval']['tokens'] == small.eval.documents * small.data.seq_len
  assert (tmp_path / 'loss_curve.png').stat().st_size > 1000
  losses = _losses(tmp_path)
  assert sorted(losses) == list(range(1, 13))
  assert losses[12] < losses[1]
  assert [r['step'] for r in metrics.read_jsonl(tmp_path / 'metrics.jsonl') if r['kind'] == 'eval'] == [6, 12]
  assert checkpoint.Checkpointer(tmp_path / 'checkpoints', keep=3, async_save=False).all_steps() == [4, 8, 12]
  events = list((tmp_path / 'tensorboard').glob('events.out.tfevents.*'))
  assert events and events[0].stat().st_size > 0
  from tensorboard.backend.event_processing import event_accumulator
  acc = event_accumulator.EventAccumulator(str(events[0].parent))
  acc.Reload()
  assert [e.step for e in acc.Scalars('train/loss')] == list(range(1, 13))
  assert {'train/grad_norm', 'train/lr', 'train/tokens_per_s', 'eval/packed_loss'} <= set(acc.Tags()['scalars'])


def test_the_logged_train_loss_is_the_mean_over_each_logging_interval(small, tmp_path):
  """log_every=4 logs, at steps 4, 8, 12, the mean of the 4 step losses that the same run logs one by one with
  log_every=1 (a cadence: same batches, same updates), and the last of them as loss_last; TensorBoard, the report's
  curve and final_train_loss read the mean."""
  standard_hooks.train(small, tmp_path / 'every_step')
  per_step = _losses(tmp_path / 'every_step')
  small.train.log_every = 4
  result = standard_hooks.train(small, tmp_path / 'every_4')
  records = {r['step']: r for r in metrics.read_jsonl(tmp_path / 'every_4' / 'metrics.jsonl') if r['kind'] == 'train'}
  assert sorted(records) == [4, 8, 12]
  for end, r in records.items():
    window = [per_step[s] for s in range(end - 3, end + 1)]
    assert r['loss'] == pytest.approx(np.mean(window), rel=1e-6) and r['loss_last'] == per_step[end], end
    assert r['loss_steps'] == 4
  assert np.std([per_step[s] for s in range(1, 13)]) > 1e-3  # The mean and one step's loss tell apart.
  assert result['final_train_loss'] == pytest.approx(records[12]['loss'], rel=1e-6)
  assert result['final_train_loss_last'] == per_step[12]
  from tensorboard.backend.event_processing import event_accumulator
  acc = event_accumulator.EventAccumulator(str(tmp_path / 'every_4' / 'tensorboard'))
  acc.Reload()
  assert [e.step for e in acc.Scalars('train/loss')] == [4, 8, 12]
  assert [e.value for e in acc.Scalars('train/loss')] == pytest.approx([records[s]['loss'] for s in (4, 8, 12)])
  assert [e.value for e in acc.Scalars('train/loss_last')] == pytest.approx([per_step[s] for s in (4, 8, 12)])
  fig = report.loss_figure(list(records.values()))
  train_line = fig.axes[0].lines[0]
  assert list(train_line.get_ydata()) == [records[s]['loss'] for s in (4, 8, 12)]
  assert 'mean' in train_line.get_label()
  report.plt.close(fig)


def test_rerun_after_completion_resumes_and_changes_nothing(small, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  first = standard_hooks.train(small, 'run')  # A relative workdir, as users type it.
  checkpoints = _file_bytes(tmp_path / 'run' / 'checkpoints')
  train_records = [r for r in metrics.read_jsonl(tmp_path / 'run' / 'metrics.jsonl') if r['kind'] == 'train']
  again = standard_hooks.train(small, 'run')
  assert again['resumed_from'] == 12 and again['steps'] == 12 and again['status'] == 'completed'
  assert _file_bytes(tmp_path / 'run' / 'checkpoints') == checkpoints  # No step taken, nothing rewritten.
  assert [r for r in metrics.read_jsonl(tmp_path / 'run' / 'metrics.jsonl') if r['kind'] == 'train'] == train_records
  assert again['eval'] == first['eval']  # The restored parameters give the same held-out outputs, exactly.


def _file_bytes(directory):
  return {str(f.relative_to(directory)): f.read_bytes() for f in sorted(directory.rglob('*')) if f.is_file()}


def test_every_checkpoint_corrupt_is_an_error_not_a_silent_restart(small, tmp_path):
  small.train.steps = 4
  standard_hooks.train(small, tmp_path)
  for f in (tmp_path / 'checkpoints' / '4').rglob('*'):
    if f.is_file():
      f.write_bytes(b'')
  with pytest.raises(checkpoint.CheckpointError, match='no checkpoint .* could be restored'):
    standard_hooks.train(small, tmp_path)


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(small, tmp_path):
  small.train.update(dict(lr=1e12, warmup_steps=1, grad_clip=0.0, steps=40, checkpoint_every=1, schedule='constant'))
  with pytest.raises(loop.TrainingDiverged, match=r'training loss is (nan|inf) at step (\d+)') as info:
    standard_hooks.train(small, tmp_path)
  bad_step = int(info.value.args[0].split(' at step ')[1].split()[0])
  saved = checkpoint.Checkpointer(tmp_path / 'checkpoints', keep=3, async_save=False).all_steps()
  assert saved and max(saved) == bad_step - 1
  assert f'(step {bad_step - 1})' in str(info.value)


class _FailingManager:
  """Stands in for orbax's manager whose background write failed (disk full)."""

  def __init__(self, real):
    self.real = real

  def __getattr__(self, name):
    return getattr(self.real, name)

  def check_for_errors(self):
    raise OSError('No space left on device')

  def wait_until_finished(self):
    raise OSError('No space left on device')


def test_failed_background_save_is_reported(small, tmp_path, monkeypatch):
  original_init = checkpoint.Checkpointer.__init__

  def failing_init(self, *args, **kwargs):
    original_init(self, *args, **kwargs)
    self.manager = _FailingManager(self.manager)

  monkeypatch.setattr(checkpoint.Checkpointer, '__init__', failing_init)
  with pytest.raises(checkpoint.CheckpointError, match='background checkpoint save .* failed: No space left'):
    standard_hooks.train(small, tmp_path)


def _wait_for_checkpoint(proc, workdir, step, timeout=180):
  wait_for((pathlib.Path(workdir) / 'checkpoints' / str(step)).is_dir, proc, f'checkpoint {step}', timeout)


@pytest.mark.e2e
def test_kill_9_then_rerun_continues_bit_for_bit(tmp_path):
  args = ['--config.train.steps=150', '--config.train.checkpoint_every=10']
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  reference = subprocess.run(train_command(tmp_path / 'reference', *args), env=env, capture_output=True, text=True)
  assert reference.returncode == 0, reference.stderr

  victim = subprocess.Popen(train_command(tmp_path / 'killed', *args), env=env, stderr=subprocess.PIPE, text=True)
  _wait_for_checkpoint(victim, tmp_path / 'killed', 30)
  victim.send_signal(signal.SIGKILL)
  assert victim.wait() == -signal.SIGKILL
  before = _losses(tmp_path / 'killed')
  assert max(before) < 150, 'the run finished before it was killed'

  resumed = subprocess.run(train_command(tmp_path / 'killed', *args), env=env, capture_output=True, text=True)
  assert resumed.returncode == 0, resumed.stderr
  assert f'process {victim.pid} is gone' in resumed.stderr  # The killed trainer's workdir lease, taken over.
  report = json.loads((tmp_path / 'killed' / 'report.json').read_text())
  assert 30 <= report['resumed_from'] < 150
  expected, got = _losses(tmp_path / 'reference'), _losses(tmp_path / 'killed')
  assert sorted(got) == sorted(expected) == list(range(1, 151))
  assert [got[s] for s in range(1, 151)] == [expected[s] for s in range(1, 151)]  # Exact, not approximate.
  # The steps trained twice (after the checkpoint, before the kill) keep one record each, the resumed run's.
  assert _logged_steps(tmp_path / 'killed') == list(range(1, 151))


def _logged_steps(workdir):
  """Train steps in metrics.jsonl so far, from whole lines only (the run may be writing the last one)."""
  path = pathlib.Path(workdir) / 'metrics.jsonl'
  lines = path.read_text().split('\n')[:-1] if path.is_file() else []
  return [r['step'] for r in map(json.loads, lines) if r['kind'] == 'train']


def _wait_for_logged_step(proc, workdir, step, timeout=180):
  wait_for(lambda: max(_logged_steps(workdir), default=0) >= step, proc, f'step {step} logged', timeout)


@pytest.mark.e2e
def test_sigterm_writes_a_checkpoint_before_exiting(tmp_path):
  """The interval (100,000 steps) is never reached, so the only checkpoint is the one SIGTERM asked for."""
  workdir = tmp_path / 'run'
  proc = subprocess.Popen(train_command(workdir, '--config.train.steps=200000', '--config.train.checkpoint_every=100000'),
                          stderr=subprocess.PIPE, text=True)
  _wait_for_logged_step(proc, workdir, 3)
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(timeout=120) == 143
  report = json.loads((workdir / 'report.json').read_text())
  assert report['status'] == 'preempted'
  saved = checkpoint.Checkpointer(workdir / 'checkpoints', keep=3, async_save=False).all_steps()
  assert saved == [report['steps']] and report['steps'] == max(_losses(workdir)) >= 3


def test_cli_rejects_bad_config_before_compiling(tmp_path):
  out = subprocess.run(train_command(tmp_path, '--config.model.window=0'), capture_output=True, text=True)
  assert out.returncode == 2
  assert 'config.model.window=0 is invalid' in out.stderr
  assert not (tmp_path / 'checkpoints').exists()


def test_cli_params_prints_the_study_counts():
  out = subprocess.run([sys.executable, '-m', 'hybrid_jax', 'params',
                        '--config=hybrid:arch=swa128,scale=s1'], capture_output=True, text=True)
  assert out.returncode == 0, out.stderr
  counts = json.loads(out.stdout)
  assert (counts['non_embedding'], counts['embedding'], counts['total']) == (14_999_424, 56_408_064, 71_407_488)
  unknown = subprocess.run([sys.executable, '-m', 'hybrid_jax', 'fly'], capture_output=True, text=True)
  assert unknown.returncode == 2 and "invalid choice: 'fly'" in unknown.stderr


@pytest.mark.e2e
def test_the_readme_main_job_trains_and_reports(tmp_path):
  """The README's main job, unchanged: the tiny SWA-128-NoPE hybrid on the built-in corpus."""
  out = subprocess.run([sys.executable, '-m', 'hybrid_jax', 'train', f'--workdir={tmp_path}'], capture_output=True,
                       text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-2000:]
  report = json.loads((tmp_path / 'report.json').read_text())
  assert report['name'] == 'swa128_nope_tiny' and report['status'] == 'completed' and report['steps'] == 300
  losses = _losses(tmp_path)  # The mean of each 10 steps (train.log_every), logged at steps 10, 20, ..., 300.
  assert sorted(losses) == list(range(10, 301, 10))
  last = np.mean([losses[s] for s in range(260, 301, 10)])
  # Measured: 2.24 over the last 5 intervals (steps 251-300), against 5.55 (uniform over 257 bytes) and 5.12 over
  # steps 1-10.
  assert last < np.log(257) - 2.5 and last < losses[10] - 1.5
  # Byte-level held-out loss well below uniform (ln 257 = 5.55); BENCHMARKS.md, "The main job on CPU" records 2.73.
  assert report['eval']['packed_loss'] < 3.0
  evals = [r['packed_loss'] for r in metrics.read_jsonl(tmp_path / 'metrics.jsonl') if r['kind'] == 'eval']
  assert len(evals) == 3 and evals[0] > evals[1] > evals[2]  # Held-out loss improves at every evaluation.
  assert len(report['eval']['loss_by_position']) == 8 and report['eval']['documents'] == 16
  assert (tmp_path / 'loss_curve.png').is_file()  # Its wall time is a measurement (BENCHMARKS.md), not a test.


def test_held_out_text_without_long_documents(small, tmp_path):
  """Too few held-out documents as long as the context stops the run before training, naming count and source;
  eval.documents = 0 trains and reports the packed held-out loss only."""
  corpus = tmp_path / 'short.jsonl'
  corpus.write_text(''.join(json.dumps({'text': f'short document {i}'}) + '\n' for i in range(40)))
  small.data.update(dict(source='files', paths=str(corpus), eval_fraction=0.5))
  small.train.update(dict(steps=2, warmup_steps=1))
  with pytest.raises(sources.DataError, match=r'only 0 of the \d+ held-out documents of FilesSource\(.*needs 16'):
    standard_hooks.train(small, tmp_path / 'refused')
  assert not list((tmp_path / 'refused').glob('checkpoints/*'))
  small.eval.documents = 0
  report = standard_hooks.train(small, tmp_path / 'packed_only')
  # Documents (the default packing): the targets counted are those inside their input's document.
  counted = sum(int(((b['segment_ids'] == b['target_segment_ids']) & (b['segment_ids'] > 0)).sum())
                for b in pipeline.make_eval_batches(small, small.eval.batches))
  assert report['eval']['packed_tokens'] == counted < small.eval.batches * small.train.batch_size * small.data.seq_len
  assert 'loss_by_position' not in report['eval'] and 'packed rows' in loop.summary_line(report)


def test_bfloat16_on_cpu_warns_and_float32_does_not(caplog):
  with caplog.at_level(logging.WARNING):
    loop.warn_if_slow_on_cpu(small_config(dtype='float32'))
    assert 'bfloat16' not in caplog.text
    loop.warn_if_slow_on_cpu(small_config(dtype='bfloat16'))
  assert 'model.dtype=bfloat16 on CPU' in caplog.text and 'float32' in caplog.text


def test_profiled_training_steps_write_a_trace_and_a_breakdown(tmp_path):
  c = small_config()
  c.train.update(dict(steps=5, checkpoint_every=5, profile_start=2, profile_steps=2))
  standard_hooks.train(c, tmp_path)
  result = json.loads((tmp_path / 'profile_breakdown.json').read_text())
  assert result['steps'] == 2 and result['first_step'] == 3
  parts = {r['part'] for r in result['parts']}
  assert {'block_swa_w16/mixer', 'block_full/mlp', 'lm_head', 'optimizer'} <= parts
  assert sum(r['share'] for r in result['parts']) == pytest.approx(1.0)
  assert pathlib.Path(result['trace']).is_relative_to(tmp_path / 'tensorboard' / 'plugins' / 'profile')


def test_profile_settings_are_validated():
  from hybrid_jax.config import ConfigError, validate
  for key, value in (('profile_start', -1), ('profile_steps', 0)):
    c = small_config()
    c.train[key] = value
    with pytest.raises(ConfigError, match=f'train.{key}'):
      validate(c)


def test_a_resumed_writer_keeps_one_record_per_step(tmp_path):
  """Steps 1-10 logged, the run resumed from its checkpoint at 7: metrics.jsonl and TensorBoard (its purge step)
  hold steps 8-10 once, the resumed run's values; a line cut short by a kill goes too."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  first = metrics.MetricsWriter(tmp_path)
  for step in range(1, 11):
    first.write(step, {'loss': float(step)}, prefix='train')
  first.close()
  with open(tmp_path / 'metrics.jsonl', 'a') as f:
    f.write('{"step": 11, "kind": "tr')
  resumed = metrics.MetricsWriter(tmp_path, resumed_from=7)
  for step in range(8, 11):
    resumed.write(step, {'loss': 100.0 + step}, prefix='train')
  resumed.close()
  records = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert [(r['step'], r['loss']) for r in records] == [(s, float(s)) for s in range(1, 8)] + [
      (s, 100.0 + s) for s in range(8, 11)]
  events = event_accumulator.EventAccumulator(str(tmp_path / 'tensorboard'))
  events.Reload()
  assert [(e.step, e.value) for e in events.Scalars('train/loss')] == [(s, float(s)) for s in range(1, 8)] + [
      (s, 100.0 + s) for s in range(8, 11)]
