"""The kernel phases of scripts/device/measure.sh: every mixer kernel at the study's layer shapes and at the anchor
shape, forward+backward, against cuDNN and fla measured in the same process.

  python3 scripts/device/kernels.py scans --json OUT.json [--deadline S] [--dry-run]
  python3 scripts/device/kernels.py attention --json OUT.json [--deadline S] [--dry-run]

`scans` (run first): `gated_delta_rule` and `linear_scan` by `pallas_gpu` (and at the study shapes `xla`, for the
automatic choice) beside fla's `chunk_gated_delta_rule` and `chunk_simple_gla` (the Mamba-2 form: per-token decay;
Lightning's constant decay per head given to it per token), in priority order (`scan_cases`): GDN at the anchor
shape (1 x 32K, K = V = 128, 16 and 32 heads) and at S4, Mamba-2 and Lightning at S4, the S4 rows on documents of
T / 4 tokens (bench step's default; fla: its varlen form of the same documents), Mamba-2 and Lightning at the
anchor, then S1. The S4 and S1 layer shapes are the packaged hybrid config's (`hybrid_jax.configs.hybrid`: each
mixer's heads and widths at the scale, data.seq_len 16K), two rows a call. Then the scans' parity on this device
(`hybrid_jax.bench.scan_parity`). fla takes one key head per value head, so Mamba-2's shared B/C are repeated for it.

`attention` (after the scans): at T = 16K and 32K, windows 128 and full, for the S4 and S1 head shapes (GQA, head
dim 64) and 16 heads of 128 (the anchor): cuDNN without documents (what each target divides by), then cuDNN (its
packed layout, the automatic choice's kernel) and `pallas_gpu` on rows of documents of T / 4 tokens, 32K tokens
per call; then the documents parity of `attention_parity.py --documents`.

Every row is the forward+backward of one call (vjp of the outputs, as training runs it), compile apart from the
median time; each under --timeout, none started after --deadline seconds (recorded as skipped), printed and written
to --json the moment it ends. --dry-run: tiny shapes on CPU, XLA standing in for cuDNN and for every Pallas scan row
but the first (interpret mode costs half a minute a row on a busy CPU); fla rows record that fla is missing.
"""

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys
import tempfile
import time
import types

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_jax.bench import documents as bench_documents, timing
from hybrid_jax.bench.attention import fallback_of
from hybrid_jax.configs import hybrid
from hybrid_jax.kernels import attention, gated_delta_rule, linear_scan
from hybrid_jax.models.mixers import lightning

FLA_NOTE = ('fla backward on Hopper with Triton < 3.7.1 is refused upstream (a miscompile); '
            'fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 was forced True for timing only')
FLA_KERNEL = {'gdn': 'chunk_gated_delta_rule', 'mamba2': 'chunk_simple_gla', 'lightning': 'chunk_simple_gla'}
ANCHOR = 'anchor'


@dataclasses.dataclass(frozen=True)
class Shape:
  """One layer's kernel call: `heads` query (or value) heads, `key_heads` key heads, widths K (key) and V."""
  name: str  # 'anchor', 's4', 's1', with a head count for the anchor's GDN variants
  batch: int
  t: int
  heads: int
  key_heads: int
  k: int
  v: int


def study_shapes(form, scales=('s4', 's1')):
  """The layer shapes of `form` ('gdn', 'mamba2', 'lightning', 'attention') at the study's scales, read from the
  packaged hybrid config: two rows of data.seq_len (16K) tokens."""
  out = []
  for scale in scales:
    c = hybrid.get_config(f"arch={'gdn' if form == 'attention' else form},scale={scale}")
    m, t = c.model, int(c.data.seq_len)
    if form == 'attention':
      out.append(Shape(scale, 2, t, m.num_heads, m.num_kv_heads, m.head_dim, m.head_dim))
    elif form == 'mamba2':
      out.append(Shape(scale, 2, t, m.mamba2.num_heads, m.mamba2.num_groups, m.mamba2.state_dim, m.mamba2.head_dim))
    else:  # GDN's value heads (0: one per key head) share the key heads by index.
      section = m[form]
      heads = section.get('value_heads') or section.num_heads
      out.append(Shape(scale, 2, t, heads, section.num_heads, section.key_dim, section.value_dim))
  return out


