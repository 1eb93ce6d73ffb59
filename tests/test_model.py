"""HybridLM: exact study parameter counts, the layer pattern, scan == unrolled, causality and receptive field."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_jax.models import counting, pattern
from hybrid_jax.models.model import HybridLM
from hybrid_jax.train import state as state_lib
from tests.conftest import default_tier, small_config, study_config

STUDY_NON_EMBEDDING = {'s1': 14_999_424, 's2': 31_470_080, 's3': 64_901_760, 's4': 104_427_264, 's5': 476_852_480}
ARCHES = ['full', 'swa128', 'swa512', 'swa2048', 'swa128_nope', 'swa128_1to3', 'swa128_headwise']


@pytest.mark.parametrize('scale', list(STUDY_NON_EMBEDDING))
@pytest.mark.parametrize('arch', ['swa128', 'full', 'swa128_nope'])
def test_study_non_embedding_counts_are_exact(arch, scale):
  counts = counting.param_counts(study_config(arch, scale).model)
  assert counts['non_embedding'] == STUDY_NON_EMBEDDING[scale]
  assert counts['embedding'] == 2 * 73_448 * study_config(arch, scale).model.d_model


@pytest.mark.parametrize('scale', ['tiny', 's1', 's5'])
@pytest.mark.parametrize('arch', ARCHES + ['lightning', 'mamba2', 'gdn', 'swa128_headwise+sinks'])
def test_counting_matches_the_built_model(arch, scale):
  arch, _, sinks = arch.partition('+')
  cfg = study_config(arch, scale).model
  cfg.attention_sinks = bool(sinks)  # One learned sink logit per head and attention layer.
  abstract = nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0)))
  params = nnx.to_pure_dict(nnx.state(abstract, nnx.Param))
  sizes = {'/'.join(map(str, path)): int(np.prod(leaf.shape))
           for path, leaf in jax.tree_util.tree_flatten_with_path(params, is_leaf=lambda x: hasattr(x, 'shape'))[0]
           for path in [[getattr(p, 'key', getattr(p, 'idx', p)) for p in path]]}
  total = sum(sizes.values())
  embedding = sizes['embed'] + sizes['lm_head']
  counts = counting.param_counts(cfg)
  assert (total - embedding, embedding, total) == (counts['non_embedding'], counts['embedding'], counts['total'])


def test_layer_pattern_is_a_function_of_the_index():
  cfg = study_config('swa128', 's1').model
  kinds = [pattern.layer_spec(cfg, i).kind for i in range(cfg.num_layers)]
  assert kinds == ['swa', 'full'] * 5  # Full attention at odd 0-based layers.
  assert pattern.layer_spec(cfg, 0).window == 128 and pattern.layer_spec(cfg, 1).window is None
  nope = study_config('swa128_nope', 's1').model
  assert [pattern.layer_spec(nope, i).rope for i in range(2)] == [True, False]
  one_to_three = study_config('swa128_1to3', 's1').model
  assert [pattern.layer_spec(one_to_three, i).kind for i in range(10)] == (['swa'] * 3 + ['full']) * 2 + ['swa'] * 2
  assert pattern.stack_layout(one_to_three) == (2, 2)
  assert {pattern.layer_spec(study_config('full', 's1').model, i).kind for i in range(10)} == {'full'}
  with pytest.raises(IndexError):
    pattern.layer_spec(cfg, 10)


def _logits(cfg, params, tokens):
  model_def = state_lib.make_model_def(cfg)
  return np.asarray(jax.jit(lambda p, t: model_def.bind(p)(t))(params, tokens))


def _to_scanned(unrolled, scanned_template, period, n_cycles):
  """Rearranges an unrolled model's params into the scanned layout (same function, stacked storage)."""
  out = dict(scanned_template)
  out['cycles'] = {'blocks': {b: jax.tree.map(lambda *xs: jnp.stack(xs),
                                               *[unrolled['tail'][c * period + b] for c in range(n_cycles)])
                              for b in range(period)}}
  out['tail'] = {i: unrolled['tail'][n_cycles * period + i] for i in range(len(unrolled['tail']) - n_cycles * period)}
  for key in ('embed', 'lm_head', 'final_norm'):
    out[key] = unrolled[key]
  return out


