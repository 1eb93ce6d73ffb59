"""One reader per structured format: JSON, JSON lines (.gz too), TSV/CSV tables, plain or gzip text, safetensors
and Hugging Face tokenizer.json.

Every file a user hands a command (training data, a fit table, a checkpoint's config.json, a run directory's
records) is read here, so a file that is missing, a directory, binary, cut short or of the wrong shape is one
DataError naming the file and, where known, the line or key: never a traceback from json, gzip, csv or a format
library, and the same words whichever command read it. `what` says what the file is for (e.g. '--fit'); it leads
the message, before the path.

This module sits on the ground floor: it imports only hybrid_jax.errors, the standard library, and (inside the
functions that need them) safetensors and tokenizers.
"""

import csv
import gzip
import json
import pathlib
import zlib

from hybrid_jax.errors import DataError

_JSON_KINDS = ((bool, 'true/false'), (dict, 'a JSON object'), (list, 'a JSON list'), (str, 'a JSON string'),
               ((int, float), 'a JSON number'), (type(None), 'null'))


def where(path, what: str = '') -> str:
  """How messages name a file: '<what> <path>', or the path alone."""
  return f'{what} {path}' if what else str(path)


def describe(value) -> str:
  """'a JSON object', 'a JSON list', ... for the value json.loads returned."""
  return next(name for kind, name in _JSON_KINDS if isinstance(value, kind))


def _kinds(expect) -> tuple:
  return () if expect is None else expect if isinstance(expect, tuple) else (expect,)


def _expected(expect) -> str:
  names = {dict: 'a JSON object', list: 'a JSON list', str: 'a JSON string', int: 'a JSON number',
           float: 'a JSON number'}
  return ' or '.join(dict.fromkeys(names.get(k, getattr(k, '__name__', str(k))) for k in _kinds(expect))) or 'JSON'


def _as_path(path):
  """`path` as given when it is already path-like with read_bytes (pathlib, etils.epath), else a pathlib.Path."""
  return path if hasattr(path, 'read_bytes') and hasattr(path, 'is_dir') else pathlib.Path(path)


def check_file(path, what: str = '') -> None:
  """DataError unless `path` is an existing file (a directory or nothing is named as such)."""
  path = _as_path(path)
  if path.is_dir():
    raise DataError(f'{where(path, what)}: is a directory, not a file')
  if not path.exists():
    raise DataError(f'{where(path, what)}: no such file')


def _os_error(path, what, error: OSError) -> DataError:
  return DataError(f'{where(path, what)}: cannot be read ({error.strerror or error})')


def _is_gzip_name(path) -> bool:
  return str(path).endswith('.gz')


def _gzip_error(path, what, error, line: int) -> DataError:
  """The one message of a .gz file that does not decompress: not gzip at all, or cut short / corrupt."""
  if isinstance(error, gzip.BadGzipFile) and 'Not a gzipped file' in str(error):
    return DataError(f'{where(path, what)}: not a gzip file, though its name ends in .gz')
  after = f' after line {line}' if line else ''
  return DataError(f'{where(path, what)}: the gzip data is cut short or corrupt{after} ({type(error).__name__}: '
                   f'{error})')


def _not_utf8(data: bytes, error: UnicodeDecodeError, line: int) -> tuple[int, str]:
  """(line, 'byte 0x.. at column c ...') of the first byte that is not UTF-8; `line` 0: counted from `data`."""
  column = error.start - data.rfind(b'\n', 0, error.start)
  line = line or data.count(b'\n', 0, error.start) + 1
  return line, f'byte 0x{data[error.start]:02x} at column {column} is not UTF-8; a binary file?'


def _decode(data: bytes, path, what, line: int) -> str:
  """UTF-8 text of one line (`line`, 1-based) or a whole file (`line` 0: the line is counted from the bytes)."""
  try:
    text = data.decode('utf-8')
  except UnicodeDecodeError as e:
    line, problem = _not_utf8(data, e, line)
    raise DataError(f'{where(path, what)}:{line}: not text ({problem})') from None
  if '\x00' in text:
    column = text.index('\x00') - text.rfind('\n', 0, text.index('\x00'))
    line = line or text.count('\n', 0, text.index('\x00')) + 1
    raise DataError(f'{where(path, what)}:{line}: a NUL byte at column {column}: binary data, not text')
  return text


