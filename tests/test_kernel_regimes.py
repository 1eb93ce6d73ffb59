"""Every kernel implementation against float64 on inputs in the regimes real text produces.

Gaussian keys in 32-128 dims are nearly orthogonal, the easy case: the TPU delta rule's old product-series inverse
of (I + L) passed every Gaussian test and gave errors of 1e+12 and more once the keys of a chunk shared a direction.
Here the inputs are `hybrid_jax.kernels.regimes`' structured rows (keys sharing a direction up to identical keys,
repeated tokens, beta at 0/1/2, decays at 0 and -50, documents starting inside chunks, peaked and sink-heavy
softmax rows, constant runs for the conv), each row asserted to be in its regime, and
`hybrid_jax.bench.kernel_errors` measures forward and every input gradient against the 'reference' run in float64.

The bar (float32 inputs): every implementation within 2x of the 'xla' implementation's own error plus FLOOR (16
ulps), and never above 1e-4 forward (1e-5 for the scans) and 1e-3 for gradients; bfloat16 inputs at the bfloat16
tolerances of docs/KERNELS.md. The default tier runs the gated delta rule (its chunked implementations, chunk 64)
and the conv; the linear scan, attention, chunk 128, bfloat16 and long rows are in the end-to-end tier
(`pytest -m e2e tests/test_kernel_regimes.py`).
"""

import functools

import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.bench import kernel_errors
from hybrid_jax.kernels import regimes
from tests.conftest import default_tier

# 16 ulps of float32 relative error: below it, errors are rounding, whose size follows the host's vector width as much
# as the algorithm (pallas_gpu's delta-rule gradients under zero decay: at most 8.3e-7 on one 2-core host, as XLA's;
# dlog_decay 1.9e-6 on an AVX-512 one, XLA's 5.7e-7), so "2x XLA's error" is asked only above it.
FLOOR = 16 * float(np.finfo(np.float32).eps)
CAP = {'forward': 1e-4, 'scan_forward': 1e-5, 'gradient': 1e-3}
BF16 = {'forward': 5e-3, 'gradient': 1e-2, 'gate': 2e-2}  # docs/KERNELS.md, "Tolerances".
SCANS = ('linear_scan', 'gated_delta_rule')
SCAN = kernel_errors.SHAPES['scan']
ATTENTION = kernel_errors.SHAPES['attention']


def errors(kernel, impl, chunk=64, dtype=jnp.float32, static=None, t=None):
  dtype = jnp.dtype(dtype)
  return _errors(kernel, impl, chunk, dtype, static, t)


@functools.lru_cache(maxsize=None)
def _errors(kernel, impl, chunk, dtype, static, t):
  """{regime: {output or gradient: relative error}}; cached, so the 'xla' baseline runs once per case."""
  if kernel == 'causal_conv1d':
    return kernel_errors.conv_errors(regimes.conv_regimes(0, **kernel_errors.SHAPES['conv']), dtype)
  if kernel == 'attention':
    shape = dict(ATTENTION, t=t or ATTENTION['t'])
    rows = regimes.attention_regimes(0, **shape, window=static[0], sinks=static[1])
    return kernel_errors.attention_errors(impl, rows, dtype)
  rows = regimes.scan_regimes(0, **dict(SCAN, t=t or SCAN['t']), chunk=chunk, delta=kernel == 'gated_delta_rule')
  return kernel_errors.scan_errors(kernel, impl, rows, chunk, dtype)


def bar(kernel, name, baseline):
  """float32: min(cap, 2 * xla's error + FLOOR)."""
  fwd_cap = CAP['scan_forward'] if kernel in SCANS else CAP['forward']
  return min(CAP['gradient'] if name.startswith('d') else fwd_cap, 2 * baseline + FLOOR)


def bf16_tol(name):
  if not name.startswith('d'):
    return BF16['forward']
  return BF16['gate'] if name in ('dlog_decay', 'dbeta') else BF16['gradient']


