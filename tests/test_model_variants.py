"""The model options of released hybrids (partial RoPE, q/k norms, output gate, post-norm blocks, Mamba-2 groups /
conv bias / grouped norm / dt floor, GDN value heads / negative eigenvalues / norm epsilon, ReLU^2 MLP layers) against
float64 numpy references written here, one loop over time steps and heads each, independent of the code under test.

Every option also keeps the parameter count formula exact and decoding (prefill, then one step per token) equal to
the full forward; every option at its default leaves the parameter tree of the study's models as it was.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_jax import kernels
from hybrid_jax.config import BASE_CONFIG, load_config_file, validate
from hybrid_jax.errors import ConfigError
from hybrid_jax.models import counting, layers, pattern
from hybrid_jax.models.mixers.attention import Attention
from hybrid_jax.models.mixers.gated_deltanet import GatedDeltaNet
from hybrid_jax.models.mixers.mamba2 import Mamba2
from hybrid_jax.models.model import HybridLM

TINY = dict(dtype='float32', vocab_size=64, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8, d_ff=48, window=6,
            num_layers=2, recurrent_chunk_size=8)
SECTIONS = dict(mamba2=dict(num_heads=4, head_dim=4, state_dim=4), gdn=dict(num_heads=2, key_dim=8, value_dim=4))


def config(**overrides):
  """The base config at tiny float32 shapes, with dotted model overrides ('attention.qk_norm': 'head')."""
  c = load_config_file(str(BASE_CONFIG))
  c.model.update(TINY)
  for section, values in SECTIONS.items():
    c.model[section].update(values)
  for key, value in overrides.items():
    node = c.model
    *parents, last = key.split('.')
    for name in parents:
      node = node[name]
    node[last] = value
  return c


def model_cfg(**overrides):
  return validate(config(**overrides)).model


def rel(got, want):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def params_of(module) -> dict:
  """'path.to.param' -> its nnx.Param."""
  return {'.'.join(map(str, path)): var for path, var in nnx.iter_graph(module) if isinstance(var, nnx.Param)}


def randomize(module, seed):
  """Non-trivial values for every parameter (norm scales around 1, biases non-zero, moderate decays); returns them
  as float64 numpy arrays by path."""
  rng = np.random.default_rng(seed)
  out = {}
  for name, var in params_of(module).items():
    leaf, shape = name.split('.')[-1], var.get_value().shape
    n = rng.standard_normal(shape)
    if leaf in ('scale', 'norm', 'q_norm', 'k_norm'):
      value = 1.0 + 0.3 * n
    elif leaf == 'A_log':
      value = np.log(rng.uniform(0.5, 2.0, shape))
    elif leaf in ('dt_bias', 'sinks') or leaf.startswith('conv_bias'):
      value = 0.5 * n
    elif leaf == 'D':
      value = n
    elif leaf.startswith('conv_'):
      value = 0.5 * n
    else:  # Matrices: about unit-scale outputs for unit-scale inputs of width 16-32.
      value = 0.25 * n
    var.set_value(jnp.asarray(value, var.get_value().dtype))
    out[name] = np.asarray(var.get_value(), np.float64)
  return out


# ------------------------------------------------------------------------------------------- numpy references
def np_silu(x):
  return x / (1.0 + np.exp(-x))


def np_sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def np_softplus(x):
  return np.log1p(np.exp(x))


def np_rms(x, scale, eps):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def np_rope(x, positions, base, dims):
  """x [B, T, H, D] float64, positions [T] or [B, T]: channels i and i + dims/2 (i < dims/2) rotate by angle
  position * base**(-2i/dims); channels from dims on pass through (dims 0: the whole head)."""
  b, t, h, d = x.shape
  dims = dims or d
  half = dims // 2
  positions = np.broadcast_to(np.asarray(positions, np.float64), (b, t))
  out = np.array(x, np.float64)
  for bi in range(b):
    for ti in range(t):
      for i in range(half):
        angle = positions[bi, ti] * base ** (-2.0 * i / dims)
        c, s = np.cos(angle), np.sin(angle)
        a, e = x[bi, ti, :, i], x[bi, ti, :, i + half]
        out[bi, ti, :, i] = a * c - e * s
        out[bi, ti, :, i + half] = e * c + a * s
  return out


def np_attention(x, p, *, qk_norm='none', output_gate=False, rope=True, rope_dims=0, base=10000.0, eps=1e-5,
                 window=None):
  """Causal (optionally windowed) GQA softmax attention of x [B, T, d]: query head i reads kv head i // (Hq/Hkv)."""
  b, t, _ = x.shape
  q = np.einsum('btd,dhk->bthk', x, p['wq'])
  k = np.einsum('btd,dhk->bthk', x, p['wk'])
  v = np.einsum('btd,dhk->bthk', x, p['wv'])
  hq, hd = q.shape[2:]
  hkv = k.shape[2]
  if qk_norm == 'head':
    q, k = np_rms(q, p['q_norm'], eps), np_rms(k, p['k_norm'], eps)
  elif qk_norm == 'all':
    q = np_rms(q.reshape(b, t, hq * hd), p['q_norm'].reshape(-1), eps).reshape(q.shape)
    k = np_rms(k.reshape(b, t, hkv * hd), p['k_norm'].reshape(-1), eps).reshape(k.shape)
  if rope:
    positions = np.arange(t)
    q, k = np_rope(q, positions, base, rope_dims), np_rope(k, positions, base, rope_dims)
  o = np.zeros_like(q)
  for bi in range(b):
    for i in range(hq):
      kv = i // (hq // hkv)
      for ti in range(t):
        lo = 0 if window is None else max(0, ti - window + 1)
        logits = np.array([q[bi, ti, i] @ k[bi, s, kv] for s in range(lo, ti + 1)]) * hd ** -0.5
        w = np.exp(logits - logits.max())
        w /= w.sum()
        o[bi, ti, i] = w @ v[bi, lo:ti + 1, kv]
  if output_gate:
    o = o * np_sigmoid(np.einsum('btd,dhk->bthk', x, p['wgate']))
  return np.einsum('bthk,hkd->btd', o, p['wo'])


