"""Needle-in-a-haystack prompts for the analyses, and where their needle sits in the tokens.

Three sources of prompts, one sample format {'prompt', 'answer', 'value', 'key', 'depth', 'label'}:
- `study_samples`: the study's probing generator (PAPER.md): one needle "One of the special magic numbers for {key}
  is: {value}." inside a repeated filler ('repeat') or natural text ('essay'); the value is one of a few candidates
  (label = its index) or a fresh 7-digit number; depth pinned or uniform in [1/4, 3/4]. Any length works, so it
  also fits the short contexts of small training runs.
- `ruler_samples`: the RULER single-needle tasks (niah_single_1/2/3) from hybrid_jax.eval.ruler.
- `recall_samples`: the queries of a run's own recall task (`data.source='recall'`, hybrid_jax.data.recall), from
  its held-out documents: what the mini-study's runs were trained to retrieve. Their needle is the queried record's
  value at its known position (`needle_span`), since the same digits occur in other records.

The model reads `prompt` and should continue with `answer` (' ' + value). `encode` tokenizes prompt + answer and
finds the needle's tokens from character offsets, so it works for any tokenizer however it splits or merges the
value with its neighbours (a leading space, the ': ' before it, the '.' after it).
"""

import dataclasses
import random
from typing import Sequence

import numpy as np

from hybrid_jax.data import recall
from hybrid_jax.errors import UserError
from hybrid_jax.eval import ruler
from hybrid_jax.eval.longppl import key_token_mask
from hybrid_jax.eval.ruler_tasks import base

FILLER = 'The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.'
NEEDLE = 'One of the special magic numbers for {key} is: {value}.'
INTRO = 'Remember the special magic number hidden in this text.'  # Short, so prompts fit small test contexts.
QUESTION = 'The special magic number for {key} is:'
STUDY_VALUES = tuple(str(31415920 + i) for i in range(8))  # The study's 8 candidate values.
HAYSTACKS = ('repeat', 'essay')
RULER_TASKS = ('niah_single_1', 'niah_single_2', 'niah_single_3')
SOURCES = ('study', 'study-essay', *RULER_TASKS, 'recall')


class NeedleError(UserError, ValueError):
  """A prompt cannot be built at the requested length, or its needle is not in the text."""


def _sentences(haystack: str, essay: str | None) -> list[str]:
  if haystack == 'repeat':
    return [s if s.endswith('.') else s + '.' for s in FILLER.split('. ')]
  if haystack == 'essay':
    return base.essay_sentences((essay or base.builtin_essay(num_words=60_000)).split())
  raise NeedleError(f'haystack={haystack!r} is invalid: use one of {", ".join(HAYSTACKS)}')


def _prompt(unit: list[str], n: int, needle: str, depth: float, key: str) -> str:
  """INTRO, n haystack sentences (cycling through `unit`) with the needle at the sentence nearest `depth`, QUESTION."""
  sentences = [unit[i % len(unit)] for i in range(n)]
  sentences.insert(round(depth * n), needle)
  return f'{INTRO}\n{" ".join(sentences)}\n{QUESTION.format(key=key)}'


def _fit(make, count, length: int) -> str:
  """The longest make(n) whose token count is <= length (bisection; count is monotone in n)."""
  if count(make(0)) > length:
    raise NeedleError(f'length={length} tokens is too short for a needle prompt: with an empty haystack it needs '
                      f'{count(make(0))} tokens')
  lo, hi = 0, 1
  while count(make(hi)) <= length:
    lo, hi = hi, hi * 2
  while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if count(make(mid)) <= length else (lo, mid)
  return make(lo)