def assert_within_bar(kernel, got, baseline=None):
  """Every (regime, output or gradient) within its bar (bfloat16 tolerance when `baseline` is None); lists every
  case that misses it."""
  misses = []
  for regime, errs in got.items():
    for name, err in errs.items():
      limit = bf16_tol(name) if baseline is None else bar(kernel, name, baseline[regime][name])
      if not err <= limit:
        xla = '' if baseline is None else f' (xla {baseline[regime][name]:.2e})'
        misses.append(f'{regime}: {name} {err:.2e} > {limit:.2e}{xla}')
  assert not misses, '\n'.join(misses)


# The inputs are in the regimes they are named after (NumPy only: cheap).


@pytest.mark.parametrize('chunk', [64, 128])
def test_scan_regimes_are_what_they_are_named(chunk):
  rows = {r.name: r for r in regimes.scan_regimes(0, **SCAN, chunk=chunk)}
  for r in rows.values():
    m, a = r.measured, r.arrays
    if 'target_cosine' in m and m['target_cosine'] > 0:
      assert m['cosine'] >= m['target_cosine'] - 1e-12, (r.name, m)
      np.testing.assert_allclose(np.linalg.norm(a['k'], axis=-1), 1.0, rtol=1e-12)  # The contract's unit keys.
    if 'period' in m:
      assert m['repeat'] == 1.0, (r.name, m)
    if 'beta_value' in m:
      assert np.all(a['beta'] == m['beta_value']) and m['log_decay_min'] == 0.0, r.name
  assert abs(rows['keys cos 0'].measured['cosine']) < 0.1  # The Gaussian baseline: nearly orthogonal keys.
  assert rows['keys cos 1'].measured['cosine'] == pytest.approx(1.0, abs=1e-12)
  assert rows['repeat period 1'].measured['cosine'] == pytest.approx(1.0, abs=1e-12)
  assert rows['decay zero'].measured['log_decay_max'] == rows['decay zero'].measured['log_decay_min'] == 0.0
  assert rows['decay strong'].measured['log_decay_max'] == -50.0
  mixed = rows['decay mixed'].measured
  assert mixed['log_decay_max'] == 0.0 and mixed['log_decay_min'] == -50.0
  docs = rows['documents in chunk'].measured
  assert docs['resets_inside_chunks'] >= 6 and docs['one_token_documents'] >= 4 and docs['log_decay_max'] == 0.0
  oracle_gates = rows['documents in chunk'].arrays['oracle_log_decay']
  assert np.sum(oracle_gates == regimes.RESET_LOG_DECAY) == docs['resets_inside_chunks'] * SCAN['hv']


def test_attention_and_conv_regimes_are_what_they_are_named():
  rows = {r.name: r for r in regimes.attention_regimes(0, **ATTENTION, window=48, sinks=2)}
  for logit in (20, 50):
    assert rows[f'peaked logit {logit}'].measured['top_logit'] >= logit - 1e-9
  assert rows['sinks'].measured['top_logit'] >= 30 - 1e-9 and rows['sinks'].measured['sink_mass'] >= 0.3
  assert rows['keys cos 0.95'].measured['cosine'] >= 0.95
  assert rows['repeat period 1'].measured['repeat'] == rows['repeat period 6'].measured['repeat'] == 1.0
  assert regimes.one_token_documents(rows['documents'].arrays['segment_ids']) >= 4
  conv = {r.name: r for r in regimes.conv_regimes(0, **kernel_errors.SHAPES['conv'])}
  assert conv['constant runs, zero-sum taps'].measured['longest_run'] >= kernel_errors.SHAPES['conv']['t'] // 3 - 1
  np.testing.assert_allclose(conv['constant runs, zero-sum taps'].arrays['weight'].sum(1), 0.0, atol=1e-12)
  assert conv['large runs, small ripples'].measured['relative_ripple'] < 1e-4
  assert regimes.one_token_documents(conv['documents'].arrays['segment_ids']) >= 4


# The kernels on them.


def check(kernel, impl, setting=64, dtype=jnp.float32):
  """One implementation's errors on every regime against its bar."""
  static = setting if kernel == 'attention' else None
  chunk = setting if kernel in SCANS else 64
  got = errors(kernel, impl, chunk, dtype, static)
  baseline = None if dtype == jnp.bfloat16 else errors(kernel, 'xla', chunk, dtype, static)
  assert_within_bar(kernel, got, baseline)


