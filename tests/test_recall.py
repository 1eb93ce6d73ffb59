"""The synthetic recall source (hybrid_jax.data.recall) and its scoring (hybrid_jax.eval.recall)."""

import dataclasses
import pickle
import re
import string

import numpy as np
import pytest
from scipy import stats

from hybrid_jax.config import ConfigError, validate
from hybrid_jax.data import pipeline, recall
from hybrid_jax.eval import recall as recall_eval
from tests.test_data import assert_resumes_exactly, make_config

RANGES = ((5, 12), (30, 60), (100, 180))
WEIGHTS = (1.0, 2.0, 1.0)


def recall_config(**fields):
  c = make_config(source='recall', long_short_ratio=0.0)
  c.data.seq_len = 256
  c.data.recall.update(dict(distance_ranges=RANGES, distance_weights=WEIGHTS, text_fraction=0.0, pairs=6,
                            documents=5000))
  c.data.recall.update(fields)
  return c


def recall_documents(source, n):
  return [source.document(i) for i in range(n)]


def test_distances_follow_the_configured_distribution():
  source = recall.RecallSource(recall_config().data, 'train')
  distances = np.array([q.distance for d in recall_documents(source, 600) for q in d.queries])  # 3600 queries
  bucket = np.full(distances.shape, -1)
  for j, (lo, hi) in enumerate(RANGES):
    bucket[(distances >= lo) & (distances <= hi)] = j
  assert (bucket >= 0).all()  # Every distance lies in a configured range.
  # Range counts against the weights, then distances inside each range against the uniform: chi-square tests at
  # p > 0.001. Under a correct generator the statistic is chi-square distributed, so a random seed fails with
  # probability 0.001; the seed is fixed, so the test is deterministic. Weights (1, 2, 2) instead of (1, 2, 1), or a
  # triangular draw inside a range, give p < 1e-10 at this sample size.
  counts = np.bincount(bucket, minlength=len(RANGES))
  expected = np.asarray(WEIGHTS) / sum(WEIGHTS) * len(distances)
  assert stats.chisquare(counts, expected).pvalue > 1e-3, counts
  for j, (lo, hi) in enumerate(RANGES):
    inside = np.bincount(distances[bucket == j] - lo, minlength=hi - lo + 1)
    assert stats.chisquare(inside).pvalue > 1e-3, (j, inside)


def test_the_answer_is_recoverable_only_from_its_stated_position():
  config = recall_config(key_length=2, key_chars=5, value_length=3)
  source = recall.RecallSource(config.data, 'train')
  s = source.settings
  for doc in recall_documents(source, 200):
    assert doc.kind == 'recall' and len(doc.text) == 256 and doc.text.isascii()
    assert len(doc.queries) == s.pairs and len({q.key for q in doc.queries}) == s.pairs
    upper = [i for i, c in enumerate(doc.text) if c in string.ascii_uppercase]
    keys = sorted(p for q in doc.queries for p in (q.pair + s.value_length, q.query))
    # Upper-case letters occur only as the keys of records: the pair and the query of each key, nowhere else.
    assert upper == sorted(p + k for p in keys for k in range(s.key_length))
    for q in doc.queries:
      assert len(q.key) == 2 and set(q.key) <= set('ABCDE') and len(q.value) == 3
      assert doc.text.count(q.key) == 2 and doc.text.find(q.key) == q.pair + 3  # Once before its query.
      assert doc.text[q.pair:q.pair + s.record] == q.value + q.key
      assert doc.text[q.query:q.query + s.record] == q.key + q.value
      # Distance: from the pair's last key character to the query's, both counted.
      assert q.distance == (q.query + 1) - (q.pair + 3 + 1) + 1
      assert ''.join(doc.text[i] for i in q.source_positions()) == q.value
      # Teacher forcing: the input at answer position m is followed by answer byte m.
      assert ''.join(doc.text[i + 1] for i in q.answer_positions()) == q.value
      assert doc.text[q.answer_positions()[0]] == q.key[-1]


