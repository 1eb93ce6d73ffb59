"""Pallas scan kernels (GPU- and TPU-style, linear scan and gated delta rule) in interpret mode on CPU.

Values, final states and the gradients of every input (loss = sum(o * do) + sum(S_T * dS), non-zero initial state)
against the float64 token-by-token reference on the same rounded inputs; thresholds as docs/KERNELS.md,
"Tolerances" (fp32 1e-5; bf16 5e-3 outputs/states, 1e-2 dq/dk/dv and d initial_state, 2e-2 gate and beta).
Interpret-mode programs are compile-bound, so cases that differ only in data (gate exactly 0, zeroed at random, strong decay) share one compiled program, and shapes
are tiny. Larger head dims and long sequences are in the end-to-end tier (`pytest -m e2e tests/test_scan_pallas.py`).
"""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.bench.kernel_errors import FAST_COMPILE  # Interpret-mode programs are compile-bound.
from hybrid_jax.kernels import gated_delta_rule
from hybrid_jax.kernels import linear_scan
from hybrid_jax.kernels.delta_rule import api as delta_api
from hybrid_jax.kernels import scan_checks
from hybrid_jax.kernels.delta_rule import pallas_delta
from hybrid_jax.kernels.linear_scan import api as linear_api
from hybrid_jax.kernels.linear_scan import pallas_scan
from tests.test_scan_kernels import make
from tests.test_scan_kernels import oracle_of
from tests.test_scan_kernels import rel

KERNELS = {'linear': linear_scan, 'delta': gated_delta_rule}
IMPLS = ('pallas_gpu', 'pallas_tpu')
NAMES = {'linear': ('q', 'k', 'v', 'log_decay', 'initial_state'),
         'delta': ('q', 'k', 'v', 'log_decay', 'beta', 'initial_state')}


@functools.lru_cache(maxsize=None)
def _compiled(kernel, impl, chunk, shapes, grads):
  """One compiled program per (kernel, implementation, chunk, input shapes/dtypes, with gradients or not)."""
  def f(inputs, s0):
    return KERNELS[kernel](*inputs, initial_state=s0, implementation=impl, chunk_size=chunk)

  def run(inputs, s0, do, ds):
    if not grads:
      return f(inputs, s0)
    (o, s), vjp = jax.vjp(f, inputs, s0)
    di, ds0 = vjp((do.astype(o.dtype), ds.astype(s.dtype)))
    return o, s, list(di) + [ds0]

  args = [[jax.ShapeDtypeStruct(*x) for x in shapes[0]]] + [jax.ShapeDtypeStruct(*x) for x in shapes[1:]]
  return jax.jit(run).lower(*args).compile(FAST_COMPILE if impl.startswith('pallas') else None)


def run(kernel, impl, args, cots, chunk, grads=True):
  inputs, s0 = list(args[:-1]), args[-1]
  do, ds = cots
  sig = lambda x: (tuple(x.shape), jnp.dtype(x.dtype))
  shapes = (tuple(sig(x) for x in inputs), sig(s0), sig(do), sig(ds))
  return _compiled(kernel, impl, chunk, shapes, grads)(inputs, s0, do, ds)


def reference(kernel, args, cots):
  """Float64 reference output, state and gradients on the same (rounded) inputs."""
  up = lambda x: jnp.asarray(np.asarray(x, np.float64))
  with jax.enable_x64(True):
    o, s, g = run(kernel, 'reference', [up(x) for x in args], [up(c) for c in cots], 64)
    return np.asarray(o), np.asarray(s), [np.asarray(x) for x in g]


def inputs(seed, kernel, dtype=jnp.float32, gates='random', **shape):
  args, cots = make(seed, kernel, **shape, gates=gates)
  return [x.astype(dtype) if i < 3 else x for i, x in enumerate(args)], cots


def check(kernel, impl, args, cots, chunk, dtype=jnp.float32):
  compare(kernel, run(kernel, impl, args, cots, chunk), args, cots, dtype)


