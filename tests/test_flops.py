"""Model FLOP counts (hybrid_jax.models.flops) against hand arithmetic, the real modules' weights, and XLA's own
count of jitted pieces (`cost_analysis()['flops']`).

XLA counts every elementwise op too (softmax, exp of decays, masks), so pieces agree with the matmul-only model
within a few percent, not exactly; each tolerance below says what it covers. XLA counts a loop body once whatever
the trip count, which the delta-rule check accounts for explicitly.
"""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from hybrid_jax.kernels import attention, gated_delta_rule, linear_scan
from hybrid_jax.kernels.attention import reference as attention_reference
from hybrid_jax.models import flops, pattern
from hybrid_jax.models.layers import SwiGLU
from hybrid_jax.models.mixers import make_mixer
from tests.conftest import study_config


def xla_flops(fn, *args):
  cost = jax.jit(fn).lower(*args).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return cost['flops']


def hand_config():
  """d 8, 2 query heads / 1 KV head of width 4, SwiGLU 16, vocab 10, [SWA(w=2), full]."""
  c = study_config('swa128', 'tiny').model
  c.update(dict(d_model=8, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4, d_ff=16, vocab_size=10,
                window=2))
  return c


def test_hand_checked_small_model():
  # T = 4. Pairs: full 1+2+3+4 = 10; window 2: 1+2+2+2 = 7.
  # Attention weights q 8*2*4 + k 8*4 + v 8*4 + o 2*4*8 = 192 -> 384 FLOPs/token -> 1536 per sequence.
  # Cores: SWA 4*2*4*7 = 224, full 4*2*4*10 = 320. MLP 3*8*16 = 384 weights -> 3072 per sequence.
  # LM head 8*10 -> 640 per sequence. Total 1536+224+3072 + 1536+320+3072 + 640 = 10400 = 2600 per token.
  f = flops.model_flops(hand_config(), 4)
  swa, full = f['layers']
  assert (swa['kind'], swa['projections'], swa['core'], swa['mlp'], swa['total']) == ('swa', 1536, 224, 3072, 4832)
  assert (full['kind'], full['core'], full['total']) == ('full', 320, 4928)
  assert f['lm_head'] == 640 and f['embedding'] == 0
  assert f['forward_per_sequence'] == 10400 and f['forward_per_token'] == 2600
  assert f['training_per_token'] == 3 * 2600
  assert f['by_kind']['swa']['layers'] == 1 and f['by_kind']['lm_head']['forward'] == 640
  assert sum(e['share'] for e in f['by_kind'].values()) == pytest.approx(1.0)


def test_hand_checked_chunk_models():
  # T = 5, C = 2: chunks 2, 2, 1 -> sum c^2 = 9, sum c^3 = 17. K = 2, V = 3, one head.
  # Scalar scan: QK^T 2*9*2 = 36, PV 2*9*3 = 54, dS + inter 4*5*2*3 = 120 -> 210.
  assert flops.scalar_scan_flops(5, 2, 1, 2, 1, 3) == 210
  # Delta rule: 6*9*2 + 4*9*3 + 6*5*2*3 + 17/3.
  assert flops.delta_rule_flops(5, 2, 1, 2, 3) == pytest.approx(108 + 108 + 180 + 17 / 3)
  # docs/KERNELS.md, "FLOP model": K = V = 128, C = 64, whole chunks: 2C(K+V) + 4KV = 98,304 per token and head.
  assert flops.scalar_scan_flops(64 * 10, 64, 1, 128, 1, 128) == 640 * 98_304


@pytest.mark.parametrize('t', [1, 5, 63, 64, 75, 500])
@pytest.mark.parametrize('window', [None, 1, 16, 64, 100, 10_000])
def test_visible_pairs_match_the_reference_mask(t, window):
  assert flops.visible_pairs(t, window) == int(jnp.sum(attention_reference.visible(t, window=window)))