def test_random_filler_hides_the_answer_among_digits():
  """With filler_random digits, the records and queries are where the document says, every other position holds a
  digit drawn uniformly from filler_random (so a value cannot be found by its type), and keys are still unique."""
  config = recall_config(filler_random='0123456789')
  source = recall.RecallSource(config.data, 'train')
  filler = []
  for doc in recall_documents(source, 300):
    record_cells = set()
    for q in doc.queries:
      assert doc.text[q.pair:q.pair + 3] == q.value + q.key and doc.text[q.query:q.query + 3] == q.key + q.value
      assert doc.text.count(q.key) == 2
      record_cells |= set(range(q.pair, q.pair + 3)) | set(range(q.query, q.query + 3))
    filler += [c for i, c in enumerate(doc.text) if i not in record_cells]
  counts = np.bincount(np.frombuffer(''.join(filler).encode(), np.uint8) - ord('0'), minlength=10)
  assert counts.sum() == len(filler) and len(counts) == 10  # Only digits between the records.
  assert stats.chisquare(counts).pvalue > 1e-3, counts  # Uniform (p 0.001 at a fixed seed: deterministic).
  assert recall.RecallSource(config.data, 'train')[5] == source[5]  # Still a pure function of the index.
  assert source[5] != recall.RecallSource(recall_config().data, 'train')[5]


def test_distractor_records_are_never_asked_and_break_the_nearest_record_rule():
  """Distractor records look like every other record (`VALUEKEY`, keys unique in the document) but their keys are
  never asked; the queries are where they were. With them, the nearest record not asked yet before a query is often
  a distractor, so that rule no longer names the answer."""
  config = recall_config(key_length=2, key_chars=5, distractors=3)
  source = recall.RecallSource(config.data, 'train')
  s = source.settings
  nearest_is_own = [0, 0]
  for doc in recall_documents(source, 300):
    asked = {q.key for q in doc.queries}
    keys = [m.group() for m in re.finditer('[A-Z]+', doc.text)]
    assert all(len(k) == 2 for k in keys)
    assert len(keys) == 2 * s.pairs + 3 and len(set(keys)) == s.pairs + 3  # Asked keys twice, distractors once.
    for key in set(keys) - asked:
      i = doc.text.index(key)
      assert doc.text[i - 2:i].isdigit()  # Its value, then the key: a record like any other.
    for q in doc.queries:
      assert doc.text[q.pair:q.pair + 4] == q.value + q.key and doc.text[q.query:q.query + 4] == q.key + q.value
      records = [doc.text.index(k) - 2 for k in set(keys) - {r.key for r in doc.queries if r.query < q.query}]
      before = [p for p in records if p < q.query]
      nearest_is_own[0] += max(before) == q.pair
      nearest_is_own[1] += 1
  without = recall.RecallSource(recall_config(key_length=2, key_chars=5).data, 'train')
  own_without = np.mean([max(r.pair for r in d.queries if r.query >= q.query and r.pair < q.query) == q.pair
                         for d in recall_documents(without, 300) for q in d.queries])
  assert nearest_is_own[0] / nearest_is_own[1] < own_without - 0.1, (nearest_is_own, own_without)


def test_no_distractors_leaves_the_documents_as_they_were():
  base = recall.RecallSource(recall_config().data, 'train')
  explicit = recall.RecallSource(recall_config(distractors=0).data, 'train')
  assert [base[i] for i in range(50)] == [explicit[i] for i in range(50)]


def test_documents_are_deterministic_and_splits_differ():
  config = recall_config(text_fraction=0.5)
  a, b = recall.RecallSource(config.data, 'train'), recall.RecallSource(config.data, 'train')
  assert repr(a) == repr(b) and 'RecallSource' in repr(a)
  for i in (0, 7, 4999, 123):
    assert a[i] == b[i] == pickle.loads(pickle.dumps(a))[i]
  held = recall.RecallSource(config.data, 'eval')
  assert len(held) == 100  # ceil(5000 * eval_fraction 0.02)
  assert [held[i] for i in range(20)] != [a[i] for i in range(20)]
  kinds = [a.document(i).kind for i in range(400)]
  assert 150 < kinds.count('text') < 250  # Binomial(400, 0.5): mean 200, sd 10.
  for i in range(40):
    assert len(a[i]) == 256 and a[i].isascii()
  config.data.recall.seed = 1
  assert [recall.RecallSource(config.data, 'train')[i] for i in range(5)] != [a[i] for i in range(5)]


