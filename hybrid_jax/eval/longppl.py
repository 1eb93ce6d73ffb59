"""LongPPL: perplexity over the key tokens that need long context, with key tokens stored as character spans.

Key tokens are chosen once by an evaluator model: token i is key if NLL_short[i] - NLL_full[i] > alpha (a
truncated context hurts it) and log p_full[i] > beta (the full context predicts it well). Storing them as character
spans `[start, end)` into the document text lets any model, with any tokenizer, be scored on the same text.

Arrays here are per token of one tokenisation: `nll[i]` = -log p(token i | tokens before it), NaN where there is
none (the first token, or positions a caller did not compute). `offsets[i] = (start, end)` are the token's character
offsets in the text (e.g. a HF fast tokenizer's offset mapping); zero-width tokens (BOS, special tokens) never match.

Mapping rule: a token is inside the key spans if its character range overlaps one by at least one character.
The spans come from another tokenizer, so token boundaries rarely line up; 'overlap' keeps every token that carries
key text (a leading-space token such as ' Smith' still counts for the span 'Smith'), whereas 'inside' (the token's
range lies within one span) drops tokens that straddle a boundary and can lose key tokens entirely.
"""

import math
import os
import re
from typing import Callable, Sequence

import numpy as np

from hybrid_jax import readers
from hybrid_jax.errors import DataError

_SPAN = re.compile(r'\[\s*(\d+)\s*,\s*(\d+)\s*\]')


# ------------------------------------------------------------------------------------------------ span files


def parse_spans(text: str) -> list[tuple[int, int]]:
  """Spans from the `[start, end];[start, end]...` format (an empty string means no key tokens)."""
  text = text.strip()
  if not text:
    return []
  spans = []
  for piece in text.split(';'):
    match = _SPAN.fullmatch(piece.strip())
    if not match:
      raise ValueError(f'bad key-span entry {piece!r}: expected "[start, end]"')
    start, end = int(match.group(1)), int(match.group(2))
    if end <= start:
      raise ValueError(f'bad key span [{start}, {end}]: end must be greater than start')
    spans.append((start, end))
  return merge_spans(spans)


def format_spans(spans: Sequence[tuple[int, int]]) -> str:
  return ';'.join(f'[{s}, {e}]' for s, e in merge_spans(spans))


def read_spans(path: str) -> list[tuple[int, int]]:
  if not os.path.isfile(path):
    raise FileNotFoundError(f'key-span file {path!r} does not exist')
  try:
    return parse_spans(readers.read_text(path, 'key-span file'))
  except DataError:
    raise
  except ValueError as e:
    raise DataError(f'key-span file {path}: {e}') from None


def write_spans(path: str, spans: Sequence[tuple[int, int]]) -> None:
  with open(path, 'w', encoding='utf-8') as f:
    f.write(format_spans(spans))


def read_span_dir(directory: str) -> dict[int, list[tuple[int, int]]]:
  """{i: spans} from a folder of `slice_<i>.txt` files (the LongPPL repository's key_text layout)."""
  if not os.path.isdir(directory):
    raise FileNotFoundError(f'key-span folder {directory!r} does not exist')
  out = {}
  for name in os.listdir(directory):
    match = re.fullmatch(r'slice_(\d+)\.txt', name)
    if match:
      out[int(match.group(1))] = read_spans(os.path.join(directory, name))
  if not out:
    raise FileNotFoundError(f'key-span folder {directory!r} holds no slice_<i>.txt file')
  return dict(sorted(out.items()))


