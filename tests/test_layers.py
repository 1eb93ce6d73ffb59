"""The layers flow one way: kernels -> models -> data/train -> eval/analysis/bench/study -> commands. Nothing under
train/ or data/ imports from eval/, analysis/, bench/ or study/ (the caller hands the loop its hooks:
hybrid_jax.standard_hooks; run strings are read by hybrid_jax.config)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
UPPER = ('hybrid_jax.eval', 'hybrid_jax.analysis', 'hybrid_jax.bench', 'hybrid_jax.study')


def _imports(path: pathlib.Path):
  """Every module a file imports, at any depth (function-level imports included)."""
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      yield node.module
      yield from (f'{node.module}.{alias.name}' for alias in node.names)


def upward_imports(package: str):
  return sorted({(str(path.relative_to(ROOT)), name) for path in (ROOT / package.replace('.', '/')).rglob('*.py')
                 for name in _imports(path) if name.startswith(UPPER)})


def test_train_imports_nothing_from_eval_analysis_bench_or_study():
  assert upward_imports('hybrid_jax.train') == []


def test_data_imports_nothing_from_eval_analysis_bench_or_study():
  assert upward_imports('hybrid_jax.data') == []


def test_the_check_sees_an_upward_import():
  """The same scan finds such imports where they are allowed (the wiring module, one layer up)."""
  assert ('hybrid_jax/standard_hooks.py', 'hybrid_jax.eval.perplexity') in {
      (str(p.relative_to(ROOT)), n) for p in [ROOT / 'hybrid_jax' / 'standard_hooks.py'] for n in _imports(p)}
