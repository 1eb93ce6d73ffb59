"""Study-scale inputs: Hugging Face tokenizer.json, parquet shards, and pretokenized ArrayRecord directories."""

import json
import os
import pickle

import numpy as np
import pytest

from hybrid_jax.commands import parsing, pretokenize as pretokenize_command
from hybrid_jax.config import ConfigError
from hybrid_jax.data import catalog, parquet, pipeline, pretokenize, pretokenized, sources, tokenizers
from tests import host_reader
from tests.test_data import (assert_batches_equal, assert_resumes_exactly, make_config, stream_of, take,
                             whole_documents)

pa = pytest.importorskip('pyarrow')
pq = pytest.importorskip('pyarrow.parquet')
hf = pytest.importorskip('tokenizers')

WORDS = 'the quick brown fox jumps over a lazy dog while seven wizards quietly hex bright jackdaws'.split()


def train_tokenizer_json(directory, *, template=True, special=('<s>', '</s>'), vocab_size=300):
  """A byte-level BPE tokenizer.json trained here by the `tokenizers` library (no download)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  rng = np.random.default_rng(0)
  tok.train_from_iterator([' '.join(rng.choice(WORDS, 12)) for _ in range(200)], trainer)
  if template:
    tok.post_processor = processors.TemplateProcessing(
        single=f'{special[0]} $A {special[1]}', special_tokens=[(t, tok.token_to_id(t)) for t in special])
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, 'tokenizer.json')
  tok.save(path)
  return path


# ------------------------------------------------------------------------------------------------ tokenizer.json


def test_hf_tokenizer_round_trip_specials_and_offsets(tmp_path):
  path = train_tokenizer_json(tmp_path / 'tok')
  tok = tokenizers.get_tokenizer(path)
  reference = hf.Tokenizer.from_file(path)
  assert isinstance(tok, tokenizers.HFTokenizer)
  assert tok.eos_id == reference.token_to_id('</s>') and tok.bos_id == reference.token_to_id('<s>')
  assert tok.vocab_size == reference.get_vocab_size(with_added_tokens=True)
  text = 'the lazy wizards hex seven quick jackdaws'
  ids = tok.encode(text)
  assert ids.dtype == np.int32 and tok.eos_id not in ids and tok.bos_id not in ids  # The pipeline adds EOS.
  assert len(ids) < len(text) and tok.decode(ids) == text
  assert tok.decode(np.append(ids, tok.eos_id)) == text
  np.testing.assert_array_equal(pickle.loads(pickle.dumps(tok)).encode(text), ids)
  ids, offsets = tok.encode_with_offsets(text)
  assert ''.join(text[a:b] for a, b in offsets) == text  # Tokens tile the text in order.
  assert all(tok.decode([i]) == text[a:b] for i, (a, b) in zip(ids, offsets))
  # Offsets count characters, not UTF-8 bytes.
  accented = 'héllo wörld ∑'
  _, offsets = tok.encode_with_offsets(accented)
  assert offsets[-1][1] == len(accented) < len(accented.encode())


def test_hf_tokenizer_special_tokens_from_config_and_names(tmp_path):
  # No template: the usual names are found among the special tokens.
  tok = tokenizers.get_tokenizer(train_tokenizer_json(tmp_path / 'a', template=False, special=('<|endoftext|>',)))
  assert tok.decode([tok.eos_id]) == '' and tok.bos_id is None
  assert hf.Tokenizer.from_file(str(tmp_path / 'a' / 'tokenizer.json')).id_to_token(tok.eos_id) == '<|endoftext|>'
  # tokenizer_config.json beside the file wins over the template.
  path = train_tokenizer_json(tmp_path / 'b', special=('<s>', '</s>', '<end>'))
  (tmp_path / 'b' / 'tokenizer_config.json').write_text(json.dumps({'eos_token': {'content': '<end>'},
                                                                     'bos_token': '<s>'}))
  tok = tokenizers.get_tokenizer(path)
  assert tok.eos_id == hf.Tokenizer.from_file(path).token_to_id('<end>')


def test_hf_tokenizer_refusals(tmp_path):
  with pytest.raises(ConfigError, match='missing.json'):
    tokenizers.get_tokenizer(str(tmp_path / 'missing.json'))
  (tmp_path / 'bad.json').write_text('{"not": "a tokenizer"}')
  with pytest.raises(sources.DataError, match='config.data.tokenizer .*bad.json: not a readable'):
    tokenizers.get_tokenizer(str(tmp_path / 'bad.json'))
  path = train_tokenizer_json(tmp_path / 'c', template=False, special=('<pad>',))
  with pytest.raises(ConfigError, match=r"no EOS token.*\['<pad>'\]"):
    tokenizers.get_tokenizer(path)


def test_vocab_size_mismatch_refused_naming_both(tmp_path):
  path = train_tokenizer_json(tmp_path / 'tok', vocab_size=300)
  c = make_config(tokenizer=path)
  c.model.vocab_size = 257
  with pytest.raises(ConfigError, match=r'vocab_size=257.*tokenizer\.json.*\(300\)'):
    pipeline.make_train_dataset(c)


# ------------------------------------------------------------------------------------------------ parquet


def write_parquet(root, n_files=3, rows=20, row_group_size=7, column='text'):
  """Long ('L', 100+ chars) and short ('S') documents over several files and row groups; returns every text."""
  root.mkdir(parents=True, exist_ok=True)
  texts = []
  for f in range(n_files):
    batch = [(f'L{f}{i:02d} ' + 'long text ' * 12) if i % 2 else f'S{f}{i:02d} short' for i in range(rows)]
    table = pa.table({column: batch, 'id': list(range(rows))})
    pq.write_table(table, root / f'part-{f:03d}.parquet', row_group_size=row_group_size)
    texts += batch
  return texts


def test_parquet_source_split_and_reads(tmp_path):
  texts = write_parquet(tmp_path / 'pq')
  cfg = make_config(source='parquet', paths=str(tmp_path / 'pq' / '*.parquet'), eval_fraction=0.2).data
  train, held_out = catalog.make_source(cfg, 'train'), catalog.make_source(cfg, 'eval')
  assert isinstance(train, parquet.ParquetSource)
  got_train = [train[i] for i in range(len(train))]
  got_eval = [held_out[i] for i in range(len(held_out))]
  assert sorted(got_train + got_eval) == sorted(texts) and not set(got_train) & set(got_eval)
  # The split is the stable hash split of '<file>:<row>', whatever the row grouping.
  expected_eval = {texts[f * 20 + r] for f in range(3) for r in range(20)
                   if sources.hash_fraction(f'part-{f:03d}.parquet:{r}') < 0.2}
  assert set(got_eval) == expected_eval
  # Random order reads and pickling (grain workers) give the same documents.
  clone = pickle.loads(pickle.dumps(train))
  for i in np.random.default_rng(0).permutation(len(train)):
    assert clone[int(i)] == got_train[int(i)]
  assert repr(catalog.make_source(cfg, 'train')) == repr(train)


def test_parquet_source_refusals(tmp_path):
  write_parquet(tmp_path / 'pq', n_files=1, column='body')
  cfg = make_config(source='parquet', paths=str(tmp_path / 'pq')).data
  with pytest.raises(ConfigError, match=r"text_field='text'.*part-000.parquet.*\['body', 'id'\]"):
    catalog.make_source(cfg, 'train')
  cfg.text_field = 'id'
  with pytest.raises(ConfigError, match='int64, not strings'):
    catalog.make_source(cfg, 'train')
  cfg.paths = str(tmp_path / 'none*.parquet')
  with pytest.raises(ConfigError, match='matches no .parquet file'):
    catalog.make_source(cfg, 'train')
  pq.write_table(pa.table({'text': pa.array([], pa.string())}), tmp_path / 'empty.parquet')
  cfg.paths, cfg.text_field = str(tmp_path / 'empty.parquet'), 'text'
  with pytest.raises(sources.DataError, match='hold no rows'):
    catalog.make_source(cfg, 'train')
  (tmp_path / 'broken.parquet').write_bytes(b'PAR1 garbage')
  cfg.paths = str(tmp_path / 'broken.parquet')
  with pytest.raises(sources.DataError, match='broken.parquet: not a readable parquet file'):
    catalog.make_source(cfg, 'train')


def test_parquet_training_mixes_and_resumes(tmp_path):
  write_parquet(tmp_path / 'pq', n_files=2, rows=40)
  c = make_config(source='parquet', paths=str(tmp_path / 'pq'), long_doc_min_tokens=50, eval_fraction=0.3)
  docs = whole_documents(stream_of(take(iter(pipeline.make_train_dataset(c)), 20)))
  n_long, n_short = sum(d[0] == 'L' for d in docs), sum(d[0] == 'S' for d in docs)
  assert n_long + n_short == len(docs) and n_short > 5 and abs(n_long / n_short - 1) < 0.3
  assert_resumes_exactly(c, 20)
  held_out = pipeline.held_out_documents(c, 20, 2)
  assert held_out.tokens.shape == (2, 21)


# ------------------------------------------------------------------------------------------------ pretokenized


def _parquet_config(tmp_path, **data):
  if not (tmp_path / 'pq').exists():
    write_parquet(tmp_path / 'pq', n_files=3, rows=30)
  return make_config(source='parquet', paths=str(tmp_path / 'pq'), long_doc_min_tokens=40, eval_fraction=0.2,
                     **data)


def _pretokenized(config, out, **kwargs):
  pretokenize.pretokenize(config, str(out), **kwargs)
  c = make_config(**{k: config.data[k] for k in ('seq_len', 'long_doc_min_tokens', 'tokenizer')},
                  source='pretokenized', paths=str(out), batch_size=config.train.batch_size)
  c.model.vocab_size = config.model.vocab_size
  return c


@pytest.mark.parametrize('tokenizer', ['byte', 'tokenizer.json'])
def test_pretokenized_gives_the_batches_of_on_the_fly(tmp_path, tokenizer):
  on_the_fly = _parquet_config(tmp_path)
  if tokenizer != 'byte':
    on_the_fly.data.tokenizer = train_tokenizer_json(tmp_path / 'tok')
    on_the_fly.model.vocab_size = 300
  pre = _pretokenized(on_the_fly, tmp_path / 'out', shard_tokens=500)
  manifest = pretokenized.read_manifest(str(tmp_path / 'out'))
  assert len(manifest['splits']['train']['shards']) > 2  # Several shards: batches cross shard boundaries.
  train = catalog.make_source(on_the_fly.data, 'train')
  assert manifest['splits']['train']['documents'] == len(train)
  assert manifest['splits']['train']['tokens'] == sum(len(tokenizers.get_tokenizer(on_the_fly.data.tokenizer).encode(
      train[i])) for i in range(len(train)))
  assert [f['path'] for f in manifest['source']['files']] == [p for p, _ in train.files]
  for seq_len in (64, 48):  # Nothing stored depends on the sequence length.
    on_the_fly.data.seq_len = pre.data.seq_len = seq_len
    assert_batches_equal(take(iter(pipeline.make_train_dataset(pre)), 12),
                         take(iter(pipeline.make_train_dataset(on_the_fly)), 12))
    for index in range(2):
      assert_batches_equal(take(iter(pipeline.make_train_dataset(pre, process_index=index, process_count=2)), 4),
                           take(iter(pipeline.make_train_dataset(on_the_fly, process_index=index, process_count=2)), 4))
  assert_batches_equal(pipeline.make_eval_batches(pre, 2), pipeline.make_eval_batches(on_the_fly, 2))
  a, b = pipeline.held_out_documents(pre, 20, 3), pipeline.held_out_documents(on_the_fly, 20, 3)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert a.ids == b.ids


def test_pretokenized_resume_in_the_middle_of_a_shard(tmp_path):
  pre = _pretokenized(_parquet_config(tmp_path), tmp_path / 'out', shard_tokens=800)
  assert len(pretokenized.read_manifest(str(tmp_path / 'out'))['splits']['train']['shards']) > 3
  assert_resumes_exactly(pre, 7, 4)  # 7 x 4 x 65 tokens: past the first shards, inside one.


@pytest.mark.e2e
def test_two_host_processes_read_disjoint_halves_covering_the_corpus(tmp_path):
  import multiprocessing  # pylint: disable=g-import-not-at-top
  config = _parquet_config(tmp_path)
  pretokenize.pretokenize(config, str(tmp_path / 'out'))
  with multiprocessing.get_context('spawn').Pool(2) as pool:
    first, second = pool.map(host_reader.documents_read_by_host, [(str(tmp_path / 'out'), i, 2, 200) for i in (0, 1)])
  train = catalog.make_source(config.data, 'train')
  assert first and second and not first & second
  assert first | second == {train[i] for i in range(len(train))}


def test_pretokenized_refusals(tmp_path):
  config = _parquet_config(tmp_path)
  out = tmp_path / 'out'
  pre = _pretokenized(config, out, shard_tokens=800)
  with pytest.raises(ConfigError, match='already holds a pretokenized corpus'):
    pretokenize.pretokenize(config, str(out))
  with pytest.raises(ConfigError, match="source='pretokenized' is invalid for pretokenize"):
    pretokenize.pretokenize(pre, str(tmp_path / 'again'))
  with pytest.raises(ConfigError, match=r'no manifest\.json'):
    catalog.make_source(make_config(source='pretokenized', paths=str(tmp_path)).data, 'train')
  # Another tokenizer: refused before any batch, naming both.
  other = make_config(source='pretokenized', paths=str(out), tokenizer=train_tokenizer_json(tmp_path / 'tok'))
  other.model.vocab_size = 300
  with pytest.raises(ConfigError, match=r"tokenizer\.json' \(blake2b:\w+\) does not match.*'byte' \(byte"):
    pipeline.make_train_dataset(other)
  # A damaged chunk: the read names the shard.
  shard = out / 'train-00001.array_record'
  original = shard.read_bytes()
  damaged = bytearray(original)
  damaged[150] ^= 0xFF
  shard.write_bytes(bytes(damaged))
  source = catalog.make_source(pre.data, 'train')
  with pytest.raises(sources.DataError, match=r'train-00001\.array_record: record 0 .*cannot be read'):
    [source[i] for i in range(len(source))]  # pylint: disable=expression-not-assigned
  # A truncated shard: refused when the source opens, naming the file.
  shard.write_bytes(original[:1000])
  with pytest.raises(sources.DataError, match=r'train-00001\.array_record: 1000 bytes, but manifest\.json records'):
    pipeline.make_train_dataset(pre)
  shard.unlink()
  with pytest.raises(sources.DataError, match=r'train-00001\.array_record: shard listed in manifest\.json is missing'):
    pipeline.make_train_dataset(pre)


def test_pretokenize_command(tmp_path, capsys):
  write_parquet(tmp_path / 'pq', n_files=2)
  tok = train_tokenizer_json(tmp_path / 'tok')
  argv = ['--config=base', '--config.data.source=parquet', f'--config.data.paths={tmp_path}/pq/*.parquet',
          f'--config.data.tokenizer={tok}', '--config.model.vocab_size=300', '--out', str(tmp_path / 'out')]
  assert pretokenize_command.main(argv) == 0
  out = capsys.readouterr().out
  manifest = pretokenized.read_manifest(str(tmp_path / 'out'))
  assert manifest['tokenizer']['vocab_size'] == 300 and manifest['tokenizer']['spec'] == tok
  assert manifest['splits']['train']['documents'] + manifest['splits']['eval']['documents'] == 40
  assert f'--config.data.source=pretokenized --config.data.paths={tmp_path / "out"}' in out
  argv[4] = '--config.model.vocab_size=257'  # The tokenizer has 300 ids.
  argv[-1] = str(tmp_path / 'out2')
  assert parsing.run(pretokenize_command.main, argv) == 2
  assert 'vocab_size=257' in capsys.readouterr().err and not (tmp_path / 'out2').exists()


def test_pretokenize_is_atomic_and_shows_progress(tmp_path, capsys, monkeypatch):
  """A stopped pretokenize leaves no directory that looks like a corpus; the next one clears what it left and
  shows its progress; a source that is not text (recall) is refused naming the text sources."""
  config = _parquet_config(tmp_path)
  out = tmp_path / 'out'
  calls = {'n': 0}
  encode = tokenizers.ByteTokenizer.encode

  def stopped(self, text):
    calls['n'] += 1
    if calls['n'] > 5:
      raise KeyboardInterrupt
    return encode(self, text)

  with monkeypatch.context() as patch:
    patch.setattr(tokenizers.ByteTokenizer, 'encode', stopped)
    with pytest.raises(KeyboardInterrupt):
      pretokenize.pretokenize(config, str(out), shard_tokens=800)
  assert sorted(p.name for p in tmp_path.iterdir()) == ['pq']  # Neither out nor its temporary folder.
  (tmp_path / '.out.partial').mkdir()  # What a kill -9 leaves.
  (tmp_path / '.out.partial' / 'train-00000.array_record').write_bytes(b'partial')
  out.mkdir()  # An empty --out made beforehand is taken.
  manifest = pretokenize.pretokenize(config, str(out), shard_tokens=800, progress=True)
  assert sorted(p.name for p in tmp_path.iterdir()) == ['out', 'pq']
  assert sorted(p.name for p in out.iterdir()) == sorted(
      [pretokenized.MANIFEST] + [s['file'] for split in manifest['splits'].values() for s in split['shards']])
  err = capsys.readouterr().err
  assert 'pretokenize train' in err and 'pretokenize eval' in err and 'doc' in err  # The progress bars.
  config.data.source = 'recall'
  with pytest.raises(ConfigError, match=r"source='recall' is invalid for pretokenize: name the text source "
                     r'\(builtin, files, tfds, parquet\)'):
    pretokenize.pretokenize(config, str(tmp_path / 'recall'))


@pytest.mark.e2e
def test_pretokenize_with_worker_processes_writes_the_same_records(tmp_path):
  config = _parquet_config(tmp_path)
  one = pretokenize.pretokenize(config, str(tmp_path / 'one'), shard_tokens=800)
  many = pretokenize.pretokenize(config, str(tmp_path / 'many'), shard_tokens=800, workers=2)
  assert one['splits'] == many['splits']
  for split in pretokenized.SPLITS:
    a = pretokenized.PretokenizedSource(str(tmp_path / 'one'), split, 'byte')
    b = pretokenized.PretokenizedSource(str(tmp_path / 'many'), split, 'byte')
    assert len(a) == len(b) and all(np.array_equal(a[i], b[i]) for i in range(len(a)))
