"""hf export of a recurrent hybrid as one of the families' classes, where that class computes exactly what it does.

The family's config.json is written from the model config, then read back by the family's own import plan
(config.py); every key of the model's function must come back equal, or the export is refused naming the key.
So a refusal names the model option the class lacks (e.g. model.attention.output_gate=False against Qwen3.5's gate).
"""

import math

from hybrid_jax.hf import HFError
from hybrid_jax.hf.families.config import FAMILIES
from hybrid_jax.models import pattern
from hybrid_jax.models.mixers import registry


def _kinds(m) -> list[str]:
  return [pattern.layer_spec(m, i).kind for i in range(m.num_layers)]


def _gdn_types(m) -> list[str]:
  return ['full_attention' if k == 'full' else 'linear_attention' for k in _kinds(m)]


def _rope_parameters(m, rope: bool = True) -> dict:
  return {'rope_type': 'default', 'rope_theta': float(m.rope_base) if rope else None,
          'partial_rotary_factor': (m.attention.rope_dims or m.head_dim) / m.head_dim}


def _head_dim(m) -> dict:
  """head_dim for classes that derive it from hidden_size / heads unless config.json says otherwise."""
  return {} if m.head_dim * m.num_heads == m.d_model else {'head_dim': m.head_dim}


def _qwen3_5_config(m) -> dict:
  """Qwen3.5's config.json fields for a model of its shape (checked against the model by `to_hf_config`)."""
  g = m.gdn
  return dict(
      layer_types=_gdn_types(m), head_dim=m.head_dim, intermediate_size=m.d_ff, rms_norm_eps=m.norm_eps,
      hidden_act='silu', attention_bias=False, tie_word_embeddings=False, linear_num_key_heads=g.num_heads,
      linear_num_value_heads=g.value_heads or g.num_heads, linear_key_head_dim=g.key_dim,
      linear_value_head_dim=g.value_dim, linear_conv_kernel_dim=g.conv_width, rope_parameters=_rope_parameters(m))


def _olmo_hybrid_config(m) -> dict:
  g = m.gdn
  return dict(
      layer_types=_gdn_types(m), **_head_dim(m), intermediate_size=m.d_ff, rms_norm_eps=m.norm_eps,
      hidden_act='silu', attention_bias=False, tie_word_embeddings=False, linear_num_key_heads=g.num_heads,
      linear_num_value_heads=g.value_heads or g.num_heads, linear_key_head_dim=g.key_dim,
      linear_value_head_dim=g.value_dim, linear_conv_kernel_dim=g.conv_width,
      linear_allow_neg_eigval=bool(g.neg_eigval), rope_parameters=_rope_parameters(m, bool(m.rope_full)))


def _nemotron_h_config(m) -> dict:
  mc = m.mamba2
  types = {'mamba2': 'linear_attention', 'full': 'full_attention', 'mlp': 'mlp'}
  return dict(
      layers_block_type=[types.get(k, k) for k in _kinds(m)], head_dim=m.head_dim, intermediate_size=m.d_ff,
      layer_norm_epsilon=m.norm_eps, mlp_hidden_act='relu2', mamba_hidden_act='silu', use_bias=False,
      mlp_bias=False, mamba_num_heads=mc.num_heads, mamba_head_dim=mc.head_dim, ssm_state_size=mc.state_dim,
      n_groups=mc.num_groups, conv_kernel=mc.conv_width, use_conv_bias=bool(mc.conv_bias),
      time_step_min=float(mc.dt_floor), tie_word_embeddings=False)


def _mamba_expand_config(m) -> dict:
  """Bamba's and Granite-4.0-H's Mamba-2 fields (inner width mamba_expand * hidden_size)."""
  mc = m.mamba2
  inner = mc.num_heads * mc.head_dim
  if inner % m.d_model:
    raise HFError(f'the model\'s Mamba-2 inner width model.mamba2.num_heads * head_dim = {inner} is not a whole '
                  f'multiple of model.d_model={m.d_model}; Bamba and Granite-4.0-H size it as an integer '
                  'mamba_expand times hidden_size')
  return dict(mamba_n_heads=mc.num_heads, mamba_d_head=mc.head_dim, mamba_expand=inner // m.d_model,
              mamba_d_state=mc.state_dim,
              mamba_n_groups=mc.num_groups, mamba_d_conv=mc.conv_width, mamba_conv_bias=bool(mc.conv_bias),
              mamba_proj_bias=False, time_step_limit=[float(mc.dt_floor), {'__float__': 'Infinity'}])


def _bamba_config(m) -> dict:
  return dict(
      attn_layer_indices=[i for i, k in enumerate(_kinds(m)) if k == 'full'], **_head_dim(m),
      intermediate_size=m.d_ff, rms_norm_eps=m.norm_eps, hidden_act='silu', attention_bias=False, mlp_bias=False,
      tie_word_embeddings=False, rope_parameters=_rope_parameters(m), **_mamba_expand_config(m))


