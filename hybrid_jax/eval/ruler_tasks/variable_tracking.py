"""Variable tracking (vt): chains of `VAR X = VAR Y` hidden in noise lines, with RULER's always-on one-shot example."""

import random
import string

from hybrid_jax.eval.ruler_tasks import base


class VariableTracking:
  """Builds one VT sample for n noise lines; the one-shot example is built once and re-randomised per sample."""

  def __init__(self, spec: dict, wrapper: str, *, count_tokens, seed: int, **_):
    self.spec, self.args, self.gen = spec, spec['args'], spec['generator']
    self.full = base.full_template(spec, wrapper)
    shot = self.gen['one_shot_example']
    bare = spec['template'] + spec['answer_prefix']
    name_len, value = shot['var_name_length'], shot['value']

    def make(n):
      rng = random.Random(f'{seed}:vt-example')
      text, names, _ = self._fill(bare, rng, n, name_len, value)
      return {'text': text + ' ' + ' '.join(names) + '\n', 'names': names}

    budget = shot['max_seq_length'] - shot['tokens_to_generate']
    try:
      _, example, _ = base.fit_size(make, lambda e: count_tokens(e['text']), budget)
    except base.ContextTooShort:
      example = make(0)
    self.example, self.example_names, self.example_value = example['text'], example['names'], value

  def min_size(self, index):
    return 0

  def max_size(self, index):
    return None

  def _names(self, rng, count, length, taken=()):
    names = []
    while len(names) < count:
      name = ''.join(rng.choice(string.ascii_uppercase) for _ in range(length))
      if name not in names and name not in taken:
        names.append(name)
    return names

  def _fill(self, template, rng, n, name_len, value=None):
    """Fills `template` with one context of n noise lines; returns (text, first chain's names, its value)."""
    hops, chains_n = self.args['num_hops'], self.args['num_chains']
    names = self._names(rng, chains_n * (hops + 1), name_len)
    low, high = self.gen['value_low'], self.gen['value_high_exclusive']
    values = [value or str(rng.randrange(low, high)) for _ in range(chains_n)]
    lines = [self.gen['noise_sentence']] * n
    for c in range(chains_n):
      chain = names[c * (hops + 1):(c + 1) * (hops + 1)]
      chain_lines = [self.gen['chain_head_template'].format(var=chain[0], value=values[c])]
      chain_lines += [self.gen['chain_link_template'].format(var=chain[j], prev=chain[j - 1]) for j in
                      range(1, hops + 1)]
      positions = sorted(rng.randint(0, len(lines)) for _ in chain_lines)
      for k, (at, line) in enumerate(zip(positions, chain_lines)):
        lines.insert(at + k, line)
    old, new = self.gen['context_fixup']
    context = '\n'.join(lines).replace(old, new)
    text = template.format(context=context, query=values[0], num_v=hops + 1)
    return text, names[:hops + 1], values[0]

  def _shot(self, rng):
    """The one-shot example with fresh names and value (RULER re-randomises it for every sample)."""
    text = self.example
    fresh = self._names(rng, len(self.example_names), len(self.example_names[0]), taken=self.example_names)
    for old, new in zip(self.example_names, fresh):
      text = text.replace(old, new)
    low, high = self.gen['value_low'], self.gen['value_high_exclusive']
    return text.replace(self.example_value, str(rng.randrange(low, high)))

  def build(self, index: int, rng: random.Random, n: int) -> dict:
    shot = self._shot(rng)
    text, names, _ = self._fill(self.full, rng, n, self.gen['var_name_length'])
    at = text.find(self.spec['template'][:20])
    return {'prompt': text[:at] + shot + '\n' + text[at:], 'outputs': names}
