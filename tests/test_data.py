"""Tokenizers, document sources, the grain pipeline (packing, mixing, sharding, checkpointing) and the TFDS builder."""

import gzip
import json
import logging
import pathlib
import pickle

import grain
import numpy as np
import pytest

from hybrid_jax.commands import build_tfds as build_tfds_command, parsing
from hybrid_jax.config import BASE_CONFIG, ConfigError, load_config_file
from hybrid_jax.data import catalog, pipeline, sources, tfds_local, tokenizers

EOS = 256


def make_config(*, batch_size=4, seed=0, **data):
  c = load_config_file(str(BASE_CONFIG))
  c.seed = seed
  c.train.batch_size = batch_size
  c.data.seq_len = 64
  c.data.update(data)
  return c


def take(iterator, n):
  return [next(iterator) for _ in range(n)]


def stream_of(batches):
  """The packed token stream: rows are consecutive chunks of it, each row = inputs + last target."""
  rows = [np.concatenate([b['inputs'][r], b['targets'][r][-1:]]) for b in batches for r in range(len(b['inputs']))]
  return np.concatenate(rows)


def whole_documents(stream):
  """Byte-decoded documents that lie entirely inside `stream` (the partial first and last pieces dropped)."""
  cuts = np.flatnonzero(stream == EOS)
  return [stream[a + 1:b].astype(np.uint8).tobytes().decode() for a, b in zip(cuts[:-1], cuts[1:])]


def assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


@pytest.fixture
def corpus(tmp_path):
  """60 unique documents: 30 long ('L', 100+ bytes) and 30 short ('S', < 20 bytes) over .txt and .jsonl files."""
  root = tmp_path / 'corpus'
  root.mkdir()
  for i in range(30):
    (root / f'long{i:02d}.txt').write_text(f'L{i:02d}' + 'l' * 100)
  with open(root / 'short.jsonl', 'w') as f:
    for i in range(30):
      f.write(json.dumps({'text': f'S{i:02d}' + 's' * 8}) + '\n')
  return root


# ------------------------------------------------------------------------------------------------ tokenizers


def test_byte_tokenizer_round_trip_non_ascii():
  tok = tokenizers.get_tokenizer('byte')
  text = 'héllo wörld — 日本語 🙂\n\ttab'
  ids = tok.encode(text)
  assert ids.dtype == np.int32 and len(ids) == len(text.encode('utf-8'))
  assert ids.max() < 256 and tok.eos_id == 256 and tok.vocab_size == 257
  assert tok.decode(ids) == text
  assert tok.decode(np.append(ids, tok.eos_id)) == text  # EOS is not text.
  assert tok.decode([]) == ''


def _train_sentencepiece(tmp_path, **options):
  text = tmp_path / 'sp.txt'
  lines = [f'the quick brown fox {i} jumps over the lazy dog; héllo wörld' for i in range(200)]
  text.write_text('\n'.join(lines), encoding='utf-8')
  prefix = tmp_path / 'sp'
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(prefix), vocab_size=100, model_type='bpe',
                                 character_coverage=1.0, minloglevel=2, **options)
  return str(prefix) + '.model'


def test_sentencepiece_round_trip(tmp_path):
  tok = tokenizers.get_tokenizer(_train_sentencepiece(tmp_path))
  assert tok.vocab_size == 100 and 0 <= tok.eos_id < 100
  text = 'the lazy fox jumps over héllo wörld 42'
  ids = tok.encode(text)
  assert ids.dtype == np.int32 and tok.eos_id not in ids and len(ids) < len(text)
  assert tok.decode(ids) == text
  clone = pickle.loads(pickle.dumps(tok))  # grain worker processes receive it pickled.
  np.testing.assert_array_equal(clone.encode(text), ids)
  _check_offsets(tok, text)


