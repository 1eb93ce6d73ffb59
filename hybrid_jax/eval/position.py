"""Loss by position inside held-out documents, on the same documents at every context length.

Each evaluated sequence is one held-out document read from its start (`pipeline.held_out_documents`), so position
p is a document's p-th token. One document set, fixed by the longest context and truncated for the shorter ones,
serves every context length: a causal model then gives the same numbers at every position two contexts share, and
their curves can differ only where the longer context reaches further. Standard errors are across documents, the
unit that varies.
"""

import dataclasses
import math
from typing import Sequence

import numpy as np

from hybrid_jax.data.pipeline import HeldOutDocuments
from hybrid_jax.eval.perplexity import perplexity

# Contexts spanning more than this ratio get a log-scaled position axis.
LOG_AXIS_SPAN = 4
LINE_STYLES = ('-', '--', ':', '-.')


def bucket_edges(lengths: Sequence[int], buckets: int) -> list[int]:
  """Position-bucket edges shared by every context of one evaluation.

  `buckets` equal-width buckets over the shortest context, then one bucket per doubling up to the longest (every
  context length is an edge too): the buckets of two contexts coincide where both reach, and stay readable on a
  log axis. A single context gets plain equal-width buckets.
  """
  shortest, longest = min(lengths), max(lengths)
  edges = set(np.linspace(0, shortest, min(buckets, shortest) + 1).round().astype(int).tolist()) | set(lengths)
  edge = shortest
  while edge < longest:
    edge *= 2
    edges.add(min(edge, longest))
  return sorted(edges)


def document_nll(eval_step, params, documents: HeldOutDocuments, length: int, *, batch_size: int,
                 place=None, packing: str = 'concat') -> np.ndarray:
  """NLL [documents, length] of each document's first `length` tokens.

  A short last batch is filled with copies of its last document (one compiled shape) whose results are dropped;
  `place` puts a batch on devices (e.g. a sharded layout) before the step. With packing='documents' (a run trained
  on documents kept apart) the leading EOS is a document of its own, so the document is read from its own start as
  training read it, and position 0 is the first token predicted from an EOS alone.
  """
  rows = documents.tokens[:, :length + 1]
  out = []
  for start in range(0, len(rows), batch_size):
    chunk = rows[start:start + batch_size]
    real = len(chunk)
    chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - real, axis=0)])
    batch = {'inputs': np.ascontiguousarray(chunk[:, :-1]), 'targets': np.ascontiguousarray(chunk[:, 1:])}
    if packing == 'documents':
      batch['segment_ids'] = np.broadcast_to(np.minimum(np.arange(length, dtype=np.int32), 1) + 1,
                                             (batch_size, length)).copy()
    out.append(np.asarray(eval_step(params, place(batch) if place else batch), np.float64)[:real])
  return np.concatenate(out)


def summarize(nll: np.ndarray, edges: Sequence[int], documents: HeldOutDocuments) -> dict:
  """Loss, perplexity, tokens, documents and loss by position bucket (mean, standard error across documents,
  tokens) of one context's NLL [documents, length]."""
  count, length = nll.shape
  buckets = []
  for a, b in zip(edges[:-1], edges[1:]):
    if b > length:
      break
    per_document = nll[:, a:b].mean(axis=1)
    buckets.append({'start': int(a), 'end': int(b), 'loss': float(per_document.mean()),
                    'stderr': float(per_document.std(ddof=1) / math.sqrt(count)), 'tokens': int(count * (b - a))})
  loss = float(nll.mean())
  return {'loss': loss, 'perplexity': perplexity(loss), 'tokens': int(nll.size), 'documents': count,
          'document_ids': list(documents.ids), 'source': documents.source, 'loss_by_position': buckets}


@dataclasses.dataclass(frozen=True)
class DocumentEval:
  """Per-token NLL of one document set at each context length."""
  documents: HeldOutDocuments
  nll: dict[int, np.ndarray]  # Context length -> [documents, length].

  def summary(self, buckets: int) -> dict[str, dict]:
    """{str(length): summarize(...)} with bucket edges shared by all lengths."""
    edges = bucket_edges(list(self.nll), buckets)
    return {str(n): summarize(nll, edges, self.documents) for n, nll in self.nll.items()}


def evaluate(eval_step, params, documents: HeldOutDocuments, lengths: Sequence[int], *, batch_size: int,
             place=None, packing: str = 'concat') -> DocumentEval:
  """The documents' NLL at each context length (each at most `documents.min_tokens`); `packing` as the run's
  data.packing (see `document_nll`)."""
  if len(documents.ids) < 2:
    raise ValueError(f'loss by position needs at least 2 documents for a standard error, got {len(documents.ids)}')
  too_long = [n for n in lengths if n > documents.min_tokens]
  if too_long:
    raise ValueError(f'context length(s) {too_long} exceed the {documents.min_tokens} tokens held per document')
  return DocumentEval(documents, {int(n): document_nll(eval_step, params, documents, int(n), batch_size=batch_size,
                                                       place=place, packing=packing) for n in lengths})


def plot(ax, curves: dict[str, dict]) -> None:
  """Draws labelled summaries on `ax`: bucket losses with a band of one standard error, the document count in the
  legend; the position axis is log-scaled when the contexts span more than LOG_AXIS_SPAN times. Line styles differ
  so curves that coincide (the same documents at two contexts) stay visible."""
  ends = []
  for i, (label, summary) in enumerate(curves.items()):
    buckets = summary['loss_by_position']
    x = np.array([(b['start'] + b['end']) / 2 for b in buckets])
    y = np.array([b['loss'] for b in buckets])
    err = np.array([b['stderr'] for b in buckets])
    line, = ax.plot(x, y, marker='o', markersize=3, linestyle=LINE_STYLES[i % len(LINE_STYLES)],
                    label=f"{label} ({summary['documents']} documents)")
    ax.fill_between(x, y - err, y + err, color=line.get_color(), alpha=0.2, linewidth=0)
    ends.append(buckets[-1]['end'])
  if max(ends) > LOG_AXIS_SPAN * min(ends):
    ax.set_xscale('log')
  ax.set_xlabel('position in document (tokens)')
  ax.set_ylabel('held-out loss (nats/token), ±1 s.e.')
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
