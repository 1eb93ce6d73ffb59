"""grain pipelines: documents -> tokens + EOS -> long/short mixing -> packed rows -> batches.

Training is an infinite, seeded `grain.IterDataset` whose iterator state (`get_state`/`set_state`, or grain's orbax
handler) restores the stream exactly, so a resumed run sees the same batches it would have seen. Every stage is
index-based (source slice, global shuffle, per-epoch reseed, deterministic mixing schedule, concat-then-split
packing), which is what makes that possible.
"""

import dataclasses
import itertools
import logging

from absl import flags
import grain
import numpy as np

from hybrid_jax import config_keys, cores
from hybrid_jax.errors import ConfigError
from hybrid_jax.data import catalog, sources as sources_lib, tokenizers, validation

log = logging.getLogger(__name__)

# Documents read ahead per stream; small because documents are long (whole files) and the model consumes ~1 per step.
_READ_AHEAD = 32
_READ_THREADS = 4
# Documents tokenized, at most, to decide whether both the long and the short side exist.
_MIX_PROBE_DOCS = 1000


def _read_options() -> grain.ReadOptions:
  """How documents are read: by _READ_THREADS threads, or in the consuming thread when this process may run on one
  core only (a run bound to its share of the cores, hybrid_jax.sweep.local): there the threads could only take turns
  with the training step on that core, and a batch cost 20-50% more CPU with them (docs/notebook/mini_study.md,
  "CPU: the mini-study's input generated once")."""
  if cores.count() == 1:
    return grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
  return grain.ReadOptions(num_threads=_READ_THREADS, prefetch_buffer_size=_READ_AHEAD)


class _Tokenize:
  """A document -> int32 tokens with EOS appended (EOS separates documents once they are packed).

  A document is text, or already tokens (a pretokenized source), which then only get the EOS.
  """

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer

  def __call__(self, document: str | np.ndarray) -> np.ndarray:
    ids = document if isinstance(document, np.ndarray) else self.tokenizer.encode(document)
    out = np.empty(len(ids) + 1, dtype=np.int32)
    out[:-1] = ids
    out[-1] = self.tokenizer.eos_id
    return out


class _LengthFilter:
  """Keeps non-empty documents on one side of `min_tokens` (EOS not counted); `side` None keeps every length."""

  def __init__(self, min_tokens: int, side: str | None):
    self.min_tokens, self.side = min_tokens, side

  def __call__(self, tokens: np.ndarray) -> bool:
    n = len(tokens) - 1
    if n <= 0:
      return False
    if self.side is None:
      return True
    return (n >= self.min_tokens) == (self.side == 'long')


def _as_row(tokens: np.ndarray) -> dict:
  return {'tokens': tokens}


def _is_full(row: dict) -> bool:
  # concat-then-split pads only the final row of a finite stream; segment id 0 marks the padding.
  return bool(row['tokens_segment_ids'][-1])


def _row_tokens(row: dict) -> np.ndarray:
  return row['tokens']


def _inputs_targets(rows: np.ndarray) -> dict:
  return {'inputs': np.ascontiguousarray(rows[:, :-1]), 'targets': np.ascontiguousarray(rows[:, 1:])}


def _with_documents(rows: dict) -> dict:
  """Inputs and targets plus where each document lies, so the model can keep documents apart and the loss can skip
  the target across a boundary (the EOS closing one document does not predict the next one's first token).

  segment_ids / target_segment_ids: the document of each input / target token, numbered from 1 inside each row (0
  would be padding, which full rows never hold); positions: each input token's offset from its document's start in
  this row. A document cut at a row's end continues at the start of the next row as segment 1 with positions from 0
  again (grain numbers each row's pieces afresh): a row is all the context the model sees of it.
  """
  segments = rows['tokens_segment_ids']
  return {**_inputs_targets(rows['tokens']),
          'segment_ids': np.ascontiguousarray(segments[:, :-1]),
          'positions': np.ascontiguousarray(rows['tokens_positions'][:, :-1]),
          'target_segment_ids': np.ascontiguousarray(segments[:, 1:])}


def _pack_and_batch(docs: grain.IterDataset, seq_len: int, batch_size: int, packing: str) -> grain.IterDataset:
  """Concatenates token streams into rows of seq_len + 1 (documents may span rows), then batches rows: int32 [B, T]
  'inputs' and 'targets', and with packing='documents' also the segment ids and positions of `_with_documents`."""
  rows = grain.experimental.ConcatThenSplitIterDataset(docs.map(_as_row), length_struct={'tokens': seq_len + 1})
  rows = rows.filter(_is_full)
  if packing == 'concat':
    return rows.map(_row_tokens).batch(batch_size, drop_remainder=True).map(_inputs_targets)
  return rows.batch(batch_size, drop_remainder=True).map(_with_documents)


