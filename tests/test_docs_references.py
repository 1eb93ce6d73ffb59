"""Every path, module and section that the docs and the code's comments name exists, so a move or a rename that
forgets a reference fails here instead of misleading the next reader.

Scanned: all the text of README.md, BUILD.md, BENCHMARKS.md and docs/**/*.md, and the comments and docstrings
(not other strings: help texts and messages are code, tested as code) of hybrid_jax/, tests/, configs/, launch/
and the files of scripts/ (a shell script's comments).

What a reference is, and what must hold:
- A repository path: a name that starts with a top-level folder (`hybrid_jax/`, `tests/`, `docs/`, `scripts/`,
  `configs/`, `launch/`, `.ci/`) or is a root file (README.md, BUILD.md, BENCHMARKS.md, setup.cfg, pyproject.toml,
  constraints.txt). It must exist; one with `*` must match a file; `tests/test_<name>.py::<function>` (or
  `::<Class>::<function>`) must define that function or class.
- A path inside the package (folders, then a `.py` file: `train/runs.py`, `linear_scan/api.py`) whose first folder
  is a folder of the repository must be the end of some file's path in the repository (`encodings/cp852.py` of the
  standard library starts with no such folder, so it is not one).
- A dotted name `hybrid_jax.<package>.<module>`: its longest prefix that is a module or package must exist as a
  file or folder (checked on disk, nothing is imported), and a name after it must be defined in that module (or be
  one of the package's modules).
- A section citation, written one way everywhere: the file's path from the repository root, a comma, and the
  start of the heading in double quotes, case as written: `BENCHMARKS.md, "Kernels on CPU"`,
  `docs/KERNELS.md, "Tolerances"` (a line break inside the quotes counts as a space). The quoted text must begin a
  heading of that file. Other ways of writing one (`<page>.md "Heading"`, `<page>.md: "Heading"`,
  `<page>.md, section Heading`) are refused, so that every citation is one this test reads.
- A Markdown link `[text](<page>.md#<anchor>)` (relative to the page it is on): the file must exist and the anchor
  must be a heading's (GitHub's rule: lower case, punctuation but `-` and `_` dropped, each space a `-`).

Not references, so never checked: text inside a URL; a path that continues another one (preceded by `/`, `.`,
`-` or a word character: `<run>/checkpoints/…`, `../shared/…`, `/tmp/docs/…`), since only paths from the
repository root name its files; a path holding a placeholder (`<`, `{`, `...`, `…`, a folder or Python file named in
capitals such as `RUN/` or `NAME.py`) or naming the reader's own file (a name starting `my_`, as in "copy it to
`configs/my_run.py`"); anything under `tests/data/` named in a test's comment, which the test itself opens.
"""

import ast
import io
import pathlib
import re
import tokenize

ROOT = pathlib.Path(__file__).resolve().parents[1]

TOP_FOLDERS = ('hybrid_jax', 'tests', 'docs', 'scripts', 'configs', 'launch', '.ci')
ROOT_FILES = ('README.md', 'BUILD.md', 'BENCHMARKS.md', 'setup.cfg', 'pyproject.toml', 'constraints.txt')
_SKIP_DIRS = {'__pycache__', '.venv', '.git', 'hybrid_jax.egg-info', 'runs', 'dist', 'build'}

_URL = re.compile(r'[a-z][a-z0-9+.-]*://\S+|www\.\S+')
_PATH = re.compile(r'(?<![\w./\-~$])((?:' + '|'.join(re.escape(f) for f in TOP_FOLDERS) +
                   r')/[\w./*\-]*[\w*/]|(?:' + '|'.join(re.escape(f) for f in ROOT_FILES) + r'))(::\w+(?:::\w+)?)?')
_INNER_PATH = re.compile(r'(?<![\w./\-~$<])((?:[a-z_][a-z0-9_]*/)+[a-z_][a-z0-9_]*\.py)\b')
_MODULE = re.compile(r'(?<![\w.])hybrid_jax(?:\.\w+)+')
_SECTION = re.compile(r'(?<![\w./\-])((?:[\w\-]+/)*[\w\-]+\.md), "([^"]+)"')
_LINK = re.compile(r'\]\(([^)\s#]*)(?:#([^)\s]+))?\)')
_PLACEHOLDER = re.compile(r'[<{]|\.\.\.|…|(?:^|/)[A-Z][A-Z_]+(?:/|\.py$|$)|(?:^|/)my_')
_LOOSE_SECTION = re.compile(r'(?<![\w./\-])((?:[\w\-]+/)*[\w\-]+\.md)(?::? "|, section )')