def test_every_training_row_is_one_document():
  config = recall_config(text_fraction=0.3)
  config.train.batch_size = 4
  source = recall.RecallSource(config.data, 'train')
  texts = {source[i] for i in range(len(source))}
  it = iter(pipeline.make_train_dataset(config))
  for _ in range(3):
    b = next(it)
    assert (b['targets'][:, -1] == 256).all()  # Each row ends with its document's EOS.
    for row in b['inputs']:
      assert bytes(row.astype(np.uint8)).decode('ascii') in texts


def test_resume_mid_stream_gives_the_same_documents():
  assert_resumes_exactly(recall_config(text_fraction=0.25), 3)


@pytest.mark.parametrize('field, value, match', [
    ('distance_ranges', ((2, 10),), 'distance_ranges'),  # below key_length + 2
    ('distance_ranges', ((30, 253),), 'distance_ranges'),  # above seq_len - key_length - 2 * value_length + 1
    ('distance_ranges', (5, 10), 'distance_ranges'),
    ('distance_weights', (1.0,), 'distance_weights'),
    ('pairs', 30, 'pairs'),
    ('text_fraction', 1.0, 'text_fraction'),
    ('key_chars', 27, 'key_chars'),
    ('filler', 'the Sky is blue', 'filler'),
    ('filler', '', 'filler'),
    ('filler_random', 'abC', 'filler_random'),
    ('distractors', -1, 'distractors'),
    ('distractors', 30, 'pairs'),  # no room: (2 * 6 + 30) * 4 > 128
    ('filler_random', 'äö', 'filler_random'),
    ('pairs_min', 7, 'pairs_min'),  # more than pairs
    ('pairs_min', -1, 'pairs_min'),
    ('eval_pairs', 7, 'eval_pairs'),
    ('record_gap', 200, 'record_gap'),  # a record longer than the row allows
    ('record_gap', -1, 'record_gap'),
    ('haystack', 'prose', 'haystack'),
])
def test_bad_settings_name_the_field(field, value, match):
  c = recall_config()
  c.data.recall[field] = value
  with pytest.raises(ConfigError, match=f'config.data.recall.{match}'):
    validate(c)


def test_bad_combinations_name_the_key_in_one_line():
  cases = [(dict(pairs=20, pairs_min=2), 'pairs='),  # a range whose most pairs do not fit the row
           (dict(record_gap=20), 'pairs='),  # the gap fits alone, not with six pairs
           (dict(haystack='text', filler_random='abc'), 'haystack=')]
  for fields, key in cases:
    with pytest.raises(ConfigError) as error:
      validate(recall_config(**fields))
    assert f'config.data.recall.{key}' in str(error.value) and '\n' not in str(error.value), fields


def test_recall_needs_the_byte_tokenizer():
  c = recall_config()
  c.data.tokenizer = 'tok.model'
  with pytest.raises(ConfigError, match='config.data.tokenizer'):
    validate(c)


def test_score_by_bucket_hand_computed():
  # Edges (0, 16, 128): bucket 0 holds distances 1..16 (a 16-token window sees them), bucket 1 holds 17..128.
  # Two answer bytes per query; a query is correct when both are.
  byte_correct = np.array([[[1, 1], [1, 0], [1, 1]], [[1, 1], [1, 1], [0, 0]]], bool)
  distances = np.array([[16, 17, 3], [128, 200, 40]])
  result = recall_eval.score(byte_correct, distances, [0, 16, 128])
  assert result['accuracy'] == pytest.approx(4 / 6) and result['queries'] == 6
  assert result['byte_accuracy'] == pytest.approx(9 / 12)
  assert result['buckets'] == [
      {'low': 0, 'high': 16, 'queries': 2, 'correct': 2, 'accuracy': 1.0, 'byte_accuracy': 1.0},  # 16 and 3
      {'low': 16, 'high': 128, 'queries': 3, 'correct': 1, 'accuracy': pytest.approx(1 / 3),
       'byte_accuracy': pytest.approx(3 / 6)},  # 17, 128, 40
  ]  # 200 lies beyond the last edge: counted overall, in no bucket.
  assert recall_eval.score(byte_correct, distances, [0, 2, 3])['buckets'][0]['accuracy'] is None


