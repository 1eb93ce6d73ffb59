"""Recurrent mixer layers: parameter matching, shapes, causality, implementation parity, init, decay, config."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_jax.config import ConfigError, validate
from hybrid_jax.models import counting, pattern
from hybrid_jax.models.mixers import make_mixer
from hybrid_jax.models.mixers import lightning
from hybrid_jax.models.mixers.lightning import alibi_slopes
from hybrid_jax.models.model import HybridLM
from hybrid_jax.study import mixer_shapes
from hybrid_jax.train import optim
from tests.conftest import ROOT, small_config, study_config

KINDS = ['lightning', 'mamba2', 'gdn']


def test_every_mixer_is_within_5_percent_of_attention_at_every_scale():
  rows = mixer_shapes.mixer_matching_table()
  assert {(r['scale'], r['kind']) for r in rows} == {(s, k) for s in ('tiny', 's1', 's2', 's3', 's4', 's5')
                                                      for k in KINDS}
  for r in rows:
    assert 0.95 <= r['ratio'] <= 1.05, r
    cfg = study_config(r['kind'], r['scale']).model
    assert r['attention'] == 2 * cfg.d_model ** 2 + 2 * cfg.d_model * cfg.num_kv_heads * cfg.head_dim
    assert r['mixer'] == _built_mixer_params(cfg, 0)


def _built_mixer_params(cfg, layer):
  """Parameter count of layer `layer`'s mixer as the model builds it, from abstract shapes (nothing allocated)."""
  spec = pattern.layer_spec(cfg, layer)
  abstract = nnx.eval_shape(lambda: make_mixer(cfg, spec, rngs=nnx.Rngs(0)))
  return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


@pytest.mark.parametrize('scale', ['tiny', 's1', 's2', 's3', 's4', 's5'])
def test_mixer_param_formulas_match_the_built_mixers_at_every_scale(scale):
  """The counting formulas against the mixers as built, per kind and scale (attention from a hybrid's layers)."""
  for arch in ('swa128', *KINDS):
    cfg = study_config(arch, scale).model
    for layer in range(min(cfg.num_layers, 2)):  # Both kinds of a hybrid's [recurrent/SWA, full] pair.
      assert counting.mixer_params(cfg, pattern.layer_spec(cfg, layer)) == _built_mixer_params(cfg, layer), (
          arch, scale, layer)


def test_docs_table_is_generated_from_the_configs():
  assert (ROOT / 'docs' / 'MIXER_SHAPES.md').read_text() == mixer_shapes.mixer_matching_markdown()


def _mixer(kind, init=True, **overrides):
  """(cfg, graphdef, params) of one layer, initialised under jit (one compile instead of one per eager op; the
  'rbg' generator compiles several times faster than the default on CPU)."""
  cfg = small_config(kind, recurrent_chunk_size=8, **overrides).model
  make = lambda: make_mixer(cfg, pattern.layer_spec(cfg, 0), rngs=nnx.Rngs(jax.random.key(0, impl='rbg')))
  graphdef = nnx.split(nnx.eval_shape(make))[0]
  return cfg, graphdef, jax.jit(lambda: nnx.split(make())[1])() if init else None


_apply = jax.jit(lambda graphdef, state, x: nnx.merge(graphdef, state)(x, jnp.arange(x.shape[1])),
                 static_argnums=0)


