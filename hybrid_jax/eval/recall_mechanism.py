"""Which full-attention heads carry recall, and how strongly long-range answers train them (held-out recall documents).

Head ablation, a retrieval score that does not depend on where a head looks: a head's score in a distance bucket is
the exact-match recall there minus the recall with that head's output zeroed (before the layer's output
projection). Attention mass on the record misses a full layer that reads the pair from positions a sliding layer
copied it to; ablation sees it, because it asks whether the answer needs the head, not where the head looks. Each
full-attention layer is also scored with all its full heads zeroed at once (heads that back each other up show
there and not one by one). The heads scored are the ones that attend fully: every head of a full layer, the full
heads of a head-wise layer.

Gradient signal: per distance bucket, the norm of the gradient that the answer bytes of that bucket's queries (their
mean cross-entropy, teacher-forced) send to each full layer's query and key projections (the full heads' columns).
The study explains large-window laziness by this signal: where a wide sliding window already answers mid-range
queries, less of it reaches the full layers.
"""

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_jax.inspection import forward as forward_lib
from hybrid_jax.eval import recall as recall_lib


def full_heads(model_cfg) -> dict[int, list[int]]:
  """{attention layer index: its query heads that attend fully} for every layer with any."""
  out = {}
  for layer in forward_lib.layers(model_cfg):
    if layer.is_attention:
      heads = [h for h, window in enumerate(forward_lib.head_windows(layer, model_cfg)) if window == 0]
      if heads:
        out[layer.index] = heads
  return out


def _predict(model_def, params, tokens, answer_positions, scales, layers):
  """Argmax prediction at each answer position [B, Q, V] with head outputs scaled by `scales` [len(layers), Hq]."""
  b, q, v = answer_positions.shape
  out = forward_lib.forward(model_def.bind(params), tokens, logit_positions=answer_positions.reshape(b, -1),
                            head_scale={layer: scales[i] for i, layer in enumerate(layers)})
  return jnp.argmax(out['logits'], axis=-1).reshape(b, q, v)


def _answer_loss(model_def, params, tokens, answer_positions, answers, weights):
  """Mean over the weighted queries of the summed cross-entropy of their answer bytes (weights [B, Q])."""
  b, q, v = answer_positions.shape
  logits = forward_lib.forward(model_def.bind(params), tokens,
                               logit_positions=answer_positions.reshape(b, -1))['logits'].astype(jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(logp, answers.reshape(b, -1)[..., None], axis=-1)[..., 0].reshape(b, q, v).sum(-1)
  return jnp.sum(weights * nll) / jnp.maximum(jnp.sum(weights), 1.0)


def _qk_norms(model_def, grads, heads: dict, groups: int) -> jnp.ndarray:
  """||(dL/dW_q, dL/dW_k)|| over the full heads of each full layer [len(heads)] from a gradient tree."""
  blocks = forward_lib.blocks(model_def.bind(grads))
  norms = []
  for layer, query_heads in heads.items():
    mixer = blocks[layer].mixer
    kv_heads = sorted({h // groups for h in query_heads})
    gq = mixer.wq[...][:, jnp.asarray(query_heads)]
    gk = mixer.wk[...][:, jnp.asarray(kv_heads)]
    norms.append(jnp.sqrt(jnp.sum(jnp.square(gq.astype(jnp.float32))) + jnp.sum(jnp.square(gk.astype(jnp.float32)))))
  return jnp.stack(norms)


class RecallMechanism:
  """Head ablation and the gradient signal of one model definition on fixed held-out documents; call with params."""

  def __init__(self, model_def, model_cfg, held: recall_lib.HeldOut, edges, *, batch_size: int = 32):
    self.held, self.edges, self.batch_size = held, [int(e) for e in edges], int(batch_size)
    self.heads = full_heads(model_cfg)
    self.layers = list(self.heads)
    self.num_heads = int(model_cfg.num_heads)
    groups = int(model_cfg.num_heads) // int(model_cfg.num_kv_heads)
    layers = tuple(self.layers)
    self._predict = jax.jit(lambda params, *a: _predict(model_def, params, *a, layers))
    self.bucket = recall_lib.bucket_index(held.distances, self.edges)  # [N, Q]
    weights = np.stack([(self.bucket == j) for j in range(len(self.edges) - 1)]).astype(np.float32)

    def signal(params, tokens, answer_positions, answers):
      return jnp.stack([_qk_norms(model_def, jax.grad(lambda p, w=w: _answer_loss(
          model_def, p, tokens, answer_positions, answers, w))(params), self.heads, groups) for w in weights])
    self._signal = jax.jit(signal) if self.layers else None

  def _scales(self, layer=None, head=None) -> np.ndarray:
    """Head multipliers [len(layers), Hq]: all ones, with `head` of `layer` zeroed (every full head if 'all')."""
    scales = np.ones((len(self.layers), self.num_heads), np.float32)
    if layer is not None:
      row = self.layers.index(layer)
      scales[row, self.heads[layer] if head == 'all' else [head]] = 0.0
    return scales

  def _accuracy(self, params, scales) -> list:
    """Exact-match accuracy per bucket (None where a bucket has no queries) with heads scaled by `scales`."""
    h = self.held
    preds = [np.asarray(self._predict(params, h.tokens[i:i + self.batch_size],
                                      h.answer_positions[i:i + self.batch_size], scales))
             for i in range(0, len(h.ids), self.batch_size)]
    correct = np.concatenate(preds) == h.answers
    return [b['accuracy'] for b in recall_lib.score(correct, h.distances, self.edges)['buckets']]

  def ablation(self, params) -> dict:
    """{'base': recall per bucket, 'layers': {layer: {'heads': {head: drop per bucket}, 'all': drop per bucket,
    'best': the largest head drop per bucket}}}; a drop is the base recall minus the ablated one."""
    base = self._accuracy(params, self._scales())
    drop = lambda acc: [None if a is None or b is None else a - b for a, b in zip(base, acc)]
    layers = {}
    for layer, heads in self.heads.items():
      per_head = {head: drop(self._accuracy(params, self._scales(layer, head))) for head in heads}
      best = [max((d[j] for d in per_head.values() if d[j] is not None), default=None) for j in range(len(base))]
      layers[str(layer)] = {'heads': {str(h): d for h, d in per_head.items()},
                            'all': drop(self._accuracy(params, self._scales(layer, 'all'))), 'best': best}
    return {'base': base, 'layers': layers}

  def gradient_signal(self, params) -> dict:
    """{layer: norm of the query/key gradient per bucket} (None where a bucket has no queries)."""
    if self._signal is None:
      return {}
    h = self.held
    norms = np.asarray(self._signal(params, h.tokens, h.answer_positions, h.answers))  # [buckets, layers]
    empty = [not (self.bucket == j).any() for j in range(len(self.edges) - 1)]
    return {str(layer): [None if empty[j] else float(norms[j, i]) for j in range(len(empty))]
            for i, layer in enumerate(self.layers)}
