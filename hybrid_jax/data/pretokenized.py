"""Tokenize a corpus once: ArrayRecord shards of token documents plus a manifest, read back as a training source.

At study scale the same corpus would otherwise be tokenized by every run. `pretokenize` writes each split of the
configured source ('train', 'eval') in the source's own index order, one record per document (little-endian int32
tokens, no EOS), so the pipeline reading the directory (data.source='pretokenized', data.paths=DIR) appends EOS,
shuffles, shards across hosts, mixes long and short documents and packs exactly as it does on the fly: the same
documents give the same batches, and the iterator state resumes the same way. Nothing stored depends on the
sequence length, so one directory serves every data.seq_len.

The manifest (manifest.json, written last) records the tokenizer (spec, content hash, vocabulary, EOS/BOS), the
source and its files, and per split the document and token counts and every shard's records and bytes. Opening a
directory refuses a manifest made with another tokenizer, and a missing, truncated or corrupt shard, naming it.

    python -m hybrid_jax pretokenize --config=hybrid:arch=swa128_nope,scale=s1 \
        --config.data.source=parquet --config.data.paths='corpus/*.parquet' \
        --config.data.tokenizer=tok/tokenizer.json --out /data/corpus_tok
"""

import datetime
import json
import logging
import os
import pathlib
import shlex
import shutil

import grain
import numpy as np
import tqdm

from hybrid_jax import checks, command_line, readers
from hybrid_jax.config import ConfigError, load_run
from hybrid_jax.data import pipeline, sources, tokenizers

FORMAT = 'hybrid_jax pretokenized 1'
MANIFEST = 'manifest.json'
SPLITS = ('train', 'eval')
_DTYPE = np.dtype('<i4')
# Tokens per shard: ~1 GiB of int32, small enough to copy and to spread over hosts and workers.
DEFAULT_SHARD_TOKENS = 1 << 28


def _source_record(data_cfg, source) -> dict:
  """What was tokenized: the data keys that choose documents, and each input file with its size."""
  keys = ('source', 'paths', 'text_field', 'eval_fraction', 'tfds_name', 'tfds_data_dir', 'tfds_train_split',
          'tfds_eval_split')
  files = [{'path': path, 'bytes': os.path.getsize(path)} for path, _ in getattr(source, 'files', [])]
  return {'config': {k: data_cfg[k] for k in keys}, 'files': files}


def _shard_name(split: str, index: int) -> str:
  return f'{split}-{index:05d}.array_record'


def _write_split(source, tokenizer, out_dir: str, split: str, shard_tokens: int, workers: int,
                 progress: bool = False) -> dict:
  """Writes `source` in index order into shards of at most `shard_tokens` tokens (a longer document gets its own)."""
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  docs = grain.MapDataset.source(source).map(tokenizer.encode).to_iter_dataset(
      grain.ReadOptions(num_threads=0 if workers else 4))
  if workers:
    docs = pipeline.in_worker_processes(docs, workers)
  shards, writer, shard = [], None, None

  def close():
    writer.close()
    shard['bytes'] = os.path.getsize(os.path.join(out_dir, shard['file']))
    shards.append(shard)

  bar = tqdm.tqdm(total=len(source), desc=f'pretokenize {split}', unit='doc', disable=not progress,
                  dynamic_ncols=True)
  for tokens in docs:
    bar.update(1)
    if writer is None or (shard['tokens'] and shard['tokens'] + len(tokens) > shard_tokens):
      if writer is not None:
        close()
      shard = {'file': _shard_name(split, len(shards)), 'documents': 0, 'tokens': 0}
      # group_size:1 makes every record its own chunk: a random read decodes one document, not a group.
      writer = ArrayRecordWriter(os.path.join(out_dir, shard['file']), 'group_size:1')
    writer.write(np.asarray(tokens, _DTYPE).tobytes())
    shard['documents'] += 1
    shard['tokens'] += len(tokens)
  bar.close()
  if writer is not None:
    close()
  return {'documents': sum(s['documents'] for s in shards), 'tokens': sum(s['tokens'] for s in shards),
          'shards': shards}


# The sources pretokenize reads: text (the others are token directories already, or synthetic and made per run).
TEXT_SOURCES = ('builtin', 'files', 'tfds', 'parquet')