def in_worker_processes(dataset: grain.IterDataset, workers: int) -> grain.IterDataset:
  """`dataset` computed by `workers` grain processes, in the same order."""
  if not flags.FLAGS.is_parsed():  # grain's workers read absl flags; outside an absl app use their defaults.
    flags.FLAGS.mark_as_parsed()
  return dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))


def checked_tokenizer(config):
  """The run's tokenizer; ConfigError naming both sizes when model.vocab_size cannot hold its ids."""
  tokenizer = tokenizers.get_tokenizer(config.data.tokenizer)
  if config.model.vocab_size < tokenizer.vocab_size:
    raise ConfigError(f'config.model.vocab_size={config.model.vocab_size} is invalid: must be >= the vocabulary of '
                      f'tokenizer {config.data.tokenizer!r} ({tokenizer.vocab_size})')
  return tokenizer


def _packing(config) -> str:
  return config_keys.choice(config, 'data.packing', validation.PACKINGS)


def _long_min_tokens(data_cfg) -> int:
  return int(data_cfg.long_doc_min_tokens) or int(data_cfg.seq_len)


def _sides_present(tokens: grain.MapDataset, num_docs: int, min_tokens: int) -> tuple[bool, bool]:
  """Whether long and short documents occur among the first documents of the (shuffled) stream."""
  has_long = has_short = False
  for i in range(min(num_docs, _MIX_PROBE_DOCS)):
    n = len(tokens[i]) - 1
    has_long |= n >= min_tokens
    has_short |= 0 < n < min_tokens
    if has_long and has_short:
      break
  return has_long, has_short


def _mixed_stream(tokens: grain.MapDataset, num_docs: int, data_cfg) -> grain.IterDataset:
  """One stream of documents, or long and short streams interleaved long_short_ratio:1 (counted in documents).

  Each side is the whole repeated stream filtered by length, so both stay infinite and index-based (checkpointable).
  """
  ratio = float(data_cfg.long_short_ratio)
  min_tokens = _long_min_tokens(data_cfg)
  has_long, has_short = _sides_present(tokens, num_docs, min_tokens)
  if not (has_long or has_short):  # Filtering would then search forever.
    raise sources_lib.DataError(f'no non-empty document among the first {min(num_docs, _MIX_PROBE_DOCS)} training '
                                'documents')
  if ratio > 0:
    if has_long and has_short:
      long_docs = tokens.filter(_LengthFilter(min_tokens, 'long')).to_iter_dataset(_read_options())
      short_docs = tokens.filter(_LengthFilter(min_tokens, 'short')).to_iter_dataset(_read_options())
      return grain.IterDataset.mix([long_docs, short_docs], weights=[ratio, 1.0])
    log.warning('long/short mixing disabled (data.long_short_ratio=%s): no %s documents (%s %d tokens) among the '
                'first %d of the training stream; using a single stream', ratio,
                'long' if not has_long else 'short', '>=' if not has_long else '<', min_tokens,
                min(num_docs, _MIX_PROBE_DOCS))
  return tokens.filter(_LengthFilter(0, None)).to_iter_dataset(_read_options())


def _in_training_order(docs: grain.MapDataset, config) -> grain.MapDataset:
  """A process's documents in the order training reads them: shuffled (seeded by config.seed), repeated."""
  if config.data.shuffle:
    docs = docs.shuffle(seed=int(config.seed))
  return docs.repeat()


def training_document_indices(config, count: int, *, process_index: int = 0, process_count: int = 1) -> np.ndarray:
  """int64 [count]: the training-split indices of the first `count` documents that make_train_dataset reads in
  this process, in reading order (what hybrid_jax.data.recall_store generates ahead)."""
  n = len(catalog.make_source(config.data, 'train'))
  order = _in_training_order(grain.MapDataset.range(n)[process_index::process_count], config)
  return np.fromiter((order[j] for j in range(count)), np.int64, count)


