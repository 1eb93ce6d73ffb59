"""The block-by-block forward and receptive-field restriction against independent references (the model itself,
a sliding-window model with the same weights, recomputation from scratch)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.inspection import forward as forward_lib
from hybrid_jax.inspection.windowed import Restriction
from hybrid_jax.train import state as state_lib
from tests.conftest import default_tier, small_config
from tests.test_model import _random_sinks

T = 64


def _tokens(t=T, batch=2, seed=0):
  return jnp.asarray(np.random.RandomState(seed).randint(0, 256, (batch, t)), jnp.int32)


def _model(arch='swa128_nope', **overrides):
  cfg = small_config(arch, **overrides).model
  model_def, params = state_lib.init_model(cfg, 0)
  return cfg, model_def, _random_sinks(params) if cfg.attention_sinks else params


def _logits(model_def, params, tokens, restriction=None):
  fn = jax.jit(lambda p, t: forward_lib.forward(model_def.bind(p), t, restriction=restriction)['logits'])
  return np.asarray(fn(params, tokens))


def _reference(model_def, params, tokens):
  return np.asarray(jax.jit(lambda p, t: model_def.bind(p)(t))(params, tokens))


SCALED = dict(embedding_multiplier=3.0, residual_multiplier=0.5, logits_scaling=2.0, attention_scale=0.3)
VARIANTS = pytest.mark.parametrize('scalings', [{}, SCALED, dict(attention_sinks=True)],
                                   ids=['plain', 'scaled', 'learned_sinks'])


@VARIANTS
def test_forward_is_the_model_and_wide_restrictions_change_nothing(scalings):
  _, model_def, params = _model(**scalings)  # Layers [SWA w=16, full], 64 tokens.
  tokens = _tokens()
  ref = _reference(model_def, params, tokens)
  np.testing.assert_array_equal(_logits(model_def, params, tokens), ref)
  np.testing.assert_allclose(_logits(model_def, params, tokens, Restriction('full', T, sinks=3)), ref, atol=1e-6)
  assert np.abs(_logits(model_def, params, tokens, Restriction('full', 8, sinks=2)) - ref).max() > 1e-4


def test_pure_swa_efficient_restriction_at_or_above_w_changes_nothing():
  _, model_def, params = _model('swa128', cycle=('swa',), window=16)
  tokens = _tokens()
  ref = _reference(model_def, params, tokens)
  for w in (16, 40):
    np.testing.assert_allclose(_logits(model_def, params, tokens, Restriction('efficient', w, sinks=4)), ref,
                               atol=1e-6)
  assert np.abs(_logits(model_def, params, tokens, Restriction('efficient', 8)) - ref).max() > 1e-4


def test_full_restriction_is_a_sliding_window_model():
  """Full layers restricted to W without sinks compute what the same weights do as SWA layers of window W."""
  _, model_def, params = _model('full', cycle=('full',), num_layers=2)
  swa_def = state_lib.make_model_def(small_config('full', cycle=('swa',), num_layers=2, window=8).model)
  tokens = _tokens()
  np.testing.assert_allclose(_logits(model_def, params, tokens, Restriction('full', 8)),
                             _reference(swa_def, params, tokens), atol=1e-6)


@pytest.mark.parametrize('kind', default_tier(['lightning', 'mamba2', 'gdn'], keep=('gdn',)))
def test_windowed_recurrent_state_matches_recomputation_from_scratch(kind):
  """One recurrent layer: with W >= T nothing changes; with W < T each chunk's last token equals a fresh run over
  the S sinks and the last W tokens, and a chunk's first token equals a fresh run over W - C + 1 tokens."""
  _, model_def, params = _model(kind, cycle=(kind,), num_layers=1)
  tokens = _tokens(t=32, batch=1)
  np.testing.assert_allclose(_logits(model_def, params, tokens, Restriction('efficient', 32, chunk=8)),
                             _reference(model_def, params, tokens), atol=2e-5)
  w, s, c = 8, 2, 4
  got = _logits(model_def, params, tokens, Restriction('efficient', w, sinks=s, chunk=c))
  for t in (11, 19, 31):  # Last token of its chunk: sees [t - W + 1, t] plus the sinks.
    ids = jnp.concatenate([tokens[:, :s], tokens[:, t - w + 1:t + 1]], axis=1)
    np.testing.assert_allclose(got[:, t], _reference(model_def, params, ids)[:, -1], atol=2e-5)
  for t in (12, 20, 28):  # First token of its chunk: sees [t - (W - C), t] plus the sinks.
    ids = jnp.concatenate([tokens[:, :s], tokens[:, t - (w - c):t + 1]], axis=1)
    np.testing.assert_allclose(got[:, t], _reference(model_def, params, ids)[:, -1], atol=2e-5)


