"""Needle-in-a-haystack family (8 tasks): noise, essay or distractor-needle haystacks with planted key/value needles."""

import itertools
import random

from hybrid_jax.eval.ruler_tasks import base


def join_query(keys: list[str], sep: str, last_sep: str) -> str:
  return keys[0] if len(keys) == 1 else sep.join(keys[:-1]) + last_sep + keys[-1]


class Niah:
  """Builds one NIAH sample for a haystack size n (lines, essay words or distractor needles).

  Keys, values and the asked keys are drawn before the haystack, so they do not change while the length search
  varies n. `depth` (a fraction in [0, 1]) pins every needle to one depth instead of RULER's random depths.
  """

  def __init__(self, spec: dict, wrapper: str, *, essay: str | None = None, depth: float | None = None, **_):
    self.spec, self.args, self.gen = spec, spec['args'], spec['generator']
    self.depth = depth
    if depth is not None and not 0.0 <= depth <= 1.0:
      raise ValueError(f'depth={depth!r} must be a fraction in [0, 1]')
    self.haystack = self.args['type_haystack']
    self.essay_words = essay.split() if self.haystack == 'essay' else None
    self.singular = self.args['num_needle_q'] * self.args['num_needle_v'] == 1
    full = base.full_template(spec, wrapper)
    if self.singular:
      for old, new in self.gen['singular_rewrites_if_one_answer']:
        full = full.replace(old, new)
    self.full = full

  def min_size(self, index):
    return 0

  def max_size(self, index):
    return None

  def _needle(self, key, value):
    return self.gen['needle_template'].format(type_needle_v=self.args['type_needle_v'], key=key, value=value)

  def _insert_lines(self, lines, needles, rng):
    for needle in needles:
      at = round(self.depth * len(lines)) if self.depth is not None else rng.randint(0, len(lines))
      lines.insert(at, needle)
    return '\n'.join(lines)

  def _essay(self, n, needles, rng):
    sentences = base.essay_sentences(base.take_words(self.essay_words, n))
    if self.depth is not None:  # The sentence boundary nearest to that fraction of the characters.
      ends = list(itertools.accumulate(len(x) + 1 for x in sentences))
      total = ends[-1] if ends else 1
      at = min(range(len(sentences) + 1), key=lambda k: abs((ends[k - 1] if k else 0) / total - self.depth))
      cuts = [0] + [at] * len(needles) + [len(sentences)]
    else:  # RULER: depths drawn without replacement, as fractions of the sentence count.
      depths = rng.sample(self.gen['depths_percent'], len(needles))
      cuts = [0] + sorted(int(len(sentences) * d / 100) for d in depths) + [len(sentences)]
    pieces = []
    for i in range(1, len(cuts)):
      pieces.append(' '.join(sentences[cuts[i - 1]:cuts[i]]))
      if i - 1 < len(needles):
        pieces.append(needles[i - 1])
    return ' '.join(p for p in pieces if p)

  def build(self, index: int, rng: random.Random, n: int) -> dict:
    a = self.args
    k_type, v_type = a['type_needle_k'], a['type_needle_v']
    num_k = max(a['num_needle_k'], a['num_needle_q'])
    keys = []
    while len(keys) < num_k:
      key = base.make_value(k_type, rng)
      if key not in keys:
        keys.append(key)
    values = [[base.make_value(v_type, rng) for _ in range(a['num_needle_v'])] for _ in keys]
    needles = [self._needle(k, v) for k, vs in zip(keys, values) for v in vs]
    rng.shuffle(needles)
    asked = rng.sample(range(num_k), a['num_needle_q'])
    query = join_query([keys[i] for i in asked], self.gen['query_join']['sep'], self.gen['query_join']['last_sep'])
    answers = [v for i in asked for v in values[i]]

    if self.haystack == 'noise':
      context = self._insert_lines([self.gen['noise_sentence']] * n, needles, rng)
    elif self.haystack == 'needle':
      distractors = []
      while len(distractors) < n:
        key = base.make_value(k_type, rng)
        if key not in keys:
          distractors.append(self._needle(key, base.make_value(v_type, rng)))
      context = self._insert_lines(distractors, needles, rng)
    elif self.haystack == 'essay':
      context = self._essay(n, needles, rng)
    else:
      raise ValueError(f'unknown NIAH haystack {self.haystack!r}')
    type_v = v_type[:-1] if self.singular else v_type
    prompt = self.full.format(type_needle_v=type_v, context=context, query=query)
    extra = {'depth': self.depth} if self.depth is not None else {}
    return {'prompt': prompt, 'outputs': answers, **extra}
