"""Head ablation and the gradient signal (hybrid_jax.eval.recall_mechanism) against independent references."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.analysis import callbacks
from hybrid_jax.inspection import forward as forward_lib
from hybrid_jax.eval import recall, recall_mechanism
from hybrid_jax.study import presets
from hybrid_jax.train import state as state_lib

SMOKE = presets.PRESETS['smoke']


def _model(label, seed=0):
  config = presets.run_config(label, SMOKE)
  model_def, params = state_lib.init_model(config.model, seed)
  return config, model_def, params


def _mechanism(config, model_def, documents=8):
  held = recall.held_out(config.data, documents)
  return recall_mechanism.RecallMechanism(model_def, config.model, held,
                                          callbacks.recall_edges(config.data.recall.distance_ranges))


def test_full_heads_are_every_head_of_a_full_layer_and_the_full_half_of_a_headwise_one():
  assert recall_mechanism.full_heads(presets.run_config('SWA-128', SMOKE).model) == {1: [0, 1]}
  assert recall_mechanism.full_heads(presets.run_config('Full', SMOKE).model) == {0: [0, 1], 1: [0, 1]}
  assert recall_mechanism.full_heads(presets.run_config('Head-wise', SMOKE).model) == {0: [1], 1: [1]}
  assert recall_mechanism.full_heads(presets.run_config('GDN', SMOKE).model) == {1: [0, 1]}


@pytest.mark.parametrize('label, layer, head', [('Full', 1, 0), ('Full', 0, 1), ('Head-wise', 1, 1)])
def test_ablating_a_head_equals_zeroing_its_rows_of_the_output_projection(label, layer, head):
  config, model_def, params = _model(label)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, size=(2, 64)), jnp.int32)
  scale = np.ones(config.model.num_heads, np.float32)
  scale[head] = 0.0
  ablated = forward_lib.forward(model_def.bind(params), tokens, head_scale={layer: jnp.asarray(scale)})['logits']
  zeroed = jax.tree.map(lambda x: x, params)
  zeroed['tail'][layer]['mixer']['wo'] = params['tail'][layer]['mixer']['wo'].at[head].set(0.0)
  reference = model_def.bind(zeroed)(tokens)
  np.testing.assert_allclose(ablated, reference, atol=1e-5, rtol=1e-5)
  assert not np.allclose(ablated, model_def.bind(params)(tokens), atol=1e-4)  # the head mattered
  ones = forward_lib.forward(model_def.bind(params), tokens, head_scale={layer: jnp.ones(config.model.num_heads)})
  np.testing.assert_allclose(ones['logits'], model_def.bind(params)(tokens), atol=1e-5, rtol=1e-5)


def test_the_unablated_accuracy_is_recall_evals():
  config, model_def, params = _model('SWA-128')
  mechanism = _mechanism(config, model_def)
  edges = mechanism.edges
  expected = recall.RecallEval(model_def, config.model, mechanism.held, edges)(params)
  assert mechanism.ablation(params)['base'] == [b['accuracy'] for b in expected['buckets']]


@pytest.mark.parametrize('effect', ['present', 'absent', 'reversed'])
def test_ablation_scores_the_head_that_carries_recall(monkeypatch, effect):
  """Hand-built: recall beyond the large window hangs on head 1 of layer 1 of a two-full-layer model (present),
  on nothing (absent), or rises without it (reversed); the scores follow, and layer 0 stays at zero."""
  config, model_def, params = _model('Full')
  mechanism = _mechanism(config, model_def)
  ablated_accuracy = {'present': 0.2, 'absent': 0.9, 'reversed': 1.0}[effect]

  def accuracy(params, scales):
    row = mechanism.layers.index(1)
    return [1.0, 0.95, 0.9 if scales[row, 1] else ablated_accuracy]
  monkeypatch.setattr(mechanism, '_accuracy', accuracy)
  result = mechanism.ablation(params)
  drop = 0.9 - ablated_accuracy
  assert result['base'] == [1.0, 0.95, 0.9]
  layer1, layer0 = result['layers']['1'], result['layers']['0']
  assert layer1['heads']['1'] == pytest.approx([0.0, 0.0, drop]) and layer1['heads']['0'] == [0.0, 0.0, 0.0]
  assert layer1['best'] == pytest.approx([0.0, 0.0, max(drop, 0.0)])  # the most needed head
  assert layer1['all'] == pytest.approx([0.0, 0.0, drop])  # every full head of the layer at once includes head 1
  assert layer0['best'] == layer0['all'] == [0.0, 0.0, 0.0]
  metrics = callbacks.mechanism_metrics(result, {'0': [1, 2, 3], '1': [4, 5, 6]}, mechanism.edges)
  assert metrics['recall_ablation_layer1_32_58'] == pytest.approx(max(drop, 0.0))
  assert metrics['qk_grad_layer0_8_32'] == 2 and metrics['recall_ablation_layer0_all_32_58'] == 0.0


def _independent_signal(config, model_def, params, held, bucket, layer, heads):
  """||dL/dW_q, dL/dW_k|| of layer's full heads for the bucket's answers, through the model's own forward."""
  edges = callbacks.recall_edges(config.data.recall.distance_ranges)
  weights = jnp.asarray(recall.bucket_index(held.distances, edges) == bucket, jnp.float32)  # [N, Q]

  def loss(p):
    logp = jax.nn.log_softmax(model_def.bind(p)(jnp.asarray(held.tokens)).astype(jnp.float32), axis=-1)
    n, q, v = held.answer_positions.shape
    rows = jnp.arange(n)[:, None, None]
    picked = logp[rows, held.answer_positions, held.answers]  # [N, Q, V]
    return jnp.sum(weights * -picked.sum(-1)) / jnp.sum(weights)
  grads = jax.grad(loss)(params)['tail'][layer]['mixer']
  groups = config.model.num_heads // config.model.num_kv_heads
  kv = sorted({h // groups for h in heads})
  return float(jnp.sqrt(jnp.sum(grads['wq'][:, heads] ** 2) + jnp.sum(grads['wk'][:, kv] ** 2)))


@pytest.mark.parametrize('label', ['SWA-128', 'Head-wise'])
def test_gradient_signal_matches_an_independent_gradient(label):
  config, model_def, params = _model(label, seed=3)
  mechanism = _mechanism(config, model_def, documents=6)
  signal = mechanism.gradient_signal(params)
  assert set(signal) == {str(layer) for layer in mechanism.heads}
  for layer, heads in mechanism.heads.items():
    for bucket in range(3):
      expected = _independent_signal(config, model_def, params, mechanism.held, bucket, layer, heads)
      assert signal[str(layer)][bucket] == pytest.approx(expected, rel=1e-4)
  # Mutation guard: another layer's gradient differs, so reading the wrong layer would fail above.
  if len(mechanism.heads) > 1:
    a, b = list(signal.values())
    assert a != pytest.approx(b, rel=1e-2)
