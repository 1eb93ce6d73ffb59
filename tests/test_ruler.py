"""RULER-style suite: every task generator round-trips, is deterministic and fits its length; golden metric cases."""

import json
import logging
import pathlib

import numpy as np
import pytest

from hybrid_jax.eval import niah
from hybrid_jax.eval import ruler

DATA = pathlib.Path(__file__).parent / 'data'
METRIC_CASES = json.loads((DATA / 'ruler_metric_cases.json').read_text('utf-8'))
# Word-list tasks need room: at 4K *bytes* a cwe prompt (few-shot example + 300 list items) cannot fit.
LENGTH = {'cwe': 16384, 'fwe': 8192}
DEFAULT_LENGTH = 4096
# Tolerance: every sample fits (length <= max_seq_length) and wastes less than this fraction of the budget.
# One haystack unit is at most ~100 bytes (a noise line, a needle, a VT line, a cwe word's 3 items), 2.5% of 4K;
# QA's unit is a whole document, so its slack is one document (the fixtures' documents are ~400 bytes).
SLACK = {'qa_1': 0.15, 'qa_2': 0.15}
DEFAULT_SLACK = 0.05
SENTENCE = ('The committee reviewed the annual report on regional water supply and noted several open issues. ')


@pytest.fixture(scope='module')
def qa_paths(tmp_path_factory):
  """Small files in the SQuAD v2.0 and HotpotQA (dev distractor) formats."""
  root = tmp_path_factory.mktemp('qa')
  para = lambda a, p: f'Article {a} paragraph {p}. ' + SENTENCE * 3 + f'The code word here is token{a}x{p}.'
  squad = {'version': 'v2.0', 'data': [{'title': f'Article {a}', 'paragraphs': [
      {'context': para(a, p), 'qas': [
          {'id': f'{a}-{p}', 'question': f'What is the code word of article {a} paragraph {p}?',
           'answers': [{'text': f'token{a}x{p}', 'answer_start': 0}, {'text': f'token{a}x{p}', 'answer_start': 0}],
           'is_impossible': False},
          {'id': f'{a}-{p}-x', 'question': 'Unanswerable?', 'answers': [], 'is_impossible': True}]}
      for p in range(3)]} for a in range(4)]}
  hotpot = [{'_id': str(q), 'question': f'Which city hosts project {q}?', 'answer': f'City{q}',
             'supporting_facts': [[f'Project {q}', 0], [f'Host {q}', 1]],
             'context': [[f'Project {q}', [f'Project {q} is a plan. ', SENTENCE, f'It is hosted by Host {q}.']],
                         [f'Host {q}', [SENTENCE, f'Host {q} is in City{q}.']],
                         [f'Other {q}', [SENTENCE * 2]], [f'Misc {q}', [SENTENCE, 'Nothing here.']]]}
            for q in range(6)]
  (root / 'squad.json').write_text(json.dumps(squad), 'utf-8')
  (root / 'hotpot.json').write_text(json.dumps(hotpot), 'utf-8')
  return {'squad_path': str(root / 'squad.json'), 'hotpotqa_path': str(root / 'hotpot.json')}


@pytest.fixture(scope='module')
def essay():
  return ruler.builtin_essay(num_words=3000)


def _generate(task, qa_paths, essay, n=3, seed=7, **kw):
  return ruler.generate(task, LENGTH.get(task, DEFAULT_LENGTH), n, seed=seed, essay=essay, **qa_paths, **kw)