def np_conv_silu(x, w, bias=None):
  """SiLU of the causal depthwise conv of x [B, T, C] with w [W, C]: y[t] = sum_i w[i] x[t - W + 1 + i] (+ bias)."""
  width, t = w.shape[0], x.shape[1]
  y = np.zeros_like(x)
  for ti in range(t):
    for i in range(width):
      s = ti - width + 1 + i
      if s >= 0:
        y[:, ti] += w[i] * x[:, s]
  if bias is not None:
    y = y + bias
  return np_silu(y)


def np_mamba2(x, p, *, num_groups, norm_by_group, dt_floor, eps):
  b, t, _ = x.shape
  h, hp = p['in_x'].shape[1:]
  gn = p['in_b'].shape[1]
  n = gn // num_groups
  width = p['conv_x'].shape[0]
  z = np.einsum('btd,dhp->bthp', x, p['in_z'])
  xbc = np.concatenate([np.einsum('btd,dhp->bthp', x, p['in_x']).reshape(b, t, h * hp), x @ p['in_b'],
                        x @ p['in_c']], axis=-1)
  w = np.concatenate([p['conv_x'].reshape(width, h * hp), p['conv_b'], p['conv_c']], axis=-1)
  bias = (np.concatenate([p['conv_bias_x'].reshape(-1), p['conv_bias_b'], p['conv_bias_c']])
          if 'conv_bias_x' in p else None)
  xbc = np_conv_silu(xbc, w, bias)
  xs = xbc[..., :h * hp].reshape(b, t, h, hp)
  bs = xbc[..., h * hp:h * hp + gn].reshape(b, t, num_groups, n)
  cs = xbc[..., h * hp + gn:].reshape(b, t, num_groups, n)
  raw_dt = np_softplus(x @ p['in_dt'] + p['dt_bias'])
  dt = np.maximum(raw_dt, dt_floor)
  a = -np.exp(p['A_log'])
  y = np.zeros((b, t, h, hp))
  state = np.zeros((b, h, n, hp))
  for ti in range(t):
    for hi in range(h):
      g = hi // (h // num_groups)
      for bi in range(b):
        state[bi, hi] = (np.exp(dt[bi, ti, hi] * a[hi]) * state[bi, hi]
                         + dt[bi, ti, hi] * np.outer(bs[bi, ti, g], xs[bi, ti, hi]))
        y[bi, ti, hi] = cs[bi, ti, g] @ state[bi, hi] + p['D'][hi] * xs[bi, ti, hi]
  y = y * np_silu(z)
  norm_groups = num_groups if norm_by_group else 1
  per = h // norm_groups
  normed = np.zeros_like(y)
  for g in range(norm_groups):
    heads = slice(g * per, (g + 1) * per)
    flat = y[:, :, heads].reshape(b, t, per * hp)
    normed[:, :, heads] = np_rms(flat, p['norm'][heads].reshape(-1), eps).reshape(b, t, per, hp)
  return np.einsum('bthp,hpd->btd', normed, p['out']), raw_dt


