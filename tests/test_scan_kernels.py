"""Linear-scan, gated-delta-rule and short-conv kernels against an independent float64 NumPy oracle.

Values, final states and gradients (loss = sum(o * do) + sum(S_T * dS)), chunk sizes, gates (zero, strong,
zeroed at random, constant per head), GVA head maps, decode steps, split sequences, dispatch and input errors.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.kernels import causal_conv1d
from hybrid_jax.kernels import causal_conv1d_step
from hybrid_jax.kernels import gated_delta_rule
from hybrid_jax.kernels import gated_delta_rule_step
from hybrid_jax.kernels import linear_scan
from hybrid_jax.kernels import linear_scan_step
from hybrid_jax.kernels.delta_rule import api as delta_api
from hybrid_jax.kernels.linear_scan import api as linear_api

KERNELS = {'linear': linear_scan, 'delta': gated_delta_rule}
STEPS = {'linear': linear_scan_step, 'delta': gated_delta_rule_step}


def oracle(q, k, v, g, beta=None, s0=None, scale=None):
  """Float64 recurrence written straight from the definition, one token at a time (all heads at once)."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  b, t, hk, dk = q.shape
  hv, dv = v.shape[2:]
  g = np.broadcast_to(np.asarray(g, np.float64), (b, t, hv))
  heads = np.arange(hv) // (hv // hk)
  scale = dk**-0.5 if scale is None else scale
  s = np.zeros((b, hv, dk, dv)) if s0 is None else np.array(s0, np.float64)
  out = np.zeros((b, t, hv, dv))
  eye = np.eye(dk)
  for i in range(t):
    qi, ki, vi = q[:, i, heads], k[:, i, heads], v[:, i]
    kv = ki[..., :, None] * vi[..., None, :]
    if beta is None:
      s = np.exp(g[:, i])[..., None, None] * s + kv
    else:
      bi = np.asarray(beta, np.float64)[:, i][..., None, None]
      proj = eye - bi * ki[..., :, None] * ki[..., None, :]
      s = np.exp(g[:, i])[..., None, None] * (proj @ s) + bi * kv
    out[:, i] = scale * np.einsum('bhkv,bhk->bhv', s, qi)
  return out, s


def rel(x, ref, floor=0.0):
  """Relative RMS error; non-finite values fail."""
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  assert np.all(np.isfinite(x)), 'non-finite values'
  return np.linalg.norm(x - ref) / max(np.linalg.norm(ref), floor)


def make(seed, kernel, b=1, t=75, hk=2, hv=2, dk=16, dv=16, gates='random', dtype=jnp.float32, init=True):
  """Inputs (q, k, v, log_decay[, beta], initial_state) and cotangents (do, dS) for one case."""
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((b, t, hk, dk))
  k = rng.standard_normal((b, t, hk, dk))
  v = rng.standard_normal((b, t, hv, dv))
  if gates == 'const':  # Lightning: constant per head, ALiBi slopes.
    g = -2.0**(-8.0 * (np.arange(hv) + 1) / hv)
  else:
    g = np.log(rng.uniform(0.5, 1.0, (b, t, hv)))
    if gates == 'zero':
      g = np.zeros_like(g)
    elif gates == 'strong':
      g = -20.0 + 0.5 * g
    elif gates == 'sparse':
      g = np.where(rng.uniform(size=g.shape) < 0.3, 0.0, g)
  args = [q, k, v, g]
  if kernel == 'delta':
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    args.append(rng.uniform(0.05, 0.95, (b, t, hv)))
  args.append(rng.standard_normal((b, hv, dk, dv)) if init else None)
  do, ds = rng.standard_normal((b, t, hv, dv)), rng.standard_normal((b, hv, dk, dv))
  cast = lambda x, dt: None if x is None else jnp.asarray(x, dt)
  args = [cast(x, dtype if i < 3 else jnp.float32) for i, x in enumerate(args)]
  return args, (jnp.asarray(do, jnp.float32), jnp.asarray(ds, jnp.float32))


def split(args):
  """(positional inputs, initial_state)."""
  return args[:-1], args[-1]