def test_held_out_arrays_match_the_documents():
  c = recall_config(text_fraction=0.5)
  held = recall_eval.held_out(c.data, 5)
  source = recall.RecallSource(c.data, 'eval')
  for n, i in enumerate(held.ids):
    doc = source.document(i)
    assert doc.kind == 'recall'
    assert bytes(held.tokens[n].astype(np.uint8)).decode() == doc.text
    for j, q in enumerate(doc.queries):
      assert held.distances[n, j] == q.distance
      assert ''.join(map(chr, held.answers[n, j])) == q.value
      assert ''.join(doc.text[p + 1] for p in held.answer_positions[n, j]) == q.value


def test_recall_eval_matches_the_model_forward(tiny_recall_model):
  """Correct = argmax of the model's own forward pass at every answer position; the record mass is a fraction."""
  model_def, params, c = tiny_recall_model
  held = recall_eval.held_out(c.data, 6)
  edges = [0, 8, 30, 60]
  result = recall_eval.RecallEval(model_def, c.model, held, edges, batch_size=4)(params)
  logits = np.asarray(model_def.bind(params)(held.tokens))
  pred = np.take_along_axis(logits.argmax(-1)[:, None, :], held.answer_positions.reshape(6, 1, -1), 2)
  pred = pred.reshape(held.answers.shape)
  assert result == {**recall_eval.score(pred == held.answers, held.distances, edges), 'layers': result['layers']}
  # With the model's own predictions as answers every query is right; predictions at other positions differ
  # (init_std 0.5 makes them vary), so an off-by-one in the scored positions would fail here.
  own = recall_eval.RecallEval(model_def, c.model, dataclasses.replace(held, answers=pred), edges)(params)
  assert own['accuracy'] == 1.0
  shifted = np.take_along_axis(logits.argmax(-1)[:, None, :], held.answer_positions.reshape(6, 1, -1) + 1, 2)
  assert (shifted.reshape(pred.shape) != pred).any()
  assert [l['index'] for l in result['layers']] == [0, 1]
  for layer in result['layers']:
    assert all(0.0 <= m <= 1.0 for bucket in layer['mass'] for m in bucket)


@pytest.fixture(scope='module')
def tiny_recall_model():
  from hybrid_jax.train import state
  from tests.conftest import small_config
  c = small_config(init_std=0.5)  # 64-token rows; large weights so predictions vary with the input
  c.data.update(recall_config().data)
  c.data.seq_len = 64
  c.data.recall.update(dict(distance_ranges=((4, 8), (12, 30), (34, 60)), pairs=2))
  validate(c)
  model_def, params = state.init_model(c.model, 0)
  return model_def, params, c


def test_probe_metrics_flatten_buckets_and_layers():
  from hybrid_jax.analysis import callbacks
  c = recall_config()
  assert callbacks.recall_edges(c.data.recall.distance_ranges) == [0, 12, 60, 180]
  result = {'accuracy': 0.5, 'buckets': [{'low': 0, 'high': 12, 'accuracy': 1.0}, {'low': 12, 'high': 60,
                                                                                   'accuracy': None}],
            'layers': [{'index': 1, 'mass': [[0.2, 0.7], None]}]}
  assert callbacks.recall_metrics(result) == {'recall_accuracy': 0.5, 'recall_accuracy_0_12': 1.0,
                                              'recall_mass_layer1_0_12': 0.7}


# Options that load the recurrent state: a range of pairs, 2-letter keys, a gap inside the record, a text haystack.