def scan_cases(dry_run):
  """(form, shape, documents, implementations) in priority order: GDN at the anchors and S4, Mamba-2 and Lightning at
  S4, the S4 rows of documents, Mamba-2 and Lightning at the anchor, then S1. The anchors time only what their
  targets compare (pallas_gpu against fla); the study shapes also time xla, for the automatic choice."""
  ours, fla = ('pallas_gpu', 'xla'), ('fla',)
  if dry_run:
    tiny = lambda name, h, hk, k, v: Shape(name, 1, 32, h, hk, k, v)
    anchor = lambda h: tiny(f'{ANCHOR} {h} heads', h, h, 16, 16)
    study = {'gdn': [tiny('s4', 2, 2, 16, 32)], 'mamba2': [tiny('s4', 2, 1, 32, 16)],
             'lightning': [tiny('s4', 2, 2, 16, 32)]}
  else:
    anchor = lambda h: Shape(f'{ANCHOR} {h} heads', 1, 32768, h, h, 128, 128)
    study = {form: study_shapes(form) for form in ('gdn', 'mamba2', 'lightning')}
  documents = lambda shape: max(1, shape.t // 4)
  s4, s1 = ({form: shapes[i] for form, shapes in study.items() if len(shapes) > i} for i in (0, 1))
  cases = [('gdn', anchor(16), None, ('pallas_gpu',) + fla), ('gdn', anchor(32), None, ('pallas_gpu',) + fla)]
  cases += [(form, s4[form], None, ours + fla) for form in ('gdn', 'mamba2', 'lightning')]
  cases += [(form, s4[form], documents(s4[form]), ours + fla) for form in ('gdn', 'mamba2', 'lightning')]
  cases += [(form, anchor(16), None, ('pallas_gpu',) + fla) for form in ('mamba2', 'lightning')]
  for form, shape in s1.items():
    cases += [(form, shape, None, ours + fla), (form, shape, documents(shape), ours + fla)]
  if dry_run:  # Interpret mode costs half a minute a row on a busy CPU: one Pallas row, xla for the others.
    cases = cases[:1] + [(f, s, d, tuple(dict.fromkeys('xla' if i == 'pallas_gpu' else i for i in impls)))
                         for f, s, d, impls in cases[1:]]
  return cases


def attention_cases(dry_run):
  """(shape, window, documents, impl) in priority order: S4 at 16K and 32K, the anchor at 32K, S1, the anchor at
  16K; for each window cuDNN unmasked, then cuDNN and pallas_gpu on documents."""
  if dry_run:
    shapes = [Shape('s4', 2, 16, 4, 2, 16, 16), Shape(ANCHOR, 1, 32, 2, 2, 16, 16)]
    windows, cudnn = (8, None), 'xla'
  else:
    at = lambda shape, t: dataclasses.replace(shape, batch=32768 // t, t=t)  # 32K tokens per call.
    s4, s1 = study_shapes('attention')
    anchor = Shape(ANCHOR, 1, 32768, 16, 16, 128, 128)
    shapes = [at(s4, 16384), at(s4, 32768), anchor, at(s1, 16384), at(s1, 32768), at(anchor, 16384)]
    windows, cudnn = (128, None), 'cudnn'
  cases = []
  for shape in shapes:
    for window in windows:
      cases += [(shape, window, None, cudnn), (shape, window, max(1, shape.t // 4), cudnn),
                (shape, window, max(1, shape.t // 4), 'pallas_gpu')]
  return cases


def scan_flops(form, s: Shape, chunk):
  """Training FLOPs (3 x forward, docs/KERNELS.md, "FLOP model") of one call: per chunk Q K^T per key head, and per
  value head the masked product with V and the state's terms; the delta rule's K K^T, inverse, W and U."""
  c, k, v = chunk, s.k, s.v
  if form == 'gdn':
    per_token = s.heads * (6 * c * k + 4 * c * v + 6 * k * v + c * c / 3)
  else:
    per_token = s.key_heads * 2 * c * k + s.heads * (2 * c * v + 4 * k * v)
  return 3 * per_token * s.batch * s.t


def _row(group, form, shape, impl, documents, **extra):
  return dict(group=group, form=form, shape=shape.name, impl=impl, batch=shape.batch, T=shape.t, heads=shape.heads,
              key_heads=shape.key_heads, k=shape.k, v=shape.v, documents=documents, **extra)


def _segment_ids(shape, documents):
  return None if documents is None else jnp.asarray(bench_documents.segment_ids(shape.batch, shape.t, documents))


def scan_inputs(form, s: Shape, dtype):
  """Layer-like inputs: L2-normalised keys, log decays in [-0.1, 0) per token (Lightning: its constant rates per
  head), beta in (0, 1); the cotangent of the output."""
  keys = jax.random.split(jax.random.key(0), 6)
  q = jax.random.normal(keys[0], (s.batch, s.t, s.key_heads, s.k), dtype)
  k = jax.random.normal(keys[1], (s.batch, s.t, s.key_heads, s.k), jnp.float32)
  k = (k / jnp.linalg.norm(k, axis=-1, keepdims=True)).astype(dtype)
  v, do = (jax.random.normal(key, (s.batch, s.t, s.heads, s.v), dtype) for key in keys[2:4])
  if form == 'lightning':
    g = -jnp.asarray(lightning.decay_rates(s.heads), jnp.float32)
  else:
    g = -0.1 * jax.random.uniform(keys[4], (s.batch, s.t, s.heads))
  beta = (jax.nn.sigmoid(jax.random.normal(keys[5], (s.batch, s.t, s.heads))),) if form == 'gdn' else ()
  return (q, k, v, g) + beta, do


def measure_scan(form, s: Shape, impl, documents, args):
  """Forward+backward of the layer's scan by `impl` (gradients of every input a layer trains through: Lightning's
  constant decay is no parameter)."""
  kernel = gated_delta_rule if form == 'gdn' else linear_scan
  xs, do = scan_inputs(form, s, jnp.dtype(args.dtype))
  seg = _segment_ids(s, documents)
  scale = 1.0 if form == 'mamba2' else None
  trained = 3 if form == 'lightning' else len(xs)

  def fwd_bwd(xs, seg, do):
    fn = lambda *grad_xs: kernel(*grad_xs, *xs[trained:], scale=scale, segment_ids=seg, chunk_size=args.chunk,
                                 implementation=impl)
    (_, state), vjp = jax.vjp(fn, *xs[:trained])
    return vjp((do, jnp.zeros_like(state)))

  def run(row):
    row['compile_s'], row['fwd_bwd_ms'] = timing.timed(fwd_bwd, (xs, seg, do), args.repeats, args.min_seconds)
    row['tflops'] = scan_flops(form, s, args.chunk) / row['fwd_bwd_ms'] / 1e9

  return timing.measured(_row('scans', form, s, impl, documents, chunk=args.chunk), args.timeout, run)


def _torch_ms(fn, repeats, min_seconds):
  """(first call seconds: Triton compiles and autotunes there, median ms after it)."""
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


def measure_fla(form, s: Shape, documents, args):
  """fla's kernel on the same shapes and distributions (fresh torch inputs), forward+backward; with documents, its
  varlen form: the batch as one row with `cu_seqlens` at every document. Key heads repeated to the value heads."""
  name = FLA_KERNEL[form]

  def run(row):
    import torch  # pylint: disable=import-outside-toplevel
    import fla.ops.common.chunk_o as chunk_o  # pylint: disable=import-outside-toplevel
    from fla import ops  # pylint: disable=import-outside-toplevel
    chunk_o.TRITON_ABOVE_3_7_1 = True  # Timing only: see FLA_NOTE.
    row['note'] = FLA_NOTE
    b, t, h = s.batch, s.t, s.heads
    varlen = {}
    if documents is not None:
      ends = np.cumsum(bench_documents.lengths(t, documents) * b)
      varlen = dict(cu_seqlens=torch.tensor([0, *ends.tolist()], dtype=torch.long, device='cuda'))
      b, t = 1, b * t
    dt = {'bfloat16': torch.bfloat16, 'float32': torch.float32}[args.dtype]
    gen = torch.Generator(device='cuda').manual_seed(0)
    randn = lambda *shape: torch.randn(*shape, device='cuda', dtype=dt, generator=gen)
    q, k, v, do = randn(b, t, h, s.k), randn(b, t, h, s.k), randn(b, t, h, s.v), randn(b, t, h, s.v)
    k = torch.nn.functional.normalize(k.float(), dim=-1).to(dt)
    if form == 'lightning':
      rates = torch.tensor(lightning.decay_rates(h), device='cuda', dtype=torch.float32)
      g = (-rates).expand(b, t, h).contiguous()
    else:
      g = -0.1 * torch.rand(b, t, h, device='cuda', generator=gen)
    leaves = [x.requires_grad_() for x in (q, k, v)]
    scale = 1.0 if form == 'mamba2' else s.k**-0.5
    if form == 'gdn':
      beta = torch.rand(b, t, h, device='cuda', generator=gen).sigmoid()
      leaves += [g.requires_grad_(), beta.requires_grad_()]
      call = lambda: ops.gated_delta_rule.chunk_gated_delta_rule(q, k, v, g=g, beta=beta, scale=scale, **varlen)[0]
    else:
      if form == 'mamba2':
        leaves.append(g.requires_grad_())
      call = lambda: ops.simple_gla.chunk_simple_gla(q, k, v, g=g, scale=scale, **varlen)[0]
    row['compile_s'], row['fwd_bwd_ms'] = _torch_ms(lambda: torch.autograd.grad(call(), leaves, do), args.repeats,
                                                    args.min_seconds)
    row['tflops'] = scan_flops(form, dataclasses.replace(s, key_heads=s.heads), args.chunk) / row['fwd_bwd_ms'] / 1e9

  return timing.measured(_row('scans', form, s, f'fla:{name}', documents, chunk=64), args.timeout, run)


def measure_attention(s: Shape, window, documents, impl, args):
  """Forward+backward of attention by `impl` (q [B, T, Hq, D], k and v [B, T, Hkv, D]); a cuDNN call the
  dispatcher hands to another kernel says which (`ran`)."""
  dtype = jnp.dtype(args.dtype)
  keys = jax.random.split(jax.random.key(0), 4)
  q, k, v, do = (jax.random.normal(key, (s.batch, s.t, h, s.k), dtype)
                 for key, h in zip(keys, (s.heads, s.key_heads, s.key_heads, s.heads)))
  seg = _segment_ids(s, documents)

  def fwd_bwd(q, k, v, seg, do):
    _, vjp = jax.vjp(lambda q, k, v: attention(q, k, v, window=window, segment_ids=seg, implementation=impl), q, k, v)
    return vjp(do)

  pairs = s.batch * (bench_documents.visible_pairs(s.t, window, documents or s.t))
  row = _row('attention', 'attention', s, impl, documents, window=window, pairs=pairs)

  def run(row):
    ran = fallback_of(impl, q, window, seg)
    if ran:
      row['ran'] = ran
    row['compile_s'], row['fwd_bwd_ms'] = timing.timed(fwd_bwd, (q, k, v, seg, do), args.repeats, args.min_seconds)
    row['tflops'] = 3.5 * 4 * s.heads * s.k * pairs / row['fwd_bwd_ms'] / 1e9

  return timing.measured(row, args.timeout, run)


def _line(r):
  what = f"{r['form']} {r['shape']} {r['impl']} T={r['T']}"
  what += f" w{r['window'] or 'full'}" if r['group'] == 'attention' else ''
  what += f" documents of {r['documents']}" if r['documents'] else ''
  if 'error' in r:
    return f'  {what}: {timing.headline(r["error"])}'
  return f"  {what}: fwd+bwd {r['fwd_bwd_ms']:.3f} ms ({r['tflops']:.1f} TF/s), compile {r['compile_s']:.1f} s"


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('group', choices=('scans', 'attention'))
  p.add_argument('--json', required=True, help='rows written here as they are measured')
  p.add_argument('--deadline', type=float, default=600.0, help='no row starts after this many seconds')
  p.add_argument('--timeout', type=float, default=60.0, help='seconds per row (compile included)')
  p.add_argument('--parity-budget', type=float, default=30.0, help='seconds of parity cases after the rows')
  p.add_argument('--dry-run', action='store_true', help='tiny shapes on CPU, interpret mode')
  args = p.parse_args(argv)
  args.dtype = 'float32' if args.dry_run else 'bfloat16'
  args.chunk = 16 if args.dry_run else 64
  args.repeats, args.min_seconds = (1, 0.0) if args.dry_run else (5, 0.2)
  start = time.perf_counter()
  device = jax.devices()[0]
  meta = dict(group=args.group, backend=jax.default_backend(), device=getattr(device, 'device_kind', str(device)),
              jax=jax.__version__, dtype=args.dtype, chunk=args.chunk, dry_run=args.dry_run)
  report = timing.Report(args.json, meta)
  print(f"kernels {args.group}: {meta['device']} ({meta['backend']}), jax {jax.__version__}, {args.dtype}", flush=True)

  def add(row_fn, row_head):
    if time.perf_counter() - start > args.deadline:
      row = dict(row_head, error=f'skipped: the deadline of {args.deadline:g} s had passed')
    else:
      row = row_fn()
    report.add(row, _line(row))

  if args.group == 'scans':
    for form, shape, documents, impls in scan_cases(args.dry_run):
      for impl in impls:
        if impl == 'fla':
          add(lambda: measure_fla(form, shape, documents, args),
              _row('scans', form, shape, f'fla:{FLA_KERNEL[form]}', documents))
        else:
          add(lambda: measure_scan(form, shape, impl, documents, args), _row('scans', form, shape, impl, documents))
    checked = ['linear_scan'] if args.dry_run else ['linear_scan', 'gated_delta_rule']  # The dry run: 2 cases.
    parity_args = types.SimpleNamespace(kernels=checked, timeout=args.timeout,
                                        parity_budget=max(0.0, min(args.parity_budget,
                                                                   args.deadline - (time.perf_counter() - start))))
    from hybrid_jax.bench import scan_parity  # pylint: disable=import-outside-toplevel
    jax.config.update('jax_default_matmul_precision', 'highest')  # fp32 reference dots must not be TF32.
    scan_parity.parity(parity_args, report)
  else:
    for shape, window, documents, impl in attention_cases(args.dry_run):
      head = _row('attention', 'attention', shape, impl, documents, window=window)
      add(lambda: measure_attention(shape, window, documents, impl, args), head)
    left = args.deadline - (time.perf_counter() - start)
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    import attention_parity  # pylint: disable=import-outside-toplevel
    with tempfile.TemporaryDirectory() as tmp:
      flags = ['--documents', '--json', f'{tmp}/parity.json', '--budget', f'{max(0.0, min(args.parity_budget, left)):g}']
      attention_parity.main(flags + (['--smoke'] if args.dry_run else []))
      report.out['documents_parity'] = json.loads(pathlib.Path(f'{tmp}/parity.json').read_text()).get('rows', [])
    report.write()
  rows = report.rows()
  skipped = sum(r.get('error', '').startswith('skipped') for r in rows)
  failed = sum('error' in r for r in rows) - skipped
  print(f'kernels {args.group}: {len(rows) - failed - skipped} rows measured, {failed} failed, {skipped} skipped, '
        f'in {time.perf_counter() - start:.0f} s', flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(main())