def make_train_dataset(config, *, process_index: int = 0, process_count: int = 1) -> grain.IterDataset:
  """Infinite training batches of int32[train.batch_size // process_count, data.seq_len]: 'inputs', 'targets', and
  with data.packing='documents' 'segment_ids', 'positions', 'target_segment_ids' (`_with_documents`).

  Each process reads documents process_index::process_count; the order is a seeded shuffle, reshuffled each epoch.
  """
  d = config.data
  if not 0 <= process_index < process_count:
    raise ValueError(f'process_index={process_index} is invalid for process_count={process_count}')
  if config.train.batch_size % process_count:
    raise ConfigError(f'config.train.batch_size={config.train.batch_size} is invalid: must be divisible by the '
                      f'process count {process_count}')
  tokenizer = checked_tokenizer(config)
  source = catalog.make_source(d, 'train')
  docs = grain.MapDataset.source(source)[process_index::process_count]
  if not len(docs):
    raise sources_lib.DataError(f'{source!r} has {len(source)} training documents: too few for process '
                                f'{process_index} of {process_count}')
  tokens = _in_training_order(docs, config).map(_Tokenize(tokenizer))
  stream = _mixed_stream(tokens, len(docs), d)
  batches = _pack_and_batch(stream, int(d.seq_len), config.train.batch_size // process_count, _packing(config))
  if d.worker_count > 0:
    batches = in_worker_processes(batches, int(d.worker_count))
  # Splitting by length filters out most documents of one stream by design; grain would warn about that.
  options = grain.experimental.DatasetOptions(filter_warn_threshold_ratio=None)
  return grain.experimental.WithOptionsIterDataset(batches, options)


def make_eval_batches(config, num_batches: int) -> list[dict]:
  """Up to `num_batches` held-out batches of the global batch size, with the keys of make_train_dataset's; the same
  on every call.

  Held-out documents are taken in a fixed shuffled order (seeded by config.seed), so a few batches sample many
  documents instead of the first files of the source. Fewer batches when the held-out text runs out (with a
  warning); if it cannot fill even one batch, it is repeated.
  """
  d = config.data
  if num_batches <= 0:
    raise ValueError(f'num_batches={num_batches} is invalid: must be positive')
  tokenizer = checked_tokenizer(config)
  source = catalog.make_source(d, 'eval')
  docs = grain.MapDataset.source(source).shuffle(seed=int(config.seed))
  tokens = docs.map(_Tokenize(tokenizer)).filter(_LengthFilter(0, None))
  seq_len, batch_size, packing = int(d.seq_len), int(config.train.batch_size), _packing(config)
  batches = list(itertools.islice(
      _pack_and_batch(tokens.to_iter_dataset(_read_options()), seq_len, batch_size, packing), num_batches))
  if len(batches) < num_batches:
    log.warning('held-out text of %r fills only %d of %d requested eval batches (%d x %d tokens)%s', source,
                len(batches), num_batches, batch_size, seq_len + 1, '; repeating it to fill one' if not batches else '')
  if not batches:
    if all(tokens[i] is None for i in range(len(tokens))):
      raise sources_lib.DataError(f'{source!r} holds no held-out text')
    repeated = tokens.repeat().to_iter_dataset(_read_options())
    batches = list(itertools.islice(_pack_and_batch(repeated, seq_len, batch_size, packing), 1))
  return batches


@dataclasses.dataclass(frozen=True)
class HeldOutDocuments:
  """The first `min_tokens` tokens of held-out documents, each row preceded by EOS (as a document follows another
  in training), so row[:L] / row[1:L + 1] are the inputs / targets of the document's first L tokens."""
  source: str  # repr of the held-out source.
  ids: list[int]  # Index of each document in that source.
  tokens: np.ndarray  # int32 [len(ids), min_tokens + 1].

  @property
  def min_tokens(self) -> int:
    return self.tokens.shape[1] - 1


def held_out_documents(config, min_tokens: int, count: int) -> HeldOutDocuments:
  """The first `count` held-out documents of at least `min_tokens` tokens, in a fixed order seeded by config.seed.

  Shorter documents are skipped, never packed together, so position p of a row is the p-th token of one document.
  Raises DataError naming the source and how many documents qualify when fewer than `count` do.
  """
  if min_tokens <= 0 or count <= 0:
    raise ValueError(f'min_tokens={min_tokens} and count={count} must be positive')
  tokenizer = checked_tokenizer(config)
  source = catalog.make_source(config.data, 'eval')
  ids, rows = [], []
  for index in np.random.default_rng(int(config.seed)).permutation(len(source)):
    tokens = _Tokenize(tokenizer)(source[int(index)])[:-1]
    if len(tokens) >= min_tokens:
      ids.append(int(index))
      rows.append(np.concatenate([[tokenizer.eos_id], tokens[:min_tokens]]).astype(np.int32))
      if len(ids) == count:
        return HeldOutDocuments(repr(source), ids, np.stack(rows))
  raise sources_lib.DataError(
      f'only {len(ids)} of the {len(source)} held-out documents of {source!r} have >= {min_tokens} tokens; loss by '
      f'position needs {count}: lower the document count (eval.documents, eval --ppl-documents; eval.documents=0 '
      'leaves it out of the training report) or the longest context, or hold out more long text')
