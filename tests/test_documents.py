"""Packed documents: a row holding several documents computes, for each document, what that document computes alone.

Kernels forward and backward against float64 references run on each document alone; the model for every arch of the
study grid, logits and parameter gradients. The row's documents put a boundary inside a chunk (of 16), one on a
chunk edge, a document shorter than the conv width and a one-token document.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_jax import kernels
from hybrid_jax.kernels import segments
from hybrid_jax.configs import hybrid
from hybrid_jax.models.model import HybridLM
from tests.conftest import default_tier, study_config

LENGTHS = (21, 11, 3, 1, 9)  # Starts at 0, 21 (inside chunk 1), 32 (a chunk edge), 35, 36; 45 tokens.
CHUNK = 16
IMPLEMENTATIONS = ('reference', 'xla', 'pallas_gpu', 'pallas_tpu')


def _segment_ids(lengths=LENGTHS, first=7):
  """[1, T] ids that are not run indices (first id 7, then descending): the kernels must not care."""
  return np.concatenate([np.full(n, first - i) for i, n in enumerate(lengths)])[None].astype(np.int32)


def _pieces(lengths=LENGTHS):
  starts = np.cumsum((0,) + tuple(lengths))
  return [slice(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])]


def _rel(x, ref):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  return float(np.max(np.abs(x - ref)) / max(np.max(np.abs(ref)), 1e-30))


def _x64(fn, *args):
  """fn(*args) with float64 inputs under jax_enable_x64, as NumPy float64."""
  jax.config.update('jax_enable_x64', True)
  try:
    out = fn(*(None if a is None else jnp.asarray(np.asarray(a, np.float64)) for a in args))
    return jax.tree.map(lambda x: np.asarray(x, np.float64), out)
  finally:
    jax.config.update('jax_enable_x64', False)


def _scan_inputs(seed=0, t=sum(LENGTHS), hk=1, hv=2, d=16):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(1, t, hk, d)).astype(np.float32)
  k = rng.normal(size=(1, t, hk, d)).astype(np.float32)
  k /= np.linalg.norm(k, axis=-1, keepdims=True)
  v = rng.normal(size=(1, t, hv, d)).astype(np.float32)
  g = -rng.uniform(0.0, 1.0, size=(1, t, hv)).astype(np.float32)
  beta = rng.uniform(0.0, 1.0, size=(1, t, hv)).astype(np.float32)
  do = rng.normal(size=(1, t, hv, d)).astype(np.float32)
  s0 = rng.normal(size=(1, hv, d, d)).astype(np.float32)
  return q, k, v, g, beta, do, s0


def _scan(kind, implementation, q, k, v, g, beta, s0, segment_ids=None):
  if kind == 'linear_scan':
    return kernels.linear_scan(q, k, v, g, initial_state=s0, chunk_size=CHUNK, segment_ids=segment_ids,
                               implementation=implementation)
  return kernels.gated_delta_rule(q, k, v, g, beta, initial_state=s0, chunk_size=CHUNK, segment_ids=segment_ids,
                                  implementation=implementation)


def _scan_loss_and_grads(kind, implementation, do, q, k, v, g, beta, s0, segment_ids=None, with_final=True):
  """(o, final state, grads of <o, do> (+ the sum of the final state) wrt q, k, v, g, beta, s0)."""
  def loss(q, k, v, g, beta, s0):
    o, final = _scan(kind, implementation, q, k, v, g, beta, s0, segment_ids)
    return jnp.sum(o * do) + (jnp.sum(final) if with_final else 0.0), (o, final)

  (_, (o, final)), grads = jax.value_and_grad(loss, argnums=range(6), has_aux=True)(q, k, v, g, beta, s0)
  return o, final, grads


def _close(got, ref, scale, what):
  """|got - ref| <= 1e-5 of `scale` (the largest value of the packed result) everywhere."""
  err = np.max(np.abs(np.asarray(got, np.float64) - ref))
  assert err <= 1e-5 * scale, f'{what}: max error {err:.3g} > 1e-5 x {scale:.3g}'


@pytest.mark.parametrize('implementation', IMPLEMENTATIONS)
@pytest.mark.parametrize('kind', ['linear_scan', 'gated_delta_rule'])
def test_scan_documents_equal_each_document_alone(kind, implementation):
  """Packed float32 outputs, final state and every gradient (the gates' included) against the float64 recurrence
  run on each document alone; the row's first document starts from the initial state, every other from zero."""
  q, k, v, g, beta, do, s0 = _scan_inputs()
  seg = jnp.asarray(_segment_ids())
  o, final, grads = _scan_loss_and_grads(kind, implementation, jnp.asarray(do), q, k, v, g, beta, s0, seg)
  pieces = _pieces()
  scales = [float(np.max(np.abs(x))) for x in (o, *grads)]
  for i, sl in enumerate(pieces):
    last = i == len(pieces) - 1
    state = s0 if i == 0 else np.zeros_like(s0)
    ref_o, ref_final, ref_grads = _x64(
        functools.partial(_scan_loss_and_grads, kind, 'reference', with_final=last), do[:, sl],
        *(x[:, sl] for x in (q, k, v, g, beta)), state)
    _close(o[:, sl], ref_o, scales[0], f'document {i}: o')
    for j, name in enumerate(('q', 'k', 'v', 'log_decay', 'beta')):
      if kind == 'linear_scan' and name == 'beta':
        continue
      _close(grads[j][:, sl], ref_grads[j], scales[j + 1], f'document {i}: d{name}')
    if i == 0:
      _close(grads[5], ref_grads[5], scales[6], 'd initial_state')
    if last:
      _close(final, ref_final, float(np.max(np.abs(final))), 'final state')


def test_conv_documents_equal_each_document_alone():
  """No tap reads across a boundary; the initial state feeds the row's first document only."""
  rng = np.random.default_rng(1)
  t = sum(LENGTHS)
  x = jnp.asarray(rng.normal(size=(1, t, 6)), jnp.float32)
  weight = jnp.asarray(rng.normal(size=(4, 6)), jnp.float32)
  bias = jnp.asarray(rng.normal(size=(6,)), jnp.float32)
  state = jnp.asarray(rng.normal(size=(1, 3, 6)), jnp.float32)
  seg = jnp.asarray(_segment_ids())

  ramp = jnp.arange(t * 6, dtype=jnp.float32).reshape(1, t, 6) / (t * 6)

  def loss(x, weight, state, segment_ids=None):
    y, _ = kernels.causal_conv1d(x, weight, bias=bias, initial_state=state, segment_ids=segment_ids)
    return jnp.sum(y * ramp), y

  (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(x, weight, state, seg)
  dweight = 0.0
  for i, sl in enumerate(_pieces()):
    alone_state = state if i == 0 else jnp.zeros_like(state)

    def piece_loss(xs, weight, st, sl=sl):
      y, _ = kernels.causal_conv1d(xs, weight, bias=bias, initial_state=st)
      return jnp.sum(y * ramp[:, sl]), y

    (_, y_alone), g_alone = jax.value_and_grad(piece_loss, argnums=(0, 1, 2), has_aux=True)(
        x[:, sl], weight, alone_state)
    np.testing.assert_allclose(y[:, sl], y_alone, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(grads[0][:, sl], g_alone[0], rtol=1e-6, atol=1e-6)
    dweight = dweight + g_alone[1]
    if i == 0:
      np.testing.assert_allclose(grads[2], g_alone[2], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(grads[1], dweight, rtol=1e-5)


@pytest.mark.parametrize('implementation', ['reference', 'xla', 'pallas_gpu', 'pallas_tpu'])
@pytest.mark.parametrize('window', [None, 4, 64])
def test_attention_documents_equal_each_document_alone(implementation, window):
  """Full causal, a window shorter than most documents and one longer than the row, GQA, forward and backward."""
  rng = np.random.default_rng(2)
  t = sum(LENGTHS)
  q, k, v, do = (rng.normal(size=(1, t, h, 16)).astype(np.float32) for h in (4, 2, 2, 4))
  seg = jnp.asarray(_segment_ids())

  def run(implementation, q, k, v, do, segment_ids=None):
    def loss(q, k, v):
      o = kernels.attention(q, k, v, window=window, segment_ids=segment_ids, implementation=implementation)
      return jnp.sum(o * do), o
    (_, o), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    return o, grads

  o, grads = run(implementation, q, k, v, jnp.asarray(do), seg)
  scales = [float(np.max(np.abs(x))) for x in (o, *grads)]
  for i, sl in enumerate(_pieces()):
    ref_o, ref_grads = _x64(functools.partial(run, 'reference'), *(x[:, sl] for x in (q, k, v, do)))
    _close(o[:, sl], ref_o, scales[0], f'document {i}: o')
    for j, name in enumerate('qkv'):
      _close(grads[j][:, sl], ref_grads[j], scales[j + 1], f'document {i}: d{name}')


def test_document_positions_and_runs():
  seg = jnp.asarray([[5, 5, 5, 2, 9, 9, 5, 5], [0, 0, 0, 0, 0, 0, 0, 0]], jnp.int32)
  np.testing.assert_array_equal(segments.runs(seg), [[0, 0, 0, 1, 2, 2, 3, 3], [0] * 8])
  np.testing.assert_array_equal(segments.positions(seg), [[0, 1, 2, 0, 0, 1, 0, 1], list(range(8))])
  np.testing.assert_array_equal(segments.starts(seg)[0], [0, 0, 0, 1, 1, 0, 1, 0])


def _tiny(arch):
  c = study_config(arch)
  c.model.update(dict(d_model=32, num_layers=len(c.model.cycle), num_heads=4, num_kv_heads=2, head_dim=8, d_ff=64, window=8,
                      recurrent_chunk_size=CHUNK))
  return c.model


# One arch per mixer kind in the default tier; the SWA variants (other windows, NoPE, 1:3) in e2e.
@pytest.mark.parametrize('arch', default_tier(sorted(hybrid.ARCHES), keep=('full', 'swa128', 'swa128_headwise',
                                                                           'lightning', 'mamba2', 'gdn')))
def test_model_documents_equal_each_document_alone(arch):
  """Logits of every document and the parameter gradients of the row's summed loss equal those of the documents
  run alone (positions restart at each document: RoPE, windows, states and convs all see one document)."""
  model = HybridLM(_tiny(arch), rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  t = sum(LENGTHS)
  rng = np.random.default_rng(3)
  tokens = jnp.asarray(rng.integers(0, model.cfg.vocab_size, (1, t)), jnp.int32)
  ramp = jnp.asarray(rng.normal(size=(1, t, model.cfg.vocab_size)), jnp.float32)

  @jax.jit
  def logits_and_grads(params, tokens, ramp, segment_ids=None):
    def loss(params):
      logits = nnx.merge(graphdef, params)(tokens, segment_ids=segment_ids)
      return jnp.sum(logits * ramp), logits
    (_, logits), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return logits, grads

  logits, grads = logits_and_grads(params, tokens, ramp, jnp.asarray(_segment_ids()))
  # Alone: one document per row, padded at its end (causal: the padding changes nothing before it, and its
  # logits carry no loss), so one program runs them all and its gradient is the documents' sum.
  longest, pieces = max(LENGTHS), _pieces()
  pad = lambda x, sl: jnp.pad(x[:, sl], [(0, 0), (0, longest - (sl.stop - sl.start))] + [(0, 0)] * (x.ndim - 2))
  alone_logits, summed = logits_and_grads(params, jnp.concatenate([pad(tokens, sl) for sl in pieces]),
                                          jnp.concatenate([pad(ramp, sl) for sl in pieces]))
  expected = np.concatenate([alone_logits[i:i + 1, :sl.stop - sl.start] for i, sl in enumerate(pieces)], axis=1)
  _close(logits, expected, float(np.max(np.abs(logits))), 'logits')
  for (path, got), ref in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(summed)):
    _close(got, np.asarray(ref, np.float64), max(float(np.max(np.abs(got))), 1e-12), jax.tree_util.keystr(path))


def test_model_refuses_bad_documents():
  model = HybridLM(_tiny('gdn'), rngs=nnx.Rngs(0))
  tokens = jnp.zeros((1, 6), jnp.int32)
  with pytest.raises(ValueError, match=r'segment_ids must have shape \[B, T\] = \(1, 6\)'):
    model(tokens, segment_ids=jnp.zeros((1, 5), jnp.int32))
  with pytest.raises(ValueError, match='segment_ids must be integers'):
    model(tokens, segment_ids=jnp.zeros((1, 6), jnp.float32))
  with pytest.raises(ValueError, match=r'positions must have shape'):
    model(tokens, positions=jnp.zeros((2, 6), jnp.int32), segment_ids=jnp.ones((1, 6), jnp.int32))
  seg = jnp.asarray([[1, 1, 1, 2, 2, 2]], jnp.int32)
  with pytest.raises(ValueError, match='positions do not match segment_ids: row 0, tokens 1 and 2'):
    model(tokens, positions=jnp.asarray([[0, 1, 3, 0, 1, 2]]), segment_ids=seg)
  model(tokens, positions=jnp.asarray([[5, 6, 7, 0, 1, 2]]), segment_ids=seg)  # A continued document.