def merge_spans(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
  """Sorted spans with overlapping or touching ones merged (the file format's invariant)."""
  merged = []
  for start, end in sorted((int(s), int(e)) for s, e in spans if e > s):
    if merged and start <= merged[-1][1]:
      merged[-1] = (merged[-1][0], max(merged[-1][1], end))
    else:
      merged.append((start, end))
  return merged


def check_spans(spans: Sequence[tuple[int, int]], text: str) -> None:
  """Raises if a span falls outside `text`: the offsets only make sense against the exact text they index."""
  if spans and spans[-1][1] > len(text):
    raise ValueError(f'key span ending at {spans[-1][1]} lies beyond the text ({len(text)} characters): this is '
                     'not the text the spans were made for')


# ------------------------------------------------------------------------------------------------ tokens <-> spans


def key_token_mask(offsets, spans: Sequence[tuple[int, int]], rule: str = 'overlap') -> np.ndarray:
  """Boolean mask of the tokens (character `offsets` [n, 2]) inside `spans` under `rule` ('overlap' or 'inside')."""
  offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
  spans = merge_spans(spans)
  mask = np.zeros(len(offsets), dtype=bool)
  if not spans or not len(offsets):
    return mask
  starts = np.array([s for s, _ in spans], dtype=np.int64)
  ends = np.array([e for _, e in spans], dtype=np.int64)
  t_start, t_end = offsets[:, 0], offsets[:, 1]
  nonempty = t_end > t_start
  if rule == 'overlap':
    k = np.searchsorted(ends, t_start, side='right')  # First span ending after the token starts.
    k_ok = k < len(spans)
    mask[k_ok] = starts[k[k_ok]] < t_end[k_ok]
  elif rule == 'inside':
    k = np.searchsorted(starts, t_start, side='right') - 1  # Last span starting at or before the token.
    k_ok = k >= 0
    mask[k_ok] = ends[k[k_ok]] >= t_end[k_ok]
  else:
    raise ValueError(f"rule={rule!r} is invalid: use 'overlap' or 'inside'")
  return mask & nonempty


def select_key_tokens(nll_full, nll_short, alpha: float = 2.0, beta: float = -2.0) -> np.ndarray:
  """Mask of key tokens: NLL_short - NLL_full > alpha and log p_full (= -NLL_full) > beta; NaN never qualifies."""
  nll_full, nll_short = np.asarray(nll_full, np.float64), np.asarray(nll_short, np.float64)
  if nll_full.shape != nll_short.shape:
    raise ValueError(f'nll_full {nll_full.shape} and nll_short {nll_short.shape} must have the same shape')
  with np.errstate(invalid='ignore'):
    return ((nll_short - nll_full) > alpha) & (-nll_full > beta)


def tokens_to_spans(offsets, mask) -> list[tuple[int, int]]:
  """Character spans of the masked tokens, merged where they overlap or touch."""
  offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
  return merge_spans([(int(s), int(e)) for (s, e), m in zip(offsets, np.asarray(mask, bool)) if m and e > s])


def key_spans(offsets, nll_full, nll_short, alpha: float = 2.0, beta: float = -2.0) -> list[tuple[int, int]]:
  """An evaluator's key-token selection, as character spans ready for `write_spans`."""
  return tokens_to_spans(offsets, select_key_tokens(nll_full, nll_short, alpha, beta))


# ------------------------------------------------------------------------------------------------ NLL helpers


def truncated_nll(token_ids, nll_fn: Callable[[np.ndarray], np.ndarray], trunc_len: int = 4096,
                  stride: int = 1024) -> np.ndarray:
  """Per-token NLL with the context cut to the last trunc_len - stride .. trunc_len - 1 tokens.

  `nll_fn(ids)` returns one NLL per id (entry 0 unused). Windows of `trunc_len` tokens end at every multiple of
  `stride` past `trunc_len`; each window contributes its last `stride` tokens. The first `trunc_len` positions
  see the same context as the full pass and are NaN (they can never be key tokens).
  """
  if not 0 < stride < trunc_len:
    raise ValueError(f'need 0 < stride < trunc_len, got stride={stride}, trunc_len={trunc_len}')
  ids = np.asarray(token_ids)
  out = np.full(len(ids), np.nan)
  for start in range(trunc_len, len(ids), stride):
    end = min(start + stride, len(ids))
    window = ids[end - trunc_len:end]
    nll = np.asarray(nll_fn(window), np.float64)
    if nll.shape != (len(window),):
      raise ValueError(f'nll_fn returned shape {nll.shape} for {len(window)} tokens')
    out[start:end] = nll[len(window) - (end - start):]
  return out


def longppl(nll, offsets, spans: Sequence[tuple[int, int]], rule: str = 'overlap') -> dict:
  """{'longppl', 'ppl', 'key_tokens', 'tokens', 'key_nll_sum', 'nll_sum'} of one document for the evaluated model.

  LongPPL = exp(mean NLL over its tokens inside the key spans); NaN when no token is (leave the document out).
  """
  nll = np.asarray(nll, np.float64)
  mask = key_token_mask(offsets, spans, rule)
  if mask.shape != nll.shape:
    raise ValueError(f'{len(nll)} NLLs for {len(mask)} token offsets')
  valid = np.isfinite(nll)
  key = mask & valid
  key_sum, all_sum = float(nll[key].sum()), float(nll[valid].sum())
  n_key, n_all = int(key.sum()), int(valid.sum())
  return {'longppl': math.exp(key_sum / n_key) if n_key else math.nan,
          'ppl': math.exp(all_sum / n_all) if n_all else math.nan,
          'key_tokens': n_key, 'tokens': n_all, 'key_nll_sum': key_sum, 'nll_sum': all_sum}


def aggregate(results: Sequence[dict]) -> dict:
  """Over documents: token-pooled 'longppl' / 'ppl' (exp of total NLL / total tokens) and per-document means.

  Documents without key tokens are left out of the LongPPL figures.
  """
  with_keys = [r for r in results if r['key_tokens']]
  key_tokens = sum(r['key_tokens'] for r in with_keys)
  tokens = sum(r['tokens'] for r in results)
  return {
      'longppl': math.exp(sum(r['key_nll_sum'] for r in with_keys) / key_tokens) if key_tokens else math.nan,
      'ppl': math.exp(sum(r['nll_sum'] for r in results) / tokens) if tokens else math.nan,
      'longppl_doc_mean': float(np.mean([r['longppl'] for r in with_keys])) if with_keys else math.nan,
      'ppl_doc_mean': float(np.mean([r['ppl'] for r in results])) if results else math.nan,
      'documents': len(results), 'documents_with_key_tokens': len(with_keys), 'key_tokens': key_tokens,
      'tokens': tokens,
  }


# ------------------------------------------------------------------------------------------------ end to end

Tokenize = Callable[[str], tuple[Sequence[int], Sequence[tuple[int, int]]]]


def evaluator_spans(text: str, tokenize: Tokenize, nll_fn: Callable[[np.ndarray], np.ndarray], *,
                    trunc_len: int = 4096, stride: int = 1024, alpha: float = 2.0,
                    beta: float = -2.0) -> list[tuple[int, int]]:
  """Key spans of `text` chosen by an evaluator model: `tokenize(text) -> (ids, offsets)`, `nll_fn(ids) -> NLLs`."""
  ids, offsets = tokenize(text)
  ids = np.asarray(ids)
  full = np.asarray(nll_fn(ids), np.float64)
  short = truncated_nll(ids, nll_fn, trunc_len, stride)
  return key_spans(offsets, full, short, alpha, beta)


def evaluate_documents(texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]], tokenize: Tokenize,
                       nll_fn: Callable[[np.ndarray], np.ndarray], rule: str = 'overlap') -> dict:
  """LongPPL and PPL of one model over documents with their key spans: {'documents': [...], **aggregate}."""
  if len(texts) != len(spans):
    raise ValueError(f'{len(texts)} texts for {len(spans)} span lists')
  results = []
  for text, doc_spans in zip(texts, spans):
    check_spans(merge_spans(doc_spans), text)
    ids, offsets = tokenize(text)
    results.append(longppl(nll_fn(np.asarray(ids)), offsets, doc_spans, rule))
  return {'documents': results, **aggregate(results)}
