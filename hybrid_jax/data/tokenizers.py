"""Tokenizers: a dependency-free byte tokenizer (the default), SentencePiece models and Hugging Face `tokenizer.json`.

All return int32 numpy arrays without special tokens; the pipeline appends `eos_id` to each document itself, so
every tokenizer separates packed documents the same way.
"""

import hashlib
import os
from typing import Protocol, Sequence

import numpy as np

from hybrid_jax import readers
from hybrid_jax.errors import ConfigError


class Tokenizer(Protocol):
  vocab_size: int
  eos_id: int
  bos_id: int | None  # None when the tokenizer has no BOS token.

  def encode(self, text: str) -> np.ndarray:
    ...

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    ...

  def encode_with_offsets(self, text: str) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Ids and each token's [start, end) character offsets in `text` (to map character spans onto tokens)."""
    ...


class ByteTokenizer:
  """UTF-8 bytes as ids 0..255 plus EOS = 256: no vocabulary file, no out-of-vocabulary text."""

  vocab_size = 257
  eos_id = 256
  bos_id = None

  def encode(self, text: str) -> np.ndarray:
    # `surrogatepass` keeps lone surrogates (possible in JSON input) encodable instead of raising.
    data = text.encode('utf-8', errors='surrogatepass')
    return np.frombuffer(data, dtype=np.uint8).astype(np.int32)

  def decode(self, ids) -> str:
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    return ids[(ids >= 0) & (ids < 256)].astype(np.uint8).tobytes().decode('utf-8', errors='replace')

  def encode_with_offsets(self, text: str) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Every byte of character i gets offsets (i, i + 1)."""
    ids = self.encode(text)
    offsets = [(i, i + 1) for i, ch in enumerate(text) for _ in range(len(ch.encode('utf-8', 'surrogatepass')))]
    return ids, offsets

  def __repr__(self):
    return 'ByteTokenizer()'


class SentencePieceTokenizer:
  """A SentencePiece `.model` file; pickles as its serialized proto so grain worker processes can rebuild it."""

  def __init__(self, path: str):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    if not os.path.isfile(path):
      raise ConfigError(f"config.data.tokenizer={path!r} is invalid: no such SentencePiece .model file (use 'byte' "
                        'or the path of a SentencePiece model)')
    self.path = path
    proto = readers.read_bytes(path, 'config.data.tokenizer')
    try:
      self._sp = spm.SentencePieceProcessor(model_proto=proto)
    except Exception as e:  # sentencepiece raises RuntimeError / OSError depending on the failure.
      raise ConfigError(f'config.data.tokenizer={path!r} is invalid: not a readable SentencePiece model ({e})') from e
    self._proto = proto
    self.vocab_size = int(self._sp.get_piece_size())
    self.eos_id = int(self._sp.eos_id())
    self.bos_id = int(self._sp.bos_id()) if self._sp.bos_id() >= 0 else None
    if self.eos_id < 0:
      raise ConfigError(f'config.data.tokenizer={path!r} is invalid: the SentencePiece model defines no EOS id '
                        '(train it with eos_id >= 0)')

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._sp.encode(text, out_type=int), dtype=np.int32)

  def decode(self, ids) -> str:
    ids = [int(i) for i in np.asarray(ids).reshape(-1) if 0 <= int(i) < self.vocab_size]
    return self._sp.decode(ids)

  def encode_with_offsets(self, text: str) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """SentencePiece's own character offset mapping (a space folded into '▁' belongs to the next token)."""
    result = self._sp.encode(text, return_type='offset_mapping')
    return np.asarray(result['ids'], np.int32), [(int(a), int(b)) for a, b in result['offsets']]

  def __getstate__(self):
    return {'path': self.path, 'proto': self._proto}

  def __setstate__(self, state):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    self.path, self._proto = state['path'], state['proto']
    self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
    self.vocab_size = int(self._sp.get_piece_size())
    self.eos_id = int(self._sp.eos_id())
    self.bos_id = int(self._sp.bos_id()) if self._sp.bos_id() >= 0 else None

  def __repr__(self):
    return f'SentencePieceTokenizer({self.path!r})'


# Special-token names tried, in order, when neither tokenizer_config.json nor the post-processor names EOS / BOS.
_EOS_NAMES = ('</s>', '<|endoftext|>', '<|end_of_text|>', '<eos>', '<|eos|>', '[EOS]')
_BOS_NAMES = ('<s>', '<|begin_of_text|>', '<bos>', '<|bos|>', '[BOS]')


def _token_content(value) -> str | None:
  """tokenizer_config.json writes a special token as a string or as {'content': ...}."""
  if isinstance(value, dict):
    value = value.get('content')
  return value if isinstance(value, str) and value else None


