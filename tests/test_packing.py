"""data.packing: 'documents' batches say where each packed document lies (segment ids, positions), 'concat' batches
are the plain token stream, exactly as the pipeline packed before the key existed."""

import json

import grain
import numpy as np
import pytest

from hybrid_jax.config import ConfigError, validate
from hybrid_jax.data import pipeline
from hybrid_jax.train import runs
from tests.cli_walk import assert_one_line, run_main
from tests.test_data import EOS, assert_batches_equal, corpus, make_config, take  # pylint: disable=unused-import
from tests.test_recall import recall_config

KEYS = {'concat': {'inputs', 'targets'},
        'documents': {'inputs', 'targets', 'segment_ids', 'positions', 'target_segment_ids'}}


def assert_documents_follow_eos(batches):
  """In every row a document starts at the row's start and right after each EOS: segment ids count documents from
  1 there and positions restart at 0; targets carry the ids of the row shifted by one, so exactly the targets
  after an EOS fall outside their input's document."""
  for b in batches:
    assert set(b) == KEYS['documents'] and all(v.dtype == np.int32 and v.shape == b['inputs'].shape
                                               for v in b.values())
    for r in range(len(b['inputs'])):
      row = np.concatenate([b['inputs'][r], b['targets'][r][-1:]])
      starts = np.concatenate([[True], row[:-1] == EOS])
      segments = np.cumsum(starts)
      index = np.arange(len(row))
      positions = index - np.maximum.accumulate(np.where(starts, index, 0))
      np.testing.assert_array_equal(b['segment_ids'][r], segments[:-1])
      np.testing.assert_array_equal(b['target_segment_ids'][r], segments[1:])
      np.testing.assert_array_equal(b['positions'][r], positions[:-1])
      counted = (b['segment_ids'][r] == b['target_segment_ids'][r]) & (b['segment_ids'][r] != 0)
      np.testing.assert_array_equal(counted, b['inputs'][r] != EOS)


def test_segment_ids_and_positions_follow_the_eos_tokens():
  c = make_config(batch_size=8, long_short_ratio=0.05)  # Mostly documents shorter than a row.
  c.data.seq_len = 32
  batches = take(iter(pipeline.make_train_dataset(c)), 40)
  assert sum(int((b['inputs'] == EOS).sum()) for b in batches) > 20  # Many rows hold several documents.
  assert_documents_follow_eos(batches)
  assert_documents_follow_eos(pipeline.make_eval_batches(c, 3))


def test_a_document_cut_by_a_row_end_continues_as_the_next_rows_first_segment(corpus):
  """grain numbers each row's pieces afresh: the tail of a cut document is segment 1 with positions from 0."""
  c = make_config(source='files', paths=str(corpus), long_short_ratio=0.0, shuffle=False)
  rows = [(b['inputs'][r], b['segment_ids'][r], b['positions'][r], b['targets'][r][-1])
          for b in take(iter(pipeline.make_train_dataset(c)), 3) for r in range(4)]
  cut = [row for prev, row in zip(rows, rows[1:]) if prev[3] != EOS]  # The row continues the previous one's.
  assert cut
  for inputs, segments, positions, _ in cut:
    assert segments[0] == 1 and positions[0] == 0 and inputs[0] != ord('L') and inputs[0] != ord('S')


@pytest.mark.e2e
def test_grain_worker_processes_carry_the_documents(corpus):
  c = make_config(source='files', paths=str(corpus), long_doc_min_tokens=50, worker_count=2)
  it = iter(pipeline.make_train_dataset(c))
  try:
    assert_documents_follow_eos(take(it, 6))
  finally:
    it.close()


def test_every_recall_row_is_one_document():
  config = recall_config(text_fraction=0.3)
  for b in take(iter(pipeline.make_train_dataset(config)), 2):
    assert set(b) == KEYS['documents']
    np.testing.assert_array_equal(b['segment_ids'], np.ones_like(b['inputs']))
    np.testing.assert_array_equal(b['target_segment_ids'], np.ones_like(b['inputs']))
    np.testing.assert_array_equal(b['positions'], np.broadcast_to(np.arange(b['inputs'].shape[1]), b['inputs'].shape))


def _pack_and_batch_as_before(docs, seq_len, batch_size, packing):
  """The pipeline's packing before data.packing existed, written out: the reference for 'concat'."""
  assert packing == 'concat'
  rows = grain.experimental.ConcatThenSplitIterDataset(docs.map(pipeline._as_row),
                                                       length_struct={'tokens': seq_len + 1})
  rows = rows.filter(pipeline._is_full).map(lambda row: row['tokens'])
  return rows.batch(batch_size, drop_remainder=True).map(
      lambda r: {'inputs': np.ascontiguousarray(r[:, :-1]), 'targets': np.ascontiguousarray(r[:, 1:])})


def _concat_batches(source, corpus):
  c = make_config(packing='concat', source=source, paths=str(corpus), long_doc_min_tokens=50)
  return (take(iter(pipeline.make_train_dataset(c)), 6)
          + take(iter(pipeline.make_train_dataset(c, process_index=1, process_count=2)), 3)
          + pipeline.make_eval_batches(c, 2))


@pytest.mark.parametrize('source', ['builtin', 'files'])
def test_concat_batches_are_the_old_ones(corpus, monkeypatch, source):
  new = _concat_batches(source, corpus)
  with monkeypatch.context() as patch:
    patch.setattr(pipeline, '_pack_and_batch', _pack_and_batch_as_before)
    old = _concat_batches(source, corpus)
  assert all(set(b) == KEYS['concat'] for b in new)
  assert_batches_equal(new, old)
  for a, b in zip(new, old):
    assert all(a[k].dtype == b[k].dtype == np.int32 for k in a)


@pytest.mark.parametrize('packing', ['documents', 'concat'])
@pytest.mark.parametrize('process_index, process_count', [(0, 1), (1, 2)])
def test_resume_gives_the_same_batches_with_every_key(corpus, packing, process_index, process_count):
  c = make_config(packing=packing, source='files', paths=str(corpus), long_doc_min_tokens=50)
  make = lambda: iter(pipeline.make_train_dataset(c, process_index=process_index, process_count=process_count))
  it = make()
  take(it, 5)
  state = it.get_state()
  expected = take(it, 4)
  restored = make()
  restored.set_state(state)
  assert all(set(b) == KEYS[packing] for b in expected)
  assert_batches_equal(take(restored, 4), expected)


def test_a_bad_packing_name_is_one_error_line(tmp_path, capsys):
  c = make_config(packing='rows')
  with pytest.raises(ConfigError, match=r"^config.data.packing='rows' is invalid: allowed: documents, concat$"):
    validate(c)
  with pytest.raises(ConfigError, match=r"config.data.packing='rows' is invalid"):
    pipeline.make_train_dataset(c)
  status, err = run_main(['train', '--config.data.packing=rows', f'--workdir={tmp_path / "run"}'], capsys)
  assert_one_line(status, err, "config.data.packing='rows'", 'allowed: documents, concat')


def test_a_run_saved_before_the_key_loads_with_concat(tmp_path, caplog):
  saved = json.loads(make_config().to_json_best_effort())
  del saved['data']['packing']
  (tmp_path / 'config.json').write_text(json.dumps(saved))
  assert runs.load_config(tmp_path).data.packing == 'concat' and 'data.packing' in caplog.text
  saved['data']['packing'] = 'documents'
  (tmp_path / 'config.json').write_text(json.dumps(saved))
  assert runs.load_config(tmp_path).data.packing == 'documents'
