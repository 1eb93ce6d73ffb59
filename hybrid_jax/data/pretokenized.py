"""Pretokenized corpora read back: ArrayRecord shards of token documents plus a manifest, a training source.

hybrid_jax.data.pretokenize writes them (the `pretokenize` command); this module reads them
(data.source='pretokenized', data.paths=DIR). Each split ('train', 'eval') is stored in the source's own index
order, one record per document (little-endian int32 tokens, no EOS), so the pipeline reading the directory appends
EOS, shuffles, shards across hosts, mixes long and short documents and packs exactly as it does on the fly: the same
documents give the same batches, and the iterator state resumes the same way. Nothing stored depends on the
sequence length, so one directory serves every data.seq_len.

The manifest (manifest.json, written last) records the tokenizer (spec, content hash, vocabulary, EOS/BOS), the
source and its files, and per split the document and token counts and every shard's records and bytes. Opening a
directory refuses a manifest made with another tokenizer, and a missing, truncated or corrupt shard, naming it.
"""

import os

import grain
import numpy as np

from hybrid_jax import readers
from hybrid_jax.data import sources, tokenizers
from hybrid_jax.errors import ConfigError

FORMAT = 'hybrid_jax pretokenized 1'
MANIFEST = 'manifest.json'
SPLITS = ('train', 'eval')
DTYPE = np.dtype('<i4')


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
    if len(record) % DTYPE.itemsize:
      raise sources.DataError(f'{path}: record {local} has {len(record)} bytes, not a whole number of int32 tokens')
    return np.frombuffer(record, DTYPE).astype(np.int32)

  def __getstate__(self):
    state = dict(self.__dict__)
    state['_readers'] = {}  # Each grain worker opens its own readers.
    return state

  def __repr__(self):
    return f'PretokenizedSource(directory={self.directory!r}, split={self.split!r}, documents={len(self)})'