def compare(kernel, got, args, cots, dtype=jnp.float32):
  """Output, final state and every input's gradient against the float64 reference, within the tolerances of
  docs/KERNELS.md."""
  o, s, grads = got
  o64, s64, g64 = reference(kernel, args, cots)
  assert o.dtype == dtype and s.dtype == jnp.float32
  bf16 = dtype != jnp.float32
  out_tol = 5e-3 if bf16 else 1e-5
  errors = {'o': rel(o, o64), 'S_T': rel(s, s64)}
  assert errors['o'] <= out_tol and errors['S_T'] <= out_tol, errors
  for name, got, want in zip(NAMES[kernel], grads, g64):
    assert got.shape == want.shape, name
    tol = (2e-2 if name in ('log_decay', 'beta') else 1e-2) if bf16 else 1e-5
    err = rel(got, want)
    assert err <= tol, f'd{name}: {err:.2e} > {tol:.0e}'


SMALL = dict(b=1, t=75, hk=1, hv=2, dk=16, dv=16)  # GVA 1:2; T = 75 is no multiple of any chunk.
CASES = [(kernel, impl) for kernel in KERNELS for impl in IMPLS]
IDS = [f'{kernel}-{impl}' for kernel, impl in CASES]


@pytest.mark.parametrize('kernel,impl', CASES, ids=IDS)
def test_fp32_gate_cases(kernel, impl):
  """Random, exactly-0, randomly zeroed and strong (~ -20 per token) gates: one compiled program, four inputs."""
  for seed, gates in enumerate(('random', 'zero', 'sparse', 'strong')):
    args, cots = inputs(seed, kernel, gates=gates, **SMALL)
    check(kernel, impl, args, cots, chunk=32)


@pytest.mark.parametrize('kernel,impl', CASES, ids=IDS)
def test_chunk_sizes_agree(kernel, impl):
  """Chunks of 16 and 64 (five and two chunks of T = 75) match the float64 oracle too; for the GPU delta rule that
  is one and four 16-row inverse blocks, for the TPU product form 4 and 6 factors."""
  args, cots = inputs(7, kernel, gates='sparse', **SMALL)
  want_o, want_s = oracle_of(kernel, args)
  for chunk in (16, 64):
    o, s = run(kernel, impl, args, cots, chunk, grads=False)
    assert rel(o, want_o) <= 1e-5 and rel(s, want_s) <= 1e-5, chunk


@pytest.mark.parametrize('kernel,impl', CASES, ids=IDS)
def test_bf16(kernel, impl):
  args, cots = inputs(8, kernel, jnp.bfloat16, b=1, t=63, hk=1, hv=1, dk=32, dv=32)
  check(kernel, impl, args, cots, chunk=16, dtype=jnp.bfloat16)


GPU_BACKENDS = {'linear': functools.partial(pallas_scan.linear_scan, 'gpu'),
                'delta': functools.partial(pallas_delta.gated_delta_rule, 'gpu')}


@pytest.mark.parametrize('kernel', ['linear', pytest.param('delta', marks=pytest.mark.e2e)])
def test_several_value_blocks(kernel):
  """block_v < V: two 8-column value blocks of V = 16, each program carrying its own slice of the state, as every
  GPU run with V >= 128 does (block_v defaults to 64 there). Values, final state and every gradient."""
  args, cots = inputs(15, kernel, **SMALL)
  scale = args[0].shape[-1] ** -0.5

  def f(inputs, s0):
    return GPU_BACKENDS[kernel](*inputs, scale=scale, initial_state=s0, chunk_size=16, interpret=True, block_v=8)

  def value_and_grads(inputs, s0, do, ds):
    (o, s), vjp = jax.vjp(f, inputs, s0)
    di, ds0 = vjp((do.astype(o.dtype), ds.astype(s.dtype)))
    return o, s, list(di) + [ds0]

  jitted = jax.jit(value_and_grads).lower(list(args[:-1]), args[-1], *cots).compile(FAST_COMPILE)
  compare(kernel, jitted(list(args[:-1]), args[-1], *cots), args, cots)


