"""Pallas attention kernels (GPU-style and TPU splash) in interpret mode against the float64 reference.

Interpret mode is slow, so shapes are tiny and the fast set is a representative subset: every window (1, 7, 64,
128 = a block, 200, >= T, full), T (1, 63, 128, 500), GQA map (4:1, 1:1), sinks and dtype appears in it at least
once. The exhaustive grid is marked slow (`pytest -m slow tests/test_attention_pallas.py`).
"""

import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.kernels import attention
from hybrid_jax.kernels.attention import api
from hybrid_jax.kernels.attention import config
from hybrid_jax.kernels.attention import pallas_gpu
from hybrid_jax.kernels.attention import reference

TOL = {jnp.float32: (1e-5, 1e-5), jnp.bfloat16: (5e-3, 1e-2)}  # (output, gradients) relative RMS
SMALL = config.GpuBlocks(32, 16, 16, 32)  # Many blocks per short sequence: exercises every loop range.


def rel(x, ref, floor=0.0):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  assert np.all(np.isfinite(x)), 'non-finite values'
  return np.linalg.norm(x - ref) / max(np.linalg.norm(ref), floor)


def make(seed, t, hq, hkv, d, dtype, segments=False, b=1):
  rng = np.random.default_rng(seed)
  q, k, v, do = (jnp.asarray(rng.standard_normal((b, t, h, d)), dtype) for h in (hq, hkv, hkv, hq))
  seg = jnp.asarray(np.sort(rng.integers(0, 3, (b, t))).astype(np.int32)) if segments else None
  return q, k, v, do, seg


# Interpret-mode programs are compile-bound on CPU; these halve the compile time and hardly slow the run.
FAST_COMPILE = dict(xla_backend_optimization_level=0, xla_llvm_disable_expensive_passes=True)


def value_and_grads(fn, q, k, v, do, **kw):
  def run(q, k, v, do):
    o, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, **kw), q, k, v)
    return o, vjp(do.astype(o.dtype))
  return jax.jit(run).lower(q, k, v, do).compile(FAST_COMPILE)(q, k, v, do)


def forward(fn, *args, **kw):
  return jax.jit(lambda *a: fn(*a, **kw)).lower(*args).compile(FAST_COMPILE)(*args)


def check(fn, t, window, hq, hkv, d, sinks=0, dtype=jnp.float32, segments=False, seed=0, **kw):
  """fn's output and dq, dk, dv against the float64 reference on the same (rounded) inputs."""
  q, k, v, do, seg = make(seed + t, t, hq, hkv, d, dtype, segments)
  args = dict(window=window, sinks=sinks, segment_ids=seg)
  o, grads = value_and_grads(fn, q, k, v, do, **args, **kw)
  assert o.dtype == dtype and all(g.dtype == dtype for g in grads)
  with jax.enable_x64(True):
    up = lambda x: jnp.asarray(np.asarray(x, np.float64))
    o64, g64 = value_and_grads(reference.attention, up(q), up(k), up(v), up(do), **args)
  out_tol, grad_tol = TOL[dtype]
  assert rel(o, o64) <= out_tol
  floor = 0.1 * np.linalg.norm(np.asarray(g64[2]))  # dq, dk vanish when each query sees one key.
  for name, g, w in zip('qkv', grads, g64):
    assert rel(g, w, floor) <= grad_tol, f'd{name}'


def gpu(q, k, v, **kw):
  return attention(q, k, v, implementation='pallas_gpu', **kw)


def tpu(q, k, v, **kw):
  return attention(q, k, v, implementation='pallas_tpu', **kw)


# (T, window, Hq, Hkv, D, sinks, dtype, blocks)
GPU_FAST = [
    (1, None, 4, 1, 16, 0, jnp.float32, None),
    (63, 7, 4, 1, 16, 0, jnp.float32, SMALL),
    (128, 128, 2, 2, 64, 0, jnp.float32, None),  # window = the 128-row forward block
    (500, 200, 4, 1, 16, 0, jnp.float32, config.GpuBlocks(64, 32, 32, 64)),  # not a multiple of any block
    (500, 1, 2, 2, 16, 40, jnp.float32, SMALL),  # sinks spanning several blocks
    (500, 64, 4, 1, 128, 0, jnp.bfloat16, None),  # the benchmark head dim, its table entry
    (500, None, 4, 1, 16, 0, jnp.bfloat16, SMALL),
]


