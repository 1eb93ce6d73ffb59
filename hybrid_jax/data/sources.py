"""Random-access document sources (`len`, `[i] -> str`) for grain: built-in corpus, local files and TFDS.

`catalog.make_source` opens these and the other kinds: parquet shards (`parquet.py`), pre-tokenized directories
(`pretokenized.py`, whose documents are token arrays instead of text) and the synthetic recall task (`recall.py`).

Sources hold an index (paths, byte offsets), never the text, so they stay small when grain pickles them into worker
processes, and their `repr` is deterministic because grain records it next to iterator state. 'builtin' and 'files'
split train/eval by a stable hash of each document's identity (relative path, plus line number for JSONL), so the
split survives moving the corpus and never depends on Python's per-process `hash()`.
"""

import dataclasses
import difflib
import glob
import hashlib
import logging
import os
import re
import sysconfig
from typing import Iterator

import numpy as np

from hybrid_jax import readers
from hybrid_jax.errors import ConfigError, DataError  # DataError stays importable from here (sources.DataError).

TEXT_SUFFIXES = ('.txt', '.txt.gz')
JSONL_SUFFIXES = ('.jsonl', '.jsonl.gz')
_SKIPPED_DIRS = ('site-packages', 'dist-packages', '__pycache__')


def hash_fraction(identity: str) -> float:
  """Maps a document identity to [0, 1), identically on every machine and process."""
  digest = hashlib.blake2b(identity.encode('utf-8', errors='surrogatepass'), digest_size=8).digest()
  return int.from_bytes(digest, 'big') / 2.0**64


def split_by_hash(identities, eval_fraction: float, split: str) -> np.ndarray:
  """Indices of `identities` in `split`: eval = hash below `eval_fraction` (at least one document), train = rest."""
  if split not in ('train', 'eval'):
    raise ValueError(f"split={split!r} is invalid: use 'train' or 'eval'")
  fractions = np.array([hash_fraction(i) for i in identities], dtype=np.float64)
  is_eval = fractions < eval_fraction
  if not is_eval.any() and len(fractions):
    is_eval[int(np.argmin(fractions))] = True
  return np.flatnonzero(is_eval if split == 'eval' else ~is_eval)


def _decode(data: bytes) -> str:
  """UTF-8 text; bytes that are not UTF-8 become U+FFFD (sources count and report them: UndecodableDocuments)."""
  return data.decode('utf-8', errors='replace')


def _is_utf8(data: bytes) -> bool:
  try:
    data.decode('utf-8')
  except UnicodeDecodeError:
    return False
  return True


class UndecodableDocuments:
  """The documents of one source that held bytes that are not UTF-8 (read as U+FFFD, so nothing is dropped):
  counted, and reported by one warning per source rather than per document or not at all."""

  def __init__(self, source: str):
    self.source = source
    self.identities: set[str] = set()

  @property
  def count(self) -> int:
    return len(self.identities)

  def note(self, identity: str, data: bytes) -> None:
    """Records `identity` when `data` is not UTF-8; the first such document of the source is warned about."""
    if identity in self.identities or _is_utf8(data):
      return
    self.identities.add(identity)
    if len(self.identities) == 1:
      logging.warning('%s: document %s holds bytes that are not UTF-8; they are read as U+FFFD. Said once for this '
                      'source: later ones are only counted (undecodable.count)', self.source, identity)

  def report_scan(self, total: int) -> None:
    """After a scan of the whole source: one warning with the count, instead of one per document."""
    if self.identities:
      first = min(self.identities)
      logging.warning('%s: %d of %d documents hold bytes that are not UTF-8 (e.g. %s); they are read as U+FFFD',
                      self.source, self.count, total, first)


# ------------------------------------------------------------------------------------------------ built-in corpus


def stdlib_files(root: str | None = None) -> list[str]:
  """Sorted '/'-separated paths of the standard library's .py files, relative to `root`, without site-packages."""
  root = root or sysconfig.get_paths()['stdlib']
  found = []
  for directory, subdirs, files in os.walk(root):
    subdirs[:] = [d for d in subdirs if d not in _SKIPPED_DIRS]
    for name in files:
      if name.endswith('.py'):
        found.append(os.path.relpath(os.path.join(directory, name), root).replace(os.sep, '/'))
  return sorted(found)


