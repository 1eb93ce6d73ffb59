"""The mixture-of-experts MLP: routers against numpy, dropless grouped dispatch against the all-experts reference
and a per-token numpy MoE, capacity drops, shared experts, the balance loss's closed form, config checks, counts,
FLOPs and a few training steps of a tiny MoE hybrid."""

import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_jax.config import BASE_CONFIG, load_config_file, validate
from hybrid_jax.errors import ConfigError
from hybrid_jax.models import counting, flops, moe, moe_routing
from hybrid_jax.models.model import HybridLM
from hybrid_jax.train import optim, state as state_lib, step as step_lib

TINY = dict(dtype='float32', vocab_size=64, d_model=16, num_heads=2, num_kv_heads=1, head_dim=8, d_ff=24, window=4,
            num_layers=2, cycle=('swa',))


def config(**moe_overrides):
  """The base config at tiny float32 shapes with every block MoE and `moe_overrides` in model.moe."""
  c = load_config_file(str(BASE_CONFIG))
  c.model.update(TINY)
  c.model.moe.update(dict(blocks='all', num_experts=4, top_k=2, expert_d_ff=8))
  c.model.moe.update(moe_overrides)
  return c


def built(**moe_overrides):
  """(validated model config, a float32 MoE with random non-zero biases)."""
  cfg = validate(config(**moe_overrides)).model
  layer = moe.MoE(cfg, rngs=nnx.Rngs(params=0))
  keys = iter(jax.random.split(jax.random.key(7), 16))
  for name in ('gate_bias', 'up_bias', 'down_bias', 'shared_gate'):
    var = getattr(layer, name)
    if var is not None:
      var.value = 0.3 * jax.random.normal(next(keys), var.shape)
  layer.router.value = 3.0 * layer.router[...]  # Well-separated logits: no near-ties decided by rounding.
  return cfg, layer


def np_params(layer) -> dict:
  return {name: np.asarray(getattr(layer, name)[...], np.float64) for name in
          ('router', 'router_bias', 'gate', 'up', 'down', 'gate_bias', 'up_bias', 'down_bias', 'shared_gate_proj',
           'shared_up', 'shared_down', 'shared_gate') if getattr(layer, name) is not None}


# ------------------------------------------------------------------------------------------ numpy references
def np_sigmoid(x):
  return 1 / (1 + np.exp(-x))


def np_softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def np_topk(x, k):
  """Indices of the k largest entries per row, ties to the lower index (stable sort of -x)."""
  return np.argsort(-x, axis=-1, kind='stable')[..., :k]


def np_route(logits, router, k, *, norm=True, bias=None, n_group=1, topk_group=1, scale=1.0):
  """(experts [N, k], weights [N, k]) by the routers' definitions, row by row."""
  experts, weights = [], []
  for row in np.asarray(logits, np.float64):
    if router == 'softmax_topk':
      p = np_softmax(row)
      idx = np_topk(p, k)
      w = p[idx] / (p[idx].sum() if norm else 1.0)
    elif router == 'topk_softmax':
      idx = np_topk(row, k)
      w = np_softmax(row[idx])
    else:
      s = np_sigmoid(row)
      choice = s + (0 if bias is None else bias)
      if n_group > 1:
        groups = choice.reshape(n_group, -1)
        group_score = np.sort(groups, axis=-1)[:, ::-1][:, :2].sum(-1)
        allowed = np.zeros(n_group, bool)
        allowed[np_topk(group_score, topk_group)] = True
        choice = np.where(np.repeat(allowed, groups.shape[1]), choice, -np.inf)
      idx = np_topk(choice, k)
      w = s[idx] / (s[idx].sum() if norm else 1.0)
    experts.append(idx)
    weights.append(w * scale)
  return np.array(experts), np.array(weights)


def np_expert(x, p, e, activation, limit=7.0, alpha=1.702):
  up = x @ p['up'][e]
  if activation == 'relu2':
    return np.square(np.maximum(up, 0)) @ p['down'][e]
  gate = x @ p['gate'][e]
  if activation == 'swiglu':
    return (gate * np_sigmoid(gate) * up) @ p['down'][e]
  gate, up = gate + p['gate_bias'][e], up + p['up_bias'][e]
  gate, up = np.minimum(gate, limit), np.clip(up, -limit, limit)
  return ((up + 1) * gate * np_sigmoid(alpha * gate)) @ p['down'][e] + p['down_bias'][e]