@pytest.mark.parametrize('case', GPU_FAST, ids=lambda c: 'T{}-w{}-H{}:{}-D{}-s{}-{}-{}'.format(
    *c[:6], jnp.dtype(c[6]).name, 'small' if c[7] == SMALL else 'table'))
def test_gpu_kernel(case):
  t, window, hq, hkv, d, sinks, dtype, blocks = case
  if blocks is None:
    check(gpu, t, window, hq, hkv, d, sinks, dtype)
  else:
    check(pallas_gpu.attention, t, window, hq, hkv, d, sinks, dtype, blocks=blocks, interpret=True)


def test_gpu_large_logits_stay_finite():
  q, k, v, _, _ = make(5, 100, 2, 1, 16, jnp.float32)
  q, k = 30 * q, 30 * k  # logits ~ 1e3: exp would overflow without the running max
  o = forward(pallas_gpu.attention, q, k, v, window=8, sinks=2, blocks=SMALL, interpret=True)
  assert rel(o, reference.attention(q, k, v, window=8, sinks=2)) <= 1e-5


@pytest.mark.slow
def test_gpu_large_logits_grads_stay_finite():
  q, k, v, do, _ = make(5, 200, 2, 1, 16, jnp.float32)
  q, k = 30 * q, 30 * k
  o, grads = value_and_grads(pallas_gpu.attention, q, k, v, do, window=8, sinks=2, blocks=SMALL, interpret=True)
  assert all(np.all(np.isfinite(x)) for x in (o, *grads))


TPU_FAST = [
    (63, 7, 4, 1, 16, 0, jnp.float32, False),
    (500, 200, 2, 2, 16, 5, jnp.float32, False),
    (500, None, 4, 2, 16, 0, jnp.float32, True),  # splash handles segment ids
    (300, 64, 4, 1, 64, 0, jnp.bfloat16, False),
    (1, 1, 2, 2, 16, 0, jnp.float32, False),
]


@pytest.mark.parametrize('case', TPU_FAST, ids=lambda c: 'T{}-w{}-H{}:{}-D{}-s{}-{}-seg{:d}'.format(
    *c[:6], jnp.dtype(c[6]).name, c[7]))
def test_tpu_kernel(case):
  t, window, hq, hkv, d, sinks, dtype, segments = case
  check(tpu, t, window, hq, hkv, d, sinks, dtype, segments)