# save_dots (the study scales' default) in the fast suite; it checks the scan as well as the remat policy.
@pytest.mark.parametrize('remat', ['save_dots', pytest.param('full', marks=pytest.mark.e2e),
                                   pytest.param('none', marks=pytest.mark.e2e)])
def test_scanned_stack_computes_the_unrolled_function(remat):
  cfg = small_config('swa128', num_layers=5, window=8).model  # 2 scanned cycles of 2 + 1 leftover layer.
  _, params = state_lib.init_model(cfg, 0)
  scanned_cfg = cfg.copy_and_resolve_references()
  scanned_cfg.scan_layers, scanned_cfg.remat = True, remat
  scanned_def, template = state_lib.init_model(scanned_cfg, 1)
  assert jax.tree.leaves(template['cycles'])[0].shape[0] == 2
  scanned = _to_scanned(params, template, 2, 2)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 24)))
  np.testing.assert_allclose(_logits(cfg, params, tokens), _logits(scanned_cfg, scanned, tokens), atol=2e-5)

  def loss(def_, p):
    return jnp.mean(def_.bind(p)(tokens).astype(jnp.float32) ** 2)

  unrolled_def, _ = state_lib.init_model(cfg, 0)
  g_unrolled = jax.jit(jax.grad(lambda p: loss(unrolled_def, p)))(params)
  g_scanned = jax.jit(jax.grad(lambda p: loss(scanned_def, p)))(scanned)
  np.testing.assert_allclose(g_scanned['cycles']['blocks'][1]['mlp']['down'][1],
                             g_unrolled['tail'][3]['mlp']['down'], rtol=1e-4, atol=1e-7)


# Each policy once in the default tier (on an attention and on a recurrent stack); every kind under both in e2e.
@pytest.mark.parametrize('arch, policy', default_tier(
    [(a, p) for p in ('minimal', 'recompute_mlp') for a in ('swa128', 'lightning', 'mamba2', 'gdn')],
    keep=[('swa128', 'minimal'), ('gdn', 'recompute_mlp')]))
def test_named_remat_policies_give_the_loss_and_gradients_of_no_remat(arch, policy):
  """Remat 'minimal' and 'recompute_mlp' (a scanned stack, float32) compute the same loss and gradients as no
  remat, for attention and each recurrent mixer."""
  cfg = small_config(arch, num_layers=4, scan_layers=True, dtype='float32').model
  model_def, params = state_lib.init_model(cfg, 0)
  policy_cfg = cfg.copy_and_resolve_references()
  policy_cfg.remat = policy
  policy_def, _ = state_lib.init_model(policy_cfg, 0)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 32)))

  def loss(def_, p):
    logits = def_.bind(p)(tokens).astype(jnp.float32)
    return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, tokens[..., None], -1)[..., 0])

  (l0, g0), (l1, g1) = (jax.jit(jax.value_and_grad(lambda p, d=d: loss(d, p)))(params)
                        for d in (model_def, policy_def))
  assert float(l0) == pytest.approx(float(l1), rel=1e-6)
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def _saved_by(arch, remat):
  """What the backward of a 2-block model keeps under `remat`: (shape, jax's description) of each saved residual."""
  from jax._src.ad_checkpoint import saved_residuals
  cfg = small_config(arch, num_layers=2, remat=remat, dtype='float32').model
  model_def, params = state_lib.init_model(cfg, 0)
  saved = saved_residuals(lambda p: jnp.sum(model_def.bind(p)(jnp.zeros((1, 16), jnp.int32))), params)
  return [(aval.shape, what) for aval, what in saved]


def _names(saved):
  """The checkpoint names (layers.QUERY, ...) among `_saved_by`'s residuals, sorted."""
  return sorted(what.split("'")[1] for _, what in saved if what.startswith('named'))


