"""LongBench v1 adapter: golden cases from the official scorer, hand-computed metrics, prompts and truncation."""

import json
import pathlib

import pytest

from hybrid_jax.eval import longbench

CASES = json.loads((pathlib.Path(__file__).parent / 'data' / 'longbench_metric_cases.json').read_text('utf-8'))
NEEDS = {'qa_f1_zh': ('jieba',), 'rouge_zh': ('jieba', 'rouge'), 'rouge': ('rouge',), 'code_sim': ('rapidfuzz',)}


def _require(task):
  for module in NEEDS.get(longbench.TASK_INFO[task][0], ()):
    pytest.importorskip(module)


@pytest.mark.parametrize('case', CASES['cases'], ids=lambda c: f"{c['dataset']}:{c['note'][:40]}")
def test_golden_cases(case):
  _require(case['dataset'])
  expected = case['expected_dataset_score']
  if isinstance(expected, dict):  # fuzzywuzzy backends disagree: check both.
    for backend, value in (('levenshtein', expected['python-Levenshtein']), ('difflib', expected['difflib'])):
      got = longbench.score_task(case['dataset'], [case['pred']], [case['answers']], case['all_classes'],
                                 backend=backend)
      assert got == value, backend
  else:
    assert longbench.score_task(case['dataset'], [case['pred']], [case['answers']], case['all_classes']) == expected


@pytest.mark.parametrize('words,expected,extra_frames', [(980, 100.0, 60), (1000, 0.0, 0)])
def test_rouge_recursion_limit_case(words, expected, extra_frames):
  pytest.importorskip('rouge')
  text = ' '.join(f'w{i}' for i in range(words))

  def deeper(k):  # The official outcome must not depend on how deep the caller's stack is.
    return deeper(k - 1) if k else longbench.score_task('gov_report', [text], [[text]])

  assert deeper(extra_frames) == expected


def test_hand_computed_metrics():
  # qa_f1: pred {paris, is, capital, of, france} vs {capital, of, france}: P=3/5, R=1 -> F1 = 0.75.
  assert longbench.qa_f1('Paris is the capital of France!', 'the capital of France') == pytest.approx(0.75)
  assert longbench.normalize_answer('The  Quick, brown-fox!') == 'quick brownfox'
  assert longbench.f1_tokens(['a', 'a', 'b'], ['a', 'b', 'b']) == pytest.approx(2 / 3)
  assert longbench.retrieval('Paragraph 3, Paragraph 3 or 4', 'Paragraph 3') == pytest.approx(2 / 3)
  assert longbench.count('no digits', '5') == 0.0
  assert longbench.classification('LOC:city', 'LOC:city', all_classes=['LOC:city', 'HUM:ind']) == 1.0
  assert longbench.code_sim('\n```\n// c\n  y = 2', '  y = 2') == 1.0
  # Multi-sample dataset score: (1 + 0 + 0.5) / 3 -> 50.0.
  assert longbench.score_task('passage_count', ['4', '5', '4 and 6'], [['4'], ['4'], ['4']]) == 50.0


def test_fuzz_ratio_rounding_and_edges():
  pytest.importorskip('rapidfuzz')
  assert longbench.fuzz_ratio('', '') == 100 and longbench.fuzz_ratio('', 'a') == 0
  assert longbench.fuzz_ratio(None, 'a') == 0
  # 'ab' vs 'ac': Indel distance 2, ratio (4 - 2) / 4 = 0.5 -> 50.
  assert longbench.fuzz_ratio('ab', 'ac') == 50
  with pytest.raises(ValueError, match='backend'):
    longbench.fuzz_ratio('a', 'b', backend='nope')


def test_averages_are_means_of_category_means():
  scores = {'narrativeqa': 10.0, 'qasper': 30.0, 'hotpotqa': 50.0, 'lcc': 70.0, 'dureader': 40.0}
  out = longbench.averages(scores)
  assert out['categories'] == {'single-doc QA': 20.0, 'multi-doc QA': 45.0, 'code': 70.0}
  assert out['en'] == round((20 + 50 + 70) / 3, 2)  # dureader is zh: not in the English multi-doc mean.
  assert out['zh'] == round((40 + 70) / 2, 2)  # code counts for both languages.
  assert out['plain_mean'] == 40.0


def test_longbench_e_buckets():
  out = longbench.score_task_e('passage_count', ['1', '2', '3'], [['1'], ['1'], ['3']], [100, 5000, 9000])
  assert out == {'0-4k': 100.0, '4-8k': 0.0, '8k+': 100.0}


def _tokenizer():
  """A word-level tokenizer with a BOS id 0 (special, skipped when decoding)."""
  vocab = {}

  def encode(text):
    return [0] + [vocab.setdefault(w, len(vocab) + 1) for w in text.split(' ')]

  def decode(ids):
    inverse = {i: w for w, i in vocab.items()}
    return ' '.join(inverse[i] for i in ids if i != 0)

  return encode, decode


def test_truncate_middle_keeps_both_ends():
  encode, decode = _tokenizer()
  text = ' '.join(f'w{i}' for i in range(20))
  assert longbench.truncate_middle(text, 21, encode, decode) == text  # 21 tokens with BOS: fits.
  # 10 tokens: first 5 (BOS + w0..w3) and last 5 (w15..w19), decoded separately, joined with nothing.
  assert longbench.truncate_middle(text, 10, encode, decode) == 'w0 w1 w2 w3' + 'w15 w16 w17 w18 w19'


def test_prepare_prompt_and_chat_exceptions():
  encode, decode = _tokenizer()
  sample = {'input': 'Who?', 'context': 'Some story.', 'answers': ['x'], 'length': 3, 'all_classes': None,
            'language': 'en', '_id': 'id0'}
  chat = lambda p: f'[INST] {p} [/INST]'
  out = longbench.prepare('narrativeqa', sample, max_length=1000, encode=encode, decode=decode, chat=chat)
  assert out['prompt'].startswith('[INST] You are given a story') and 'Story: Some story.' in out['prompt']
  assert out['prompt'].endswith('Question: Who?\n\nAnswer: [/INST]') and out['max_new_tokens'] == 128
  raw = longbench.prepare('trec', sample, max_length=1000, encode=encode, decode=decode, chat=chat)
  assert raw['prompt'] == longbench.build_prompt('trec', sample) and raw['max_new_tokens'] == 64
  assert longbench.max_new_tokens('gov_report') == 512


def test_read_jsonl_and_errors(tmp_path):
  path = tmp_path / 'hotpotqa.jsonl'
  rows = [{'input': 'q', 'context': 'c', 'answers': ['a'], 'length': 2, 'all_classes': None, 'language': 'en',
           '_id': str(i)} for i in range(2)]
  path.write_text('\n'.join(json.dumps(r) for r in rows) + '\n', 'utf-8')
  assert [r['_id'] for r in longbench.read_jsonl(str(path))] == ['0', '1']
  with pytest.raises(FileNotFoundError, match='does not exist'):
    longbench.read_jsonl(str(tmp_path / 'missing.jsonl'))
  bad = tmp_path / 'bad.jsonl'
  bad.write_text('{"input": "q"}\n', 'utf-8')
  with pytest.raises(ValueError, match=r'bad.jsonl:1: missing field'):
    longbench.read_jsonl(str(bad))
  with pytest.raises(ValueError, match='unknown LongBench task'):
    longbench.build_prompt('nope', rows[0])
