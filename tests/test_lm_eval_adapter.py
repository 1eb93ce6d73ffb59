"""The lm-evaluation-harness adapter: each request type against a direct forward pass of the same model."""

import json
import sys

import jax
import numpy as np
import pytest

from hybrid_jax.data.tokenizers import ByteTokenizer
from hybrid_jax.eval import lm_eval_adapter
from hybrid_jax.eval.scoring import ModelScorer
from hybrid_jax.train import state as state_lib
from tests.conftest import small_config


@pytest.fixture(scope='module')
def model():
  model_def, params = state_lib.init_model(small_config('swa128_nope', dtype='float32').model, 5)
  forward = jax.jit(lambda p, t: model_def.bind(p)(t))
  return model_def, params, lambda ids: np.asarray(forward(params, np.asarray(ids, np.int32)[None])[0], np.float64)


def _log_probs(logits):
  return logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(
      -1, keepdims=True)


def _requests(model, max_length):
  model_def, params, _ = model
  return lm_eval_adapter.Requests(ModelScorer(model_def, params, ByteTokenizer(), pad_multiple=8),
                                  max_length=max_length)


def test_loglikelihood_and_greedy_flag(model):
  _, _, forward = model
  tok = ByteTokenizer()
  requests = _requests(model, 64)
  pairs = [('The cat sat on the', ' mat'), ('', 'x'), ('abc', 'abcd')]
  results = requests.loglikelihood(pairs)
  for (context, continuation), (logprob, greedy) in zip(pairs, results):
    ctx = tok.encode(context).tolist() or [tok.eos_id]
    cont = tok.encode(continuation).tolist()
    ids = ctx + cont
    lp = _log_probs(forward(ids[:-1]))
    rows = range(len(ctx) - 1, len(ids) - 1)
    expected = sum(lp[r, ids[r + 1]] for r in rows)
    np.testing.assert_allclose(logprob, expected, rtol=1e-5, atol=1e-5)
    assert greedy == all(np.argmax(lp[r]) == ids[r + 1] for r in rows)
  # The model's own greedy continuation is flagged greedy.
  lp = _log_probs(forward(tok.encode('hello')))
  best = bytes([int(np.argmax(lp[-1]))]).decode('latin-1')
  if int(np.argmax(lp[-1])) < 128:
    assert requests.loglikelihood([('hello', best)])[0][1]


def test_loglikelihood_keeps_the_last_max_length_tokens(model):
  _, _, forward = model
  tok = ByteTokenizer()
  context, continuation = 'a long context that will be cut on the left', ' end'
  (logprob, _), = _requests(model, 16).loglikelihood([(context, continuation)])
  ids = (tok.encode(context).tolist() + tok.encode(continuation).tolist())[-17:]
  lp = _log_probs(forward(ids[:-1]))
  expected = sum(lp[r, ids[r + 1]] for r in range(len(ids) - 5, len(ids) - 1))
  np.testing.assert_allclose(logprob, expected, rtol=1e-5, atol=1e-5)


def test_loglikelihood_rolling_in_disjoint_windows(model):
  _, _, forward = model
  tok = ByteTokenizer()
  text = 'rolling windows score every token exactly once'
  ids = [tok.eos_id] + tok.encode(text).tolist()
  lp = _log_probs(forward(ids[:-1]))
  whole = sum(lp[i - 1, ids[i]] for i in range(1, len(ids)))
  np.testing.assert_allclose(_requests(model, 64).loglikelihood_rolling([text])[0], whole, rtol=1e-5)
  # max_length 10: targets 1..10 see ids[0:10], targets 11..20 see ids[1:20] (10 tokens of context), ...
  expected, start = 0.0, 1
  while start < len(ids):
    end = min(start + 10, len(ids))
    window = ids[max(0, end - 11):end]
    wlp = _log_probs(forward(window[:-1]))
    expected += sum(wlp[j - 1, window[j]] for j in range(len(window) - (end - start), len(window)))
    start = end
  np.testing.assert_allclose(_requests(model, 10).loglikelihood_rolling([text])[0], expected, rtol=1e-5)


def test_generate_until_stops_and_limits(model):
  requests = _requests(model, 64)
  free = requests.generate_until([('Once upon a time', {'max_gen_toks': 12})])[0]
  assert 0 < len(free) <= 12  # Each byte token decodes to at most one character.
  ascii_chars = [c for c in free[1:] if ' ' <= c < '\x7f']  # A stop string that decodes the same in any prefix.
  if ascii_chars:
    cut = requests.generate_until([('Once upon a time', {'until': [ascii_chars[0]], 'max_gen_toks': 12})])[0]
    assert cut == free.split(ascii_chars[0])[0]
  with pytest.raises(ValueError, match='greedy'):
    requests.generate_until([('x', {'do_sample': True})])


def test_harness_runs_a_local_task(model, tmp_path):
  """lm-evaluation-harness runs a local-file multiple-choice task on our model, scoring as a direct computation."""
  model_def, params, _ = model
  scorer = ModelScorer(model_def, params, ByteTokenizer())
  data = tmp_path / 'tiny.jsonl'
  data.write_text(''.join(json.dumps({'question': f'{a}+{a}=', 'choices': [str(2 * a), str(2 * a + 1)], 'label': 0})
                          + '\n' for a in range(4)))
  (tmp_path / 'tiny.yaml').write_text(
      'task: hybrid_jax_tiny\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: ' + str(data) +
      '\ntest_split: test\noutput_type: multiple_choice\ndoc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\n'
      'doc_to_target: label\nmetric_list:\n  - metric: acc\n')
  results = lm_eval_adapter.evaluate(scorer, ['hybrid_jax_tiny'], max_length=64, include_path=str(tmp_path))
  # The harness scores ' choice' after the question; recompute its accuracy from the model's log-probs directly.
  _, _, forward = model
  tok = ByteTokenizer()
  correct = 0
  for a in range(4):
    scores = []
    for choice in (str(2 * a), str(2 * a + 1)):
      ctx, cont = tok.encode(f'{a}+{a}=').tolist(), tok.encode(' ' + choice).tolist()
      ids = ctx + cont
      lp = _log_probs(forward(ids[:-1]))
      scores.append(sum(lp[r, ids[r + 1]] for r in range(len(ctx) - 1, len(ids) - 1)))
    correct += int(np.argmax(scores) == 0)
  assert results['hybrid_jax_tiny']['acc,none'] == pytest.approx(correct / 4)


def test_missing_harness_is_a_clear_error(model, monkeypatch):
  model_def, params, _ = model
  monkeypatch.setitem(sys.modules, 'lm_eval', None)  # as if the package were not installed
  with pytest.raises(lm_eval_adapter.NotInstalled, match=r'hybrid_jax\[eval\]'):
    lm_eval_adapter.evaluate(ModelScorer(model_def, params, ByteTokenizer()), ['x'], max_length=64)