def _check_offsets(tok, text):
  """Offsets agree with encode, are ordered, cover the text, and each token decodes to its text slice."""
  ids, offsets = tok.encode_with_offsets(text)
  np.testing.assert_array_equal(ids, tok.encode(text))
  assert len(offsets) == len(ids)
  assert all(a <= b for a, b in offsets) and all(o1[0] <= o2[0] for o1, o2 in zip(offsets, offsets[1:]))
  covered = ''.join(text[a:b] for a, b in dict.fromkeys(offsets))  # a multi-byte character's bytes share offsets
  assert covered.replace(' ', '') == text.replace(' ', '')  # SentencePiece may fold a space into its marker


def test_byte_tokenizer_offsets():
  tok = tokenizers.ByteTokenizer()
  _check_offsets(tok, 'héllo wörld ∑ 42')
  ids, offsets = tok.encode_with_offsets('aé')
  assert list(ids) == [97, 0xC3, 0xA9] and offsets == [(0, 1), (1, 2), (1, 2)]


def test_sentencepiece_errors(tmp_path):
  with pytest.raises(ConfigError, match='missing.model'):
    tokenizers.get_tokenizer(str(tmp_path / 'missing.model'))
  garbage = tmp_path / 'garbage.model'
  garbage.write_bytes(b'not a model')
  with pytest.raises(ConfigError, match='garbage.model'):
    tokenizers.get_tokenizer(str(garbage))
  with pytest.raises(ConfigError, match='no EOS'):
    tokenizers.get_tokenizer(_train_sentencepiece(tmp_path, eos_id=-1))


# ------------------------------------------------------------------------------------------------ sources


