"""RULER-style synthetic long-context suite: 13 task generators at any context length, and RULER's scoring.

Prompts, parameters and answer prefixes are RULER's (NVIDIA/RULER@c3f5e3b, `hybrid_jax/eval/data/tasks.json`).
Lengths are measured by a caller-supplied `count_tokens(str) -> int` (default: UTF-8 bytes), so the same code
serves any tokenizer. A sample fits when `count_tokens(input + answer_prefix) + max_new_tokens <= max_seq_length`.

Length search: RULER searches the haystack size once per task, then shrinks each sample by a fixed step until it
fits. Here the per-task search is the same, but a sample that does not fit is re-searched (bisected) instead of
shrunk by the step, so every sample stays within one haystack unit of the budget.

Known differences from RULER: sentences of the essay haystack are split with a regex, not NLTK punkt; without the
`wonderwords` package, key words come from the built-in corpus (warned, and recorded as `word_source` in the
results); cwe tops up its vocabulary with corpus words
where RULER would read `english_words.json`.
"""

import math
import random
import re
from typing import Callable, Sequence

from hybrid_jax.eval.ruler_tasks import FAMILIES
from hybrid_jax.eval.ruler_tasks import base
from hybrid_jax.eval.ruler_tasks.base import ContextTooShort, builtin_essay, utf8_bytes, word_source

TASKS = tuple(base.common()['task_order'])
NIAH_TASKS = tuple(t for t in TASKS if base.task_specs()[t]['family'] == 'niah')


def task_spec(task: str) -> dict:
  specs = base.task_specs()
  if task not in specs:
    raise ValueError(f'unknown RULER task {task!r}: choose from {", ".join(TASKS)}')
  return specs[task]


def generate(task: str, max_seq_length: int, num_samples: int, *, seed: int = 42,
             count_tokens: Callable[[str], int] = utf8_bytes, chat_template: str = 'base', essay: str | None = None,
             squad_path: str | None = None, hotpotqa_path: str | None = None, depth: float | None = None,
             start_index: int = 0) -> list[dict]:
  """`num_samples` samples of `task`, each as long as fits `max_seq_length` tokens.

  A sample: {'index', 'task', 'input', 'answer_prefix', 'outputs' (gold strings), 'length' (prompt tokens +
  max_new_tokens), 'max_new_tokens', 'max_seq_length', 'metric', 'haystack_size'} (+ 'depth' for pinned NIAH).
  Feed the model `input + answer_prefix` and score only what it generates. The same seed gives the same samples.
  `essay`: haystack text for essay tasks (default: `builtin_essay`). `depth`: pins NIAH needles to one depth.
  """
  spec = task_spec(task)
  if max_seq_length <= spec['tokens_to_generate']:
    raise ContextTooShort(f'max_seq_length={max_seq_length} leaves no room for a {task} prompt')
  if depth is not None and spec['family'] != 'niah':
    raise ValueError(f'depth applies to NIAH tasks only, not {task!r}')
  if essay is None and spec['args'].get('type_haystack') == 'essay':
    essay = builtin_essay(num_words=max_seq_length + 1000)
  family = FAMILIES[spec['family']](spec, base.chat_wrapper(chat_template), essay=essay, depth=depth,
                                    squad_path=squad_path, hotpotqa_path=hotpotqa_path, seed=seed,
                                    max_seq_length=max_seq_length, count_tokens=count_tokens)
  gen_tokens = spec['tokens_to_generate']

  def maker(index):
    def make(n):
      rng = random.Random(f'{seed}:{task}:{index}')
      built = family.build(index, rng, n)
      prompt_input, prefix = base.split_prompt(built.pop('prompt'), spec)
      return {'index': index, 'task': task, 'input': prompt_input, 'answer_prefix': prefix,
              'outputs': built.pop('outputs'), 'max_new_tokens': gen_tokens, 'max_seq_length': max_seq_length,
              'metric': spec['metric'], 'haystack_size': n, **built}
    return make

  cost = lambda s: count_tokens(s['input'] + s['answer_prefix']) + gen_tokens
  samples, size = [], None
  for index in range(start_index, start_index + num_samples):
    make = maker(index)
    lo, hi = family.min_size(index), family.max_size(index)
    try:
      if size is None:
        size, sample, length = base.fit_size(make, cost, max_seq_length, min_size=lo, max_size=hi)
      else:  # Like RULER, reuse the task's size; re-search only a sample that does not fit.
        n = max(lo, size if hi is None else min(size, hi))
        sample = make(n)
        length = cost(sample)
        if length > max_seq_length:
          _, sample, length = base.fit_size(make, cost, max_seq_length, min_size=lo, max_size=n - 1, start=n)
    except ContextTooShort as e:
      raise ContextTooShort(f'{task} sample {index}: {e}') from None
    sample['length'] = length
    samples.append(sample)
  return samples


