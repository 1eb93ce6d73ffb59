"""Common words extraction (cwe): a numbered word list where num_cw words repeat freq_cw times, others freq_ucw."""

import random

from hybrid_jax.eval.ruler_tasks import base


def numbered(words: list[str], item_template: str, join: str) -> str:
  return join.join(item_template.format(i=i, word=w) for i, w in enumerate(words, 1))


class CommonWords:
  """Builds one CWE sample with n distinct words in the question's list (after RULER's one few-shot example)."""

  def __init__(self, spec: dict, wrapper: str, *, max_seq_length: int, count_tokens, seed: int, **_):
    self.spec, self.args, self.gen = spec, spec['args'], spec['generator']
    self.full = base.full_template(spec, wrapper)
    small = max_seq_length < 4096
    shapes = self.gen['if_max_seq_length_lt_4096'] if small else self.gen
    self.shot_shape, self.main_shape = shapes['fewshot_shape'], shapes['main_shape']
    if small:
      self.main_repeats = (self.main_shape['common_repeats'], self.main_shape['uncommon_repeats'])
    else:
      self.main_repeats = (self.args['freq_cw'], self.args['freq_ucw'])
    lists = base.word_lists()
    vocab = sorted(set(lists['nouns']) | set(lists['adjectives']) | set(lists['verbs']))
    random.Random(seed).shuffle(vocab)
    item_cost = max(1, count_tokens(' 1000. ' + vocab[0]))
    needed = int(1.5 * max_seq_length / (item_cost * max(1, self.main_repeats[1]))) + self.shot_shape['num_words']
    if needed > len(vocab):  # RULER falls back to a larger English word list here; we use the corpus words.
      known = set(vocab)
      extra = [w for w in base._corpus_words() if w not in known]  # pylint: disable=protected-access
      random.Random(seed).shuffle(extra)
      vocab += extra
    self.vocab = vocab

  def min_size(self, index):
    return self.args['num_cw']

  def max_size(self, index):
    return len(self.vocab) - self.shot_shape['num_words']

  def _list(self, words, num_cw, repeats, rng):
    common, rare = words[:num_cw], words[num_cw:]
    items = common * repeats[0] + rare * repeats[1]
    rng.shuffle(items)
    return numbered(items, self.gen['item_template'], self.gen['item_join']), common

  def build(self, index: int, rng: random.Random, n: int) -> dict:
    order = rng.sample(self.vocab, len(self.vocab))
    num_cw = self.args['num_cw']
    shot_words = order[-self.shot_shape['num_words']:]
    shot_repeats = (self.shot_shape['common_repeats'], self.shot_shape['uncommon_repeats'])
    shot_context, shot_answer = self._list(shot_words, num_cw, shot_repeats, rng)
    shot = (self.full.format(context=shot_context, query='') + ' ' +
            numbered(shot_answer, self.gen['item_template'], self.gen['item_join']))
    context, answer = self._list(order[:n], num_cw, self.main_repeats, rng)
    return {'prompt': shot + '\n' + self.full.format(context=context, query=''), 'outputs': answer}