class TextFile:
  """The lines of a plain or gzip (name ending in .gz) file, as text (UTF-8) or bytes.

  Opening, decompressing and decoding failures are DataErrors naming the file and the line reached; `line_number`
  is the number of the last line read. Use as a context manager or iterate once.
  """

  def __init__(self, path, what: str = '', *, binary: bool = False):
    self.path, self.what, self.binary, self.line_number = path, what, binary, 0
    check_file(path, what)
    try:
      self._file = gzip.open(path, 'rb') if _is_gzip_name(path) else open(path, 'rb')
    except OSError as e:
      raise _os_error(path, what, e) from None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def close(self):
    self._file.close()

  def _failed(self, error) -> DataError:
    if _is_gzip_name(self.path) and isinstance(error, (OSError, EOFError, zlib.error)):
      return _gzip_error(self.path, self.what, error, self.line_number)
    return _os_error(self.path, self.what, error)

  def __iter__(self):
    while True:
      try:
        line = self._file.readline()
      except (OSError, EOFError, zlib.error) as e:
        raise self._failed(e) from None
      if not line:
        return
      self.line_number += 1
      yield line if self.binary else _decode(line, self.path, self.what, self.line_number)

  def read(self):
    """The whole (decompressed) content: bytes, or text when not `binary`."""
    try:
      data = self._file.read()
    except (OSError, EOFError, zlib.error) as e:
      raise self._failed(e) from None
    return data if self.binary else _decode(data, self.path, self.what, 0)


def open_text(path, what: str = '', *, binary: bool = False) -> TextFile:
  """A plain or gzip file's lines (see TextFile); DataError naming the file for anything unreadable."""
  return TextFile(path, what, binary=binary)


def read_bytes(path, what: str = '') -> bytes:
  """All bytes of a file (decompressed when its name ends in .gz); pathlib and epath paths (gs://) alike."""
  path = _as_path(path)
  if _is_gzip_name(path) or isinstance(path, pathlib.Path):
    with open_text(path, what, binary=True) as f:
      return f.read()
  check_file(path, what)
  try:
    return path.read_bytes()
  except OSError as e:
    raise _os_error(path, what, e) from None


def read_text(path, what: str = '') -> str:
  """All of a UTF-8 text file (decompressed when its name ends in .gz)."""
  return _decode(read_bytes(path, what), path, what, 0)


# ---------------------------------------------------------------------------------------------------------- JSON


def check_shape(value, name: str, expect=dict, required=(), items=None, hint: str = ''):
  """`value` if it is of type `expect` (a type, a tuple of types or None for any) holding the `required` keys, else
  a DataError naming `name` (the file, or file and line) and ending in `hint` (what the file should be). For a
  list, every item must be of type `items` (when given) and, when keys are `required`, an object holding them."""
  suffix = f' ({hint})' if hint else ''
  kinds = _kinds(expect)
  if kinds and (not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds):
    raise DataError(f'{name}: holds {describe(value)} where {_expected(expect)} is expected{suffix}')
  if required and isinstance(value, dict):
    missing = [k for k in required if k not in value]
    if missing:
      raise DataError(f'{name}: missing key(s) {", ".join(map(repr, missing))} (has '
                      f'{", ".join(map(str, value)) or "none"}){suffix}')
  if (items or required) and isinstance(value, list):
    for index, item in enumerate(value):
      check_shape(item, f'{name}: item {index}', dict if required else items, required, hint=hint)
  return value


def parse_json(data, name: str, expect=dict, required=(), items=None, hint: str = ''):
  """The JSON value of `data` (bytes or str) checked as by check_shape; `name` names the source in messages."""
  if isinstance(data, bytes):
    try:
      data = data.decode('utf-8')
    except UnicodeDecodeError as e:
      line, problem = _not_utf8(data, e, 0)
      raise DataError(f'{name}: not JSON (line {line}: {problem})') from None
  if not data.strip():
    raise DataError(f'{name}: is empty (expected {_expected(expect)})')
  value = _loads(data, name, lines=True)
  return check_shape(value, name, expect, required, items, hint)


def _loads(text: str, name: str, *, lines: bool):
  """json.loads of `text`, or DataError naming `name` and where the text stops being JSON (`lines`: a whole file,
  so the line too; else one line of a JSON-lines file, whose line `name` already carries)."""
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    at = f'line {e.lineno} column {e.colno}' if lines else f'column {e.colno}'
    raise DataError(f'{name}: not JSON ({e.msg} at {at})') from None
  except RecursionError:
    raise DataError(f'{name}: JSON nested too deeply to read') from None


def read_json(path, what: str = '', expect=dict, required=(), items=None, hint: str = ''):
  """The JSON value of a file (see check_shape for `expect` and `required`); DataError naming the file for a file
  that is missing, a directory, unreadable, not UTF-8, empty, not JSON (with line and column) or of the wrong
  shape (what was found and what is expected)."""
  return parse_json(read_bytes(path, what), where(path, what), expect, required, items, hint)


# ---------------------------------------------------------------------------------------------------- JSON lines