def generate_suite(tasks: Sequence[str], lengths: Sequence[int], num_samples: int, **kwargs) -> dict:
  """{length: {task: samples}}; checks every task name before generating anything."""
  for task in tasks:
    task_spec(task)
  if kwargs.get('essay') is None and any(task_spec(t)['args'].get('type_haystack') == 'essay' for t in tasks):
    kwargs['essay'] = builtin_essay(num_words=max(lengths) + 1000)
  return {n: {t: generate(t, n, num_samples, **kwargs) for t in tasks} for n in lengths}


# ------------------------------------------------------------------------------------------------ scoring

_CONTROL = re.compile(r'[\x00-\x1f]')


def postprocess(prediction: str) -> str:
  """RULER's prediction cleanup: strip, control characters (newline and tab too) to '\\n', strip again."""
  return _CONTROL.sub('\n', prediction.strip()).strip()


def _fraction_found(prediction: str, references: Sequence[str]) -> float:
  pred = prediction.lower()
  return sum(r.lower() in pred for r in references) / len(references)


def _any_found(prediction: str, references: Sequence[str]) -> float:
  pred = prediction.lower()
  return float(any(r.lower() in pred for r in references))


def sample_scores(metric: str, predictions: Sequence[str], references: Sequence[Sequence[str]]) -> list[float]:
  """Per-sample scores in [0, 1] after RULER's cleanup."""
  if metric not in METRICS:
    raise ValueError(f'unknown RULER metric {metric!r}: use {", ".join(METRICS)}')
  if len(predictions) != len(references):
    raise ValueError(f'{len(predictions)} predictions for {len(references)} reference lists')
  return [METRICS[metric](postprocess(p), r) for p, r in zip(predictions, references)]


def string_match_all(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
  """Mean over samples of the fraction of references found (case-insensitive substring), x100, 2 decimals."""
  return _percent(sample_scores('string_match_all', predictions, references))


def string_match_part(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
  """Mean over samples of 1 if any reference is found (case-insensitive substring), x100, 2 decimals."""
  return _percent(sample_scores('string_match_part', predictions, references))


METRICS = {'string_match_all': _fraction_found, 'string_match_part': _any_found}


def _percent(scores):
  """RULER's arithmetic, in its order: sum / count * 100, rounded to 2 decimals."""
  return round(_mean(scores) * 100, 2)


def _mean(values):
  values = list(values)
  if not values:
    raise ValueError('cannot score zero samples')
  return sum(values) / len(values)


def score_task(samples: Sequence[dict], predictions: Sequence[str]) -> dict:
  """{'score' (0-100), 'nulls' (empty predictions), 'num_samples'} with the task's own metric."""
  if not samples:
    raise ValueError('cannot score zero samples')
  metric = samples[0]['metric']
  scores = sample_scores(metric, predictions, [s['outputs'] for s in samples])
  return {'score': _percent(scores), 'nulls': sum(not postprocess(p) for p in predictions),
          'num_samples': len(samples)}


def summarize(task_scores: dict[str, float]) -> dict:
  """Plain mean over the given tasks (RULER's per-length score) and the mean over the NIAH tasks among them."""
  unknown = [t for t in task_scores if t not in TASKS]
  if unknown:
    raise ValueError(f'unknown RULER task(s) {unknown}: choose from {", ".join(TASKS)}')
  niah = [v for t, v in task_scores.items() if t in NIAH_TASKS]
  return {'tasks': dict(task_scores), 'average': round(_mean(task_scores.values()), 2),
          'niah_average': round(_mean(niah), 2) if niah else math.nan}


def summarize_lengths(score_by_length: dict[int, float]) -> dict:
  """Across lengths: 'avg', RULER's 'wavg_inc' / 'wavg_dec' (weights 1..k / k..1 over ascending lengths) and
  'effective_length' (longest length whose score beats the 85.6 threshold, every shorter one too)."""
  lengths = sorted(score_by_length)
  scores = [score_by_length[n] for n in lengths]
  k = len(lengths)
  inc, dec = list(range(1, k + 1)), list(range(k, 0, -1))
  wavg = lambda w: round(sum(a * b for a, b in zip(w, scores)) / sum(w), 2)
  threshold = base.common()['effective_length_threshold']
  effective = 0
  for n, s in zip(lengths, scores):
    if s <= threshold:
      break
    effective = n
  return {'avg': round(_mean(scores), 2), 'wavg_inc': wavg(inc), 'wavg_dec': wavg(dec),
          'effective_length': effective, 'threshold': threshold}


def score_suite(samples: dict[str, Sequence[dict]], predictions: dict[str, Sequence[str]]) -> dict:
  """Scores of every task at one length: {'per_task': {task: score_task(...)}, 'average', 'niah_average'}."""
  missing = sorted(set(samples) - set(predictions))
  if missing:
    raise ValueError(f'no predictions for task(s) {missing}')
  per_task = {task: score_task(samples[task], predictions[task]) for task in samples}
  summary = summarize({task: r['score'] for task, r in per_task.items()})
  return {'per_task': per_task, 'average': summary['average'], 'niah_average': summary['niah_average']}
