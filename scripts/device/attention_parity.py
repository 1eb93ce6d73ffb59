"""Attention parity on the accelerator: every block configuration the dispatcher may pick, values and gradients.

Each case compares the compiled kernel (not interpret mode) with the float64 reference on the same rounded inputs,
with the same thresholds as the CPU tests (fp32 1e-5, bf16 5e-3 outputs / 1e-2 gradients, relative RMS, no NaN).
The T values are chosen so `config.gpu_blocks` returns each of its short-sequence caps and the full entry (with its
shared-memory fallbacks for float32). Also checks the automatic choice (implementation=None) end to end. Sized for
about a minute on an H200: float32 compiles slowly (20 s per case at T = 500 with 64-row blocks in the 2026-11-30
run), so float32 runs the full entry only at head dim 128, where its blocks differ most from bf16's. Each case has
its own time limit (--case-timeout) and none starts after --budget seconds (recorded as skipped); every case is
printed and written to --json the moment it ends. Exit status 1 if any case fails. --documents runs only the cases
with documents instead (`DOCUMENTS`: bf16 rows through the automatic choice, cuDNN's packed layout on a GPU that has
it, one batch with a row over its bound).

  python3 scripts/device/attention_parity.py --json OUT.json      (--smoke: a few tiny cases, for CPU dry runs)
"""

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update('jax_default_matmul_precision', 'highest')  # fp32 reference dots must not be TF32.

from hybrid_jax.bench import timing  # pylint: disable=wrong-import-position
from hybrid_jax.kernels import attention  # pylint: disable=wrong-import-position
from hybrid_jax.kernels import gpu_smem  # pylint: disable=wrong-import-position
from hybrid_jax.kernels import segments  # pylint: disable=wrong-import-position
from hybrid_jax.kernels.attention import api as attention_api  # pylint: disable=wrong-import-position
from hybrid_jax.kernels.attention import config  # pylint: disable=wrong-import-position
from hybrid_jax.kernels.attention import cudnn_documents  # pylint: disable=wrong-import-position
from hybrid_jax.kernels.attention import pallas_gpu  # pylint: disable=wrong-import-position
from hybrid_jax.kernels.attention import reference  # pylint: disable=wrong-import-position

TOL = {'float32': (1e-5, 1e-5), 'bfloat16': (5e-3, 1e-2)}
TS = (1, 30, 63, 500)  # Block caps 16, 32, 64 and the full table entry.
CASES = (  # (window, sinks, (Hq, Hkv), dtype)
    (7, 0, (4, 1), 'bfloat16'),
    (200, 5, (2, 2), 'float32'),
    (None, 0, (4, 1), 'bfloat16'),
)
FLOAT32_FULL_ENTRY_DIMS = (128,)  # float32 at the full entry only here (compile time; see above).
AUTO = (  # (T, window, sinks, dtype): implementation=None at the benchmark head dim.
    (1024, 128, 0, 'bfloat16'), (1024, None, 0, 'bfloat16'), (1024, 512, 4, 'bfloat16'), (1000, 64, 0, 'float32'))


def _rows(*documents, t=1024):
  """Segment ids [rows, T] of rows given as document lengths (a last 0-id run pads a row short of T)."""
  ids = [np.concatenate([np.full(n, i + 1, np.int32) for i, n in enumerate(row)] + [np.zeros(t - sum(row), np.int32)])
         for row in documents]
  return np.stack(ids)


# implementation=None with documents, bf16 (on a GPU with cuDNN >= 9.6 and Hopper: cuDNN's packed layout), each row
# a boundary case of tests/test_cudnn_documents.py: documents longer than the window, one token long, padding at
# the end, exactly the default bound of 64 documents, one document; then a batch with a row over the bound (65
# documents), which runs the fallback. (T, window, segment ids).
DOCUMENTS = (
    (1024, 128, _rows((300, 1, 200, 203), (16,) * 64, (1024,))),
    (1024, None, _rows((300, 1, 200, 203), (16,) * 64, (1024,))),
    (1024, 128, _rows((1024,), (15,) * 65)),
)


def rel(x, ref, floor=0.0):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  if not np.all(np.isfinite(x)):
    return float('nan')
  return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), floor, 1e-300))


def value_and_grads(fn, q, k, v, do, *extra):
  """fn(q, k, v, *extra) and its gradients in q, k, v; `extra` (segment ids) are arguments of the compiled
  program, as in training, not constants folded into it."""
  def run(q, k, v, do, *extra):
    o, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, *extra), q, k, v)
    return o, vjp(do.astype(o.dtype))
  return jax.jit(run)(q, k, v, do, *extra)


