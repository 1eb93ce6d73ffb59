"""`python -m hybrid_jax eval` on a trained run: task outputs against independent computations, and clear errors."""

import json
import math
import re
import shutil

import jax
import numpy as np
import pytest

from tests.conftest import small_config
from hybrid_jax.train import runs
from hybrid_jax.data import catalog, pipeline
from hybrid_jax.data.tokenizers import ByteTokenizer
from hybrid_jax.commands import eval as cli, parsing
from hybrid_jax.eval import suite
from hybrid_jax.eval.scoring import ModelScorer
from hybrid_jax.train import state as state_lib


def _log_softmax_nll(logits, targets):
  logits = np.asarray(logits, np.float64)
  logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  return logz - np.take_along_axis(logits, np.asarray(targets)[..., None], -1)[..., 0]


@pytest.mark.parametrize('arch', ['swa128_nope', 'gdn'])
def test_scorer_nll_is_unchanged_by_padding(arch):
  """Right padding to the compile bucket leaves every real token's NLL as one unpadded forward pass gives it."""
  cfg = small_config(arch, dtype='float32').model
  model_def, params = state_lib.init_model(cfg, 3)
  ids = np.random.default_rng(0).integers(0, 256, 37)
  scorer = ModelScorer(model_def, params, ByteTokenizer(), pad_multiple=16)
  logits = jax.jit(lambda p, t: model_def.bind(p)(t))(params, ids[None, :-1])
  expected = _log_softmax_nll(logits[0], ids[1:])
  got = scorer.nll(ids)
  assert math.isnan(got[0])
  np.testing.assert_allclose(got[1:], expected, rtol=1e-5, atol=1e-5)


def test_parse_tasks():
  assert suite.parse_tasks('ppl, ruler:vt+cwe') == [('ppl', []), ('ruler', ['vt', 'cwe'])]
  with pytest.raises(suite.EvalError, match="unknown eval task 'rulr'"):
    suite.parse_tasks('ppl,rulr')
  with pytest.raises(suite.EvalError, match='no tasks'):
    suite.parse_tasks(' , ')


def _run_on_files(tiny_run, tmp_path, corpus):
  """A copy of the tiny run whose held-out text is `corpus` (a JSONL file), half of it held out."""
  run_dir = tmp_path / 'run'
  shutil.copytree(tiny_run, run_dir)
  config = json.loads((run_dir / 'config.json').read_text())
  config['data'].update(source='files', paths=str(corpus), eval_fraction=0.5)
  (run_dir / 'config.json').write_text(json.dumps(config))
  return run_dir


def test_ppl_by_position_on_the_same_documents_and_packed_loss_beside_it(tiny_run, tmp_path, capsys):
  corpus = tmp_path / 'docs.jsonl'
  corpus.write_text(''.join(json.dumps({'text': (f'doc {i:02d}: ' + 'x = y + 1\n' * 12)[:(100, 48)[i % 2]]}) + '\n'
                            for i in range(40)))  # 48-byte documents reach 32 tokens but not 64.
  run_dir = _run_on_files(tiny_run, tmp_path, corpus)
  out = tmp_path / 'eval'
  assert cli.main(['--workdir', str(run_dir), '--tasks', 'ppl', '--context-lengths', '32,64', '--ppl-batches', '2',
                   '--ppl-documents', '5', '--batch-size', '2', '--out', str(out), '--no-progress']) == 0
  result = json.loads((out / 'ppl.json').read_text())
  assert (out / 'ppl_by_position.png').stat().st_size > 0
  assert result['step'] == 12 and set(result['by_context']) == {'32', '64'}
  short, long = result['by_context']['32'], result['by_context']['64']
  ids = result['documents']['ids']
  assert short['document_ids'] == long['document_ids'] == ids and len(set(ids)) == 5
  run = runs.load_run(run_dir)
  held_out = catalog.make_source(run.config.data, 'eval')
  texts = [held_out[i].encode() for i in ids]
  assert all(len(t) >= 64 for t in texts) and any(len(held_out[i]) == 48 for i in range(len(held_out)))
  rows = np.stack([np.concatenate([[256], np.frombuffer(t, np.uint8)[:64]]) for t in texts]).astype(np.int32)
  assert run.config.data.packing == 'documents'  # Each document from its start; the EOS before it is one alone.
  alone = np.minimum(np.arange(64), 1)[None].repeat(5, 0) + 1
  nll = _log_softmax_nll(run.model(rows[:, :-1], segment_ids=alone), rows[:, 1:])
  for length, got in ((32, short), (64, long)):
    assert got['documents'] == 5 and got['tokens'] == 5 * length
    np.testing.assert_allclose(got['loss'], nll[:, :length].mean(), rtol=1e-5)
    for b in got['loss_by_position']:
      np.testing.assert_allclose(b['loss'], nll[:, b['start']:b['end']].mean(), rtol=1e-5)
  assert [(b['start'], b['end']) for b in long['loss_by_position']][:4] == [(0, 8), (8, 16), (16, 24), (24, 32)]
  for a, b in zip(short['loss_by_position'], long['loss_by_position']):
    assert a['loss'] == pytest.approx(b['loss'], rel=1e-6)
  for length in (32, 64):  # The packed loss, labelled so, over packed rows as training sees them.
    config = run.config.copy_and_resolve_references()
    config.data.seq_len, config.train.batch_size = length, 2
    batches = pipeline.make_eval_batches(config, 2)  # Documents apart; a target counts inside its document.
    counted = [(b['segment_ids'] == b['target_segment_ids']) & (b['segment_ids'] > 0) for b in batches]
    packed = [_log_softmax_nll(run.model(b['inputs'], segment_ids=b['segment_ids']), b['targets'])[w]
              for b, w in zip(batches, counted)]
    got = result['by_context'][str(length)]
    assert got['packed_tokens'] == sum(int(w.sum()) for w in counted) < 2 * 2 * length
    np.testing.assert_allclose(got['packed_loss'], np.mean(np.concatenate(packed)), rtol=1e-4)
  printed = capsys.readouterr().out
  assert 'perplexity' in printed and 'packed_loss' in printed