def test_minimal_remat_keeps_the_named_projections_only():
  """What the backward keeps under 'minimal': q/k after RoPE, v, the mixer's output, the MLP's gate and up, each
  block's input; not the MLP's down projection, which only the block's output needs. 'recompute_mlp' keeps the
  same but the MLP's gate and up."""
  saved = _saved_by('swa128', 'minimal')
  assert _names(saved) == sorted(['query_proj', 'key_proj', 'value_proj', 'out_proj', 'mlpwi_0', 'mlpwi_1'] * 2)
  assert not any('mlpwo' in what for _, what in saved)
  saved = _saved_by('swa128', 'recompute_mlp')
  assert _names(saved) == sorted(['query_proj', 'key_proj', 'value_proj', 'out_proj'] * 2)
  assert not any('mlpw' in what for _, what in saved)
  cfg = small_config('swa128', num_layers=2, remat='minimal', dtype='float32').model
  model_def, params = state_lib.init_model(cfg, 0)
  # Named after RoPE: what is named 'query_proj' comes from RoPE's arithmetic, not straight from the projection.
  sources = _named_sources(jax.make_jaxpr(lambda p: model_def.bind(p)(jnp.zeros((1, 16), jnp.int32)))(params).jaxpr,
                           'query_proj')
  assert sources and 'dot_general' not in sources, sources


def _named_sources(jaxpr, name):
  """The primitives that make the values named `name` (through reshapes), in `jaxpr` and every jaxpr inside it."""
  from jax._src import core  # pylint: disable=g-import-not-at-top
  producer = {v: eqn for eqn in jaxpr.eqns for v in eqn.outvars}
  found = set()
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'name' and eqn.params.get('name') == name:
      source = producer.get(eqn.invars[0])
      while source is not None and source.primitive.name == 'reshape':
        source = producer.get(source.invars[0])
      found.add(source.primitive.name if source is not None else 'input')
    for sub in core.jaxprs_in_params(eqn.params):
      found |= _named_sources(sub, name)
  return found


@pytest.mark.parametrize('remat', ['save_dots', 'minimal', 'recompute_mlp'])
@pytest.mark.parametrize('arch', ['swa128', 'lightning', 'mamba2', 'gdn'])
def test_kept_projections_are_flat_not_per_head(arch, remat):
  """What remat keeps of a per-head projection is [B, T, heads*head_dim], never [B, T, heads, head_dim]: a TPU pads
  a kept tensor's minor dimension to 128 lanes, so head_dim 64 kept per head would hold twice its bytes."""
  cfg = small_config(arch, num_layers=2, remat=remat, dtype='float32').model
  kept = [(shape, what) for shape, what in _saved_by(arch, remat) if 'from the argument' not in what]
  assert any(len(shape) == 3 and shape[-1] == cfg.num_heads * cfg.head_dim for shape, _ in kept), kept
  per_head = [(shape, what) for shape, what in kept if len(shape) == 4 and shape[-1] == cfg.head_dim]
  assert not per_head, per_head


def test_each_block_is_its_own_remat_unit():
  """The backward recomputes one block at a time: in a scanned cycle of [SWA, SWA, SWA, full] each block is its
  own checkpoint, so a long pattern holds one layer's recomputed activations at once, not the whole cycle's
  (a checkpoint around the cycle made the 1:3 hybrid's TPU peak grow with the cycle length)."""
  cfg = small_config('swa128_1to3', num_layers=8, scan_layers=True, remat='save_dots').model
  model = HybridLM(cfg, rngs=nnx.Rngs(0))
  jaxpr = jax.make_jaxpr(lambda m, t: m(t))(model, jnp.zeros((1, 16), jnp.int32))
  [scan] = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == 'scan']
  units = [e for e in scan.params['jaxpr'].jaxpr.eqns if e.primitive.name == 'remat2']
  assert len(units) == len(cfg.cycle) == 4
  assert all(not any(inner.primitive.name == 'remat2' for inner in e.params['jaxpr'].eqns) for e in units)


