"""Each kernel implementation's error against float64 by input regime (`python -m hybrid_jax bench kernel-errors`).

The inputs are `hybrid_jax.kernels.regimes`' structured rows (keys sharing a direction, repeated tokens, beta at
0/1/2, decays at 0 and -50, documents inside chunks, peaked and sink-heavy softmax rows, constant runs), all
regimes of a kernel stacked along the batch so one compiled program measures them. The oracle is the 'reference'
implementation run in float64 (jax_enable_x64) on the same rounded inputs; for the scans it gets the documents as
gates written by `regimes.reset_gates`, not through the kernels' own document handling, and the conv's is a NumPy
float64 sum. Error: relative RMS per regime (batch row), forward = worst of the output and final state, gradient =
worst over every input of loss = sum(o * do) + sum(S_T * dS).
"""

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_jax import kernels
from hybrid_jax.kernels import regimes as regimes_lib
from hybrid_jax.kernels.attention import IMPLEMENTATIONS as ATTENTION_IMPLEMENTATIONS
from hybrid_jax.kernels.scan_checks import IMPLEMENTATION_NAMES as SCAN_IMPLEMENTATIONS

KERNELS = ('attention', 'linear_scan', 'gated_delta_rule', 'causal_conv1d')
# Interpret-mode Pallas programs are compile-bound on CPU; these roughly halve compile time. The other
# implementations compile at XLA's default level whatever XLA_FLAGS say (the test suite's is O0), since their
# rounding sets the bar the others are held to.
FAST_COMPILE = dict(xla_backend_optimization_level=0, xla_llvm_disable_expensive_passes=True)
DEFAULT_COMPILE = dict(xla_backend_optimization_level=2)
SCAN_INPUTS = {'linear_scan': ('q', 'k', 'v', 'log_decay', 'initial_state'),
               'gated_delta_rule': ('q', 'k', 'v', 'log_decay', 'beta', 'initial_state')}
# Small shapes: T = 160 is 2.5 chunks of 64 and 1.25 of 128; GVA 1:2; attention GQA 2:1.
SHAPES = {'scan': dict(t=160, hk=1, hv=2, dk=32, dv=32), 'attention': dict(t=160, hq=2, hkv=1, d=32),
          'conv': dict(t=160, c=16)}
ATTENTION_STATIC = ((None, 0), (48, 2))  # (window, sinks): full causal; a window of 48 with 2 sink keys.


def implementations(kernel):
  """The implementations of `kernel` this backend can run (cuDNN needs a GPU); the conv has one."""
  if kernel == 'causal_conv1d':
    return ('xla',)
  if kernel == 'attention':
    return tuple(i for i in ATTENTION_IMPLEMENTATIONS if i != 'cudnn' or jax.default_backend() == 'gpu')
  return SCAN_IMPLEMENTATIONS


def rel(x, ref, size=None):
  """Relative RMS error per batch row [B] (inf where x is not finite; 0 where both are exactly zero), against the
  norm of `size` [B] where given (the size of the terms a cancelling sum adds up), else of ref."""
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  x, ref = x.reshape(x.shape[0], -1), ref.reshape(ref.shape[0], -1)
  diff, norm = np.linalg.norm(x - ref, axis=1), np.linalg.norm(ref, axis=1) if size is None else size
  out = np.where(norm > 0, diff / np.where(norm > 0, norm, 1), np.where(diff > 0, np.inf, 0.0))
  return np.where(np.all(np.isfinite(x), axis=1), out, np.inf)


_PROGRAMS = {}


def _compiled(key, build, options, *args):
  """Runs `build()` (a function) on args through one compiled program per key and input shapes: cases that differ
  only in data share it, since compiling dominates on CPU (interpret-mode Pallas above all)."""
  sig = tuple((tuple(x.shape), jnp.dtype(x.dtype).name) for x in jax.tree.leaves(args))
  if (key, sig) not in _PROGRAMS:
    _PROGRAMS[key, sig] = jax.jit(build()).lower(*args).compile(options)
  return _PROGRAMS[key, sig](*args)