def _record_positions(doc, s):
  """{position: character} of every queried record and query of a recall document, from its queries alone."""
  out = {}
  for q in doc.queries:
    out.update({q.pair + m: c for m, c in enumerate(q.value)})
    out.update({q.pair + s.value_length + s.record_gap + m: c for m, c in enumerate(q.key)})
    out.update({q.query + m: c for m, c in enumerate(q.key + q.value)})
  return out


def _runs(positions):
  """Consecutive runs of the sorted positions, as lists."""
  out = []
  for p in sorted(positions):
    if out and p == out[-1][-1] + 1:
      out[-1].append(p)
    else:
      out.append([p])
  return out


def test_a_range_of_pairs_mixes_training_documents_and_held_out_ones_do_not():
  config = recall_config(pairs=5, pairs_min=2, distractors=1)
  train = recall.RecallSource(config.data, 'train')
  counts = np.bincount([len(d.queries) for d in recall_documents(train, 800)], minlength=6)
  assert counts[:2].sum() == 0 and counts[2:].min() > 0  # every count from 2 to 5, nothing else
  assert stats.chisquare(counts[2:]).pvalue > 1e-3, counts  # drawn uniformly
  for doc in recall_documents(train, 100):
    assert len(re.findall('[A-Z]', doc.text)) == 2 * len(doc.queries) + 1  # each pair twice, the distractor once
  held = recall.RecallSource(config.data, 'eval')
  assert {len(held.document(i).queries) for i in range(len(held))} == {5}
  one = recall.RecallSource(recall_config(pairs=5, pairs_min=2, eval_pairs=1).data, 'eval')
  assert {len(one.document(i).queries) for i in range(len(one))} == {1}
  # pairs_min = pairs draws nothing more: the documents are those of a fixed count, under the same store key.
  fixed = recall.RecallSource(recall_config(pairs=5, pairs_min=5).data, 'train')
  plain = recall.RecallSource(recall_config(pairs=5).data, 'train')
  assert [fixed[i] for i in range(30)] == [plain[i] for i in range(30)]
  assert repr(plain.settings) == repr(fixed.settings).replace(', pairs_min=5', '') and 'pairs_min' not in repr(plain)


def test_two_letter_keys_give_hundreds_of_keys_each_unique_in_its_document():
  source = recall.RecallSource(recall_config(key_length=2, key_chars=16, distractors=2).data, 'train')
  seen = set()
  for doc in recall_documents(source, 300):
    keys = re.findall('[A-Z]+', doc.text)
    assert all(len(k) == 2 and set(k) <= set('ABCDEFGHIJKLMNOP') for k in keys)
    assert len(set(keys)) == len(doc.queries) + 2 and len(keys) == 2 * len(doc.queries) + 2
    seen |= set(keys)
  assert len(seen) > 240  # of 16 x 16 = 256


def test_a_record_gap_puts_haystack_between_value_and_key_beyond_the_conv():
  conv = validate(recall_config()).model.gdn.conv_width  # GDN's and Mamba-2's short convolution: 4
  gap = conv + 1
  source = recall.RecallSource(recall_config(key_length=2, key_chars=16, record_gap=gap, distractors=2,
                                             pairs=4).data, 'train')
  s = source.settings
  assert s.record == 2 + gap + 2 and s.query_length == 4
  for doc in recall_documents(source, 100):
    records = _record_positions(doc, s)
    for q in doc.queries:
      key_start = q.pair + s.value_length + gap
      assert doc.text[q.pair:q.pair + 2] == q.value and doc.text[key_start:key_start + 2] == q.key
      between = doc.text[q.pair + 2:key_start]
      assert len(between) == gap and not any(c.isupper() or c.isdigit() for c in between)
      # A width-`conv` causal convolution at the key's first character sees none of the value.
      assert key_start - (q.pair + s.value_length - 1) >= conv
      assert doc.text[q.query:q.query + 4] == q.key + q.value  # the query stays KEYVALUE
      # Distance from the pair's last key character to the query's, both counted.
      assert q.distance == (q.query + 1) - (key_start + 1) + 1 and doc.text.count(q.key) == 2
    # The distractors keep the gap too: their values sit `gap` characters before their keys.
    extra_keys = _runs(i for i, c in enumerate(doc.text) if c.isupper() and i not in records)
    extra_values = _runs(i for i, c in enumerate(doc.text) if c.isdigit() and i not in records)
    assert [len(k) for k in extra_keys] == [2, 2] and [len(v) for v in extra_values] == [2, 2]
    assert [k[0] - v[-1] - 1 for k, v in zip(extra_keys, extra_values)] == [gap, gap]


