"""Benchmark programs (`python -m hybrid_jax bench NAME`): each prints a table and can write JSON.

Benchmarks are programs, never timed tests: timings depend on the machine and are recorded in BENCHMARKS.md.
"""

BENCHMARKS = {'attention': 'hybrid_jax.bench.attention', 'scan': 'hybrid_jax.bench.scan',
              'decode': 'hybrid_jax.bench.decode', 'step': 'hybrid_jax.bench.step',
              'data': 'hybrid_jax.bench.data'}
