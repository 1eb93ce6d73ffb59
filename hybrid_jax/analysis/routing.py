"""`analyze routing`: which experts the needle and the answer-producing tokens of needle-in-a-haystack prompts are
routed to, per MoE layer, against the rest of the prompt (statistics in routing_stats.py).

Token groups of each prompt (needles.encode): the needle's tokens; the query, the positions P-1 ... P-2+A whose
outputs predict the A answer tokens (P: the prompt's length); the control, every other prompt token. The routes come
from the inspection forward pass (the same function as the model's, hybrid_jax.inspection.forward), so they are the
experts the model computes with.
"""

import jax
import numpy as np

from hybrid_jax.analysis import needles, report, retrieval_heads, routing_stats
from hybrid_jax.errors import InputError
from hybrid_jax.inspection import forward as forward_lib
from hybrid_jax.models import moe


def groups(batch: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Bool [B, T] masks (needle, query, control) of a needles.batch."""
  b, t = batch['tokens'].shape
  pos = np.arange(t)[None, :]
  needle = np.zeros((b, t), bool)
  for row in range(b):
    needle[row, batch['needle'][row][batch['needle_valid'][row]]] = True
  start = batch['prompt_len'][:, None] - 1
  query = (pos >= start) & (pos < start + batch['answer_len'][:, None])
  control = (pos < start) & ~needle
  return needle, query & ~needle, control


def same_tokens(tokens: np.ndarray, needle: np.ndarray, control: np.ndarray) -> np.ndarray:
  """Bool [B, T]: the control tokens of each row whose id is one of that row's needle token ids."""
  return np.stack([np.isin(row, row[mask]) for row, mask in zip(tokens, needle)]) & control


def routes(model_def, params, tokens) -> dict:
  """{layer index: experts [B, T, k]} of every MoE layer on tokens [B, T]; model_def a train.state.ModelDef."""

  @jax.jit
  def run(p, t):
    return forward_lib.forward(model_def.bind(p), t, routes=True)['routes']

  return {layer: np.asarray(e) for layer, e in run(params, tokens).items()}


def score(model_def, model_cfg, params, samples, tokenizer, *, draws: int = 200, seed: int = 0) -> dict:
  """Per MoE layer: each group's expert load and routing_stats' distances and overlaps."""
  if not moe.layer_count(model_cfg):
    raise InputError('analyze routing needs a model with mixture-of-experts layers (model.moe.blocks or a '
                     "'moe' layer in model.cycle); this one has none")
  encoded, skipped = retrieval_heads.encode_all(samples, tokenizer)
  batch = needles.batch(encoded, pad_id=tokenizer.eos_id)
  needle, query, control = groups(batch)
  chosen = routes(model_def, params, batch['tokens'])
  e = int(model_cfg.moe.num_experts)
  twins = same_tokens(batch['tokens'], needle, control)
  layers = [{'index': layer, **routing_stats.layer_statistics(experts, needle, query, control, e, draws=draws,
                                                               seed=seed, same_tokens=twins)}
            for layer, experts in sorted(chosen.items())]
  return {'num_samples': len(encoded), 'skipped_samples': skipped, 'num_experts': e,
          'top_k': int(model_cfg.moe.top_k), 'layers': layers}


def plot(result: dict, path, *, title: str = 'Routing') -> str:
  """Per MoE layer, each group's load over the experts."""
  rows = result['layers']
  fig = report.figure(2.0 + 0.35 * result['num_experts'], 1.0 + 2.0 * len(rows))
  axes = np.atleast_1d(fig.subplots(len(rows), 1))
  width = 0.27
  for ax, row in zip(axes, rows):
    x = np.arange(result['num_experts'])
    for i, name in enumerate(('needle', 'query', 'control')):
      ax.bar(x + (i - 1) * width, row[name]['load'], width, label=f"{name} ({row[name]['tokens']} tokens)")
    ax.set_title(f"{title}: layer {row['index']}: needle TV {row['needle']['tv']:.3f} "
                 f"(chance {row['needle']['null_p95']:.3f}), query TV {row['query']['tv']:.3f} "
                 f"(chance {row['query']['null_p95']:.3f})", fontsize=8)
    ax.set_xlabel('expert')
    ax.set_ylabel('share of assignments')
    ax.legend(fontsize=7)
  return str(report.save(fig, path))


def run(run, *, source: str = 'niah_single_1', num_samples: int = 20, length: int | None = None, seed: int = 42,
        draws: int = 200, out=None) -> dict:
  """The tool on a loaded run: samples, statistics, `routing.json` and `routing.png`."""
  length = length or int(run.config.data.seq_len)
  samples = needles.make_samples(source, num_samples, length=length, tokenizer=run.tokenizer, seed=seed, values=None,
                                 data_cfg=run.config.data)
  result = score(run.model_def, run.config.model, run.params, samples, run.tokenizer, draws=draws, seed=seed)
  result.update(workdir=str(run.workdir), step=run.step, source=source, length=length, seed=seed)
  directory = report.output_dir(run.workdir, out)
  result['plot'] = plot(result, directory / 'routing.png', title=f'step {run.step}')
  result['json'] = str(report.write_json(directory / 'routing.json', result))
  return result