def study_samples(num: int, *, length: int, tokenizer, seed: int = 42, values: Sequence[str] | None = STUDY_VALUES,
                  depths: Sequence[float] | None = None, haystack: str = 'repeat',
                  essay: str | None = None) -> list[dict]:
  """`num` prompts of about `length` tokens (prompt + answer), deterministic by seed.

  values: candidate values, sample i gets values[i % len(values)] (balanced labels for probing); None draws a
  7-digit number per sample. depths: sample i gets depths[i % len(depths)]; None draws uniform in [1/4, 3/4].
  """
  if num <= 0:
    raise NeedleError(f'num={num} samples is invalid: must be positive')
  unit = _sentences(haystack, essay)
  count = lambda text: len(tokenizer.encode(text))
  out = []
  for i in range(num):
    rng = random.Random(f'{seed}:study:{i}')
    label = i % len(values) if values else 0
    value = values[label] if values else base.number(rng)
    depth = float(depths[i % len(depths)]) if depths else rng.uniform(0.25, 0.75)
    key = base.word_key(rng)
    needle = NEEDLE.format(key=key, value=value)
    answer = f' {value}'
    offset = rng.randrange(len(unit))  # Essay haystacks start at a different sentence per sample.
    shifted = unit[offset:] + unit[:offset]
    prompt = _fit(lambda n: _prompt(shifted, n, needle, depth, key), lambda p: count(p + answer), length)
    out.append({'prompt': prompt, 'answer': answer, 'value': value, 'key': key, 'depth': depth, 'label': label})
  return out


def ruler_samples(task: str, num: int, *, length: int, tokenizer, seed: int = 42,
                  depths: Sequence[float] | None = None) -> list[dict]:
  """`num` samples of a RULER single-needle task at `length` tokens, in the same format as `study_samples`."""
  if task not in RULER_TASKS:
    raise NeedleError(f'task={task!r} is invalid: single-needle tasks are {", ".join(RULER_TASKS)}')
  count = lambda text: len(tokenizer.encode(text))
  out = []
  for i in range(num):
    depth = float(depths[i % len(depths)]) if depths else None
    (s,) = ruler.generate(task, length, 1, seed=seed, count_tokens=count, depth=depth, start_index=i)
    value = s['outputs'][0]
    out.append({'prompt': s['input'] + s['answer_prefix'], 'answer': f' {value}', 'value': value,
                'key': s.get('key', ''), 'depth': s.get('depth', float('nan')), 'label': 0})
  return out


def recall_samples(data_cfg, num: int, *, seed: int = 42) -> list[dict]:
  """`num` queries of the recall task `data_cfg` configures, from its held-out documents in an order drawn from
  `seed`: the document up to the queried key as the prompt, the value as the answer, and the first record's value
  as the needle (`needle_span`, its characters)."""
  if data_cfg.source != 'recall':
    raise NeedleError(f"needle source 'recall' reads the run's own recall task; this run trained on "
                      f"data.source={data_cfg.source!r}: use study, study-essay or one of {', '.join(RULER_TASKS)}")
  documents = recall.RecallSource(data_cfg, 'eval', use_store=False)
  samples = []
  for index in np.random.default_rng(seed).permutation(len(documents)):
    document = documents.document(int(index))
    for q in document.queries:
      samples.append({'prompt': document.text[:q.query + len(q.key)], 'answer': q.value, 'value': q.value,
                      'key': q.key, 'needle_span': (q.pair, q.pair + len(q.value)), 'distance': q.distance})
      if len(samples) == num:
        return samples
  if not samples:
    raise NeedleError('the recall task\'s held-out documents hold no queries (every one is a text document)')
  return samples


def make_samples(source: str, num: int, *, length: int, tokenizer, seed: int = 42, depths=None,
                 values=STUDY_VALUES, data_cfg=None) -> list[dict]:
  """Samples by source name: 'study' / 'study-essay' (study_samples), a RULER single-needle task name, or 'recall'
  (recall_samples of `data_cfg`, the run's data config; its documents have their own length)."""
  if source in ('study', 'study-essay'):
    return study_samples(num, length=length, tokenizer=tokenizer, seed=seed, values=values, depths=depths,
                         haystack='essay' if source == 'study-essay' else 'repeat')
  if source in RULER_TASKS:
    return ruler_samples(source, num, length=length, tokenizer=tokenizer, seed=seed, depths=depths)
  if source == 'recall':
    if data_cfg is None:
      raise NeedleError("needle source 'recall' reads a run's own recall task, and this analysis has no run config")
    return recall_samples(data_cfg, num, seed=seed)
  raise NeedleError(f'needle source {source!r} is invalid: use {", ".join(SOURCES)}')