def test_a_text_haystack_is_the_corpus_without_anything_that_reads_as_a_key_or_value(monkeypatch):
  from hybrid_jax.data import sources
  files = ['The Quick brown fox, 12 jumps over 3 Lazy dogs.\n' * 3, 'Def F(x): return 42 * X_2  # 7 ways\n' * 4]

  class Corpus:  # a known corpus, so every haystack character can be checked against it
    def __init__(self, *args):
      del args

    def __len__(self):
      return len(files)

    def __getitem__(self, index):
      return files[index]

  monkeypatch.setattr(sources, 'BuiltinSource', Corpus)
  clean = ''.join(recall.haystack_text(f) for f in files)
  assert not any(c.isupper() or c.isdigit() for c in clean) and 'the quick brown fox,  jumps' in clean
  config = recall_config(key_length=2, key_chars=16, value_length=1, pairs=6, pairs_min=1, distractors=2,
                         haystack='text')
  source = recall.RecallSource(config.data, 'train', use_store=False)
  s = source.settings
  for doc in recall_documents(source, 40):
    records = _record_positions(doc, s)
    assert all(doc.text[i] == c for i, c in records.items())
    extra_keys = _runs(i for i, c in enumerate(doc.text) if c.isupper() and i not in records)
    extra_values = [i for i, c in enumerate(doc.text) if c.isdigit() and i not in records]
    assert [len(k) for k in extra_keys] == [2, 2] and extra_values == [k[0] - 1 for k in extra_keys]
    for q in doc.queries:  # every key exactly where it should be
      assert [m.start() for m in re.finditer(q.key, doc.text)] == [q.pair + 1, q.query]
    # Everything else is the cleaned corpus, in order (repeated when a pass through it is shorter than the row).
    taken = set(records) | {p for k in extra_keys for p in k} | set(extra_values)
    for run in _runs(set(range(len(doc.text))) - taken):
      assert ''.join(doc.text[i] for i in run) in clean * 3


def test_a_text_haystack_from_the_built_in_corpus_leaks_no_digit_or_capital():
  config = recall_config(key_length=2, key_chars=16, value_length=1, pairs=6, distractors=2, haystack='text')
  source = recall.RecallSource(config.data, 'train')
  s = source.settings
  for doc in recall_documents(source, 40):
    records = _record_positions(doc, s)
    outside = [c for i, c in enumerate(doc.text) if i not in records]
    assert sum(c.isupper() for c in outside) == 2 * s.distractors and sum(c.isdigit() for c in outside) == 2
    assert len(doc.text) == 256 and doc.text.isascii() and sum(c.islower() for c in outside) > 50


def test_haystack_text_removes_what_reads_as_keys_or_values():
  assert recall.haystack_text('Def F(x): return 42 * X_2 # café') == 'def f(x): return  * x_ # caf?'


def test_an_empty_text_haystack_is_one_error_naming_the_key(monkeypatch):
  from hybrid_jax.data import sources

  class Digits:  # a corpus whose every file is digits only
    def __init__(self, *args):
      del args

    def __len__(self):
      return 3

    def __getitem__(self, index):
      return '1234567890' * 3

  monkeypatch.setattr(sources, 'BuiltinSource', Digits)
  source = recall.RecallSource(recall_config(haystack='text').data, 'train', use_store=False)
  with pytest.raises(ConfigError, match="config.data.recall.haystack='text' is invalid") as error:
    source.document(0)
  assert '\n' not in str(error.value)


