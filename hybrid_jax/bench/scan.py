"""Recurrent-mixer speed: linear_scan and gated_delta_rule per implementation and T, optionally against fla.

Reports the median step time after warm-up (compile time apart) of the forward and the forward+backward pass,
model TFLOP/s (chunk FLOP model of docs/KERNELS.md: fwd 2C(K+V) + 4KV per token and head for the scalar-decay
scan; the delta rule adds K K^T, the inverse, W, U and W S; fwd+bwd counted as 3x fwd), model GB/s (each input and output
tensor moved once: fwd q, k, v, o; fwd+bwd also do, dq, dk, dv) and the fraction of the same-run copy bandwidth,
the speed-up over --baseline measured in the same run, the time growth from one T to the next, and where fla is
importable (`--fla`; PyTorch/Triton, GPU only) the same-run ratio to fla's chunk_simple_gla / chunk_lightning_attn
(linear_scan) and chunk_gated_delta_rule. On CPU only the ratios mean much. The GPU defaults are the anchor
shapes of docs/BENCHMARKING.md: bf16, B=4, H=16, K=V=128, T in {2K, 8K, 32K}.

--parity first checks values and every gradient of the Pallas kernel of this backend (and the automatic choice)
against the float64 reference at the docs/KERNELS.md tolerances, compiled on the device (not interpret mode),
for the cases of `parity_cases` (within --parity-budget seconds). Every row is printed and written to --json the
moment it is measured, compile time apart from run time, each measurement under its own --timeout.

--documents N[,N...] also times every implementation on rows of packed documents of N tokens (segment ids: the state
restarts at each document, as training with data.packing='documents' runs the scans) right after its unmasked
call: those rows carry documents=N and their speed against the unmasked call; with --fla, fla's varlen form of the
same documents (`cu_seqlens` over the batch flattened to one row) is timed for the kernels that take it
(FLA_DOCUMENTS).

  python -m hybrid_jax bench scan --seq-lens 1024,4096,16384 --json out.json
  python -m hybrid_jax bench scan --parity --fla --json out.json          (GPU machine: scripts/device/measure.sh)
  python -m hybrid_jax bench scan --seq-lens 8192 --documents 512 --json out.json
"""

import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_jax.bench import documents as bench_documents, timing
from hybrid_jax.bench.attention import ceilings
from hybrid_jax.bench.scan_parity import KERNELS, parity

# Per backend defaults of what the flags leave unset, written as the flags are.
DEFAULTS = {
    'cpu': dict(seq_lens='1024,4096,16384', impls='xla,reference', baseline='reference', batch=1, heads=4,
                head_dim=64, dtype='float32', repeats=3, gemm=1024),
    'gpu': dict(seq_lens='2048,8192,32768', impls='pallas_gpu,xla', baseline='xla', batch=4, heads=16,
                head_dim=128, dtype='bfloat16', repeats=20, gemm=8192),
    'tpu': dict(seq_lens='2048,8192,32768', impls='pallas_tpu,xla', baseline='xla', batch=4, heads=16,
                head_dim=128, dtype='bfloat16', repeats=20, gemm=8192),
}
FLA = {'linear_scan': ('chunk_simple_gla', 'chunk_lightning_attn'), 'gated_delta_rule': ('chunk_gated_delta_rule',)}
FLA_DOCUMENTS = ('chunk_simple_gla', 'chunk_gated_delta_rule')  # fla kernels timed on documents (cu_seqlens).
FLA_NOTE = ('fla backward on Hopper with Triton < 3.7.1 is refused upstream (a miscompile); '
            'fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 was forced True for timing only')


def model_flops(kernel, t, args):
  """Forward FLOPs of the chunked form (docs/KERNELS.md, "FLOP model"); the delta rule adds K K^T (2CK), the
  inverse (~2C^2/3), W and U (2C(K+V)) and W S (2KV) per token and head."""
  c, d = args.chunk_size, args.head_dim
  per_token = 2 * c * (d + d) + 4 * d * d
  if kernel == 'gated_delta_rule':
    per_token += 2 * c * d + 2 * c * c // 3 + 2 * c * (d + d) + 2 * d * d
  return args.batch * t * args.heads * per_token