@pytest.mark.parametrize('task', ruler.TASKS)
def test_task_round_trip_determinism_and_length(task, qa_paths, essay):
  samples = _generate(task, qa_paths, essay)
  target = LENGTH.get(task, DEFAULT_LENGTH)
  for s in samples:
    assert s['task'] == task and s['max_new_tokens'] == ruler.task_spec(task)['tokens_to_generate']
    assert s['outputs'] and all(o in s['input'] for o in s['outputs'])  # Gold present in the prompt.
    assert s['length'] == len((s['input'] + s['answer_prefix']).encode()) + s['max_new_tokens']
    assert (1 - SLACK.get(task, DEFAULT_SLACK)) * target <= s['length'] <= target, s['length']
  perfect = [' '.join(s['outputs']) for s in samples]
  assert ruler.score_task(samples, perfect)['score'] == 100.0
  empty = ruler.score_task(samples, [''] * len(samples))
  assert empty['score'] == 0.0 and empty['nulls'] == len(samples)
  assert _generate(task, qa_paths, essay) == samples  # Same seed, same samples.
  assert [s['input'] for s in _generate(task, qa_paths, essay, seed=8)] != [s['input'] for s in samples]


def test_prompt_structure_follows_ruler_templates(essay):
  single = ruler.generate('niah_single_1', 2048, 1, chat_template='vicuna-chat')[0]
  # Single-answer tasks get RULER's plain substring rewrites over the whole wrapped template.
  assert single['input'].startswith('A chat between') and 'polite answer to' in single['input']
  assert 'A special magic number is hidden' in single['input']
  assert 'One of the special magic numbers for' in single['input']  # Needles keep the plural.
  assert single['answer_prefix'].startswith(' The special magic number for ')
  assert single['answer_prefix'].endswith('mentioned in the provided text is')
  multi = ruler.generate('niah_multivalue', 4096, 1, essay=essay)[0]
  assert len(multi['outputs']) == 4 and multi['answer_prefix'].endswith('are')
  vt = ruler.generate('vt', 4096, 1)[0]
  assert vt['input'].count('Memorize and track the chain(s)') == 2  # The one-shot example and the task.
  assert vt['answer_prefix'] == (' Answer: According to the chain(s) of variable assignment in the text above, 5 '
                                 f"variables are assigned the value {vt['input'].split('value ')[-1][:5]}, they are: ")


def test_any_token_counter(essay):
  words = lambda text: len(text.split())
  s = ruler.generate('niah_single_2', 800, 2, count_tokens=words, essay=essay)
  assert all(780 <= x['length'] <= 800 for x in s), [x['length'] for x in s]


def test_errors(qa_paths, tmp_path):
  with pytest.raises(ValueError, match='unknown RULER task'):
    ruler.generate('niah_single_9', 4096, 1)
  with pytest.raises(FileNotFoundError, match='--squad'):
    ruler.generate('qa_1', 4096, 1)
  with pytest.raises(FileNotFoundError, match='does not exist'):
    ruler.generate('qa_2', 4096, 1, hotpotqa_path=str(tmp_path / 'missing.json'))
  with pytest.raises(ValueError, match='question 6'):
    ruler.generate('qa_2', 4096, 7, **qa_paths)
  with pytest.raises(ruler.ContextTooShort, match='niah_single_1 sample 0'):
    ruler.generate('niah_single_1', 300, 1)
  with pytest.raises(ValueError, match='unknown RULER metric'):
    ruler.sample_scores('exact', ['a'], [['a']])
  with pytest.raises(ValueError, match='chat_template'):
    ruler.generate('vt', 4096, 1, chat_template='nope')


@pytest.mark.parametrize('case', METRIC_CASES['cases'], ids=lambda c: c['note'])
def test_metric_golden_cases(case):
  metric = {'string_match_all': ruler.string_match_all, 'string_match_part': ruler.string_match_part}
  assert metric[case['metric']]([case['raw_pred']], [case['references']]) == case['expected_score']


@pytest.mark.parametrize('case', METRIC_CASES['multi_sample_cases'], ids=lambda c: c['note'])
def test_metric_golden_multi_sample_cases(case):
  metric = {'string_match_all': ruler.string_match_all, 'string_match_part': ruler.string_match_part}
  assert metric[case['metric']](case['raw_preds'], case['references']) == case['expected_score']


