"""Benchmark programs (`python -m hybrid_jax bench NAME`): each prints a table and can write JSON.

Benchmarks are programs, never timed tests: timings depend on the machine and are recorded in BENCHMARKS.md.
"""

import importlib

BENCHMARKS = {'attention': 'hybrid_jax.bench.attention', 'scan': 'hybrid_jax.bench.scan',
              'decode': 'hybrid_jax.bench.decode', 'step': 'hybrid_jax.bench.step',
              'data': 'hybrid_jax.bench.data'}


def main(argv) -> int:
  """`python -m hybrid_jax bench NAME [args]`: runs one benchmark program."""
  if not argv or argv[0] not in BENCHMARKS:
    print(f'usage: python -m hybrid_jax bench {{{",".join(BENCHMARKS)}}} [--help]')
    return 0 if argv and argv[0] in ('-h', '--help') else 2
  return importlib.import_module(BENCHMARKS[argv[0]]).main(argv[1:]) or 0