def model_bytes(kernel, t, args, bwd):
  """Each tensor moved once: q, k, v, o (+ do, dq, dk, dv) and the per-token gates (and beta)."""
  tokens = args.batch * t * args.heads
  gates = 2 if kernel == 'gated_delta_rule' else 1
  return tokens * (args.head_dim * jnp.dtype(args.dtype).itemsize * (8 if bwd else 4) + 4 * gates * (2 if bwd else 1))


def inputs(kernel, t, args):
  """Layer-like inputs: L2-normalised keys, log decays in [-0.1, 0), beta in (0, 1)."""
  b, h, d, dtype = args.batch, args.heads, args.head_dim, jnp.dtype(args.dtype)
  keys = jax.random.split(jax.random.key(0), 6)
  q, k, v, do = (jax.random.normal(key, (b, t, h, d), dtype) for key in keys[:4])
  k = (k / jnp.linalg.norm(k.astype(jnp.float32), axis=-1, keepdims=True)).astype(dtype)
  g = -0.1 * jax.random.uniform(keys[4], (b, t, h))
  extra = (jax.nn.sigmoid(jax.random.normal(keys[5], (b, t, h))),) if kernel == 'gated_delta_rule' else ()
  return (q, k, v, g) + extra, do


def _row(kernel, impl, t, args, documents=None):
  return dict(kernel=kernel, impl=impl, T=t, documents=documents, batch=args.batch, heads=args.heads,
              head_dim=args.head_dim, dtype=args.dtype, chunk_size=args.chunk_size)


def measure(kernel, t, impl, args, documents=None):
  """One row: fwd (and fwd+bwd) of `kernel` by `impl`, on rows of documents of `documents` tokens (None:
  unmasked)."""
  fn = KERNELS[kernel]
  xs, do = inputs(kernel, t, args)
  # The segment ids are an argument of the timed program, as in training (not a constant folded into it).
  seg = None if documents is None else jnp.asarray(bench_documents.segment_ids(args.batch, t, documents))
  fwd = lambda xs, seg: fn(*xs, segment_ids=seg, chunk_size=args.chunk_size, implementation=impl)

  def fwd_bwd(xs, seg, do):
    (_, s), vjp = jax.vjp(lambda *xs: fwd(xs, seg), *xs)
    return vjp((do, jnp.zeros_like(s)))

  def run(row):
    row['fwd_compile_s'], row['fwd_ms'] = timing.timed(fwd, (xs, seg), args.repeats, args.min_seconds)
    if not args.no_bwd:
      row['fwd_bwd_compile_s'], row['fwd_bwd_ms'] = timing.timed(fwd_bwd, (xs, seg, do), args.repeats,
                                                                 args.min_seconds)

  return timing.measured(_row(kernel, impl, t, args, documents), args.timeout, run)


def _torch_ms(fn, repeats, min_seconds):
  """(first call seconds: Triton compiles there, median ms after it)."""
  import torch  # pylint: disable=import-outside-toplevel
  start = time.perf_counter()
  fn()
  torch.cuda.synchronize()
  first_s = time.perf_counter() - start
  times = []
  while len(times) < repeats or (sum(times) < min_seconds and len(times) < 1000):
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - start)
  return first_s, 1e3 * statistics.median(times)


def fla_cu_seqlens(batch, t, documents):
  """fla's varlen boundaries of `batch` rows of `t` tokens cut into documents of `documents` tokens, the rows laid
  end to end as one: [0, ..., batch * t]."""
  lengths = bench_documents.lengths(t, documents) * batch
  return [0] + [int(x) for x in np.cumsum(lengths)]