@pytest.mark.parametrize('kind', KINDS)
def test_layer_shape_dtype_causality_and_reference_parity(kind):
  cfg, graphdef, state = _mixer(kind)
  assert {p.dtype for p in jax.tree.leaves(state)} == {jnp.dtype('float32')}
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 28, cfg.d_model)), jnp.float32)
  changed = x.at[:, 19:].add(1.0)  # The change starts inside a chunk (chunk 8) and crosses chunk boundaries.
  y, y2 = jnp.split(_apply(graphdef, state, jnp.concatenate([x, changed])), 2)
  assert y.shape == x.shape and y.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(y)))
  np.testing.assert_allclose(y[:, :19], y2[:, :19], atol=1e-6, rtol=0)  # Future tokens leave the past alone.
  assert float(jnp.abs(y[:, 19:] - y2[:, 19:]).max()) > 1e-4
  # The chunked kernel and the token-by-token reference compute the same layer.
  module = nnx.merge(graphdef, state)
  module.implementation = 'reference'
  reference_def = nnx.split(module)[0]
  np.testing.assert_allclose(_apply(reference_def, state, x[:1, :21]), y[:1, :21], rtol=2e-4, atol=2e-6)
  # Mixed precision: bfloat16 compute returns bfloat16 from float32 masters.
  _, bf16_def, _ = _mixer(kind, init=False, dtype='bfloat16')
  out = jax.eval_shape(lambda s, x: nnx.merge(bf16_def, s)(x, None), state, x.astype(jnp.bfloat16))
  assert out.shape == x.shape and out.dtype == jnp.bfloat16


def test_mamba2_init_ranges():
  _, graphdef, state = _mixer('mamba2', mamba2=dict(num_heads=256, head_dim=2, state_dim=4, conv_width=4))
  mixer = nnx.merge(graphdef, state)
  a = np.exp(np.asarray(mixer.A_log[...]))
  dt = np.asarray(jax.nn.softplus(mixer.dt_bias[...]))
  assert a.min() >= 1.0 and a.max() <= 16.0 and a.max() - a.min() > 10  # Spread over U(1, 16).
  assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 1e-1 * (1 + 1e-5)
  assert np.median(dt) == pytest.approx(1e-2, rel=0.5)  # Log-uniform: median near the geometric mean.
  np.testing.assert_array_equal(np.asarray(mixer.D[...]), 1.0)


@pytest.mark.parametrize('heads', range(1, 13))
def test_lightning_decay_rates_are_the_closed_form_for_every_head_count(heads):
  """Head h of H decays by exp(-2^(-8(h+1)/H)) per token (MiniMax's Lightning layer), powers of two or not: in the
  rate series and in the log decay of a layer built from the config."""
  expected_log2 = [-8.0 * (h + 1) / heads for h in range(heads)]  # Evenly spaced from -8/H down to -8.
  np.testing.assert_allclose(np.log2(alibi_slopes(heads)), expected_log2, rtol=1e-12)
  assert lightning.decay_rates(heads) == alibi_slopes(heads)
  cfg = small_config('lightning', lightning=dict(num_heads=heads, key_dim=4, value_dim=4)).model
  assert cfg.lightning.decay_rates == 'closed_form'  # The default.
  layer = nnx.eval_shape(lambda: make_mixer(cfg, pattern.layer_spec(cfg, 0), rngs=nnx.Rngs(0)))
  np.testing.assert_allclose(layer.log_decay, [-(2.0 ** e) for e in expected_log2], rtol=1e-12)


def test_the_alibi_interleaved_series_is_kept_for_runs_made_before():
  """ALiBi's series differs from the closed form unless H is a power of two (H = 3: log2 rates [-4, -8, -2])."""
  np.testing.assert_allclose(np.log2(lightning.alibi_interleaved_slopes(3)), [-4, -8, -2])
  np.testing.assert_allclose(np.log2(lightning.alibi_interleaved_slopes(6)), [-2, -4, -6, -8, -1, -3])
  assert [h for h in range(1, 13) if lightning.series_differ(h)] == [3, 5, 6, 7, 9, 10, 11, 12]
  cfg = small_config('lightning', lightning=dict(num_heads=6, key_dim=4, value_dim=4,
                                                 decay_rates='alibi_interleaved')).model
  layer = nnx.eval_shape(lambda: make_mixer(cfg, pattern.layer_spec(cfg, 0), rngs=nnx.Rngs(0)))
  np.testing.assert_allclose(layer.log_decay, [-s for s in lightning.alibi_interleaved_slopes(6)])
  bad = small_config('lightning')
  bad.model.lightning.decay_rates = 'alibi'
  with pytest.raises(ConfigError, match=r"model.lightning.decay_rates='alibi' is invalid: allowed: closed_form, "
                                        'alibi_interleaved'):
    validate(bad)


