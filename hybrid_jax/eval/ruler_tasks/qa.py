"""QA family (qa_1: SQuAD, qa_2: HotpotQA): the gold paragraph(s) hidden among distractor documents.

Reads the datasets' own JSON formats from local paths: SQuAD v1.1/v2.0 (`data[].paragraphs[].qas[]`, only
answerable questions) and HotpotQA (`[{question, answer, context: [[title, sentences]], supporting_facts}]`).
"""

import functools
import os
import random

from hybrid_jax import readers
from hybrid_jax.errors import DataError
from hybrid_jax.eval.ruler_tasks import base


def _read_json(path: str | None, what: str, option: str, expect):
  if not path:
    raise FileNotFoundError(f'{what} needs a local {what.split()[0]} JSON file: pass {option}=PATH')
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{option}={path!r} does not exist ({what} JSON file expected)')
  return readers.read_json(path, option, expect=expect, hint=f'the {what} format')


@functools.cache
def read_squad(path: str) -> tuple[list[str], list[dict]]:
  """(documents, questions): documents de-duplicated and sorted; each question knows its gold and same-article docs."""
  data = _read_json(path, 'SQuAD (qa_1)', '--squad', dict)
  try:
    articles = data['data']
    docs = sorted({p['context'] for a in articles for p in a['paragraphs']})
    index = {d: i for i, d in enumerate(docs)}
    qas = []
    for article in articles:
      same = [index[p['context']] for p in article['paragraphs']]
      for p in article['paragraphs']:
        gold = index[p['context']]
        for q in p['qas']:
          if q.get('is_impossible', False):
            continue
          qas.append({'query': q['question'], 'outputs': [a['text'] for a in q['answers']], 'gold': [gold],
                      'more': sorted(set(same) - {gold})})
  except (KeyError, TypeError) as e:
    raise DataError(f'--squad={path!r} is not in SQuAD format ({type(e).__name__}: {e})') from None
  return docs, qas


@functools.cache
def read_hotpotqa(path: str) -> tuple[list[str], list[dict]]:
  """(documents, questions): a document is `title\\n` + its sentences joined; gold = supporting-fact paragraphs."""
  data = _read_json(path, 'HotpotQA (qa_2)', '--hotpotqa', list)
  try:
    doc = lambda title, sentences: f'{title}\n{"".join(sentences)}'
    docs = sorted({doc(t, s) for item in data for t, s in item['context']})
    index = {d: i for i, d in enumerate(docs)}
    qas = []
    for item in data:
      titles = {t for t, _ in item.get('supporting_facts', [])}
      own = [(t, index[doc(t, s)]) for t, s in item['context']]
      gold = [i for t, i in own if t in titles] or [i for _, i in own]
      qas.append({'query': item['question'], 'outputs': [item['answer']], 'gold': gold,
                  'more': [i for _, i in own if i not in gold]})
  except (KeyError, TypeError, ValueError) as e:
    raise DataError(f'--hotpotqa={path!r} is not in HotpotQA format ({type(e).__name__}: {e})') from None
  return docs, qas


class QA:
  """Builds one QA sample with n documents: gold first, then same-article documents, then random others, shuffled."""

  def __init__(self, spec: dict, wrapper: str, *, squad_path=None, hotpotqa_path=None, **_):
    self.spec, self.gen = spec, spec['generator']
    self.full = base.full_template(spec, wrapper)
    dataset = spec['args']['dataset']
    if dataset == 'squad':
      self.docs, self.qas = read_squad(os.path.abspath(squad_path) if squad_path else '')
    elif dataset == 'hotpotqa':
      self.docs, self.qas = read_hotpotqa(os.path.abspath(hotpotqa_path) if hotpotqa_path else '')
    else:
      raise ValueError(f'unknown QA dataset {dataset!r}')
    if not self.qas:
      raise DataError(f'the {dataset} file {squad_path if dataset == "squad" else hotpotqa_path} holds no answerable '
                      'question')

  def _question(self, index):
    if index >= len(self.qas):
      raise DataError(f'sample {index} needs question {index}, but the file holds {len(self.qas)} questions')
    return self.qas[index]

  def min_size(self, index):
    return len(self._question(index)['gold'])

  def max_size(self, index):
    return len(self.docs)

  def build(self, index: int, rng: random.Random, n: int) -> dict:
    q = self._question(index)
    gold, more = q['gold'], rng.sample(q['more'], len(q['more']))
    if n >= len(self.docs):
      chosen = list(range(len(self.docs)))
    elif n - len(gold) <= len(more):
      chosen = gold + more[:n - len(gold)]
    else:
      taken = set(gold) | set(more)
      others = [i for i in range(len(self.docs)) if i not in taken]
      rng.shuffle(others)
      chosen = gold + more + others[:n - len(gold) - len(more)]
    rng.shuffle(chosen)
    context = self.gen['document_join'].join(
        self.gen['document_template'].format(i=i, document=self.docs[d]) for i, d in enumerate(chosen, 1))
    return {'prompt': self.full.format(context=context, query=q['query']), 'outputs': list(q['outputs'])}
