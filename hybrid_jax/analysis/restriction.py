"""Receptive-field restriction at inference: how much each layer type's long-range view matters.

Restrict the full-attention layers, or the efficient layers, to a window W with S sink tokens (semantics in
windowed.py) and evaluate, for each restriction and without one:
- 'loss': held-out loss, overall and by position bucket of the row (the run's data source at `seq_len`, packed as
  data.packing says: with 'documents' each document of a row on its own, over the targets training counts);
- 'niah': needle accuracy (teacher-forced greedy match, see needle_probe.py) on needle prompts;
- 'longppl': LongPPL / PPL over documents with precomputed key spans (hybrid_jax.eval.longppl), when given.
The result is a table of metric vs restriction (JSON, Markdown) and a plot of each metric against W.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from hybrid_jax import readers
from hybrid_jax.inspection import forward as forward_lib
from hybrid_jax.analysis import needle_probe, needles, report, retrieval_heads
from hybrid_jax.inspection.windowed import Restriction
from hybrid_jax.data.pipeline import make_eval_batches
from hybrid_jax.errors import InputError
from hybrid_jax.eval import longppl as longppl_lib
from hybrid_jax.eval.perplexity import loss_by_position
from hybrid_jax.train.step import target_weights, token_nll

METRICS = ('loss', 'niah', 'longppl')


def make_nll(model_def, restriction):
  """Jitted (params, inputs [B, T], targets [B, T], positions=None, segment_ids=None) -> per-token NLL [B, T] under
  `restriction`; with segment ids each document of a packed row is read on its own, as the model trained on it."""
  def nll(params, inputs, targets, positions=None, segment_ids=None):
    logits = forward_lib.forward(model_def.bind(params), inputs, positions=positions, segment_ids=segment_ids,
                                 restriction=restriction)['logits']
    return token_nll(logits, targets)[0]
  return jax.jit(nll)


def eval_batches(config, seq_len: int, num_batches: int) -> list[dict]:
  c = config.copy_and_resolve_references()
  c.data.seq_len = int(seq_len)
  return make_eval_batches(c, num_batches)


def batch_nll(nll_fn, params, batch: dict) -> tuple[np.ndarray, np.ndarray]:
  """(per-token NLL [B, T], weight [B, T] of each target) of a held-out batch: its documents kept apart, and only
  the targets the training loss counts weigh 1 (`target_weights`: not the EOS asked for the next document)."""
  documents = {k: jnp.asarray(batch[k]) for k in ('positions', 'segment_ids') if k in batch}
  nll = np.asarray(nll_fn(params, jnp.asarray(batch['inputs']), jnp.asarray(batch['targets']), **documents),
                   np.float64)
  weights = target_weights(batch)
  return nll, np.ones_like(nll) if weights is None else np.asarray(weights, np.float64)


def loss_metric(nll_fn, params, batches, buckets: int) -> dict:
  total, counts = None, None
  for b in batches:
    nll, weights = batch_nll(nll_fn, params, b)
    s, c = (nll * weights).sum(axis=0), weights.sum(axis=0)
    total, counts = (s, c) if total is None else (total + s, counts + c)
  return {'loss': float(total.sum() / counts.sum()), 'loss_by_position': loss_by_position(total, counts, buckets)}


def longppl_metric(nll_fn, params, tokenizer, texts, spans, *, pad_to: int = 256) -> dict:
  """LongPPL / PPL of documents with key spans; each document in one forward pass (right-padded to `pad_to`)."""
  def doc_nll(ids):
    ids = np.asarray(ids, np.int32)
    t = -(-len(ids) // pad_to) * pad_to
    padded = np.full((1, t), tokenizer.eos_id, np.int32)
    padded[0, :len(ids)] = ids
    nll = np.asarray(nll_fn(params, jnp.asarray(padded[:, :-1]), jnp.asarray(padded[:, 1:])))[0]
    return np.concatenate([[np.nan], nll[:len(ids) - 1]])
  result = longppl_lib.evaluate_documents(texts, spans, tokenizer.encode_with_offsets, doc_nll)
  result.pop('documents')
  return result


def read_longppl_inputs(texts_path: str, spans_dir: str) -> tuple[list[str], list]:
  """Documents (JSONL, one {'text': ...} per line, document i <-> slice_<i>.txt) and their key spans."""
  texts = [record['text'] for record in readers.read_jsonl(texts_path, '--longppl-texts', {'text': str})]
  spans = longppl_lib.read_span_dir(spans_dir)
  missing = [i for i in range(len(texts)) if i not in spans]
  if missing:
    raise InputError(f'{spans_dir} has no slice_<i>.txt for document(s) {missing[:5]} of {texts_path}')
  return texts, [spans[i] for i in range(len(texts))]


def evaluate(run, restrictions, *, metrics=('loss', 'niah'), seq_len=None, batches=2, buckets=None,
             niah_source='study', niah_samples=16, niah_length=None, seed=42, batch_size=8, longppl_texts=None,
             longppl_spans=None, progress=True) -> dict:
  """Rows {restriction, target, window, sinks, <metric>...}: first the unrestricted model, then each restriction."""
  unknown = sorted(set(metrics) - set(METRICS))
  if unknown:
    raise InputError(f'unknown metric(s) {unknown}: use {", ".join(METRICS)}')
  if 'longppl' in metrics and not (longppl_texts and longppl_spans):
    raise InputError('metric longppl needs --longppl-texts (JSONL) and --longppl-spans (folder of slice_<i>.txt)')
  tokenizer, cfg = run.tokenizer, run.config
  seq_len = int(seq_len or cfg.data.seq_len)
  inputs = {}
  if 'loss' in metrics:
    inputs['loss'] = eval_batches(cfg, seq_len, batches)
  if 'niah' in metrics:
    samples = needles.make_samples(niah_source, niah_samples, length=niah_length or seq_len, tokenizer=tokenizer,
                                   seed=seed, values=None, data_cfg=cfg.data)
    inputs['niah'] = retrieval_heads.encode_all(samples, tokenizer)[0]
  if 'longppl' in metrics:
    inputs['longppl'] = read_longppl_inputs(longppl_texts, longppl_spans)
  rows = []
  for r in tqdm.tqdm([None] + list(restrictions), desc='restrictions', disable=not progress):
    row = {'restriction': 'none' if r is None else r.label(), 'target': None if r is None else r.target,
           'window': None if r is None else r.window, 'sinks': None if r is None else r.sinks,
           'recurrent_chunk': None if r is None else r.recurrent_chunk}
    nll_fn = make_nll(run.model_def, r) if {'loss', 'longppl'} & set(metrics) else None
    if 'loss' in metrics:
      row.update(loss_metric(nll_fn, run.params, inputs['loss'], buckets or int(cfg.eval.position_buckets)))
    if 'niah' in metrics:
      probe = needle_probe.NeedleProbe(run.model_def, cfg.model, restriction=r)
      stats = probe.run(run.params, inputs['niah'], pad_id=tokenizer.eos_id, batch_size=batch_size)
      row['niah_accuracy'] = float(stats['correct'].mean())
    if 'longppl' in metrics:
      lp = longppl_metric(nll_fn, run.params, tokenizer, *inputs['longppl'])
      row.update(longppl=lp['longppl'], log_longppl=math.log(lp['longppl']) if lp['longppl'] > 0 else None,
                 ppl=lp['ppl'])
    rows.append(row)
  return {'rows': rows, 'seq_len': seq_len, 'metrics': list(metrics), 'niah_source': niah_source}


def _columns(rows):
  return [c for c in ('loss', 'niah_accuracy', 'longppl', 'log_longppl', 'ppl') if c in rows[0]]


def markdown(result: dict) -> str:
  cols = _columns(result['rows'])
  lines = ['| restriction | ' + ' | '.join(cols) + ' |', '| --- |' + ' --- |' * len(cols)]
  for row in result['rows']:
    cells = [f'{row[c]:.4f}' if isinstance(row[c], float) else str(row[c]) for c in cols]
    lines.append(f"| {row['restriction']} | " + ' | '.join(cells) + ' |')
  return '\n'.join(lines) + '\n'


def plot(result: dict, path) -> str:
  rows, cols = result['rows'], _columns(result['rows'])
  fig = report.figure(4.2 * max(len(cols), 1), 3.4)
  axes = np.atleast_1d(fig.subplots(1, max(len(cols), 1)))
  for ax, col in zip(axes, cols):
    base = rows[0][col]
    if base is not None:
      ax.axhline(base, color='black', linestyle=':', label='unrestricted')
    for target in ('full', 'efficient'):
      points = sorted((r['window'], r[col]) for r in rows[1:] if r['target'] == target and r[col] is not None)
      if points:
        ax.plot(*zip(*points), marker='o', label=f'{target} layers restricted')
    ax.set_xscale('log', base=2)
    ax.set(xlabel='window W (tokens)', ylabel=col, title=col)
    ax.legend(fontsize=7)
  return str(report.save(fig, path))


def run(run, restrictions, *, out=None, **kwargs) -> dict:
  """The tool: `restriction.json`, `restriction.md` and `restriction.png` in the run's analysis folder."""
  result = evaluate(run, restrictions, **kwargs)
  result.update(workdir=str(run.workdir), step=run.step)
  directory = report.output_dir(run.workdir, out)
  (directory / 'restriction.md').write_text(markdown(result))
  result['plot'] = plot(result, directory / 'restriction.png')
  result['json'] = str(report.write_json(directory / 'restriction.json', result))
  return result


__all__ = ['Restriction', 'evaluate', 'run', 'markdown', 'plot']