def _granite_hybrid_config(m) -> dict:
  rope = bool(m.rope_full)
  return dict(
      layer_types=['full_attention' if k == 'full' else 'linear_attention' if k == 'mamba2' else k
                   for k in _kinds(m)], **_head_dim(m), num_local_experts=0, shared_intermediate_size=m.d_ff,
      intermediate_size=m.d_ff, rms_norm_eps=m.norm_eps, hidden_act='silu', attention_bias=False,
      tie_word_embeddings=False, position_embedding_type='rope' if rope else None,
      rope_parameters=_rope_parameters(m), embedding_multiplier=float(m.embedding_multiplier),
      residual_multiplier=float(m.residual_multiplier), logits_scaling=float(m.logits_scaling),
      attention_multiplier=float(m.attention_scale) or m.head_dim ** -0.5, **_mamba_expand_config(m))


# model_type -> its config.json fields for a model (num_hidden_layers and the shared sizes are added to all).
EXPORTERS = {'qwen3_5_text': _qwen3_5_config, 'olmo_hybrid': _olmo_hybrid_config, 'nemotron_h': _nemotron_h_config,
             'bamba': _bamba_config, 'granitemoehybrid': _granite_hybrid_config}
# The layer kinds some family's class has (a model with another kind is no family's).
FAMILY_KINDS = {'full', 'gdn', 'mamba2', 'mlp'}
# Model keys an exported config must reproduce: every key the model's function depends on (mixer sections whole).
_FUNCTION_KEYS = ('vocab_size', 'd_model', 'num_layers', 'num_heads', 'num_kv_heads', 'head_dim', 'd_ff', 'cycle',
                  'window', 'rope_full', 'rope_swa', 'rope_base', 'headwise_full_kv_heads', 'norm_eps', 'mlp',
                  'block_mlp', 'embedding_multiplier', 'residual_multiplier', 'logits_scaling', 'attention_scale',
                  'attention_sinks')


def to_hf_config(model_cfg, model_type: str, *, max_positions: int, eos_id: int | None) -> dict:
  """The config.json of `model_type` for a hybrid_jax model; HFError naming the first model field the family's
  class computes differently (the written config is read back by the family's own import plan and compared)."""
  if model_type not in EXPORTERS:
    raise HFError(f'--arch={model_type}: export writes {", ".join(EXPORTERS)} among the recurrent hybrids '
                  f'({model_type} is import-only)')
  family = FAMILIES[model_type]
  hf = dict(architectures=[family.hf_class], model_type=model_type, vocab_size=model_cfg.vocab_size,
            hidden_size=model_cfg.d_model, num_hidden_layers=model_cfg.num_layers,
            num_attention_heads=model_cfg.num_heads, num_key_value_heads=model_cfg.num_kv_heads,
            max_position_embeddings=max_positions, bos_token_id=None, eos_token_id=eos_id, pad_token_id=None,
            dtype='float32', **EXPORTERS[model_type](model_cfg))
  fields, _ = family.plan(hf)
  _check_same(model_cfg, fields, model_type)
  return hf


def _check_same(model_cfg, fields: dict, model_type: str):
  """HFError naming the first model field whose value differs from what the class computes (`fields`)."""
  used = set(model_cfg.cycle)
  expected = {}
  for key in _FUNCTION_KEYS:
    if key in model_cfg:
      expected[key] = fields.get(key, _BASE_DEFAULTS.get(key, model_cfg[key]))
  for kind in registry.kinds():
    if kind.section and kind.name in used:
      for name, field in kind.fields.items():
        expected[f'{kind.section}.{name}'] = fields.get(kind.section, {}).get(name, field.default)
  for key, want in expected.items():
    section, _, name = key.rpartition('.')
    have = model_cfg[section][name] if section else model_cfg[key]
    have, want = (tuple(have), tuple(want)) if key == 'cycle' else (have, want)
    if key in ('window', 'headwise_full_kv_heads') and not used & {'swa', 'headwise'}:
      continue
    if key == 'rope_base' and not (model_cfg.rope_full or model_cfg.rope_swa):
      continue
    if have != want and not (isinstance(have, float) and isinstance(want, float) and math.isclose(have, want)):
      raise HFError(f'the model sets model.{key}={have!r}, but {model_type} computes {want!r} there; no '
                    f'{FAMILIES[model_type].hf_class} holds this model')


# The base config's plain block, for keys a family's plan leaves at that.
_BASE_DEFAULTS = dict(window=128, rope_full=True, rope_swa=True, headwise_full_kv_heads=1, mlp='swiglu',
                      block_mlp=True, embedding_multiplier=1.0, residual_multiplier=1.0, logits_scaling=1.0,
                      attention_scale=0.0, attention_sinks=False)