def _template_specials(processor) -> tuple[str | None, str | None]:
  """(BOS, EOS) of a TemplateProcessing post-processor: the special tokens before and after the sequence $A."""
  if not isinstance(processor, dict):
    return None, None
  if processor.get('type') == 'Sequence':
    found = [_template_specials(p) for p in processor.get('processors', [])]
    return (next((b for b, _ in found if b), None), next((e for _, e in found if e), None))
  if processor.get('type') != 'TemplateProcessing':
    return None, None
  items = processor.get('single', [])
  at = next((i for i, item in enumerate(items) if 'Sequence' in item), None)
  if at is None:
    return None, None
  before = [item['SpecialToken']['id'] for item in items[:at] if 'SpecialToken' in item]
  after = [item['SpecialToken']['id'] for item in items[at + 1:] if 'SpecialToken' in item]
  return (before[-1] if before else None), (after[0] if after else None)


class HFTokenizer:
  """A Hugging Face `tokenizer.json` (the `tokenizers` library); character offsets come from the library.

  EOS and BOS are read from the files: `tokenizer_config.json` beside it (eos_token / bos_token) when present, else
  the post-processor's template ('<s> $A </s>'), else a special token with a usual name ('</s>', '<|endoftext|>').
  """

  def __init__(self, path: str):
    if not os.path.isfile(path):
      raise ConfigError(f'config.data.tokenizer={path!r} is invalid: no such tokenizer.json file')
    self.path = path
    spec, self._tok = readers.read_tokenizer_json(path, 'config.data.tokenizer')
    vocab = self._tok.get_vocab(with_added_tokens=True)
    self.vocab_size = max(vocab.values()) + 1  # Ids need not be dense; every id must fit the embedding.
    bos, eos = self._special_names(spec)
    specials = sorted(t.content for t in self._tok.get_added_tokens_decoder().values() if t.special)
    if eos is None or self._tok.token_to_id(eos) is None:
      raise ConfigError(f'config.data.tokenizer={path!r} is invalid: no EOS token found (looked for eos_token in '
                        f'tokenizer_config.json, a post-processor template "$A <eos>", and the names '
                        f'{", ".join(_EOS_NAMES)}); its special tokens are {specials}')
    self.eos_id = int(self._tok.token_to_id(eos))
    self.bos_id = None if bos is None or self._tok.token_to_id(bos) is None else int(self._tok.token_to_id(bos))

  def _special_names(self, spec: dict) -> tuple[str | None, str | None]:
    sibling = os.path.join(os.path.dirname(self.path), 'tokenizer_config.json')
    if os.path.isfile(sibling):
      cfg = readers.read_json(sibling, 'tokenizer config')
      bos, eos = _token_content(cfg.get('bos_token')), _token_content(cfg.get('eos_token'))
      if eos:
        return bos, eos
    bos, eos = _template_specials(spec.get('post_processor'))
    names = {t.get('content') for t in spec.get('added_tokens', []) if t.get('special')}
    bos = bos or next((n for n in _BOS_NAMES if n in names), None)
    eos = eos or next((n for n in _EOS_NAMES if n in names), None)
    return bos, eos

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

  def decode(self, ids) -> str:
    ids = [int(i) for i in np.asarray(ids).reshape(-1) if 0 <= int(i) < self.vocab_size]
    return self._tok.decode(ids, skip_special_tokens=True)

  def id_to_token(self, token_id: int) -> str | None:
    """The vocabulary entry of an id (special tokens included), e.g. '</s>' for EOS."""
    return self._tok.id_to_token(int(token_id))

  def encode_with_offsets(self, text: str) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The library's offsets, in characters of `text` (byte-level pieces of one character share its offsets)."""
    encoding = self._tok.encode(text, add_special_tokens=False)
    return np.asarray(encoding.ids, np.int32), [(int(a), int(b)) for a, b in encoding.offsets]

  def __repr__(self):
    return f'HFTokenizer({self.path!r})'


def get_tokenizer(spec: str) -> Tokenizer:
  """'byte' -> ByteTokenizer; a path ending in '.json' -> HFTokenizer; else a SentencePiece `.model` file."""
  if not isinstance(spec, str) or not spec:
    raise ConfigError(f"config.data.tokenizer={spec!r} is invalid: use 'byte', a Hugging Face tokenizer.json path "
                      'or a SentencePiece .model path')
  if spec == 'byte':
    return ByteTokenizer()
  if spec.endswith('.json'):
    return HFTokenizer(spec)
  return SentencePieceTokenizer(spec)


def fingerprint(spec: str) -> str:
  """Identifies a tokenizer by content: 'byte', or 'blake2b:<hex>' of its file (the same file under any path)."""
  if spec == 'byte':
    return 'byte'
  get_tokenizer(spec)  # Refuses a missing or unreadable file with the usual message.
  with open(spec, 'rb') as f:
    return 'blake2b:' + hashlib.blake2b(f.read(), digest_size=16).hexdigest()