def one(fn, t, window, sinks, hq, hkv, d, dtype, seed=0, segment_ids=None):
  """Errors of fn's output and dq, dk, dv against the float64 reference; ok if all within thresholds. With
  `segment_ids` [B, T] fn takes them as a fourth argument."""
  rng = np.random.default_rng(seed)
  b = 1 if segment_ids is None else segment_ids.shape[0]
  q, k, v, do = (jnp.asarray(rng.standard_normal((b, t, h, d)), dtype) for h in (hq, hkv, hkv, hq))
  extra = () if segment_ids is None else (jnp.asarray(segment_ids),)
  start = time.perf_counter()
  o, grads = jax.block_until_ready(value_and_grads(fn, q, k, v, do, *extra))
  seconds = time.perf_counter() - start
  with jax.enable_x64(True):
    up = lambda x: jnp.asarray(np.asarray(x, np.float64))
    ref = lambda q, k, v, *seg: reference.attention(q, k, v, window=window, sinks=sinks,
                                                    segment_ids=segments.runs(seg[0]) if seg else None)
    o64, g64 = value_and_grads(ref, up(q), up(k), up(v), up(do), *extra)
    o64, g64 = np.asarray(o64), [np.asarray(g) for g in g64]
  floor = 0.1 * np.linalg.norm(g64[2])  # dq, dk vanish when each query sees one key.
  errs = dict(out=rel(o, o64), dq=rel(grads[0], g64[0], floor), dk=rel(grads[1], g64[1], floor),
              dv=rel(grads[2], g64[2], floor))
  out_tol, grad_tol = TOL[dtype]
  ok = errs['out'] <= out_tol and all(errs[n] <= grad_tol for n in ('dq', 'dk', 'dv'))  # False on NaN.
  return dict(errs, ok=bool(ok), seconds=round(seconds, 3))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--json', help='write every case and the summary here')
  p.add_argument('--smoke', action='store_true', help='a few tiny cases (CPU dry run in interpret mode)')
  p.add_argument('--case-timeout', type=float, default=30.0, help='seconds per case (compile included)')
  p.add_argument('--budget', type=float, default=55.0, help='no case starts after this many seconds')
  p.add_argument('--documents', action='store_true', help='only the cases with documents (cuDNN packed on GPU)')
  args = p.parse_args(argv)
  backend = jax.default_backend()
  print(f'attention parity: {jax.devices()[0]} ({backend}), jax {jax.__version__}', flush=True)
  interpret = backend != 'gpu'
  dims, ts, cases, auto = ((64, 128), TS, CASES, AUTO)
  if args.smoke:  # One kernel case and one automatic case, tiny.
    dims, ts, cases, auto = (16,), (30,), CASES[1:2], ((40, 8, 0, 'float32'),)
  meta = dict(backend=backend, device=str(jax.devices()[0]), jax=jax.__version__)
  report = timing.Report(args.json, meta)
  start = time.perf_counter()

  def run(row, fn, t, window, sinks, hq, hkv, d, dtype, segment_ids=None):
    if time.perf_counter() - start > args.budget:
      row.update(ok=False, error=f'skipped: the budget of {args.budget:g} s was spent')
    else:
      row['ok'] = False
      timing.measured(row, args.case_timeout, lambda row: row.update(
          one(fn, t, window, sinks, hq, hkv, d, dtype, segment_ids=segment_ids)))
    report.add(row)

  if args.documents:  # Rows of documents through the automatic choice: cuDNN's packed layout on a GPU.
    d = 16 if args.smoke else 128
    for t, window, seg in (((40, 8, _rows((10, 1, 9), t=40)),) if args.smoke else DOCUMENTS):
      counts = [int(n) for n in np.asarray(segments.runs(jnp.asarray(seg)))[:, -1] + 1]
      chosen = attention_api._auto(  # pylint: disable=protected-access
          jnp.zeros((len(seg), t, 8, d), jnp.bfloat16), window, 0, jnp.asarray(seg))
      fn = lambda q, k, v, seg, w=window: attention(q, k, v, window=w, segment_ids=seg)
      run(dict(impl=f'auto ({chosen})', d=d, t=t, window=window, sinks=0, hq=8, hkv=2, dtype='bfloat16',
               documents_per_row=counts, over_bound=max(counts) > cudnn_documents.DEFAULT_MAX_DOCUMENTS),
          fn, t, window, 0, 8, 2, d, 'bfloat16', segment_ids=seg)
    dims, ts, cases, auto = (), (), (), ()
  for d in dims:
    for t in ts:
      for window, sinks, (hq, hkv), dtype in cases:
        if dtype == 'float32' and t == ts[-1] and d not in FLOAT32_FULL_ENTRY_DIMS and not args.smoke:
          continue
        blocks = config.gpu_blocks(d, t, itemsize=jnp.dtype(dtype).itemsize)
        fn = lambda q, k, v, w=window, s=sinks, b=blocks: pallas_gpu.attention(q, k, v, window=w, sinks=s,
                                                                               blocks=b, interpret=interpret)
        smem = gpu_smem.attention(d, jnp.dtype(dtype).itemsize, blocks)  # The model, to check against the device.
        run(dict(impl='pallas_gpu', d=d, t=t, window=window, sinks=sinks, hq=hq, hkv=hkv, dtype=dtype,
                 blocks=blocks._asdict(), smem_model=smem), fn, t, window, sinks, hq, hkv, d, dtype)
  d = dims[-1] if dims else None
  for t, window, sinks, dtype in auto:
    impl = None if backend == 'gpu' else 'xla'
    fn = lambda q, k, v, w=window, s=sinks, i=impl: attention(q, k, v, window=w, sinks=s, implementation=i)
    run(dict(impl=f'auto ({impl})', d=d, t=t, window=window, sinks=sinks, hq=8, hkv=2, dtype=dtype), fn, t,
        window, sinks, 8, 2, d, dtype)
  results = report.rows()
  failed = [r for r in results if not r['ok']]
  meta.update(cases=len(results), failed=len(failed))
  report.write()
  print(f"parity: {len(results) - len(failed)}/{len(results)} cases pass", flush=True)
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main())