def np_l2(x, eps=1e-6):
  return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def np_delta_rule(q, k, v, g, beta, scale, s0=None):
  """Sequential gated delta rule, value head j on key head j // (Hv/Hk): S = exp(g) S; S += k (beta (v - S^T k))^T;
  o = scale * S^T q."""
  b, t, hk, dk = q.shape
  hv, dv = v.shape[2:]
  s = np.zeros((b, hv, dk, dv)) if s0 is None else np.array(s0, np.float64)
  o = np.zeros((b, t, hv, dv))
  for ti in range(t):
    for j in range(hv):
      i = j // (hv // hk)
      for bi in range(b):
        s[bi, j] *= np.exp(g[bi, ti, j])
        kk = k[bi, ti, i]
        u = beta[bi, ti, j] * (v[bi, ti, j] - s[bi, j].T @ kk)
        s[bi, j] += np.outer(kk, u)
        o[bi, ti, j] = scale * (s[bi, j].T @ q[bi, ti, i])
  return o, s


def np_gdn(x, p, *, neg_eigval, norm_eps):
  b, t, _ = x.shape
  h, dk = p['wq'].shape[1:]
  hv, dv = p['wv'].shape[1:]
  width = p['conv_q'].shape[0]

  def branch(w, conv):
    flat = np.einsum('btd,dhk->bthk', x, w).reshape(b, t, -1)
    return np_conv_silu(flat, conv.reshape(width, -1)).reshape(b, t, *w.shape[1:])

  q = np_l2(branch(p['wq'], p['conv_q']))
  k = np_l2(branch(p['wk'], p['conv_k']))
  v = branch(p['wv'], p['conv_v'])
  beta = (2.0 if neg_eigval else 1.0) * np_sigmoid(x @ p['w_beta'])
  g = -np.exp(p['A_log']) * np_softplus(x @ p['w_a'] + p['dt_bias'])
  o, _ = np_delta_rule(q, k, v, g, beta, dk ** -0.5)
  gate = np_silu(np.einsum('btd,dhk->bthk', x, p['wg']))
  o = np_rms(o, p['norm'], norm_eps) * gate
  return np.einsum('bthk,hkd->btd', o, p['wo']), beta


def np_swiglu(x, p):
  return (np_silu(x @ p['gate']) * (x @ p['up'])) @ p['down']


def np_relu2(x, p):
  return np.maximum(x @ p['up'], 0.0) ** 2 @ p['down']


def sub(p, prefix):
  """The parameters under `prefix.`, keyed by the rest of their path."""
  return {name[len(prefix) + 1:]: value for name, value in p.items() if name.startswith(prefix + '.')}


# At these settings tiny programs compile in about half the time and run hardly slower.
FAST_COMPILE = dict(xla_backend_optimization_level=0, xla_llvm_disable_expensive_passes=True)


def compiled(fn, *args):
  return jax.jit(fn).lower(*args).compile(FAST_COMPILE)


