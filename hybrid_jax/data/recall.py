"""A synthetic long-range recall task as a document source (`data.source='recall'`, fields `data.recall.*`).

Why: on ordinary text a tiny model at a short context has almost nothing to retrieve from far back, so the study's
question (where does long-range retrieval live in a hybrid?) cannot be asked. Here it must retrieve, from a
controlled distance.

A recall document is multi-query associative recall written as text, exactly `data.seq_len` ASCII characters:
`pairs` records `VALUEKEY` (keys of `key_length` upper-case letters from the first `key_chars` letters, unique in
the document; values of `value_length` digits from the first `value_chars` digits) sit in `filler` (repeated from
a random offset; no upper-case letters or digits, so keys occur nowhere else), and each key comes back once later
as the query `KEYVALUE`, whose value the model can only copy from the pair (one pair per document is a
needle-in-a-haystack document). The value comes before the key in the pair so that retrieval is one content match:
the query's key attends to the pair's key, where an earlier layer has gathered the value from the positions just
before it (the key-then-value order of the query would need an induction circuit, which tiny models on a few
hundred steps did not form; docs/notebook/mini_study.md, "First run: 800 steps").

The distance of a query, in tokens (= characters: byte tokenizer, ASCII), is from the pair's last key character to
the query's last key character, counting both: the smallest window (the query itself included) through which the
query's key sees the pair's key, so a window w sees it iff distance <= w. It is drawn per pair: a range of
`distance_ranges` with probability proportional to `distance_weights`, then uniform inside it.

A fraction `text_fraction` of the documents are ordinary text instead: seq_len characters of the built-in corpus
(same train/eval split), non-ASCII characters folded to '?'. Every document then tokenizes to seq_len + 1 tokens
with EOS, one packed training row, so a row never cuts a pair from its query.

Options that make the task harder for a recurrent state (each off by default, which leaves every document as it
was):
- `pairs_min`: each training document draws its number of pairs uniformly from pairs_min..pairs (0: always
  `pairs`), so one run sees documents of every load (hybrid_jax.study.load: records per recurrent key dimension).
  Held-out (eval split) documents never mix: each holds `eval_pairs` pairs (0: `pairs`), so every held-out document
  asks the same number of queries, which the scorers need (hybrid_jax.eval.recall).
- `record_gap`: that many haystack characters between a record's value and its key (`VALUE...KEY`; the query stays
  `KEYVALUE`). A short causal convolution (width 4 in GDN and Mamba-2) sees the value from the key's position when
  they are adjacent, so it binds them in one token; a gap of at least the convolution's width leaves that binding
  to a layer that mixes across positions. The record's span (`Settings.record`, where the scorers read attention
  mass on the needle) then includes the gap.
- `haystack='text'`: the characters around the records come from the built-in corpus (the same split's files, from
  a random file and offset) instead of `filler`: lower-cased, digits removed, non-ASCII folded to '?', so the only
  upper-case letters and digits of a document are still its keys and values.

Document i of a split is a pure function of (data.recall.seed, split, i): the source is random-access, its repr is
stable, and grain's shuffle and checkpointed iterator state work on it unchanged. `document(i)` gives the text with
its queries (positions, distances, answers) for scoring (hybrid_jax.eval.recall).
"""

import concurrent.futures
import dataclasses
import functools
import math
import multiprocessing
import os
import pathlib
import string
import uuid

import numpy as np

from hybrid_jax.errors import ConfigError
from hybrid_jax.data import recall_store

_SPLITS = {'train': 0, 'eval': 1}
_ATTEMPTS = 100  # Layouts tried per document before the settings are called impossible.


