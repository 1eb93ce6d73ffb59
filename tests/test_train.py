"""Optimizer schedules, the pure train step (accumulation, z-loss, bf16) and held-out loss by position."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.eval.perplexity import evaluate_packed, loss_by_position
from hybrid_jax.train import optim, state as state_lib, step as step_lib
from tests.conftest import default_tier, small_config


def test_wsd_schedule_warms_up_holds_then_decays():
  t = small_config().train
  t.update(dict(steps=100, warmup_steps=10, lr=1.0, schedule='wsd', decay_fraction=0.2, min_lr_ratio=0.1))
  lr = optim.make_schedule(t)
  assert float(lr(0)) == 0.0 and float(lr(5)) == pytest.approx(0.5)
  assert [float(lr(s)) for s in (10, 50, 80)] == [1.0, 1.0, 1.0]
  assert float(lr(90)) == pytest.approx(0.55) and float(lr(100)) == pytest.approx(0.1)


def test_cosine_and_constant_schedules():
  t = small_config().train
  t.update(dict(steps=100, warmup_steps=10, lr=2.0, schedule='cosine', min_lr_ratio=0.0))
  lr = optim.make_schedule(t)
  assert float(lr(10)) == pytest.approx(2.0) and float(lr(55)) == pytest.approx(1.0, abs=1e-3)
  assert float(lr(100)) == pytest.approx(0.0, abs=1e-6)
  t.schedule = 'constant'
  lr = optim.make_schedule(t)
  assert float(lr(5)) == pytest.approx(1.0) and float(lr(99)) == pytest.approx(2.0)


def test_weight_decay_skips_vectors():
  mask = optim.decay_mask({'w': jnp.ones((2, 3)), 'norm': {'scale': jnp.ones((3,))}})
  assert mask == {'w': True, 'norm': {'scale': False}}


def _setup(cfg):
  model_def, params = state_lib.init_model(cfg.model, 0)
  tx = optim.make_optimizer(cfg.train)
  return model_def, tx, state_lib.init_train_state(params, tx)


def _batch(cfg, seed=0):
  tokens = np.random.default_rng(seed).integers(0, 256, (cfg.train.batch_size, cfg.data.seq_len + 1))
  return {'inputs': jnp.asarray(tokens[:, :-1], jnp.int32), 'targets': jnp.asarray(tokens[:, 1:], jnp.int32)}


@pytest.mark.parametrize('arch', default_tier(['full', 'swa128', 'swa128_nope', 'swa128_1to3', 'swa128_headwise',
                                               'lightning', 'mamba2', 'gdn'],
                                              keep=('full', 'swa128', 'swa128_headwise', 'lightning', 'mamba2', 'gdn')))
def test_train_step_fits_a_batch(arch):
  cfg = small_config(arch)
  cfg.train.update(dict(warmup_steps=1, lr=1e-2))
  model_def, tx, state = _setup(cfg)
  train_step = step_lib.make_train_step(model_def, tx, cfg.train)
  batch = _batch(cfg)
  losses = []
  for _ in range(12):
    state, m = train_step(state, batch)
    losses.append(float(m['loss']))
  assert int(state['step']) == 12
  assert losses[0] == pytest.approx(np.log(cfg.model.vocab_size), abs=0.3)  # Near-uniform at init.
  assert losses[-1] < losses[0] - 1.0


def test_gradient_accumulation_matches_one_big_batch():
  cfg = small_config()
  cfg.train.update(dict(batch_size=4, warmup_steps=1))
  model_def, tx, state = _setup(cfg)
  batch = _batch(cfg)
  one, m1 = step_lib.make_train_step(model_def, tx, cfg.train)(jax.tree.map(jnp.copy, state), batch)
  cfg.train.grad_accum = 2
  two, m2 = step_lib.make_train_step(model_def, tx, cfg.train)(state, batch)
  assert float(m1['loss']) == pytest.approx(float(m2['loss']), rel=1e-6)
  assert float(m1['grad_norm']) == pytest.approx(float(m2['grad_norm']), rel=1e-5)
  for a, b in zip(jax.tree.leaves(one['params']), jax.tree.leaves(two['params'])):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_z_loss_adds_the_squared_log_partition():
  cfg = small_config()
  model_def, params = state_lib.init_model(cfg.model, 0)
  batch = _batch(cfg)
  logits = model_def.bind(params)(batch['inputs'])
  nll, log_z = step_lib.token_nll(logits, batch['targets'])
  expected = -jax.nn.log_softmax(logits.astype(jnp.float32))
  expected = jnp.take_along_axis(expected, batch['targets'][..., None], -1)[..., 0]
  np.testing.assert_allclose(nll, expected, rtol=1e-5)
  cfg.train.z_loss = 1e-2
  cfg.train.grad_clip = 0.0
  tx = optim.make_optimizer(cfg.train)
  state = state_lib.init_train_state(params, tx)
  _, m = step_lib.make_train_step(model_def, tx, cfg.train)(state, batch)
  assert float(m['loss']) == pytest.approx(float(jnp.mean(nll)), rel=1e-5)  # Reported loss excludes z-loss.
  assert float(jnp.mean(log_z ** 2)) > 1.0


@pytest.mark.parametrize('chunk', [16, 24])  # 24 does not divide the 64-token sequence: the last chunk is padded.
def test_chunked_loss_matches_the_whole_sequence_loss_and_its_gradients(chunk):
  cfg = small_config('gdn')
  model_def, params = state_lib.init_model(cfg.model, 0)
  batch = _batch(cfg)

  def objective(params, chunk):
    nll, log_z = step_lib.sequence_nll(model_def.bind(params), batch['inputs'], batch['targets'], chunk)
    return jnp.mean(nll) + 1e-2 * jnp.mean(log_z ** 2), (nll, log_z)

  (whole, (nll, log_z)), g_whole = jax.jit(jax.value_and_grad(objective, has_aux=True), static_argnums=1)(params, 0)
  (chunked, (nll_c, log_z_c)), g_chunked = jax.jit(jax.value_and_grad(objective, has_aux=True),
                                                   static_argnums=1)(params, chunk)
  direct, _ = step_lib.token_nll(model_def.bind(params)(batch['inputs']), batch['targets'])
  np.testing.assert_allclose(nll, direct, rtol=1e-6)
  np.testing.assert_allclose(nll_c, nll, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(log_z_c, log_z, rtol=1e-5, atol=1e-6)
  assert float(chunked) == pytest.approx(float(whole), rel=1e-6)
  for a, b in zip(jax.tree.leaves(g_chunked), jax.tree.leaves(g_whole)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_chunked_loss_never_holds_the_whole_logits():
  """Compiled temporaries of the train step shrink by about the logits (and their gradient) when chunked."""
  cfg = small_config(vocab_size=8192)
  cfg.data.seq_len, cfg.train.batch_size = 256, 2
  model_def, params = state_lib.init_model(cfg.model, 0)
  tx = optim.make_optimizer(cfg.train)
  state = jax.eval_shape(lambda: state_lib.init_train_state(params, tx))
  batch = jax.eval_shape(lambda: _batch(cfg))
  temp = {}
  for chunk in (0, 32):
    cfg.train.loss_chunk = chunk
    compiled = step_lib.make_train_step(model_def, tx, cfg.train).lower(state, batch).compile()
    temp[chunk] = compiled.memory_analysis().temp_size_in_bytes
  logits_bytes = 2 * 256 * 8192 * 4
  assert temp[32] < temp[0] - logits_bytes  # Whole: logits and their gradient; chunked: one 32-position slice.


def test_bfloat16_training_step_is_finite_and_keeps_float32_state():
  cfg = small_config(dtype='bfloat16')
  model_def, tx, state = _setup(cfg)
  state, m = step_lib.make_train_step(model_def, tx, cfg.train)(state, _batch(cfg))
  assert np.isfinite(float(m['loss']))
  assert {x.dtype for x in jax.tree.leaves(state['params'])} == {jnp.dtype('float32')}


def test_loss_by_position_buckets():
  nll = np.arange(8, dtype=np.float64) * 2  # Summed over 2 sequences.
  counts = np.full(8, 2.0)
  assert loss_by_position(nll, counts, 4) == [
      {'start': 0, 'end': 2, 'loss': 0.5}, {'start': 2, 'end': 4, 'loss': 2.5},
      {'start': 4, 'end': 6, 'loss': 4.5}, {'start': 6, 'end': 8, 'loss': 6.5}]


def test_evaluate_matches_a_direct_mean():
  cfg = small_config()
  model_def, params = state_lib.init_model(cfg.model, 0)
  batches = [_batch(cfg, seed) for seed in range(2)]
  result = evaluate_packed(step_lib.make_eval_step(model_def), params, batches)
  direct = np.mean([np.asarray(step_lib.token_nll(model_def.bind(params)(b['inputs']), b['targets'])[0])
                    for b in batches])
  assert result['packed_loss'] == pytest.approx(direct, rel=1e-5)
  assert result['packed_perplexity'] == pytest.approx(np.exp(direct), rel=1e-5)
  assert result['packed_tokens'] == 2 * cfg.train.batch_size * cfg.data.seq_len
  with pytest.raises(ValueError, match='at least one batch'):
    evaluate_packed(None, params, [])


def _documents_batch(cfg, seed=0):
  """A batch of rows of several documents (ids 1, 2, ... per row; the last target of each document crosses)."""
  batch = _batch(cfg, seed)
  b, t = batch['inputs'].shape
  rng = np.random.default_rng(seed + 1)
  seg = np.stack([np.searchsorted(np.sort(rng.choice(np.arange(1, t + 1), 3, replace=False)), np.arange(t + 1),
                                  side='right') + 1 for _ in range(b)]).astype(np.int32)
  return {**batch, 'segment_ids': jnp.asarray(seg[:, :-1]), 'target_segment_ids': jnp.asarray(seg[:, 1:])}


def test_documents_train_loss_is_the_mean_over_the_counted_targets():
  """The train step's loss and gradients on a batch with documents: the mean NLL (and z-loss) over the targets inside
  their input's document, with the loss in chunks and the batch accumulated or neither (the same update both ways)."""
  cfg = small_config('swa128')
  cfg.train.update(dict(z_loss=1e-2))
  model_def, params = state_lib.init_model(cfg.model, 0)
  batch = _documents_batch(cfg)
  weights = np.asarray(step_lib.target_weights(batch))
  assert 0 < weights.sum() < weights.size

  def reference(params):
    nll, log_z = step_lib.token_nll(model_def.bind(params)(batch['inputs'], segment_ids=batch['segment_ids']),
                                    batch['targets'])
    loss = jnp.sum(nll * weights) / weights.sum()
    return loss + 1e-2 * jnp.sum(log_z ** 2 * weights) / weights.sum(), loss

  (_, want), grads = jax.value_and_grad(reference, has_aux=True)(params)
  want_norm = float(jnp.sqrt(sum(jnp.sum(g ** 2) for g in jax.tree.leaves(grads))))
  updated = []
  for chunk, accum in ((0, 1), (16, 2)):
    cfg.train.update(dict(loss_chunk=chunk, grad_accum=accum))
    tx = optim.make_optimizer(cfg.train)
    state = state_lib.init_train_state(jax.tree.map(jnp.copy, params), tx)  # The step donates it.
    state, metrics = step_lib.make_train_step(model_def, tx, cfg.train)(state, batch)
    assert float(metrics['loss']) == pytest.approx(float(want), rel=1e-5), (chunk, accum)
    assert float(metrics['grad_norm']) == pytest.approx(want_norm, rel=1e-5), (chunk, accum)
    updated.append(state['params'])
  for other in updated[1:]:
    for a, b in zip(jax.tree.leaves(other), jax.tree.leaves(updated[0])):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