def np_moe(x, p, cfg):
  """The MoE by its definition, token by token (dropless)."""
  m = cfg.moe
  x = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
  experts, weights = np_route(x @ p['router'], m.router, m.top_k, norm=m.norm_topk_prob, bias=p.get('router_bias'),
                              n_group=m.n_group, topk_group=m.topk_group, scale=m.routed_scaling_factor)
  out = np.zeros_like(x)
  for n in range(x.shape[0]):
    for e, w in zip(experts[n], weights[n]):
      out[n] += w * np_expert(x[n], p, e, m.activation)
  if 'shared_up' in p:
    up = x @ p['shared_up']
    hidden = np.square(np.maximum(up, 0)) if m.activation == 'relu2' else (
        x @ p['shared_gate_proj'] * np_sigmoid(x @ p['shared_gate_proj']) * up)
    shared = hidden @ p['shared_down']
    if 'shared_gate' in p:
      shared = shared * np_sigmoid(x @ p['shared_gate'])[:, None]
    out += shared
  return out


def rel(got, want):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


# -------------------------------------------------------------------------------------------------- routers
TIED = np.array([[2.0, 1.0, 1.0, 0.5, -1.0, 0.0],   # Experts 1 and 2 tie for second place.
                 [0.3, 0.3, 0.3, 0.3, 0.3, 0.3],     # Everything ties: the lowest indices win.
                 [-2.0, 4.0, 0.0, 3.9, 1.0, -0.5],
                 [0.0, 0.0, 5.0, 0.0, 0.0, 5.0]], np.float32)


@pytest.mark.parametrize('router,norm', [('softmax_topk', True), ('softmax_topk', False), ('topk_softmax', True)])
def test_softmax_routers_match_numpy_ties_included(router, norm):
  rc = moe_routing.RouterConfig(router, top_k=2, norm_topk_prob=norm, routed_scaling_factor=1.5)
  got = moe_routing.route(jnp.asarray(TIED), rc)
  experts, weights = np_route(TIED, router, 2, norm=norm, scale=1.5)
  np.testing.assert_array_equal(got.experts, experts)
  np.testing.assert_allclose(got.weights, weights, rtol=1e-6)
  np.testing.assert_array_equal(got.experts[:2], [[0, 1], [0, 1]])  # Ties to the lower index.
  np.testing.assert_allclose(got.probs, np_softmax(TIED.astype(np.float64)), rtol=1e-6)


def test_sigmoid_router_bias_changes_the_choice_not_the_weights():
  rc = moe_routing.RouterConfig('sigmoid', top_k=2, norm_topk_prob=False, routed_scaling_factor=2.5)
  bias = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.7], np.float32)  # Lifts expert 5 into every row's choice.
  plain = moe_routing.route(jnp.asarray(TIED), rc)
  biased = moe_routing.route(jnp.asarray(TIED), rc, jnp.asarray(bias))
  for got, b in ((plain, None), (biased, bias)):
    experts, weights = np_route(TIED, 'sigmoid', 2, norm=False, bias=b, scale=2.5)
    np.testing.assert_array_equal(got.experts, experts)
    np.testing.assert_allclose(got.weights, weights, rtol=1e-6)
  assert (np.asarray(biased.experts) == 5).any(axis=1).all() and not (np.asarray(plain.experts)[:3] == 5).any()
  # The weights are the unbiased scores of the chosen experts, times the scaling factor.
  np.testing.assert_allclose(biased.weights, 2.5 * np_sigmoid(np.take_along_axis(TIED, np.asarray(biased.experts),
                                                                                 1)), rtol=1e-6)


def test_sigmoid_grouped_topk_picks_within_the_best_groups():
  logits = np.array([[3.0, -3.0, 2.0, 2.0, 2.5, -4.0],   # Groups {0,1} {2,3} {4,5}: best two of 3 groups by top-2 sums.
                     [0.0, 0.1, -1.0, 5.0, 0.2, 0.3]], np.float32)
  rc = moe_routing.RouterConfig('sigmoid', top_k=2, norm_topk_prob=True, n_group=3, topk_group=1)
  got = moe_routing.route(jnp.asarray(logits), rc)
  experts, weights = np_route(logits, 'sigmoid', 2, norm=True, n_group=3, topk_group=1)
  np.testing.assert_array_equal(got.experts, experts)
  np.testing.assert_allclose(got.weights, weights, rtol=1e-6)
  # Row 0: expert 0 has the best score but group {2,3} has the best pair, so 0 is not eligible.
  assert sorted(np.asarray(got.experts)[0]) == [2, 3]
  np.testing.assert_allclose(np.asarray(got.weights).sum(-1), 1.0, rtol=1e-6)