def test_longppl_with_file_spans_and_self_evaluator(tiny_run, tmp_path):
  text = 'def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n' * 3
  spans = [[17, 29], [60, 70]]
  data = tmp_path / 'docs.jsonl'
  data.write_text(json.dumps({'text': text, 'spans': spans}) + '\n' + json.dumps({'text': text[::-1]}) + '\n')
  out = tmp_path / 'eval'
  assert cli.main(['--workdir', str(tiny_run), '--tasks', 'longppl', '--context-lengths', '64,200',
                   '--longppl-data', str(data), '--longppl-evaluator', 'self', '--longppl-trunc-len', '32',
                   '--longppl-stride', '16', '--out', str(out), '--no-progress']) == 0
  result = json.loads((out / 'longppl.json').read_text())
  run = runs.load_run(tiny_run)
  ids = np.frombuffer(text.encode(), np.uint8).astype(np.int32)
  for length in (64, 200):
    doc = result['by_context'][str(length)]['documents'][0]
    n = min(length, len(ids))
    nll = _log_softmax_nll(run.model(ids[None, :n - 1]), ids[None, 1:n])[0]
    key = [i for i in range(1, n) if any(a <= i < b for a, b in spans)]  # ASCII: byte i is character i
    assert doc['key_tokens'] == len(key)
    np.testing.assert_allclose(doc['longppl'], math.exp(np.mean(nll[np.asarray(key) - 1])), rtol=1e-4)
    np.testing.assert_allclose(doc['ppl'], math.exp(np.mean(nll)), rtol=1e-4)
  assert result['evaluator'] == 'self'


def test_niah_and_ruler_write_scores_and_heat_map(tiny_run, tmp_path):
  out = tmp_path / 'eval'
  assert cli.main(['--workdir', str(tiny_run), '--tasks', 'niah:niah_single_1,ruler:niah_single_1',
                   '--context-lengths', '520', '--max-context', '600', '--samples', '1', '--depths', '0,1',
                   '--out', str(out), '--no-progress']) == 0
  niah = json.loads((out / 'niah.json').read_text())
  assert (out / 'niah_heatmap.png').stat().st_size > 0
  assert np.asarray(niah['scores']).shape == (2, 1) and len(niah['samples']) == 2
  # The scores the command wrote follow from the predictions it recorded by RULER's rule (all needle values
  # contained, case-insensitively), cell by cell.
  expected = [[100.0 * all(o.lower() in sample['prediction'].lower() for o in sample['outputs'])]
              for sample in niah['samples']]
  assert niah['scores'] == expected and niah['average'] == pytest.approx(np.mean(expected))
  ruler_result = json.loads((out / 'ruler.json').read_text())
  assert set(ruler_result['by_context']['520']['per_task']) == {'niah_single_1'}
  assert niah['word_source'] == ruler_result['word_source'] == 'wonderwords'  # RULER's own key words.