def test_summaries():
  scores = {t: 50.0 for t in ruler.TASKS}
  scores['vt'] = 100.0
  out = ruler.summarize(scores)
  assert out['niah_average'] == 50.0 and out['average'] == round((12 * 50 + 100) / 13, 2)
  by_length = {4096: 90.0, 8192: 86.0, 16384: 80.0, 32768: 95.0}
  lengths = ruler.summarize_lengths(by_length)
  assert lengths['avg'] == 87.75 and lengths['effective_length'] == 8192
  assert lengths['wavg_inc'] == round((90 + 2 * 86 + 3 * 80 + 4 * 95) / 10, 2)
  assert lengths['wavg_dec'] == round((4 * 90 + 3 * 86 + 2 * 80 + 95) / 10, 2)
  with pytest.raises(ValueError, match='unknown RULER task'):
    ruler.summarize({'nope': 1.0})


def test_score_suite(essay):
  suite = ruler.generate_suite(['niah_single_1', 'vt'], [2048], 2, essay=essay)[2048]
  predictions = {'niah_single_1': [' '.join(s['outputs']) for s in suite['niah_single_1']],
                 'vt': [suite['vt'][0]['outputs'][0], '']}  # 1/5 of the names, then nothing.
  out = ruler.score_suite(suite, predictions)
  assert out['per_task']['vt'] == {'score': 10.0, 'nulls': 1, 'num_samples': 2}
  assert out['niah_average'] == 100.0 and out['average'] == 55.0
  with pytest.raises(ValueError, match='no predictions'):
    ruler.score_suite(suite, {'vt': predictions['vt']})


def test_niah_grid_and_heatmap(tmp_path, essay):
  depths, lengths = [0.0, 0.5, 1.0], [2048, 4096]
  grid = niah.build_grid(lengths, depths, essay=essay)
  assert len(grid) == 6 and {(s['depth'], s['max_seq_length']) for s in grid} == {
      (d, n) for d in depths for n in lengths}
  for s in grid:  # The needle sits at the requested depth of the haystack (to within one essay sentence).
    start, end = s['input'].index('\n') + 1, s['input'].rindex('\nWhat is')
    position = (s['input'].index('One of the special') - start) / (end - start)
    assert abs(position - s['depth']) < 0.1, (s['depth'], position)
  predictions = [s['outputs'][0] if s['depth'] < 1 else 'no idea' for s in grid]
  scores = niah.score_grid(grid, predictions, depths, lengths)
  np.testing.assert_array_equal(scores, [[100, 100], [100, 100], [0, 0]])
  path = niah.plot_heatmap(scores, depths, lengths, str(tmp_path / 'niah.png'))
  assert pathlib.Path(path).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  with pytest.raises(ValueError, match='single-needle'):
    niah.build_grid(lengths, depths, task='niah_multikey_1')
  with pytest.raises(ValueError, match='shape'):
    niah.plot_heatmap(scores[:2], depths, lengths, str(tmp_path / 'bad.png'))


def test_word_lists_fall_back_to_the_corpus_without_wonderwords(monkeypatch, caplog):
  from hybrid_jax.eval.ruler_tasks import base  # pylint: disable=g-import-not-at-top
  assert base.word_source() == base.OFFICIAL_WORD_SOURCE  # The eval extra is installed here.
  monkeypatch.setitem(__import__('sys').modules, 'wonderwords', None)
  monkeypatch.setattr(base, '_corpus_words', lambda: tuple(f'word{i}' for i in range(300)))
  base._word_lists_and_source.cache_clear()  # pylint: disable=protected-access
  try:
    with caplog.at_level(logging.WARNING):
      lists = base.word_lists()
      assert len(lists['adjectives']) == 100 and not set(lists['adjectives']) & set(lists['nouns'])
      sample = ruler.generate('niah_single_1', 2048, 1)[0]
      assert ruler.word_source() == base.CORPUS_WORD_SOURCE
    key = sample['answer_prefix'].split(' for ')[1].split(' mentioned')[0]
    assert key.startswith('word') and '-word' in key
    assert caplog.text.count('RULER key words come from the built-in corpus') == 1  # Once, naming the cause.
    assert 'not comparable' in caplog.text and 'wonderwords' in caplog.text
  finally:
    base._word_lists_and_source.cache_clear()  # pylint: disable=protected-access