# ------------------------------------------------------------------------------------------------- dispatch
CASES = {
    'swiglu_softmax_gated_shared': dict(activation='swiglu', router='softmax_topk', norm_topk_prob=False,
                                        shared_experts=2, shared_d_ff=4, shared_expert_gate=True),
    'relu2_sigmoid_shared': dict(activation='relu2', router='sigmoid', shared_experts=1, routed_scaling_factor=2.0),
    'oai_topk_softmax': dict(activation='swiglu_oai', router='topk_softmax'),
}


@pytest.mark.parametrize('case', list(CASES))
def test_grouped_dispatch_equals_dense_and_numpy(case):
  cfg, layer = built(**CASES[case])
  if layer.router_bias is not None:
    layer.router_bias.value = jnp.asarray([0.0, 0.5, -0.5, 0.2])
  x = jax.random.normal(jax.random.key(1), (3, 5, cfg.d_model))
  want = np_moe(np.asarray(x), np_params(layer), cfg)
  graphdef, params = nnx.split(layer)

  def run(params, x, impl):
    model = nnx.merge(graphdef, params)
    model.implementation = impl
    y = model(x)
    return jnp.sum(jnp.sin(y)), y

  if case != 'swiglu_softmax_gated_shared':  # Values only: one case's gradients cover the shared dispatch code.
    grouped, dense = (jax.jit(run, static_argnums=2)(params, x, impl)[1] for impl in ('ragged_dot', 'dense'))
    assert rel(grouped.reshape(-1, cfg.d_model), want) < 1e-5 and rel(dense, grouped) < 1e-5
    return
  grad = jax.jit(jax.grad(run, argnums=(0, 1), has_aux=True), static_argnums=2)
  g_grouped, grouped = grad(params, x, 'ragged_dot')
  g_dense, dense = grad(params, x, 'dense')
  assert rel(grouped.reshape(-1, cfg.d_model), want) < 1e-5
  assert rel(dense, grouped) < 1e-5
  for a, b in zip(jax.tree.leaves(g_grouped), jax.tree.leaves(g_dense)):
    if np.abs(np.asarray(b)).max() > 0:
      assert rel(a, b) < 1e-5
  assert np.abs(np.asarray(g_grouped[0]['router'][...])).max() > 0  # The router is trained through the weights.


def test_capacity_drops_later_tokens_and_counts_them():
  cfg, layer = built(dropless=False, capacity_factor=1.0, top_k=1)
  router = np.zeros((cfg.d_model, 4), np.float32)
  router[0, 2] = 10.0  # A positive first coordinate sends every token to expert 2.
  layer.router.value = jnp.asarray(router)
  x = jax.random.normal(jax.random.key(2), (12, cfg.d_model)).at[:, 0].set(1.0)
  cap = math.ceil(1.0 * 12 * 1 / 4)
  graphdef, params = nnx.split(layer)

  @functools.partial(jax.jit, static_argnums=(0, 3))
  def run(graphdef, params, x, impl):
    model = nnx.merge(graphdef, params)
    model.implementation = impl
    return model.with_stats(x)

  for impl in ('ragged_dot', 'dense'):
    y, stats = run(graphdef, params, x, impl)
    assert float(stats['dropped']) == 12 - cap
    assert np.abs(np.asarray(y[:cap])).min(axis=1).all() and not np.asarray(y[cap:]).any()
    np.testing.assert_allclose(stats['load'], [0, 0, 1, 0])
  cfg2 = validate(config(top_k=1)).model
  dropless = moe.MoE(cfg2, rngs=nnx.Rngs(params=0))
  dropless.router.value = layer.router[...]
  dropless.up.value, dropless.gate.value, dropless.down.value = layer.up[...], layer.gate[...], layer.down[...]
  y_all, stats = run(*nnx.split(dropless), x, 'ragged_dot')
  assert float(stats['dropped']) == 0
  assert rel(y[:cap], y_all[:cap]) < 1e-5


def test_within_capacity_keeps_the_first_assignments_of_each_expert():
  flat = jnp.asarray([1, 0, 1, 1, 2, 0, 1, 0])
  np.testing.assert_array_equal(moe._within_capacity(flat, 3, 2), [1, 1, 1, 0, 1, 1, 0, 0])


