"""The train step on one CPU device computes its dots through oneDNN (hybrid_jax.train.cpu_dots) and trains as
XLA's own dots do; with a persistent compilation cache, or on any other device set, it keeps XLA's dots."""

import types

import jax
import numpy as np
import pytest

from hybrid_jax.train import cpu_dots, optim, state as state_lib, step as step_lib
from tests.conftest import small_config

ONEDNN_CALL = '__onednn$matmul'


@pytest.fixture
def compilation_cache():
  """set(enabled): turns the suite's persistent compilation cache on or off until the test ends."""
  enabled = jax.config.jax_enable_compilation_cache
  yield lambda on: jax.config.update('jax_enable_compilation_cache', on)
  jax.config.update('jax_enable_compilation_cache', enabled)


def _losses(cfg, steps=5):
  """(compiled HLO text, losses of `steps` steps on one batch) of the config's train step from its initial state."""
  model_def, params = state_lib.init_model(cfg.model, 0)
  tx = optim.make_optimizer(cfg.train)
  state = state_lib.init_train_state(params, tx)
  tokens = np.random.default_rng(0).integers(0, 256, (cfg.train.batch_size, cfg.data.seq_len + 1)).astype(np.int32)
  batch = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:]}
  compiled = step_lib.make_train_step(model_def, tx, cfg.train).lower(state, batch).compile()
  losses = []
  for _ in range(steps):
    state, m = compiled(state, batch)
    losses.append(float(m['loss']))
  return compiled.as_text(), losses


def test_one_cpu_device_trains_with_onednn_dots_as_with_xla_dots(compilation_cache):
  cfg = small_config('swa128')
  cfg.train.update(dict(warmup_steps=1, lr=1e-2))
  assert cpu_dots.persistent_cache_configured()  # the suite's cache: XLA's own dots
  xla_text, xla_losses = _losses(cfg)
  compilation_cache(False)
  onednn_text, onednn_losses = _losses(cfg)
  assert ONEDNN_CALL not in xla_text and ONEDNN_CALL in onednn_text
  np.testing.assert_allclose(onednn_losses, xla_losses, rtol=1e-5)
  assert onednn_losses[-1] < onednn_losses[0]


@pytest.mark.parametrize('platforms, cache, expected', [
    (['cpu'], False, cpu_dots.ONEDNN_DOTS),
    (['cpu'], True, None),  # XLA cannot serialise oneDNN calls into the cache
    (['cpu', 'cpu'], False, None),  # a sharded CPU mesh checks layouts, not speed
    (['tpu'], False, None), (['gpu'], False, None)])
def test_onednn_only_for_one_cpu_device_without_a_persistent_cache(compilation_cache, platforms, cache, expected):
  compilation_cache(cache)
  assert cpu_dots.compiler_options([types.SimpleNamespace(platform=p) for p in platforms]) == expected
