"""Every structured file a command reads is read by hybrid_jax.readers: each malformed kind of each format is one
DataError naming the file (and the line or key where known), and through the command line one `error:` line.

Generated, not listed: the cases are every reader (or command) x every malformed kind that applies to its format.
A new reader is one row of READERS, a new command one row of COMMANDS, a new kind one entry of KINDS.
"""

import dataclasses
import gzip
import shutil

import numpy as np
import pytest

from hybrid_jax import readers
from hybrid_jax.data import sources
from hybrid_jax.errors import DataError
from tests.cli_walk import assert_one_line, parsers_seen, run_main
from tests.conftest import ROOT, SMALL

HF_FIXTURE = ROOT / 'tests' / 'data' / 'hf' / 'hf_llama_tied'
BASE = 'hybrid:arch=swa128_nope,scale=tiny'
KEY = 'text'  # The key every reader with required keys is asked for (the 'files' source's default text field).


def _table(text: str, suffix: str) -> bytes:
  return (text.replace('\t', ',') if suffix.endswith(('.csv', '.csv.gz')) else text).encode()


def _safetensors(tmp_path) -> bytes:
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  save_file({'w': np.arange(4096, dtype=np.float32)}, str(tmp_path / 'good.safetensors'))
  return (tmp_path / 'good.safetensors').read_bytes()


def _tokenizer() -> bytes:
  from tokenizers import Tokenizer, models  # pylint: disable=g-import-not-at-top
  return Tokenizer(models.WordLevel({'a': 0, '</s>': 1}, unk_token='a')).to_str().encode()


def good(fmt: str, suffix: str, tmp_path) -> bytes:
  """A well-formed file of `fmt` (uncompressed), long enough that cutting its gzip in half cuts the stream."""
  return {
      'json': lambda: b'{"text": "a", "n": 1}',
      'json_list': lambda: b'[{"text": "a"}, {"text": "b"}]',
      'jsonl': lambda: b'{"text": "a"}\n' * 2000,
      'table': lambda: _table('text\tn\n' + 'a\t1\n' * 2000, suffix),
      'text': lambda: b'hello\n' * 2000,
      'bytes': lambda: bytes(range(256)) * 64,
      'safetensors': lambda: _safetensors(tmp_path),
      'tokenizer': _tokenizer,
  }[{'jsonl_docs': 'jsonl', 'text_docs': 'text'}.get(fmt, fmt)]()


@dataclasses.dataclass(frozen=True)
class Kind:
  """A way a file is malformed: the formats it applies to, its content (from the format and the file's suffix),
  and fragments of the message (by format; '*' for any). `keys`: applies only where keys or columns are required;
  `cli`: the fragments through a command where they differ (a command requires keys of its own)."""
  formats: set
  content: object  # (fmt, suffix, tmp_path) -> bytes; None: nothing there; 'dir': a directory.
  fragments: dict
  keys: bool = False
  gzip_only: bool = False
  cli: dict | None = None


JSONS = {'json', 'json_list', 'jsonl', 'jsonl_docs', 'tokenizer'}
# *_docs: training documents, whose bytes that are not UTF-8 are read as U+FFFD (counted and warned about, no error).
ANY = {'json', 'json_list', 'jsonl', 'jsonl_docs', 'table', 'text', 'text_docs', 'bytes', 'safetensors', 'tokenizer'}


def _per_format(**contents):
  return lambda fmt, suffix, tmp_path: contents[fmt] if isinstance(contents[fmt], bytes) else contents[fmt](suffix)


