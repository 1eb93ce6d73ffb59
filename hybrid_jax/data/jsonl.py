"""JSON-lines records with errors that name the file, the line and what is wrong.

Training documents, LongPPL documents, LongBench samples and metrics.jsonl are all JSON lines; this is the one
parser they share, so a malformed line reads the same wherever it turns up.
"""

import json
import os

from hybrid_jax.errors import UserError


class JsonlError(UserError, ValueError):
  """A JSON-lines file is missing, or one of its lines is not a record with the required fields."""


def parse_record(line: str, path: str, line_number: int, required: dict | None = None, hint: str = '') -> dict:
  """One JSON object from `line`; `required` maps field names to the type each must have (None: any type).

  `hint` is appended to a missing- or wrong-field message (e.g. which option names the field).
  """
  where = f'{path}:{line_number}'
  try:
    record = json.loads(line)
  except json.JSONDecodeError as e:
    raise JsonlError(f'{where}: not valid JSON ({e.msg} at column {e.colno})') from None
  if not isinstance(record, dict):
    raise JsonlError(f'{where}: a JSON {type(record).__name__}, not an object')
  suffix = f' ({hint})' if hint else ''
  missing = [name for name in (required or {}) if name not in record]
  if missing:
    raise JsonlError(f'{where}: missing field(s) {missing}{suffix}')
  for name, kind in (required or {}).items():
    if kind is not None and not isinstance(record[name], kind):
      expected = getattr(kind, '__name__', str(kind))
      raise JsonlError(f'{where}: field {name!r} is a {type(record[name]).__name__}, not a {expected}{suffix}')
  return record


def read_records(path, required: dict | None = None, hint: str = '') -> list[dict]:
  """Every record of a UTF-8 JSON-lines file (blank lines skipped), checked as by `parse_record`."""
  path = str(path)
  if not os.path.isfile(path):
    raise JsonlError(f'{path}: no such file')
  with open(path, encoding='utf-8') as f:
    return [parse_record(line, path, number, required, hint) for number, line in enumerate(f, 1) if line.strip()]
