"""Retrieval heads: which attention heads fetch the needle in needle-in-a-haystack prompts.

Two scores per (layer, head), averaged over samples (definitions in needle_probe.py):
- 'mass': the study's score, the attention mass that the query at position len-2 of the prompt puts on the needle
  tokens; the top-k (default 4) heads are the retrieval heads;
- 'copy': the copy-paste retrieval score of Wu et al. (2024); 'copy_gold' scores copies of the gold answer tokens.
Only attention layers are scored (full, SWA, head-wise); recurrent layers are listed with `scored: false`.
"""

import numpy as np

from hybrid_jax.inspection import forward as forward_lib
from hybrid_jax.analysis import needle_probe, needles, report
from hybrid_jax.errors import InputError

DEFINITIONS = ('mass', 'copy', 'copy_gold')


def encode_all(samples, tokenizer) -> tuple[list, int]:
  """(encoded samples, number skipped because their needle could not be located)."""
  encoded, skipped = [], 0
  for sample in samples:
    try:
      encoded.append(needles.encode(sample, tokenizer))
    except needles.NeedleError:
      skipped += 1
  if not encoded:
    raise needles.NeedleError('the needle could not be located in any sample')
  return encoded, skipped


def top_heads(table: dict, k: int, *, roles=None) -> list[dict]:
  """The k best (layer, head) of a {layer: [score per head]} table, optionally only layers of given roles."""
  entries = [(score, layer, head) for layer, scores in table.items() if roles is None or layer[1] in roles
             for head, score in enumerate(scores)]
  entries.sort(key=lambda e: (-e[0], e[1][0], e[2]))
  return [{'layer': layer[0], 'head': head, 'score': float(score)} for score, layer, head in entries[:k]]


def score(model_def, model_cfg, params, samples, tokenizer, *, top_k: int = 4, batch_size: int = 8,
          progress: bool = False) -> dict:
  """Per-layer, per-head scores of both definitions, the top-k heads of each, and NIAH accuracy."""
  if top_k <= 0:
    raise InputError(f'top_k={top_k} is invalid: must be positive')
  encoded, skipped = encode_all(samples, tokenizer)
  probe = needle_probe.NeedleProbe(model_def, model_cfg)
  stats = probe.run(params, encoded, pad_id=tokenizer.eos_id, batch_size=batch_size, progress=progress)
  means = {d: stats[d].mean(axis=0) for d in DEFINITIONS}  # [attention layers, heads]
  rows = {l.index: i for i, l in enumerate(probe.layers)}
  layer_rows = []
  for layer in forward_lib.layers(model_cfg):
    row = {'index': layer.index, 'kind': layer.kind, 'role': layer.role, 'scored': layer.is_attention}
    for d in DEFINITIONS:
      row[d] = means[d][rows[layer.index]].tolist() if layer.is_attention else None
    layer_rows.append(row)
  tables = {d: {(r['index'], r['role']): r[d] for r in layer_rows if r['scored']} for d in DEFINITIONS}
  return {
      'num_samples': len(encoded), 'skipped_samples': skipped, 'top_k': top_k,
      'niah_accuracy': float(stats['correct'].mean()),
      'layers': layer_rows,
      'top_heads': {d: top_heads(tables[d], top_k) for d in DEFINITIONS},
      'top_full_heads': {d: top_heads(tables[d], top_k, roles=('full',)) for d in DEFINITIONS},
      'definitions': {'mass': 'attention mass of the query at len-2 on the needle tokens (study)',
                      'copy': 'copy-paste retrieval score, greedy emitted token (Wu et al. 2024)',
                      'copy_gold': 'copy-paste retrieval score against the gold answer token'},
  }


def heatmap(result: dict, path, *, title: str = 'Retrieval heads') -> str:
  """Layer x head heat maps of 'mass' and 'copy'; unscored (recurrent) layers are grey and labelled."""
  rows = result['layers']
  heads = max((len(r['mass']) for r in rows if r['scored']), default=1)
  fig = report.figure(2.0 + 0.55 * heads * 2, 1.2 + 0.38 * len(rows))
  axes = fig.subplots(1, 2)
  labels = [f"{r['index']} {r['kind']}" + ('' if r['scored'] else ' (not scored)') for r in rows]
  for ax, d in zip(axes, ('mass', 'copy')):
    grid = np.full((len(rows), heads), np.nan)
    for i, r in enumerate(rows):
      if r['scored']:
        grid[i, :len(r[d])] = r[d]
    ax.set_facecolor('0.85')
    image = ax.imshow(grid, vmin=0, vmax=max(1e-9, np.nanmax(grid) if np.isfinite(grid).any() else 1),
                      cmap='viridis', aspect='auto')
    ax.set_xticks(range(heads), [str(h) for h in range(heads)])
    ax.set_yticks(range(len(rows)), labels)
    ax.set_xlabel('head')
    ax.set_title(f'{title}: {d}')
    for top in result['top_heads'][d]:
      ax.text(top['head'], top['layer'], '*', ha='center', va='center', color='red', fontsize=12)
    fig.colorbar(image, ax=ax)
  return str(report.save(fig, path))


def run(run, *, source: str = 'niah_single_1', num_samples: int = 20, length: int | None = None, seed: int = 42,
        top_k: int = 4, batch_size: int = 8, out=None, progress: bool = True) -> dict:
  """The tool on a loaded run: samples, scores, `retrieval_heads.json` and `retrieval_heads.png`."""
  tokenizer = run.tokenizer
  length = length or int(run.config.data.seq_len)
  samples = needles.make_samples(source, num_samples, length=length, tokenizer=tokenizer, seed=seed, values=None,
                                 data_cfg=run.config.data)
  result = score(run.model_def, run.config.model, run.params, samples, tokenizer, top_k=top_k,
                 batch_size=batch_size, progress=progress)
  result.update(workdir=str(run.workdir), step=run.step, source=source, length=length, seed=seed)
  directory = report.output_dir(run.workdir, out)
  result['plot'] = heatmap(result, directory / 'retrieval_heads.png', title=f'step {run.step}')
  result['json'] = str(report.write_json(directory / 'retrieval_heads.json', result))
  return result
