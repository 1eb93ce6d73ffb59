"""Exact-match recall accuracy by distance bucket, and where the answer is read from, on held-out recall documents.

Held-out documents are regenerated with their queries (hybrid_jax.data.recall, eval split), fed as in training (the
document's bytes, one row, no padding) and scored teacher-forced: a query is correct when the argmax prediction at
every answer position equals the answer byte (byte accuracy, the fraction of answer bytes right, shows partial
learning). Distances are bucketed by edges e_0 < e_1 < ...: bucket j holds
e_j < distance <= e_{j+1}, so an edge equal to a window w splits queries that window sees (distance <= w) from
those it cannot.

The same forward pass gives, per attention layer and head, the attention mass that the query predicting the first
answer byte puts on the pair's record VALUEKEY (the study's retrieval-head score, with the record as the needle),
averaged per bucket: a layer that retrieves the answer puts its mass there.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_jax.inspection import forward as forward_lib
from hybrid_jax.data import recall as recall_lib


@dataclasses.dataclass(frozen=True)
class HeldOut:
  """Held-out recall documents as arrays (every document has the same number of queries)."""
  ids: list  # Index of each document in the eval split.
  tokens: np.ndarray  # int32 [N, L]: the documents' bytes (the model's inputs).
  answers: np.ndarray  # int32 [N, Q, V]: answer bytes.
  answer_positions: np.ndarray  # int32 [N, Q, V]: inputs whose next-token prediction is each answer byte.
  records: np.ndarray  # int32 [N, Q, 2]: [start, end) of each query's first record (the needle).
  distances: np.ndarray  # int32 [N, Q].


def held_out(data_cfg, count: int) -> HeldOut:
  """The first `count` recall documents (text documents skipped) of the eval split, in index order."""
  if count <= 0:
    raise ValueError(f'count={count} is invalid: must be positive')
  source = recall_lib.RecallSource(data_cfg, 'eval')
  docs, ids = [], []
  for i in range(len(source)):
    doc = source.document(i)
    if doc.kind == 'recall':
      docs.append(doc)
      ids.append(i)
      if len(docs) == count:
        break
  else:
    raise ValueError(f'{source!r} holds only {len(docs)} recall documents; {count} requested')
  s = source.settings
  tokens = np.stack([np.frombuffer(d.text.encode('ascii'), np.uint8) for d in docs]).astype(np.int32)
  answers = np.array([[[ord(c) for c in q.value] for q in d.queries] for d in docs], np.int32)
  positions = np.array([[q.answer_positions() for q in d.queries] for d in docs], np.int32)
  records = np.array([[(q.pair, q.pair + s.record) for q in d.queries] for d in docs], np.int32)
  distances = np.array([[q.distance for q in d.queries] for d in docs], np.int32)
  return HeldOut(ids, tokens, answers, positions, records, distances)


def bucket_index(distances: np.ndarray, edges) -> np.ndarray:
  """Bucket of each distance (e_j < d <= e_{j+1} -> j); -1 outside every bucket."""
  edges = np.asarray(edges)
  j = np.searchsorted(edges, distances, side='left') - 1
  return np.where((distances > edges[0]) & (distances <= edges[-1]), j, -1)


def score(byte_correct: np.ndarray, distances: np.ndarray, edges) -> dict:
  """Exact-match accuracy (every answer byte right) and byte accuracy, overall and per bucket, of boolean
  `byte_correct` [N, Q, V] against `distances` [N, Q]."""
  byte_correct = np.asarray(byte_correct, bool)
  byte_correct = byte_correct.reshape(-1, byte_correct.shape[-1])
  correct, distances = byte_correct.all(axis=-1), np.asarray(distances).ravel()
  index = bucket_index(distances, edges)
  buckets = []
  for j in range(len(edges) - 1):
    hit, bytes_ = correct[index == j], byte_correct[index == j]
    buckets.append({'low': int(edges[j]), 'high': int(edges[j + 1]), 'queries': int(hit.size),
                    'correct': int(hit.sum()), 'accuracy': float(hit.mean()) if hit.size else None,
                    'byte_accuracy': float(bytes_.mean()) if hit.size else None})
  return {'accuracy': float(correct.mean()), 'byte_accuracy': float(byte_correct.mean()),
          'queries': int(correct.size), 'buckets': buckets}


def _statistics(model_def, restriction, params, tokens, answer_positions, records):
  """(argmax prediction at each answer position [B, Q, V], record mass [attention layers, B, H, Q])."""
  b, q, v = answer_positions.shape
  model = model_def.bind(params)
  first = answer_positions[:, :, 0]
  out = forward_lib.forward(model, tokens, attention_queries=first, logit_positions=answer_positions.reshape(b, -1),
                            restriction=restriction)
  pred = jnp.argmax(out['logits'], axis=-1).reshape(b, q, v)
  t = jnp.arange(tokens.shape[1])
  on_record = (t >= records[..., :1]) & (t < records[..., 1:])  # [B, Q, T]
  mass = [jnp.sum(p * on_record[:, None], axis=-1) for _, p in sorted(out['attention'].items())]
  return pred, jnp.stack(mass) if mass else jnp.zeros((0, b, 0, q))


class RecallEval:
  """Jitted scoring of one model definition on fixed held-out documents; call with params."""

  def __init__(self, model_def, model_cfg, held: HeldOut, edges, *, restriction=None, batch_size: int = 32,
               mesh=None):
    self.held, self.edges, self.batch_size = held, [int(e) for e in edges], int(batch_size)
    if list(self.edges) != sorted(set(self.edges)) or len(self.edges) < 2:
      raise ValueError(f'bucket edges {edges} are invalid: need at least two, strictly increasing')
    self.layers = [l for l in forward_lib.layers(model_cfg) if l.is_attention]
    replicated = None if mesh is None else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    self._place = (jnp.asarray if replicated is None else
                   lambda x: jax.make_array_from_callback(x.shape, replicated, lambda index: x[index]))
    self._fn = jax.jit(lambda *a: _statistics(model_def, restriction, *a), out_shardings=replicated)

  def run(self, params) -> tuple[np.ndarray, np.ndarray]:
    """(byte correct [N, Q, V] bool, record mass [attention layers, N, H, Q]) of every held-out query."""
    h = self.held
    preds, masses = [], []
    for i in range(0, len(h.ids), self.batch_size):
      part = slice(i, i + self.batch_size)
      pred, mass = self._fn(params, *(self._place(np.ascontiguousarray(x[part]))
                                      for x in (h.tokens, h.answer_positions, h.records)))
      preds.append(np.asarray(pred))
      masses.append(np.asarray(mass))
    return np.concatenate(preds) == h.answers, np.concatenate(masses, axis=1)

  def summary(self, correct, mass, edges=None) -> dict:
    """{'accuracy', 'byte_accuracy', 'queries', 'buckets', 'layers': [{index, kind, role, mass: [bucket][head]}]}
    over `edges`
    (default: this evaluator's); a bucket without queries has accuracy and mass None."""
    edges = self.edges if edges is None else [int(e) for e in edges]
    result = score(correct, self.held.distances, edges)
    index = bucket_index(self.held.distances, edges)  # [N, Q]
    result['layers'] = []
    for row, layer in enumerate(self.layers):
      per_query = mass[row].transpose(0, 2, 1)  # [N, Q, H]
      per_bucket = [per_query[index == j].mean(axis=0).tolist() if (index == j).any() else None
                    for j in range(len(edges) - 1)]
      result['layers'].append({'index': layer.index, 'kind': layer.kind, 'role': layer.role, 'mass': per_bucket})
    return result

  def __call__(self, params) -> dict:
    return self.summary(*self.run(params))