def test_bad_inputs_fail_clearly():
  with pytest.raises(ValueError, match='window'):
    flops.visible_pairs(8, 0)
  with pytest.raises(ValueError, match='seq_len'):
    flops.model_flops(hand_config(), 0)
  with pytest.raises(ValueError, match='chunk'):
    flops.scalar_scan_flops(8, 0, 1, 2, 1, 2)


def _weights(module):
  """(dense projection weights, depthwise conv weights) of a mixer, read from its real parameters."""
  dense = conv = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(module, nnx.Param)):
    name = str(path[0].key if hasattr(path[0], 'key') else path[0])
    if name.startswith('conv'):
      conv += leaf.size
    elif leaf.ndim >= 2 and name != 'norm':  # Mamba-2's per-head norm scale is [H, P] but no projection.
      dense += leaf.size
  return dense, conv


@pytest.mark.parametrize('arch', ['full', 'swa128', 'swa128_headwise', 'lightning', 'mamba2', 'gdn'])
def test_projection_flops_are_twice_the_real_weights(arch):
  cfg = study_config(arch, 'tiny').model
  t = 96
  for i in range(len(tuple(cfg.cycle))):
    spec = pattern.layer_spec(cfg, i)
    dense, conv = _weights(make_mixer(cfg, spec, rngs=nnx.Rngs(0)))
    layer = flops.layer_flops(cfg, spec, t)
    assert layer['projections'] == 2 * t * dense, spec.kind
    assert layer['conv'] == 2 * t * conv, spec.kind
    assert layer['mlp'] == 2 * t * 3 * cfg.d_model * cfg.d_ff


def test_headwise_core_splits_heads_between_window_and_full():
  cfg = study_config('swa128_headwise', 'tiny').model  # 4 query heads over 2 KV heads; 1 KV group full.
  spec = pattern.layer_spec(cfg, 0)
  t = 512
  expected = flops.attention_core_flops(t, 2, 32, 128) + flops.attention_core_flops(t, 2, 32, None)
  assert flops.layer_flops(cfg, spec, t)['core'] == expected