def build(cls, *args, seed):
  """cls(*args) with the random parameters of `randomize` (built abstractly: eager init compiles per shape),
  and those parameters as float64 numpy arrays."""
  module = nnx.eval_shape(lambda: cls(*args, rngs=nnx.Rngs(0)))
  return module, randomize(module, seed)


def run_mixer(mixer, x, positions):
  graphdef, state = nnx.split(mixer)
  x = jnp.asarray(x, jnp.float32)
  return np.asarray(compiled(lambda s, x: nnx.merge(graphdef, s)(x, positions), state, x)(state, x))


def run_model(model, tokens):
  graphdef, state = nnx.split(model)
  tokens = jnp.asarray(tokens)
  return np.asarray(compiled(lambda s, t: nnx.merge(graphdef, s)(t), state, tokens)(state, tokens))


def inputs(seed, shape):
  return np.asarray(np.random.default_rng(seed).standard_normal(shape), np.float32).astype(np.float64)


# ------------------------------------------------------------------------------------------- 1. partial RoPE
@pytest.mark.parametrize('positions_shape', ['[T]', '[B,T]'])
def test_partial_rope(positions_shape):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 5, 3, 8)).astype(np.float32)
  positions = np.arange(5) + 3 if positions_shape == '[T]' else rng.integers(0, 50, (2, 5))
  base = 500.0
  got = np.asarray(layers.rope(jnp.asarray(x), jnp.asarray(positions, jnp.int32), base=base, dims=4))
  want = np_rope(x.astype(np.float64), positions, base, 4)
  assert rel(got, want) < 1e-6
  np.testing.assert_array_equal(got[..., 4:], x[..., 4:])  # Passed through untouched.
  assert not np.allclose(got[..., :4], x[..., :4])
  full = np.asarray(layers.rope(jnp.asarray(x), jnp.asarray(positions, jnp.int32), base=base, dims=0))
  assert rel(full, np_rope(x.astype(np.float64), positions, base, 8)) < 1e-6
  np.testing.assert_array_equal(full, np.asarray(layers.rope(jnp.asarray(x), jnp.asarray(positions, jnp.int32),
                                                             base=base, dims=8)))


# ------------------------------------------------------------------------------------------- 2. attention variants
ATTENTION_CASES = {
    'qk_head': dict(kind='full', qk_norm='head'),
    'qk_all_gate_partial': dict(kind='full', qk_norm='all', output_gate=True, rope_dims=4),
    'swa_qk_head_gate_partial': dict(kind='swa', qk_norm='head', output_gate=True, rope_dims=6),
    'gate_only': dict(kind='full', output_gate=True),
    'partial_rope_only': dict(kind='full', rope_dims=2),
}


@pytest.mark.parametrize('case', ATTENTION_CASES)
def test_attention_variants(case):
  opts = dict(ATTENTION_CASES[case])
  kind = opts.pop('kind')
  m = model_cfg(cycle=(kind,), norm_eps=1e-3, rope_base=100.0, **{f'attention.{k}': v for k, v in opts.items()})
  spec = pattern.layer_spec(m, 0)
  assert spec.rope
  layer, p = build(Attention, m, spec, seed=2)
  x = inputs(3, (2, 10, m.d_model))
  got = run_mixer(layer, x, jnp.arange(10, dtype=jnp.int32))
  want = np_attention(x, p, rope=True, base=100.0, eps=1e-3, window=spec.window, **opts)
  assert rel(got, want) < 1e-5


# ------------------------------------------------------------------------------------------- 3. Mamba-2
MAMBA_CASES = {
    'groups_bias_groupnorm_floor': dict(num_groups=2, conv_bias=True, norm_by_group=True, dt_floor=0.75),
    'groups_only': dict(num_groups=2),
    'defaults': dict(),
}