@dataclasses.dataclass(frozen=True)
class Query:
  """One key-value pair and its query; positions are character (= token) offsets in the document."""
  key: str
  value: str
  pair: int  # Start of the pair VALUEKEY.
  query: int  # Start of the query KEYVALUE.
  gap: int = 0  # Haystack characters between the pair's value and its key (data.recall.record_gap).

  @property
  def distance(self) -> int:
    return self.query - self.pair - len(self.value) - self.gap + 1

  def answer_positions(self) -> np.ndarray:
    """Input positions whose next-token prediction is answer byte m (teacher forcing)."""
    return self.query + len(self.key) - 1 + np.arange(len(self.value))

  def source_positions(self) -> np.ndarray:
    """Positions of the value in the first record: the only place the answer can be read from."""
    return self.pair + np.arange(len(self.value))


@dataclasses.dataclass(frozen=True)
class RecallDocument:
  text: str
  kind: str  # 'recall' | 'text'
  queries: tuple[Query, ...] = ()


# Fields added after recall stores were written, with the defaults that leave documents as they were: the repr (a
# store's key, hybrid_jax.data.recall_store) shows them only when set otherwise, so existing stores stay valid.
_ADDED_DEFAULTS = {'pairs_min': 0, 'eval_pairs': 0, 'record_gap': 0, 'haystack': 'filler'}
HAYSTACKS = ('filler', 'text')


@dataclasses.dataclass(frozen=True, repr=False)
class Settings:
  """The validated `data.recall` fields plus the document length and text split they apply to."""
  length: int
  pairs: int
  key_length: int
  key_chars: int
  value_length: int
  value_chars: int
  distance_ranges: tuple
  distance_weights: tuple
  text_fraction: float
  documents: int
  seed: int
  filler: str
  filler_random: str
  distractors: int
  pairs_min: int = 0
  eval_pairs: int = 0
  record_gap: int = 0
  haystack: str = 'filler'

  def __repr__(self):
    shown = [f.name for f in dataclasses.fields(self)
             if f.name not in _ADDED_DEFAULTS or getattr(self, f.name) != _ADDED_DEFAULTS[f.name]]
    return f"Settings({', '.join(f'{name}={getattr(self, name)!r}' for name in shown)})"

  @property
  def record(self) -> int:
    """Characters of a stored record VALUE, gap, KEY."""
    return self.key_length + self.record_gap + self.value_length

  @property
  def query_length(self) -> int:
    """Characters of a query KEYVALUE."""
    return self.key_length + self.value_length

  @property
  def fewest_pairs(self) -> int:
    """The fewest pairs a training document draws (`pairs` when they do not mix)."""
    return self.pairs_min or self.pairs

  def pairs_of(self, split: str) -> tuple[int, int]:
    """(fewest, most) pairs of a document of `split`: held-out documents hold eval_pairs (0: pairs) each."""
    if split == 'eval':
      return (self.eval_pairs or self.pairs,) * 2
    return self.fewest_pairs, self.pairs

  @functools.cached_property
  def probabilities(self) -> np.ndarray:
    w = np.asarray(self.distance_weights, np.float64)
    return w / w.sum()


def _fail(key, value, allowed):
  raise ConfigError(f'config.data.recall.{key}={value!r} is invalid: {allowed}')


def _int(r, key, low):
  value = r[key]
  if isinstance(value, bool) or not isinstance(value, int) or value < low:
    _fail(key, value, f'must be an integer >= {low}')
  return value


