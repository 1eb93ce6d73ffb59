"""Benchmark programs (`python -m hybrid_jax bench NAME`): each prints a table and can write JSON.

Benchmarks are programs, never timed tests: timings depend on the machine and are recorded in BENCHMARKS.md.
"""

import importlib

from hybrid_jax import command_line

BENCHMARKS = {'attention': 'hybrid_jax.bench.attention', 'scan': 'hybrid_jax.bench.scan',
              'decode': 'hybrid_jax.bench.decode', 'step': 'hybrid_jax.bench.step',
              'data': 'hybrid_jax.bench.data'}


def main(argv) -> int:
  """`python -m hybrid_jax bench NAME [args]`: runs one benchmark program."""
  parser = command_line.ArgumentParser(prog='python -m hybrid_jax bench', description=__doc__.splitlines()[0])
  parser.add_argument('name', metavar='NAME', choices=list(BENCHMARKS),
                      help=f'the benchmark: {", ".join(BENCHMARKS)} (NAME --help lists its flags)')
  parser.add_argument('args', nargs='...', help="the benchmark's flags")
  args = parser.parse_args(argv)
  return importlib.import_module(BENCHMARKS[args.name]).main(args.args) or 0