def measure_fla(kernel, name, t, args, documents=None):
  """fla's PyTorch/Triton kernel on the same shapes (fresh torch inputs of the same distribution); with
  `documents`, its varlen form: the batch as one row of B * T tokens with `cu_seqlens` at every document."""

  def run(row):
    import torch  # pylint: disable=import-outside-toplevel
    import fla.ops.common.chunk_o as chunk_o  # pylint: disable=import-outside-toplevel
    from fla import ops  # pylint: disable=import-outside-toplevel
    chunk_o.TRITON_ABOVE_3_7_1 = True  # Timing only: see FLA_NOTE.
    b, h, d = args.batch, args.heads, args.head_dim
    varlen = {}
    if documents is not None:
      varlen = dict(cu_seqlens=torch.tensor(fla_cu_seqlens(b, t, documents), dtype=torch.long, device='cuda'))
      b, t = 1, b * t
    dt = {'bfloat16': torch.bfloat16, 'float32': torch.float32}[args.dtype]
    gen = torch.Generator(device='cuda').manual_seed(0)
    randn = lambda *s: torch.randn(*s, device='cuda', dtype=dt, generator=gen)
    q, k, v, do = randn(b, t, h, d), randn(b, t, h, d), randn(b, t, h, d), randn(b, t, h, d)
    k = torch.nn.functional.normalize(k.float(), dim=-1).to(dt)
    g = -0.1 * torch.rand(b, t, h, device='cuda', generator=gen)
    beta = torch.rand(b, t, h, device='cuda', generator=gen).sigmoid()
    leaves = [x.requires_grad_() for x in (q, k, v)]
    if name == 'chunk_simple_gla':
      g.requires_grad_()
      leaves.append(g)
      call = lambda: ops.simple_gla.chunk_simple_gla(q, k, v, g=g, scale=d**-0.5, **varlen)[0]
    elif name == 'chunk_lightning_attn':
      call = lambda: ops.lightning_attn.chunk_lightning_attn(q, k, v, layer_idx=0, num_layers=2, scale=d**-0.5,
                                                             **varlen)[0]
    else:
      g.requires_grad_()
      beta.requires_grad_()
      leaves += [g, beta]
      call = lambda: ops.gated_delta_rule.chunk_gated_delta_rule(q, k, v, g=g, beta=beta, scale=d**-0.5,
                                                                 **varlen)[0]
    row['note'] = FLA_NOTE
    with torch.no_grad():
      row['fwd_compile_s'], row['fwd_ms'] = _torch_ms(call, args.repeats, args.min_seconds)
    if not args.no_bwd:
      row['fwd_bwd_compile_s'], row['fwd_bwd_ms'] = _torch_ms(lambda: torch.autograd.grad(call(), leaves, do),
                                                              args.repeats, args.min_seconds)

  return timing.measured(_row(kernel, f'fla:{name}', t, args, documents), args.timeout, run)


def add_ratios(rows, baseline, ceiling):
  """Growth from each T to the next, baseline ms / this ms (above 1 is faster), fla ms / this ms (fla on the same
  documents), a masked row's speed against the unmasked call of its implementation (`*_vs_unmasked`), TF/s, GB/s
  and the fraction of the same-run copy bandwidth."""
  groups = {}
  for row in rows:
    groups.setdefault((row['kernel'], row['impl'], row.get('documents')), []).append(row)
  for group in groups.values():
    group.sort(key=lambda r: r['T'])
    for prev, row in zip(group, group[1:]):
      for m in ('fwd', 'fwd_bwd'):
        if f'{m}_ms' in row and f'{m}_ms' in prev:
          row[f'{m}_growth'] = row[f'{m}_ms'] / prev[f'{m}_ms']
  key = lambda r: (r['kernel'], r['T'], r.get('documents'))
  base = {key(r): r for r in rows if r['impl'] == baseline}
  unmasked = {(r['kernel'], r['impl'], r['T']): r for r in rows if r.get('documents') is None}
  fla = {}
  for r in rows:
    if r['impl'].startswith('fla:') and 'error' not in r:
      fla.setdefault(key(r), r)  # The first fla variant listed is the anchor.
  for row in rows:
    for m in ('fwd', 'fwd_bwd'):
      ms = row.get(f'{m}_ms')
      if ms is None:
        continue
      flops = model_flops(row['kernel'], row['T'], _Args(row)) * (3 if m == 'fwd_bwd' else 1)
      row[f'{m}_tflops'] = flops / ms / 1e9
      row[f'{m}_gbs'] = model_bytes(row['kernel'], row['T'], _Args(row), m == 'fwd_bwd') / ms / 1e6
      if ceiling:
        row[f'{m}_of_copy'] = row[f'{m}_gbs'] / ceiling['copy_gbs']
      plain = unmasked.get((row['kernel'], row['impl'], row['T']), {}) if row.get('documents') else {}
      for name, ref in (('speedup', base.get(key(row), {})), ('vs_fla', fla.get(key(row), {})),
                        ('vs_unmasked', plain)):
        if f'{m}_ms' in ref:
          row[f'{m}_{name}'] = ref[f'{m}_ms'] / ms


class _Args:
  """A row's shape settings in the form model_flops/model_bytes read."""

  def __init__(self, row):
    self.batch, self.heads, self.head_dim = row['batch'], row['heads'], row['head_dim']
    self.chunk_size, self.dtype = row['chunk_size'], row['dtype']


