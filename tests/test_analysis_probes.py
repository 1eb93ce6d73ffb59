"""Needle location, a planted retrieval head, linear probes and gradient influence against independent references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.analysis import gradient_influence, needles, probing, retrieval_heads
from hybrid_jax.data.tokenizers import ByteTokenizer
from hybrid_jax.train import state as state_lib
from tests.conftest import small_config


def test_needle_is_located_however_the_tokenizer_splits_it():
  value = '4719253'
  for text in (f'a b: {value}. c', f'x {value} y', f'x{value}.', f'ends {value}'):
    start, end = needles.needle_span(text, value)
    assert text[start:end] == value
  text = f'The number is: {value}. Asked later: 4719253?'
  start, _ = needles.needle_span(text, value)
  assert start == text.index(': 47') + 2  # The needle's own occurrence, not a later mention.
  # A tokenizer that merges the leading space with the first digits and the period with the last ones.
  text = f'is: {value}.'
  offsets = [(0, 2), (2, 3), (3, 7), (7, 9), (9, 12), (12, 13)]  # 'is', ':', ' 471', '92', '53.', '' (empty)
  np.testing.assert_array_equal(needles.locate_needle(text, value, offsets), [2, 3, 4])
  with pytest.raises(needles.NeedleError):
    needles.needle_span('no needle here', value)


VALUE = '4719253'
PLANTED = 3  # Query head 3 (KV head 1 of 2).


def test_recall_samples_point_at_the_queried_record_not_at_other_records_with_the_same_digits():
  """--source recall: each prompt is a held-out document up to the queried key; the needle is the first record's
  value (its tokens) even where another record holds the same digits first; a run trained on other data is one
  line."""
  from tests.test_recall import recall_config
  cfg = recall_config(pairs=6, distractors=2).data
  samples = needles.make_samples('recall', 60, length=0, tokenizer=None, data_cfg=cfg)
  assert len(samples) == 60
  tokenizer = ByteTokenizer()
  elsewhere = 0
  for sample in samples:
    assert sample['prompt'].endswith(sample['key']) and sample['answer'] == sample['value']
    encoded = needles.encode(sample, tokenizer)
    start, end = sample['needle_span']
    assert encoded.needle.tolist() == list(range(start, end))  # Bytes: token i is character i.
    assert sample['prompt'][start:end] == sample['value'] and sample['prompt'][end:].find(sample['key']) >= 0
    elsewhere += sample['prompt'].find(sample['value']) != start  # Searching for the digits would miss these.
  assert elsewhere > 0
  builtin = small_config('swa128').data
  with pytest.raises(needles.NeedleError, match=r"^needle source 'recall' reads the run's own recall task; this "
                     r"run trained on data.source='builtin'"):
    needles.make_samples('recall', 4, length=64, tokenizer=None, data_cfg=builtin)
  with pytest.raises(needles.NeedleError, match=r"^needle source 'recall' reads a run's own recall task, and this "
                     r"analysis has no run config$"):
    needles.make_samples('recall', 4, length=64, tokenizer=None)


def _planted_model():
  """[Lightning layer doing nothing, full NoPE attention layer with one hand-built copying head].

  Embedding dims 0-9: the token's digit; 10-19: the digit to fetch next (for a digit of the needle, its successor
  in the needle; for any other token, the needle's first digit). The planted head's query reads 10-19 and its key
  0-9, so it attends to the needle digit that comes next; its value/output write that digit to dims 30-39, which
  the LM head reads out: the model copies the needle one digit at a time. Every other weight is zero.
  """
  cfg = small_config('lightning', num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, head_dim=16, d_ff=16,
                     rope_full=False).model
  model_def, params = state_lib.init_model(cfg, 0)
  p = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), params)
  for block in p['tail'].values():
    block['mixer_norm']['scale'][:] = 1
    block['mlp_norm']['scale'][:] = 1
  p['final_norm']['scale'][:] = 1
  digits = [int(ch) for ch in VALUE]
  for token in range(256):
    p['embed'][token, 20] = 1.0
    if chr(token).isdigit() and token < 128:
      d = int(chr(token))
      p['embed'][token, d] = 1.0
      if d in digits and digits.index(d) + 1 < len(digits):
        p['embed'][token, 10 + digits[digits.index(d) + 1]] = 1.0
    else:
      p['embed'][token, 10 + digits[0]] = 1.0
  mixer = p['tail'][1]['mixer']
  for i in range(10):
    mixer['wq'][10 + i, PLANTED, i] = 3.0
    mixer['wk'][i, PLANTED // 2, i] = 3.0
    mixer['wv'][i, PLANTED // 2, i] = 1.0
    mixer['wo'][PLANTED, i, 30 + i] = 1.0
    p['lm_head'][30 + i, ord(str(i))] = 10.0
  return cfg, model_def, p


def test_a_planted_retrieval_head_gets_the_top_score():
  cfg, model_def, params = _planted_model()
  tokenizer = ByteTokenizer()
  samples = needles.study_samples(4, length=300, tokenizer=tokenizer, values=(VALUE,), depths=(0.2, 0.5, 0.8))
  result = retrieval_heads.score(model_def, cfg, params, samples, tokenizer, top_k=4)
  assert [l['scored'] for l in result['layers']] == [False, True]  # The recurrent layer is listed, not scored.
  assert result['layers'][0]['kind'] == 'lightning' and result['layers'][0]['mass'] is None
  for definition in ('mass', 'copy', 'copy_gold'):
    top = result['top_heads'][definition]
    assert (top[0]['layer'], top[0]['head']) == (1, PLANTED)
    assert top[0]['score'] > 0.99 and top[1]['score'] < 0.1
  # Heads with zero weights attend uniformly: their mass is the needle's share of the visible keys.
  encoded = [needles.encode(s, tokenizer) for s in samples]
  uniform = np.mean([len(e.needle) / (e.prompt_len - 1) for e in encoded])
  assert result['layers'][1]['mass'][0] == pytest.approx(uniform, rel=1e-4)


def test_probes_read_a_planted_feature_and_not_shuffled_labels():
  rng = np.random.RandomState(0)
  labels = np.arange(400) % 8
  features = rng.normal(size=(400, 16))
  features[:, :8] += 4.0 * np.eye(8)[labels]  # Linearly separable by construction.
  assert probing.probe_accuracy(features, labels) > 0.97
  shuffled = rng.permutation(labels)
  assert probing.probe_accuracy(features, shuffled) < 0.3  # Chance is 0.125.


def test_gradient_influence_is_zero_beyond_the_receptive_field():
  """One SWA layer of window k: the logits at t depend on tokens t-k+1..t only, so with s over the last n positions
  G(d) > 0 exactly for d <= k + n - 1."""
  k = 8
  model_def, params = state_lib.init_model(small_config('swa128', cycle=('swa',), num_layers=1, window=k).model, 0)
  tokens = jnp.asarray(np.random.RandomState(0).randint(0, 256, (3, 48)), jnp.int32)
  for last in (1, 20):
    g = gradient_influence.influence(gradient_influence.make_gradient_norms(model_def, last=last)(params, tokens))
    reach = k + last - 1
    assert np.all(g[:reach] > 0) and np.all(g[reach:] == 0)