@pytest.mark.parametrize('case', MAMBA_CASES)
def test_mamba2_variants(case):
  opts = MAMBA_CASES[case]
  m = model_cfg(cycle=('mamba2',), norm_eps=1e-3, **{f'mamba2.{k}': v for k, v in opts.items()})
  layer, p = build(Mamba2, m, pattern.layer_spec(m, 0), seed=4)
  assert ('conv_bias_x' in p) == bool(opts.get('conv_bias'))
  x = inputs(5, (2, 20, m.d_model))
  got = run_mixer(layer, x, None)
  want, raw_dt = np_mamba2(x, p, num_groups=opts.get('num_groups', 1), norm_by_group=opts.get('norm_by_group', False),
                           dt_floor=opts.get('dt_floor', 0.0), eps=1e-3)
  if opts.get('dt_floor'):
    bound = np.mean(raw_dt < opts['dt_floor'])
    assert 0.1 < bound < 0.9, bound  # The floor binds for some entries, not all.
  assert rel(got, want) < 1e-4


# ------------------------------------------------------------------------------------------- 4. Gated DeltaNet
GDN_CASES = {
    'value_heads_negeig_eps': dict(value_heads=4, neg_eigval=True, norm_eps=0.05),
    'defaults': dict(),  # The gated norm then takes model.norm_eps.
}


@pytest.mark.parametrize('case', GDN_CASES)
def test_gdn_variants(case):
  opts = GDN_CASES[case]
  m = model_cfg(cycle=('gdn',), norm_eps=0.02, **{f'gdn.{k}': v for k, v in opts.items()})
  layer, p = build(GatedDeltaNet, m, pattern.layer_spec(m, 0), seed=6)
  assert p['wv'].shape[1] == opts.get('value_heads', 2)
  x = inputs(7, (2, 20, m.d_model))
  got = run_mixer(layer, x, None)
  want, beta = np_gdn(x, p, neg_eigval=opts.get('neg_eigval', False), norm_eps=opts.get('norm_eps', 0.02))
  if opts.get('neg_eigval'):
    assert (beta > 1.2).mean() > 0.2  # The negative-eigenvalue range is exercised.
  assert rel(got, want) < 1e-4


# ------------------------------------------------------------------------------------------- 5. delta-rule kernel
def delta_inputs(seed=0, b=2, t=40, hk=2, hv=4, dk=8, dv=8):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((b, t, hk, dk))
  k = np_l2(rng.standard_normal((b, t, hk, dk)), 0.0)
  v = rng.standard_normal((b, t, hv, dv))
  g = -rng.uniform(0.0, 0.4, (b, t, hv))
  beta = rng.uniform(1.0, 2.0, (b, t, hv))
  s0 = rng.standard_normal((b, hv, dk, dv))
  return [np.asarray(a, np.float32) for a in (q, k, v, g, beta, s0)]


@pytest.mark.parametrize('impl', ['reference', 'xla', 'pallas_gpu', 'pallas_tpu', 'step'])
def test_delta_rule_beta_above_one_grouped(impl):
  q, k, v, g, beta, s0 = args = delta_inputs()
  want_o, want_s = np_delta_rule(*(a.astype(np.float64) for a in args[:5]), scale=0.8, s0=s0)
  if impl == 'step':
    step = jax.jit(lambda s, *xs: kernels.gated_delta_rule_step(s, *xs, scale=0.8))
    state, outs = jnp.asarray(s0), []
    for t in range(q.shape[1]):
      o, state = step(state, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t])
      outs.append(o)
    o, s = jnp.stack(outs, 1), state
  else:
    fn = lambda q, k, v, g, beta, s0: kernels.gated_delta_rule(q, k, v, g, beta, scale=0.8, initial_state=s0,
                                                                chunk_size=16, implementation=impl)
    o, s = compiled(fn, *args)(*args)
  assert o.shape == want_o.shape and s.shape == want_s.shape
  assert rel(o, want_o) < 2e-5 and rel(s, want_s) < 2e-5, (rel(o, want_o), rel(s, want_s))


