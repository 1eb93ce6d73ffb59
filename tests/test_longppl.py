"""LongPPL: span files, key-token selection, cross-tokenizer mapping and the sliding-window truncated NLL."""

import math
import pathlib

import numpy as np
import pytest

from hybrid_jax.eval import longppl

SHARED_KEY_TEXT = pathlib.Path(__file__).resolve().parents[2] / 'shared' / 'data' / 'longppl' / 'key_text'
TEXT = 'Alice met Bob in Paris. Later Alice paid 42 dollars to Bob.'


def word_offsets(text):
  """Whitespace 'evaluator' tokenizer: one token per word (punctuation attached)."""
  offsets, start = [], 0
  for word in text.split(' '):
    offsets.append((start, start + len(word)))
    start += len(word) + 1
  return offsets


def test_hand_built_selection_and_longppl():
  offsets = word_offsets(TEXT)
  words = TEXT.split(' ')
  assert words == ['Alice', 'met', 'Bob', 'in', 'Paris.', 'Later', 'Alice', 'paid', '42', 'dollars', 'to', 'Bob.']
  nan = math.nan
  nll_full = np.array([nan, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 1.0, 1.5, 3.0, 1.0, 0.1])
  nll_short = np.array([nan, 1.0, 1.0, 1.0, 1.0, 1.0, 4.0, 1.0, 5.0, 9.0, 3.0, nan])
  # Key: 'Alice' (#6, gain 3.5, log p -0.5) and '42' (#8, gain 3.5, log p -1.5). Not key: 'dollars' (gain 6 but
  # log p -3 < beta), 'to' (gain exactly 2, not > alpha), 'Bob.' (NaN short NLL), the first token (NaN).
  mask = longppl.select_key_tokens(nll_full, nll_short)
  assert np.flatnonzero(mask).tolist() == [6, 8]
  spans = longppl.key_spans(offsets, nll_full, nll_short)
  assert [TEXT[s:e] for s, e in spans] == ['Alice', '42']
  assert longppl.select_key_tokens(nll_full, nll_short, alpha=1.9).sum() == 3  # 'to' joins.
  assert longppl.select_key_tokens(nll_full, nll_short, beta=-4).sum() == 3  # 'dollars' joins.

  # The evaluated model tokenizes by character; its NLL is 2.0 on key characters and 0.5 elsewhere.
  char_offsets = [(i, i + 1) for i in range(len(TEXT))]
  in_key = np.zeros(len(TEXT), bool)
  for s, e in spans:
    in_key[s:e] = True
  nll = np.where(in_key, 2.0, 0.5)
  nll[0] = math.nan
  out = longppl.longppl(nll, char_offsets, spans)
  assert out['key_tokens'] == 7  # 'Alice' + '42'.
  assert out['longppl'] == pytest.approx(math.exp(2.0))
  assert out['tokens'] == len(TEXT) - 1
  assert out['ppl'] == pytest.approx(math.exp((7 * 2.0 + (len(TEXT) - 8) * 0.5) / (len(TEXT) - 1)))


def test_mapping_rules_across_tokenizers():
  spans = [(10, 13), (30, 35)]  # 'Bob' and 'Alice' (second one) in TEXT.
  assert [TEXT[s:e] for s, e in spans] == ['Bob', 'Alice']
  # A tokenizer with leading-space tokens: ' Bob' straddles the span start, ' Al' + 'ice' split the other.
  offsets = [(0, 5), (5, 9), (9, 13), (13, 16), (29, 32), (32, 35), (35, 40), (0, 0)]
  overlap = longppl.key_token_mask(offsets, spans)
  inside = longppl.key_token_mask(offsets, spans, rule='inside')
  assert overlap.tolist() == [False, False, True, False, True, True, False, False]
  assert inside.tolist() == [False, False, False, False, False, True, False, False]
  with pytest.raises(ValueError, match='rule'):
    longppl.key_token_mask(offsets, spans, rule='nope')


