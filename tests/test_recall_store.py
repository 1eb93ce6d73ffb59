"""Recall documents generated ahead (hybrid_jax.data.recall_store) and the order training reads documents in."""

import itertools
import logging
import pickle

import numpy as np
import pytest

from hybrid_jax import cores
from hybrid_jax.data import pipeline, recall, recall_store
from tests.test_recall import recall_config


def _config(**fields):
  c = recall_config(text_fraction=0.3, **fields)
  c.train.batch_size = 4
  return c


def _batches(config, n):
  return list(itertools.islice(iter(pipeline.make_train_dataset(config)), n))


def _generated(config, split='train'):
  return recall.RecallSource(config.data, split, use_store=False)


def test_training_reads_documents_in_the_order_of_training_document_indices():
  config = _config()
  config.seed = 3
  indices = pipeline.training_document_indices(config, 12)
  assert len(set(indices.tolist())) == 12 and sorted(indices.tolist()) != indices.tolist()  # Shuffled.
  rows = np.concatenate([b['inputs'] for b in _batches(config, 3)])
  source = _generated(config)
  for row, index in zip(rows, indices):  # Every document is one row (test_recall).
    assert bytes(row.astype(np.uint8)).decode('ascii') == source[int(index)]
  config.seed = 4
  assert pipeline.training_document_indices(config, 12).tolist() != indices.tolist()


def test_a_store_holds_the_generated_text_and_training_reads_it_unchanged(tmp_path, monkeypatch):
  config = _config()
  indices = pipeline.training_document_indices(config, 40)
  path = recall.build_store(config.data, 'train', indices[:30], tmp_path)
  store = recall_store.load(tmp_path, recall.settings(config.data), 'train')
  source = _generated(config)
  assert path.exists() and sorted(store.indices.tolist()) == sorted(indices[:30].tolist())
  for index in indices[:30]:
    assert store.get(int(index)) == source[int(index)]
  assert store.get(int(indices[35])) is None  # Not stored: the source generates it.
  without = _batches(config, 10)
  monkeypatch.setenv(recall_store.ENV, str(tmp_path))
  with_store = _batches(config, 10)  # 40 documents: 30 from the store, 10 generated.
  for a, b in zip(without, with_store):
    np.testing.assert_array_equal(a['inputs'], b['inputs'])
    np.testing.assert_array_equal(a['targets'], b['targets'])


def test_the_source_serves_stored_text_and_only_its_own_settings_split(tmp_path, monkeypatch, caplog):
  config = _config()
  settings = recall.settings(config.data)
  recall.build_store(config.data, 'train', [5, 9], tmp_path)
  path = recall_store.path_for(tmp_path, settings, 'train')
  with np.load(path) as f:
    fields = dict(f)
  fields['texts'][0] = np.frombuffer(b'Z' * settings.length, np.uint8)  # Marks document 5 as read from the store.
  np.savez(path, **fields)
  monkeypatch.setenv(recall_store.ENV, str(tmp_path))
  source = recall.RecallSource(config.data, 'train')
  assert source[5] == 'Z' * settings.length
  assert pickle.loads(pickle.dumps(source))[5] == 'Z' * settings.length  # As grain's worker processes get it.
  assert recall.RecallSource(config.data, 'train')[9] == _generated(config)[9]
  assert recall.RecallSource(config.data, 'eval')[5] == _generated(config, 'eval')[5]  # Other split: no store.
  other = _config(seed=7)
  assert recall.RecallSource(other.data, 'train')[5] == _generated(other)[5]  # Other settings: no store.
  # A store whose recorded settings differ from its name's is not used.
  fields['key'] = np.asarray(recall_store.key_of(recall.settings(other.data), 'train'))
  np.savez(path, **fields)
  with caplog.at_level(logging.WARNING):
    assert recall.RecallSource(config.data, 'train')[5] == _generated(config)[5]
  assert 'built for other settings' in caplog.text
  path.write_bytes(b'not a store')
  with caplog.at_level(logging.WARNING):
    assert recall.RecallSource(config.data, 'train')[5] == _generated(config)[5]
  assert 'unreadable' in caplog.text


def test_building_again_adds_only_missing_documents(tmp_path, monkeypatch):
  config = _config()
  recall.build_store(config.data, 'train', [3, 1, 2], tmp_path)
  path = recall_store.path_for(tmp_path, recall.settings(config.data), 'train')
  with np.load(path) as f:
    fields = dict(f)
  fields['texts'][0] = np.frombuffer(b'Z' * 256, np.uint8)  # Document 1 as stored: kept, not generated again.
  np.savez(path, **fields)
  recall.build_store(config.data, 'train', [2, 40, 1], tmp_path)
  store = recall_store.load(tmp_path, recall.settings(config.data), 'train')
  assert store.indices.tolist() == [1, 2, 3, 40]
  assert store.get(1) == 'Z' * 256 and store.get(40) == _generated(config)[40]


@pytest.mark.e2e
def test_a_store_built_by_worker_processes_equals_one_built_here(tmp_path, monkeypatch):
  monkeypatch.setattr(recall_store, 'PER_WORKER', 10)
  config = _config()
  indices = pipeline.training_document_indices(config, 30)
  recall.build_store(config.data, 'train', indices, tmp_path / 'two', workers=2)
  recall.build_store(config.data, 'train', indices, tmp_path / 'one', workers=1)
  settings = recall.settings(config.data)
  two, one = (recall_store.load(tmp_path / d, settings, 'train') for d in ('two', 'one'))
  np.testing.assert_array_equal(two.indices, one.indices)
  np.testing.assert_array_equal(two.texts, one.texts)


@pytest.mark.parametrize('available, threads', [({0}, 0), ({0, 1}, pipeline._READ_THREADS)])
def test_documents_are_read_in_the_consuming_thread_on_one_core(monkeypatch, available, threads):
  monkeypatch.setattr(cores, 'available', lambda: available)
  assert pipeline._read_options().num_threads == threads