# ------------------------------------------------------------------------------------------------ tokens


def needle_span(text: str, value: str) -> tuple[int, int]:
  """Character span [start, end) of the needle's value in `text`.

  The needle's own context is tried first (': value.', ': value', ' value.', ' value', 'value.', 'value'), so an
  occurrence of the value elsewhere (a question, another sentence) is not mistaken for the needle.
  """
  if not value:
    raise NeedleError('the needle value is empty')
  for before in (': ', ' ', ''):
    for after in ('.', ''):
      at = text.find(f'{before}{value}{after}')
      if at >= 0:
        return at + len(before), at + len(before) + len(value)
  raise NeedleError(f'the needle value {value!r} does not occur in the prompt')


def locate_needle(text: str, value: str, offsets) -> np.ndarray:
  """Indices of the tokens (with character `offsets` [n, 2]) that overlap the needle value's characters."""
  mask = key_token_mask(offsets, [needle_span(text, value)], rule='overlap')
  if not mask.any():
    raise NeedleError(f'no token overlaps the needle value {value!r}')
  return np.flatnonzero(mask)


@dataclasses.dataclass(frozen=True)
class Encoded:
  """A sample's tokens (prompt then answer), the prompt's length in tokens and the needle's token positions."""
  ids: np.ndarray
  prompt_len: int
  needle: np.ndarray

  @property
  def answer_len(self) -> int:
    return len(self.ids) - self.prompt_len


def encode(sample: dict, tokenizer) -> Encoded:
  """Tokens of prompt + answer; the answer is the tokens after the prompt's own tokenization (when the joint text
  splits differently at the boundary, the answer is tokenized on its own and appended)."""
  prompt_ids, offsets = tokenizer.encode_with_offsets(sample['prompt'])
  prompt_ids = np.asarray(prompt_ids, np.int32)
  joint = np.asarray(tokenizer.encode(sample['prompt'] + sample['answer']), np.int32)
  if len(joint) > len(prompt_ids) and np.array_equal(joint[:len(prompt_ids)], prompt_ids):
    ids = joint
  else:
    ids = np.concatenate([prompt_ids, np.asarray(tokenizer.encode(sample['answer']), np.int32)])
  if len(prompt_ids) < 4 or len(ids) == len(prompt_ids):
    raise NeedleError(f'sample prompt has {len(prompt_ids)} tokens and answer {len(ids) - len(prompt_ids)}: too short')
  span = sample.get('needle_span')
  if span is None:
    needle = locate_needle(sample['prompt'], sample['value'], offsets)
  else:
    needle = np.flatnonzero(key_token_mask(offsets, [tuple(span)], rule='overlap'))
  return Encoded(ids, len(prompt_ids), needle)


def batch(encoded: Sequence[Encoded], *, pad_id: int, multiple: int = 64) -> dict:
  """Numpy arrays for `needle_probe`: tokens [B, T] (right-padded, T a multiple of `multiple`), prompt_len [B],
  answer_len [B], needle [B, N] positions with needle_valid [B, N]. Right padding never changes causal outputs."""
  t = max(len(e.ids) for e in encoded)
  t = -(-t // multiple) * multiple
  n = max(len(e.needle) for e in encoded)
  tokens = np.full((len(encoded), t), pad_id, np.int32)
  needle = np.zeros((len(encoded), n), np.int32)
  valid = np.zeros((len(encoded), n), bool)
  for row, e in enumerate(encoded):
    tokens[row, :len(e.ids)] = e.ids
    needle[row, :len(e.needle)] = e.needle
    valid[row, :len(e.needle)] = True
  return {'tokens': tokens, 'prompt_len': np.asarray([e.prompt_len for e in encoded], np.int32),
          'answer_len': np.asarray([e.answer_len for e in encoded], np.int32), 'needle': needle,
          'needle_valid': valid}
