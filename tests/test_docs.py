"""The documentation's references hold: every test docs/CLAIMS.md names exists and runs where it says (the
default tier unless marked `-m e2e`: the end-to-end tier), every README / BENCHMARKS claim row names a check, and every citation of a
docs/ page names a page and section that exist."""

import ast
import re

from tests.conftest import ROOT

CLAIMS = ROOT / 'docs' / 'CLAIMS.md'
_TEST_REF = re.compile(r'(`-m e2e` )?tests/(\w+\.py)::(\w+)')
_DOC_REF = re.compile(r'docs/([A-Z_]+\.md)(?:, "([^"]+)")?')


def _is_e2e(decorators) -> bool:
  return any('mark.e2e' in ast.unparse(d) for d in decorators)


def _test_functions(filename) -> dict[str, bool]:
  """{test function: in the end-to-end tier} of a test module, read without importing it."""
  tree = ast.parse((ROOT / 'tests' / filename).read_text())
  module_e2e = any(isinstance(node, ast.Assign) and 'pytestmark' in ast.unparse(node.targets[0]) and
                    'mark.e2e' in ast.unparse(node.value) for node in tree.body)
  return {node.name: module_e2e or _is_e2e(node.decorator_list) for node in tree.body
          if isinstance(node, ast.FunctionDef) and node.name.startswith('test_')}


def _claim_rows():
  rows = []
  for line in CLAIMS.read_text().splitlines():
    cells = [c.strip() for c in line.strip().strip('|').split('|')]
    if line.startswith('|') and len(cells) == 2 and cells[0] not in ('claim', '---'):
      rows.append(cells)
  return rows


def test_every_test_the_claims_table_names_exists_and_runs_where_it_says():
  refs = _TEST_REF.findall(CLAIMS.read_text())
  assert len(refs) > 50
  for e2e_marker, filename, name in refs:
    functions = _test_functions(filename)
    assert name in functions, f'docs/CLAIMS.md names tests/{filename}::{name}, which does not exist'
    assert functions[name] == bool(e2e_marker), (
        f'tests/{filename}::{name} is {"" if functions[name] else "not "}in the end-to-end tier; docs/CLAIMS.md '
        f'must say "`-m e2e`" before exactly the end-to-end ones')


def test_every_claim_row_names_a_test_or_says_why_not():
  rows = _claim_rows()
  assert len(rows) > 40
  for claim, checked_by in rows:
    assert _TEST_REF.findall(checked_by) or 'measurement' in checked_by or '.ci/run' in checked_by, claim


def _cited_files():
  for pattern in ('hybrid_jax/**/*.py', 'tests/*.py', 'scripts/**/*.sh', 'launch/*.py', '*.md', 'docs/*.md'):
    yield from ROOT.glob(pattern)


def test_citations_of_docs_pages_name_pages_and_sections_that_exist():
  cited = 0
  for path in sorted(set(_cited_files())):
    for page, section in _DOC_REF.findall(path.read_text()):
      cited += 1
      target = ROOT / 'docs' / page
      assert target.is_file(), f'{path.relative_to(ROOT)} cites docs/{page}, which does not exist'
      if section:
        headings = [h.lstrip('#').strip() for h in target.read_text().splitlines() if h.startswith('#')]
        assert any(h.startswith(section) for h in headings), (
            f'{path.relative_to(ROOT)} cites docs/{page}, "{section}": no such section')
  assert cited > 10