def table(rows, baseline):
  masked = any(r.get('documents') for r in rows)
  cols = ['kernel', 'impl', 'T', 'docs', 'fwd ms', 'TF/s', 'GB/s', 'of copy', f'vs {baseline}', 'vs fla',
          *(['vs unmasked'] if masked else []), 'fwd+bwd ms', 'TF/s', f'vs {baseline}', 'vs fla',
          *(['vs unmasked'] if masked else []), 'growth', 'compile s']
  f = lambda x, spec: '' if x is None else format(x, spec)
  lines = ['| ' + ' | '.join(cols) + ' |', '|' + ' --- |' * len(cols)]
  for r in rows:
    cells = [r['kernel'], r['impl'], str(r['T']), str(r.get('documents') or '')]
    if 'error' in r:
      cells += [timing.headline(r['error'], 80)] + [''] * (len(cols) - 5)
    else:
      for m in ('fwd', 'fwd_bwd'):
        cells += [f(r.get(f'{m}_ms'), '.3f'), f(r.get(f'{m}_tflops'), '.1f')]
        if m == 'fwd':
          cells += [f(r.get('fwd_gbs'), '.0f'), f(r.get('fwd_of_copy'), '.2f')]
        cells += [f(r.get(f'{m}_speedup'), '.2f'), f(r.get(f'{m}_vs_fla'), '.2f')]
        if masked:
          cells.append(f(r.get(f'{m}_vs_unmasked'), '.2f'))
      cells += [f(r.get('fwd_bwd_growth'), '.2f'),
                ', '.join(f'{r[k]:.1f}' for k in ('fwd_compile_s', 'fwd_bwd_compile_s') if k in r)]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def _line(r):
  head = f"  {r['kernel']} {r['impl']} T={r['T']}" + (f" documents of {r['documents']}" if r.get('documents') else '')
  return timing.row_line(head, r)


def run(args) -> int:
  """Parity checks and timings as `args` asks (the flags of `bench scan`, one attribute each)."""
  meta = timing.run_meta({k: v for k, v in vars(args).items() if k != 'json'})
  report = timing.Report(args.json, meta)
  failed = 0
  if args.parity or args.parity_only:
    jax.config.update('jax_default_matmul_precision', 'highest')  # fp32 reference dots must not be TF32.
    failed = sum(not r['ok'] for r in parity(args, report))
    jax.config.update('jax_default_matmul_precision', None)
  if not args.parity_only:
    print(f"scan bench: {meta['device']} ({meta['backend']}), jax {jax.__version__}, B={args.batch} "
          f'H={args.heads} K=V={args.head_dim} C={args.chunk_size} {args.dtype}', flush=True)
    meta['ceiling'] = ceiling = ceilings(args)
    print(f"  ceilings: {args.dtype} GEMM {ceiling['gemm_n']}^3 {ceiling['gemm_tflops']:.1f} TF/s, "
          f"copy {ceiling['copy_gbs']:.0f} GB/s", flush=True)
    variants = (None, *(args.documents or ()))  # Unmasked first.
    for kernel in args.kernels:
      for t in args.seq_lens:
        for impl in args.impls:
          for documents in variants:
            report.add(r := measure(kernel, t, impl, args, documents), _line(r))
        for name in FLA[kernel] if args.fla else ():
          for documents in variants if name in FLA_DOCUMENTS else (None,):
            report.add(r := measure_fla(kernel, name, t, args, documents), _line(r))
    rows = report.rows()
    add_ratios(rows, args.baseline, ceiling)
    report.write()
    print(table(rows, args.baseline))
    print('vs X: X ms / this ms in the same run (above 1: faster than X); vs fla: the first fla kernel listed per '
          'kernel (on the same documents); growth: fwd+bwd time ratio to the previous T.'
          + (' docs: rows of documents of that many tokens; vs unmasked: the same implementation without '
             'documents.' if args.documents else '') + (f' Note: {FLA_NOTE}.' if args.fla else ''))
    failed += sum('error' in r for r in rows)
  if args.json:
    print(f'wrote {args.json}')
  if failed:
    print(f'scan bench: {failed} parity cases or measurements failed (whole errors in the JSON)', file=sys.stderr)
  return 1 if failed else 0