def _repo_files():
  files = []
  for folder in TOP_FOLDERS:
    for path in (ROOT / folder).rglob('*'):
      if path.is_file() and not _SKIP_DIRS & set(path.relative_to(ROOT).parts):
        files.append(path.relative_to(ROOT).as_posix())
  return files


def _docs():
  """(path, text) of every Markdown page: all of its text."""
  for path in [*(ROOT / f for f in ('README.md', 'BUILD.md', 'BENCHMARKS.md')), *sorted(ROOT.glob('docs/**/*.md'))]:
    yield path, path.read_text()


def _python_prose(source: str) -> str:
  """The comments and docstrings of a Python file, one per line, with their line breaks kept."""
  parts = []
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type == tokenize.COMMENT:
      parts.append(token.string.lstrip('#'))
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      docstring = ast.get_docstring(node, clean=False)
      if docstring:
        parts.append(docstring)
  return '\n'.join(parts)


def _shell_prose(source: str) -> str:
  return '\n'.join(m.group(1) for m in re.finditer(r'(?:^|\s)#(.*)$', source, re.M))


def _code():
  """(path, comments and docstrings) of every source file in the scanned folders."""
  for folder in ('hybrid_jax', 'tests', 'configs', 'launch'):
    for path in sorted((ROOT / folder).rglob('*.py')):
      if not _SKIP_DIRS & set(path.relative_to(ROOT).parts):
        yield path, _python_prose(path.read_text())
  for path in sorted((ROOT / 'scripts').rglob('*')):
    if path.is_file() and '__pycache__' not in path.parts:
      text = path.read_text()
      yield path, _python_prose(text) if path.suffix == '.py' else _shell_prose(text)


def _sources():
  yield from _docs()
  yield from _code()


