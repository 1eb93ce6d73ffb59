"""Decoding: prefill + one-token steps reproduce the full forward pass for every arch; SWA decode memory is O(w)
and recurrent states O(1); greedy generation with EOS and stop strings."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.eval.generate import Generator, stop_on_strings
from hybrid_jax.train import state as state_lib
from tests.conftest import default_tier, small_config

ARCHES = ['full', 'swa128', 'swa128_nope', 'swa128_1to3', 'swa128_headwise', 'lightning', 'mamba2', 'gdn']


def _decode_logits(model_def, params, tokens, prompt_len):
  model = model_def.bind(params)
  state = model.init_decode_state(tokens.shape[0], tokens.shape[1])
  prefill = jax.jit(lambda p, t, s: model_def.bind(p).prefill(t, s))
  step = jax.jit(lambda p, t, pos, s: model_def.bind(p).step(t, pos, s))
  logits, state = prefill(params, tokens[:, :prompt_len], state)
  out = [logits]
  for pos in range(prompt_len, tokens.shape[1]):
    logits, state = step(params, tokens[:, pos], jnp.int32(pos), state)
    out.append(logits[:, None])
  return jnp.concatenate(out, axis=1)


def _forward(model_def, params, tokens):
  return jax.jit(lambda p, t: model_def.bind(p)(t))(params, tokens)


# Every arch unscanned and one scanned stack in the default tier; the second scanned one is the e2e tier's.
DECODE_CASES = [(arch, False) for arch in ARCHES] + [('swa128', True), ('gdn', True)]


@pytest.mark.parametrize('arch, scan', default_tier(DECODE_CASES, keep=[c for c in DECODE_CASES if c != ('gdn', True)]))
def test_prefill_plus_steps_equal_one_forward_pass(arch, scan):
  cfg = small_config(arch, window=5, num_layers=5, scan_layers=scan).model  # Scanned: 2 cycles + 1 layer.
  model_def, params = state_lib.init_model(cfg, 0)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 19)))
  expected = _forward(model_def, params, tokens)
  got = _decode_logits(model_def, params, tokens, prompt_len=7)  # Steps cross the window several times.
  np.testing.assert_allclose(got, expected, atol=2e-5, rtol=1e-5)


def test_decode_with_learned_sinks_equals_the_forward_pass():
  """Head-wise layers (SWA and full heads, each with its own sink) in a scanned stack (3 cycles): caches and sinks
  per head."""
  from tests.test_model import _random_sinks  # pylint: disable=g-import-not-at-top
  cfg = small_config('swa128_headwise', window=5, num_layers=3, scan_layers=True, attention_sinks=True).model
  model_def, params = state_lib.init_model(cfg, 0)
  params = _random_sinks(params)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 19)))
  expected = _forward(model_def, params, tokens)
  got = _decode_logits(model_def, params, tokens, prompt_len=7)
  np.testing.assert_allclose(got, expected, atol=2e-5, rtol=1e-5)
  plain = _forward(state_lib.make_model_def(small_config('swa128_headwise', window=5, num_layers=3,
                                                         scan_layers=True).model),
                   _without_sinks(params), tokens)
  assert np.abs(np.asarray(plain) - np.asarray(expected)).max() > 1e-3


def _without_sinks(tree):
  return {k: _without_sinks(v) for k, v in tree.items() if k != 'sinks'} if isinstance(tree, dict) else tree


def test_sliding_window_decode_state_is_a_ring_of_w_entries():
  cfg = small_config('swa128', window=5).model
  model_def, params = state_lib.init_model(cfg, 0)
  model = model_def.bind(params)
  short, long = model.init_decode_state(1, 64), model.init_decode_state(1, 4096)
  swa_short, full_short = short['tail'][0][0]['k'], short['tail'][1][0]['k']
  swa_long, full_long = long['tail'][0][0]['k'], long['tail'][1][0]['k']
  assert swa_short.shape[1] == swa_long.shape[1] == 5  # O(w) whatever the context ...
  assert (full_short.shape[1], full_long.shape[1]) == (64, 4096)  # ... while full attention keeps everything.


@pytest.mark.parametrize('arch', ['lightning', 'mamba2', 'gdn'])
def test_recurrent_decode_state_does_not_grow_with_context(arch):
  cfg = small_config(arch).model
  model_def, params = state_lib.init_model(cfg, 0)
  model = model_def.bind(params)
  size = lambda state: sum(x.size for x in jax.tree.leaves(state['tail'][0]))
  assert size(model.init_decode_state(1, 64)) == size(model.init_decode_state(1, 65536)) > 0


def test_greedy_generation_matches_argmax_of_the_forward_pass():
  cfg = small_config('swa128_nope', window=5).model
  model_def, params = state_lib.init_model(cfg, 0)
  gen = Generator(model_def, params)
  prompts = [[1, 2, 3, 4], [9, 8, 7, 6], [5, 5, 5]]
  outs = gen.generate(prompts, max_new_tokens=6, batch_size=2)
  assert [len(o) for o in outs] == [6, 6, 6]
  for prompt, out in zip(prompts, outs):  # Teacher-force the generated text: each token is the argmax.
    logits = _forward(model_def, params, jnp.asarray([prompt + out]))
    assert list(np.asarray(jnp.argmax(logits[0, len(prompt) - 1:-1], axis=-1))) == out


def test_length_buckets_give_the_same_tokens():
  """Prefill up to a bucket boundary plus one-token steps for the rest gives what one whole prefill gives."""
  cfg = small_config('gdn').model
  model_def, params = state_lib.init_model(cfg, 1)
  prompts = [list(range(1, 12)), list(range(20, 39)), [7] * 8]
  whole = Generator(model_def, params, bucket=1024).generate(prompts, max_new_tokens=5)
  assert Generator(model_def, params, bucket=8).generate(prompts, max_new_tokens=5) == whole  # 3, 3 and 0 steps


def test_generation_stops_at_eos_and_at_stop_strings():
  cfg = small_config('swa128', window=5).model
  model_def, params = state_lib.init_model(cfg, 0)
  free = Generator(model_def, params).generate([[1, 2, 3]], max_new_tokens=8)[0]
  eos = free[2]
  stopped = Generator(model_def, params, eos_id=eos).generate([[1, 2, 3]], max_new_tokens=8)[0]
  assert stopped == free[:free.index(eos)]
  as_text = lambda ids: ' '.join(map(str, ids))
  cut = Generator(model_def, params).generate([[1, 2, 3]], max_new_tokens=8,
                                              stop=stop_on_strings(as_text, [str(free[1])]))[0]
  assert cut == free[:2] or (free[0] == free[1] and cut == free[:1])
  with pytest.raises(ValueError, match='at least one token'):
    Generator(model_def, params).generate([[]], max_new_tokens=2)