def test_span_file_round_trip_and_errors(tmp_path):
  spans = [(40, 50), (5, 9), (9, 12), (60, 61)]
  path = tmp_path / 'slice_0.txt'
  longppl.write_spans(str(path), spans)
  assert path.read_text() == '[5, 12];[40, 50];[60, 61]'  # Sorted, touching spans merged, no newline.
  (tmp_path / 'slice_1.txt').write_text('')
  assert longppl.read_span_dir(str(tmp_path)) == {0: [(5, 12), (40, 50), (60, 61)], 1: []}
  with pytest.raises(FileNotFoundError):
    longppl.read_spans(str(tmp_path / 'missing.txt'))
  with pytest.raises(FileNotFoundError):
    longppl.read_span_dir(str(tmp_path / 'missing'))
  (tmp_path / 'bad.txt').write_text('[3, 1]')
  with pytest.raises(ValueError, match='bad.txt'):
    longppl.read_spans(str(tmp_path / 'bad.txt'))
  with pytest.raises(ValueError, match='beyond the text'):
    longppl.check_spans([(0, 100)], 'short text')


def test_truncated_nll_windows():
  ids = np.arange(23)
  trunc_len, stride = 8, 3
  # nll_fn reporting each token's id shows which token a value belongs to; one reporting its position in the
  # window shows how much context that token had.
  as_id = longppl.truncated_nll(ids, lambda w: w.astype(float), trunc_len, stride)
  context = longppl.truncated_nll(ids, lambda w: np.arange(len(w), dtype=float), trunc_len, stride)
  assert np.isnan(as_id[:trunc_len]).all()
  assert (as_id[trunc_len:] == ids[trunc_len:]).all()
  assert ((context[trunc_len:] >= trunc_len - stride) & (context[trunc_len:] <= trunc_len - 1)).all()
  with pytest.raises(ValueError, match='stride'):
    longppl.truncated_nll(ids, lambda w: w, trunc_len=4, stride=4)


def test_aggregate_pools_tokens_and_skips_documents_without_keys():
  a = {'longppl': math.exp(1.0), 'ppl': math.exp(0.5), 'key_tokens': 2, 'tokens': 10, 'key_nll_sum': 2.0,
       'nll_sum': 5.0}
  b = {'longppl': math.nan, 'ppl': math.exp(1.0), 'key_tokens': 0, 'tokens': 10, 'key_nll_sum': 0.0,
       'nll_sum': 10.0}
  out = longppl.aggregate([a, b])
  assert out['longppl'] == pytest.approx(math.exp(1.0)) and out['documents_with_key_tokens'] == 1
  assert out['ppl'] == pytest.approx(math.exp(15.0 / 20))


@pytest.mark.skipif(not SHARED_KEY_TEXT.is_dir(), reason='shared LongPPL key_text not present')
def test_reads_the_released_key_span_files():
  llama = longppl.read_span_dir(str(SHARED_KEY_TEXT / 'Meta-Llama-3.1-8B'))
  assert sorted(llama) == list(range(50))
  assert sum(len(s) for s in llama.values()) == 2965
  for spans in llama.values():
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:]))  # Sorted, never touching.
    assert spans[0][0] > 20000 and spans[-1][1] < 140000
  assert longppl.read_spans(str(SHARED_KEY_TEXT / 'Qwen2-72B-Instruct' / 'slice_9.txt')) == []


def test_end_to_end_with_a_toy_model():
  """A character 'model' that needs long context for digits: its key spans are exactly the late digits."""
  text = 'abcdefghij' * 3 + '7' + 'abcdefghij' + '8'
  tokenize = lambda t: ([ord(c) for c in t], [(i, i + 1) for i in range(len(t))])

  def nll_fn(ids):  # Digits are easy with more than 8 tokens of context, hard otherwise; letters always easy.
    out = np.where(np.arange(len(ids)) > 8, 0.1, 5.0)
    out[np.asarray(ids) < ord('a')] = 0.1 if len(ids) > 20 else 5.0
    out[np.asarray(ids) >= ord('a')] = 0.5
    out[0] = np.nan
    return out

  spans = longppl.evaluator_spans(text, tokenize, nll_fn, trunc_len=16, stride=4)
  assert [text[s:e] for s, e in spans] == ['7', '8']
  result = longppl.evaluate_documents([text], [spans], tokenize, nll_fn)
  assert result['key_tokens'] == 2 and result['longppl'] == pytest.approx(math.exp(0.1))
  with pytest.raises(ValueError, match='beyond the text'):
    longppl.evaluate_documents(['short'], [spans], tokenize, nll_fn)