def check_fields(r, length: int | None = None) -> tuple:
  """The recall fields `r` (config.data.recall) checked on their own, whatever the data source (a bad value there is
  a typo waiting for the next `data.source=recall`), and against the document `length` when given. Returns them as
  Settings' fields after the length."""
  pairs, klen, vlen = _int(r, 'pairs', 1), _int(r, 'key_length', 1), _int(r, 'value_length', 1)
  distractors = _int(r, 'distractors', 0)
  # Keys added later: a run's saved config may lack them (train/runs.py fills them in; a bare ConfigDict may not).
  optional = lambda key: r.get(key, _ADDED_DEFAULTS[key])
  pairs_min = _int({'pairs_min': optional('pairs_min')}, 'pairs_min', 0)
  if pairs_min > pairs:
    _fail('pairs_min', pairs_min, f'must be 0 (every document holds data.recall.pairs) or 1 to data.recall.pairs='
          f'{pairs} (the fewest pairs a document draws; pairs is the most)')
  eval_pairs = _int({'eval_pairs': optional('eval_pairs')}, 'eval_pairs', 0)
  if eval_pairs > pairs:
    _fail('eval_pairs', eval_pairs, f'must be 0 (= data.recall.pairs) or 1 to data.recall.pairs={pairs}')
  gap = _int({'record_gap': optional('record_gap')}, 'record_gap', 0)
  haystack = optional('haystack')
  if haystack not in HAYSTACKS:
    _fail('haystack', haystack, f"must be one of {', '.join(map(repr, HAYSTACKS))}")
  kchars, vchars = _int(r, 'key_chars', 1), _int(r, 'value_chars', 2)
  if kchars > 26:
    _fail('key_chars', kchars, 'must be <= 26 (upper-case letters)')
  if vchars > 10:
    _fail('value_chars', vchars, 'must be <= 10 (digits)')
  if kchars ** klen < pairs + distractors:
    _fail('pairs', pairs, f'plus distractors ({distractors}) must be <= key_chars ** key_length = {kchars ** klen} '
          '(keys are unique in a document)')
  ranges = tuple(tuple(x) for x in r.distance_ranges) if all(
      isinstance(x, (tuple, list)) for x in r.distance_ranges) else None
  if not ranges or any(len(x) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in x)
                       for x in ranges):
    _fail('distance_ranges', r.distance_ranges, 'must be a non-empty tuple of (low, high) integer pairs')
  record = klen + gap + vlen
  if length is not None and 2 * (record + 1) > length // 2:
    _fail('record_gap', gap, f'leaves no room: a record of value + gap + key = {record} characters and its query '
          f'need 2 * (record + 1) <= data.seq_len / 2 = {length // 2}')
  if length is not None:
    # Records apart by a filler character; both inside the document.
    low, high = klen + 2, length - klen - 2 * vlen - gap + 1
    for lo, hi in ranges:
      if not low <= lo <= hi <= high:
        _fail('distance_ranges', r.distance_ranges, f'each range must satisfy {low} <= low <= high <= {high} '
              f'(records of {record} characters apart by a gap inside data.seq_len={length})')
  weights = tuple(r.distance_weights)
  if len(weights) != len(ranges) or any(isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0
                                        for w in weights) or not sum(weights) > 0:
    _fail('distance_weights', r.distance_weights, f'must be {len(ranges)} numbers >= 0 (one per distance range), '
          'not all 0')
  cells = (2 * pairs + distractors) * (record + 1)
  if length is not None and cells > length // 2:
    _fail('pairs', pairs, f'(2 * pairs + distractors) * (record + 1) = {cells} must be <= data.seq_len / 2 = '
          f'{length // 2}, so that the records (of {record} characters) leave room to place them at the drawn '
          'distances; pairs is the most a document holds')
  fraction = r.text_fraction
  if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
    _fail('text_fraction', fraction, 'must be in [0, 1)')
  filler = r.filler
  if not isinstance(filler, str) or not filler or not filler.isascii() or any(
      c.isupper() or c.isdigit() for c in filler):
    _fail('filler', filler, 'must be non-empty ASCII text without upper-case letters or digits (those are keys and '
          'values)')
  filler_random = r.filler_random
  if not isinstance(filler_random, str) or not filler_random.isascii() or any(c.isupper() for c in filler_random):
    _fail('filler_random', filler_random, "must be '' or ASCII characters without upper-case letters (those are keys)")
  if haystack == 'text' and filler_random:
    _fail('haystack', haystack, "draws the characters around the records from the built-in corpus: leave "
          "data.recall.filler_random at '' with it")
  return (pairs, klen, kchars, vlen, vchars, ranges, weights, float(fraction), _int(r, 'documents', 1),
          _int(r, 'seed', 0), filler, filler_random, distractors, pairs_min, eval_pairs, gap, haystack)