class BuiltinSource:
  """This interpreter's standard-library sources, one document per .py file: real code with docstrings, everywhere."""

  def __init__(self, split: str, eval_fraction: float, root: str | None = None):
    self.root = root or sysconfig.get_paths()['stdlib']
    self.split, self.eval_fraction = split, float(eval_fraction)
    paths = [p for p in stdlib_files(self.root) if not self._is_blank(p)]
    if not paths:
      raise DataError(f'the built-in corpus is empty: no .py files under {self.root!r}')
    self.paths = [paths[i] for i in split_by_hash(paths, self.eval_fraction, split)]
    self.undecodable = UndecodableDocuments(f'the built-in corpus ({split} split, {self.root})')

  def _is_blank(self, rel: str) -> bool:
    path = os.path.join(self.root, rel)
    size = os.path.getsize(path)
    if size > 256:  # Only tiny files (empty __init__.py) can be blank; skip reading the rest.
      return False
    with open(path, 'rb') as f:
      return not f.read().strip()

  def __len__(self):
    return len(self.paths)

  def __getitem__(self, index: int) -> str:
    with open(os.path.join(self.root, self.paths[index]), 'rb') as f:
      data = f.read()
    self.undecodable.note(self.paths[index], data)
    return _decode(data)

  def __repr__(self):
    return (f'BuiltinSource(root={self.root!r}, split={self.split!r}, eval_fraction={self.eval_fraction!r}, '
            f'documents={len(self.paths)})')


# ------------------------------------------------------------------------------------------------ local files


def _has_glob(spec: str) -> bool:
  return any(c in spec for c in '*?[')


def resolve_paths(paths: str, suffixes: tuple[str, ...] = TEXT_SUFFIXES + JSONL_SUFFIXES) -> list[tuple[str, str]]:
  """(absolute path, identity) of every file ending in one of `suffixes` named by comma-separated files, dirs or
  globs (default: the 'files' source's .txt/.jsonl(.gz)).

  The identity is the path relative to the named directory (or the file name for files and glob matches), so the
  train/eval split does not change when the corpus moves.
  """
  kinds = '/'.join(suffixes)
  specs = [s.strip() for s in str(paths).split(',') if s.strip()]
  if not specs:
    raise ConfigError(f'config.data.paths={paths!r} is invalid: names no file, directory or glob')
  found: dict[str, str] = {}
  for spec in specs:
    spec_path = os.path.expanduser(spec)
    if _has_glob(spec_path):
      matches = sorted(m for m in glob.glob(spec_path, recursive=True) if os.path.isfile(m) and m.endswith(suffixes))
      if not matches:
        raise ConfigError(f'config.data.paths: glob {spec!r} matches no {kinds} file')
      entries = [(m, os.path.basename(m)) for m in matches]
    elif os.path.isdir(spec_path):
      entries = []
      for directory, subdirs, files in os.walk(spec_path):
        subdirs.sort()
        for name in sorted(files):
          full = os.path.join(directory, name)
          if full.endswith(suffixes):
            entries.append((full, os.path.relpath(full, spec_path).replace(os.sep, '/')))
      if not entries:
        raise ConfigError(f'config.data.paths: directory {spec!r} holds no {kinds} file')
    elif os.path.isfile(spec_path):
      if not spec_path.endswith(suffixes):
        raise ConfigError(f'config.data.paths: {spec!r} is not a {kinds} file')
      entries = [(spec_path, os.path.basename(spec_path))]
    else:
      raise ConfigError(f'config.data.paths: {spec!r} does not exist')
    for full, identity in entries:
      found.setdefault(os.path.abspath(full), identity)
  return sorted(found.items())


def _jsonl_text(line: bytes, path: str, line_number: int, text_field: str) -> str:
  record = readers.parse_record(_decode(line), path, line_number, {text_field: str}, 'set config.data.text_field')
  return record[text_field]


@dataclasses.dataclass(frozen=True)
class Document:
  file_index: int  # Index into the resolved file list.
  start: int  # Byte offsets into the (decompressed) file.
  end: int
  identity: str  # Stable name hashed for the train/eval split.
  text: str
  utf8: bool = True  # False when some bytes were not UTF-8 (read as U+FFFD).


def iter_documents(files: list[tuple[str, str]], text_field: str) -> Iterator[Document]:
  """Every non-blank document of `files` (from `resolve_paths`): a whole .txt file or one JSONL line.

  Raises DataError naming file and line for a JSONL line that is not JSON or lacks `text_field`, and for a file
  that cannot be read or a .gz file that is not gzip or is cut short; undecodable bytes are replaced (U+FFFD), never
  dropped, and the document says so (`utf8` False).
  """
  for file_index, (path, identity) in enumerate(files):
    with readers.open_text(path, binary=True) as f:
      if path.endswith(TEXT_SUFFIXES):
        data = f.read()
        text = _decode(data)
        if text.strip():
          yield Document(file_index, 0, len(data), identity, text, _is_utf8(data))
        continue
      offset = 0
      for line in f:
        start, offset = offset, offset + len(line)
        if not line.strip():
          continue
        text = _jsonl_text(line, path, f.line_number, text_field)
        if text.strip():
          yield Document(file_index, start, offset, f'{identity}:{f.line_number}', text, _is_utf8(line))