def parse_record(line: str, path, line_number: int, required: dict | None = None, hint: str = '',
                 what: str = '') -> dict:
  """One JSON object from `line`; `required` maps field names to the type each must have (None: any type).

  `hint` is appended to a missing- or wrong-field message (e.g. which option names the field).
  """
  name = f'{where(path, what)}:{line_number}'
  record = _loads(line, name, lines=False)
  if not isinstance(record, dict):
    raise DataError(f'{name}: holds {describe(record)} where a JSON object is expected')
  suffix = f' ({hint})' if hint else ''
  missing = [field for field in (required or {}) if field not in record]
  if missing:
    raise DataError(f'{name}: missing field(s) {missing}{suffix}')
  for field, kind in (required or {}).items():
    if kind is not None and not isinstance(record[field], kind):
      expected = getattr(kind, '__name__', str(kind))
      raise DataError(f'{name}: field {field!r} is a {type(record[field]).__name__}, not a {expected}{suffix}')
  return record


def read_jsonl(path, what: str = '', required: dict | None = None, hint: str = '') -> list[dict]:
  """Every record of a UTF-8 JSON-lines file, plain or .gz (blank lines skipped), checked as by `parse_record`."""
  with open_text(path, what) as f:
    return [parse_record(line, path, f.line_number, required, hint, what) for line in f if line.strip()]


# -------------------------------------------------------------------------------------------------------- tables


def read_table(path, what: str = '', required_columns=(), delimiter: str | None = None) -> list[dict]:
  """The rows of a TSV or CSV file with a header line, as {column: text}; the delimiter is ',' for a .csv name and
  a tab otherwise. DataError naming the file (and line) for a binary or non-UTF-8 file, no header, a missing
  required column, an unclosed quote or a row whose field count differs from the header's."""
  name = where(path, what)
  delimiter = delimiter or (',' if str(path).endswith(('.csv', '.csv.gz')) else '\t')
  header, rows = None, []
  with open_text(path, what) as f:
    reader = csv.reader(f, delimiter=delimiter, strict=True)
    while True:
      start = reader.line_num + 1  # A quoted field may span lines: a row is named by its first line.
      try:
        row = next(reader, None)
      except csv.Error as e:
        raise DataError(f'{name}:{start}: not a readable table row ({e}; an unclosed quote?)') from None
      if row is None:
        break
      if not row:
        continue
      if header is None:
        header = row
        missing = [c for c in required_columns if c not in header]
        if missing:
          raise DataError(f'{name}: no column(s) {", ".join(map(repr, missing))} in its header (columns: '
                          f'{", ".join(header)})')
      elif len(row) != len(header):
        raise DataError(f'{name}:{start}: {len(row)} field(s), but the header has {len(header)} columns '
                        f'(delimiter {delimiter!r})')
      else:
        rows.append(dict(zip(header, row)))
  if header is None:
    raise DataError(f'{name}: is empty (expected a header line of column names)')
  return rows


# --------------------------------------------------------------------------------------- safetensors, tokenizers


def _one_line(error) -> str:
  """A library's message on one line (the command line reports a user error as one line)."""
  return ' '.join(str(error).split())


def _safetensors_error(path, what, error) -> DataError:
  return DataError(f'{where(path, what)} cannot be read as safetensors (truncated or not safetensors?): '
                   f'{type(error).__name__}: {_one_line(error)}')


def safetensors_names(path, what: str = '') -> list[str]:
  """The tensor names of a safetensors file."""
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  check_file(path, what)
  try:
    with safe_open(str(path), framework='numpy') as f:
      return list(f.keys())
  except Exception as e:  # pylint: disable=broad-except  # safetensors raises its own SafetensorError.
    raise _safetensors_error(path, what, e) from e


def read_tensor(path, name: str, what: str = ''):
  """One tensor of a safetensors file, as numpy."""
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  check_file(path, what)
  try:
    with safe_open(str(path), framework='numpy') as f:
      return f.get_tensor(name)
  except Exception as e:  # pylint: disable=broad-except  # safetensors raises its own SafetensorError.
    raise _safetensors_error(path, what, e) from e


def read_tokenizer_json(path, what: str = ''):
  """(the file's JSON object, a tokenizers.Tokenizer) of a Hugging Face tokenizer.json."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  data = read_bytes(path, what)
  spec = parse_json(data, where(path, what))
  try:
    return spec, tokenizers.Tokenizer.from_str(data.decode('utf-8'))
  except Exception as e:  # pylint: disable=broad-except  # The Rust library raises its own Exception type.
    raise DataError(f'{where(path, what)}: not a readable Hugging Face tokenizer.json ({_one_line(e)})') from e