def test_the_load_is_records_over_each_recurrent_kinds_key_dimensions():
  from hybrid_jax.study import load, presets
  mini = presets.PRESETS['mini']  # 4 pairs and 2 distractors: 6 records a document
  for label, kind, dims in (('GDN', 'gdn', 4 * 16), ('Lightning', 'lightning', 4 * 16), ('Mamba-2', 'mamba2', 48)):
    c = presets.run_config(label, mini)
    got = load.recall_load(c.data, c.model)
    assert list(got) == [kind] and got[kind]['key_dims'] == dims, (label, got)
    assert got[kind]['load'] == [pytest.approx(6 / dims)] * 2 and got[kind]['held_out_load'] == pytest.approx(6 / dims)
  assert load.recall_load(presets.run_config('SWA-128', mini).data, presets.run_config('SWA-128', mini).model) == {}
  # Mamba-2's heads share B and C: more heads or wider heads add no key dimension, more B/C groups do.
  c = presets.run_config('Mamba-2', mini)
  c.model.mamba2.update(dict(num_heads=16, head_dim=32))
  assert load.recall_load(c.data, c.model)['mamba2']['key_dims'] == 48
  c.model.mamba2.update(dict(num_groups=2))
  assert load.recall_load(c.data, c.model)['mamba2']['key_dims'] == 96
  # GDN's heads each have keys of their own; its value width adds none.
  c = presets.run_config('GDN', mini)
  c.model.gdn.update(dict(num_heads=3, key_dim=2, value_dim=64))
  c.data.recall.update(dict(pairs=7, pairs_min=1, eval_pairs=1))
  got = load.recall_load(c.data, c.model)['gdn']
  assert got['key_dims'] == 6 and got['records'] == [3, 9] and got['load'] == [0.5, 1.5]
  assert got['mean_load'] == pytest.approx((4 + 2) / 6) and got['held_out_load'] == pytest.approx(3 / 6)
  assert 'gdn: 3-9 records over 6 key dimensions, load 0.50 to 1.50 (mean 1.00)' in load.describe({'gdn': got})


def test_the_load_presets_span_their_loads_and_each_cell_is_one_command(capsys):
  from hybrid_jax.commands import study as study_command
  from hybrid_jax.config import load_config_file, resolve_spec
  from hybrid_jax.study import load, presets
  targets = {'load-0.1': 0.1, 'load-0.4': 0.4, 'load-0.75': 0.75, 'load-1.5': 1.5, 'load-3': 3.0}
  for name, target in targets.items():
    p = presets.PRESETS[name]
    assert p.seq_len == 128 and p.stop_when_formed and set(p.arches) == {'SWA-128', 'Lightning', 'Mamba-2', 'GDN'}
    for label, kind in (('GDN', 'gdn'), ('Mamba-2', 'mamba2'), ('Lightning', 'lightning')):
      # One cell, one command: the config `study --preset NAME --arches ARCH` trains.
      c = load_config_file(resolve_spec(f'mini:arch={presets.ARCHES[label][0]},preset={name}'))
      r = c.data.recall
      assert (r.key_length, r.pairs_min, r.pairs, r.distractors) == (2, 1, 7, 2)
      got = load.recall_load(c.data, c.model)[kind]
      assert got['load'][1] == pytest.approx(target, rel=0.1) and got['held_out_load'] == got['load'][1], (name, got)
      assert got['load'][0] == pytest.approx(got['load'][1] / 3)  # 3 to 9 records
  high = presets.run_config('GDN', presets.PRESETS['train-high'])
  assert high.data.recall.haystack == 'text' and high.data.recall.eval_pairs == 1
  got = load.recall_load(high.data, high.model)['gdn']
  assert got['load'][1] >= 1.5 and got['held_out_records'] == 3  # trained overloaded, scored on one pair
  with pytest.raises(SystemExit):
    study_command.main(['--help'])
  text = capsys.readouterr().out
  assert 'mini trains until retrieval forms, capped at 20,000 steps' in ' '.join(text.split())
  lines = text.splitlines()
  for name in list(targets) + ['train-high']:
    assert sum(line.startswith(f'  {name} ') for line in lines) == 1, name