class FilesSource:
  """Local .txt (one document per file) and .jsonl (one per line) files, optionally gzipped.

  Construction scans every file once (validating JSON, skipping blank documents) and keeps byte offsets; reads seek
  into plain files and into a per-process cache of decompressed .gz files (for corpora larger than memory, build an
  ArrayRecord dataset with `hybrid_jax.data.tfds_local` instead).
  """

  def __init__(self, paths: str, split: str, eval_fraction: float, text_field: str = 'text'):
    self.paths_spec, self.split, self.text_field = str(paths), split, text_field
    self.eval_fraction = float(eval_fraction)
    self.files = resolve_paths(paths)
    docs, not_utf8 = [], set()
    for d in iter_documents(self.files, text_field):
      docs.append((d.file_index, d.start, d.end, d.identity))
      if not d.utf8:
        not_utf8.add(d.identity)
    if not docs:
      raise DataError(f'config.data.paths={paths!r}: every document is empty or whitespace-only')
    keep = split_by_hash([d[3] for d in docs], self.eval_fraction, split)
    self.undecodable = UndecodableDocuments(f'config.data.paths={paths!r} ({split} split)')
    self.undecodable.identities = {docs[i][3] for i in keep} & not_utf8
    self.undecodable.report_scan(len(keep))
    self._index = np.array([docs[i][:3] for i in keep], dtype=np.int64).reshape(-1, 3)
    self._gz_cache = {}

  def __len__(self):
    return len(self._index)

  def _read(self, path: str, start: int, end: int) -> bytes:
    if path.endswith('.gz'):
      data = self._gz_cache.get(path)
      if data is None:  # Shuffled reads jump between files, so keep each decompressed file (per process).
        data = self._gz_cache.setdefault(path, readers.read_bytes(path))
      return data[start:end]
    with open(path, 'rb') as f:
      f.seek(start)
      return f.read(end - start)

  def __getitem__(self, index: int) -> str:
    file_index, start, end = (int(x) for x in self._index[index])
    path = self.files[file_index][0]
    data = self._read(path, start, end)
    if path.endswith(TEXT_SUFFIXES):
      return _decode(data)
    return _jsonl_text(data, path, 0, self.text_field)  # Lines were validated by the scan.

  def __getstate__(self):
    state = dict(self.__dict__)
    state['_gz_cache'] = {}
    return state

  def __repr__(self):
    return (f'FilesSource(paths={self.paths_spec!r}, split={self.split!r}, eval_fraction={self.eval_fraction!r}, '
            f'text_field={self.text_field!r}, files={len(self.files)}, documents={len(self)})')


# ------------------------------------------------------------------------------------------------ TFDS


def _first_line(error) -> str:
  """An error's first line: TFDS appends hundreds of lines (every dataset it knows) to 'not found'."""
  return (str(error).strip().splitlines() or [''])[0]


def _near_tfds(name: str, error) -> str:
  """' Did you mean ...?' with the names closest to `name` among those TFDS's not-found message lists."""
  listed = re.findall(r'^\s+- (\S+)$', str(error), re.M)
  near = difflib.get_close_matches(name.partition(':')[0].partition('/')[0], listed, n=3)
  return f' Did you mean {", ".join(near)}?' if near else ''


class TfdsSource:
  """A TFDS split through `tfds.data_source` (ArrayRecord, random access, no TensorFlow needed)."""

  def __init__(self, name: str, split: str, data_dir: str = '', text_field: str = 'text'):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    self.name, self.split, self.data_dir, self.text_field = name, split, data_dir, text_field
    self.undecodable = UndecodableDocuments(f'TFDS {name!r} split {split!r}')
    try:
      self._source = tfds.data_source(name, split=split, data_dir=data_dir or None)
    except Exception as e:  # TFDS raises many types (DatasetNotFoundError, AssertionError, ValueError...).
      raise ConfigError(f'config.data.tfds_name={name!r} (split {split!r}, data_dir {data_dir!r}) cannot be read '
                        f'as a TFDS data source: {type(e).__name__}: {_first_line(e)}{_near_tfds(name, e)}') from e

  def __len__(self):
    return len(self._source)

  def __getitem__(self, index: int) -> str:
    record = self._source[index]
    if self.text_field not in record:
      raise DataError(f'TFDS {self.name!r} split {self.split!r} example {index} has no field {self.text_field!r} '
                      f'(fields: {sorted(record)}; set config.data.text_field)')
    text = record[self.text_field]
    if isinstance(text, np.ndarray):
      text = text.item()
    if isinstance(text, bytes):
      self.undecodable.note(f'example {index}', text)
      return _decode(text)
    return str(text)

  def __repr__(self):
    return (f'TfdsSource(name={self.name!r}, split={self.split!r}, data_dir={self.data_dir!r}, '
            f'text_field={self.text_field!r})')
