"""Loss by position inside whole held-out documents: the document set, shared buckets, standard errors, plots."""

import json

import numpy as np
import pytest

from hybrid_jax.train import runs
from hybrid_jax.data import catalog, pipeline, sources
from hybrid_jax.eval import position
from hybrid_jax.train import step as step_lib
from tests.conftest import small_config

EOS = 256


@pytest.fixture
def mixed_corpus(tmp_path):
  """Held-out documents of 100, 48 and 12 bytes: the 48-byte ones lie between the contexts 32 and 64."""
  path = tmp_path / 'docs.jsonl'
  with open(path, 'w') as f:
    for i in range(60):
      size = (100, 48, 12)[i % 3]
      f.write(json.dumps({'text': (f'doc {i:02d} ' + 'abcdefghij' * 10)[:size]}) + '\n')
  return path


def _config(corpus):
  c = small_config()
  c.data.update(dict(source='files', paths=str(corpus), eval_fraction=0.5))
  return c


def _held_out_lengths(config):
  source = catalog.make_source(config.data, 'eval')
  return source, np.array([len(source[i].encode()) for i in range(len(source))])


def _reference_nll(model_def, params, rows):
  """float64 log-softmax NLL of a direct forward pass over [n, L + 1] token rows."""
  logits = np.asarray(model_def.bind(params)(rows[:, :-1]), np.float64)
  top = logits.max(-1, keepdims=True)
  log_z = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
  return log_z - np.take_along_axis(logits, rows[:, 1:, None], -1)[..., 0]


def test_held_out_documents_are_whole_documents_read_from_their_start(mixed_corpus):
  config = _config(mixed_corpus)
  source, lengths = _held_out_lengths(config)
  docs = pipeline.held_out_documents(config, 64, 6)
  assert docs.min_tokens == 64 and docs.tokens.shape == (6, 65) and docs.tokens.dtype == np.int32
  assert len(set(docs.ids)) == 6 and all(lengths[i] >= 64 for i in docs.ids)
  for i, row in zip(docs.ids, docs.tokens):
    assert row[0] == EOS
    np.testing.assert_array_equal(row[1:], np.frombuffer(source[i].encode(), np.uint8)[:64])
  assert docs.source == repr(source)
  again = pipeline.held_out_documents(config, 64, 6)
  assert again.ids == docs.ids  # A fixed order: the same documents on every call.
  assert pipeline.held_out_documents(config, 64, 3).ids == docs.ids[:3]


def test_too_few_long_documents_is_an_error_naming_count_and_source(mixed_corpus):
  config = _config(mixed_corpus)
  source, lengths = _held_out_lengths(config)
  long_enough = int((lengths >= 64).sum())
  with pytest.raises(sources.DataError) as e:
    pipeline.held_out_documents(config, 64, long_enough + 1)
  assert f'only {long_enough} of the {len(source)} held-out documents' in str(e.value)
  assert 'FilesSource(' in str(e.value) and f'needs {long_enough + 1}' in str(e.value)


def test_bucket_edges_are_shared_by_every_context():
  assert position.bucket_edges([512], 8) == list(range(0, 513, 64))
  assert position.bucket_edges([64, 32], 4) == [0, 8, 16, 24, 32, 64]
  assert position.bucket_edges([512, 4096, 3000], 2) == [0, 256, 512, 1024, 2048, 3000, 4096]


def test_curves_agree_below_the_shorter_context_on_the_same_documents(tiny_run, mixed_corpus):
  """One evaluation at contexts 32 and 64: the same document ids behind both, identical NLL at every position
  below 32 (a causal model), and every number equal to a direct forward pass over each document from its start."""
  config = _config(mixed_corpus)
  _, lengths = _held_out_lengths(config)
  assert ((lengths >= 32) & (lengths < 64)).any()  # Documents a per-context choice would have let in.
  run = runs.load_run(tiny_run)  # Trained a few steps: its loss depends on the text, unlike a fresh model's.
  model_def, params = run.model_def, run.params
  docs = pipeline.held_out_documents(config, 64, 5)
  result = position.evaluate(step_lib.make_eval_step(model_def), params, docs, [32, 64], batch_size=3)
  assert result.nll[32].shape == (5, 32) and result.nll[64].shape == (5, 64)
  np.testing.assert_allclose(result.nll[64][:, :32], result.nll[32], rtol=1e-5, atol=1e-6)
  summary = result.summary(4)
  assert summary['32']['document_ids'] == summary['64']['document_ids'] == docs.ids
  short, long = summary['32']['loss_by_position'], summary['64']['loss_by_position']
  assert [(b['start'], b['end']) for b in long] == [(0, 8), (8, 16), (16, 24), (24, 32), (32, 64)]
  for a, b in zip(short, long):
    assert (a['start'], a['end'], a['tokens']) == (b['start'], b['end'], b['tokens'])
    assert a['loss'] == pytest.approx(b['loss'], rel=1e-6) and a['stderr'] == pytest.approx(b['stderr'], abs=1e-6)
  reference = _reference_nll(model_def, params, docs.tokens)
  for length in (32, 64):
    r = summary[str(length)]
    assert r['documents'] == 5 and r['tokens'] == 5 * length
    assert r['loss'] == pytest.approx(reference[:, :length].mean(), rel=1e-5)
    for b in r['loss_by_position']:
      per_document = reference[:, b['start']:b['end']].mean(axis=1)
      assert b['loss'] == pytest.approx(per_document.mean(), rel=1e-5)
      assert b['stderr'] == pytest.approx(np.std(per_document, ddof=1) / np.sqrt(5), abs=1e-5)
      assert b['tokens'] == 5 * (b['end'] - b['start'])
  with pytest.raises(ValueError, match=r'\[128\] exceed the 64 tokens'):
    position.evaluate(step_lib.make_eval_step(model_def), params, docs, [128], batch_size=3)


def _summary(length, documents=7):
  edges = position.bucket_edges([length], 4)
  return {'documents': documents, 'loss_by_position': [
      {'start': a, 'end': b, 'loss': 3.0 - 0.1 * i, 'stderr': 0.05} for i, (a, b) in enumerate(zip(edges, edges[1:]))]}


@pytest.mark.parametrize('lengths, scale', [((512, 1024), 'linear'), ((512, 4096), 'log')])
def test_plot_scales_the_axis_by_span_and_shows_bands_and_document_count(lengths, scale):
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  ax = Figure().subplots()
  position.plot(ax, {f'context {n}': _summary(n) for n in lengths})
  assert ax.get_xscale() == scale
  assert len(ax.collections) == len(lengths)  # One standard-error band per curve.
  assert all('7 documents' in t.get_text() for t in ax.get_legend().get_texts())