# ---------------------------------------------------------------------------------------------- statistics
def test_balance_loss_closed_form_and_minimal_at_uniform_load():
  experts = jnp.asarray([[0, 1], [0, 2], [0, 1], [3, 0]])  # 8 assignments: loads 4/8, 2/8, 1/8, 1/8.
  probs = jnp.asarray(np_softmax(np.random.default_rng(0).normal(size=(4, 4))), jnp.float32)
  load = moe_routing.load_fractions(experts, 4)
  np.testing.assert_allclose(load, [0.5, 0.25, 0.125, 0.125])
  want = 4 * np.sum(np.array([0.5, 0.25, 0.125, 0.125]) * np.asarray(probs).mean(0))
  assert float(moe_routing.balance_loss(load, probs)) == pytest.approx(want, rel=1e-6)
  uniform = moe_routing.balance_loss(jnp.full((4,), 0.25), jnp.full((4, 4), 0.25))
  assert float(uniform) == pytest.approx(1.0)
  skewed = moe_routing.balance_loss(load, jnp.tile(load, (4, 1)))
  assert float(skewed) > 1.0
  routing = moe_routing.Routing(experts, jnp.ones((4, 2)) / 2, probs)
  stats = moe_routing.statistics(jnp.log(probs), routing, 4, 0)
  assert float(stats['load_cv']) == pytest.approx(np.std([0.5, 0.25, 0.125, 0.125]) / 0.25, rel=1e-6)
  assert float(stats['z_loss']) == pytest.approx(0.0, abs=1e-10)  # log-softmax logits: logsumexp is 0.
  np_entropy = -np.mean(np.sum(np.asarray(probs) * np.log(np.asarray(probs)), -1))
  assert float(stats['entropy']) == pytest.approx(np_entropy, rel=1e-6)


def test_bias_update_moves_toward_even_load():
  bias = moe_routing.bias_update(jnp.zeros(4), jnp.asarray([0.5, 0.25, 0.125, 0.125]), 0.01)
  np.testing.assert_allclose(bias, [-0.01, 0.0, 0.01, 0.01])


# -------------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize('overrides,needle', [
    (dict(top_k=5), 'config.model.moe.top_k=5 is invalid: must be at most model.moe.num_experts=4'),
    (dict(num_experts=0), 'config.model.moe.num_experts=0 is invalid'),
    (dict(capacity_factor=0.0), 'config.model.moe.capacity_factor=0.0 is invalid'),
    (dict(router='switch'), 'config.model.moe.router='),
    (dict(activation='gelu'), 'config.model.moe.activation='),
    (dict(blocks='some'), 'config.model.moe.blocks='),
    (dict(n_group=2), "grouped top-k needs model.moe.router='sigmoid'"),
    (dict(blocks='cycle', cycle_positions=(3,)), 'config.model.moe.cycle_positions=(3,) is invalid'),
])
def test_bad_moe_config_is_one_line(overrides, needle):
  with pytest.raises(ConfigError) as e:
    validate(config(**overrides))
  assert needle in str(e.value) and '\n' not in str(e.value)


def test_dense_default_has_no_moe_and_blocks_choose_their_mlps():
  c = load_config_file(str(BASE_CONFIG))
  model = validate(c).model
  assert model.moe.blocks == 'none' and not any(moe.is_moe_block(model, i) for i in range(model.num_layers))
  c.model.update(num_layers=6, cycle=('swa', 'full', 'swa'))
  c.model.moe.update(blocks='every', every=2)
  assert [moe.is_moe_block(validate(c).model, i) for i in range(6)] == [False, True, False, True, False, True]
  c.model.moe.update(blocks='cycle', cycle_positions=(0, 2))
  assert [moe.is_moe_block(validate(c).model, i) for i in range(6)] == [True, False, True, True, False, True]


# ----------------------------------------------------------------------------------------- counts and FLOPs
@pytest.mark.parametrize('model_overrides,moe_overrides', [
    ({}, dict(router='sigmoid', shared_experts=1, shared_expert_gate=True)),
    ({}, dict(activation='swiglu_oai', router='topk_softmax')),
    (dict(block_mlp=False, cycle=('swa', 'moe')), dict(blocks='none', activation='relu2', shared_experts=1)),
    (dict(num_layers=4, scan_layers=True, cycle=('swa', 'full')), dict(blocks='cycle', cycle_positions=(1,))),
])
def test_counted_params_equal_the_built_model(model_overrides, moe_overrides):
  c = config(**moe_overrides)
  c.model.update(model_overrides)
  cfg = validate(c).model
  model = nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(params=0)))
  built_count = sum(math.prod(v.shape) for v in jax.tree.leaves(nnx.state(model)))
  counts = counting.param_counts(cfg)
  assert counts['total'] == built_count
  m = cfg.moe
  per_expert = moe.EXPERT_MLPS[m.activation] * cfg.d_model * 8 + (2 * 8 + cfg.d_model if m.activation ==
                                                                   'swiglu_oai' else 0)
  moe_layers = sum(1 for layer in counts['layers'] if layer['active'] != layer['total'])
  assert moe_layers >= 1
  assert counts['total'] - counts['active'] == moe_layers * (m.num_experts - m.top_k) * per_expert