def test_delta_rule_beta_range_checked():
  q, k, v, g, beta, s0 = delta_inputs(t=16)
  kernels.gated_delta_rule(q, k, v, g, np.full_like(beta, 2.0), initial_state=s0, implementation='reference')
  with pytest.raises(ValueError, match='beta must be <= 2'):
    kernels.gated_delta_rule(q, k, v, g, np.full_like(beta, 2.01), initial_state=s0, implementation='reference')


# ------------------------------------------------------------------------------------------- 6. block structure
def test_mlp_layers_parameter_tree():
  m = model_cfg(cycle=('mamba2', 'mlp', 'full', 'mlp'), num_layers=4, block_mlp=False, mlp='relu2')
  model = nnx.eval_shape(lambda: HybridLM(m, rngs=nnx.Rngs(0)))
  names = set(params_of(model))
  for i in range(4):
    layer = {n.split('.', 2)[2] for n in names if n.startswith(f'tail.{i}.')}
    assert not any(n.startswith(('mlp.', 'mlp_norm.')) for n in layer), (i, layer)
    assert 'mixer_norm.scale' in layer
    if i % 2:
      assert layer == {'mixer_norm.scale', 'mixer.mlp.up', 'mixer.mlp.down'}, layer
  assert 'tail.0.mixer.in_x' in names and 'tail.2.mixer.wq' in names


def test_block_mlp_false_model_logits():
  """('full', 'mlp') without block MLPs: x + attn(norm x), then x + relu2(norm x), as one numpy model."""
  m = model_cfg(cycle=('full', 'mlp'), num_layers=2, block_mlp=False, mlp='relu2', norm_eps=1e-3)
  model, p = build(HybridLM, m, seed=8)
  tokens = np.random.default_rng(9).integers(0, m.vocab_size, (2, 9))
  got = run_model(model, tokens)
  eps = 1e-3
  x = p['embed'][tokens]
  x = x + np_attention(np_rms(x, p['tail.0.mixer_norm.scale'], eps), sub(p, 'tail.0.mixer'), eps=eps)
  x = x + np_relu2(np_rms(x, p['tail.1.mixer_norm.scale'], eps), sub(p, 'tail.1.mixer.mlp'))
  want = np_rms(x, p['final_norm.scale'], eps) @ p['lm_head']
  assert rel(got, want) < 1e-5


def test_mlp_kind_needs_block_mlp_off():
  with pytest.raises(ConfigError, match=re.escape('config.model.block_mlp=True')):
    validate(config(cycle=('mamba2', 'mlp'), block_mlp=True))


@pytest.mark.parametrize('qk_norm', ['none', 'all'])
def test_post_norm_attention_block(qk_norm):
  """One post-norm attention layer: h = x + norm(attn(x)); h + norm(mlp(h)), through the whole model."""
  m = model_cfg(cycle=('full',), num_layers=1, norm_eps=1e-3, **{'attention.post_norm': True,
                                                                 'attention.qk_norm': qk_norm})
  model, p = build(HybridLM, m, seed=10)
  tokens = np.random.default_rng(11).integers(0, m.vocab_size, (2, 9))
  got = run_model(model, tokens)
  eps = 1e-3
  x = p['embed'][tokens]
  x = x + np_rms(np_attention(x, sub(p, 'tail.0.mixer'), qk_norm=qk_norm, eps=eps), p['tail.0.mixer_norm.scale'], eps)
  x = x + np_rms(np_swiglu(x, sub(p, 'tail.0.mlp')), p['tail.0.mlp_norm.scale'], eps)
  want = np_rms(x, p['final_norm.scale'], eps) @ p['lm_head']
  assert rel(got, want) < 1e-5


def test_post_norm_only_on_attention_blocks():
  m = model_cfg(cycle=('gdn', 'full', 'mamba2', 'swa'), num_layers=4, **{'attention.post_norm': True})
  model = nnx.eval_shape(lambda: HybridLM(m, rngs=nnx.Rngs(0)))
  assert [block.post_norm for block in model.tail] == [False, True, False, True]