def test_constant_per_head_decay():
  """Lightning's [Hv] log decay through the GPU kernel, gradient summed back to [Hv]."""
  args, cots = inputs(9, 'linear', gates='const', b=1, t=40, hk=2, hv=2, dk=16, dv=16)
  assert args[3].shape == (2,)
  o, s, grads = run('linear', 'pallas_gpu', args, cots, 16)
  o64, s64, g64 = reference('linear', args, cots)
  assert rel(o, o64) <= 1e-5 and rel(s, s64) <= 1e-5
  assert grads[3].shape == (2,) and rel(grads[3], g64[3]) <= 1e-5


def test_no_initial_state():
  args, cots = inputs(10, 'delta', **SMALL)
  args[-1] = None
  fn = lambda *x: gated_delta_rule(*x, implementation='pallas_tpu', chunk_size=32)
  o, s = jax.jit(fn).lower(*args[:-1]).compile(FAST_COMPILE)(*args[:-1])
  want_o, want_s = oracle_of('delta', args)
  assert rel(o, want_o) <= 1e-5 and rel(s, want_s) <= 1e-5


def product_inverse(lower):
  """The product form (I + N)(I + N^2)(I + N^4)... with N = -L: exact in exact arithmetic, but its powers of N grow
  combinatorially when the keys of a chunk share a direction (the TPU kernel's inverse before `recursive_inverse`)."""
  c = lower.shape[0]
  power = -lower
  inv = jnp.eye(c, dtype=lower.dtype) + power
  reach = 2
  while reach < c:
    power = power @ power
    inv = inv + inv @ power
    reach *= 2
  return inv


def chunk_lower(rng, c, cosine, beta, log_decay, d=32):
  """beta_i k_i.k_j exp(G_i - G_j) below the diagonal for L2-normalised keys whose mean pairwise cosine is about
  `cosine` (a shared direction plus noise), and the keys' realised mean pairwise cosine."""
  shared = rng.standard_normal(d)
  shared /= np.linalg.norm(shared)
  k = np.sqrt(cosine) * shared + np.sqrt(1 - cosine) * rng.standard_normal((c, d)) / np.sqrt(d)
  k /= np.linalg.norm(k, axis=1, keepdims=True)
  cum = np.cumsum(np.full(c, log_decay))
  gram = k @ k.T
  realised = (gram.sum() - c) / (c * (c - 1))
  return np.tril(beta * gram * np.exp(cum[:, None] - cum[None, :]), -1), realised


# (target mean key cosine, beta, log decay per token): independent keys, then keys sharing a direction up to
# identical ones, beta up to 2 (I - beta k k^T with a negative eigenvalue), no decay.
INVERSE_REGIMES = [(0.0, 0.5, -0.05), (0.5, 0.9, -0.01), (0.8, 0.99, -0.001), (0.95, 1.5, 0.0), (1.0, 2.0, 0.0),
                   (1.0, 1.0, 0.0)]


