"""`python -m hybrid_jax bench NAME [args]`: runs one benchmark program (hybrid_jax.bench)."""

import importlib

from hybrid_jax import bench, command_line


def main(argv) -> int:
  """Time kernels, decoding and the sharded train step (attention, scan, decode, step)."""
  parser = command_line.ArgumentParser(prog='python -m hybrid_jax bench', description=bench.__doc__.splitlines()[0])
  parser.add_argument('name', metavar='NAME', choices=list(bench.BENCHMARKS),
                      help=f'the benchmark: {", ".join(bench.BENCHMARKS)} (NAME --help lists its flags)')
  parser.add_argument('args', nargs='...', help="the benchmark's flags")
  args = parser.parse_args(argv)
  return importlib.import_module(bench.BENCHMARKS[args.name]).main(args.args) or 0