@functools.partial(jax.jit, static_argnames=('kernel', 'has_init', 'implementation', 'chunk_size'))
def _value_and_grads(inputs, s0, do, ds, *, kernel, has_init, implementation, chunk_size):
  def f(inputs, s0):
    return KERNELS[kernel](*inputs, initial_state=s0 if has_init else None, implementation=implementation,
                           chunk_size=chunk_size)
  (o, s), vjp = jax.vjp(f, inputs, s0)
  di, ds0 = vjp((do.astype(o.dtype), ds.astype(s.dtype)))
  return o, s, list(di) + [ds0]


def value_and_grads(kernel, args, cots, implementation='xla', chunk_size=64):
  """Output, final state and the gradients of sum(o*do) + sum(S*dS) for every input, in one compiled call.

  Module-level jit: cases with equal shapes and settings share one compilation (compiling dominates on CPU).
  """
  inputs, s0 = split(args)
  has_init = s0 is not None
  return _value_and_grads(inputs, s0 if has_init else jnp.zeros(()), *cots, kernel=kernel, has_init=has_init,
                          implementation=implementation, chunk_size=chunk_size)


@functools.partial(jax.jit, static_argnames=('kernel', 'implementation', 'chunk_size'))
def _call(inputs, s0, *, kernel, implementation, chunk_size):
  return KERNELS[kernel](*inputs, initial_state=s0, implementation=implementation, chunk_size=chunk_size)


def call(kernel, args, implementation='xla', chunk_size=64):
  inputs, s0 = split(args)
  return _call(inputs, s0, kernel=kernel, implementation=implementation, chunk_size=chunk_size)


def up64(x):
  return None if x is None else jnp.asarray(np.asarray(x, np.float64))


def oracle_of(kernel, args):
  return oracle(*args[:4], args[4] if kernel == 'delta' else None, s0=args[-1])


@functools.lru_cache(maxsize=None)
def expected(kernel, case):
  """Inputs, the NumPy oracle, and the float64 reference's output, state and gradients (cached)."""
  seed, shape, gates = case
  args, cots = make(seed, kernel, **SHAPES[shape], gates=gates)
  with jax.enable_x64(True):
    o64, s64, g64 = value_and_grads(kernel, [up64(x) for x in args], [up64(c) for c in cots],
                                    implementation='reference')
    assert o64.dtype == jnp.float64 and s64.dtype == jnp.float64
  return args, cots, oracle_of(kernel, args), (np.asarray(o64), np.asarray(s64), [np.asarray(x) for x in g64])


# Few distinct shapes on purpose: each costs one compilation per implementation.
SHAPES = {
    'gva75': dict(b=2, t=75, hk=1, hv=2, dk=16, dv=8),  # two value heads per key head; T not a chunk multiple
    'k64t500': dict(b=1, t=500, hk=1, hv=1, dk=64, dv=64),
}
CHUNK = {'gva75': 32, 'k64t500': 64}
# (seed, shape, gates)
CASES = [(0, 'gva75', 'random'), (1, 'gva75', 'zero'), (2, 'gva75', 'sparse'), (3, 'gva75', 'strong'),
         (4, 'k64t500', 'random')]
PAIRS = [(kernel, case) for kernel in KERNELS for case in CASES]
PAIR_IDS = ['{}-{}-{}'.format(kernel, *case[1:]) for kernel, case in PAIRS]
GRAD_NAMES = {'linear': ('q', 'k', 'v', 'log_decay', 'initial_state'),
              'delta': ('q', 'k', 'v', 'log_decay', 'beta', 'initial_state')}


@pytest.mark.parametrize('kernel,case', PAIRS, ids=PAIR_IDS)
def test_reference_matches_numpy_oracle(kernel, case):
  _, _, (o, s), (o64, s64, _) = expected(kernel, case)
  assert rel(o64, o) <= 1e-12 and rel(s64, s) <= 1e-12