def pretokenize(config, out_dir: str, shard_tokens: int = DEFAULT_SHARD_TOKENS, workers: int = 0,
                progress: bool = False) -> dict:
  """Tokenizes both splits of config.data's source into `out_dir` (a new or empty directory).

  Everything is written into a hidden sibling folder first, which becomes `out_dir` by one rename once the manifest
  is complete: a stopped run leaves no directory that looks like a corpus (the next run clears its leftovers).
  """
  d = config.data
  if d.source not in TEXT_SOURCES:
    raise ConfigError(f'config.data.source={d.source!r} is invalid for pretokenize: name the text source '
                      f'({", ".join(TEXT_SOURCES)}) to tokenize')
  checks.number(shard_tokens, '--shard-tokens', integer=True, positive=True)
  checks.number(workers, '--workers', integer=True, nonnegative=True)
  out = pathlib.Path(out_dir)
  if (out / MANIFEST).exists():
    raise ConfigError(f'{out_dir} already holds a pretokenized corpus ({MANIFEST}); choose another --out')
  checks.path(out, '--out', kind='dir', exists=False, writable=True)
  if out.is_dir() and any(out.iterdir()):
    raise ConfigError(f'--out={out_dir}: holds other files; pretokenize writes a new (or empty) directory')
  tokenizer = pipeline.checked_tokenizer(config)
  partial = out.parent / f'.{out.name}.partial'
  if partial.exists():
    logging.warning('removing %s, left by a pretokenize that did not finish', partial)
    shutil.rmtree(partial)
  partial.mkdir(parents=True)
  manifest = {
      'format': FORMAT,
      'created': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC'),
      'tokenizer': {'spec': d.tokenizer, 'hash': tokenizers.fingerprint(d.tokenizer),
                    'vocab_size': tokenizer.vocab_size, 'eos_id': tokenizer.eos_id, 'bos_id': tokenizer.bos_id},
      'dtype': _DTYPE.str,
      'made_with_seq_len': int(d.seq_len),  # For the record only: documents do not depend on it.
      'splits': {},
  }
  try:
    for split in SPLITS:
      source = sources.make_source(d, split)
      manifest.setdefault('source', _source_record(d, source))
      manifest['splits'][split] = {'source': repr(source), **_write_split(source, tokenizer, str(partial), split,
                                                                          shard_tokens, workers, progress)}
    with open(partial / MANIFEST, 'w') as f:
      json.dump(manifest, f, indent=1)
      f.write('\n')
    if out.is_dir():
      out.rmdir()  # Empty (checked above); the rename takes its place.
    os.rename(partial, out)
  except BaseException:
    shutil.rmtree(partial, ignore_errors=True)
    raise
  return manifest


def read_manifest(directory: str) -> dict:
  path = os.path.join(directory, MANIFEST)
  if not os.path.isfile(path):
    raise ConfigError(f'config.data.paths={directory!r} is invalid: no {MANIFEST} (write one with '
                      '`python -m hybrid_jax pretokenize`)')
  manifest = readers.read_json(path, 'pretokenized manifest', required=('format', 'tokenizer', 'splits'))
  if manifest.get('format') != FORMAT:
    raise sources.DataError(f'{path}: not a {FORMAT!r} manifest')
  return manifest


def check_tokenizer(manifest: dict, directory: str, tokenizer_spec: str) -> None:
  """ConfigError naming both when the run's tokenizer is not the one the directory was written with."""
  made = manifest['tokenizer']
  run_hash = tokenizers.fingerprint(tokenizer_spec)
  if made['hash'] != run_hash:
    raise ConfigError(f'config.data.tokenizer={tokenizer_spec!r} ({run_hash}) does not match the tokenizer '
                      f"{directory} was pretokenized with: {made['spec']!r} ({made['hash']}, vocabulary "
                      f"{made['vocab_size']}); set config.data.tokenizer to that file or pretokenize again")