def _truncated_gzip(fmt, suffix, tmp_path):
  data = gzip.compress(good(fmt, suffix, tmp_path))
  return data[:len(data) // 2]


KINDS = {
    'missing': Kind(ANY, lambda *_: None, {'*': ['no such file']}),
    'directory': Kind(ANY, lambda *_: 'dir', {'*': ['is a directory']}),
    'binary': Kind(ANY - {'bytes', 'text_docs'}, lambda *_: bytes(range(256)) * 4,
                   {'safetensors': ['cannot be read as safetensors'], 'jsonl_docs': [':1: not JSON'],
                    '*': ['binary']}),
    'not UTF-8': Kind({'json', 'json_list', 'jsonl', 'table', 'text', 'tokenizer'}, _per_format(
        json=b'{"text":\n "caf\xe9"}', json_list=b'[\n"caf\xe9"]', jsonl=b'{"text": "a"}\n{"text": "caf\xe9"}\n',
        table=lambda suffix: _table('text\tn\na\t1\n', suffix) + b'caf\xe9\t2\n', text=b'hello\ncaf\xe9\n',
        tokenizer=b'{\n"caf\xe9": 1}'),
        {'table': [':3: not text', 'is not UTF-8'], 'jsonl': [':2: not text', 'is not UTF-8'],
         'text': [':2: not text', 'is not UTF-8'], '*': ['not JSON (line 2', 'is not UTF-8']}),
    'empty': Kind({'json', 'json_list', 'table', 'safetensors', 'tokenizer'}, lambda *_: b'',
                  {'safetensors': ['cannot be read as safetensors'], '*': ['is empty']}),
    'not gzip': Kind(ANY - {'safetensors', 'tokenizer'}, lambda fmt, suffix, tmp_path: good(fmt, suffix, tmp_path),
                     {'*': ['not a gzip file']}, gzip_only=True),
    'truncated gzip': Kind(ANY - {'safetensors', 'tokenizer'}, _truncated_gzip, {'*': ['cut short']}, gzip_only=True),
    'invalid JSON': Kind(JSONS, _per_format(
        json=b'{"text": 1,\n"n": }', json_list=b'[{"text": 1},\n{]', jsonl=b'{"text": "a"}\n{"text": \n',
        jsonl_docs=b'{"text": "a"}\n{"text": \n', tokenizer=b'{"model":\n'),
        {'jsonl': [':2: not JSON'], 'jsonl_docs': [':2: not JSON'], 'tokenizer': ['not JSON', 'at line 2'],
         '*': ['not JSON', 'at line 2 column']}),
    'wrong top-level type': Kind(JSONS, _per_format(
        json=b'[1, 2]', json_list=b'{"text": "a"}', jsonl=b'{"text": "a"}\n[1, 2]\n', jsonl_docs=b'{"text": "a"}\n7\n',
        tokenizer=b'"a string"'),
        {'json': ['holds a JSON list where a JSON object is expected'],
         'json_list': ['holds a JSON object where a JSON list is expected'],
         'jsonl': [':2: holds a JSON list where a JSON object is expected'],
         'jsonl_docs': [':2: holds a JSON number where a JSON object is expected'],
         'tokenizer': ['holds a JSON string where a JSON object is expected']}),
    'missing key': Kind({'json', 'json_list', 'jsonl', 'jsonl_docs'}, _per_format(
        json=b'{"other": 1}', json_list=b'[{"text": "a"}, {"other": 1}]', jsonl=b'{"text": "a"}\n{"other": 1}\n',
        jsonl_docs=b'{"text": "a"}\n{"other": 1}\n'),
        {'json': ["missing key(s) 'text'"], 'json_list': ["item 1: missing key(s) 'text'"],
         'jsonl': [":2: missing field(s) ['text']"], 'jsonl_docs': [":2: missing field(s) ['text']"]}, keys=True,
        cli={'jsonl_docs': [":2: missing field(s) ['text']"], 'jsonl': [":2: missing field(s) ['text']"],
             '*': ['missing key(s)']}),
    'missing column': Kind({'table'}, lambda fmt, suffix, tmp_path: _table('other\tn\na\t1\n', suffix),
                           {'*': ["no column(s) 'text'"]}, keys=True),
    'wrong field count': Kind({'table'}, lambda fmt, suffix, tmp_path: _table('text\tn\na\t1\nb\n', suffix),
                              {'*': [':3: 1 field(s), but the header has 2 columns']}),
    'unclosed quote': Kind({'table'}, lambda fmt, suffix, tmp_path: _table('text\tn\n"a\t1\nb\t2\n', suffix),
                           {'*': [':2: not a readable table row', 'unclosed quote']}),
    'truncated': Kind({'safetensors'}, lambda fmt, suffix, tmp_path: _safetensors(tmp_path)[:200],
                      {'*': ['cannot be read as safetensors']}),
    'not a tokenizer': Kind({'tokenizer'}, lambda *_: b'{"not": "a tokenizer"}',
                            {'*': ['not a readable Hugging Face tokenizer.json']}),
}


def kinds_for(fmt: str, name: str, keys: bool, skip=()):
  """The kinds that apply to a file of `fmt` named `name` (its suffix says whether it is gzip)."""
  gz = name.endswith('.gz')
  return [k for k, kind in KINDS.items() if fmt in kind.formats and (gz or not kind.gzip_only)
          and (keys or not kind.keys) and k not in skip]


def make(path, fmt: str, kind_name: str, tmp_path, cli: bool = False) -> list[str]:
  """Writes the malformed file at `path`; returns the fragments its message must hold (through a command: `cli`)."""
  kind = KINDS[kind_name]
  suffix = path.name
  content = kind.content(fmt, suffix, tmp_path)
  if content == 'dir':
    path.mkdir()
  elif content is not None:
    compress = suffix.endswith('.gz') and kind_name not in ('not gzip', 'truncated gzip')
    path.write_bytes(gzip.compress(content) if compress else content)
  fragments = kind.cli if cli and kind.cli else kind.fragments
  return fragments.get(fmt, fragments.get('*', []))


# ------------------------------------------------------------------------------------------------- the readers

# name -> (file name, format, call, whether it requires keys)
READERS = {
    'read_json': ('x.json', 'json', lambda p: readers.read_json(p, 'thing', required=(KEY,)), True),
    'read_json (.gz)': ('x.json.gz', 'json', lambda p: readers.read_json(p, 'thing', required=(KEY,)), True),
    'read_json (a list)': ('x.json', 'json_list', lambda p: readers.read_json(p, 'thing', list, (KEY,)), True),
    'read_jsonl': ('x.jsonl', 'jsonl', lambda p: readers.read_jsonl(p, 'thing', {KEY: None}), True),
    'read_jsonl (.gz)': ('x.jsonl.gz', 'jsonl', lambda p: readers.read_jsonl(p, 'thing', {KEY: None}), True),
    'read_table (TSV)': ('x.tsv', 'table', lambda p: readers.read_table(p, 'thing', (KEY,)), True),
    'read_table (CSV)': ('x.csv', 'table', lambda p: readers.read_table(p, 'thing', (KEY,)), True),
    'read_table (TSV .gz)': ('x.tsv.gz', 'table', lambda p: readers.read_table(p, 'thing', (KEY,)), True),
    'read_text': ('x.txt', 'text', lambda p: readers.read_text(p, 'thing'), False),
    'read_text (.gz)': ('x.txt.gz', 'text', lambda p: readers.read_text(p, 'thing'), False),
    'open_text lines (.gz)': ('x.txt.gz', 'text', lambda p: list(readers.open_text(p, 'thing')), False),
    'read_bytes (.gz)': ('x.bin.gz', 'bytes', lambda p: readers.read_bytes(p, 'thing'), False),
    'safetensors_names': ('x.safetensors', 'safetensors', readers.safetensors_names, False),
    'read_tensor': ('x.safetensors', 'safetensors', lambda p: readers.read_tensor(p, 'w'), False),
    'read_tokenizer_json': ('tokenizer.json', 'tokenizer', readers.read_tokenizer_json, False),
    'sources.iter_documents': ('x.jsonl', 'jsonl_docs',
                               lambda p: list(sources.iter_documents([(str(p), 'x')], KEY)), True),
    'sources.iter_documents (.gz)': ('x.jsonl.gz', 'jsonl_docs',
                                     lambda p: list(sources.iter_documents([(str(p), 'x')], KEY)), True),
    'sources.iter_documents (.txt.gz)': ('x.txt.gz', 'text_docs',
                                         lambda p: list(sources.iter_documents([(str(p), 'x')], KEY)), False),
}
READER_CASES = [(reader, kind) for reader, (name, fmt, _, keys) in READERS.items()
                for kind in kinds_for(fmt, name, keys)]


def test_the_generated_cases_cover_every_kind():
  assert {kind for _, kind in READER_CASES} == set(KINDS)
  assert len(READER_CASES) >= 100, len(READER_CASES)


@pytest.mark.parametrize('reader', READERS)
def test_a_well_formed_file_reads(reader, tmp_path):
  name, fmt, call, _ = READERS[reader]
  path = tmp_path / name
  data = good(fmt, name, tmp_path)
  path.write_bytes(gzip.compress(data) if name.endswith('.gz') else data)
  assert call(path) is not None


@pytest.mark.parametrize('reader, kind', READER_CASES)
def test_each_malformed_kind_is_a_data_error_naming_the_file(reader, kind, tmp_path):
  name, fmt, call, _ = READERS[reader]
  path = tmp_path / name
  fragments = make(path, fmt, kind, tmp_path)
  with pytest.raises(DataError) as error:  # Any other exception fails the test with its traceback.
    call(path)
  message = str(error.value)
  assert str(path) in message and '\n' not in message, message
  for fragment in fragments:
    assert fragment in message, (fragment, message)


def test_what_leads_and_the_hint_ends_the_message(tmp_path):
  path = tmp_path / 'rows.json'
  path.write_text('{"a": 1}')
  with pytest.raises(DataError, match=rf'^--fit {path}: holds a JSON object where a JSON list is expected '
                                      r'\(compile-check rows\)$'):
    readers.read_json(path, '--fit', expect=list, hint='compile-check rows')


def test_json_lines_records_and_their_field_checks(tmp_path):
  path = tmp_path / 'x.jsonl'
  path.write_text('{"text": "a", "n": 1}\n\n   \n{"text": "b", "n": 2}\n')
  assert readers.read_jsonl(path, '', {'text': str, 'n': None}) == [{'text': 'a', 'n': 1}, {'text': 'b', 'n': 2}]
  path.write_text('{"text": ["a"]}\n')
  with pytest.raises(DataError, match=r"x\.jsonl:1: field 'text' is a list, not a str \(use --field\)"):
    readers.read_jsonl(path, '', {'text': str}, hint='use --field')


def test_analysis_longppl_documents_name_the_bad_line(tmp_path):
  from hybrid_jax.analysis import restriction  # pylint: disable=g-import-not-at-top
  (tmp_path / 'docs.jsonl').write_text('{"text": "fine"}\n{"txt": "typo"}\n')
  (tmp_path / 'spans').mkdir()
  (tmp_path / 'spans' / 'slice_0.txt').write_text('')
  with pytest.raises(DataError, match=r"docs\.jsonl:2: missing field\(s\) \['text'\]"):
    restriction.read_longppl_inputs(str(tmp_path / 'docs.jsonl'), str(tmp_path / 'spans'))


# ------------------------------------------------------------------------------------------------ the commands

TRAIN = ['train', f'--config={BASE}', '--workdir={tmp}/run', '--config.train.steps=4',
         *[f'--config.{section}.{key}={value}' for section, values in SMALL.items() for key, value in values.items()]]
HF_IMPORT = ['hf', 'import', '{dir}', '--workdir', '{tmp}/imported']
EVAL = ['eval', '--workdir', '{run}', '--samples', '1', '--no-progress', '--out', '{tmp}/eval', '--tasks']


@dataclasses.dataclass(frozen=True)
class Command:
  """A command that reads a structured file: its argv ({file}: the file, {dir}: its folder, {tmp}: a scratch
  folder), the file's name and format. `fixture`: a folder copied to {dir} first; `keys`: the command requires keys
  of the file; `skip`: kinds that are no error for this command (an optional file, text read leniently)."""
  argv: list
  name: str
  fmt: str
  fixture: object = None
  keys: bool = False
  skip: tuple = ()


COMMANDS = {
    'fit --data (TSV)': Command(['fit', '--data', '{file}', '--out', '{tmp}/out'], 'points.tsv', 'table'),
    'fit --data (CSV)': Command(['fit', '--data', '{file}', '--out', '{tmp}/out'], 'points.csv', 'table'),
    'fit --data (JSON)': Command(['fit', '--data', '{file}', '--out', '{tmp}/out'], 'points.json', 'json_list'),
    'plan --runs --fit': Command(['plan', '--runs', BASE, '--fit', '{file}'], 'fit.json', 'json_list', keys=True),
    'hf import (config.json)': Command(HF_IMPORT, 'config.json', 'json', HF_FIXTURE),
    'hf import (model.safetensors)': Command(HF_IMPORT, 'model.safetensors', 'safetensors', HF_FIXTURE),
    'hf import (safetensors index)': Command(HF_IMPORT, 'model.safetensors.index.json', 'json', HF_FIXTURE,
                                             keys=True, skip=('missing', 'directory')),  # Optional.
    'hf import (tokenizer.json)': Command(HF_IMPORT, 'tokenizer.json', 'tokenizer', HF_FIXTURE,
                                          skip=('missing', 'directory')),  # Optional.
    'hf import --tensor-names': Command([*HF_IMPORT[:2], str(HF_FIXTURE), *HF_IMPORT[3:], '--tensor-names', '{file}'],
                                        'names.json', 'json'),
    'analyze tracing-overlay': Command(['analyze', 'tracing-overlay', '--runs', '{file}', '--out', '{tmp}/out'],
                                       'tracing.json', 'json', keys=True),
    'train (data.paths .jsonl)': Command([*TRAIN, '--config.data.source=files', '--config.data.paths={file}'],
                                         'docs.jsonl', 'jsonl_docs', keys=True),
    'train (data.paths .jsonl.gz)': Command([*TRAIN, '--config.data.source=files', '--config.data.paths={file}'],
                                            'docs.jsonl.gz', 'jsonl_docs', keys=True),
    'train (pretokenized manifest)': Command([*TRAIN, '--config.data.source=pretokenized', '--config.data.paths={dir}'],
                                             'manifest.json', 'json', keys=True),
    'train (data.paths .txt.gz)': Command([*TRAIN, '--config.data.source=files', '--config.data.paths={file}'],
                                          'doc.txt.gz', 'text_docs'),
    'build-tfds': Command(['build-tfds', '{file}', '{tmp}/tfds'], 'docs.jsonl.gz', 'jsonl_docs', keys=True),
    # The evaluations' own files, read once the run is loaded ({run}: the session's tiny trained run).
    'eval --squad': Command([*EVAL, 'ruler:qa_1', '--squad', '{file}'], 'squad.json', 'json'),
    'eval --hotpotqa': Command([*EVAL, 'ruler:qa_2', '--hotpotqa', '{file}'], 'hotpot.json', 'json_list'),
    # LongBench records need their own fields, so only the kinds that fail on line 1 apply.
    'eval --longbench-dir': Command([*EVAL, 'longbench:narrativeqa', '--longbench-dir', '{dir}'], 'narrativeqa.jsonl',
                                    'jsonl', skip=('directory', 'not UTF-8', 'invalid JSON', 'wrong top-level type')),
    'eval --longppl-data': Command([*EVAL, 'longppl', '--longppl-data', '{file}', '--longppl-evaluator', 'self'],
                                   'docs.jsonl', 'jsonl', keys=True),
}
COMMAND_CASES = [(command, kind) for command, c in COMMANDS.items() for kind in kinds_for(c.fmt, c.name, c.keys, c.skip)]
_CHECKED_BEFORE_READING = ('missing', 'directory')  # Refused by a flag's check or a folder walk, in their words.


def test_the_commands_meet_every_kind_of_their_formats():
  assert {kind for _, kind in COMMAND_CASES} == set(KINDS) - {'missing column'}  # No command requires a column.
  assert len(COMMAND_CASES) >= 90, len(COMMAND_CASES)


@pytest.mark.parametrize('command, kind', COMMAND_CASES)
def test_each_command_refuses_each_malformed_file_in_one_line(command, kind, tmp_path, capsys, request):
  c = COMMANDS[command]
  run = request.getfixturevalue('tiny_run') if '{run}' in c.argv else None
  folder = tmp_path / 'input'
  if c.fixture:
    shutil.copytree(c.fixture, folder)
  else:
    folder.mkdir()
  path = folder / c.name
  if path.exists():
    path.unlink()
  fragments = make(path, c.fmt, kind, tmp_path, cli=True)
  argv = [a.format(file=path, dir=folder, tmp=tmp_path, run=run) for a in c.argv]
  with parsers_seen():
    status, err = run_main(argv, capsys)
  assert 'Traceback' not in err, (command, kind, err)
  try:
    assert_one_line(status, err, c.name, *([] if kind in _CHECKED_BEFORE_READING else fragments))
  except AssertionError as e:
    raise AssertionError(f'{command}, {kind}: {e}') from None
  assert not (tmp_path / 'imported').exists()


def test_an_unclosed_quote_in_a_run_string_is_one_line(capsys):
  status, err = run_main(['plan', '--runs', f'{BASE} --config.name="unclosed'], capsys)
  assert_one_line(status, err, 'No closing quotation', '--config.name="unclosed')
