"""hf export of a recurrent hybrid as one of the families' classes, where that class computes exactly what it does.

The family's config.json is written from the model config, then read back by the family's own import plan
(config.py); every key of the model's function must come back equal, or the export is refused naming the key.
So a refusal names the model option the class lacks (e.g. model.attention.output_gate=False against Qwen3.5's gate).
A model with mixtures of experts is compared the same way: which layers are MoE, and the MoE's function (routing,
expert and shared widths, activation; not its training-only keys).
"""

import math
import types

from hybrid_jax.hf import HFError
from hybrid_jax.hf.families.config import family as family_of
from hybrid_jax.models import moe, pattern
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
  names = {'mamba2': 'linear_attention', 'full': 'full_attention', 'mlp': 'mlp', 'moe': 'moe'}
  hf = dict(
      layers_block_type=[names.get(k, k) for k in _kinds(m)], head_dim=m.head_dim, intermediate_size=m.d_ff,
      layer_norm_epsilon=m.norm_eps, mlp_hidden_act='relu2', mamba_hidden_act='silu', use_bias=False,
      mlp_bias=False, mamba_num_heads=mc.num_heads, mamba_head_dim=mc.head_dim, ssm_state_size=mc.state_dim,
      n_groups=mc.num_groups, conv_kernel=mc.conv_width, use_conv_bias=bool(mc.conv_bias),
      time_step_min=float(mc.dt_floor), tie_word_embeddings=False)
  if 'moe' in _kinds(m):  # Its 'E' layers: sigmoid routing with the selection bias, squared-ReLU experts.
    mo = m.moe
    hf.update(n_routed_experts=mo.num_experts, num_experts_per_tok=mo.top_k, moe_intermediate_size=moe.expert_width(m),
              moe_shared_expert_intermediate_size=moe.shared_width(m), n_shared_experts=int(bool(mo.shared_experts)),
              n_group=mo.n_group, topk_group=mo.topk_group, norm_topk_prob=bool(mo.norm_topk_prob),
              routed_scaling_factor=float(mo.routed_scaling_factor), moe_latent_size=None)
  return hf


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
  hf = dict(
      layer_types=['full_attention' if k == 'full' else 'linear_attention' if k == 'mamba2' else k
                   for k in _kinds(m)], **_head_dim(m), num_local_experts=0, shared_intermediate_size=m.d_ff,
      intermediate_size=m.d_ff, rms_norm_eps=m.norm_eps, hidden_act='silu', attention_bias=False,
      tie_word_embeddings=False, position_embedding_type='rope' if rope else None,
      rope_parameters=_rope_parameters(m), embedding_multiplier=float(m.embedding_multiplier),
      residual_multiplier=float(m.residual_multiplier), logits_scaling=float(m.logits_scaling),
      attention_multiplier=float(m.attention_scale) or m.head_dim ** -0.5, **_mamba_expand_config(m))
  if _has_moe(m):  # Every block's MLP an MoE, with the shared MLP as its shared expert.
    hf.update(num_local_experts=m.moe.num_experts, num_experts_per_tok=m.moe.top_k,
              intermediate_size=moe.expert_width(m), shared_intermediate_size=moe.shared_width(m))
  return hf


def _has_moe(m) -> bool:
  """Whether the model has MoE MLPs (block MLPs or 'moe' layers)."""
  return 'moe' in m and (m.moe.blocks != 'none' or moe.LAYER_KIND in tuple(m.cycle))


def _moe_layers(m) -> list[int]:
  return [i for i in range(m.num_layers) if pattern.layer_spec(m, i).moe]


def _qwen_experts(m) -> dict:
  """Qwen's MoE fields: E experts of moe_intermediate_size, top-k, one gated shared expert."""
  mo = m.moe
  return dict(num_experts=mo.num_experts, num_experts_per_tok=mo.top_k, moe_intermediate_size=moe.expert_width(m),
              shared_expert_intermediate_size=moe.shared_width(m) or moe.expert_width(m))


def _qwen3_5_moe_config(m) -> dict:
  hf = _qwen3_5_config(m)
  del hf['intermediate_size']  # Every block's MLP is the MoE.
  return dict(hf, **_qwen_experts(m))


def _qwen3_next_config(m) -> dict:
  """Qwen3.5's layers; the blocks that are not MoE listed in mlp_only_layers (SwiGLUs of intermediate_size)."""
  moe_layers = set(_moe_layers(m))
  return dict(_qwen3_5_config(m), **_qwen_experts(m), norm_topk_prob=bool(m.moe.norm_topk_prob),
              decoder_sparse_step=1, mlp_only_layers=[i for i in range(m.num_layers) if i not in moe_layers])


