"""The package's layers hold: every room (a top-level module or sub-package of hybrid_jax/) imports only from its
own floor or below, as docs/ARCHITECTURE.md's table assigns them, and no imports form a circle, between rooms or
between modules, imports inside functions included (read from the source, so none can hide from the test)."""

import ast
import graphlib
import pathlib
import re

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / 'hybrid_jax'


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob('*.py')}


def imports_of(path: pathlib.Path) -> set[str]:
  """The hybrid_jax modules `path` imports anywhere in it (a `from package import name` names the module `name`
  when it is one, else the package)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      for alias in node.names:
        full = f'{node.module}.{alias.name}'
        found.add(full if full in MODULES else node.module)
  return {m for m in found if m in MODULES and m != 'hybrid_jax'}


GRAPH = {name: imports_of(path) - {name} for name, path in MODULES.items()}


def room(module: str) -> str:
  return module.split('.')[1]


def floors() -> dict[str, int]:
  """Room -> floor, from the table of docs/ARCHITECTURE.md."""
  table = {}
  for line in (ROOT / 'docs' / 'ARCHITECTURE.md').read_text().splitlines():
    m = re.match(r'\| (\d+) \| (.+?) \|', line)
    if m:
      for name in re.findall(r'`([\w./]+)`', m.group(2)):
        table[name.removesuffix('/').removesuffix('.py')] = int(m.group(1))
  return table


def test_every_room_has_a_floor_and_imports_nothing_above_it():
  table = floors()
  rooms = {room(m) for m in MODULES if m != 'hybrid_jax'}
  assert rooms <= set(table), f'rooms without a floor in docs/ARCHITECTURE.md: {sorted(rooms - set(table))}'
  assert set(table) <= rooms, f'floors for rooms that do not exist: {sorted(set(table) - rooms)}'
  upward = sorted(f'{m} (floor {table[room(m)]}) imports {i} (floor {table[room(i)]})'
                  for m, targets in GRAPH.items() if m != 'hybrid_jax' for i in targets
                  if table[room(i)] > table[room(m)])
  assert not upward, '\n'.join(upward)


@pytest.mark.parametrize('level', ['rooms', 'modules'])
def test_no_imports_form_a_circle(level):
  if level == 'rooms':
    graph = {}
    for m, targets in GRAPH.items():
      if m != 'hybrid_jax':
        graph.setdefault(room(m), set()).update(room(t) for t in targets if room(t) != room(m))
  else:
    graph = GRAPH
  try:
    tuple(graphlib.TopologicalSorter(graph).static_order())
  except graphlib.CycleError as e:
    pytest.fail(f'an import circle between {level}: {" -> ".join(e.args[1])}')


def test_the_graph_sees_imports_inside_functions():
  """standard_hooks.py imports the analysis callbacks inside a function; the graph must hold that edge."""
  deferred = [m for m, path in MODULES.items() for node in ast.walk(ast.parse(path.read_text()))
              if isinstance(node, ast.FunctionDef) for inner in ast.walk(node)
              if isinstance(inner, ast.ImportFrom) and (inner.module or '').startswith('hybrid_jax')]
  assert deferred
  module = deferred[0]
  path = MODULES[module]
  inner = next(inner for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)
               for inner in ast.walk(node) if isinstance(inner, ast.ImportFrom)
               and (inner.module or '').startswith('hybrid_jax'))
  assert inner.module in GRAPH[module] or any(t.startswith(inner.module) for t in GRAPH[module])