def test_lightning_decay_is_minus_the_slopes_with_the_optional_layer_factor():
  cfg = small_config('lightning', lightning=dict(num_heads=8, key_dim=4, value_dim=4, layer_decay=False)).model
  layer = nnx.eval_shape(lambda: make_mixer(cfg, pattern.layer_spec(cfg, 0), rngs=nnx.Rngs(0)))
  np.testing.assert_allclose(layer.log_decay, [-s for s in alibi_slopes(8)])
  cfg = small_config('lightning', num_layers=5, cycle=('lightning',)).model
  cfg.lightning.layer_decay = True
  assert [pattern.layer_spec(cfg, i).option('decay_scale') for i in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
  layer = nnx.eval_shape(lambda: make_mixer(cfg, pattern.layer_spec(cfg, 1), rngs=nnx.Rngs(0)))
  np.testing.assert_allclose(layer.log_decay, [-0.75 * s for s in alibi_slopes(cfg.lightning.num_heads)])


@pytest.mark.parametrize('scan_layers', [False, True])
def test_no_weight_decay_on_a_log_dt_bias_and_d(scan_layers):
  cfg = small_config('mamba2', num_layers=4, scan_layers=scan_layers, cycle=('mamba2', 'gdn')).model
  params = nnx.to_pure_dict(nnx.state(nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0))), nnx.Param))
  mask = optim.decay_mask(params)
  flat = {'/'.join(str(getattr(k, 'key', getattr(k, 'idx', k))) for k in path): m
          for path, m in jax.tree_util.tree_flatten_with_path(mask)[0]}
  names = {path.rsplit('/', 1)[-1] for path in flat}
  assert {'A_log', 'dt_bias', 'D', 'in_x', 'wq'} <= names
  for path, decays in flat.items():
    name = path.rsplit('/', 1)[-1]
    if name in ('A_log', 'dt_bias', 'D', 'scale', 'norm'):
      assert not decays, path
    elif name in ('in_x', 'in_b', 'wq', 'w_beta', 'conv_x', 'out', 'wo', 'down', 'embed', 'lm_head'):
      assert decays, path


@pytest.mark.parametrize('key, value, message', [
    ('mamba2.state_dim', 0, r'config.model.mamba2.state_dim=0 is invalid: must be a positive integer'),
    ('gdn.num_heads', -1, r'config.model.gdn.num_heads=-1 is invalid: must be a positive integer'),
    ('gdn.value_dim', 0, r'config.model.gdn.value_dim=0 is invalid'),
    ('lightning.key_dim', -4, r'config.model.lightning.key_dim=-4 is invalid'),
    ('mamba2.conv_width', True, r'config.model.mamba2.conv_width=True is invalid'),
    ('recurrent_implementation', 'cuda', r"config.model.recurrent_implementation='cuda' is invalid: allowed: auto"),
    ('recurrent_chunk_size', 0, r'config.model.recurrent_chunk_size=0 is invalid'),
])
def test_bad_mixer_fields_name_key_value_and_allowed(key, value, message):
  kind = key.split('.')[0] if '.' in key else 'gdn'
  c = study_config(kind)
  node = c.model
  *parents, leaf = key.split('.')
  for part in parents:
    node = node[part]
  node[leaf] = value
  with pytest.raises(ConfigError, match=message):
    validate(c)


def test_layer_decay_needs_unscanned_layers():
  c = study_config('lightning', 's1')
  c.model.lightning.layer_decay = True
  with pytest.raises(ConfigError, match=r'layer_decay=True is invalid: needs model.scan_layers=False'):
    validate(c)
  c.model.scan_layers = False
  validate(c)