def test_mlp_and_lm_head_match_xla():
  """Lone SwiGLU and LM head: matmuls dominate; XLA adds SiLU and the product (< 1% at d_ff = 320)."""
  b, t, d, ff, vocab = 2, 64, 128, 320, 257
  mlp = SwiGLU(d, ff, std=0.02, out_std=0.02, param_dtype=jnp.float32, dtype=jnp.float32, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(mlp)
  x = jnp.ones((b, t, d))
  fwd = lambda s, x: nnx.merge(graphdef, s)(x)
  model = 2 * b * t * 3 * d * ff
  assert xla_flops(fwd, state, x) == pytest.approx(model, rel=0.01)
  # Training = 3 x forward: XLA's count of forward + gradients w.r.t. weights and input.
  # value_and_grad keeps the forward's last matmul alive (grad alone lets XLA drop it as dead code).
  grad = jax.value_and_grad(lambda s, x, dy: jnp.sum(fwd(s, x) * dy), argnums=(0, 1))
  dy = jax.random.normal(jax.random.key(0), (b, t, d))
  assert xla_flops(grad, state, x, dy) == pytest.approx(flops.TRAIN_MULTIPLIER * model, rel=0.03)
  w = jnp.ones((d, vocab))
  assert xla_flops(lambda h, w: h @ w, x, w) == pytest.approx(2 * b * t * d * vocab, rel=1e-6)


@pytest.mark.parametrize('window', [None, 16])
def test_attention_per_pair_cost_matches_xla(window):
  """The dense reference computes all T^2 pairs whatever the window: XLA's count over T^2 pairs gives the per-pair
  cost 4 * heads * head_dim (softmax adds ~2.5% at head_dim 64); the model then charges only visible pairs."""
  b, t, hq, hkv, d = 2, 256, 4, 2, 64
  ks = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(ks[0], (b, t, hq, d))
  k, v = (jax.random.normal(key, (b, t, hkv, d)) for key in ks[1:])
  fn = lambda q, k, v: attention(q, k, v, window=window, implementation='reference')
  per_pair = xla_flops(fn, q, k, v) / (b * t * t)
  assert per_pair == pytest.approx(4 * hq * d, rel=0.04)
  assert flops.attention_core_flops(t, hq, d, window) == 4 * hq * d * flops.visible_pairs(t, window)


@pytest.mark.parametrize('key_heads', [2, 1])  # 1: Mamba-2-style, one key head shared by the value heads.
def test_scalar_scan_matches_xla(key_heads):
  """The chunked XLA path: every chunk matmul is batched outside the loop, so XLA sees all of them; the decay
  masks, segment sums and exps add about 5% at K = V = 64, C = 64."""
  b, t, h, kd, vd, c = 2, 256, 2, 64, 64, 64
  ks = jax.random.split(jax.random.key(1), 3)
  q = jax.random.normal(ks[0], (b, t, key_heads, kd))
  k = jax.random.normal(ks[1], (b, t, key_heads, kd))
  v = jax.random.normal(ks[2], (b, t, h, vd))
  g = -0.1 * jnp.ones((b, t, h))
  fn = lambda q, k, v, g: linear_scan(q, k, v, g, chunk_size=c, implementation='xla')
  model = b * flops.scalar_scan_flops(t, c, key_heads, kd, h, vd)
  assert xla_flops(fn, q, k, v, g) == pytest.approx(model, rel=0.07)


def test_delta_rule_matches_xla_on_one_chunk():
  """One chunk (T = C), so the sequential scan's body runs once and XLA's count covers it. The XLA path inverts
  (I + L) by C row steps in a fori_loop that XLA counts once (2 C^2 per head) where the model charges C^3 / 3."""
  b, h, kd, vd, c = 2, 2, 64, 64, 64
  ks = jax.random.split(jax.random.key(2), 3)
  q = jax.random.normal(ks[0], (b, c, h, kd))
  k = jax.random.normal(ks[1], (b, c, h, kd))
  k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
  v = jax.random.normal(ks[2], (b, c, h, vd))
  g, beta = -0.1 * jnp.ones((b, c, h)), 0.5 * jnp.ones((b, c, h))
  fn = lambda *xs: gated_delta_rule(*xs, chunk_size=c, implementation='xla')
  expected = b * (flops.delta_rule_flops(c, c, h, kd, vd) - h * c**3 / 3 + h * 2 * c**2)
  assert xla_flops(fn, q, k, v, g, beta) == pytest.approx(expected, rel=0.05)


def test_window_and_chunk_awareness_at_study_scale():
  """At 16K context an SWA-128 layer's core costs ~1/64 of a full layer's; a GDN layer's core is linear in T."""
  cfg = study_config('swa128', 's4').model
  t = 16_384
  swa = flops.layer_flops(cfg, pattern.layer_spec(cfg, 0), t)['core']
  full = flops.layer_flops(cfg, pattern.layer_spec(cfg, 1), t)['core']
  assert full / swa == pytest.approx(flops.visible_pairs(t, None) / flops.visible_pairs(t, 128))
  assert 60 < full / swa < 65
  gdn = study_config('gdn', 's4').model
  core = lambda t: flops.layer_flops(gdn, pattern.layer_spec(gdn, 0), t)['core']
  assert core(2 * t) == pytest.approx(2 * core(t))
  # The whole S4 SWA hybrid does ~0.71x the all-full model's FLOPs per token (half its layers lose their T^2 part;
  # MLPs, projections and the LM head are shared).
  ratio = flops.training_flops_per_token(cfg, t) / flops.training_flops_per_token(study_config('full', 's4').model, t)
  assert 0.65 < ratio < 0.75


def test_breakdown_markdown_lists_every_kind():
  text = flops.breakdown_markdown(study_config('gdn', 'tiny').model, 512)
  for kind in ('gdn', 'full', 'lm_head'):
    assert f'| {kind} |' in text
