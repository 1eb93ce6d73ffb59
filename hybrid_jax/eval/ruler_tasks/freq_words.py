"""Frequent words extraction (fwe): coded words with Zipf counts; the answer is the words ranked 2-4."""

import math
import random
import string

from hybrid_jax.eval.ruler_tasks import base


def zeta(alpha: float, terms: int = 1000) -> float:
  """Riemann zeta for alpha > 1: a partial sum plus the Euler-Maclaurin tail (error far below 1e-12)."""
  if alpha <= 1:
    raise ValueError(f'alpha={alpha!r} must be > 1 for a Zipf distribution')
  head = math.fsum(k**-alpha for k in range(1, terms))
  n = float(terms)
  tail = n**(1 - alpha) / (alpha - 1) + 0.5 * n**-alpha + alpha * n**(-alpha - 1) / 12
  return head + tail


class FreqWords:
  """Builds one FWE sample with n coded words in total; the vocabulary size follows RULER's rule from the budget."""

  def __init__(self, spec: dict, wrapper: str, *, max_seq_length: int, count_tokens, **_):
    self.spec, self.args, self.gen = spec, spec['args'], spec['generator']
    self.full = base.full_template(spec, wrapper)
    size = self.gen['vocab_size']
    if size == -1:
      wrapper_tokens = count_tokens(wrapper.replace('{task_template}', ''))
      size = (max_seq_length - wrapper_tokens - spec['tokens_to_generate']) // 50
    if size < 5:
      raise base.ContextTooShort(f'max_seq_length {max_seq_length} gives fwe a vocabulary of {size} words; '
                                 'at least 5 are needed')
    self.vocab_size = size
    self.z = zeta(self.args['alpha'])

  def min_size(self, index):
    return 0

  def max_size(self, index):
    return None

  def build(self, index: int, rng: random.Random, n: int) -> dict:
    length, alphabet = self.gen['coded_wordlen'], self.gen['alphabet'] or string.ascii_lowercase
    vocab = []
    seen = set()
    while len(vocab) < self.vocab_size:
      word = ''.join(rng.choice(alphabet) for _ in range(length))
      if word not in seen:
        seen.add(word)
        vocab.append(word)
    vocab[0] = self.gen['noise_word']
    alpha = self.args['alpha']
    words = [w for k, w in enumerate(vocab, 1) for _ in range(int(n * k**-alpha / self.z))]
    rng.shuffle(words)
    context = self.gen['word_join'].join(words)
    return {'prompt': self.full.format(context=context, query=''), 'outputs': vocab[1:4]}
