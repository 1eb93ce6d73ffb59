"""Shared pieces of the RULER task generators: task data, prompt assembly, word lists, haystacks, length search.

The task parameters and strings are RULER's own (copied into `hybrid_jax/eval/data/`); only the code is ours.
"""

import functools
import json
import logging
import pathlib
import random
import re
import uuid
from typing import Callable

from hybrid_jax.errors import UserError

DATA_DIR = pathlib.Path(__file__).resolve().parents[1] / 'data'


def utf8_bytes(text: str) -> int:
  """Default token counter: UTF-8 bytes, a tokenizer-free upper bound on any byte-level tokenizer's count."""
  return len(text.encode('utf-8'))


@functools.cache
def _load(name: str) -> dict:
  with open(DATA_DIR / name, encoding='utf-8') as f:
    return json.load(f)


def task_specs() -> dict:
  return _load('tasks.json')


def common() -> dict:
  return _load('common.json')


def chat_wrapper(chat_template: str) -> str:
  """A `model_templates` name from common.json ('base', 'meta-llama3', ...) or a string holding '{task_template}'."""
  templates = common()['model_templates']
  if chat_template in templates:
    return templates[chat_template]
  if '{task_template}' not in chat_template:
    raise ValueError(f'chat_template={chat_template!r} is neither a known wrapper ({", ".join(templates)}) '
                     "nor a string containing '{task_template}'")
  return chat_template


def full_template(spec: dict, wrapper: str) -> str:
  """Chat wrapper around the task template, then the answer prefix (RULER's step 1)."""
  return wrapper.replace('{task_template}', spec['template']) + spec['answer_prefix']


def split_prompt(text: str, spec: dict) -> tuple[str, str]:
  """(input, answer_prefix): split at the last occurrence of the raw answer prefix's first characters."""
  locator = spec['answer_prefix'][:spec['generator']['answer_prefix_locator_chars']]
  at = text.rfind(locator)
  if at < 0:
    raise AssertionError(f'answer prefix {locator!r} not found in the generated prompt')
  return text[:at], text[at:]


class ContextTooShort(UserError, ValueError):
  """The requested max_seq_length cannot hold even the prompt with an empty haystack (a length the user asked for:
  one line wherever it surfaces)."""


