"""Attention parity on the accelerator: every block configuration the dispatcher may pick, values and gradients.

Each case compares the compiled kernel (not interpret mode) with the float64 reference on the same rounded inputs,
with the same thresholds as the CPU tests (fp32 1e-5, bf16 5e-3 outputs / 1e-2 gradients, relative RMS, no NaN).
The T values are chosen so `config.gpu_blocks` returns each of its short-sequence caps and the full entry (with its
shared-memory fallbacks for float32). Also checks the automatic choice (implementation=None) end to end. Sized for
about a minute on an H200: float32 compiles slowly (20 s per case at T = 500 with 64-row blocks in the 2026-11-30
run), so float32 runs the full entry only at head dim 128, where its blocks differ most from bf16's. Each case has
its own time limit (--case-timeout) and none starts after --budget seconds (recorded as skipped); every case is
printed and written to --json the moment it ends. Exit status 1 if any case fails.

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
from hybrid_jax.kernels.attention import config  # pylint: disable=wrong-import-position
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


def rel(x, ref, floor=0.0):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  if not np.all(np.isfinite(x)):
    return float('nan')
  return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), floor, 1e-300))


def value_and_grads(fn, q, k, v, do):
  def run(q, k, v, do):
    o, vjp = jax.vjp(fn, q, k, v)
    return o, vjp(do.astype(o.dtype))
  return jax.jit(run)(q, k, v, do)


def one(fn, t, window, sinks, hq, hkv, d, dtype, seed=0):
  """Errors of fn's output and dq, dk, dv against the float64 reference; ok if all within thresholds."""
  rng = np.random.default_rng(seed)
  q, k, v, do = (jnp.asarray(rng.standard_normal((1, t, h, d)), dtype) for h in (hq, hkv, hkv, hq))
  start = time.perf_counter()
  o, grads = jax.block_until_ready(value_and_grads(fn, q, k, v, do))
  seconds = time.perf_counter() - start
  with jax.enable_x64(True):
    up = lambda x: jnp.asarray(np.asarray(x, np.float64))
    ref = lambda q, k, v: reference.attention(q, k, v, window=window, sinks=sinks)
    o64, g64 = value_and_grads(ref, up(q), up(k), up(v), up(do))
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

  def run(row, fn, t, window, sinks, hq, hkv, d, dtype):
    if time.perf_counter() - start > args.budget:
      row.update(ok=False, error=f'skipped: the budget of {args.budget:g} s was spent')
    else:
      row['ok'] = False
      timing.measured(row, args.case_timeout, lambda row: row.update(one(fn, t, window, sinks, hq, hkv, d, dtype)))
    report.add(row)

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
  d = dims[-1]
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