@pytest.mark.parametrize('kernel,case', PAIRS, ids=PAIR_IDS)
def test_xla_values_and_grads_fp32(kernel, case):
  args, cots, (o, s), (_, _, g64) = expected(kernel, case)
  got_o, got_s, grads = value_and_grads(kernel, args, cots, chunk_size=CHUNK[case[1]])
  assert got_o.dtype == jnp.float32 and got_s.dtype == jnp.float32
  assert rel(got_o, o) <= 1e-5 and rel(got_s, s) <= 1e-5
  for name, got, want in zip(GRAD_NAMES[kernel], grads, g64):
    assert got.dtype == jnp.float32
    assert rel(got, want) <= 1e-5, f'd{name}'


@pytest.mark.parametrize('kernel', KERNELS)
def test_xla_bf16(kernel):
  """Same shape as the T=500 fp32 case, so the float64 reference gradients come from its compilation."""
  args, cots = make(5, kernel, **SHAPES['k64t500'])
  args = [x.astype(jnp.bfloat16) if i < 3 else x for i, x in enumerate(args)]
  o, s, grads = value_and_grads(kernel, args, cots)
  assert o.dtype == jnp.bfloat16 and s.dtype == jnp.float32
  with jax.enable_x64(True):
    o64, s64, g64 = value_and_grads(kernel, [up64(x) for x in args], [up64(c) for c in cots],
                                    implementation='reference')
  assert rel(o, o64) <= 5e-3 and rel(s, s64) <= 5e-3
  for i, (name, got, want) in enumerate(zip(GRAD_NAMES[kernel], grads, g64)):
    assert got.dtype == args[i].dtype
    assert rel(got, want) <= (1e-2 if name in 'qkv' else 2e-2), f'd{name}'


def dot_operand_dtypes(jaxpr):
  """The operand dtypes of every dot_general in `jaxpr` and the jaxprs inside it (scan bodies, custom VJPs)."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'dot_general':
      found.append(tuple(jnp.dtype(x.aval.dtype).name for x in eqn.invars))
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      found += dot_operand_dtypes(sub)
  return found


def test_xla_linear_scan_runs_every_product_of_bf16_inputs_in_bf16():
  """Forward and backward: bf16 inputs give only bf16 x bf16 products (fp32 accumulation), the tensor cores' and
  the MXU's single pass, as in the Pallas scans; float32 inputs keep float32 products."""
  args, cots = make(5, 'linear', **SHAPES['k64t500'])
  for dtype in (jnp.bfloat16, jnp.float32):
    typed = [x.astype(dtype) if i < 3 else x for i, x in enumerate(args)]
    jaxpr = jax.make_jaxpr(lambda *a: value_and_grads('linear', list(a), cots))(*typed).jaxpr
    dots = dot_operand_dtypes(jaxpr)
    assert len(dots) >= 8 and set(dots) == {(jnp.dtype(dtype).name,) * 2}, (dtype, sorted(set(dots)))


@pytest.mark.parametrize('kernel', KERNELS)
def test_chunk_sizes_agree(kernel):
  """Chunks of 16 and 64 (longer than T) give the chunk-32 answer."""
  args, cots, _, _ = expected(kernel, (2, 'gva75', 'sparse'))
  want_o, want_s, _ = value_and_grads(kernel, args, cots, chunk_size=32)
  for c in (16, 64):
    o, s = call(kernel, args, chunk_size=c)
    assert rel(o, want_o) <= 1e-6 and rel(s, want_s) <= 1e-6


@pytest.mark.parametrize('kernel', KERNELS)
def test_strong_decay_stays_finite(kernel):
  """g ~ -60 per token: products of decays underflow to exactly 0, never to inf or NaN (values or grads)."""
  args, cots = make(12, kernel, **SHAPES['gva75'], gates='strong')
  args[3] = 3.0 * args[3]
  o, s, grads = value_and_grads(kernel, args, cots, chunk_size=CHUNK['gva75'])
  assert all(np.all(np.isfinite(x)) for x in [o, s] + grads)
  want_o, want_s = oracle_of(kernel, args)
  assert rel(o, want_o) <= 1e-5 and rel(s, want_s) <= 1e-5