def fit_size(make: Callable[[int], dict], cost: Callable[[dict], int], budget: int, *, min_size: int = 0,
             max_size: int | None = None, start: int | None = None) -> tuple[int, dict, int]:
  """(n, make(n), its cost) for the largest haystack size n in [min_size, max_size] with cost <= budget.

  Assumes cost grows with n. Two probes estimate the cost of one unit, then the answer is bracketed around the
  estimate and bisected, so a real tokenizer runs about ten times per search instead of once per unit.
  """
  memo = {}

  def ok(n):
    if max_size is not None and n > max_size:
      return False
    if n not in memo:
      item = make(n)
      memo[n] = (item, cost(item))
    return memo[n][1] <= budget

  if not ok(min_size):
    needed = memo[min_size][1] if min_size in memo else cost(make(min_size))
    raise ContextTooShort(f'max_seq_length {budget} is too small: the prompt with the smallest haystack '
                          f'already needs {needed} tokens (including the generation budget)')
  lo, hi = min_size, None  # lo always fits; hi (when set) never does.
  if start is None:
    probe = min_size + 16 if max_size is None else min(min_size + 16, max_size)
    if probe > min_size and ok(probe):
      per_unit = max((memo[probe][1] - memo[min_size][1]) / (probe - min_size), 1e-9)
      lo, start = probe, min_size + int((budget - memo[min_size][1]) / per_unit)
    else:
      hi = max(probe, min_size + 1)
  if hi is None:
    n = max(start, lo + 1)
    step = max(1, n // 32)
    if ok(n):
      lo = n
      while ok(lo + step):
        lo += step
        step *= 2
      hi = lo + step
    else:
      hi = n
      while hi - step > lo and not ok(hi - step):
        hi -= step
        step *= 2
      lo = max(lo, hi - step)
  while hi - lo > 1:
    mid = (lo + hi) // 2
    if ok(mid):
      lo = mid
    else:
      hi = mid
  ok(lo)
  return lo, memo[lo][0], memo[lo][1]


# ------------------------------------------------------------------------------------------------ values


def number(rng: random.Random, low: int = 1000000, high_inclusive: int = 9999999) -> str:
  return str(rng.randint(low, high_inclusive))


def uuid4(rng: random.Random) -> str:
  return str(uuid.UUID(int=rng.getrandbits(128), version=4))


_WORD = re.compile(r'[a-z]{3,12}')


@functools.cache
def _corpus_words() -> tuple[str, ...]:
  """Lowercase words of the built-in corpus: the fallback vocabulary when wonderwords is not installed."""
  words = set()
  for split in ('eval', 'train'):
    for text in _builtin_documents(split):
      words.update(_WORD.findall(text))
      if len(words) > 30000:
        return tuple(sorted(words))
  return tuple(sorted(words))


OFFICIAL_WORD_SOURCE = 'wonderwords'  # RULER's key words: the adjective, noun and verb lists of this package.
CORPUS_WORD_SOURCE = 'built-in corpus words (not RULER\'s wonderwords lists)'


@functools.cache
def _word_lists_and_source() -> tuple[dict[str, tuple[str, ...]], str]:
  try:
    from importlib import resources
    assets = resources.files('wonderwords') / 'assets'
    read = lambda name: tuple(w.strip() for w in (assets / name).read_text('utf-8').splitlines() if w.strip())
    lists = {'adjectives': read('adjectivelist.txt'), 'nouns': read('nounlist.txt'), 'verbs': read('verblist.txt')}
    return lists, OFFICIAL_WORD_SOURCE
  except (ImportError, FileNotFoundError, ModuleNotFoundError) as e:
    logging.warning('RULER key words come from the %s because wonderwords cannot be read (%s: %s); keys and '
                    'common-words lists differ from RULER\'s, so scores are not comparable to published RULER '
                    'scores. Install the eval extra (pip install -e .[eval]) for the official lists.',
                    CORPUS_WORD_SOURCE, type(e).__name__, e)
    words = _corpus_words()
    return {'adjectives': words[0::3], 'nouns': words[1::3], 'verbs': words[2::3]}, CORPUS_WORD_SOURCE


def word_lists() -> dict[str, tuple[str, ...]]:
  """{'adjectives', 'nouns', 'verbs'}: wonderwords' lists as RULER uses them, else built-in corpus words.

  Without wonderwords, the corpus vocabulary is dealt into three disjoint lists, so keys still look like
  `word-word` but carry no part-of-speech meaning; that is warned once and recorded (word_source).
  """
  return _word_lists_and_source()[0]


def word_source() -> str:
  """Where word_lists() came from: OFFICIAL_WORD_SOURCE, or CORPUS_WORD_SOURCE when wonderwords is missing."""
  return _word_lists_and_source()[1]


def word_key(rng: random.Random) -> str:
  lists = word_lists()
  return f'{rng.choice(lists["adjectives"])}-{rng.choice(lists["nouns"])}'


def make_value(kind: str, rng: random.Random) -> str:
  if kind == 'numbers':
    return number(rng)
  if kind == 'words':
    return word_key(rng)
  if kind == 'uuids':
    return uuid4(rng)
  raise ValueError(f'unknown needle type {kind!r}: use numbers, words or uuids')


# ------------------------------------------------------------------------------------------------ haystacks


def _builtin_documents(split: str = 'eval', eval_fraction: float = 0.02):
  from hybrid_jax.data.sources import BuiltinSource  # pylint: disable=g-import-not-at-top
  source = BuiltinSource(split, eval_fraction)
  for i in range(len(source)):
    yield source[i]


def builtin_essay(num_words: int = 150_000, eval_fraction: float = 0.02) -> str:
  """Natural-ish text for the 'essay' haystack from the built-in corpus (stdlib sources), `num_words` words long.

  Held-out documents come first, so a model trained on the built-in corpus has not memorised the start of the
  haystack; training documents follow only when more words are needed (the held-out split has ~40K words).
  """
  parts, count = [], 0
  for split in ('eval', 'train'):
    for text in _builtin_documents(split, eval_fraction):
      parts.append(text)
      count += len(text.split())
      if count >= num_words:
        return '\n'.join(parts)
  return '\n'.join(parts)


_SENTENCE_END = re.compile(r'(?<=[.!?])\s+')


def essay_sentences(words: list[str], max_words: int = 25) -> list[str]:
  """Sentences of the given essay words: split after . ! or ? followed by space (NLTK's punkt is not used).

  A 'sentence' longer than `max_words` words is cut into `max_words` pieces, so text with few full stops (the
  built-in corpus is code) still offers fine-grained needle depths.
  """
  out = []
  for sentence in _SENTENCE_END.split(' '.join(words)):
    parts = sentence.split(' ')
    out.extend(' '.join(parts[i:i + max_words]) for i in range(0, len(parts), max_words) if sentence)
  return out


def take_words(essay_words: list[str], n: int) -> list[str]:
  """The first n words, cycling through the essay when it is shorter."""
  if not essay_words:
    raise ValueError('the essay haystack is empty: pass essay text with words in it')
  if n <= len(essay_words):
    return essay_words[:n]
  reps, rest = divmod(n, len(essay_words))
  return essay_words * reps + essay_words[:rest]