def test_niah_scores_place_each_answer_in_its_depth_and_length_cell(tiny_run, tmp_path, monkeypatch):
  """With a generator that answers the needle's value only when the needle sits in the first half of the prompt
  or the context is the longer one, the grid's scores are known in advance: [[100, 100], [0, 100]]."""
  def answer_by_needle_position(self, prompts, max_new_tokens, **kwargs):
    del self, max_new_tokens, kwargs
    answers = []
    for prompt in prompts:
      needle = re.search(r'special magic numbers for [\w-]+ is: (\d+)\.', prompt)
      early, longer = needle.start() < len(prompt) / 2, len(prompt) > 800
      answers.append(f' {needle.group(1)}.' if early or longer else ' 1234567.')
    return answers
  monkeypatch.setattr(ModelScorer, 'generate', answer_by_needle_position)
  out = tmp_path / 'eval'
  assert cli.main(['--workdir', str(tiny_run), '--tasks', 'niah:niah_single_1', '--context-lengths', '800,1200',
                   '--max-context', '1200', '--samples', '1', '--depths', '0,1', '--out', str(out),
                   '--no-progress']) == 0
  niah = json.loads((out / 'niah.json').read_text())
  assert niah['scores'] == [[100.0, 100.0], [0.0, 100.0]]
  assert niah['by_context'] == {'800': 50.0, '1200': 100.0} and niah['average'] == 75.0


def _longbench_file(path, task, records):
  path.mkdir(exist_ok=True)
  (path / f'{task}.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))


def test_longbench_from_local_files(tiny_run, tmp_path):
  lb = tmp_path / 'longbench'
  _longbench_file(lb, 'passage_count', [{'input': '', 'context': 'Paragraph 1: a b c. Paragraph 2: d e.',
                                         'answers': ['2'], 'length': 9, 'all_classes': None, '_id': 'x'}])
  _longbench_file(lb, 'trec', [{'input': 'What is the capital of France?', 'context': 'Question: Who? Type: Human',
                                'answers': ['Location'], 'length': 12, 'all_classes': ['Location', 'Human'],
                                '_id': 'y'}])
  out = tmp_path / 'eval'
  assert cli.main(['--workdir', str(tiny_run), '--tasks', 'longbench:passage_count+trec', '--context-lengths', '512',
                   '--longbench-dir', str(lb), '--out', str(out), '--no-progress']) == 0
  result = json.loads((out / 'longbench.json').read_text())['by_context']['512']
  from hybrid_jax.eval import longbench
  for task, answers in (('passage_count', ['2']), ('trec', ['Location'])):
    r = result['per_task'][task]
    classes = ['Location', 'Human'] if task == 'trec' else None
    assert r['score'] == longbench.score_task(task, r['predictions'], [answers], classes)
  assert result['plain_mean'] == pytest.approx((result['per_task']['passage_count']['score'] +
                                                result['per_task']['trec']['score']) / 2, abs=0.01)


def _status(argv) -> int:
  """The exit status of `eval ARGV` as the command line reports it (a user error: one line, status 2)."""
  try:
    return parsing.run(cli.main, argv)
  except SystemExit as e:  # A bad flag, refused while parsing.
    return e.code


@pytest.mark.parametrize('argv, message', [
    (['--tasks', 'ppl', '--context-lengths', '100000'], 'exceed --max-context=512'),
    (['--tasks', 'longbench'], '--longbench-dir'),
    (['--tasks', 'longbench:qasper', '--longbench-dir', '/nonexistent'], '/nonexistent: does not exist'),
    (['--tasks', 'longbench:nope', '--longbench-dir', '/tmp'], "unknown LongBench task 'nope'"),
    (['--tasks', 'ruler:qa_1'], '--squad=PATH'),
    (['--tasks', 'ruler:vt', '--context-lengths', '64'], 'too small'),
    (['--tasks', 'longppl'], '--longppl-data'),
    (['--tasks', 'ppl:x'], 'takes no sub-tasks'),
    (['--tasks', 'ppl', '--step', '5'], 'no checkpoint at step 5'),
    (['--tasks', 'ppl', '--ppl-documents', '1000'], 'have >= 64 tokens; loss by position needs 1000'),
    (['--tasks', 'lm_eval'], 'lm_eval:task+task'),
])
def test_clear_errors(tiny_run, tmp_path, capsys, argv, message):
  assert _status(['--workdir', str(tiny_run), '--out', str(tmp_path), '--no-progress'] + argv) == 2
  assert message in capsys.readouterr().err


def test_longppl_documents_without_spans_need_an_evaluator(tiny_run, tmp_path, capsys):
  data = tmp_path / 'docs.jsonl'
  data.write_text(json.dumps({'text': 'no spans here'}) + '\n')
  assert _status(['--workdir', str(tiny_run), '--tasks', 'longppl', '--longppl-data', str(data),
                  '--out', str(tmp_path), '--no-progress']) == 2
  assert '--longppl-evaluator' in capsys.readouterr().err


@pytest.mark.parametrize('argv, message', [(['--context-lengths', '4k'], "'4k' is invalid: must be a positive"),
                                           (['--ppl-documents', '1'], "'1' is invalid: must be an integer >= 2")])
def test_bad_flag_values_exit_with_usage(tiny_run, capsys, argv, message):
  with pytest.raises(SystemExit) as e:
    cli.main(['--workdir', str(tiny_run)] + argv)
  assert e.value.code == 2 and message in capsys.readouterr().err