def _options(impl):
  return FAST_COMPILE if impl.startswith('pallas') else DEFAULT_COMPILE


def _scan_program(kernel, impl, chunk):
  """Output, final state and the gradients of every input of one scan implementation."""
  fn = getattr(kernels, kernel)

  def run(inputs, seg, do, ds):
    def f(*inputs):
      return fn(*inputs[:-1], initial_state=inputs[-1], chunk_size=chunk, segment_ids=seg, implementation=impl)
    (o, s), vjp = jax.vjp(f, *inputs)
    return o, s, vjp((do.astype(o.dtype), ds.astype(s.dtype)))

  return run


def _cast(x, dtype):
  return jnp.asarray(np.asarray(x, np.float64), dtype)


def scan_errors(kernel, impl, rows, chunk, dtype=jnp.float32):
  """{regime: {'o', 'S_T', 'dq', ...: relative error}} of one scan implementation against the float64 oracle."""
  arrays = regimes_lib.stack(rows)
  names = SCAN_INPUTS[kernel]
  # q, k, v in `dtype`; gates, beta and the initial state stay float32 (the layers keep them so).
  inputs = [_cast(arrays[n], dtype if n in ('q', 'k', 'v') else jnp.float32) for n in names]
  seg = jnp.asarray(arrays['segment_ids'])
  do, ds = _cast(arrays['do'], jnp.float32), _cast(arrays['dS'], jnp.float32)
  o, s, grads = _compiled((kernel, impl, chunk), lambda: _scan_program(kernel, impl, chunk), _options(impl),
                          inputs, seg, do, ds)
  o64, s64, g64 = scan_oracle(kernel, inputs, arrays, do, ds)
  return _by_regime(rows, ['o', 'S_T'] + [f'd{n}' for n in names], [o, s, *grads], [o64, s64, *g64])


def scan_oracle(kernel, inputs, arrays, do, ds):
  """The float64 'reference' on the rounded inputs, documents as gates written by `regimes.reset_gates`."""
  with jax.enable_x64(True):
    up = [jnp.asarray(np.asarray(x, np.float64)) for x in inputs]
    names = SCAN_INPUTS[kernel]
    gate = names.index('log_decay')
    starts = np.asarray(arrays['oracle_log_decay']) != np.asarray(arrays['log_decay'])
    up[gate] = jnp.where(starts, regimes_lib.RESET_LOG_DECAY, up[gate])
    cots = [jnp.asarray(np.asarray(c, np.float64)) for c in (do, ds)]
    o, s, grads = _compiled((kernel, 'reference'), lambda: _scan_program(kernel, 'reference', 64), DEFAULT_COMPILE,
                            up, None, *cots)
    return np.asarray(o), np.asarray(s), [np.asarray(g) for g in grads]


def _by_regime(rows, names, got, want, sizes=None):
  sizes = sizes or {}
  errors = [rel(g, w, sizes.get(n)) for n, g, w in zip(names, got, want)]
  return {r.name: {n: float(e[i]) for n, e in zip(names, errors)} for i, r in enumerate(rows)}


def _attention_program(impl, window, sinks):
  def run(q, k, v, seg, do):
    o, vjp = jax.vjp(lambda q, k, v: kernels.attention(q, k, v, window=window, sinks=sinks, segment_ids=seg,
                                                       implementation=impl), q, k, v)
    return o, vjp(do.astype(o.dtype))
  return run


