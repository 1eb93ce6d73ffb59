"""One jitted forward pass over needle prompts -> every per-sample statistic the needle analyses use.

Queries read per sample (prompt of length P, answer of A tokens fed by teacher forcing):
- P-4 .. P-1: the last 4 prompt queries, for the normalised attention entropy (tracing);
- P-2: the study's retrieval query, whose attention mass on the needle tokens is the retrieval-head score;
- P-1+m for m < A: the query predicting answer token m, for the copy-paste score and NIAH accuracy.

Outputs per sample ([B] or [B, attention layers, heads]):
- 'correct': the greedy prediction equals every answer token under teacher forcing, i.e. greedy decoding would
  start with ' ' + value. One forward pass instead of a decode loop; RULER's substring scoring is more lenient.
- 'mass': attention mass of query P-2 on the needle tokens.
- 'copy' / 'copy_gold': Wu et al. (2024) copy-paste retrieval score: the fraction of needle tokens that a head
  copies, where the head copies at an answer step if its argmax attention lands on a needle token equal to the
  token emitted at that step ('copy': the model's greedy token, Wu's definition; 'copy_gold': the gold answer
  token, which stays informative for models that do not yet answer correctly).
- 'entropy': attention entropy over the last 4 queries, H / ln(visible keys), averaged (0 = one key, 1 = uniform).
"""

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from hybrid_jax.inspection import forward as forward_lib
from hybrid_jax.analysis import needles

LAST_QUERIES = 4
RETRIEVAL_QUERY = 2  # Index of P-2 among the queries above.


def queries(b: dict) -> dict:
  """Adds 'queries' [B, 4 + A] and 'answer_mask' [B, A] to a `needles.batch` (numpy)."""
  pl, al = b['prompt_len'], b['answer_len']
  a = int(al.max())
  last = pl[:, None] - LAST_QUERIES + np.arange(LAST_QUERIES)[None]
  steps = pl[:, None] - 1 + np.arange(a)[None]
  mask = np.arange(a)[None] < al[:, None]
  steps = np.where(mask, steps, pl[:, None] - 1)
  return {**b, 'queries': np.concatenate([last, steps], axis=1).astype(np.int32), 'answer_mask': mask}


class NeedleProbe:
  """Jitted needle statistics for one model definition (and an optional receptive-field restriction)."""

  def __init__(self, model_def, model_cfg, *, restriction=None, mesh=None):
    """`mesh`: the device mesh of sharded params (training); inputs and outputs are then replicated on it, which
    also holds in a multi-process run."""
    self.layers = [l for l in forward_lib.layers(model_cfg) if l.is_attention]
    windows = np.asarray([forward_lib.head_windows(l, model_cfg) for l in self.layers], np.int32)
    self.windows = windows.reshape(len(self.layers), model_cfg.num_heads)

    def probe(params, b):
      model = model_def.bind(params)
      answer_q = b['queries'][:, LAST_QUERIES:]
      out = forward_lib.forward(model, b['tokens'], attention_queries=b['queries'], logit_positions=answer_q,
                                restriction=restriction)
      return _statistics(out, b, self.windows, [l.index for l in self.layers])

    self._replicated = None if mesh is None else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    self._probe = jax.jit(probe, out_shardings=self._replicated)

  def _place(self, x):
    x = np.asarray(x)
    if self._replicated is None:
      return jnp.asarray(x)
    return jax.make_array_from_callback(x.shape, self._replicated, lambda index: x[index])

  def __call__(self, params, b: dict) -> dict:
    """Statistics of one batch (`needles.batch` output) as numpy arrays."""
    b = queries(b)
    return jax.tree.map(np.asarray, self._probe(params, {k: self._place(v) for k, v in b.items()}))

  def run(self, params, encoded, *, pad_id: int, batch_size: int = 8, progress: bool = False) -> dict:
    """Statistics of all samples (`needles.Encoded`), batched by similar length, concatenated in input order."""
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].ids))
    parts = []
    chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    for chunk in tqdm.tqdm(chunks, desc='needle prompts', disable=not progress, leave=False):
      parts.append((chunk, self(params, needles.batch([encoded[i] for i in chunk], pad_id=pad_id))))
    out = {}
    for key in parts[0][1]:
      values = np.concatenate([p[key] for _, p in parts])
      index = np.concatenate([np.asarray(c) for c, _ in parts])
      out[key] = values[np.argsort(index)]
    return out


def _statistics(out, b, windows, layer_indices):
  tokens, q = b['tokens'], b['queries']
  t = tokens.shape[1]
  answer_q = q[:, LAST_QUERIES:]
  amask = b['answer_mask']
  pred = jnp.argmax(out['logits'], axis=-1)  # [B, A]: greedy token at each answer step.
  gold = jnp.take_along_axis(tokens, jnp.minimum(answer_q + 1, t - 1), axis=1)
  correct = jnp.all((pred == gold) | ~amask, axis=1)
  needle, nvalid = b['needle'], b['needle_valid']
  needle_mask = jnp.zeros(tokens.shape, bool).at[jnp.arange(tokens.shape[0])[:, None], needle].max(nvalid)
  n_needle = jnp.maximum(jnp.sum(nvalid, axis=1), 1)[:, None]
  stats = {'mass': [], 'copy': [], 'copy_gold': [], 'entropy': []}
  for row, index in enumerate(layer_indices):
    p = out['attention'][index]  # [B, H, nq, T]
    stats['mass'].append(jnp.sum(p[:, :, RETRIEVAL_QUERY] * needle_mask[:, None], axis=-1))
    last = p[:, :, :LAST_QUERIES]
    ent = -jnp.sum(jnp.where(last > 0, last * jnp.log(jnp.where(last > 0, last, 1.0)), 0.0), axis=-1)
    w = jnp.asarray(windows[row])[None, :, None]
    seen = (q[:, None, :LAST_QUERIES] + 1).astype(jnp.float32)
    seen = jnp.where(w > 0, jnp.minimum(seen, w), seen)
    stats['entropy'].append(jnp.mean(jnp.where(seen > 1, ent / jnp.log(jnp.maximum(seen, 2.0)), 0.0), axis=-1))
    top = jnp.argmax(p[:, :, LAST_QUERIES:], axis=-1)  # [B, H, A]
    top_token = jnp.take_along_axis(tokens[:, None, :], top, axis=2)
    on_needle = (top[..., None] == needle[:, None, None, :]) & nvalid[:, None, None, :]  # [B, H, A, N]
    for key, emitted in (('copy', pred), ('copy_gold', gold)):
      ok = (top_token == emitted[:, None, :]) & amask[:, None, :]
      copied = jnp.any(on_needle & ok[..., None], axis=2)  # [B, H, N]: needle tokens this head copied.
      stats[key].append(jnp.sum(copied, axis=-1) / n_needle)
  h = windows.shape[1] if windows.size else 0
  result = {k: (jnp.stack(v, axis=1) if v else jnp.zeros((tokens.shape[0], 0, h))) for k, v in stats.items()}
  result['correct'] = correct
  return result
