"""Documents through cuDNN's packed layout, checked on CPU: the lengths and offsets a row of segment ids becomes,
expanded back into the mask cuDNN applies (written here from jax's documented layout, independently of the code),
against the reference document mask; the program lowered for CUDA; the automatic choice with the target faked to
GPU; and the whole call (layout, bound, fallback) with the cuDNN kernel stood in for by that expansion. What only a
GPU can confirm (cuDNN computing this mask, speed, memory) is the device script's (scripts/device/measure.sh)."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax import errors
from hybrid_jax.kernels import platform
from hybrid_jax.kernels import segments
from hybrid_jax.kernels.attention import api
from hybrid_jax.kernels.attention import cudnn_documents
from hybrid_jax.kernels.attention import reference
from hybrid_jax.kernels.attention import xla

T = 16
ROWS = {  # Segment ids of one row of T tokens, as the data pipeline writes them (0: padding at a row's end).
    'longer_than_window': [1] * 11 + [2] * 5,
    'one_token': [1] * 6 + [2] + [3] * 9,
    'one_token_first_and_last': [4] + [5] * 14 + [6],
    'padding_at_end': [1] * 5 + [2] * 4 + [0] * 7,
    'exactly_the_bound': [1] * 3 + [2] * 5 + [3] + [4] * 7,
    'one_document': [7] * 16,
    'id_comes_back': [1] * 4 + [2] * 4 + [1] * 8,
}
BOUND = 4
OVER = [1] * 3 + [2] * 3 + [3] * 3 + [4] * 3 + [5] * 4  # BOUND + 1 documents.


def packed_mask(lengths, offsets, t, window):
  """[T, T] bool: what cuDNN's packed layout lets query i (rows) see, from jax's documentation of
  `fused_attention_stablehlo.dot_product_attention`: sequence m of a row is `lengths[m]` tokens from
  `offsets[m]`, entries past the row's sequences are -1, and each sequence attends causally as a row of its own,
  with a sliding window of `window` keys counting the query (None: no window)."""
  lengths, offsets = np.asarray(lengths), np.asarray(offsets)
  assert len(offsets) == len(lengths) + 1 and offsets[-1] == -1
  used = int(np.sum(lengths >= 0))  # The documented fill past a row's sequences is -1 in both arrays.
  assert np.all(lengths[:used] >= 1) and np.all(lengths[used:] == -1) and np.all(offsets[used:] == -1)
  assert np.all(offsets[:used] >= 0)
  mask = np.zeros((t, t), bool)
  for n, o in zip(lengths[:used], offsets[:used]):
    a = np.arange(n)
    seen = a[None, :] <= a[:, None]
    if window is not None:
      seen &= a[:, None] - a[None, :] < window
    assert not mask[o:o + n].any(), 'two sequences share a token'
    mask[o:o + n, o:o + n] = seen
  return mask


def cudnn_batch_mask(lengths, offsets, b, t, heads, head_dim, window):
  """[B*T, B*T] bool: the mask cuDNN applies to the whole batch after jax's own rewrite of the layout
  (`_fix_seqlen_offsets`: the non-negative entries of all rows packed to the left, offsets counted from the batch's
  first token in elements of a token's heads x head dim), read as cuDNN reads it: sequence s is lengths[s] tokens
  from token offsets[s] / (heads x head_dim), until the first empty sequence."""
  from jax._src.cudnn import fused_attention_stablehlo as fused  # pylint: disable=import-outside-toplevel
  q = jnp.zeros((b, t, heads, head_dim))
  flat_len, _, flat_off, _ = fused._fix_seqlen_offsets(  # pylint: disable=protected-access
      jnp.asarray(lengths), jnp.asarray(lengths), jnp.asarray(offsets), jnp.asarray(offsets), q, q)
  flat_len, flat_off = np.asarray(flat_len).ravel(), np.asarray(flat_off).ravel()
  mask = np.zeros((b * t, b * t), bool)
  for n, o in zip(flat_len, flat_off):
    if n <= 0:
      break
    start = o // (heads * head_dim)
    a = np.arange(n)
    seen = a[None, :] <= a[:, None]
    if window is not None:
      seen &= a[:, None] - a[None, :] < window
    mask[start:start + n, start:start + n] = seen
  return mask


def reference_mask(seg, window):
  """The reference's document mask [B, T, T] of segment ids [B, T] (documents as `attention` hands them on)."""
  return np.asarray(reference.visible(seg.shape[1], window=window, segment_ids=segments.runs(jnp.asarray(seg))))


@pytest.mark.parametrize('window', [None, 4, 1])
@pytest.mark.parametrize('name', list(ROWS))
def test_each_row_becomes_the_reference_mask(name, window):
  seg = np.asarray([ROWS[name]], np.int32)
  lengths, offsets, fits = cudnn_documents.layout(segments.runs(jnp.asarray(seg)), BOUND)
  assert lengths.dtype == offsets.dtype == jnp.int32 and lengths.shape == (1, BOUND)
  assert offsets.shape == (1, BOUND + 1) and bool(fits[0])
  np.testing.assert_array_equal(packed_mask(lengths[0], offsets[0], T, window), reference_mask(seg, window)[0])


@pytest.mark.parametrize('window', [None, 3])
def test_a_batch_of_rows_reaches_cudnn_as_the_reference_mask(window):
  """Rows of different document counts in one batch: after jax packs every row's entries to the left, each
  sequence still covers its own row's tokens (a 0 in place of a -1 would move later rows' documents)."""
  seg = np.asarray([ROWS[name] for name in ('one_document', 'padding_at_end', 'exactly_the_bound', 'one_token')],
                   np.int32)
  b = len(seg)
  lengths, offsets, fits = cudnn_documents.layout(segments.runs(jnp.asarray(seg)), BOUND)
  assert np.all(fits)
  want = np.zeros((b * T, b * T), bool)
  for row, mask in enumerate(reference_mask(seg, window)):
    want[row * T:(row + 1) * T, row * T:(row + 1) * T] = mask
  np.testing.assert_array_equal(cudnn_batch_mask(lengths, offsets, b, T, 4, 8, window), want)


def test_more_documents_than_the_bound_does_not_fit():
  seg = jnp.asarray([OVER, ROWS['exactly_the_bound']], jnp.int32)
  lengths, offsets, fits = cudnn_documents.layout(segments.runs(seg), BOUND)
  assert fits.tolist() == [False, True]
  # The layout of such a row leaves its last document out: the mask it would give is wrong, hence the fallback.
  assert not np.array_equal(packed_mask(lengths[0], offsets[0], T, None), reference_mask(np.asarray(seg), None)[0])
  assert cudnn_documents.layout(segments.runs(seg), BOUND + 1)[2].tolist() == [True, True]


def _cudnn_on_cpu(monkeypatch):
  """Let jax lower its cuDNN call for CUDA on this host: a cuDNN 9.6 on a Hopper GPU, as far as its checks see."""
  from jax._src.cudnn import fused_attention_stablehlo as fused  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(fused, 'check_cudnn_version', lambda: cudnn_documents.MIN_CUDNN_VERSION)
  monkeypatch.setattr(fused, 'check_compute_capability', lambda capability: True)
  monkeypatch.setattr(fused, 'is_cuda_compute_capability_equal', lambda capability: False)


@pytest.mark.parametrize('window', [None, 128])
def test_the_step_lowers_to_cudnns_packed_kernels_forward_and_backward(monkeypatch, window):
  """The program XLA gets for a GPU: cuDNN's forward and backward custom calls, each with the bound as its
  documents per row, the padding-causal mask and the window as cuDNN's sliding window length (0: none); its saved
  softmax statistics are [B * bound, Hq, T] float32."""
  _cudnn_on_cpu(monkeypatch)
  b, t, bound = 2, 256, 8
  q, kv = jnp.zeros((b, t, 4, 128), jnp.bfloat16), jnp.zeros((b, t, 2, 128), jnp.bfloat16)
  seg = jnp.asarray(np.repeat(np.arange(b * t).reshape(b, t) // 40, 1, axis=1), jnp.int32)

  def loss(q, k, v):
    o = cudnn_documents.fused(q, k, v, *cudnn_documents.layout(segments.runs(seg), bound)[:2], window=window,
                              scale=0.1)
    return o.astype(jnp.float32).sum()

  text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, kv, kv).lower(lowering_platforms=('cuda',)).as_text()
  calls = re.findall(r'custom_call @(\S+)\(', text)
  assert calls == ['__cudnn$fmhaSoftmax', '__cudnn$fmhaSoftmaxBackward']
  config = lambda key: re.findall(rf'{key}\\22: \\?2?2?(\w+)', text)
  assert config('max_seg_per_batch') == [str(bound)] * 2
  assert config('mask_type') == ['PADDING_CAUSAL'] * 2
  assert config('sliding_window_length') == [str(window or 0)] * 2
  assert f'tensor<{b * bound}x4x{t}xf32>' in text  # The softmax statistics the backward reads.


def _faked_gpu(monkeypatch, unsupported=None):
  """The automatic choice as on a GPU whose cuDNN can (unsupported None) or cannot run packed documents."""
  monkeypatch.setattr(cudnn_documents, 'unsupported', lambda: unsupported)
  monkeypatch.setattr(api, '_warned', set())


def _choice(q, window=None, sinks=0, documents=True):
  seg = jnp.zeros(q.shape[:2], jnp.int32) if documents else None
  with platform.targeting('gpu'):
    return api._auto(q, window, sinks, seg)  # pylint: disable=protected-access


def test_the_automatic_choice_on_gpu(monkeypatch):
  _faked_gpu(monkeypatch)
  q = jnp.zeros((1, 1024, 8, 128), jnp.bfloat16)
  with warnings.catch_warnings():
    warnings.simplefilter('error')  # cuDNN runs all of these: nothing to warn about.
    assert _choice(q, documents=False) == 'cudnn'
    assert _choice(q, 128, documents=False) == 'cudnn'
    assert _choice(q) == 'cudnn'
    assert _choice(q, 128) == 'cudnn'
    # A head-wise layer calls the kernel once per group of KV heads, each with its own window: cuDNN runs both.
    assert [_choice(q[:, :, heads], window) for window, heads in ((128, slice(0, 6)), (None, slice(6, 8)))] == [
        'cudnn', 'cudnn']
    assert _choice(q, None, sinks=4) == 'cudnn'  # Sinks are moot without a window.
  with pytest.warns(UserWarning, match=r"'cudnn' cannot run this call \(sinks 4 beside a window\); using "
                                       "'pallas_gpu'"):
    assert _choice(q, 128, sinks=4) == 'pallas_gpu'
  with pytest.warns(UserWarning, match='dtype float32'):
    assert _choice(q.astype(jnp.float32)) == 'pallas_gpu'
  with platform.targeting('cpu'):
    assert api._auto(q, 128, 0, jnp.zeros((1, 1024), jnp.int32)) == 'xla'  # pylint: disable=protected-access


def test_a_cudnn_too_old_falls_back_with_one_warning_per_reason(monkeypatch):
  reason = 'cuDNN 90500 is older than 90600 (9.6.0), the first with packed documents'
  _faked_gpu(monkeypatch, unsupported=reason)
  q = jnp.zeros((1, 1024, 8, 128), jnp.bfloat16)
  with pytest.warns(UserWarning, match=re.escape(f"'cudnn' cannot run this call ({reason}); using 'pallas_gpu'")):
    assert _choice(q) == 'pallas_gpu'
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    assert _choice(q, 128) == 'pallas_gpu' and _choice(q) == 'pallas_gpu'
    assert _choice(q, documents=False) == 'cudnn'  # Rows without documents keep cuDNN.
  assert not caught  # Warned once for the reason, not per call.


def test_cudnns_own_check_of_this_gpu_says_why_not_here():
  """On this CPU host there is no cuDNN to run documents: the reason is a sentence, not an exception."""
  cudnn_documents.unsupported.cache_clear()
  try:
    reason = cudnn_documents.unsupported()
  finally:
    cudnn_documents.unsupported.cache_clear()
  if jax.default_backend() != 'gpu':
    assert reason and ('cuDNN' in reason or 'Hopper' in reason)


def _emulated_cudnn(q, k, v, lengths, offsets, *, window, scale):
  """cuDNN's packed attention as the test's own expansion describes it, in plain jnp (differentiable): rows no
  sequence covers see no key and come out NaN, as unwritten memory would be garbage."""
  b, t, hq, d = q.shape
  i = jnp.arange(t)
  # member[b, m, i]: token i lies in sequence m of row b.
  member = ((offsets[:, :-1, None] <= i) & (i < offsets[:, :-1, None] + lengths[:, :, None])
            & (lengths[:, :, None] >= 0))
  same = jnp.einsum('bmi,bmj->bij', member.astype(jnp.int32), member.astype(jnp.int32)) > 0
  causal = i[None, :] <= i[:, None]
  if window is not None:
    causal &= i[:, None] - i[None, :] < window
  mask = same & causal[None]
  g = hq // k.shape[2]
  logits = jnp.einsum('bihgd,bjhd->bhgij', q.reshape(b, t, k.shape[2], g, d).astype(jnp.float32),
                      k.astype(jnp.float32)) * scale
  logits = jnp.where(mask[:, None, None], logits, -jnp.inf)
  p = jax.nn.softmax(logits, axis=-1)
  o = jnp.einsum('bhgij,bjhd->bihgd', p, v.astype(jnp.float32))
  return o.reshape(b, t, hq, d).astype(q.dtype)


def _marked_fallback(q, k, v, **kwargs):
  """The fallback kernel (pallas_gpu on a GPU), here XLA's attention plus 100: its output shows which branch ran."""
  return xla.attention(q, k, v, **kwargs) + 100


@pytest.fixture
def emulated_gpu(monkeypatch):
  _faked_gpu(monkeypatch)
  monkeypatch.setattr(cudnn_documents, 'fused', _emulated_cudnn)
  monkeypatch.setattr(cudnn_documents, '_warned', set())
  monkeypatch.setitem(api._IMPLEMENTATIONS, 'pallas_gpu', _marked_fallback)  # pylint: disable=protected-access


def _inputs(b, hq=4, hkv=2, d=16, seed=0):
  rng = np.random.default_rng(seed)
  return [jnp.asarray(rng.standard_normal((b, T, h, d)), jnp.bfloat16) for h in (hq, hkv, hkv)]  # cuDNN's dtype.


def _close(got, want, tol=2e-2):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  assert np.all(np.isfinite(got)) and np.abs(got - want).max() <= tol * max(1.0, np.abs(want).max())


def test_documents_run_cudnn_and_a_row_over_the_bound_the_fallback_warning_once(emulated_gpu):
  """One compiled call, decided on device by each batch's documents: within the bound cuDNN's packed layout with
  the reference's mask (not the fallback's +100), a row over it the fallback for the whole call (never a layout
  that leaves documents out), warning once."""
  del emulated_gpu
  within = jnp.asarray([ROWS[name] for name in ('longer_than_window', 'padding_at_end', 'exactly_the_bound')])
  over = jnp.asarray([ROWS['one_document'], OVER, ROWS['one_token']], jnp.int32)
  q, k, v = _inputs(3)
  with platform.targeting('gpu'):
    fn = jax.jit(lambda q, k, v, seg: api.attention(q, k, v, window=5, segment_ids=seg, max_documents=BOUND))
    with warnings.catch_warnings():
      warnings.simplefilter('error')
      _close(fn(q, k, v, within), reference.attention(q, k, v, window=5, segment_ids=segments.runs(within)))
      full = api.attention(q, k, v, segment_ids=within, implementation='cudnn', max_documents=BOUND)
      _close(full, reference.attention(q, k, v, segment_ids=segments.runs(within)))
    with pytest.warns(UserWarning, match=f"more than {BOUND} documents .*model.attention.max_documents.* run "
                                         "'pallas_gpu'"):
      o = jax.block_until_ready(fn(q, k, v, over))
    _close(o, xla.attention(q, k, v, window=5, segment_ids=segments.runs(over)) + 100, 1e-2)
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter('always')
      jax.block_until_ready(fn(q, k, v, over))  # The same reason again: no second warning.
    assert not caught


@pytest.mark.e2e
def test_gradients_follow_the_branch_that_ran(emulated_gpu):
  del emulated_gpu
  q, k, v = _inputs(2, seed=1)
  loss = lambda q, k, v, seg, bound: jnp.sum(jnp.sin(api.attention(q, k, v, window=5, segment_ids=seg,
                                                                    max_documents=bound)))
  ref = lambda q, k, v, seg: jnp.sum(jnp.sin(reference.attention(q, k, v, window=5, segment_ids=segments.runs(seg))))
  seg = jnp.asarray([ROWS['one_token'], ROWS['padding_at_end']], jnp.int32)
  with platform.targeting('gpu'):
    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=4)(q, k, v, seg, BOUND)
  want = jax.grad(ref, argnums=(0, 1, 2))(q, k, v, seg)
  for g, w in zip(got, want):
    _close(g, w, 3e-2)


def test_the_bound_is_checked():
  q = jnp.zeros((1, T, 2, 8))
  for bad in (0, -3, 2.5):
    with pytest.raises(ValueError, match='max_documents'):
      api.attention(q, q, q, segment_ids=jnp.zeros((1, T), jnp.int32), max_documents=bad)


def test_the_config_key_is_checked_by_name():
  from hybrid_jax.config import BASE_CONFIG, load_config_file  # pylint: disable=import-outside-toplevel
  from hybrid_jax.models import validation  # pylint: disable=import-outside-toplevel
  config = load_config_file(str(BASE_CONFIG))
  assert config.model.attention.max_documents == cudnn_documents.DEFAULT_MAX_DOCUMENTS
  config.model.attention.max_documents = 0
  with pytest.raises(errors.ConfigError, match=r'^config\.model\.attention\.max_documents=0 is invalid'):
    validation.validate(config)


def test_the_attention_bench_names_the_kernel_a_documents_row_ran(monkeypatch):
  """`bench attention` rows of cuDNN with documents time cuDNN itself, unless the dispatcher falls back."""
  from hybrid_jax.bench import attention as bench_attention  # pylint: disable=import-outside-toplevel
  _faked_gpu(monkeypatch)
  q = jnp.zeros((1, 1024, 8, 128), jnp.bfloat16)
  bound = cudnn_documents.DEFAULT_MAX_DOCUMENTS
  at_bound, over = (jnp.asarray(np.arange(1024)[None] // (1024 // n), jnp.int32) for n in (bound, 2 * bound))
  with platform.targeting('gpu'):
    assert bench_attention.fallback_of('cudnn', q, 128, at_bound) is None
    assert bench_attention.fallback_of('cudnn', q, 128, over) == 'pallas_gpu'
    assert bench_attention.fallback_of('pallas_gpu', q, 128, over) is None
    monkeypatch.setattr(cudnn_documents, 'unsupported', lambda: 'no cuDNN')
    with pytest.warns(UserWarning, match='no cuDNN'):
      assert bench_attention.fallback_of('cudnn', q, 128, at_bound) == 'pallas_gpu'