def attention_errors(impl, rows, dtype=jnp.float32):
  """{regime: {'o', 'dq', 'dk', 'dv'}} of one attention implementation against the float64 reference."""
  window, sinks = rows[0].static
  arrays = regimes_lib.stack(rows)
  q, k, v = (_cast(arrays[n], dtype) for n in ('q', 'k', 'v'))
  seg, do = jnp.asarray(arrays['segment_ids']), _cast(arrays['do'], jnp.float32)
  o, grads = _compiled(('attention', impl, window, sinks), lambda: _attention_program(impl, window, sinks),
                       _options(impl), q, k, v, seg, do)
  with jax.enable_x64(True):
    up = [jnp.asarray(np.asarray(x, np.float64)) for x in (q, k, v, do)]
    o64, g64 = _compiled(('attention', 'reference', window, sinks),
                         lambda: _attention_program('reference', window, sinks), DEFAULT_COMPILE, *up[:3], seg,
                         up[3])
    o64, g64 = np.asarray(o64), [np.asarray(g) for g in g64]
  sizes = attention_term_sizes(*(np.asarray(x, np.float64) for x in (q, k, v, do)), np.asarray(seg), window, sinks)
  return _by_regime(rows, ['o', 'dq', 'dk', 'dv'], [o, *grads], [o64, *g64], sizes)


def attention_term_sizes(q, k, v, do, seg, window, sinks):
  """{'dq', 'dk'}: per row [B], the norm of the sums dq_i = scale sum_j P_ij (dP_ij - delta_i) k_j and
  dk_j = scale sum_i P_ij (dP_ij - delta_i) q_i taken over the terms' absolute values.

  The weights P_ij (dP_ij - delta_i) of a row sum to exactly 0, so where the keys a row sees are alike (one
  repeated token: exactly equal) or one key takes the whole row (a scaled logit of 50), dq and dk are a
  cancellation down to ~0 and any float32 computation of them, the reference's included, is rounding noise
  against it (relative errors of 1e+9). Their error is measured against the size of the terms, which is what
  rounding is proportional to, and equals the plain relative error's denominator where nothing cancels.
  """
  b, t, hq, d = q.shape
  group = hq // k.shape[2]
  dq, dk = np.zeros(b), np.zeros(b)
  for row in range(b):
    logits = regimes_lib.visible_logits(q[row:row + 1], k[row:row + 1], d**-0.5, window, sinks, seg[row:row + 1])[0]
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)  # [Hq, T, T]
    vv = np.repeat(v[row], group, axis=1)
    dp = np.einsum('ihd,jhd->hij', do[row], vv)
    weight = p * (np.abs(dp) + np.abs(np.sum(p * dp, -1, keepdims=True))) * d**-0.5
    dq[row] = np.linalg.norm(np.einsum('hij,jhd->ihd', weight, np.abs(np.repeat(k[row], group, axis=1))))
    per_head = np.einsum('hij,ihd->jhd', weight, np.abs(q[row]))
    dk[row] = np.linalg.norm(per_head.reshape(t, -1, group, d).sum(2))
  return {'dq': dq, 'dk': dk}


def conv_oracle(x, weight, state, seg):
  """NumPy float64 y_t = sum_i weight[i] x_{t-W+1+i} per channel, a tap reading zero across a document start
  (the state belongs to the row's first document). x [T, C], weight [W, C], state [W-1, C], seg [T]."""
  w, t = weight.shape[0], x.shape[0]
  xp = np.concatenate([state, x])
  doc = np.concatenate([np.full(w - 1, seg[0]), seg])
  doc = np.cumsum(np.r_[0, doc[1:] != doc[:-1]])
  y = np.zeros_like(x)
  for i in range(w):
    same = (doc[i:i + t] == doc[w - 1:])[:, None]
    y += weight[i] * np.where(same, xp[i:i + t], 0.0)
  return y


def _conv_program():
  def one(x, weight, state, seg, do):
    y, vjp = jax.vjp(lambda x, w, s: kernels.causal_conv1d(x[None], w, initial_state=s[None],
                                                           segment_ids=seg[None])[0][0], x, weight, state)
    return y, vjp(do.astype(y.dtype))
  return jax.vmap(one)


