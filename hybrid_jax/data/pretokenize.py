"""Tokenize a corpus once: ArrayRecord shards of token documents plus a manifest, read back as a training source.

The `pretokenize` command writes every split of a text source in this format; hybrid_jax.data.pretokenized reads it
back (data.source='pretokenized'). At study scale the same corpus would otherwise be tokenized by every run.

    python -m hybrid_jax pretokenize --config=hybrid:arch=swa128_nope,scale=s1 \\
        --config.data.source=parquet --config.data.paths='corpus/*.parquet' \\
        --config.data.tokenizer=tok/tokenizer.json --out /data/corpus_tok
"""

import datetime
import json
import logging
import os
import pathlib
import shutil

import grain
import numpy as np
import tqdm

from hybrid_jax import checks
from hybrid_jax.data import catalog, pipeline, pretokenized, tokenizers
from hybrid_jax.errors import ConfigError

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
    writer.write(np.asarray(tokens, pretokenized.DTYPE).tobytes())
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
  if (out / pretokenized.MANIFEST).exists():
    raise ConfigError(f'{out_dir} already holds a pretokenized corpus ({pretokenized.MANIFEST}); choose another --out')
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
      'format': pretokenized.FORMAT,
      'created': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC'),
      'tokenizer': {'spec': d.tokenizer, 'hash': tokenizers.fingerprint(d.tokenizer),
                    'vocab_size': tokenizer.vocab_size, 'eos_id': tokenizer.eos_id, 'bos_id': tokenizer.bos_id},
      'dtype': pretokenized.DTYPE.str,
      'made_with_seq_len': int(d.seq_len),  # For the record only: documents do not depend on it.
      'splits': {},
  }
  try:
    for split in pretokenized.SPLITS:
      source = catalog.make_source(d, split)
      manifest.setdefault('source', _source_record(d, source))
      manifest['splits'][split] = {'source': repr(source), **_write_split(source, tokenizer, str(partial), split,
                                                                          shard_tokens, workers, progress)}
    with open(partial / pretokenized.MANIFEST, 'w') as f:
      json.dump(manifest, f, indent=1)
      f.write('\n')
    if out.is_dir():
      out.rmdir()  # Empty (checked above); the rename takes its place.
    os.rename(partial, out)
  except BaseException:
    shutil.rmtree(partial, ignore_errors=True)
    raise
  return manifest