def _gpt_oss_config(m) -> dict:
  ac, mo = m.attention, m.moe
  rope = {'rope_type': 'default', 'rope_theta': float(m.rope_base)}
  if ac.rope_scaling == 'yarn':
    rope.update(rope_type='yarn', factor=float(ac.yarn_factor), original_max_position_embeddings=int(
        ac.yarn_original_positions), beta_fast=float(ac.yarn_beta_fast), beta_slow=float(ac.yarn_beta_slow),
                truncate=bool(ac.yarn_truncate))
    if ac.yarn_attention_factor:
      rope['attention_factor'] = float(ac.yarn_attention_factor)
  kinds = _kinds(m)
  # transformers warns unless max_position_embeddings is the extended context, factor x original.
  extended = dict(max_position_embeddings=round(ac.yarn_factor * ac.yarn_original_positions)) if (
      ac.rope_scaling == 'yarn') else {}
  return dict(**extended,
      layer_types=['sliding_attention' if k == 'swa' else 'full_attention' if k == 'full' else k for k in kinds],
      head_dim=m.head_dim, sliding_window=int(m.window) if 'swa' in kinds else None, rms_norm_eps=m.norm_eps,
      attention_bias=bool(ac.bias), rope_parameters=rope, intermediate_size=moe.expert_width(m),
      num_local_experts=mo.num_experts, num_experts_per_tok=mo.top_k, swiglu_limit=float(mo.swiglu_limit),
      swiglu_alpha=float(mo.swiglu_alpha), hidden_act='silu', tie_word_embeddings=False)


def _minimax_config(m) -> dict:
  kinds = _kinds(m)
  factors = {}
  for (section, prefix) in (('lightning', 'linear_attn'), ('attention', 'full_attn'), ('moe', 'mlp')):
    alpha, beta = tuple(m[section].normed_residual) or (1.0, 1.0)  # () is refused by the comparison.
    factors.update({f'{prefix}_alpha_factor': float(alpha), f'{prefix}_beta_factor': float(beta)})
  return dict(
      layer_types=['linear_attention' if k == 'lightning' else 'full_attention' if k in ('full', 'swa') else k
                   for k in kinds],
      head_dim=m.head_dim, sliding_window=int(m.window) if 'swa' in kinds else None, rms_norm_eps=m.norm_eps,
      hidden_act='silu', rope_parameters={'rope_type': 'default', 'rope_theta': float(m.rope_base)},
      block_size=int(m.recurrent_chunk_size), intermediate_size=moe.expert_width(m),
      num_local_experts=m.moe.num_experts, num_experts_per_tok=m.moe.top_k, tie_word_embeddings=False, **factors)


# model_type -> its config.json fields for a model (num_hidden_layers and the shared sizes are added to all).
EXPORTERS = {'qwen3_5_text': _qwen3_5_config, 'olmo_hybrid': _olmo_hybrid_config, 'nemotron_h': _nemotron_h_config,
             'bamba': _bamba_config, 'granitemoehybrid': _granite_hybrid_config,
             'qwen3_5_moe_text': _qwen3_5_moe_config, 'qwen3_next': _qwen3_next_config, 'gpt_oss': _gpt_oss_config,
             'minimax': _minimax_config}
# What --arch auto tries, in order: for a dense model with layers that are not attention, and for a model with MoE.
DENSE_AUTO = ('qwen3_5_text', 'olmo_hybrid', 'nemotron_h', 'bamba', 'granitemoehybrid')
MOE_AUTO = ('qwen3_5_moe_text', 'qwen3_next', 'nemotron_h', 'granitemoehybrid', 'gpt_oss', 'minimax')
# The layer kinds some dense family's class has (a dense model with another kind is no family's).
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
  family = family_of(model_type)
  hf = dict(architectures=[family.hf_class], model_type=model_type, vocab_size=model_cfg.vocab_size,
            hidden_size=model_cfg.d_model, num_hidden_layers=model_cfg.num_layers,
            num_attention_heads=model_cfg.num_heads, num_key_value_heads=model_cfg.num_kv_heads,
            max_position_embeddings=max_positions, bos_token_id=None, eos_token_id=eos_id, pad_token_id=None,
            dtype='float32')
  hf.update(EXPORTERS[model_type](model_cfg))  # An exporter may say max_position_embeddings (YaRN's context).
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
    if kind.section and kind.section != 'moe' and kind.name in used:  # model.moe: _check_moe.
      for name, field in kind.fields.items():
        if f'{kind.section}.{name}' not in _NOT_FUNCTION:
          expected[f'{kind.section}.{name}'] = fields.get(kind.section, {}).get(name, field.default)
  if not _dense_mlp(model_cfg):  # Every MLP an MoE: the block MLP width is nobody's.
    expected.pop('d_ff', None)
  hf_class = family_of(model_type).hf_class
  for key, want in expected.items():
    section, _, name = key.rpartition('.')
    have = model_cfg[section][name] if section else model_cfg[key]
    have, want = (tuple(have), tuple(want)) if isinstance(want, (tuple, list)) else (have, want)
    if key in ('window', 'headwise_full_kv_heads') and not used & {'swa', 'headwise'}:
      continue
    if key == 'rope_base' and not (model_cfg.rope_full or model_cfg.rope_swa):
      continue
    if not _equal(have, want):
      raise HFError(f'the model sets model.{key}={have!r}, but {model_type} computes {want!r} there; no '
                    f'{hf_class} holds this model')
  _check_moe(model_cfg, fields, model_type, hf_class)


