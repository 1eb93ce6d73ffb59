"""Attention speed: forward and forward+backward per (T, window, implementation).

Reports the median step time after warm-up (compile time apart), model TFLOP/s from the visible-pair count
(fwd 4*B*Hq*D*P, fwd+bwd 3.5x that), model GB/s (each tensor moved once), and the time growth from one T to the
next at the same window: about 2x per doubling for a sliding window (O(T*w)), about 4x for full causal (O(T^2)).
On CPU only these ratios mean much; absolute speed needs a GPU or TPU.

  python -m hybrid_jax.bench.attention --seq-lens 2048,4096 --windows 128,full --json out.json
"""

import argparse
import datetime
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_jax.kernels import attention

# Per backend: batch, heads, head dim, dtype, repeats. CPU defaults finish in a minute or two.
_DEFAULTS = {
    'cpu': dict(batch=1, heads=4, head_dim=64, dtype='float32', repeats=5),
    'gpu': dict(batch=1, heads=16, head_dim=128, dtype='bfloat16', repeats=20),
    'tpu': dict(batch=1, heads=16, head_dim=128, dtype='bfloat16', repeats=20),
}


def _parse(argv):
  p = argparse.ArgumentParser(prog='hybrid_jax bench attention', description=__doc__.split('\n')[0])
  ints = lambda s: [int(x) for x in s.split(',') if x]
  p.add_argument('--seq-lens', type=ints, default=[2048, 4096, 8192], help='comma-separated T values')
  p.add_argument('--windows', default='128,full', help="comma-separated windows; 'full' = full causal")
  p.add_argument('--heads', type=int, help='query heads (default: 4 on CPU, 16 on GPU/TPU)')
  p.add_argument('--kv-heads', type=int, help='kv heads (default: --heads)')
  p.add_argument('--head-dim', type=int, help='head dim (default: 64 on CPU, 128 on GPU/TPU)')
  p.add_argument('--batch', type=int, help='batch size (default 1)')
  p.add_argument('--dtype', choices=['float32', 'bfloat16', 'float16'], help='default: float32 on CPU, else bf16')
  p.add_argument('--impls', default='xla', help='comma-separated implementations; the first is the baseline')
  p.add_argument('--repeats', type=int,
                 help='fewest timed runs per measurement (more until 1 s); median reported (default 5 CPU, 20 else)')
  p.add_argument('--json', metavar='OUT', help='write all rows and the run metadata to this JSON file')
  args = p.parse_args(argv)
  for key, value in _DEFAULTS.get(jax.default_backend(), _DEFAULTS['gpu']).items():
    if getattr(args, key) is None:
      setattr(args, key, value)
  args.kv_heads = args.kv_heads or args.heads
  args.windows = [None if w in ('full', 'none', 'None') else int(w) for w in args.windows.split(',') if w]
  args.impls = [i for i in args.impls.split(',') if i]
  return args


def visible_pairs(t, window):
  """Number of (query, key) pairs a causal window of `window` keys (None = full) lets through."""
  w = t if window is None else min(window, t)
  return w * (w + 1) // 2 + (t - w) * w


def _timed(fn, args, repeats, min_seconds=1.0):
  """(compile seconds, median milliseconds) of jit(fn) on args, after one warm-up call.

  Fast configurations run more than `repeats` times (until min_seconds) so the median is not one noisy sample.
  """
  start = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - start
  jax.block_until_ready(compiled(*args))
  times = []
  while len(times) < repeats or (sum(times) < min_seconds and len(times) < 1000):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
  return compile_s, 1e3 * statistics.median(times)


def measure(t, window, impl, args):
  """One row: fwd and fwd+bwd timings and model rates for this (T, window, implementation)."""
  dtype = jnp.dtype(args.dtype)
  keys = jax.random.split(jax.random.key(0), 4)
  shapes = [(args.batch, t, h, args.head_dim) for h in (args.heads, args.kv_heads, args.kv_heads, args.heads)]
  q, k, v, do = (jax.random.normal(key, s, dtype) for key, s in zip(keys, shapes))
  fwd = lambda q, k, v: attention(q, k, v, window=window, implementation=impl)

  def fwd_bwd(q, k, v, do):
    _, vjp = jax.vjp(fwd, q, k, v)
    return vjp(do)

  pairs = args.batch * visible_pairs(t, window)
  flops = 4 * args.heads * args.head_dim * pairs
  io = dtype.itemsize * args.batch * t * args.head_dim * (2 * args.heads + 2 * args.kv_heads)
  row = dict(impl=impl, T=t, window=window, batch=args.batch, heads=args.heads, kv_heads=args.kv_heads,
             head_dim=args.head_dim, dtype=args.dtype, pairs=pairs, fwd_flops=flops, fwd_bwd_flops=3.5 * flops)
  try:
    row['fwd_compile_s'], row['fwd_ms'] = _timed(fwd, (q, k, v), args.repeats)
    row['fwd_bwd_compile_s'], row['fwd_bwd_ms'] = _timed(fwd_bwd, (q, k, v, do), args.repeats)
  except Exception as e:  # pylint: disable=broad-except  # One failing config must not end the sweep.
    row['error'] = f'{type(e).__name__}: {e}'.split('\n')[0][:200]
    return row
  row['fwd_tflops'] = flops / row['fwd_ms'] / 1e9
  row['fwd_bwd_tflops'] = 3.5 * flops / row['fwd_bwd_ms'] / 1e9
  row['fwd_gbs'] = io / row['fwd_ms'] / 1e6
  row['fwd_bwd_gbs'] = 3 * io / row['fwd_bwd_ms'] / 1e6  # Model: fwd tensors, plus o, do, dq, dk, dv.
  return row


