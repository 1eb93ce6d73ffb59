"""Gradient influence G(d): how strongly the model's output depends on the input d tokens back.

s = the sum of logits over the vocabulary, averaged over the last `last` (20) positions of a T-token context;
G(d) = mean over documents of ||ds / de_{T-d}||_2, where e_i is the input embedding at 0-based position i, so
d = 1 is the last token and d = T the first. Flat G beyond some d means tokens further back barely matter; the
study measured it at T = 8,192 over 1,000 held-out documents.

Rows are held-out batches as the run's data.packing packs them: with 'documents' a row holds several documents,
kept apart as in training, so a token of an earlier document than the last positions' has no influence (0), and
G(d) at large d also says how often the last document reaches back d tokens.
"""

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from hybrid_jax.inspection import forward as forward_lib
from hybrid_jax.analysis import report
from hybrid_jax.analysis.restriction import eval_batches
from hybrid_jax.errors import InputError


def make_gradient_norms(model_def, *, last: int = 20):
  """Jitted (params, tokens [B, T], positions=None, segment_ids=None) -> ||ds/de_i||_2 per position [B, T]; a row
  is one document, or the documents of `segment_ids` kept apart."""
  def norms(params, tokens, positions=None, segment_ids=None):
    model = model_def.bind(params)
    t = tokens.shape[1]
    if not 0 < last <= t:
      raise InputError(f'last={last} must be in [1, T={t}]')
    queries = jnp.broadcast_to(jnp.arange(t - last, t), (tokens.shape[0], last))

    def s(e):  # Rows are independent, so the gradient of the batch sum is each row's own gradient.
      logits = forward_lib.forward(model, embeddings=e, positions=positions, segment_ids=segment_ids,
                                   logit_positions=queries)['logits']
      return jnp.sum(jnp.mean(jnp.sum(logits.astype(jnp.float32), axis=-1), axis=-1))

    grads = jax.grad(s)(forward_lib.embed(model, tokens))
    return jnp.linalg.norm(grads, axis=-1)
  return jax.jit(norms)


def influence(norms) -> np.ndarray:
  """G[d - 1] for d = 1..T from per-position norms [N, T] (mean over documents)."""
  return np.asarray(norms, np.float64).mean(axis=0)[::-1]


def plot(result: dict, path, *, title: str = 'Gradient influence') -> str:
  d = np.asarray(result['distance'], float)
  g = np.asarray(result['G'], float)
  keep = g > 0  # Log axes cannot show zeros (tokens outside the receptive field).
  fig = report.figure(6, 4)
  ax = fig.subplots()
  ax.plot(d[keep], g[keep], linewidth=1)
  ax.set_xscale('log')
  ax.set_yscale('log')
  ax.set(xlabel='distance d (tokens back from the end)', ylabel='G(d) = mean ||ds/de_{T-d}||', title=title)
  ax.grid(True, which='both', alpha=0.3)
  return str(report.save(fig, path))


def run(run, *, context: int | None = None, num_samples: int = 16, batch_size: int = 4, last: int = 20,
        out=None, progress: bool = True) -> dict:
  """The tool on held-out text of the run's data source: `gradient_influence.json` and `.png`."""
  context = int(context or run.config.data.seq_len)
  if num_samples <= 0 or batch_size <= 0:
    raise InputError(f'num_samples={num_samples} and batch_size={batch_size} must be positive')
  if not 0 < last <= context:
    raise InputError(f'last={last} must be in [1, context={context}]')
  cfg = run.config.copy_and_resolve_references()
  cfg.train.batch_size = batch_size
  batches = eval_batches(cfg, context, -(-num_samples // batch_size))
  fn = make_gradient_norms(run.model_def, last=last)
  norms = [np.asarray(fn(run.params, jnp.asarray(b['inputs']),
                         **{k: jnp.asarray(b[k]) for k in ('positions', 'segment_ids') if k in b}))
           for b in tqdm.tqdm(batches, desc='rows', disable=not progress)]
  norms = np.concatenate(norms)[:num_samples]
  g = influence(norms)
  result = {'distance': list(range(1, context + 1)), 'G': g.tolist(), 'context': context, 'last': last,
            'num_samples': int(len(norms)), 'workdir': str(run.workdir), 'step': run.step}
  directory = report.output_dir(run.workdir, out)
  result['plot'] = plot(result, directory / 'gradient_influence.png', title=f'Gradient influence (step {run.step})')
  result['json'] = str(report.write_json(directory / 'gradient_influence.json', result))
  return result