@VARIANTS
def test_attention_probabilities_weigh_the_values_into_the_layer_output(scalings):
  """The returned attention rows, times the layer's values, give the kernel's attention output at those queries
  (with learned sinks the rows sum to less than one: the sink takes its share)."""
  cfg, model_def, params = _model(**scalings, dtype='float32')  # Layer 0: SWA w=16; layer 1: full.
  tokens = _tokens()
  queries = jnp.asarray([[3, 40, 63], [0, 17, 50]], jnp.int32)

  def run(p):
    model = model_def.bind(p)
    out = forward_lib.forward(model, tokens, attention_queries=queries)
    block = forward_lib.blocks(model)[0]
    h = block.mixer_norm(forward_lib.embed(model, tokens).astype(model.dtype))
    q, k, v = block.mixer.qkv(h, jnp.arange(T))
    return out['attention'][0], v, block.mixer._attend(q, k, v)  # pylint: disable=protected-access

  probs, v, o = map(np.asarray, jax.jit(run)(params))
  values = np.repeat(v, cfg.num_heads // cfg.num_kv_heads, axis=2)  # [B, T, Hq, D]
  weighted = np.einsum('bhnt,bthd->bnhd', probs, values)
  expected = np.take_along_axis(o, np.asarray(queries)[:, :, None, None], axis=1)
  np.testing.assert_allclose(weighted, expected, atol=1e-5)


def test_longppl_under_restriction_matches_a_direct_computation(tiny_run, tmp_path):
  """LongPPL / PPL of a document under a restriction: the padded, batched metric equals exp(mean NLL) of the key
  tokens (and of all tokens) from an unpadded forward pass under the same restriction, and differs from the
  unrestricted model's once the window is shorter than the document."""
  import json
  import math
  from hybrid_jax.train import runs
  from hybrid_jax.analysis import restriction as restriction_lib
  from hybrid_jax.eval import longppl as longppl_lib
  run = runs.load_run(tiny_run)
  text = 'def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n' * 4
  spans = [(17, 29), (90, 120)]
  (tmp_path / 'docs.jsonl').write_text(json.dumps({'text': text}) + '\n')
  (tmp_path / 'spans').mkdir()
  longppl_lib.write_spans(str(tmp_path / 'spans' / 'slice_0.txt'), spans)
  texts, doc_spans = restriction_lib.read_longppl_inputs(str(tmp_path / 'docs.jsonl'), str(tmp_path / 'spans'))
  ids = np.frombuffer(text.encode(), np.uint8).astype(np.int32)  # Byte tokens: token i is character i.
  key = np.asarray([i for i in range(1, len(ids)) if any(a <= i < b for a, b in spans)])
  results = {}
  for r in (None, Restriction('full', 8, sinks=2)):
    nll_fn = restriction_lib.make_nll(run.model_def, r)
    got = restriction_lib.longppl_metric(nll_fn, run.params, run.tokenizer, texts, doc_spans)
    nll = np.asarray(nll_fn(run.params, jnp.asarray(ids[None, :-1]), jnp.asarray(ids[None, 1:])))[0]
    assert got['longppl'] == pytest.approx(math.exp(np.mean(nll[key - 1])), rel=1e-4)
    assert got['ppl'] == pytest.approx(math.exp(np.mean(nll)), rel=1e-4)
    results[r] = got['ppl']
  assert len(set(results.values())) == 2  # The restriction changed what the full layers see.
