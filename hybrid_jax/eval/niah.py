"""Depth x length grids of single-needle NIAH prompts and their heat map.

The heat map (needle depth down, context length across) shows where in the context and from which length a
model stops retrieving, which a single averaged score hides.
"""

from typing import Callable, Sequence

import numpy as np

from hybrid_jax.eval import ruler

DEFAULT_DEPTHS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def build_grid(lengths: Sequence[int], depths: Sequence[float] = DEFAULT_DEPTHS, *, samples_per_cell: int = 1,
               task: str = 'niah_single_2', seed: int = 42, count_tokens: Callable[[str], int] = ruler.utf8_bytes,
               chat_template: str = 'base', essay: str | None = None) -> list[dict]:
  """Samples of a single-needle NIAH task for every (depth, length) cell, each with 'depth' and 'max_seq_length'.

  `depths` are fractions of the haystack (0 = start, 1 = end). Cells use distinct sample indices, so keys and
  values differ between cells while the whole grid stays reproducible by seed.
  """
  spec = ruler.task_spec(task)
  a = spec['args']
  if spec['family'] != 'niah' or a['num_needle_k'] * a['num_needle_v'] * a['num_needle_q'] != 1:
    raise ValueError(f'{task!r} is not a single-needle NIAH task: use one of niah_single_1/2/3')
  if essay is None and a['type_haystack'] == 'essay':
    essay = ruler.builtin_essay(num_words=max(lengths) + 1000)
  grid = []
  for li, length in enumerate(lengths):
    for di, depth in enumerate(depths):
      start = (li * len(depths) + di) * samples_per_cell
      grid += ruler.generate(task, length, samples_per_cell, seed=seed, count_tokens=count_tokens,
                             chat_template=chat_template, essay=essay, depth=float(depth), start_index=start)
  return grid


def score_grid(grid: Sequence[dict], predictions: Sequence[str], depths: Sequence[float],
               lengths: Sequence[int]) -> np.ndarray:
  """Score matrix [depth, length] in 0-100 (RULER's string_match_all, averaged per cell; NaN for empty cells)."""
  if len(grid) != len(predictions):
    raise ValueError(f'{len(predictions)} predictions for {len(grid)} grid samples')
  sums = np.zeros((len(depths), len(lengths)))
  counts = np.zeros_like(sums)
  d_index = {float(d): i for i, d in enumerate(depths)}
  l_index = {int(n): i for i, n in enumerate(lengths)}
  per_sample = ruler.sample_scores('string_match_all', predictions, [s['outputs'] for s in grid])
  for sample, score in zip(grid, per_sample):
    i, j = d_index[float(sample['depth'])], l_index[int(sample['max_seq_length'])]
    sums[i, j] += score
    counts[i, j] += 1
  with np.errstate(invalid='ignore'):
    return 100 * sums / counts


def plot_heatmap(scores, depths: Sequence[float], lengths: Sequence[int], path: str, *,
                 title: str = 'Needle in a haystack') -> str:
  """Writes a PNG heat map of `scores` [depth, length] (0-100) to `path` and returns the path."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top  (no pyplot: no global backend)
  scores = np.asarray(scores, dtype=float)
  if scores.shape != (len(depths), len(lengths)):
    raise ValueError(f'scores have shape {scores.shape}, expected (len(depths), len(lengths)) = '
                     f'({len(depths)}, {len(lengths)})')
  fig = Figure(figsize=(1.2 + 0.9 * len(lengths), 1.0 + 0.45 * len(depths)))
  ax = fig.subplots()
  image = ax.imshow(scores, vmin=0, vmax=100, cmap='RdYlGn', aspect='auto')
  ax.set_xticks(range(len(lengths)), [_short(n) for n in lengths])
  ax.set_yticks(range(len(depths)), [f'{100 * d:g}%' for d in depths])
  ax.set_xlabel('context length')
  ax.set_ylabel('needle depth')
  ax.set_title(title)
  for i in range(len(depths)):
    for j in range(len(lengths)):
      if np.isfinite(scores[i, j]):
        ax.text(j, i, f'{scores[i, j]:.0f}', ha='center', va='center', fontsize=7)
  fig.colorbar(image, ax=ax, label='score')
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  return path


def _short(n: int) -> str:
  return f'{n // 1024}K' if n >= 1024 and n % 1024 == 0 else str(n)