def conv_errors(rows, dtype=jnp.float32):
  """{regime: {'y', 'dx', 'dweight', 'dinitial_state'}}: forward against the NumPy float64 sum, gradients against
  the same function run in float64 (the conv is linear, so its float64 run is its exact adjoint)."""
  arrays = regimes_lib.stack(rows)
  x, weight, state = (_cast(arrays[n], dtype) for n in ('x', 'weight', 'initial_state'))
  seg, do = jnp.asarray(arrays['segment_ids']), _cast(arrays['do'], jnp.float32)
  y, grads = _compiled(('conv',), _conv_program, DEFAULT_COMPILE, x, weight, state, seg, do)
  y64 = np.stack([conv_oracle(*(np.asarray(a[i], np.float64) for a in (x, weight, state)), np.asarray(seg[i]))
                  for i in range(len(rows))])
  with jax.enable_x64(True):
    up = [jnp.asarray(np.asarray(a, np.float64)) for a in (x, weight, state, do)]
    _, g64 = _compiled(('conv',), _conv_program, DEFAULT_COMPILE, *up[:3], seg, up[3])
    g64 = [np.asarray(g) for g in g64]
  return _by_regime(rows, ['y', 'dx', 'dweight', 'dinitial_state'], [y, *grads], [y64, *g64])


def worst(errors):
  """(forward, gradient): the worst output/state error and the worst input-gradient error of one regime."""
  fwd = max(v for k, v in errors.items() if not k.startswith('d'))
  grad = max(v for k, v in errors.items() if k.startswith('d'))
  return fwd, grad


def table(kernel, *, chunk=64, dtype=jnp.float32, seed=0):
  """{regime: {implementation: (forward, gradient)}} for one kernel on the small shapes."""
  out = {}
  if kernel == 'causal_conv1d':
    for name, errors in conv_errors(regimes_lib.conv_regimes(seed, **SHAPES['conv']), dtype).items():
      out.setdefault(name, {})['xla'] = worst(errors)
    return out
  for impl in implementations(kernel):
    if kernel == 'attention':
      for window, sinks in ATTENTION_STATIC:
        rows = regimes_lib.attention_regimes(seed, **SHAPES['attention'], window=window, sinks=sinks)
        label = 'causal' if window is None else f'window {window}, {sinks} sinks'
        for name, errors in attention_errors(impl, rows, dtype).items():
          out.setdefault(f'{name} ({label})', {})[impl] = worst(errors)
    else:
      rows = regimes_lib.scan_regimes(seed, **SHAPES['scan'], chunk=chunk, delta=kernel == 'gated_delta_rule')
      for name, errors in scan_errors(kernel, impl, rows, chunk, dtype).items():
        out.setdefault(name, {})[impl] = worst(errors)
  return out


def markdown(kernel, rows):
  """A markdown table: rows = regime, columns = implementation, cells = forward / gradient error."""
  impls = list(next(iter(rows.values())))
  lines = [f'| {kernel}: regime | ' + ' | '.join(impls) + ' |', '| --- |' + ' --- |' * len(impls)]
  for name, cells in rows.items():
    lines.append(f'| {name} | ' + ' | '.join(f'{cells[i][0]:.1e} / {cells[i][1]:.1e}' for i in impls) + ' |')
  return '\n'.join(lines)


def run(args) -> int:
  """Prints one table per kernel of `args.kernels` (chunk `args.chunk`, inputs `args.dtype`)."""
  dtype = jnp.dtype(args.dtype)
  print(f'Worst relative RMS error against float64, forward / gradient ({args.dtype} inputs, scan chunk '
        f'{args.chunk}, backend {jax.default_backend()}; Pallas interpreted off its device):\n')
  for kernel in args.kernels:
    print(markdown(kernel, table(kernel, chunk=args.chunk, dtype=dtype)) + '\n', flush=True)
  return 0