@pytest.mark.parametrize('impl', default_tier(kernel_errors.implementations('gated_delta_rule'),
                                              keep=('xla', 'pallas_gpu', 'pallas_tpu')))
def test_gated_delta_rule(impl):
  """Chunk 64 (T = 160: 2.5 chunks): every regime, forward and every input gradient (the token-by-token float32
  reference in the end-to-end tier)."""
  check('gated_delta_rule', impl)


def test_causal_conv1d():
  """The conv has one implementation: against a NumPy float64 sum (forward) and its own float64 run (gradients),
  within the caps."""
  got = errors('causal_conv1d', 'xla')
  assert_within_bar('causal_conv1d', got, got)


# End-to-end tier.


@pytest.mark.e2e
@pytest.mark.parametrize('kernel,impl,chunk', [(k, i, c) for k in SCANS for i in kernel_errors.implementations(k)
                                               for c in (64, 128) if (k, c) != ('gated_delta_rule', 64)])
def test_scans(kernel, impl, chunk):
  check(kernel, impl, chunk)


@pytest.mark.e2e
@pytest.mark.parametrize('impl', kernel_errors.implementations('attention'))
@pytest.mark.parametrize('static', kernel_errors.ATTENTION_STATIC, ids=['causal', 'window48-sinks2'])
def test_attention(impl, static):
  check('attention', impl, static)


BF16_CASES = [(k, i) for k in SCANS for i in ('xla', 'pallas_gpu', 'pallas_tpu')] + [
    ('attention', i) for i in ('xla', 'pallas_gpu', 'pallas_tpu')] + [('causal_conv1d', 'xla')]


@pytest.mark.e2e
@pytest.mark.parametrize('kernel,impl', BF16_CASES)
def test_bf16(kernel, impl):
  """bfloat16 inputs (scan chunk 64; attention with a window of 48 and 2 sinks) at the bfloat16 tolerances."""
  check(kernel, impl, kernel_errors.ATTENTION_STATIC[1] if kernel == 'attention' else 64, jnp.bfloat16)


@pytest.mark.e2e
@pytest.mark.parametrize('kernel,impl', [(k, i) for k in SCANS for i in ('reference', 'xla')])
def test_scans_on_rows_of_16k(kernel, impl):
  """How error grows with T: at 16K tokens (256 chunks of 64) every regime stays below 1e-4, forward and
  gradients."""
  got = errors(kernel, impl, t=16384)
  misses = [f'{r}: {n} {e:.2e}' for r, errs in got.items() for n, e in errs.items() if not e <= 1e-4]
  assert not misses, '\n'.join(misses)


@pytest.mark.e2e
@pytest.mark.parametrize('impl', ['reference', 'xla'])
def test_attention_on_rows_of_2k(impl):
  """The dense float64 reference (and the term sizes of dq and dk) hold T x T arrays per row, so the long attention
  row is 2K here (16K would need tens of GB)."""
  got = errors('attention', impl, static=kernel_errors.ATTENTION_STATIC[1], t=2048)
  misses = [f'{r}: {n} {e:.2e}' for r, errs in got.items() for n, e in errs.items() if not e <= 1e-4]
  assert not misses, '\n'.join(misses)


def test_bench_kernel_errors_prints_the_measured_table(capsys):
  """`bench kernel-errors` prints, per regime, the worst forward / gradient error these tests hold to the bar (the
  conv's compiled program is shared with test_causal_conv1d)."""
  from hybrid_jax.commands import bench as bench_command
  assert bench_command.main(['kernel-errors', '--kernels', 'causal_conv1d']) == 0
  lines = capsys.readouterr().out.splitlines()
  assert '| causal_conv1d: regime | xla |' in lines
  for regime, errs in errors('causal_conv1d', 'xla').items():
    fwd, grad = kernel_errors.worst(errs)
    assert f'| {regime} | {fwd:.1e} / {grad:.1e} |' in lines
  with pytest.raises(SystemExit):
    bench_command.main(['kernel-errors', '--kernels', 'nosuch'])
  assert "'nosuch' not among the kernels" in capsys.readouterr().err
