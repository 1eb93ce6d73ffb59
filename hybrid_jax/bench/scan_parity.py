"""Parity of the recurrent-mixer kernels on the device `bench scan` runs on (`--parity`): the output, final state
and every gradient of each implementation against the float64 reference on the same rounded inputs."""

import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_jax.bench import timing
from hybrid_jax.kernels import gated_delta_rule
from hybrid_jax.kernels import gpu_smem
from hybrid_jax.kernels import linear_scan
from hybrid_jax.kernels import pallas_scan_common as pc

KERNELS = {'linear_scan': linear_scan, 'gated_delta_rule': gated_delta_rule}

TOL = {'float32': (1e-5, 1e-5, 1e-5), 'bfloat16': (5e-3, 1e-2, 2e-2)}  # o/S_T, dq/dk/dv/dS_0, dg/dbeta


def _rel(x, ref):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  if not np.all(np.isfinite(x)):
    return float('nan')
  return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-300))


def parity_case(kernel, impl, t, d, chunk, dtype, seed=0):
  """Errors of the output, final state and every gradient (loss = sum(o do) + sum(S_T dS), non-zero initial
  state, GVA 2:4 heads) against the float64 reference on the same rounded inputs."""
  rng = np.random.default_rng(seed)
  b, hk, hv = 1, 2, 4
  q, k = rng.standard_normal((b, t, hk, d)), rng.standard_normal((b, t, hk, d))
  k /= np.linalg.norm(k, axis=-1, keepdims=True)
  v = rng.standard_normal((b, t, hv, d))
  g = np.log(rng.uniform(0.5, 1.0, (b, t, hv)))
  g = np.where(rng.uniform(size=g.shape) < 0.1, 0.0, g)  # Some gates exactly 0.
  args = [q, k, v, g] + ([rng.uniform(0.05, 0.95, (b, t, hv))] if kernel == 'gated_delta_rule' else [])
  s0, do, ds = rng.standard_normal((b, hv, d, d)), rng.standard_normal((b, t, hv, d)), rng.standard_normal(
      (b, hv, d, d))
  fn = KERNELS[kernel]

  def run(xs, s0, do, ds, impl, chunk):
    (o, s), vjp = jax.vjp(lambda xs, s0: fn(*xs, initial_state=s0, chunk_size=chunk, implementation=impl), xs, s0)
    dxs, ds0 = vjp((do.astype(o.dtype), ds))
    return o, s, list(dxs) + [ds0]

  xs = [jnp.asarray(x, dtype if i < 3 else jnp.float32) for i, x in enumerate(args)]
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  start = time.perf_counter()
  got = jax.block_until_ready(jax.jit(run, static_argnums=(4, 5))(xs, f32(s0), f32(do), f32(ds), impl, chunk))
  seconds = time.perf_counter() - start
  with jax.enable_x64(True):
    up = lambda x: jnp.asarray(np.asarray(x, np.float64))
    want = jax.jit(run, static_argnums=(4, 5))([up(x) for x in xs], up(f32(s0)), up(f32(do)), up(f32(ds)),
                                               'reference', chunk)
    want = jax.tree.map(np.asarray, want)
  names = ['q', 'k', 'v', 'log_decay'] + (['beta'] if kernel == 'gated_delta_rule' else []) + ['initial_state']
  errs = {'o': _rel(got[0], want[0]), 'S_T': _rel(got[1], want[1])}
  errs.update({f'd{n}': _rel(x, w) for n, x, w in zip(names, got[2], want[2])})
  out_tol, qkv_tol, gate_tol = TOL[jnp.dtype(dtype).name]
  limit = {n: out_tol if n in ('o', 'S_T') else qkv_tol if n in ('dq', 'dk', 'dv', 'dinitial_state') else gate_tol
           for n in errs}
  ok = all(errs[n] <= limit[n] for n in errs)  # False on NaN.
  return dict(kernel=kernel, impl=str(impl), T=t, head_dim=d, chunk=chunk, dtype=jnp.dtype(dtype).name, ok=bool(ok),
              seconds=round(seconds, 3), **{n: float(f'{e:.3g}') for n, e in errs.items()})


def parity_cases(kernels, backend):
  """Per kernel at T = 1000 (no chunk multiple), GVA 2:4: the default (bf16, head dim 128, chunk 64), float32 at
  head dim 128 (its chunk falls back to fit shared memory), bf16 at head dim 64 and chunk 16, and the automatic
  choice. Sized to finish within a minute on an H200 (compile-bound: about 35 s measured for these shapes)."""
  impl = {'gpu': 'pallas_gpu', 'tpu': 'pallas_tpu'}.get(backend, 'pallas_gpu')
  bf16, f32 = jnp.dtype('bfloat16'), jnp.dtype('float32')
  cases = []
  for kernel in kernels:
    if backend == 'cpu':  # Interpret mode: a smoke run only.
      cases += [(kernel, impl, 40, 16, 16, f32), (kernel, impl, 40, 16, 16, bf16)]
      continue
    cases += [(kernel, impl, 1000, 128, 64, bf16), (kernel, impl, 1000, 128, 64, f32),
              (kernel, impl, 1000, 64, 16, bf16), (kernel, None, 1000, 128, 64, bf16)]
  return cases


def parity(args, report):
  """Runs `parity_cases`, each under --timeout, none started after --parity-budget seconds (recorded as skipped);
  every case is a row of `report` ('parity') the moment it ends."""
  start = time.perf_counter()
  for kernel, impl, t, d, chunk, dtype in parity_cases(args.kernels, jax.default_backend()):
    row = dict(kernel=kernel, impl=str(impl), T=t, head_dim=d, chunk=chunk, dtype=dtype.name, ok=False)
    if impl == 'pallas_gpu':  # The chunk the kernels run with and the model's footprints, to check on the device.
      row['kernel_chunk'] = gpu_smem.scan_chunk(kernel, chunk, d, d, pc.GPU_BLOCK_V, dtype.itemsize)
      if row['kernel_chunk']:
        row['smem_model'] = gpu_smem.scan(kernel, row['kernel_chunk'], d, d, min(d, pc.GPU_BLOCK_V), dtype.itemsize)
    if time.perf_counter() - start > args.parity_budget:
      row['error'] = f'skipped: the parity budget of {args.parity_budget:g} s was spent'
    else:
      timing.measured(row, args.timeout, lambda row, c=(kernel, impl, t, d, chunk, dtype): row.update(
          parity_case(*c)))
    report.add(row, 'parity ' + json.dumps({k: v for k, v in row.items() if k != 'traceback'}), key='parity')
  results = report.rows('parity')
  failed = sum(not r['ok'] for r in results)
  print(f'parity: {len(results) - failed}/{len(results)} cases pass', flush=True)
  return results