def _equal(have, want) -> bool:
  if isinstance(have, tuple) and isinstance(want, tuple):
    return len(have) == len(want) and all(_equal(a, b) for a, b in zip(have, want))
  if isinstance(have, (int, float)) and isinstance(want, (int, float)) and not isinstance(have, bool):
    return math.isclose(have, want)
  return have == want


def _dense_mlp(m) -> bool:
  """Whether some layer has a dense MLP (an 'mlp' layer, or a block MLP that is not an MoE)."""
  if 'mlp' in tuple(m.cycle):
    return True
  return bool(m.block_mlp) and not all(pattern.layer_spec(m, i).moe for i in range(m.num_layers))


def _moe_function(moe_cfg, d_ff) -> dict:
  """The keys of model.moe (a dict) that change what an MoE computes, widths as used (0 = the default width):
  no training-only key, no key its router or activation leaves unread."""
  defaults = _moe_defaults()
  get = lambda name: moe_cfg.get(name, defaults[name])
  width = int(get('expert_d_ff')) or int(d_ff)
  shared = int(get('shared_experts')) * (int(get('shared_d_ff')) or width)
  out = dict(num_experts=get('num_experts'), top_k=get('top_k'), router=get('router'),
             router_logit_bias=bool(get('router_logit_bias')), activation=get('activation'), expert_d_ff=width,
             shared_d_ff=shared, routed_scaling_factor=float(get('routed_scaling_factor')),
             dropless=bool(get('dropless')), normed_residual=tuple(get('normed_residual')))
  if shared:
    out['shared_expert_gate'] = bool(get('shared_expert_gate'))
  if out['router'] != 'topk_softmax':
    out['norm_topk_prob'] = bool(get('norm_topk_prob'))
  if out['router'] == 'sigmoid':
    out.update(n_group=get('n_group'), topk_group=get('topk_group'))
  if out['activation'] == 'swiglu_oai':
    out.update(swiglu_limit=float(get('swiglu_limit')), swiglu_alpha=float(get('swiglu_alpha')))
  return out


def _check_moe(model_cfg, fields: dict, model_type: str, hf_class: str):
  """HFError naming the first difference in which layers are MoE, or in what the MoE computes."""
  theirs = dict(fields.get('moe', {}))
  defaults = dict(_moe_defaults(), blocks='none')
  plan = types.SimpleNamespace(block_mlp=fields.get('block_mlp', True), cycle=tuple(fields.get('cycle', ())),
                               moe=types.SimpleNamespace(**{**defaults, **theirs}))
  mine = [i for i in range(model_cfg.num_layers) if pattern.layer_spec(model_cfg, i).moe]
  their_layers = [i for i in range(model_cfg.num_layers) if moe.is_moe_block(plan, i)]
  if mine != their_layers:
    raise HFError(f'the model\'s MoE blocks are layers {mine} (model.moe.blocks={model_cfg.moe.blocks!r}), but '
                  f'{model_type} has them at {their_layers}; no {hf_class} holds this model')
  if not _has_moe(model_cfg) and not theirs:
    return
  have = _moe_function(model_cfg.moe, model_cfg.d_ff)
  want = _moe_function(theirs, fields.get('d_ff', model_cfg.d_ff))
  for key in [*have, *(k for k in want if k not in have)]:
    if not _equal(have.get(key), want.get(key)):
      raise HFError(f'the model sets model.moe.{key}={have.get(key)!r} (as used), but {model_type} computes '
                    f'{want.get(key)!r} there; no {hf_class} holds this model')


# Keys of the mixers' sections that say how, not what, a layer computes.
_NOT_FUNCTION = {'attention.max_documents'}


def _moe_defaults() -> dict:
  """model.moe's defaults (the registry's), for an MoE a plan leaves partly unsaid."""
  return {name: field.default for name, field in registry.get(moe.LAYER_KIND).fields.items()}

# The base config's plain block, for keys a family's plan leaves at that.
_BASE_DEFAULTS = dict(window=128, rope_full=True, rope_swa=True, headwise_full_kv_heads=1, mlp='swiglu',
                      block_mlp=True, embedding_multiplier=1.0, residual_multiplier=1.0, logits_scaling=1.0,
                      attention_scale=0.0, attention_sinks=False)
