"""Attention kernels against an independent float64 NumPy oracle: values, gradients, masks, dispatch, cost."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.kernels import attention
from hybrid_jax.kernels.attention import reference
from hybrid_jax.kernels.attention import xla


def oracle(q, k, v, *, window=None, scale=None, sinks=0, segment_ids=None):
  """Float64 dense attention written straight from the definition, one (batch, query head) at a time."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  b, t, hq, d = q.shape
  group = hq // k.shape[2]
  scale = d**-0.5 if scale is None else scale
  i, j = np.arange(t)[:, None], np.arange(t)[None, :]
  allowed = j <= i
  if window is not None:
    allowed = allowed & ((j > i - window) | (j < sinks))
  out = np.zeros_like(q)
  for bi in range(b):
    mask = allowed
    if segment_ids is not None:
      seg = np.asarray(segment_ids[bi])
      mask = mask & (seg[:, None] == seg[None, :])
    for h in range(hq):
      s = scale * q[bi, :, h] @ k[bi, :, h // group].T
      s = np.where(mask, s, -np.inf)
      p = np.exp(s - s.max(axis=1, keepdims=True))
      out[bi, :, h] = (p / p.sum(axis=1, keepdims=True)) @ v[bi, :, h // group]
  return out


def rel(x, ref, floor=0.0):
  """Relative RMS error; `floor` bounds the denominator where the reference may be exactly zero."""
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  assert np.all(np.isfinite(x)), 'non-finite values'
  return np.linalg.norm(x - ref) / max(np.linalg.norm(ref), floor)


def check_grads(got, want, tol):
  """dq and dk vanish exactly when a query sees one key (window 1, T = 1): judge them on dv's scale there."""
  floor = 0.1 * np.linalg.norm(want[2])
  for name, g, w in zip('qkv', got, want):
    assert rel(g, w, floor) <= tol, f'd{name}'



def make(seed, b, t, hq, hkv, d, dtype=jnp.float32, segments=False):
  rng = np.random.default_rng(seed)
  q, k, v, do = (rng.standard_normal((b, t, h, d)) for h in (hq, hkv, hkv, hq))
  seg = np.sort(rng.integers(0, 4, (b, t)), axis=1).astype(np.int32) if segments else None
  cast = lambda x: jnp.asarray(x, dtype)
  return cast(q), cast(k), cast(v), cast(do), None if seg is None else jnp.asarray(seg)


def value_and_grads(fn, q, k, v, do, **kw):
  """fn's output and the gradients of sum(o * do) with respect to q, k, v, in one compiled call."""
  def run(q, k, v, do):
    o, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, **kw), q, k, v)
    return o, vjp(do.astype(o.dtype))
  return jax.jit(run)(q, k, v, do)


def grads(fn, q, k, v, do, **kw):
  return value_and_grads(fn, q, k, v, do, **kw)[1]


def call(fn, *args, **kw):
  """Compiles once instead of dispatching op by op (much faster on CPU for many shapes)."""
  return jax.jit(lambda *a: fn(*a, **kw))(*args)


def up64(x):
  return jnp.asarray(np.asarray(x, np.float64))


def f64_grads(q, k, v, do, **kw):
  """Gradients of the float64 reference (itself checked against the NumPy oracle below)."""
  with jax.enable_x64(True):
    return [np.asarray(g) for g in grads(reference.attention, up64(q), up64(k), up64(v), up64(do), **kw)]


