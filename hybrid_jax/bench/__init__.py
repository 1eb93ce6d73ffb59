"""Benchmark programs (`python -m hybrid_jax bench NAME`): each prints a table and can write JSON.

Benchmarks are programs, never timed tests: timings depend on the machine and are recorded in BENCHMARKS.md. Each
program's `run(args)` takes its settings as attributes of `args`; hybrid_jax/commands/bench.py parses them from
the command line.
"""