def anchor(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, each space a `-`."""
  text = re.sub(r'[`*]', '', heading.strip().lower())
  return re.sub(r'[^\w\- ]', '', text).replace(' ', '-')


def headings(path: pathlib.Path) -> list[str]:
  """The headings of a Markdown file, outside code blocks."""
  found, fenced = [], False
  for line in path.read_text().splitlines():
    if line.startswith('```'):
      fenced = not fenced
    elif not fenced and re.match(r'#{1,6} ', line):
      found.append(line.lstrip('#').strip())
  return found


def _defined_names(path: pathlib.Path) -> set[str]:
  """Every function and class defined anywhere in a module, and its top-level assignments and imports."""
  tree = ast.parse(path.read_text())
  names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
  for node in tree.body:
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
      for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
        names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names |= {(a.asname or a.name).split('.')[0] for a in node.names}
  return names


def _check_path(path: str, test: str | None) -> str | None:
  """Why a repository path is stale, or None."""
  target = ROOT / path.rstrip('/')
  if '*' in path:
    return None if any(ROOT.glob(path)) else 'matches no file'
  if not target.exists():
    return 'does not exist'
  if test:
    if not target.is_file() or target.suffix != '.py':
      return f'is not a Python file, so it holds no {test}'
    missing = [name for name in test.strip(':').split('::') if name not in _defined_names(target)]
    if missing:
      return f'defines no {missing[0]}'
  return None


def _module_file(dotted: list[str]) -> pathlib.Path | None:
  base = ROOT.joinpath(*dotted)
  if base.with_suffix('.py').is_file():
    return base.with_suffix('.py')
  if (base / '__init__.py').is_file():
    return base / '__init__.py'
  return None


def _check_module(name: str) -> str | None:
  """Why a dotted hybrid_jax name is stale, or None."""
  parts = name.split('.')
  for end in range(len(parts), 0, -1):
    module = _module_file(parts[:end])
    if module:
      break
  else:
    return 'is no module'
  if end == len(parts):
    return None
  attribute = parts[end]
  if attribute in _defined_names(module):
    return None
  if end == 1 or module.name == '__init__.py':
    return f'is no module: {".".join(parts[:end + 1])} is missing'
  return f'is not defined in {module.relative_to(ROOT)}'


def _check_section(page: str, section: str) -> str | None:
  target, section = ROOT / page, ' '.join(section.split())
  if not target.is_file():
    return f'cites {page}, which does not exist'
  if not any(h.startswith(section) for h in headings(target)):
    return f'cites {page}, "{section}": no heading of {page} begins so'
  return None


def _check_link(link: str, fragment: str | None, where: pathlib.Path) -> str | None:
  target = (where.parent / link).resolve() if link else where
  if not target.exists():
    return f'links to {link}, which does not exist'
  if fragment and target.suffix == '.md' and fragment not in {anchor(h) for h in headings(target)}:
    return f'links to {link or where.name}#{fragment}: no heading of {target.relative_to(ROOT)} has that anchor'
  return None


def stale_references() -> list[str]:
  """'file: reference: why' for every reference of the scanned files that does not hold."""
  files = _repo_files()
  folders = {part for f in files for part in f.split('/')[:-1]}
  stale = []
  for path, text in _sources():
    where = path.relative_to(ROOT).as_posix()
    is_test = where.startswith('tests/')
    text = _URL.sub(' ', text)
    for m in _PATH.finditer(text):
      path_ref, test = m.group(1), m.group(2)
      if (_PLACEHOLDER.search(path_ref) or text[m.end(1):m.end(1) + 1] in ('<', '{') or
          (is_test and path_ref.startswith('tests/data/'))):
        continue
      why = _check_path(path_ref, test)
      if why:
        stale.append(f'{where}: {path_ref}{test or ""} {why}')
    for m in _INNER_PATH.finditer(_PATH.sub(' ', text)):
      inner = m.group(1)
      if inner.split('/')[0] not in folders or _PLACEHOLDER.search(inner):
        continue
      if not any(f == inner or f.endswith('/' + inner) for f in files):
        stale.append(f'{where}: {inner} is the end of no file\'s path in the repository')
    for m in _MODULE.finditer(text):
      why = _check_module(m.group(0))
      if why:
        stale.append(f'{where}: {m.group(0)} {why}')
    for page, section in _SECTION.findall(text):
      why = _check_section(page, section)
      if why:
        stale.append(f'{where}: {why}')
    for m in _LOOSE_SECTION.finditer(text):
      stale.append(f'{where}: cites {m.group(1)} as "{m.group(0)}…"; write {m.group(1)}, "Heading"')
    if path.suffix == '.md':
      for link, fragment in _LINK.findall(text):
        if link.startswith(('http:', 'https:', 'mailto:')):
          continue
        why = _check_link(link, fragment, path)
        if why:
          stale.append(f'{where}: {why}')
  return stale


def test_every_path_module_and_section_named_in_docs_and_comments_exists():
  stale = stale_references()
  assert not stale, 'stale references (fix the reference, or the name it points at):\n  ' + '\n  '.join(stale)


def test_the_scan_finds_references_of_every_kind():
  """A pattern that stopped matching would pass the test above by finding nothing."""
  text = '\n'.join(t for _, t in _sources())
  assert len(_PATH.findall(text)) > 200
  assert len([m for m in _PATH.finditer(text) if m.group(2)]) > 50
  assert len(_INNER_PATH.findall(text)) > 10
  assert len(_MODULE.findall(text)) > 30
  assert len(_SECTION.findall(text)) > 10
  assert len(_LINK.findall(text)) > 10


def test_the_rules_catch_what_they_should():
  assert _check_path('docs/KERNELS.md', None) is None
  assert _check_section('BENCHMARKS.md', 'The mini-study') is None
  assert 'no heading' in _check_section('BENCHMARKS.md', 'A section that is not there')
  assert _LOOSE_SECTION.search('as BENCHMARKS.md: ' + '"The mini-study" says')
  assert _check_path('docs/' + 'NO_SUCH_PAGE.md', None) == 'does not exist'  # Split: no page cites it.
  assert _check_path('tests/test_docs_references.py', '::test_the_rules_catch_what_they_should') is None
  assert _check_path('tests/test_docs_references.py', '::no_such_test') == 'defines no no_such_test'
  assert _check_module('hybrid_jax.kernels.platform') is None
  assert _check_module('hybrid_jax.errors.UserError') is None
  assert _check_module('hybrid_jax.no_such_module') is not None
  assert _check_module('hybrid_jax.errors.NoSuchError') is not None
  assert anchor('Context parallelism: S5 on v5p:4x4x4 (2026-12-04)') == 'context-parallelism-s5-on-v5p4x4x4-2026-12-04'
  assert _PATH.search('see <run>/docs/x.md and ../shared/tests/y.py') is None
  assert _PLACEHOLDER.search('hybrid_jax/kernels/<name>/api.py') and _PLACEHOLDER.search('RUN/eval/ppl.json')
  assert not _PLACEHOLDER.search('docs/KERNELS.md') and not _PLACEHOLDER.search('README.md')