def _visible_blocks(t, window, sinks, bq, bk):
  """[nq, nk] 0: no visible pair, 1: some, 2: all pairs visible (from the dense reference mask)."""
  vis = np.asarray(reference.visible(t, window=window, sinks=sinks))[0]
  tiles = vis.reshape(t // bq, bq, t // bk, bk)
  return np.where(tiles.all(axis=(1, 3)), 2, tiles.any(axis=(1, 3)).astype(int))


@pytest.mark.parametrize('window,sinks', [(1, 0), (7, 0), (64, 0), (100, 0), (None, 0), (16, 40), (1, 3)])
def test_gpu_block_ranges_visit_exactly_the_visible_blocks(window, sinks):
  """The loop bounds visit every block with a visible pair and no other (cost O(T*w)); unmasked = all visible."""
  t, bq, bk = 512, 64, 32
  cfg = pallas_gpu._Cfg(1.0, window, sinks, 1, config.GpuBlocks(bq, bk, bq, bk), True)
  want = _visible_blocks(t, window, sinks, bq, bk)
  got = np.zeros_like(want)
  for i in range(t // bq):
    sink_hi, lo, full_lo, full_hi, hi = (None if x is None else int(x) for x in pallas_gpu._kv_ranges(
        i * bq, bq, bk, t // bk, cfg))
    spans = [(0, sink_hi or 0, 1), (lo, full_lo, 1), (full_lo, full_hi, 2), (full_hi, hi, 1)]
    for start, end, kind in spans:
      assert not got[i, start:end].any(), 'block visited twice'
      got[i, start:end] = kind
  assert np.all((got > 0) == (want > 0))
  assert np.all(want[got == 2] == 2)
  got = np.zeros_like(want)
  for j in range(t // bk):
    lo, full_lo, full_hi, hi = (int(x) for x in pallas_gpu._q_ranges(j * bk, bq, bk, t // bq, cfg))
    got[lo:full_lo, j], got[full_lo:full_hi, j], got[full_hi:hi, j] = 1, 2, 1
  assert np.all((got > 0) == (want > 0))
  assert np.all(want[got == 2] == 2)


def test_window_at_least_t_equals_full_causal_batched_and_vmapped():
  q, k, v, _, _ = make(4, 100, 2, 1, 16, jnp.float32, b=2)
  full = reference.attention(q, k, v)
  for fn in (gpu, tpu):
    assert rel(forward(fn, q, k, v, window=10_000, sinks=3), full) <= 1e-5
    per_example = jax.vmap(lambda q, k, v, fn=fn: fn(q[None], k[None], v[None], window=100)[0])
    assert rel(forward(per_example, q, k, v), full) <= 1e-5


def test_gpu_segment_ids_raise():
  q, k, v, _, seg = make(1, 16, 2, 1, 16, jnp.float32, segments=True)
  with pytest.raises(ValueError, match='segment_ids'):
    gpu(q, k, v, segment_ids=seg)


def test_dispatch(monkeypatch):
  q, k, v, _, seg = make(2, 16, 2, 1, 16, jnp.float32, segments=True)
  auto = lambda q, **kw: api._auto(q, kw.get('window'), kw.get('sinks', 0), kw.get('segment_ids'))
  assert auto(q) == 'xla'  # CPU: never interpret mode.
  monkeypatch.setattr(jax, 'default_backend', lambda: 'tpu')
  assert auto(q, window=8, sinks=2, segment_ids=seg) == 'pallas_tpu'
  with pytest.raises(RuntimeError, match="'pallas_gpu' needs a GPU"):
    gpu(q, k, v)
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  with pytest.raises(RuntimeError, match="'pallas_tpu' needs a TPU"):
    tpu(q, k, v)
  bf = q.astype(jnp.bfloat16)
  for window, bucket in ((1, 128), (128, 128), (129, 512), (2048, 2048), (4096, None), (None, None)):
    assert api._bucket(window, 4096) == bucket
    assert auto(bf, window=window) == dict(api._GPU_BY_WINDOW)[api._bucket(window, 16)]
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    assert auto(q, window=8) == 'pallas_gpu'  # cuDNN has no fp32
    assert auto(bf, window=8, sinks=2) == 'pallas_gpu'  # nor sinks
    assert auto(bf, window=8, segment_ids=seg) == 'xla'
    assert auto(bf[..., :12], window=8) == 'xla'  # 12 is no power of two for the Pallas kernel
  assert auto(bf, window=None, sinks=2) == dict(api._GPU_BY_WINDOW)[None]  # full causal: sinks moot


# Exhaustive grid (slow): every window x T x GQA map in fp32 through the table blocks and the small ones, and bf16
# and sinks on the longest T; every table block configuration the dispatcher can pick.
_WINDOWS = (1, 7, 64, 128, 200, 1000, None)
_TS = (1, 63, 128, 500)
_GQA = ((4, 1), (2, 2))


@pytest.mark.slow
@pytest.mark.parametrize('t,window,gqa,blocks', list(itertools.product(_TS, _WINDOWS, _GQA, (None, SMALL))))
def test_gpu_grid(t, window, gqa, blocks):
  check(pallas_gpu.attention, t, window, *gqa, 16, blocks=blocks, interpret=True)


@pytest.mark.slow
@pytest.mark.parametrize('window,sinks,dtype', list(itertools.product(_WINDOWS, (0, 5), (jnp.float32,
                                                                                        jnp.bfloat16))))
def test_gpu_grid_sinks_dtypes(window, sinks, dtype):
  check(pallas_gpu.attention, 500, window, 4, 1, 64, sinks, dtype, blocks=SMALL, interpret=True)


@pytest.mark.slow
@pytest.mark.parametrize('d,itemsize,blocks', config.all_gpu_blocks(itemsizes=(2, 4)), ids=str)
def test_gpu_every_table_config(d, itemsize, blocks):
  dtype = {2: jnp.bfloat16, 4: jnp.float32}[itemsize]
  check(pallas_gpu.attention, 300, 100, 4, 1, d, 3, dtype, blocks=blocks, interpret=True)
  check(pallas_gpu.attention, 300, None, 2, 2, d, 0, dtype, blocks=blocks, interpret=True)


@pytest.mark.slow
@pytest.mark.parametrize('t,window,gqa,sinks', list(itertools.product(_TS, _WINDOWS, _GQA, (0, 5))))
def test_tpu_grid(t, window, gqa, sinks):
  check(tpu, t, window, *gqa, 16, sinks)


@pytest.mark.slow
@pytest.mark.parametrize('window', _WINDOWS)
def test_tpu_bf16_d128(window):
  check(tpu, 300, window, 4, 2, 128, 0, jnp.bfloat16)
