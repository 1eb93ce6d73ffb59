"""Recurrent-mixer speed: chunked XLA scans against the token-by-token reference, per T.

For linear_scan and gated_delta_rule, reports the median step time after warm-up (compile time apart) of the
forward and the forward+backward pass, the speed-up of each implementation over the first one listed in
--baseline, and the time growth from one T to the next: both forms are O(T), but the reference runs T tiny
sequential steps while the chunked form runs T/C matmul-sized ones. On CPU only these ratios mean much.

  python -m hybrid_jax bench scan --seq-lens 1024,4096,16384 --json out.json
"""

import argparse
import datetime
import json
import sys

import jax
import jax.numpy as jnp

from hybrid_jax.bench import timing
from hybrid_jax.kernels import gated_delta_rule
from hybrid_jax.kernels import linear_scan

KERNELS = {'linear_scan': linear_scan, 'gated_delta_rule': gated_delta_rule}


def _parse(argv):
  p = argparse.ArgumentParser(prog='hybrid_jax bench scan', description=__doc__.split('\n')[0])
  ints = lambda s: [int(x) for x in s.split(',') if x]
  names = lambda s: [x for x in s.split(',') if x]
  p.add_argument('--seq-lens', type=ints, default=[1024, 4096, 16384], help='comma-separated T values')
  p.add_argument('--kernels', type=names, default=list(KERNELS), help=f'comma-separated, of {list(KERNELS)}')
  p.add_argument('--impls', type=names, default=['xla', 'reference'],
                 help='comma-separated implementations')
  p.add_argument('--baseline', default='reference', help='implementation the speed-ups are relative to')
  p.add_argument('--batch', type=int, default=1)
  p.add_argument('--heads', type=int, default=4)
  p.add_argument('--head-dim', type=int, default=64, help='K = V')
  p.add_argument('--chunk-size', type=int, default=64)
  p.add_argument('--dtype', choices=['float32', 'bfloat16'], default='float32')
  p.add_argument('--no-bwd', action='store_true', help='time the forward pass only')
  p.add_argument('--repeats', type=int, default=3, help='fewest timed runs (more until --min-seconds)')
  p.add_argument('--min-seconds', type=float, default=0.5)
  p.add_argument('--json', metavar='OUT', help='write all rows and the run metadata to this JSON file')
  args = p.parse_args(argv)
  unknown = set(args.kernels) - set(KERNELS)
  if unknown:
    p.error(f'unknown kernels {sorted(unknown)}; choose from {list(KERNELS)}')
  return args




def inputs(kernel, t, args):
  """Layer-like inputs: L2-normalised keys, log decays in [-0.1, 0), beta in (0, 1)."""
  b, h, d, dtype = args.batch, args.heads, args.head_dim, jnp.dtype(args.dtype)
  keys = jax.random.split(jax.random.key(0), 6)
  q, k, v, do = (jax.random.normal(key, (b, t, h, d), dtype) for key in keys[:4])
  k = (k / jnp.linalg.norm(k.astype(jnp.float32), axis=-1, keepdims=True)).astype(dtype)
  g = -0.1 * jax.random.uniform(keys[4], (b, t, h))
  extra = (jax.nn.sigmoid(jax.random.normal(keys[5], (b, t, h))),) if kernel == 'gated_delta_rule' else ()
  return (q, k, v, g) + extra, do


def measure(kernel, t, impl, args):
  fn = KERNELS[kernel]
  xs, do = inputs(kernel, t, args)
  fwd = lambda *xs: fn(*xs, chunk_size=args.chunk_size, implementation=impl)

  def fwd_bwd(xs, do):
    (o, s), vjp = jax.vjp(fwd, *xs)
    return vjp((do, jnp.zeros_like(s)))

  row = dict(kernel=kernel, impl=impl, T=t, batch=args.batch, heads=args.heads, head_dim=args.head_dim,
             dtype=args.dtype, chunk_size=args.chunk_size)
  try:
    row['fwd_compile_s'], row['fwd_ms'] = timing.timed(fwd, xs, args.repeats, args.min_seconds)
    if not args.no_bwd:
      row['fwd_bwd_compile_s'], row['fwd_bwd_ms'] = timing.timed(fwd_bwd, (xs, do), args.repeats, args.min_seconds)
  except Exception as e:  # pylint: disable=broad-except  # One failing config must not end the sweep.
    row['error'] = f'{type(e).__name__}: {e}'.split('\n')[0][:200]
  return row