def test_builtin_source():
  cfg = make_config().data
  train, held_out = catalog.make_source(cfg, 'train'), catalog.make_source(cfg, 'eval')
  assert len(train) > 100 and len(held_out) > 0
  assert not set(train.paths) & set(held_out.paths)
  assert 0.005 < len(held_out) / (len(train) + len(held_out)) < 0.05  # eval_fraction = 0.02
  texts = [train[i] for i in range(0, len(train), len(train) // 20)]
  assert all(isinstance(t, str) and t.strip() for t in texts)
  assert any('def ' in t or 'import ' in t for t in texts)
  assert not any(p.startswith(('site-packages/', 'dist-packages/')) for p in train.paths)
  assert repr(catalog.make_source(cfg, 'train')) == repr(train)
  assert catalog.make_source(cfg, 'train').paths == train.paths


def _write_mixed_files(root):
  root.mkdir()
  (root / 'a.txt').write_text('plain text document\nwith two lines\n')
  (root / 'empty.txt').write_text('  \n\t\n')
  (root / 'latin1.txt').write_bytes(b'caf\xe9 au lait')  # Not UTF-8.
  with open(root / 'b.jsonl', 'w') as f:
    f.write(json.dumps({'text': 'json one', 'meta': 1}) + '\n\n')
    f.write(json.dumps({'text': '   '}) + '\n')
    f.write(json.dumps({'text': 'json two \u00e9'}) + '\n')
  with gzip.open(root / 'c.jsonl.gz', 'wt') as f:
    f.write(json.dumps({'body': 'x', 'text': 'gzipped json'}) + '\n')
  with gzip.open(root / 'd.txt.gz', 'wb') as f:
    f.write(b'gzipped text')
  (root / 'ignored.csv').write_text('not read')


def _write_docs(root, contents):
  """Writes {file name: bytes} under a new directory `root`."""
  root.mkdir()
  for name, data in contents.items():
    (root / name).write_bytes(data)
  return root


def _texts_of_both_splits(data_cfg):
  return [s[i] for s in (catalog.make_source(data_cfg, 'train'), catalog.make_source(data_cfg, 'eval'))
          for i in range(len(s))]


LATIN1 = {'good.txt': b'fine text', 'latin1.txt': b'caf\xe9 au lait'}  # The second is not UTF-8.


def test_undecodable_documents_are_counted_and_reported_once_per_source(tmp_path, caplog):
  """Bytes that are not UTF-8 are read as U+FFFD (nothing dropped), and each source says so once with its count."""
  root = _write_docs(tmp_path / 'docs', {
      **LATIN1, 'lines.jsonl': b'{"text": "ok"}\n{"text": "bad \xff byte"}\n{"text": "also \xfe bad"}\n'})
  cfg = make_config(source='files', paths=str(root), eval_fraction=0.5).data
  with caplog.at_level(logging.WARNING):
    train, held_out = catalog.make_source(cfg, 'train'), catalog.make_source(cfg, 'eval')
    texts = [train[i] for i in range(len(train))] + [held_out[i] for i in range(len(held_out))]
  assert sorted(texts) == sorted(['fine text', 'caf\ufffd au lait', 'ok', 'bad \ufffd byte', 'also \ufffd bad'])
  assert train.undecodable.identities | held_out.undecodable.identities == {'latin1.txt', 'lines.jsonl:2',
                                                                           'lines.jsonl:3'}
  warnings = [r.getMessage() for r in caplog.records if 'not UTF-8' in r.getMessage()]
  assert len(warnings) == sum(1 for s in (train, held_out) if s.undecodable.count)  # One per source, reads too.
  for source in (train, held_out):
    if source.undecodable.count:
      assert any(f'{source.undecodable.count} of {len(source)} documents' in w for w in warnings)

  # The built-in source reads lazily: the first bad document is warned about, later ones (and rereads) counted.
  stdlib = tmp_path / 'stdlib'
  stdlib.mkdir()
  for i in range(6):
    (stdlib / f'm{i}.py').write_bytes(b'x = 1  # ' + (b'\xe9' if i % 2 else b'e') * 300)
  builtin = sources.BuiltinSource('train', 0.01, root=str(stdlib))
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    for _ in range(2):
      for i in range(len(builtin)):
        assert builtin[i].startswith('x = 1  # ')
  bad = {p for p in builtin.paths if int(p[1]) % 2}
  assert builtin.undecodable.identities == bad and builtin.undecodable.count == len(bad) > 0
  assert len(caplog.records) == 1 and 'not UTF-8' in caplog.text


def test_files_source(tmp_path):
  _write_mixed_files(tmp_path / 'docs')
  cfg = make_config(source='files', paths=str(tmp_path / 'docs'), eval_fraction=0.3).data
  train, held_out = catalog.make_source(cfg, 'train'), catalog.make_source(cfg, 'eval')
  docs = [train[i] for i in range(len(train))] + [held_out[i] for i in range(len(held_out))]
  assert sorted(docs) == sorted(['plain text document\nwith two lines\n', 'caf\ufffd au lait', 'json one',
                                 'json two \u00e9', 'gzipped json', 'gzipped text'])
  assert len(held_out) >= 1 and len(train) >= 1
  assert repr(catalog.make_source(cfg, 'eval')) == repr(held_out)
  # Globs and single files name the same documents.
  cfg.paths = f'{tmp_path}/docs/*.txt, {tmp_path}/docs/b.jsonl'
  files = sources.resolve_paths(cfg.paths)
  assert [pathlib.Path(p).name for p, _ in files] == ['a.txt', 'b.jsonl', 'empty.txt', 'latin1.txt']


def test_files_source_errors(tmp_path):
  cfg = make_config(source='files', paths=str(tmp_path / 'nope.jsonl')).data
  with pytest.raises(ConfigError, match='nope.jsonl'):
    catalog.make_source(cfg, 'train')
  cfg.paths = str(tmp_path / 'none*.txt')
  with pytest.raises(ConfigError, match='none'):
    catalog.make_source(cfg, 'train')
  bad = tmp_path / 'bad.jsonl'
  bad.write_text('{"text": "ok"}\n{"text": oops}\n')
  cfg.paths = str(bad)
  with pytest.raises(sources.DataError, match=r'bad\.jsonl:2: not JSON'):
    catalog.make_source(cfg, 'train')
  bad.write_text('{"text": "ok"}\n\n{"body": "no text"}\n')
  with pytest.raises(sources.DataError, match=r"bad\.jsonl:3: missing field\(s\) \['text'\] \(set config\.data"):
    catalog.make_source(cfg, 'train')
  bad.write_text('{"text": 3}\n')
  with pytest.raises(sources.DataError, match=r"bad\.jsonl:1: field 'text' is a int, not a str"):
    catalog.make_source(cfg, 'train')
  bad.write_text('\n  \n')
  with pytest.raises(sources.DataError, match='empty'):
    catalog.make_source(cfg, 'train')


def test_hash_split_is_stable_and_disjoint():
  ids = [f'doc{i}.txt' for i in range(1000)]
  train = sources.split_by_hash(ids, 0.1, 'train')
  held_out = sources.split_by_hash(ids, 0.1, 'eval')
  assert not set(train) & set(held_out) and len(train) + len(held_out) == 1000
  assert 60 < len(held_out) < 140
  np.testing.assert_array_equal(held_out, sources.split_by_hash(list(reversed(ids))[::-1], 0.1, 'eval'))
  assert len(sources.split_by_hash(['only', 'two'], 1e-9, 'eval')) == 1  # Never an empty eval split.


# ------------------------------------------------------------------------------------------------ pipeline


def test_train_batches_shapes_shift_and_eos():
  c = make_config()
  it = iter(pipeline.make_train_dataset(c))
  batches = take(it, 3)
  for b in batches:
    assert set(b) == {'inputs', 'targets', 'segment_ids', 'positions', 'target_segment_ids'}  # data.packing default
    assert all(v.shape == (4, 64) and v.dtype == np.int32 for v in b.values())
    np.testing.assert_array_equal(b['inputs'][:, 1:], b['targets'][:, :-1])
    assert b['inputs'].min() >= 0 and b['inputs'].max() <= EOS
  stream = stream_of(batches + take(it, 300))
  assert (stream == EOS).sum() >= 2  # Documents (stdlib files) are separated by EOS.
  text = tokenizers.ByteTokenizer().decode(stream)
  assert text.count('\n') > 10 and any(k in text for k in ('def ', 'import ', 'class '))  # Python source.


def test_eos_separates_documents(corpus):
  c = make_config(source='files', paths=str(corpus), long_short_ratio=0.0)
  docs = whole_documents(stream_of(take(iter(pipeline.make_train_dataset(c)), 10)))
  assert len(docs) > 10
  source = catalog.make_source(c.data, 'train')
  assert set(docs) <= {source[i] for i in range(len(source))}


def test_deterministic_by_seed():
  first = take(iter(pipeline.make_train_dataset(make_config(seed=1))), 4)
  again = take(iter(pipeline.make_train_dataset(make_config(seed=1))), 4)
  other = take(iter(pipeline.make_train_dataset(make_config(seed=2))), 4)
  assert_batches_equal(first, again)
  assert not np.array_equal(stream_of(first), stream_of(other))


def test_epochs_reshuffle(corpus):
  c = make_config(source='files', paths=str(corpus), long_short_ratio=0.0)
  n_docs = len(catalog.make_source(c.data, 'train'))
  docs = whole_documents(stream_of(take(iter(pipeline.make_train_dataset(c)), 40)))
  assert len(docs) > 2 * n_docs + 2
  epoch1, epoch2 = docs[:n_docs], docs[n_docs:2 * n_docs]  # docs[0] is the first whole document, index 1.
  assert epoch1 != epoch2
  c.data.shuffle = False  # Source order, every epoch.
  source = catalog.make_source(c.data, 'train')
  ordered = whole_documents(stream_of(take(iter(pipeline.make_train_dataset(c)), 40)))
  assert ordered[:2 * n_docs - 1] == (2 * [source[i] for i in range(n_docs)])[1:]


def test_process_sharding(corpus):
  c = make_config(source='files', paths=str(corpus), long_short_ratio=0.0)
  seen = []
  for index in range(2):
    batches = take(iter(pipeline.make_train_dataset(c, process_index=index, process_count=2)), 8)
    assert batches[0]['inputs'].shape == (2, 64)
    seen.append(set(whole_documents(stream_of(batches))))
  assert seen[0] and seen[1] and not seen[0] & seen[1]
  with pytest.raises(ConfigError, match='batch_size'):
    pipeline.make_train_dataset(make_config(batch_size=3), process_index=0, process_count=2)


@pytest.mark.parametrize('ratio', [1.0, 3.0])
def test_long_short_mixing_ratio(corpus, ratio):
  c = make_config(source='files', paths=str(corpus), long_short_ratio=ratio, long_doc_min_tokens=50)
  docs = whole_documents(stream_of(take(iter(pipeline.make_train_dataset(c)), 30)))
  n_long, n_short = sum(d[0] == 'L' for d in docs), sum(d[0] == 'S' for d in docs)
  assert n_long + n_short == len(docs) and n_short > 5
  assert abs(n_long / n_short - ratio) < 0.25 * ratio


def test_mixing_falls_back_when_one_side_is_empty(corpus, caplog):
  c = make_config(source='files', paths=str(corpus), long_short_ratio=1.0, long_doc_min_tokens=10_000)
  with caplog.at_level(logging.WARNING):
    batches = take(iter(pipeline.make_train_dataset(c)), 5)
  assert 'mixing disabled' in caplog.text
  assert batches[0]['inputs'].shape == (4, 64)


def assert_resumes_exactly(config, before: int, after: int = 3):
  """A fresh pipeline given the iterator state after `before` batches yields the next `after` batches exactly, every
  key of them (with data.packing='documents' the segment ids and positions too)."""
  it = iter(pipeline.make_train_dataset(config))
  take(it, before)
  state = it.get_state()
  expected = take(it, after)
  restored = iter(pipeline.make_train_dataset(config))
  restored.set_state(state)
  assert_batches_equal(take(restored, after), expected)
  assert ('segment_ids' in expected[0]) == (config.data.packing == 'documents')


@pytest.mark.parametrize('source', ['builtin', 'files'])
def test_checkpoint_restore_exact(corpus, source):
  assert_resumes_exactly(make_config(source=source, paths=str(corpus)), 5)


def test_orbax_checkpoint_restore(tmp_path):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  c = make_config()
  it = iter(pipeline.make_train_dataset(c))
  take(it, 5)
  with ocp.CheckpointManager(tmp_path / 'ckpt') as manager:
    manager.save(5, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
    manager.wait_until_finished()
  expected = take(it, 3)
  restored = iter(pipeline.make_train_dataset(c))
  with ocp.CheckpointManager(tmp_path / 'ckpt') as manager:
    manager.restore(5, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(restored)))
  assert_batches_equal(take(restored, 3), expected)


def test_eval_batches(corpus, caplog):
  c = make_config(batch_size=3)
  first, again = pipeline.make_eval_batches(c, 2), pipeline.make_eval_batches(c, 2)
  assert len(first) == 2 and first[0]['inputs'].shape == (3, 64)
  assert_batches_equal(first, again)
  np.testing.assert_array_equal(first[0]['inputs'][:, 1:], first[0]['targets'][:, :-1])
  # A tiny held-out split: fewer batches than asked, but at least one (text repeated), with a warning.
  small = make_config(source='files', paths=str(corpus), eval_fraction=0.01, batch_size=8)
  with caplog.at_level(logging.WARNING):
    batches = pipeline.make_eval_batches(small, 5)
  assert len(batches) == 1 and batches[0]['inputs'].shape == (8, 64)
  assert 'eval batches' in caplog.text
  held_out = catalog.make_source(small.data, 'eval')
  assert set(whole_documents(stream_of(batches))) <= {held_out[i] for i in range(len(held_out))}


def test_vocab_size_checked():
  c = make_config()
  c.model.vocab_size = 100
  with pytest.raises(ConfigError, match='vocab_size'):
    pipeline.make_train_dataset(c)


# ------------------------------------------------------------------------------------------------ TFDS


def test_tfds_local_builder_round_trip(tmp_path, corpus):
  name = tfds_local.build_local_tfds(str(corpus), str(tmp_path / 'tfds'), eval_fraction=0.1)
  assert name.startswith('hybrid_jax_local_files/')
  c = make_config(source='tfds', tfds_name=name, tfds_data_dir=str(tmp_path / 'tfds'), long_doc_min_tokens=50)
  files_cfg = make_config(source='files', paths=str(corpus), eval_fraction=0.1).data
  for split in ('train', 'eval'):
    from_tfds, from_files = catalog.make_source(c.data, split), catalog.make_source(files_cfg, split)
    assert sorted(from_tfds[i] for i in range(len(from_tfds))) == sorted(from_files[i] for i in range(len(from_files)))
  assert 'validation' in repr(catalog.make_source(c.data, 'eval'))
  docs = whole_documents(stream_of(take(iter(pipeline.make_train_dataset(c)), 10)))
  assert docs and all(d[0] in 'LS' for d in docs)
  # Same inputs: reused, same name.
  assert tfds_local.build_local_tfds(str(corpus), str(tmp_path / 'tfds'), eval_fraction=0.1) == name


def test_tfds_build_reports_undecodable_documents_once(tmp_path, caplog):
  root = _write_docs(tmp_path / 'docs', {**LATIN1, 'koi8.txt': b'\xf0\xd2\xc9\xd7\xc5\xd4'})
  with caplog.at_level(logging.WARNING):
    name = tfds_local.build_local_tfds(str(root), str(tmp_path / 'tfds'), eval_fraction=0.3)
  warnings = [r.getMessage() for r in caplog.records if 'not UTF-8' in r.getMessage()]
  assert len(warnings) == 1 and '2 of 3 documents' in warnings[0]
  c = make_config(source='tfds', tfds_name=name, tfds_data_dir=str(tmp_path / 'tfds'))
  assert sorted(_texts_of_both_splits(c.data)) == sorted(['fine text', 'caf\ufffd au lait', '\ufffd' * 6])


def test_build_tfds_command_prints_the_flags_that_train_on_it(tmp_path, capsys):
  root = _write_docs(tmp_path / 'docs', {f'{i}.txt': f'document number {i}'.encode() for i in range(3)})
  assert build_tfds_command.main([str(root), str(tmp_path / 'tfds')]) == 0
  [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith('--config.')]
  flags = dict(f.removeprefix('--config.data.').split('=', 1) for f in line.split())
  c = make_config(**flags)
  assert sorted(_texts_of_both_splits(c.data)) == [f'document number {i}' for i in range(3)]
  assert parsing.run(build_tfds_command.main, [str(tmp_path / 'nothing*.txt'), str(tmp_path / 'tfds')]) == 2
  assert 'matches no' in capsys.readouterr().err


def test_tfds_missing_dataset(tmp_path):
  c = make_config(source='tfds', tfds_name='hybrid_jax_local_files/nothere', tfds_data_dir=str(tmp_path))
  with pytest.raises(ConfigError, match='nothere'):
    catalog.make_source(c.data, 'train')


@pytest.mark.e2e
def test_worker_processes_match_shapes(corpus):
  c = make_config(source='files', paths=str(corpus), worker_count=2)
  it = iter(pipeline.make_train_dataset(c))
  batches = take(it, 4)
  state = it.get_state()
  expected = take(it, 2)
  it.close()
  restored = iter(pipeline.make_train_dataset(c))
  restored.set_state(state)
  assert_batches_equal(take(restored, 2), expected)
  restored.close()
  assert batches[0]['inputs'].shape == batches[0]['segment_ids'].shape == (4, 64)
