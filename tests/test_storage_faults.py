"""A full disk (or a file that stops being writable) mid-run ends the run at once with one line naming the file and
the cause, never a hang; after space is freed, the same command resumes bit for bit."""

import errno

import pytest
from tensorboardX import record_writer

from hybrid_jax import standard_hooks
from hybrid_jax.train import metrics
from tests.conftest import small_config


def _losses(workdir):
  return {r['step']: r['loss'] for r in metrics.read_jsonl(workdir / 'metrics.jsonl') if r['kind'] == 'train'}


def _disk_full(*args, **kwargs):
  raise OSError(errno.ENOSPC, 'No space left on device')


class _FailingFile:
  """A file object whose writes fail with ENOSPC (the JSONL metrics file on a full disk)."""

  def __init__(self, f):
    self._f = f

  def write(self, text):
    _disk_full()

  def __getattr__(self, name):
    return getattr(self._f, name)


def _fail_at(monkeypatch, writer_kind: str, step: int):
  """Makes every metrics write from `step` on fail in `writer_kind` ('tensorboard' or 'jsonl')."""
  original = metrics.MetricsWriter.write

  def write(self, at, values, *, prefix):
    if at >= step:
      if writer_kind == 'tensorboard':
        monkeypatch.setattr(record_writer.RecordWriter, 'write', _disk_full)
      else:
        self._jsonl = _FailingFile(self._jsonl)
    return original(self, at, values, prefix=prefix)
  monkeypatch.setattr(metrics.MetricsWriter, 'write', write)


@pytest.mark.e2e
@pytest.mark.parametrize('writer_kind, path', [('tensorboard', 'tensorboard'), ('jsonl', 'metrics.jsonl')])
def test_a_full_disk_stops_the_run_with_one_line_and_the_rerun_resumes_bit_for_bit(tmp_path, monkeypatch,
                                                                                   writer_kind, path):
  config = small_config()
  reference = standard_hooks.train(config, tmp_path / 'reference')
  run = tmp_path / 'run'
  with monkeypatch.context() as patch:
    _fail_at(patch, writer_kind, 6)
    with pytest.raises(metrics.StorageError) as error:
      standard_hooks.train(config, run)
  message = str(error.value)
  assert '\n' not in message and 'No space left on device' in message and str(run / path) in message
  assert 'at step 6' in message and 'the newest checkpoint (step 4) is kept' in message
  resumed = standard_hooks.train(config, run)
  assert resumed['status'] == 'completed'
  assert _losses(run) == _losses(tmp_path / 'reference')
  assert resumed['eval']['packed_loss'] == reference['eval']['packed_loss']


def test_the_writer_says_which_file_failed_and_closes_quietly_after(tmp_path, monkeypatch):
  writer = metrics.MetricsWriter(tmp_path)
  writer.write(1, {'loss': 1.0}, prefix='train')
  monkeypatch.setattr(record_writer.RecordWriter, 'write', _disk_full)
  monkeypatch.setattr(record_writer.RecordWriter, 'flush', _disk_full)
  with pytest.raises(metrics.StorageError, match='cannot write the TensorBoard events to .*tensorboard: No space'):
    writer.write(2, {'loss': 2.0}, prefix='train')
  writer.close()  # the failure was already reported; closing does not raise a second one
  assert [r['step'] for r in metrics.read_jsonl(tmp_path / 'metrics.jsonl')] == [1, 2]  # the JSONL record was kept