def test_flops_count_active_experts():
  cfg = validate(config(shared_experts=1)).model
  f = flops.layer_flops(cfg, counting.pattern.layer_spec(cfg, 0), 10)
  d, e, k, w = cfg.d_model, 4, 2, 8
  assert f['mlp'] == 2 * 10 * (d * e + k * 3 * d * w + 3 * d * w)
  assert f['mlp_in'] == f['mlp'] - 2 * 10 * (k * w * d + w * d)


# -------------------------------------------------------------------------------------------------- training
def train_config(**moe_overrides):
  c = config(**moe_overrides)
  c.model.update(dict(cycle=('swa',), num_layers=2, vocab_size=257))
  c.train.update(dict(batch_size=2, warmup_steps=1, lr=1e-2, grad_accum=1))
  c.data.seq_len = 16
  return validate(c)


def test_tiny_moe_hybrid_trains_and_reports_router_statistics():
  c = train_config(router='sigmoid', bias_rate=0.01, aux_loss_coef=0.01)
  c.model.num_layers = 1  # One SWA block with an MoE MLP: the cheapest hybrid that trains.
  cfg = validate(c)
  model_def, params = state_lib.make_model_def(cfg.model), state_lib.init_params(cfg.model, 0)  # Eager: no compile.
  tx = optim.make_optimizer(cfg.train)
  state = state_lib.init_train_state(params, tx)
  train_step = step_lib.make_train_step(model_def, tx, cfg.train)
  tokens = np.random.default_rng(0).integers(0, 257, (2, 17))
  batch = {'inputs': jnp.asarray(tokens[:, :-1], jnp.int32), 'targets': jnp.asarray(tokens[:, 1:], jnp.int32)}
  bias_before = np.asarray(params['tail'][0]['mlp']['router_bias'])
  losses = []
  for _ in range(6):
    state, m = train_step(state, batch)
    losses.append(float(m['loss']))
  assert all(np.isfinite(losses)) and losses[-1] < losses[0]
  assert np.asarray(m['moe/layer0/load']).shape == (4,)
  assert float(m['moe/layer0/load'].sum()) == pytest.approx(1.0)
  for name in ('aux_loss', 'z_loss', 'load_cv', 'entropy', 'dropped'):
    assert np.isfinite(float(m[f'moe/layer0/{name}']))
  assert float(m['moe_aux_loss']) == pytest.approx(float(m['moe/layer0/aux_loss']))
  moved = np.asarray(state['params']['tail'][0]['mlp']['router_bias']) - bias_before  # 6 steps of +-0.01 or 0.
  assert 0 < np.abs(moved).max() <= 0.06 + 1e-6
  np.testing.assert_allclose(moved * 100, np.round(moved * 100), atol=1e-4)


def test_router_penalty_sums_every_moe_layer_with_its_coefficients():
  c = train_config(aux_loss_coef=0.5, z_loss_coef=0.25, blocks='none')
  c.model.update(dict(block_mlp=False, cycle=('moe',)))  # Two MoE layers and nothing else: a cheap forward.
  cfg = validate(c)
  model_def, params = state_lib.make_model_def(cfg.model), state_lib.init_params(cfg.model, 0)
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 257, (2, 16)), jnp.int32)

  @jax.jit
  def forward(params):
    model = model_def.bind(params)
    _, stats = model.hidden_states_with_stats(tokens)
    return model.stats_by_layer(stats), step_lib.router_penalty(model, stats)

  by_layer, penalty = forward(params)
  assert sorted(by_layer) == [0, 1]
  want = sum(0.5 * float(s['aux_loss']) + 0.25 * float(s['z_loss']) for s in by_layer.values())
  assert float(penalty) == pytest.approx(want, rel=1e-6)
  assert want > 0