def test_scanned_params_carry_the_layers_axis():
  cfg = small_config('swa128', num_layers=4, scan_layers=True).model
  model = HybridLM(cfg, rngs=nnx.Rngs(0))
  axes = model.cycles.blocks[0].mixer.wq.get_metadata()['logical_axes']
  assert axes == ('layers', 'embed', 'heads', 'head_dim')


# small_config sets window=16 for every arch, so swa512 / swa2048 repeat swa128 here: the e2e tier's.
@pytest.mark.parametrize('arch', default_tier(ARCHES, keep=set(ARCHES) - {'swa512', 'swa2048'}))
def test_causal(arch):
  cfg = small_config(arch).model
  _, params = state_lib.init_model(cfg, 0)
  tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (1, 40))
  changed = tokens.copy()
  changed[0, 30:] = (changed[0, 30:] + 1) % cfg.vocab_size
  a, b = _logits(cfg, params, jnp.asarray(np.concatenate([tokens, changed])))  # One compile for both.
  np.testing.assert_array_equal(a[:30], b[:30])
  assert np.abs(a[30:] - b[30:]).max() > 1e-4


def test_sliding_window_bounds_the_receptive_field():
  """A stack of L SWA layers with window w sees exactly L*(w-1) tokens back, no more."""
  cfg = small_config('swa128', cycle=('swa',), num_layers=2, window=5).model
  _, params = state_lib.init_model(cfg, 0)
  tokens = np.random.default_rng(2).integers(0, cfg.vocab_size, (1, 30))
  reach = cfg.num_layers * (cfg.window - 1)  # 8
  query = 29
  far, near = tokens.copy(), tokens.copy()
  far[0, query - reach - 1] += 1  # Just outside the receptive field: no effect.
  near[0, query - reach] += 1  # Just inside: changes the logits.
  base, far_out, near_out = _logits(cfg, params, jnp.asarray(np.concatenate([tokens, far, near])))[:, query]
  np.testing.assert_array_equal(base, far_out)
  assert np.abs(base - near_out).max() > 1e-6


def test_headwise_with_a_window_covering_everything_is_full_attention():
  headwise = small_config('swa128_headwise', window=64).model
  full = small_config('full').model
  _, params = state_lib.init_model(headwise, 0)
  tokens = jnp.asarray(np.random.default_rng(3).integers(0, headwise.vocab_size, (2, 20)))
  np.testing.assert_allclose(_logits(headwise, params, tokens), _logits(full, params, tokens), atol=1e-5)
  narrow = small_config('swa128_headwise', window=2).model
  assert np.abs(_logits(narrow, params, tokens) - _logits(full, params, tokens)).max() > 1e-4


def test_nope_full_layers_ignore_position_but_rope_layers_do_not():
  """With NoPE everywhere and one layer, the last position's output is invariant to permuting earlier tokens."""
  cfg = small_config('full', num_layers=1, rope_full=False).model
  _, params = state_lib.init_model(cfg, 0)
  tokens = np.random.default_rng(4).integers(0, cfg.vocab_size, (1, 12))
  permuted = tokens.copy()
  permuted[0, :11] = tokens[0, :11][::-1]
  both = jnp.asarray(np.concatenate([tokens, permuted]))
  a, b = _logits(cfg, params, both)[:, -1]
  np.testing.assert_allclose(a, b, atol=1e-5)
  rope_cfg = small_config('full', num_layers=1, rope_full=True).model
  c, d = _logits(rope_cfg, params, both)[:, -1]
  assert np.abs(c - d).max() > 1e-4


def test_bfloat16_compute_keeps_float32_masters():
  cfg = small_config('swa128', dtype='bfloat16').model
  model_def, params = state_lib.init_model(cfg, 0)
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype('float32')}
  logits = model_def.bind(params)(jnp.zeros((1, 8), jnp.int32))
  assert logits.dtype == jnp.bfloat16