# (T, window, block size, Hq, Hkv, D, sinks, segment ids)
CASES = [
    (1, None, None, 4, 1, 16, 0, False),
    (63, 7, 16, 4, 1, 16, 0, True),
    (63, 64, None, 4, 1, 16, 0, False),  # window >= T: full causal
    (128, 128, 128, 2, 2, 64, 0, False),  # window = T
    (500, 1, 16, 2, 2, 16, 0, False),
    (500, 7, None, 4, 1, 16, 0, False),
    (500, 64, 32, 2, 2, 16, 0, True),
    (500, 128, 128, 4, 1, 16, 0, False),  # window = block size
    (500, 200, 128, 4, 1, 16, 0, False),  # window not a multiple of the block
    (500, 16, None, 4, 1, 16, 4, True),  # sinks and segments
    (500, 16, 16, 2, 1, 16, 40, False),  # sinks spanning several blocks
    (500, 1000, None, 4, 1, 16, 4, False),  # window > T: full causal, sinks moot
    (500, None, None, 4, 1, 16, 0, True),
    (256, 64, 64, 4, 1, 128, 0, False),
]
CASE_IDS = ['T{}-w{}-C{}-H{}:{}-D{}-sinks{}-seg{:d}'.format(*case) for case in CASES]


@functools.lru_cache(maxsize=None)
def expected(case):
  """Inputs, the NumPy oracle's output, and the float64 reference's output and gradients for one case.

  Cached: both tests below use them, and compiling dominates the runtime on CPU.
  """
  t, window, _, hq, hkv, d, sinks, segments = case
  q, k, v, do, seg = make(t, 2 if segments else 1, t, hq, hkv, d, segments=segments)
  kw = dict(window=window, sinks=sinks, segment_ids=seg)
  with jax.enable_x64(True):
    o64, g64 = value_and_grads(reference.attention, up64(q), up64(k), up64(v), up64(do), **kw)
    assert o64.dtype == jnp.float64
  return (q, k, v, do), kw, oracle(q, k, v, **kw), np.asarray(o64), [np.asarray(g) for g in g64]


@pytest.mark.parametrize('case', CASES, ids=CASE_IDS)
def test_reference_matches_numpy_oracle(case):
  _, _, want, o64, _ = expected(case)
  assert rel(o64, want) <= 1e-12


@pytest.mark.parametrize('case', CASES, ids=CASE_IDS)
def test_xla_values_and_grads_fp32(case):
  (q, k, v, do), kw, want, _, g64 = expected(case)
  o, got = value_and_grads(xla.attention, q, k, v, do, block_size=case[2], **kw)
  assert o.dtype == jnp.float32
  assert rel(o, want) <= 1e-5
  check_grads(got, g64, 1e-5)


@pytest.mark.parametrize('t,window,sinks,segments', [(500, 64, 0, False), (500, None, 0, False), (300, 16, 4, True)])
def test_xla_bf16(t, window, sinks, segments):
  q, k, v, do, seg = make(2, 2, t, 4, 1, 64, dtype=jnp.bfloat16, segments=segments)
  kw = dict(window=window, sinks=sinks, segment_ids=seg)
  o, got = value_and_grads(xla.attention, q, k, v, do, **kw)
  assert o.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in got)
  assert rel(o, oracle(q, k, v, **kw)) <= 5e-3
  check_grads(got, f64_grads(q, k, v, do, **kw), 1e-2)


LSE_CASES = [CASES[0], (300, 24, 32, 4, 2, 16, 3, True), CASES[12]]  # GQA 4:2, sinks, segments, full causal
LSE_IDS = ['T{}-w{}-C{}-H{}:{}-D{}-sinks{}-seg{:d}'.format(*case) for case in LSE_CASES]