@pytest.mark.parametrize('kernel', KERNELS)
def test_constant_per_head_decay(kernel):
  """Lightning: log_decay [Hv], in the parallel kernel and in the decode step."""
  args, _ = make(13, kernel, b=1, t=40, hk=2, hv=2, gates='const')
  o, s = call(kernel, args, chunk_size=16)
  want_o, want_s = oracle_of(kernel, args)
  assert rel(o, want_o) <= 1e-5 and rel(s, want_s) <= 1e-5
  inputs, s0 = split(args)
  o_t, _ = STEPS[kernel](s0, *(x if j == 3 else x[:, 0] for j, x in enumerate(inputs)))
  want_t, _ = oracle_of(kernel, [x if j == 3 or x is None or j == len(args) - 1 else x[:, :1]
                                 for j, x in enumerate(args)])
  assert rel(o_t, want_t[:, 0]) <= 1e-5


@pytest.mark.parametrize('kernel', KERNELS)
def test_decode_steps_match_parallel(kernel):
  args, _, (o, s_final), _ = expected(kernel, (2, 'gva75', 'sparse'))
  inputs, state = split(args)
  step = jax.jit(STEPS[kernel])
  outs = []
  for i in range(inputs[0].shape[1]):
    o_t, state = step(state, *(x[:, i] for x in inputs))
    outs.append(o_t)
  assert state.dtype == jnp.float32
  assert rel(jnp.stack(outs, 1), o) <= 1e-5 and rel(state, s_final) <= 1e-5


@pytest.mark.parametrize('kernel', KERNELS)
def test_pieces_equal_one_pass(kernel):
  """Splitting after one token and mid-chunk, carrying the state, equals one pass; T = 1 alone is exact too."""
  args, _ = make(15, kernel, **SHAPES['gva75'])
  o, s = call(kernel, args, chunk_size=16)
  state, outs = args[-1], []
  for lo, hi in ((0, 1), (1, 40), (40, 75)):
    o_part, state = call(kernel, [x[:, lo:hi] for x in args[:-1]] + [state], chunk_size=16)
    outs.append(o_part)
    if hi == 1:
      want_o, want_s = oracle_of(kernel, [x[:, :1] for x in args[:-1]] + [args[-1]])
      assert rel(o_part, want_o) <= 1e-5 and rel(state, want_s) <= 1e-5
  assert rel(jnp.concatenate(outs, 1), o) <= 1e-5 and rel(state, s) <= 1e-5


def test_jit_and_vmap():
  args, _ = make(17, 'delta', b=3, t=40, hk=2, hv=2)
  q, k, v, g, beta, s0 = args
  fn = jax.jit(jax.vmap(lambda *x: jax.tree.map(lambda y: y[0], gated_delta_rule(
      *(y[None] for y in x[:5]), initial_state=x[5][None], chunk_size=16))))
  o, s = fn(q, k, v, g, beta, s0)
  want_o, want_s = oracle(q, k, v, g, beta, s0=s0)
  assert rel(o, want_o) <= 1e-5 and rel(s, want_s) <= 1e-5


@pytest.mark.parametrize('kernel', KERNELS)
def test_default_dispatch_is_xla(kernel):
  module = {'linear': linear_api, 'delta': delta_api}[kernel]
  for impl in (None, 'auto', 'xla'):
    assert module.resolve(impl, module._IMPLEMENTATIONS, kernel) is module._IMPLEMENTATIONS['xla']


@pytest.mark.parametrize('kernel', KERNELS)
def test_dispatch_errors(kernel):
  args, _ = make(19, kernel, t=8)
  inputs, _ = split(args)
  with pytest.raises(ValueError, match="'xla'"):
    KERNELS[kernel](*inputs, implementation='triton')


def _bad(kernel, change):
  z = lambda *s: jnp.zeros(s, jnp.float32)
  args = dict(q=z(1, 16, 2, 8), k=z(1, 16, 2, 8), v=z(1, 16, 4, 8), log_decay=z(1, 16, 4))
  if kernel == 'delta':
    args['beta'] = jnp.full((1, 16, 4), 0.5)
  args.update({n: jnp.asarray(x) if isinstance(x, np.ndarray) else x for n, x in change.items()})
  return args