@pytest.mark.parametrize('c', [64, 128])
def test_inverses_hold_on_shared_key_directions(c):
  """`recursive_inverse` (TPU) stays within 2x of forward substitution's (the XLA path's) error against a float64
  solve where the keys of a chunk share a direction; the product form it replaced does not (so the cases reach the
  regime that broke it), and the GPU's 16-row substitution agrees on its block."""
  from hybrid_jax.kernels.delta_rule.xla import unit_lower_inverse
  rng = np.random.default_rng(11)
  for cosine, beta, log_decay in INVERSE_REGIMES:
    lower, realised = chunk_lower(rng, c, cosine, beta, log_decay)
    assert realised >= cosine - 0.05, (cosine, realised)
    want = np.linalg.inv(np.eye(c) + lower)
    lower32 = jnp.asarray(lower, jnp.float32)
    with jax.default_matmul_precision('highest'):
      err = rel(pallas_delta.recursive_inverse(lower32), want)
      floor = max(rel(unit_lower_inverse(lower32), want), 1e-7)
      product = np.asarray(product_inverse(lower32), np.float64)
    assert err <= 2 * floor, (cosine, beta, err, floor)
    assert err <= 1e-5, (cosine, beta, err)
    if cosine >= 0.5:
      broken = not np.all(np.isfinite(product)) or np.linalg.norm(product - want) > 1e-3 * np.linalg.norm(want)
      assert broken, cosine
    assert rel(pallas_delta.recursive_inverse(lower32[:16, :16], leaf=16), want[:16, :16]) <= 1e-6


def test_recursive_inverse_any_chunk_and_leaf():
  """Chunks that are not a power of two times the leaf (an unpaired last block at some level) and every leaf."""
  rng = np.random.default_rng(12)
  for c in (8, 24, 40, 72):
    lower, _ = chunk_lower(rng, c, 0.8, 1.0, 0.0)
    want = np.linalg.inv(np.eye(c) + lower)
    for leaf in (1, 2, 4, 8):
      with jax.default_matmul_precision('highest'):
        got = pallas_delta.recursive_inverse(jnp.asarray(lower, jnp.float32), leaf)
      assert rel(got, want) <= 1e-5, (c, leaf)


def test_accurate_sum_is_one_rounding_plus_its_second_order_term():
  """`accurate_sum` (the Pallas scans' gate-gradient sums) against math.fsum on a [128, 128] tile of O(1) terms
  that cancel to small sums: off by at most one rounding of the exact sum plus 2 n^2 eps^2 max|x| (its docstring's
  bound), on rows, columns and masked rows, where jnp.sum is off by at least 30 times that bound somewhere (so the
  case is one where the order of summation matters)."""
  import math
  from hybrid_jax.kernels import pallas_scan_common as pc
  rng = np.random.default_rng(5)
  c, eps = 128, 2.0 ** -24
  x = rng.normal(size=(c, c)).astype(np.float32)
  x[:, 1::2] = -x[:, ::2] * np.float32(1 + 2.0 ** -12)  # Pairs that nearly cancel: sums far below the terms.
  r, col = np.indices((c, c))
  lower = col <= r
  cases = {'rows': (1, None, x), 'columns': (0, None, x), 'masked rows': (1, lower, np.where(lower, x, 0.0))}
  plain_off = 0.0
  for name, (axis, where, kept) in cases.items():
    got = np.asarray(pc.accurate_sum(jnp.asarray(x), axis, None if where is None else jnp.asarray(where)),
                     np.float64).ravel()
    exact = np.array([math.fsum(line) for line in np.moveaxis(kept.astype(np.float64), axis, -1)])
    bound = np.spacing(np.abs(exact).astype(np.float32)) + 2 * c * c * eps * eps * np.max(np.abs(kept))
    assert np.all(np.abs(got - exact) <= bound), (name, np.max(np.abs(got - exact) / bound))
    plain = np.asarray(jnp.sum(jnp.asarray(kept), axis=axis), np.float64)
    plain_off = max(plain_off, float(np.max(np.abs(plain - exact) / bound)))
  assert plain_off > 30, plain_off
  zero = jnp.zeros((8, 8), jnp.float32)
  assert np.all(np.asarray(pc.accurate_sum(zero, 1)) == 0.0)


# Larger shapes (end-to-end tier: slow in interpret mode).
SLOW = [(kernel, impl, dtype, shape) for kernel in KERNELS for impl in IMPLS
        for dtype in (jnp.float32, jnp.bfloat16)
        for shape in (dict(b=1, t=500, hk=1, hv=1, dk=64, dv=64), dict(b=2, t=130, hk=2, hv=4, dk=128, dv=128))]