@pytest.mark.e2e
def test_training_run_writes_router_statistics_to_metrics(tmp_path):
  from hybrid_jax.train import loop
  cfg = train_config()
  cfg.train.update(dict(steps=20, log_every=5, eval_every=0, checkpoint_every=20, progress=False))
  cfg.eval.documents = 0
  loop.train(cfg, str(tmp_path))
  records = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  train = [r for r in records if r['kind'] == 'train']
  assert len(train[-1]['moe/layer1/load']) == 4 and 'moe/layer0/load_cv' in train[-1]
  assert train[-1]['loss'] < train[0]['loss']


def test_hf_export_refuses_moe_models_in_one_line():
  from hybrid_jax.hf import io as hf_io
  from hybrid_jax.hf import HFError
  for model_overrides, moe_overrides in (({}, {}), (dict(block_mlp=False, cycle=('swa', 'moe')), dict(blocks='none'))):
    c = config(**moe_overrides)
    c.model.update(model_overrides)
    with pytest.raises(HFError) as e:
      hf_io.check_exportable(validate(c).model)
    assert '\n' not in str(e.value)


@pytest.mark.e2e
def test_scanned_moe_stack_trains_with_per_layer_statistics_and_bias_updates():
  cfg = train_config(router='sigmoid', bias_rate=0.01, blocks='every', every=2)
  cfg.model.update(dict(num_layers=6, cycle=('swa', 'full'), scan_layers=True, remat='minimal'))
  cfg = validate(cfg)
  model_def, params = state_lib.init_model(cfg.model, 0)
  tx = optim.make_optimizer(cfg.train)
  state = state_lib.init_train_state(params, tx)
  cfg.train.grad_accum = 2
  train_step = step_lib.make_train_step(model_def, tx, cfg.train)
  tokens = np.random.default_rng(0).integers(0, 257, (2, 17))
  batch = {'inputs': jnp.asarray(tokens[:, :-1], jnp.int32), 'targets': jnp.asarray(tokens[:, 1:], jnp.int32)}
  for _ in range(3):
    state, m = train_step(state, batch)
  assert sorted({int(k.split('/')[1][5:]) for k in m if k.startswith('moe/')}) == [1, 3, 5]
  bias = np.asarray(state['params']['cycles']['blocks'][1]['mlp']['router_bias'])
  assert bias.shape == (3, 4) and np.abs(bias).max() > 0


@pytest.mark.e2e
def test_sharded_moe_training_matches_one_device():
  """Data parallel beside FSDP, and FSDP beside tensor parallel, on 4 devices: each device sorts its own tokens, and the losses, router
  statistics and loads of 3 steps (sigmoid router, bias updates, a shared expert) equal one device's."""
  from tests.test_parallel import run_with_devices
  code = '''
    import json
    import jax, numpy as np
    from hybrid_jax.config import validate
    from hybrid_jax.parallel import mesh as mesh_lib, rules as rules_lib
    from hybrid_jax.train import optim, state as state_lib, step as step_lib
    from tests.test_moe import train_config

    def run(shape, devices):
      c = train_config(router='sigmoid', bias_rate=0.01, shared_experts=1)
      c.train.batch_size = 4
      c.parallel.data, c.parallel.fsdp, c.parallel.tensor = shape
      cfg = validate(c)
      md, tx = state_lib.make_model_def(cfg.model), optim.make_optimizer(cfg.train)
      mesh = mesh_lib.make_mesh(cfg.parallel, devices)
      sh = mesh_lib.train_shardings(md, tx, mesh, rules_lib.parse_rules(cfg.parallel.rules))
      state = state_lib.init_sharded_train_state(cfg.model, cfg.seed, tx, sh.state)
      step = step_lib.make_train_step(md, tx, cfg.train, sh)
      rng, out = np.random.default_rng(0), []
      for _ in range(3):
        toks = rng.integers(0, 257, (4, cfg.data.seq_len + 1)).astype(np.int32)
        batch = {k: jax.device_put(v, sh.batch) for k, v in {'inputs': toks[:, :-1], 'targets': toks[:, 1:]}.items()}
        state, m = step(state, batch)
        out.append([float(m['loss']), float(m['moe/layer1/aux_loss'])] + np.asarray(m['moe/layer0/load']).tolist())
      return out

    single = np.array(run((1, 1, 1), jax.devices()[:1]))
    print(json.dumps([float(np.abs(np.array(run(s, jax.devices())) - single).max())
                      for s in ((2, 2, 1), (1, 2, 2))]))
  '''
  gaps = json.loads(run_with_devices(4, code).splitlines()[-1])
  assert max(gaps) < 1e-5, gaps