def add_ratios(rows, baseline):
  """Growth from each T to the next (same kernel and impl) and baseline ms / this ms (above 1 is faster)."""
  groups = {}
  for row in rows:
    groups.setdefault((row['kernel'], row['impl']), []).append(row)
  for group in groups.values():
    group.sort(key=lambda r: r['T'])
    for prev, row in zip(group, group[1:]):
      for m in ('fwd', 'fwd_bwd'):
        if f'{m}_ms' in row and f'{m}_ms' in prev:
          row[f'{m}_growth'] = row[f'{m}_ms'] / prev[f'{m}_ms']
  base = {(r['kernel'], r['T']): r for r in rows if r['impl'] == baseline}
  for row in rows:
    ref = base.get((row['kernel'], row['T']), {})
    for m in ('fwd', 'fwd_bwd'):
      if f'{m}_ms' in row and f'{m}_ms' in ref:
        row[f'{m}_speedup'] = ref[f'{m}_ms'] / row[f'{m}_ms']


def table(rows, baseline):
  cols = ['kernel', 'impl', 'T', 'fwd ms', 'fwd growth', f'fwd speed-up vs {baseline}', 'fwd+bwd ms',
          'fwd+bwd growth', f'fwd+bwd speed-up vs {baseline}', 'compile s (fwd, fwd+bwd)']
  f = lambda x, spec: '' if x is None else format(x, spec)
  lines = ['| ' + ' | '.join(cols) + ' |', '|' + ' --- |' * len(cols)]
  for r in rows:
    cells = [r['kernel'], r['impl'], str(r['T'])]
    if 'error' in r:
      cells += [r['error'][:80]] + [''] * (len(cols) - 4)
    else:
      cells += [f(r['fwd_ms'], '.2f'), f(r.get('fwd_growth'), '.2f'), f(r.get('fwd_speedup'), '.1f'),
                f(r.get('fwd_bwd_ms'), '.2f'), f(r.get('fwd_bwd_growth'), '.2f'),
                f(r.get('fwd_bwd_speedup'), '.1f'),
                ', '.join(f'{r[k]:.2f}' for k in ('fwd_compile_s', 'fwd_bwd_compile_s') if k in r)]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def main(argv=None) -> int:
  args = _parse(sys.argv[1:] if argv is None else argv)
  rows = []
  for kernel in args.kernels:
    for impl in args.impls:
      for t in args.seq_lens:
        rows.append(measure(kernel, t, impl, args))
        print(f"{kernel} {impl} T={t}: " + ', '.join(f'{k}={rows[-1][k]:.2f}' for k in ('fwd_ms', 'fwd_bwd_ms')
                                                      if k in rows[-1]) + rows[-1].get('error', ''),
              file=sys.stderr, flush=True)
  add_ratios(rows, args.baseline)
  print(f'backend={jax.default_backend()} devices={jax.device_count()} B={args.batch} H={args.heads} '
        f'K=V={args.head_dim} C={args.chunk_size} dtype={args.dtype}')
  print(table(rows, args.baseline))
  if args.json:
    meta = dict(time=datetime.datetime.now(datetime.timezone.utc).isoformat(), jax=jax.__version__,
                backend=jax.default_backend(), device=str(jax.devices()[0]), argv=list(argv or []))
    with open(args.json, 'w') as fh:
      json.dump(dict(meta=meta, rows=rows), fh, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
