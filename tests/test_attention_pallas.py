"""Pallas attention kernels (GPU-style and TPU splash) in interpret mode against the float64 reference.

Interpret mode is slow, so shapes are tiny and the fast set is a representative subset: every window (1, 7, 64,
128 = a block, 200, >= T, full), T (1, 63, 128, 500), GQA map (4:1, 1:1), sinks and dtype appears in it at least
once. The exhaustive grid is in the end-to-end tier (`pytest -m e2e tests/test_attention_pallas.py`). Documents
(`segment_ids`) are checked on rows that hold every kind of boundary (on a block edge, inside a block, documents
of one token, the padding past T), and the block ranges are checked against the dense mask.
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
from hybrid_jax.kernels.attention import cudnn_documents
from hybrid_jax.kernels.attention import pallas_gpu
from hybrid_jax.kernels.attention import reference

TOL = {jnp.float32: (1e-5, 1e-5), jnp.bfloat16: (5e-3, 1e-2)}  # (output, gradients) relative RMS
SMALL = config.GpuBlocks(32, 16, 16, 32)  # Many blocks per short sequence: exercises every loop range.


def rel(x, ref, floor=0.0):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  assert np.all(np.isfinite(x)), 'non-finite values'
  return np.linalg.norm(x - ref) / max(np.linalg.norm(ref), floor)


def make(seed, t, hq, hkv, d, dtype, segments=False, b=1):
  """q, k, v, do and segment_ids: None, sorted random ids (segments=True) or the run indices of `segments`, a
  list of document lengths per row (then B is its length)."""
  if isinstance(segments, (list, tuple)):
    b = len(segments)
  rng = np.random.default_rng(seed)
  q, k, v, do = (jnp.asarray(rng.standard_normal((b, t, h, d)), dtype) for h in (hq, hkv, hkv, hq))
  if isinstance(segments, (list, tuple)):
    seg = jnp.asarray(np.stack([runs(lengths, t) for lengths in segments]))
  else:
    seg = jnp.asarray(np.sort(rng.integers(0, 3, (b, t))).astype(np.int32)) if segments else None
  return q, k, v, do, seg


def runs(lengths, t):
  """int32 [T] run indices of documents of these lengths (which must sum to T)."""
  assert sum(lengths) == t, (sum(lengths), t)
  return np.repeat(np.arange(len(lengths)), lengths).astype(np.int32)


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


def gpu_interpret(q, k, v, **kw):
  return pallas_gpu.attention(q, k, v, interpret=True, **kw)


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


@pytest.mark.e2e
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


def _visible_blocks(t, window, sinks, bq, bk, seg=None):
  """[nq, nk] 0: no visible pair, 1: some, 2: all pairs visible (from the dense reference mask)."""
  seg = None if seg is None else jnp.asarray(seg)[None]
  vis = np.asarray(reference.visible(t, window=window, sinks=sinks, segment_ids=seg))[0]
  tiles = vis.reshape(t // bq, bq, t // bk, bk)
  return np.where(tiles.all(axis=(1, 3)), 2, tiles.any(axis=(1, 3)).astype(int))


def _visited_blocks(t, window, sinks, bq, bk, seg=None):
  """[nq, nk] block maps the forward/dQ loop bounds (`_kv_ranges`) and the dK/dV ones (`_q_ranges`) visit:
  0 not visited, 1 masked, 2 full (unmasked); a block visited twice fails."""
  cfg = pallas_gpu._Cfg(1.0, window, sinks, 1, config.GpuBlocks(bq, bk, bq, bk), True, seg is not None)
  first = last = None
  if seg is not None:
    first, last = (np.asarray(x)[0] for x in pallas_gpu._documents(jnp.asarray(seg)[None], t))
  by_q = np.zeros((t // bq, t // bk), int)
  for i in range(t // bq):
    rows = None if first is None else first[i * bq:(i + 1) * bq]
    for start, end, masked in pallas_gpu._kv_ranges(i * bq, bq, bk, t // bk, cfg, rows):
      start, end = int(start), int(end)
      assert not by_q[i, start:end].any(), 'block visited twice'
      by_q[i, start:end] = 1 if masked else 2
  by_k = np.zeros_like(by_q)
  for j in range(t // bk):
    keys = None if last is None else last[j * bk:(j + 1) * bk]
    for start, end, masked in pallas_gpu._q_ranges(j * bk, bq, bk, t // bq, cfg, keys):
      start, end = int(start), int(end)
      assert not by_k[start:end, j].any(), 'block visited twice'
      by_k[start:end, j] = 1 if masked else 2
  return by_q, by_k


# Run indices of a 512-token row: one-token documents, boundaries on 32- and 64-row block edges and inside blocks,
# a document that starts on a 32-block's last key (159) and one that covers one (127) and ends on a 64-block's
# first row (128).
MIXED_DOCS = runs([1, 63, 1, 1, 30, 33, 30, 101, 3, 121, 128], 512)


@pytest.mark.parametrize('docs', (False, True), ids=('rows', 'documents'))
@pytest.mark.parametrize('window,sinks', [(1, 0), (7, 0), (64, 0), (100, 0), (None, 0), (16, 40), (1, 3)])
def test_gpu_block_ranges_visit_exactly_the_visible_blocks(window, sinks, docs):
  """The loop bounds visit every block with a visible pair and no other (cost O(T*w), and with documents no block
  outside them); unmasked = all visible."""
  t, bq, bk = 512, 64, 32
  seg = MIXED_DOCS if docs else None
  want = _visible_blocks(t, window, sinks, bq, bk, seg)
  for got in _visited_blocks(t, window, sinks, bq, bk, seg):
    assert np.all((got > 0) == (want > 0))
    assert np.all(want[got == 2] == 2)


@pytest.mark.parametrize('bq,bk', [(128, 64), (32, 128), (128, 32), (64, 64)])  # the table's forward, dK/dV, dQ
@pytest.mark.parametrize('window', [None, 128])
def test_gpu_short_documents_visit_fewer_blocks(bq, bk, window):
  """16 documents of 64 tokens at T = 1024: the forward/dQ and dK/dV loops visit only the blocks the documents
  reach (what the dense mask says), 4.5-8.5x fewer than the same row without documents (1.9-2.8x with a window
  of 128)."""
  t = 1024
  seg = runs([64] * 16, t)
  want = _visible_blocks(t, window, 0, bq, bk, seg)
  for docs, rows in zip(_visited_blocks(t, window, 0, bq, bk, seg), _visited_blocks(t, window, 0, bq, bk)):
    assert np.all((docs > 0) == (want > 0))
    visited, unmasked = np.count_nonzero(docs), np.count_nonzero(rows)
    assert visited * (4 if window is None else 1.5) <= unmasked, (visited, unmasked)


def test_window_at_least_t_equals_full_causal_batched_and_vmapped():
  q, k, v, _, _ = make(4, 100, 2, 1, 16, jnp.float32, b=2)
  full = reference.attention(q, k, v)
  for fn in (gpu, tpu):
    assert rel(forward(fn, q, k, v, window=10_000, sinks=3), full) <= 1e-5
    per_example = jax.vmap(lambda q, k, v, fn=fn: fn(q[None], k[None], v[None], window=100)[0])
    assert rel(forward(per_example, q, k, v), full) <= 1e-5


# Document layouts (lengths per row). T = 100 with SMALL blocks (32/16 forward, 16/32 backward; padded to 128):
# row 0 has boundaries on block edges (32, 64), two one-token documents (32, 33) and one inside a block (81); row 1
# only inside blocks (5, 49, 50), a one-token document and one that ends on the first row of a q block (48) after
# covering a kv block's last key (31). T = 300 with the table blocks (128/64 forward, 32/128 dK/dV, 128/32 dQ;
# padded to 384): boundaries on the 128 edge and inside blocks, one-token documents (63: on a kv block's last key),
# a document that starts on a kv block's last key (191) and holds a q block's first row (256).
DOCS_100 = ([32, 1, 1, 30, 17, 19], [5, 44, 1, 50])
DOCS_300 = ([128, 1, 100, 71], [1, 62, 1, 1, 126, 109])

# (T, window, Hq, Hkv, sinks, dtype, blocks, documents); D = 16.
GPU_DOCS = [
    (100, None, 4, 1, 0, jnp.float32, SMALL, DOCS_100),  # full causal, GQA
    (100, 8, 2, 2, 0, jnp.float32, SMALL, DOCS_100),  # window smaller than most documents
    (100, 48, 4, 2, 3, jnp.float32, SMALL, DOCS_100),  # window larger than most documents, sinks
    (300, 100, 4, 1, 0, jnp.float32, None, DOCS_300),  # the table blocks: documents cross 128-row blocks
    (100, 20, 4, 1, 0, jnp.bfloat16, SMALL, DOCS_100),
    (300, None, 2, 1, 0, jnp.bfloat16, None, DOCS_300),
]


@pytest.mark.parametrize('case', GPU_DOCS, ids=lambda c: 'T{}-w{}-H{}:{}-s{}-{}-{}'.format(
    *c[:5], jnp.dtype(c[5]).name, 'small' if c[6] == SMALL else 'table'))
def test_gpu_documents(case):
  """Output and dq, dk, dv with segment_ids (run indices, as `attention` passes them) against the reference."""
  t, window, hq, hkv, sinks, dtype, blocks, docs = case
  check(gpu_interpret, t, window, hq, hkv, 16, sinks, dtype, docs, blocks=blocks)


def test_gpu_one_document_equals_no_documents():
  """A row that is one document computes what no segment_ids computes (the padding past T is its own document)."""
  q, k, v, do, seg = make(3, 100, 4, 1, 16, jnp.float32, ([100], [100]))
  for window, sinks in ((None, 0), (8, 2)):
    kw = dict(window=window, sinks=sinks, blocks=SMALL)
    o, grads = value_and_grads(gpu_interpret, q, k, v, do, segment_ids=seg, **kw)
    o0, grads0 = value_and_grads(gpu_interpret, q, k, v, do, **kw)
    for x, x0 in zip((o, *grads), (o0, *grads0)):
      np.testing.assert_allclose(np.asarray(x), np.asarray(x0), rtol=1e-6, atol=1e-7)  # fp rounding only


def test_gpu_documents_batched_and_vmapped():
  q, k, v, _, seg = make(6, 100, 2, 1, 16, jnp.float32, DOCS_100)
  want = reference.attention(q, k, v, window=20, segment_ids=seg)
  kw = dict(window=20, blocks=SMALL)
  assert rel(forward(gpu_interpret, q, k, v, segment_ids=seg, **kw), want) <= 1e-5
  per_example = jax.vmap(lambda q, k, v, s: gpu_interpret(q[None], k[None], v[None], segment_ids=s[None], **kw)[0])
  assert rel(forward(per_example, q, k, v, seg), want) <= 1e-5


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
    monkeypatch.setattr(cudnn_documents, 'unsupported', lambda: 'cuDNN 90500 is older than 90600')
    assert auto(bf, window=8, segment_ids=seg) == 'pallas_gpu'  # A cuDNN without packed documents
    assert auto(bf[..., :12], window=8, segment_ids=seg) == 'xla'
    assert auto(bf[..., :12], window=8) == 'xla'  # 12 is no power of two for the Pallas kernel
  assert auto(bf, window=None, sinks=2) == dict(api._GPU_BY_WINDOW)[None]  # full causal: sinks moot


# Exhaustive grid (end-to-end tier): every window x T x GQA map in fp32 through the table blocks and the small ones, and bf16
# and sinks on the longest T; every table block configuration the dispatcher can pick.
_WINDOWS = (1, 7, 64, 128, 200, 1000, None)
_TS = (1, 63, 128, 500)
_GQA = ((4, 1), (2, 2))


@pytest.mark.e2e
@pytest.mark.parametrize('t,window,gqa,blocks', list(itertools.product(_TS, _WINDOWS, _GQA, (None, SMALL))))
def test_gpu_grid(t, window, gqa, blocks):
  check(pallas_gpu.attention, t, window, *gqa, 16, blocks=blocks, interpret=True)


@pytest.mark.e2e
@pytest.mark.parametrize('window,sinks,dtype', list(itertools.product(_WINDOWS, (0, 5), (jnp.float32,
                                                                                        jnp.bfloat16))))
def test_gpu_grid_sinks_dtypes(window, sinks, dtype):
  check(pallas_gpu.attention, 500, window, 4, 1, 64, sinks, dtype, blocks=SMALL, interpret=True)


@pytest.mark.e2e
@pytest.mark.parametrize('d,itemsize,blocks', config.all_gpu_blocks(itemsizes=(2, 4)), ids=str)
def test_gpu_every_table_config(d, itemsize, blocks):
  dtype = {2: jnp.bfloat16, 4: jnp.float32}[itemsize]
  check(pallas_gpu.attention, 300, 100, 4, 1, d, 3, dtype, blocks=blocks, interpret=True)
  check(pallas_gpu.attention, 300, None, 2, 2, d, 0, dtype, blocks=blocks, interpret=True)


@pytest.mark.e2e
@pytest.mark.parametrize('t,window,gqa,sinks', list(itertools.product(_TS, _WINDOWS, _GQA, (0, 5))))
def test_tpu_grid(t, window, gqa, sinks):
  check(tpu, t, window, *gqa, 16, sinks)


@pytest.mark.e2e
@pytest.mark.parametrize('window', _WINDOWS)
def test_tpu_bf16_d128(window):
  check(tpu, 300, window, 4, 2, 128, 0, jnp.bfloat16)