# ------------------------------------------------------------------------------------------- 7. counts and decoding
ATTN_ALL = {'attention.qk_norm': 'head', 'attention.output_gate': True, 'attention.rope_dims': 4}
GDN_ALL = {'gdn.value_heads': 4, 'gdn.neg_eigval': True, 'gdn.norm_eps': 0.05}
MAMBA_ALL = {'mamba2.num_groups': 2, 'mamba2.conv_bias': True, 'mamba2.norm_by_group': True, 'mamba2.dt_floor': 0.5}
NEMOTRON = dict(cycle=('mamba2', 'mlp', 'full', 'mlp'), num_layers=4, block_mlp=False, mlp='relu2')
COUNT_CASES = {
    'defaults': dict(),
    'attention_head_gate_partial': dict(cycle=('swa', 'full'), **ATTN_ALL),
    'attention_all_post': {'cycle': ('gdn', 'full'), 'attention.qk_norm': 'all', 'attention.post_norm': True},
    'attention_sinks_gate': {'attention_sinks': True, 'attention.output_gate': True},
    'gdn': dict(cycle=('gdn', 'full'), **GDN_ALL),
    'mamba2': dict(cycle=('mamba2', 'full'), **MAMBA_ALL),
    'relu2_block_mlp': dict(cycle=('gdn', 'full'), mlp='relu2'),
    'nemotron': NEMOTRON,
    'scan_mlp_layers': dict(NEMOTRON, num_layers=9, scan_layers=True, **MAMBA_ALL),
}


@pytest.mark.parametrize('case', COUNT_CASES)
def test_param_counts(case):
  m = model_cfg(**COUNT_CASES[case])
  model = nnx.eval_shape(lambda: HybridLM(m, rngs=nnx.Rngs(0)))
  built = sum(int(np.prod(var.get_value().shape)) for var in params_of(model).values())
  assert built == counting.param_counts(m)['total']


DECODE_CASES = {
    # Every option but qk_norm 'head' and block_mlp False in one model.
    'gdn_full_mamba2': dict(cycle=('gdn', 'full', 'mamba2'), num_layers=3, mlp='relu2', **GDN_ALL, **MAMBA_ALL,
                            **{'attention.qk_norm': 'all', 'attention.post_norm': True,
                               'attention.output_gate': True, 'attention.rope_dims': 4}),
    # MLP layers, q/k norm per head, a window the 12 tokens overrun, scanned: 2 cycles + 2 leftover layers.
    'scanned_mlp_layers': dict(cycle=('mamba2', 'mlp', 'swa', 'mlp'), num_layers=10, block_mlp=False, mlp='relu2',
                               scan_layers=True, window=4, **ATTN_ALL, **MAMBA_ALL),
}


@pytest.mark.parametrize('case', DECODE_CASES)
def test_decode_matches_forward(case):
  m = model_cfg(**DECODE_CASES[case])
  model, _ = build(HybridLM, m, seed=12)
  assert model.scan_layers == bool(m.scan_layers)
  tokens = jnp.asarray(np.random.default_rng(13).integers(0, m.vocab_size, (2, 12)))
  full = run_model(model, tokens)
  graphdef, params = nnx.split(model)
  state = model.init_decode_state(2, 12)
  prefill = lambda s, t, st: nnx.merge(graphdef, s).prefill(t, st)
  logits, state = compiled(prefill, params, tokens[:, :5], state)(params, tokens[:, :5], state)
  step_fn = lambda s, t, i, st: nnx.merge(graphdef, s).step(t, i, st)
  step = compiled(step_fn, params, tokens[:, 0], jnp.int32(0), state)
  outs = [logits]
  for i in range(5, 12):
    logits, state = step(params, tokens[:, i], jnp.int32(i), state)
    outs.append(logits[:, None])
  assert rel(jnp.concatenate(outs, 1), full) < 1e-5


# ------------------------------------------------------------------------------------------- 8. defaults unchanged
# The parameter trees of tiny default models before these options existed: old checkpoints keep loading.
ATTENTION_LAYER = {'mixer.wq': (32, 4, 8), 'mixer.wk': (32, 2, 8), 'mixer.wv': (32, 2, 8), 'mixer.wo': (4, 8, 32)}
BLOCK_REST = {'mixer_norm.scale': (32,), 'mlp_norm.scale': (32,), 'mlp.gate': (32, 48), 'mlp.up': (32, 48),
              'mlp.down': (48, 32)}