def settings(data_cfg) -> Settings:
  """The recall fields of `data_cfg`, checked alone and against the tokenizer and seq_len; ConfigError naming the
  field otherwise."""
  if data_cfg.tokenizer != 'byte':
    raise ConfigError(f"config.data.tokenizer={data_cfg.tokenizer!r} is invalid with data.source='recall': use "
                      "'byte' (distances and one document per row are counted in bytes)")
  length = int(data_cfg.seq_len)
  return Settings(length, *check_fields(data_cfg.recall, length))


def ascii_fold(text: str) -> str:
  """Non-ASCII characters become '?', so characters, bytes and byte tokens coincide."""
  return text.encode('ascii', errors='replace').decode('ascii')


_NOT_IN_HAYSTACK = str.maketrans('', '', string.digits)


def haystack_text(text: str) -> str:
  """Corpus text as a haystack: ASCII-folded, lower-cased and without digits, so it holds nothing that reads as a
  key (upper-case letters) or a value (digits)."""
  return ascii_fold(text).lower().translate(_NOT_IN_HAYSTACK)


def _key(index: int, s: Settings) -> str:
  letters = string.ascii_uppercase[:s.key_chars]
  return ''.join(letters[(index // s.key_chars ** j) % s.key_chars] for j in range(s.key_length))


def _room(taken: bytearray, start: int, size: int) -> bool:
  """Whether `size` cells from `start` are apart by >= 1 character from every taken cell (a bytearray, not a
  numpy array: these slices are a few cells long, where numpy's per-call cost is most of a document's)."""
  return not any(taken[max(start - 1, 0):start + size + 1])


def _take(taken: bytearray, start: int, size: int) -> None:
  taken[start:start + size] = b'\x01' * size


def _layout(rng, s: Settings, pairs: int) -> list[tuple[int, int]] | None:
  """(pair start, query start) per pair at freshly drawn distances, records apart by >= 1 character; None if the
  random placement failed (the caller draws again)."""
  buckets = rng.choice(len(s.distance_ranges), size=pairs, p=s.probabilities)
  distances = [int(rng.integers(s.distance_ranges[b][0], s.distance_ranges[b][1] + 1)) for b in buckets]
  taken = bytearray(s.length + 1)  # One guard cell so a record may end at the last character.
  placed = [None] * pairs
  for j in sorted(range(pairs), key=lambda j: -distances[j]):  # The longest are the hardest to place.
    d = distances[j] + s.value_length + s.record_gap - 1  # Query start - pair start.
    for _ in range(64):
      p = int(rng.integers(0, s.length - d - s.query_length + 1))
      q = p + d
      if _room(taken, p, s.record) and _room(taken, q, s.query_length):
        _take(taken, p, s.record)
        _take(taken, q, s.query_length)
        placed[j] = (p, q)
        break
    else:
      return None
  return placed


def _distractors(rng, s: Settings, placed, used_keys) -> list[tuple[int, str, str]] | None:
  """(start, value, key) of each distractor record: a record whose key is never asked, at a free place apart
  from every other record by >= 1 character. Why: with every record asked once, "the nearest record not asked yet"
  names the right one for most queries, a rule a full-attention layer can follow without matching the key (the Full
  arch learned it: docs/notebook/mini_study.md, "Why the hybrids now learn"); records nobody asks for break that
  rule."""
  taken = bytearray(s.length + 1)
  for p, q in placed:
    _take(taken, p, s.record)
    _take(taken, q, s.query_length)
  used = {int(k) for k in used_keys}
  free_keys = [k for k in range(s.key_chars ** s.key_length) if k not in used]
  keys = rng.choice(free_keys, size=s.distractors, replace=False)
  out = []
  for k in keys:
    for _ in range(64):
      p = int(rng.integers(0, s.length - s.record + 1))
      if _room(taken, p, s.record):
        _take(taken, p, s.record)
        value = ''.join(string.digits[x] for x in rng.integers(0, s.value_chars, size=s.value_length))
        out.append((p, value, _key(int(k), s)))
        break
    else:
      return None
  return out


class RecallSource:
  """Recall documents mixed with built-in text; `len`, `[i] -> str` and `document(i)` (see the module doc)."""

  def __init__(self, data_cfg, split: str, use_store: bool = True):
    if split not in _SPLITS:
      raise ValueError(f"split={split!r} is invalid: use 'train' or 'eval'")
    self.settings = settings(data_cfg)
    self.split, self.eval_fraction = split, float(data_cfg.eval_fraction)
    n = self.settings.documents
    self._len = n if split == 'train' else max(1, math.ceil(n * self.eval_fraction))
    self._text = None  # The built-in corpus, opened on first use (not at all without text documents or haystack).
    # Documents generated ahead (hybrid_jax.data.recall_store), looked up on first use; False: none.
    self._store = None if use_store else False

  def __len__(self):
    return self._len

  def _rng(self, index: int):
    if not 0 <= index < self._len:
      raise IndexError(f'document {index} is out of range for {self!r}')
    return np.random.default_rng([self.settings.seed, _SPLITS[self.split], int(index)])

  def document(self, index: int) -> RecallDocument:
    """Document `index` with its queries (none for a text document)."""
    s, rng = self.settings, self._rng(index)
    if rng.random() < s.text_fraction:
      return RecallDocument(self._text_document(rng), 'text')
    fewest, most = s.pairs_of(self.split)
    pairs = most if fewest == most else int(rng.integers(fewest, most + 1))  # No draw unless they mix.
    for _ in range(_ATTEMPTS):
      placed = _layout(rng, s, pairs)
      if placed is not None:
        break
    else:
      raise ConfigError(f'config.data.recall: {pairs} pairs at distances {s.distance_ranges} could not be placed '
                        f'in {s.length} characters in {_ATTEMPTS} attempts; use fewer pairs or shorter distances')
    keys = rng.choice(s.key_chars ** s.key_length, size=pairs, replace=False)
    values = rng.integers(0, s.value_chars, size=(pairs, s.value_length))
    if s.haystack == 'text':
      chars = list(self._haystack(rng))
    elif s.filler_random:
      chars = [s.filler_random[i] for i in rng.integers(len(s.filler_random), size=s.length)]
    else:
      offset = int(rng.integers(len(s.filler)))
      chars = [s.filler[(offset + i) % len(s.filler)] for i in range(s.length)]
    queries = []
    for (p, q), k, v in zip(placed, keys, values):
      query = Query(_key(int(k), s), ''.join(string.digits[x] for x in v), p, q, s.record_gap)
      chars[p:p + s.value_length] = query.value
      chars[p + s.record - s.key_length:p + s.record] = query.key
      chars[q:q + s.query_length] = query.key + query.value
      queries.append(query)
    queries.sort(key=lambda x: x.query)
    if s.distractors:
      placed_distractors = _distractors(rng, s, placed, keys)
      if placed_distractors is None:
        raise ConfigError(f'config.data.recall: {s.distractors} distractor records found no room beside {pairs} '
                          f'pairs in {s.length} characters; use fewer distractors or pairs')
      for start, value, key in placed_distractors:
        chars[start:start + s.value_length] = value
        chars[start + s.record - s.key_length:start + s.record] = key
    return RecallDocument(''.join(chars), 'recall', tuple(queries))

  def _corpus(self):
    from hybrid_jax.data import sources  # pylint: disable=g-import-not-at-top  (sources imports this module)
    if self._text is None:
      self._text = sources.BuiltinSource(self.split, self.eval_fraction)
    return self._text

  def _haystack(self, rng) -> str:
    """data.seq_len characters of haystack_text from the corpus of this split: a random file from a random offset,
    continued by the next files (one pass at most), repeated if the whole pass is shorter."""
    corpus, length = self._corpus(), self.settings.length
    n = len(corpus)
    i = int(rng.integers(n))
    first = haystack_text(corpus[i])
    parts = [first[int(rng.integers(max(1, len(first) - length + 1))):]]
    for j in range(1, n):
      if sum(map(len, parts)) >= length:
        break
      parts.append(haystack_text(corpus[(i + j) % n]))
    text = ''.join(parts)
    if not text:
      raise ConfigError(f"config.data.recall.haystack='text' is invalid here: the built-in corpus's {self.split} "
                        'split holds no characters once digits and upper-case letters are removed; use '
                        "haystack='filler'")
    return (text * -(-length // len(text)))[:length]

  def _text_document(self, rng) -> str:
    self._corpus()
    n = len(self._text)
    i = int(rng.integers(n))
    first = ascii_fold(self._text[i])
    parts = [first[int(rng.integers(max(1, len(first) - self.settings.length + 1))):]]
    while sum(map(len, parts)) < self.settings.length:  # A short file continues with the next ones.
      i = (i + 1) % n
      parts.append('\n' + ascii_fold(self._text[i]))
    return ''.join(parts)[:self.settings.length]

  def __getitem__(self, index: int) -> str:
    index = int(index)
    if self._store is None:
      directory = os.environ.get(recall_store.ENV)
      self._store = (directory and recall_store.load(directory, self.settings, self.split)) or False
    text = self._store.get(index) if self._store else None
    return self.document(index).text if text is None else text

  def __getstate__(self):
    state = dict(self.__dict__)
    state['_text'] = None
    if state['_store'] is not False:
      state['_store'] = None  # Looked up again where the copy is used.
    return state

  def __repr__(self):
    return f'RecallSource(split={self.split!r}, documents={self._len}, settings={self.settings!r})'


# ------------------------------------------------------------------------------------ the store, built ahead
def _store_texts(data_cfg, split: str, indices: np.ndarray) -> np.ndarray:
  """uint8 [len(indices), length]: the documents' text."""
  source = RecallSource(data_cfg, split, use_store=False)
  length = source.settings.length
  out = np.empty((len(indices), length), np.uint8)
  for row, index in enumerate(indices):
    text = source[int(index)].encode('ascii')
    if len(text) != length:
      raise AssertionError(f'recall document {index} has {len(text)} characters, not {length}')
    out[row] = np.frombuffer(text, np.uint8)
  return out


def build_store(data_cfg, split: str, indices, directory, workers: int = 1) -> pathlib.Path:
  """Generates documents `indices` of `split` (a data config with source 'recall') into the store of its settings
  in `directory`, in `workers` processes, and returns the store's path. Documents an existing store already holds
  are kept, not generated again."""
  settings_ = settings(data_cfg)
  path = recall_store.path_for(directory, settings_, split)
  present = recall_store.load(directory, settings_, split) or recall_store.Store(np.zeros(0, np.int64), np.zeros((0, settings_.length), np.uint8))
  missing = np.setdiff1d(np.asarray(indices, np.int64), present.indices)
  if not len(missing):
    return path
  workers = min(workers, max(1, len(missing) // recall_store.PER_WORKER))
  if workers > 1:
    parts = np.array_split(missing, workers)
    context = multiprocessing.get_context('spawn')  # No fork of a process whose JAX runtime holds threads.
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
      new = np.concatenate(list(pool.map(_store_texts, [data_cfg] * workers, [split] * workers, parts)))
  else:
    new = _store_texts(data_cfg, split, missing)
  indices = np.concatenate([present.indices, missing])
  order = np.argsort(indices)
  indices, texts = indices[order], np.concatenate([present.texts, new])[order]
  path.parent.mkdir(parents=True, exist_ok=True)
  partial = path.with_name(f'.{path.stem}-{uuid.uuid4().hex}.npz')  # Readers never see half a file.
  np.savez(partial, key=np.asarray(recall_store.key_of(settings_, split)), indices=indices, texts=texts)
  os.replace(partial, path)
  return path