def _random_sinks(params, seed=1):
  """Params with the learned sinks drawn N(0.5, 1), one head per layer at -inf (no sink)."""
  rng = np.random.default_rng(seed)

  def draw(path, a):
    if getattr(path[-1], 'key', None) != 'sinks':
      return a
    values = rng.normal(0.5, 1.0, a.shape).astype(np.float32)
    values[..., 1] = -np.inf
    return jnp.asarray(values)

  return jax.tree_util.tree_map_with_path(draw, params)


def test_learned_sinks_are_one_more_zero_value_logit_per_head():
  """A head-wise layer (SWA and full heads, sinks sliced per head) with learned sinks equals dense softmax attention
  over [scaled logits, sink] with the sink's value zero (computed here, independently of the layer's
  o·sigmoid(lse − sink) form), in value and in the gradients of the sinks and the projections; a -inf sink is no
  sink."""
  from hybrid_jax.models.mixers.attention import Attention  # pylint: disable=g-import-not-at-top
  arch = 'swa128_headwise'
  cfg = small_config(arch, window=5, attention_sinks=True, attention_scale=0.4, dtype='float32').model
  spec = pattern.layer_spec(cfg, 0)
  graphdef, state = nnx.split(Attention(cfg, spec, rngs=nnx.Rngs(0)))
  state = nnx.to_pure_dict(state)
  state = {**state, 'sinks': _random_sinks({'sinks': state['sinks']})['sinks']}
  x = jnp.asarray(np.random.default_rng(2).normal(size=(2, 13, cfg.d_model)), jnp.float32)
  positions = jnp.arange(13)
  groups = cfg.num_heads // cfg.num_kv_heads
  full_heads = cfg.headwise_full_kv_heads * groups if spec.kind == 'headwise' else 0
  windows = np.asarray([5] * (cfg.num_heads - full_heads) + [13] * full_heads)  # Per query head.

  def layer(state):
    module = nnx.merge(graphdef, nnx.State(state))
    return module(x, positions)

  def reference(state):
    module = nnx.merge(graphdef, nnx.State(state))
    q, k, v = module.qkv(x, positions)
    k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    logits = jnp.einsum('bihd,bjhd->bhij', q, k) * 0.4
    i, j = np.arange(13)[:, None], np.arange(13)[None, :]
    visible = (j <= i) & (j > i - windows[:, None, None])  # [H, T, T]
    logits = jnp.where(visible[None], logits, -jnp.inf)
    sink = jnp.broadcast_to(state['sinks'][None, :, None, None], logits.shape[:3] + (1,))
    p = jax.nn.softmax(jnp.concatenate([logits, sink], axis=-1), axis=-1)[..., :-1]
    return module.out(jnp.einsum('bhij,bjhd->bihd', p, v))

  cotangent = jnp.asarray(np.random.default_rng(3).normal(size=(2, 13, cfg.d_model)), jnp.float32)
  loss = lambda fn: lambda s: jnp.sum(fn(s) * cotangent)
  got, want = jax.jit(layer)(state), jax.jit(reference)(state)
  assert float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want)) <= 1e-5
  grads, ref_grads = jax.jit(jax.grad(loss(layer)))(state), jax.jit(jax.grad(loss(reference)))(state)
  for key in ('sinks', 'wq', 'wk', 'wv'):
    g, r = grads[key], ref_grads[key]
    assert np.isfinite(np.asarray(g)).all(), key
    assert float(jnp.linalg.norm(g - r) / jnp.linalg.norm(r)) <= 1e-5, key
  assert float(grads['sinks'][1]) == 0.0  # The -inf head: no sink, no gradient.
  plain = small_config(arch, window=5, attention_scale=0.4, dtype='float32').model
  plain_def, _ = nnx.split(Attention(plain, spec, rngs=nnx.Rngs(0)))
  plain_state = {k: v for k, v in state.items() if k != 'sinks'}
  plain_out = jax.jit(lambda s: nnx.merge(plain_def, nnx.State(s))(x, positions))(plain_state)
  assert float(jnp.abs(plain_out - got).max()) > 1e-3
