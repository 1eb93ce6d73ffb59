"""Tokenizers: a dependency-free byte tokenizer (the default) and SentencePiece models for real runs.

Both return int32 numpy arrays without EOS; the pipeline appends `eos_id` to each document itself, so every
tokenizer separates packed documents the same way.
"""

import os
from typing import Protocol, Sequence

import numpy as np

from hybrid_jax.config import ConfigError


class Tokenizer(Protocol):
  vocab_size: int
  eos_id: int

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
    with open(path, 'rb') as f:
      proto = f.read()
    try:
      self._sp = spm.SentencePieceProcessor(model_proto=proto)
    except Exception as e:  # sentencepiece raises RuntimeError / OSError depending on the failure.
      raise ConfigError(f'config.data.tokenizer={path!r} is invalid: not a readable SentencePiece model ({e})') from e
    self._proto = proto
    self.vocab_size = int(self._sp.get_piece_size())
    self.eos_id = int(self._sp.eos_id())
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

  def __repr__(self):
    return f'SentencePieceTokenizer({self.path!r})'


def get_tokenizer(spec: str) -> Tokenizer:
  """'byte' -> ByteTokenizer; anything else is the path of a SentencePiece `.model` file."""
  if not isinstance(spec, str) or not spec:
    raise ConfigError(f"config.data.tokenizer={spec!r} is invalid: use 'byte' or a SentencePiece .model path")
  if spec == 'byte':
    return ByteTokenizer()
  return SentencePieceTokenizer(spec)