BAD = [
    (dict(q=np.zeros((16, 2, 8))), 'rank 4'),
    (dict(k=np.zeros((1, 16, 2, 4))), 'same shape'),
    (dict(v=np.zeros((1, 16, 3, 8))), 'multiple of key heads'),
    (dict(v=np.zeros((1, 15, 4, 8))), 'match q'),
    (dict(v=np.zeros((1, 16, 4, 8), np.float16)), 'dtype'),
    (dict(log_decay=np.zeros((1, 16, 2))), 'log_decay must have shape'),
    (dict(log_decay=np.full((1, 16, 4), 0.1)), 'log_decay must be <= 0'),
    (dict(log_decay=np.full((1, 16, 4), np.nan)), 'NaN'),
    (dict(log_decay=np.zeros((1, 16, 4), np.int32)), 'floating'),
    (dict(initial_state=np.zeros((1, 4, 8, 7))), 'initial_state'),
    (dict(chunk_size=0), 'chunk_size'),
    (dict(chunk_size=2.5), 'chunk_size'),
    (dict(beta=np.full((1, 16, 4), 2.5)), 'beta must be <= 2'),
    (dict(beta=np.full((1, 16, 4), -0.5)), 'beta must be >= 0'),
    (dict(beta=np.zeros((1, 16, 2))), 'beta must have shape'),
]


@pytest.mark.parametrize('kernel,change,match',
                         [(kernel, *bad) for kernel in KERNELS for bad in BAD
                          if kernel == 'delta' or 'beta' not in bad[0]])
def test_bad_arguments(kernel, change, match):
  with pytest.raises(ValueError, match=match):
    KERNELS[kernel](**_bad(kernel, change))


def test_value_checks_are_skipped_under_jit():
  """Under tracing the values are unknown: shapes are still checked, ranges are not (documented)."""
  args = _bad('linear', dict(log_decay=np.full((1, 16, 4), 0.1)))
  o, _ = jax.jit(lambda a: linear_scan(**a, implementation='reference'))(args)
  assert o.shape == (1, 16, 4, 8)
  with pytest.raises(ValueError, match='rank 4'):
    jax.jit(lambda a: linear_scan(**a))(dict(args, q=jnp.zeros((16, 2, 8))))


def test_step_bad_arguments():
  z = lambda *s: jnp.zeros(s, jnp.float32)
  with pytest.raises(ValueError, match='state'):
    linear_scan_step(z(1, 2, 8, 7), z(1, 2, 8), z(1, 2, 8), z(1, 2, 8), z(1, 2))
  with pytest.raises(ValueError, match='log_decay_t must be <= 0'):
    linear_scan_step(z(1, 2, 8, 8), z(1, 2, 8), z(1, 2, 8), z(1, 2, 8), jnp.ones((1, 2)))
  with pytest.raises(ValueError, match='beta_t must be <= 2'):
    gated_delta_rule_step(z(1, 2, 8, 8), z(1, 2, 8), z(1, 2, 8), z(1, 2, 8), z(1, 2), jnp.full((1, 2), 2.5))


# Short causal convolution.


def conv_oracle(x, w, bias=None, state=None):
  x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
  b, t, c = x.shape
  width = w.shape[0]
  state = np.zeros((b, width - 1, c)) if state is None else np.asarray(state, np.float64)
  xp = np.concatenate([state, x], 1)
  y = np.zeros((b, t, c))
  for i in range(t):
    for j in range(width):
      y[:, i] += w[j] * xp[:, i + j]  # xp[i + j] is x_{i - W + 1 + j}
  if bias is not None:
    y += np.asarray(bias, np.float64)
  return y, xp[:, t:]


def conv_inputs(seed, b=2, t=37, c=6, width=4):
  rng = np.random.default_rng(seed)
  f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  return f(b, t, c), f(width, c), f(c), f(b, width - 1, c)


