"""Attention speed: forward and forward+backward per (T, window, implementation).

Reports the median step time after warm-up (compile time apart), model TFLOP/s from the visible-pair count
(fwd 4*B*Hq*D*P, fwd+bwd 3.5x that), model GB/s (each tensor moved once), the time growth from one T to the
next at the same window (about 2x per doubling for a sliding window, O(T*w); about 4x for full causal, O(T^2)),
the speed relative to each anchor implementation (cudnn, xla) and the fraction of a bf16 GEMM ceiling, both
measured in the same run. On CPU only ratios mean much; absolute speed needs a GPU or TPU. The GPU defaults are
the anchor shapes of docs/BENCHMARKING.md: bf16, 16 heads of 128, 32,768 tokens per call (8x4K, 1x32K), windows
128/512/2048/full.

--documents N[,N...] also times every call on rows of packed documents of N tokens (segment ids, as training with
data.packing='documents' calls it; N = T is one document per row, the masks' own overhead) right after the
unmasked call: those rows carry documents=N, count only the pairs inside a document (the work a kernel that skips
other documents' blocks has left), and report the speed against the unmasked call of the same implementation, T
and window.

  python -m hybrid_jax bench attention --seq-lens 2048,4096 --windows 128,full --json out.json
  python -m hybrid_jax bench attention --seq-lens 8192 --tokens 32768 --impls pallas_gpu --documents 512,8192
"""

import datetime
import sys

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_jax.bench import documents as bench_documents, timing
from hybrid_jax.kernels import attention

# Per backend defaults of what the flags leave unset, written as the flags are. CPU ones finish in a minute or two;
# GPU ones are the anchor shapes (docs/BENCHMARKING.md).
DEFAULTS = {
    'cpu': dict(seq_lens='2048,4096,8192', windows='128,full', impls='xla', batch=1, heads=4, head_dim=64,
                dtype='float32', repeats=5, gemm=1024),
    'gpu': dict(seq_lens='4096,32768', windows='128,512,2048,full', impls='pallas_gpu,cudnn,xla', tokens=32768,
                heads=16, head_dim=128, dtype='bfloat16', repeats=20, gemm=8192),
    'tpu': dict(seq_lens='4096,32768', windows='128,512,2048,full', impls='pallas_tpu,xla', tokens=32768,
                heads=16, head_dim=128, dtype='bfloat16', repeats=20, gemm=8192),
}
_ANCHORS = ('cudnn', 'xla')  # Speed ratios are reported against each of these that was measured.


def visible_pairs(t, window):
  """Number of (query, key) pairs a causal window of `window` keys (None = full) lets through."""
  w = t if window is None else min(window, t)
  return w * (w + 1) // 2 + (t - w) * w