@pytest.mark.e2e
@pytest.mark.parametrize('kernel,impl,dtype,shape', SLOW,
                         ids=[f'{k}-{i}-{jnp.dtype(d).name}-d{s["dk"]}-t{s["t"]}' for k, i, d, s in SLOW])
def test_large(kernel, impl, dtype, shape):
  args, cots = inputs(12, kernel, dtype, **shape)
  check(kernel, impl, args, cots, chunk=64, dtype=dtype)


@pytest.mark.e2e
@pytest.mark.parametrize('kernel,impl', CASES, ids=IDS)
def test_strong_decay_x3_stays_finite(kernel, impl):
  """g ~ -60 per token: decays underflow to exactly 0, never inf or NaN, in values and gradients."""
  args, cots = inputs(13, kernel, gates='strong', **SMALL)
  args[3] = 3.0 * args[3]
  o, s, grads = run(kernel, impl, args, cots, 32)
  assert all(np.all(np.isfinite(x)) for x in [o, s] + grads)
  want_o, want_s = oracle_of(kernel, args)
  assert rel(o, want_o) <= 1e-5 and rel(s, want_s) <= 1e-5


# Dispatch.


@pytest.mark.parametrize('kernel', KERNELS)
def test_dispatch(kernel, monkeypatch):
  module = {'linear': linear_api, 'delta': delta_api}[kernel]
  name = {'linear': 'linear_scan', 'delta': 'gated_delta_rule'}[kernel]
  table = module._IMPLEMENTATIONS
  assert module.resolve(None, table, name) is table['xla']  # CPU: never interpret mode automatically.
  args, _ = inputs(14, kernel, t=8)
  with pytest.raises(ValueError, match='multiple of 16'):
    KERNELS[kernel](*args[:-1], implementation='pallas_gpu', chunk_size=24)
  monkeypatch.setattr(jax, 'default_backend', lambda: 'tpu')
  assert module.resolve(None, table, name) is table['pallas_tpu']
  with warnings.catch_warnings():  # Falls back to 'xla' (warns once per process).
    warnings.simplefilter('ignore')
    assert module.resolve(None, table, name, chunk_size=12) is table['xla']
  with pytest.raises(RuntimeError, match='needs a GPU target'):
    KERNELS[kernel](*args[:-1], implementation='pallas_gpu')
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  assert module.resolve(None, table, name) is table[scan_checks.GPU_MEASURED_CHOICE[name]]
  assert scan_checks.supports('pallas_gpu', jnp.bfloat16, 64, (128, 128))
  assert not scan_checks.supports('pallas_gpu', jnp.bfloat16, 64, (96, 128))  # Triton tiles: powers of two.
  assert not scan_checks.supports('pallas_tpu', jnp.float64, 64)
  assert scan_checks.supports('pallas_tpu', jnp.float32, 8) and not scan_checks.supports('pallas_tpu', jnp.float32, 12)
  with pytest.raises(RuntimeError, match='needs a TPU target'):
    KERNELS[kernel](*args[:-1], implementation='pallas_tpu')


def test_vmap_of_batch():
  """The contract runs under vmap of the batch: pallas_call's batching rule adds a grid axis."""
  args, _ = inputs(15, 'delta', b=2, t=40, hk=1, hv=1, dk=16, dv=16)
  q, k, v, g, beta, s0 = args
  one = lambda *x: jax.tree.map(lambda y: y[0], gated_delta_rule(
      *(y[None] for y in x[:5]), initial_state=x[5][None], implementation='pallas_gpu', chunk_size=16))
  o, s = jax.jit(jax.vmap(one)).lower(q, k, v, g, beta, s0).compile(FAST_COMPILE)(q, k, v, g, beta, s0)
  want_o, want_s = oracle_of('delta', args)
  assert rel(o, want_o) <= 1e-5 and rel(s, want_s) <= 1e-5