def _add_ratios(rows, baseline):
  """Growth of time from each T to the next (same window and impl), and speed relative to the baseline impl."""
  by_key = {}
  for row in rows:
    by_key.setdefault((row['impl'], row['window']), []).append(row)
  for group in by_key.values():
    group.sort(key=lambda r: r['T'])
    for prev, row in zip(group, group[1:]):
      for m in ('fwd', 'fwd_bwd'):
        if f'{m}_ms' in row and f'{m}_ms' in prev:
          row[f'{m}_growth'] = row[f'{m}_ms'] / prev[f'{m}_ms']
  base = {(r['T'], r['window']): r for r in rows if r['impl'] == baseline}
  for row in rows:
    ref = base.get((row['T'], row['window']), {})
    for m in ('fwd', 'fwd_bwd'):
      if f'{m}_ms' in row and f'{m}_ms' in ref:
        row[f'{m}_vs_{baseline}'] = ref[f'{m}_ms'] / row[f'{m}_ms']


def _table(rows, baseline, multi):
  cols = ['impl', 'T', 'window', 'fwd ms', 'fwd TF/s', 'fwd growth', 'fwd+bwd ms', 'fwd+bwd TF/s',
          'fwd+bwd growth', 'compile s (fwd, fwd+bwd)']
  if multi:
    cols += [f'fwd speed vs {baseline}', f'fwd+bwd speed vs {baseline}']
  f = lambda x, spec: '' if x is None else format(x, spec)
  lines = ['| ' + ' | '.join(cols) + ' |', '|' + ' --- |' * len(cols)]
  for r in rows:
    if 'error' in r:
      cells = [r['impl'], str(r['T']), str(r['window'] or 'full'), r['error'][:80]] + [''] * (len(cols) - 4)
    else:
      cells = [r['impl'], str(r['T']), str(r['window'] or 'full'), f(r['fwd_ms'], '.2f'), f(r['fwd_tflops'], '.3f'),
               f(r.get('fwd_growth'), '.2f'), f(r['fwd_bwd_ms'], '.2f'), f(r['fwd_bwd_tflops'], '.3f'),
               f(r.get('fwd_bwd_growth'), '.2f'), f"{r['fwd_compile_s']:.2f}, {r['fwd_bwd_compile_s']:.2f}"]
      if multi:
        cells += [f(r.get(f'fwd_vs_{baseline}'), '.2f'), f(r.get(f'fwd_bwd_vs_{baseline}'), '.2f')]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def main(argv=None):
  args = _parse(sys.argv[1:] if argv is None else argv)
  device = jax.devices()[0]
  meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
              jax=jax.__version__, numpy=np.__version__, backend=jax.default_backend(),
              device=getattr(device, 'device_kind', str(device)), device_count=jax.device_count(),
              args={k: v for k, v in vars(args).items() if k != 'json'})
  print(f"attention bench: {meta['device']} ({meta['backend']}), jax {meta['jax']}, B={args.batch} "
        f'Hq={args.heads} Hkv={args.kv_heads} D={args.head_dim} {args.dtype}, median of {args.repeats}', flush=True)
  rows = []
  for impl in args.impls:
    for window in args.windows:
      for t in args.seq_lens:
        rows.append(measure(t, window, impl, args))
        r = rows[-1]
        print(f"  {impl} T={t} window={window or 'full'}: "
              + (r['error'] if 'error' in r else f"fwd {r['fwd_ms']:.2f} ms, fwd+bwd {r['fwd_bwd_ms']:.2f} ms"),
              flush=True)
  _add_ratios(rows, args.impls[0])
  print(_table(rows, args.impls[0], len(args.impls) > 1))
  print('growth: time ratio to the previous T at the same window (x2 T: ~2 means O(T*w), ~4 means O(T^2)).')
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print(f'wrote {args.json}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
