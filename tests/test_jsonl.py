"""The one JSON-lines parser: every way a line can be wrong is named with file and line."""

import pytest

from hybrid_jax.data import jsonl


def test_records_and_their_errors(tmp_path):
  path = tmp_path / 'x.jsonl'
  path.write_text('{"text": "a", "n": 1}\n\n   \n{"text": "b", "n": 2}\n')
  assert jsonl.read_records(path, {'text': str, 'n': None}) == [{'text': 'a', 'n': 1}, {'text': 'b', 'n': 2}]
  cases = [('{"text": "a"\n', r'x\.jsonl:1: not valid JSON'),
           ('{"text": "a"}\n[1, 2]\n', r'x\.jsonl:2: a JSON list, not an object'),
           ('{"n": 1}\n', r"x\.jsonl:1: missing field\(s\) \['text'\] \(use --field\)"),
           ('{"text": ["a"]}\n', r"x\.jsonl:1: field 'text' is a list, not a str \(use --field\)")]
  for content, message in cases:
    path.write_text(content)
    with pytest.raises(jsonl.JsonlError, match=message):
      jsonl.read_records(path, {'text': str}, hint='use --field')
  with pytest.raises(jsonl.JsonlError, match='no such file'):
    jsonl.read_records(tmp_path / 'missing.jsonl')


def test_analysis_longppl_documents_name_the_bad_line(tmp_path):
  from hybrid_jax.analysis import restriction
  (tmp_path / 'docs.jsonl').write_text('{"text": "fine"}\n{"txt": "typo"}\n')
  (tmp_path / 'spans').mkdir()
  (tmp_path / 'spans' / 'slice_0.txt').write_text('')
  with pytest.raises(jsonl.JsonlError, match=r"docs\.jsonl:2: missing field\(s\) \['text'\]"):
    restriction.read_longppl_inputs(str(tmp_path / 'docs.jsonl'), str(tmp_path / 'spans'))