MAMBA2_LAYER = {'mixer.in_z': (32, 4, 4), 'mixer.in_x': (32, 4, 4), 'mixer.in_b': (32, 4), 'mixer.in_c': (32, 4),
                'mixer.in_dt': (32, 4), 'mixer.conv_x': (4, 4, 4), 'mixer.conv_b': (4, 4), 'mixer.conv_c': (4, 4),
                'mixer.A_log': (4,), 'mixer.dt_bias': (4,), 'mixer.D': (4,), 'mixer.norm': (4, 4),
                'mixer.out': (4, 4, 32)}
GDN_LAYER = {'mixer.wq': (32, 2, 8), 'mixer.wk': (32, 2, 8), 'mixer.wv': (32, 2, 4), 'mixer.conv_q': (4, 2, 8),
             'mixer.conv_k': (4, 2, 8), 'mixer.conv_v': (4, 2, 4), 'mixer.w_beta': (32, 2), 'mixer.w_a': (32, 2),
             'mixer.A_log': (2,), 'mixer.dt_bias': (2,), 'mixer.wg': (32, 2, 4), 'mixer.norm': (4,),
             'mixer.wo': (2, 4, 32)}
OUTSIDE = {'embed': (64, 32), 'final_norm.scale': (32,), 'lm_head': (32, 64)}


@pytest.mark.parametrize('cycle,layer_params', [(('swa', 'full'), (ATTENTION_LAYER, ATTENTION_LAYER)),
                                                (('mamba2', 'gdn'), (MAMBA2_LAYER, GDN_LAYER))],
                         ids=['swa_full', 'mamba2_gdn'])
def test_default_parameter_tree_unchanged(cycle, layer_params):
  m = model_cfg(cycle=cycle)
  model = nnx.eval_shape(lambda: HybridLM(m, rngs=nnx.Rngs(0)))
  got = {name: tuple(var.get_value().shape) for name, var in params_of(model).items()}
  want = dict(OUTSIDE)
  for i, layer in enumerate(layer_params):
    want.update({f'tail.{i}.{name}': shape for name, shape in {**layer, **BLOCK_REST}.items()})
  assert got == want


# ------------------------------------------------------------------------------------------- 9. validation
BAD = [
    ({'attention.rope_dims': 3}, 'model.attention.rope_dims'),
    ({'attention.rope_dims': 10}, 'model.attention.rope_dims'),  # > head_dim 8.
    ({'attention.rope_dims': -2}, 'model.attention.rope_dims'),
    ({'attention.qk_norm': 'layer'}, 'model.attention.qk_norm'),
    ({'gdn.value_heads': 3}, 'model.gdn.value_heads'),  # gdn.num_heads 2.
    ({'gdn.norm_eps': -1e-5}, 'model.gdn.norm_eps'),
    ({'mamba2.num_groups': 3}, 'model.mamba2.num_groups'),  # mamba2.num_heads 4.
    ({'mamba2.dt_floor': -0.1}, 'model.mamba2.dt_floor'),
    ({'mlp': 'gelu'}, 'model.mlp'),
    ({'head_dim': 7}, 'model.head_dim'),  # Odd head with whole-head RoPE.
]


@pytest.mark.parametrize('overrides,key', BAD, ids=[key + '=' + str(list(o.values())[0]) for o, key in BAD])
def test_invalid_options(overrides, key):
  with pytest.raises(ConfigError, match=re.escape(f'config.{key}=')):
    validate(config(**overrides))


def test_valid_options_pass():
  validate(config(**{'head_dim': 7, 'attention.rope_dims': 4}))  # Partial RoPE on an odd head is fine.
  validate(config(**{'attention.rope_dims': 8, 'gdn.value_heads': 6, 'mamba2.num_groups': 4}))
  validate(config(**NEMOTRON))