@pytest.mark.parametrize('t', [1, 2, 37])
def test_conv1d_matches_numpy(t):
  x, w, bias, state = conv_inputs(20, t=t)
  for kw in (dict(), dict(bias=bias), dict(bias=bias, initial_state=state)):
    y, s = causal_conv1d(x, w, **kw)
    want_y, want_s = conv_oracle(x, w, kw.get('bias'), kw.get('initial_state'))
    assert rel(y, want_y) <= 1e-6 and rel(s, want_s, 1e-30) <= 1e-6


def test_conv1d_steps_and_halves():
  x, w, bias, state = conv_inputs(21)
  y, s = causal_conv1d(x, w, bias=bias, initial_state=state)
  st, ys = state, []
  for i in range(x.shape[1]):
    y_t, st = causal_conv1d_step(st, x[:, i], w, bias=bias)
    ys.append(y_t)
  assert rel(jnp.stack(ys, 1), y) <= 1e-6 and rel(st, s) <= 1e-6
  y1, s1 = causal_conv1d(x[:, :2], w, bias=bias, initial_state=state)  # shorter than the state
  y2, s2 = causal_conv1d(x[:, 2:], w, bias=bias, initial_state=s1)
  assert rel(jnp.concatenate([y1, y2], 1), y) <= 1e-6 and rel(s2, s) <= 1e-6


def test_conv1d_bf16_and_grads():
  x, w, bias, state = conv_inputs(22)
  y, _ = causal_conv1d(x.astype(jnp.bfloat16), w, bias=bias)
  assert y.dtype == jnp.bfloat16 and rel(y, conv_oracle(x.astype(jnp.bfloat16), w, bias)[0]) <= 5e-3


def conv_oracle_grads(x, w, state, dy, ds):
  """Gradients of sum(y * dy) + sum(final_state * ds) by the conv's adjoint, in float64: y[i] reads xp[i + j]
  through w[j], so each output's cotangent flows back to those inputs and taps; the final state is xp's tail."""
  x, w, state, dy, ds = (np.asarray(a, np.float64) for a in (x, w, state, dy, ds))
  t, width = x.shape[1], w.shape[0]
  xp = np.concatenate([state, x], 1)
  dxp, dw = np.zeros_like(xp), np.zeros_like(w)
  for i in range(t):
    for j in range(width):
      dxp[:, i + j] += w[j] * dy[:, i]
      dw[j] += np.sum(xp[:, i + j] * dy[:, i], 0)
  dxp[:, t:] += ds
  return dxp[:, width - 1:], dw, dy.sum((0, 1)), dxp[:, :width - 1]


@pytest.mark.parametrize('t', [2, 37])  # Shorter than the state (its tail is part of the state) and longer.
def test_conv1d_grads_match_the_adjoint(t):
  x, w, bias, state = conv_inputs(23, t=t)
  rng = np.random.default_rng(24)
  dy, ds = rng.standard_normal(x.shape), rng.standard_normal(state.shape)

  def loss(x, w, bias, state):
    y, final = causal_conv1d(x, w, bias=bias, initial_state=state)
    return jnp.sum(y * dy) + jnp.sum(final * ds)

  got = jax.grad(loss, (0, 1, 2, 3))(x, w, bias, state)
  for name, g, want in zip(('x', 'weight', 'bias', 'state'), got, conv_oracle_grads(x, w, state, dy, ds)):
    assert g.shape == want.shape and rel(g, want) <= 1e-6, name


@pytest.mark.parametrize('args,match', [
    (dict(x=jnp.zeros((4, 6))), 'rank 3'),
    (dict(weight=jnp.zeros((4, 5))), 'weight'),
    (dict(bias=jnp.zeros((5,))), 'bias'),
    (dict(initial_state=jnp.zeros((2, 4, 6))), 'state'),
])
def test_conv1d_bad_arguments(args, match):
  kw = dict(x=jnp.zeros((2, 5, 6)), weight=jnp.zeros((4, 6)))
  kw.update(args)
  with pytest.raises(ValueError, match=match):
    causal_conv1d(kw.pop('x'), kw.pop('weight'), **kw)