def batch_for(t, args):
  return max(1, args.tokens // t) if args.tokens else args.batch


def ceilings(args):
  """Same-run hardware ceilings: an n x n x n GEMM in the bench dtype (TF/s) and an elementwise copy (GB/s)."""
  dtype, n = jnp.dtype(args.dtype), args.gemm
  a, b = (jax.random.normal(key, (n, n), dtype) for key in jax.random.split(jax.random.key(1), 2))
  _, gemm_ms = timing.timed(lambda a, b: a @ b, (a, b), args.repeats, args.min_seconds)
  x = jnp.ones((n * n * 4,), dtype)
  _, copy_ms = timing.timed(lambda x: x * 2, (x,), args.repeats, args.min_seconds)
  return dict(gemm_n=n, gemm_ms=gemm_ms, gemm_tflops=2 * n**3 / gemm_ms / 1e9,
              copy_gbs=2 * x.size * dtype.itemsize / copy_ms / 1e6)


def fallback_of(impl, q, window, segment_ids):
  """What a call of `impl` with documents runs instead, where the dispatcher falls back (a GPU whose cuDNN cannot
  run packed documents, or rows of more documents than cuDNN's packed layout holds); None where `impl` runs."""
  from hybrid_jax.kernels import platform, segments  # pylint: disable=import-outside-toplevel
  from hybrid_jax.kernels.attention import api, cudnn_documents  # pylint: disable=import-outside-toplevel
  if impl != 'cudnn' or segment_ids is None or platform.target() != 'gpu':
    return None
  ran = api._auto(q, window, 0, segment_ids, preferred='cudnn')  # pylint: disable=protected-access
  if ran != impl:
    return ran
  most = int(np.max(segments.runs(segment_ids)[:, -1])) + 1
  return 'pallas_gpu' if most > cudnn_documents.DEFAULT_MAX_DOCUMENTS else None


def measure(t, window, impl, args, documents=None):
  """One row: fwd and fwd+bwd timings and model rates for this (T, window, implementation), on rows of documents
  of `documents` tokens (None: unmasked)."""
  dtype = jnp.dtype(args.dtype)
  batch = batch_for(t, args)
  keys = jax.random.split(jax.random.key(0), 4)
  shapes = [(batch, t, h, args.head_dim) for h in (args.heads, args.kv_heads, args.kv_heads, args.heads)]
  q, k, v, do = (jax.random.normal(key, s, dtype) for key, s in zip(keys, shapes))
  # The segment ids are an argument of the timed program, as in training (not a constant folded into it).
  seg = None if documents is None else jnp.asarray(bench_documents.segment_ids(batch, t, documents))
  fwd = lambda q, k, v, seg: attention(q, k, v, window=window, segment_ids=seg, implementation=impl)

  def fwd_bwd(q, k, v, seg, do):
    _, vjp = jax.vjp(lambda q, k, v: fwd(q, k, v, seg), q, k, v)
    return vjp(do)

  pairs = batch * (visible_pairs(t, window) if documents is None
                   else bench_documents.visible_pairs(t, window, documents))
  flops = 4 * args.heads * args.head_dim * pairs
  io = dtype.itemsize * batch * t * args.head_dim * (2 * args.heads + 2 * args.kv_heads)
  row = dict(impl=impl, T=t, window=window, documents=documents, batch=batch, heads=args.heads,
             kv_heads=args.kv_heads, head_dim=args.head_dim, dtype=args.dtype, pairs=pairs, fwd_flops=flops,
             fwd_bwd_flops=3.5 * flops)

  def run(row):
    ran = fallback_of(impl, q, window, seg)
    if ran:
      row['ran'] = ran
      row['note'] = f"{impl} cannot run these documents here: the call runs {ran} instead (the dispatcher's fallback)"
    row['fwd_compile_s'], row['fwd_ms'] = timing.timed(fwd, (q, k, v, seg), args.repeats, args.min_seconds)
    row['fwd_tflops'] = flops / row['fwd_ms'] / 1e9
    row['fwd_gbs'] = io / row['fwd_ms'] / 1e6
    row['fwd_bwd_compile_s'], row['fwd_bwd_ms'] = timing.timed(fwd_bwd, (q, k, v, seg, do), args.repeats,
                                                               args.min_seconds)
    row['fwd_bwd_tflops'] = 3.5 * flops / row['fwd_bwd_ms'] / 1e9
    row['fwd_bwd_gbs'] = 3 * io / row['fwd_bwd_ms'] / 1e6  # Model: fwd tensors, plus o, do, dq, dk, dv.

  return timing.measured(row, args.timeout, run)


def _add_ratios(rows, baselines, ceiling):
  """Growth of time from each T to the next (same window, impl and documents), speed relative to each baseline impl
  (baseline ms / this ms: above 1 is faster), a masked row's speed relative to the unmasked call of its impl, T and
  window (`*_vs_unmasked`), and the fraction of the GEMM ceiling reached."""
  by_key = {}
  for row in rows:
    by_key.setdefault((row['impl'], row['window'], row.get('documents')), []).append(row)
  for group in by_key.values():
    group.sort(key=lambda r: r['T'])
    for prev, row in zip(group, group[1:]):
      for m in ('fwd', 'fwd_bwd'):
        if f'{m}_ms' in row and f'{m}_ms' in prev:
          row[f'{m}_growth'] = row[f'{m}_ms'] / prev[f'{m}_ms']
  for baseline in baselines:
    base = {(r['T'], r['window'], r.get('documents')): r for r in rows if r['impl'] == baseline}
    for row in rows:
      ref = base.get((row['T'], row['window'], row.get('documents')), {})
      for m in ('fwd', 'fwd_bwd'):
        if f'{m}_ms' in row and f'{m}_ms' in ref:
          row[f'{m}_vs_{baseline}'] = ref[f'{m}_ms'] / row[f'{m}_ms']
  unmasked = {(r['impl'], r['T'], r['window']): r for r in rows if r.get('documents') is None}
  for row in rows:
    ref = unmasked.get((row['impl'], row['T'], row['window']), {}) if row.get('documents') else {}
    for m in ('fwd', 'fwd_bwd'):
      if f'{m}_ms' in row and f'{m}_ms' in ref:
        row[f'{m}_vs_unmasked'] = ref[f'{m}_ms'] / row[f'{m}_ms']
  for row in rows:
    for m in ('fwd', 'fwd_bwd'):
      if f'{m}_tflops' in row:
        row[f'{m}_of_gemm'] = row[f'{m}_tflops'] / ceiling['gemm_tflops']


def suggested_gpu_table(rows):
  """Per window bucket of the dispatcher, the faster of pallas_gpu and cudnn (fwd+bwd, largest T measured)."""
  from hybrid_jax.kernels.attention import api  # pylint: disable=import-outside-toplevel
  best = {}
  for row in sorted(rows, key=lambda r: r['T']):
    if row['impl'] in ('pallas_gpu', 'cudnn') and 'fwd_bwd_ms' in row and row.get('documents') is None:
      key = (api._bucket(row['window'], row['T']), row['T'])  # pylint: disable=protected-access
      if key not in best or row['fwd_bwd_ms'] < best[key][1]:
        best[key] = (row['impl'], row['fwd_bwd_ms'])
  table = {}
  for (bucket, _), (impl, _) in sorted(best.items(), key=lambda kv: kv[0][1]):
    table[bucket] = impl  # Largest T last, so it wins.
  return table


def _table(rows, baselines):
  cols = ['impl', 'B', 'T', 'window', 'docs', 'fwd ms', 'fwd TF/s', 'fwd growth', 'fwd+bwd ms', 'fwd+bwd TF/s',
          'fwd+bwd growth', 'compile s (fwd, fwd+bwd)']
  for baseline in baselines:
    cols += [f'fwd speed vs {baseline}', f'fwd+bwd speed vs {baseline}']
  masked = any(r.get('documents') for r in rows)
  if masked:
    cols += ['fwd speed vs unmasked', 'fwd+bwd speed vs unmasked']
  cols += ['fwd+bwd / GEMM']
  f = lambda x, spec: '' if x is None else format(x, spec)
  lines = ['| ' + ' | '.join(cols) + ' |', '|' + ' --- |' * len(cols)]
  for r in rows:
    head = [r['impl'], str(r['batch']), str(r['T']), str(r['window'] or 'full'), str(r.get('documents') or '')]
    if 'error' in r:
      cells = head + [timing.headline(r['error'], 80)]
      cells += [''] * (len(cols) - len(cells))
    else:
      cells = head + [f(r['fwd_ms'], '.3f'), f(r['fwd_tflops'], '.3f'),
                      f(r.get('fwd_growth'), '.2f'), f(r['fwd_bwd_ms'], '.3f'), f(r['fwd_bwd_tflops'], '.3f'),
                      f(r.get('fwd_bwd_growth'), '.2f'), f"{r['fwd_compile_s']:.2f}, {r['fwd_bwd_compile_s']:.2f}"]
      for baseline in baselines:
        cells += [f(r.get(f'fwd_vs_{baseline}'), '.2f'), f(r.get(f'fwd_bwd_vs_{baseline}'), '.2f')]
      if masked:
        cells += [f(r.get('fwd_vs_unmasked'), '.2f'), f(r.get('fwd_bwd_vs_unmasked'), '.2f')]
      cells.append(f(r.get('fwd_bwd_of_gemm'), '.3f'))
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def run(args) -> int:
  """Measures every implementation, window and T of `args` (the flags of `bench attention`, one attribute each)."""
  device = jax.devices()[0]
  meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
              jax=jax.__version__, numpy=np.__version__, backend=jax.default_backend(),
              device=getattr(device, 'device_kind', str(device)), device_count=jax.device_count(),
              args={k: v for k, v in vars(args).items() if k != 'json'})
  batch = f'{args.tokens} tokens per call' if args.tokens else f'B={args.batch}'
  print(f"attention bench: {meta['device']} ({meta['backend']}), jax {meta['jax']}, {batch} "
        f'Hq={args.heads} Hkv={args.kv_heads} D={args.head_dim} {args.dtype}, median of {args.repeats}', flush=True)
  meta['ceiling'] = ceiling = ceilings(args)
  print(f"  ceilings: {args.dtype} GEMM {ceiling['gemm_n']}^3 {ceiling['gemm_tflops']:.1f} TF/s, "
        f"copy {ceiling['copy_gbs']:.0f} GB/s", flush=True)
  report = timing.Report(args.json, meta)
  for impl in args.impls:
    for window in args.windows:
      for t in args.seq_lens:
        for documents in (None, *(args.documents or ())):  # Unmasked first.
          r = measure(t, window, impl, args, documents)
          result = (timing.headline(r['error']) if 'error' in r
                    else f"fwd {r['fwd_ms']:.2f} ms (compile {r['fwd_compile_s']:.1f} s), fwd+bwd "
                    f"{r['fwd_bwd_ms']:.2f} ms (compile {r['fwd_bwd_compile_s']:.1f} s)")
          masked = f' documents of {documents}' if documents else ''
          report.add(r, f"  {impl} T={t} window={window or 'full'}{masked}: {result}")
  rows = report.rows()
  baselines = [a for a in _ANCHORS if a in args.impls] or args.impls[:1]
  _add_ratios(rows, baselines, ceiling)
  print(_table(rows, baselines))
  print('growth: time ratio to the previous T at the same window (x2 T: ~2 means O(T*w), ~4 means O(T^2)); '
        'speed vs X: X ms / this ms (above 1: faster than X)' + (
            '; docs: rows of documents of that many tokens; vs unmasked: the same call without documents'
            if args.documents else '') + '.')
  if {'pallas_gpu', 'cudnn'} <= set(args.impls):
    meta['suggested_gpu_table'] = {str(k): v for k, v in suggested_gpu_table(rows).items()}
    print(f"suggested _GPU_BY_WINDOW (faster fwd+bwd per window bucket): {meta['suggested_gpu_table']}")
  report.write()
  if args.json:
    print(f'wrote {args.json}')
  failed = [r for r in rows if 'error' in r]
  if failed:
    print(f'attention bench: {len(failed)} of {len(rows)} measurements failed (whole errors in the JSON rows)',
          file=sys.stderr)
  return 1 if failed else 0