class PretokenizedSource:
  """One split of a pretokenized directory: `[i]` is document i's int32 tokens (no EOS), read at random."""

  def __init__(self, directory: str, split: str, tokenizer_spec: str):
    if split not in SPLITS:
      raise ValueError(f"split={split!r} is invalid: use 'train' or 'eval'")
    self.directory, self.split = str(directory), split
    manifest = read_manifest(self.directory)
    check_tokenizer(manifest, self.directory, tokenizer_spec)
    self.shards = manifest['splits'][split]['shards']
    if not self.shards:
      raise sources.DataError(f'{self.directory}: the {split} split holds no documents')
    self.paths = [os.path.join(self.directory, s['file']) for s in self.shards]
    for path, shard in zip(self.paths, self.shards):
      if not os.path.isfile(path):
        raise sources.DataError(f'{path}: shard listed in {MANIFEST} is missing')
      size = os.path.getsize(path)
      if size != shard['bytes']:
        raise sources.DataError(f'{path}: {size} bytes, but {MANIFEST} records {shard["bytes"]} (truncated or '
                                'rewritten); pretokenize again or restore the file')
    self._ends = np.cumsum([s['documents'] for s in self.shards])
    self._readers = {}

  def _reader(self, shard: int):
    """The shard's reader, opened on first use (in each process); DataError naming the file if it is damaged."""
    reader = self._readers.get(shard)
    if reader is None:
      path = self.paths[shard]
      try:
        reader = grain.sources.ArrayRecordDataSource(path)
      except Exception as e:  # array_record raises RuntimeError / ValueError for a damaged file.
        raise sources.DataError(f'{path}: not a readable ArrayRecord shard ({type(e).__name__}: {e}); pretokenize '
                                'again or restore the file') from e
      if len(reader) != self.shards[shard]['documents']:
        raise sources.DataError(f"{path}: holds {len(reader)} records, {MANIFEST} records "
                                f"{self.shards[shard]['documents']}")
      self._readers[shard] = reader
    return reader

  def __len__(self):
    return int(self._ends[-1])

  def __getitem__(self, index: int) -> np.ndarray:
    shard = int(np.searchsorted(self._ends, index, side='right'))
    path = self.paths[shard]
    local = index - (int(self._ends[shard - 1]) if shard else 0)
    reader = self._reader(shard)
    try:
      record = reader[local]
    except Exception as e:  # A corrupt chunk fails its checksum inside array_record.
      raise sources.DataError(f'{path}: record {local} (document {index} of the {self.split} split) cannot be '
                              f'read ({type(e).__name__}: {e})') from e
    if len(record) % _DTYPE.itemsize:
      raise sources.DataError(f'{path}: record {local} has {len(record)} bytes, not a whole number of int32 tokens')
    return np.frombuffer(record, _DTYPE).astype(np.int32)

  def __getstate__(self):
    state = dict(self.__dict__)
    state['_readers'] = {}  # Each grain worker opens its own readers.
    return state

  def __repr__(self):
    return f'PretokenizedSource(directory={self.directory!r}, split={self.split!r}, documents={len(self)})'


def main(argv) -> int:
  """`python -m hybrid_jax pretokenize --config=FILE[:ARG] [--config.KEY=VALUE ...] --out DIR`."""
  parser = command_line.ArgumentParser(prog='python -m hybrid_jax pretokenize', description=__doc__.split('\n\n')[0],
                                       epilog='--config.KEY=VALUE overrides (e.g. --config.data.paths=...) follow '
                                       '--config as for train.')
  parser.add_argument('--config', required=True, help='config file[:arg], as for train')
  parser.add_argument('--out', required=True, type=checks.OUT_DIR,
                      help='directory to write (shards + manifest.json); written under a temporary name and renamed '
                      'when complete')
  parser.add_argument('--shard-tokens', type=checks.POSITIVE_INT,
                      default=DEFAULT_SHARD_TOKENS, help='tokens per shard, at most')
  parser.add_argument('--workers', type=checks.NONNEGATIVE_INT, default=0,
                      help='grain worker processes that tokenize')
  parser.add_argument('--no-progress', action='store_true', help='no progress bar')
  args, overrides = parser.parse_known_args(argv)
  if overrides and not overrides[0].startswith('--config.'):
    parser.error(f'unrecognized arguments: {" ".join(overrides)}')
  _, _, config = load_run(shlex.join([args.config, *overrides]))
  manifest = pretokenize(config, args.out, args.shard_tokens, args.workers, progress=not args.no_progress)
  for split, entry in manifest['splits'].items():
    print(f"{split}: {entry['documents']} documents, {entry['tokens']} tokens, {len(entry['shards'])} shards")
  print(f'train on it with --config.data.source=pretokenized --config.data.paths={args.out} '
        f"--config.data.tokenizer={manifest['tokenizer']['spec']}")
  return 0