@pytest.mark.parametrize('case', LSE_CASES, ids=LSE_IDS)
def test_xla_row_log_sum_exp(case):
  """return_lse: each row's log-sum-exp over its visible keys of the scaled logits (what learned sinks scale by)."""
  t, window, block, hq, hkv, d, sinks, segments = case
  q, k, v, _, seg = make(t, 2 if segments else 1, t, hq, hkv, d, segments=segments)
  o, lse = call(xla.attention, q, k, v, window=window, sinks=sinks, segment_ids=seg, block_size=block, scale=0.3,
                return_lse=True)
  assert lse.shape == q.shape[:3] and lse.dtype == jnp.float32
  assert rel(o, oracle(q, k, v, window=window, sinks=sinks, segment_ids=seg, scale=0.3)) <= 1e-5
  i, j = np.arange(t)[:, None], np.arange(t)[None, :]
  allowed = (j <= i) & (True if window is None else (j > i - window) | (j < sinks))
  want = np.zeros(lse.shape)
  for bi in range(q.shape[0]):
    mask = allowed if seg is None else allowed & (np.asarray(seg[bi])[:, None] == np.asarray(seg[bi])[None, :])
    for h in range(hq):
      s = np.where(mask, 0.3 * np.asarray(q[bi, :, h], np.float64) @ np.asarray(k[bi, :, h // (hq // hkv)]).T,
                   -np.inf)
      want[bi, :, h] = np.log(np.exp(s - s.max(1, keepdims=True)).sum(1)) + s.max(1)
  assert np.abs(np.asarray(lse) - want).max() <= 1e-5 * max(1.0, np.abs(want).max())



def _dense_lse_reference(q, k, v, *, window, sinks, segment_ids, scale):
  """(o, lse) by dense masked softmax in plain jnp: differentiated by autodiff, the written-out backward's referee."""
  t, group = q.shape[1], q.shape[2] // k.shape[2]
  i, j = jnp.arange(t)[:, None], jnp.arange(t)[None, :]
  mask = (j <= i) & (True if window is None else (j > i - window) | (j < sinks))
  mask = mask[None, None] if segment_ids is None else mask & (segment_ids[:, None, :, None] ==
                                                               segment_ids[:, None, None, :])
  kx, vx = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
  s = jnp.where(mask, scale * jnp.einsum('bqhd,bkhd->bhqk', q, kx), -jnp.inf)
  lse = jax.nn.logsumexp(s, axis=-1)
  return jnp.einsum('bhqk,bkhd->bqhd', jnp.exp(s - lse[..., None]), vx), lse.transpose(0, 2, 1)


@pytest.mark.parametrize('case', LSE_CASES, ids=LSE_IDS)
def test_xla_row_log_sum_exp_gradients(case):
  """Gradients through o and lse together (learned sinks read both) equal float64 autodiff of a dense softmax."""
  t, window, block, hq, hkv, d, sinks, segments = case
  q, k, v, do, seg = make(t + 1, 2 if segments else 1, t, hq, hkv, d, segments=segments)
  dlse = jnp.asarray(np.random.default_rng(t).standard_normal(q.shape[:3]), jnp.float32)
  kw = dict(window=window, sinks=sinks, segment_ids=seg, scale=0.3)

  def loss(fn, q, k, v, **extra):
    o, lse = fn(q, k, v, **kw, **extra)
    return jnp.sum(o * do.astype(o.dtype)) + jnp.sum(lse * dlse.astype(lse.dtype))
  got = jax.jit(jax.grad(lambda *a: loss(xla.attention, *a, block_size=block, return_lse=True), (0, 1, 2)))(q, k, v)
  with jax.enable_x64(True):
    want = jax.grad(lambda *a: loss(_dense_lse_reference, *a), (0, 1, 2))(up64(q), up64(k), up64(v))
  check_grads(got, [np.asarray(w) for w in want], 1e-5)

def test_block_sizes_agree():
  q, k, v, _, seg = make(3, 2, 300, 4, 2, 16, segments=True)
  outs = [call(xla.attention, q, k, v, window=40, sinks=2, segment_ids=seg, block_size=c) for c in (16, 32, 64)]
  for o in outs[1:]:
    assert rel(o, outs[0]) <= 1e-6


def test_window_at_least_t_is_full_causal():
  q, k, v, _, _ = make(4, 1, 100, 2, 1, 16)
  full = call(attention, q, k, v)
  for impl in ('xla', 'reference'):
    for w in (100, 10_000):
      assert rel(call(attention, q, k, v, window=w, implementation=impl), full) <= 1e-6


def test_large_logits_stay_finite():
  q, k, v, do, _ = make(5, 1, 200, 2, 1, 16)
  q, k = 30 * q, 30 * k  # logits ~ 1e3: exp would overflow without the row max
  for w in (8, None):
    o, got = value_and_grads(xla.attention, q, k, v, do, window=w, sinks=2, block_size=16)
    assert all(np.all(np.isfinite(g)) for g in got)
    assert rel(o, oracle(q, k, v, window=w, sinks=2)) <= 1e-5


def test_jit_and_vmap():
  q, k, v, _, seg = make(6, 3, 130, 4, 2, 16, segments=True)
  fn = jax.jit(jax.vmap(lambda q, k, v, s: attention(q[None], k[None], v[None], window=20, sinks=1,
                                                     segment_ids=s[None])[0]))
  o = fn(q, k, v, seg)
  assert rel(o, oracle(q, k, v, window=20, sinks=1, segment_ids=seg)) <= 1e-5


def test_default_dispatch_is_xla():
  q, k, v, _, _ = make(7, 1, 150, 4, 1, 16)
  want = call(xla.attention, q, k, v, window=32)
  for impl in (None, 'auto', 'xla'):
    np.testing.assert_array_equal(call(attention, q, k, v, window=32, implementation=impl), want)
  assert rel(call(attention, q, k, v, window=32, implementation='reference'), want) <= 1e-6


def test_dispatch_errors():
  q, k, v, _, _ = make(8, 1, 16, 4, 2, 8)
  if jax.default_backend() != 'gpu':
    with pytest.raises(RuntimeError, match='needs a GPU'):
      attention(q, k, v, implementation='cudnn')
  other = {'gpu': 'pallas_tpu', 'tpu': 'pallas_gpu'}.get(jax.default_backend())
  if other:  # On CPU both Pallas kernels run in interpret mode (tests/test_attention_pallas.py).
    with pytest.raises(RuntimeError, match='needs a'):
      attention(q, k, v, implementation=other)
  with pytest.raises(ValueError, match="'xla'"):
    attention(q, k, v, implementation='flash')


@pytest.mark.parametrize('change,match', [
    (dict(q=np.zeros((16, 4, 8))), 'rank 4'),
    (dict(q=np.zeros((1, 16, 3, 8))), 'multiple of kv heads'),
    (dict(v=np.zeros((1, 16, 1, 8))), 'same shape'),
    (dict(k=np.zeros((1, 15, 2, 8)), v=np.zeros((1, 15, 2, 8))), 'match q'),
    (dict(window=0), 'window'),
    (dict(window=-3), 'window'),
    (dict(window=2.5), 'window'),
    (dict(sinks=-1), 'sinks'),
    (dict(segment_ids=np.zeros((1, 15), np.int32)), 'segment_ids'),
    (dict(segment_ids=np.zeros((1, 16), np.float32)), 'segment_ids'),
])
def test_bad_arguments(change, match):
  args = dict(q=np.zeros((1, 16, 4, 8), np.float32), k=np.zeros((1, 16, 2, 8), np.float32),
              v=np.zeros((1, 16, 2, 8), np.float32))
  args.update(change)
  with pytest.raises(ValueError, match=match):
    attention(**{name: jnp.asarray(x) if isinstance(x, np.ndarray) else x for name, x in args.items()})


def _compiled_cost(t, window):
  spec = jax.ShapeDtypeStruct((1, t, 2, 32), jnp.float32)
  compiled = jax.jit(lambda q, k, v: xla.attention(q, k, v, window=window)).lower(spec, spec, spec).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return cost['flops'], compiled.memory_analysis().temp_size_in_bytes


def test_sliding_window_cost_is_linear_in_t():
  (f1, m1), (f2, m2) = _compiled_cost(2048, 128), _compiled_cost(4096, 128)
  assert f2 / f1 < 2.5 and m2 / m1 < 2.5
  (f1, m1), (f2, m2) = _compiled_cost(2048, None), _compiled_cost(4096, None)
  assert f2 / f1 > 3 and m2 / m1 > 3
