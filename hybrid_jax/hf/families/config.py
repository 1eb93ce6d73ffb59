"""The recurrent hybrids people release, as hybrid_jax models: Qwen3.5, OLMo Hybrid, Nemotron-H, Bamba, Granite-4.0-H,
and the mixture-of-experts ones: Qwen3.5-MoE, Qwen3-Next, Nemotron-H with 'E' layers, Granite-4.0-H with experts,
gpt-oss (SWA / full attention with sinks, biases and YaRN) and MiniMax-Text-01 (Lightning and softmax layers with
MiniMax's scaled normed residuals).

Each family is a `Family`: how its `config.json` maps onto model fields (refusing, field by field, what the model
cannot hold, before a weight is read) and its tensor rules (hybrid_jax.hf.families.rules): which checkpoint tensor
holds which parameters, and how the layouts differ. docs/HF.md lists the families, the options each maps to and the
refusals.
"""

import dataclasses
import math
from typing import Callable

import numpy as np

from hybrid_jax.hf.families.experts import Stacking
from hybrid_jax.hf.families.rules import (CONV, FLAT, ZERO_CENTRED, Rule, attention_bias_rules, attention_rules,
                                          block_norm_rules, mamba_rules, moe_rules, shared_expert_rules,
                                          swiglu_rules, transposed_expert_rules)
from hybrid_jax.hf.fields import positive_int, positive_number, refuse, rope, shortest_cycle
from hybrid_jax.hf.tensors import HEADS_IN, HEADS_OUT, SAME, TRANSPOSE
from hybrid_jax.models.mixers import lightning


# ---------------------------------------------------------------------------------------------------- config
def _number(value) -> float:
  """A config number, including transformers' {"__float__": "Infinity"} encoding."""
  if isinstance(value, dict) and '__float__' in value:
    return float(value['__float__'])
  return float(value)


def _no_bias(hf: dict, *fields):
  for field in fields:
    if hf.get(field):
      refuse(field, hf[field], 'these projections have no biases here')


def _silu(hf: dict, *fields):
  for field in fields:
    if hf.get(field, 'silu') != 'silu':
      refuse(field, hf[field], "the gated MLP and the short convs use 'silu'")


def _rope(hf: dict, default_factor: float = 1.0) -> tuple[float | None, float]:
  """(RoPE base, partial rotary factor): transformers' base 10000 when the config names none, None for null."""
  return rope(hf, default_factor, default_theta=10000.0)


def _rope_dims(head_dim: int, factor) -> int:
  """model.attention.rope_dims of a partial rotary factor (0 = whole head)."""
  if not isinstance(factor, (int, float)) or not 0 < factor <= 1:
    refuse('partial_rotary_factor', factor, 'a fraction in (0, 1]')
  dims = int(head_dim * factor)
  if dims % 2 or dims <= 0:
    refuse('partial_rotary_factor', factor, f'must rotate an even number of the {head_dim} head channels')
  return 0 if dims == head_dim else dims


def _time_step_limit(hf: dict) -> float:
  """Bamba / Granite's time_step_limit (lo, hi): lo is the dt floor; a finite hi is refused."""
  limit = hf.get('time_step_limit', (0.0, math.inf))
  try:
    lo, hi = (_number(v) for v in limit)
  except (TypeError, ValueError):
    refuse('time_step_limit', limit, 'a pair (low, high)')
  if hi != math.inf:
    refuse('time_step_limit', limit, 'dt has a floor here but no ceiling (high must be Infinity)')
  if not 0 <= lo < math.inf:
    refuse('time_step_limit', limit, 'the low end must be finite and >= 0')
  return lo


def _mamba_expand_fields(hf: dict) -> dict:
  """model.mamba2 of Bamba / Granite-4.0-H (inner width mamba_expand * hidden_size)."""
  heads = positive_int(hf, 'mamba_n_heads', 128)
  inner = int(hf.get('mamba_expand', 2) * hf['hidden_size'])
  head_dim = hf.get('mamba_d_head', 'auto')
  head_dim = inner // heads if head_dim == 'auto' else head_dim
  if head_dim * heads != inner:
    refuse('mamba_d_head', hf.get('mamba_d_head'), f'mamba_n_heads * mamba_d_head must be the inner width {inner}')
  _no_bias(hf, 'mamba_proj_bias')
  return dict(num_heads=heads, head_dim=head_dim, state_dim=positive_int(hf, 'mamba_d_state', 256),
              num_groups=positive_int(hf, 'mamba_n_groups', 1), conv_width=positive_int(hf, 'mamba_d_conv', 4),
              conv_bias=bool(hf.get('mamba_conv_bias', True)), norm_by_group=True, dt_floor=_time_step_limit(hf))


def _common(hf: dict, kinds: list[str], *, head_dim=None, d_ff=None, eps_field='rms_norm_eps', eps=1e-6) -> dict:
  heads = positive_int(hf, 'num_attention_heads')
  hidden = positive_int(hf, 'hidden_size')
  return dict(vocab_size=positive_int(hf, 'vocab_size'), d_model=hidden, num_layers=len(kinds),
              num_heads=heads, num_kv_heads=hf.get('num_key_value_heads') or heads,
              head_dim=head_dim or hf.get('head_dim') or hidden // heads,
              d_ff=d_ff or positive_int(hf, 'intermediate_size'), norm_eps=float(hf.get(eps_field, eps)),
              cycle=shortest_cycle(kinds))


def _layer_list(hf: dict, field: str, names: dict, n: int | None) -> list[str]:
  types = hf.get(field)
  if not isinstance(types, (list, tuple)) or not types:
    refuse(field, types, 'a list of layer types is required')
  bad = [t for t in types if t not in names]
  if bad:
    refuse(field, types, f'layer types must be {", ".join(map(repr, names))} ({bad[0]!r} is not: '
                          'mixtures of experts are not supported)' if 'moe' in bad else
            f'layer types must be {", ".join(map(repr, names))}')
  if n is not None and len(types) != n:
    refuse(field, types, f'one entry per layer (num_hidden_layers={n})')
  return [names[t] for t in types]


# ---------------------------------------------------------------------------------------------------- families
@dataclasses.dataclass(frozen=True)
class Family:
  """One model_type: `plan(hf) -> (model fields, tied)`, `rules(model_cfg, spec, i) -> that layer's Rules`, its
  top-level tensor names, the prefixes its checkpoints may use for `model.`, and the prefixes of tensors that are
  not the language model's (a vision tower, multi-token prediction heads: left out, and counted in the summary)."""
  model_type: str
  hf_class: str
  plan: Callable
  layer_rules: Callable
  top: dict
  prefixes: tuple = ('model.',)
  ignored: tuple = ()
  zero_centred: bool = False  # Norms store w for a scale of 1 + w (Qwen3.5's), the final norm's included.
  per_expert: tuple = ()  # Stackings: experts stored one tensor each, read as the stacked tensors (experts.py).
  export_per_expert: bool = False  # Export writes the experts one tensor each (as the family's releases do).
  # (name in some checkpoints, name the rules use): module paths a class also loads under another name.
  aliases: tuple = ()
  # derived(model_cfg, spec, i) -> {tensor name: value}: buffers computed from the config (MiniMax's decays), which
  # import checks where the checkpoint stores them and export writes.
  derived: Callable | None = None


_GDN_TYPES = {'linear_attention': 'gdn', 'full_attention': 'full'}


def _qwen3_5_plan(hf, d_ff=None):
  _no_bias(hf, 'attention_bias')
  _silu(hf, 'hidden_act')
  n = positive_int(hf, 'num_hidden_layers')
  if 'layer_types' in hf:
    kinds = _layer_list(hf, 'layer_types', _GDN_TYPES, n)
  else:
    interval = positive_int(hf, 'full_attention_interval', 4)
    kinds = ['full' if (i + 1) % interval == 0 else 'gdn' for i in range(n)]
  head_dim = positive_int(hf, 'head_dim', 256)
  theta, factor = _rope(hf, default_factor=0.25)
  key_heads = positive_int(hf, 'linear_num_key_heads', 16)
  value_heads = positive_int(hf, 'linear_num_value_heads', 32)
  if value_heads % key_heads:
    refuse('linear_num_value_heads', value_heads, f'a multiple of linear_num_key_heads={key_heads}')
  fields = _common(hf, kinds, head_dim=head_dim, d_ff=d_ff)
  fields.update(rope_base=float(theta), rope_full=True,
                attention=dict(qk_norm='head', output_gate=True, rope_dims=_rope_dims(head_dim, factor)),
                gdn=dict(num_heads=key_heads, value_heads=0 if value_heads == key_heads else value_heads,
                         key_dim=positive_int(hf, 'linear_key_head_dim', 128),
                         value_dim=positive_int(hf, 'linear_value_head_dim', 128),
                         conv_width=positive_int(hf, 'linear_conv_kernel_dim', 4)))
  return fields, bool(hf.get('tie_word_embeddings', False))


def _qwen_mlp_rules(spec, p):
  """A Qwen block's MLP: SwiGLU, or (an MoE block) the softmax router, stacked SwiGLU experts (fused gate_up_proj)
  and the shared expert with its sigmoid gate."""
  if not spec.moe:
    return swiglu_rules(p + 'mlp.')
  q = p + 'mlp.'
  return [*moe_rules(('mlp',), q + 'gate.weight', q + 'experts.down_proj', gate_up=q + 'experts.gate_up_proj'),
          *shared_expert_rules(('mlp',), q + 'shared_expert.', sigmoid_gate=q + 'shared_expert_gate.weight')]


def _qwen_gdn_common_rules(a, m):
  return [Rule(a + 'conv1d.weight', ((m('conv_q'), CONV), (m('conv_k'), CONV), (m('conv_v'), CONV))),
          Rule(a + 'A_log', ((m('A_log'), SAME),)), Rule(a + 'dt_bias', ((m('dt_bias'), SAME),)),
          Rule(a + 'norm.weight', ((m('norm'), SAME),)), Rule(a + 'out_proj.weight', ((m('wo'), HEADS_OUT),))]


def _qwen3_5_rules(model_cfg, spec, i):
  p = f'model.layers.{i}.'
  rules = [*block_norm_rules(p, 'input_layernorm', 'post_attention_layernorm', ZERO_CENTRED),
           *_qwen_mlp_rules(spec, p)]
  if spec.kind == 'full':
    return rules + attention_rules(p + 'self_attn.', dict(qk_norm='head', zero_centred=True), gate_interleaved=True)
  a = p + 'linear_attn.'
  m = lambda name: ('mixer', name)
  return rules + [
      Rule(a + 'in_proj_qkv.weight', ((m('wq'), HEADS_IN), (m('wk'), HEADS_IN), (m('wv'), HEADS_IN))),
      Rule(a + 'in_proj_z.weight', ((m('wg'), HEADS_IN),)), Rule(a + 'in_proj_b.weight', ((m('w_beta'), TRANSPOSE),)),
      Rule(a + 'in_proj_a.weight', ((m('w_a'), TRANSPOSE),)), *_qwen_gdn_common_rules(a, m)]


def _qwen3_next_rules(model_cfg, spec, i):
  """Qwen3.5's block, but its GDN projections fused per key head: in_proj_qkvz is, per key head g, [q_g | k_g | v
  of g's value heads | z of them], and in_proj_ba [b of g's value heads | a of them]."""
  if spec.kind == 'full':
    return _qwen3_5_rules(model_cfg, spec, i)
  p = f'model.layers.{i}.'
  a = p + 'linear_attn.'
  m = lambda name: ('mixer', name)
  groups = int(model_cfg.gdn.num_heads)
  return [*block_norm_rules(p, 'input_layernorm', 'post_attention_layernorm', ZERO_CENTRED),
          *_qwen_mlp_rules(spec, p),
          Rule(a + 'in_proj_qkvz.weight', ((m('wq'), HEADS_IN), (m('wk'), HEADS_IN), (m('wv'), HEADS_IN),
                                           (m('wg'), HEADS_IN)), interleave=4, groups=groups),
          Rule(a + 'in_proj_ba.weight', ((m('w_beta'), TRANSPOSE), (m('w_a'), TRANSPOSE)), interleave=2,
               groups=groups),
          *_qwen_gdn_common_rules(a, m)]


def _moe_layout(kinds: list[str], moe_layers: list[bool]) -> tuple[dict, dict]:
  """model.cycle and model.moe's blocks / cycle_positions for per-layer kinds and which blocks' MLPs are MoE: the
  shortest unit repeating both."""
  unit = shortest_cycle(list(zip(kinds, moe_layers)))
  if all(moe_layers):
    blocks = dict(blocks='all')
  elif not any(moe_layers):
    blocks = dict(blocks='none')
  else:
    blocks = dict(blocks='cycle', cycle_positions=tuple(j for j, (_, is_moe) in enumerate(unit) if is_moe))
  return dict(cycle=tuple(kind for kind, _ in unit)), blocks


def _experts(hf: dict, count_field: str, width_field: str) -> dict:
  """model.moe's expert count, top-k and expert width."""
  experts = positive_int(hf, count_field)
  top_k = positive_int(hf, 'num_experts_per_tok')
  if top_k > experts:
    refuse('num_experts_per_tok', top_k, f'at most {count_field}={experts}')
  return dict(num_experts=experts, top_k=top_k, expert_d_ff=positive_int(hf, width_field))


def _qwen_moe(hf: dict, renormalise: bool) -> dict:
  """model.moe of the Qwen MoE blocks: softmax over all experts, the top k (renormalised or not), SwiGLU experts,
  one shared SwiGLU expert scaled by sigmoid(x . w)."""
  return dict(**_experts(hf, 'num_experts', 'moe_intermediate_size'), router='softmax_topk',
              norm_topk_prob=renormalise, activation='swiglu', shared_experts=1,
              shared_d_ff=positive_int(hf, 'shared_expert_intermediate_size'), shared_expert_gate=True)


def _qwen3_5_moe_plan(hf):
  """Qwen3.5-MoE: dense Qwen3.5 with every block's MLP an MoE (always renormalised: the class has no
  norm_topk_prob)."""
  fields, tied = _qwen3_5_plan(hf, d_ff=positive_int(hf, 'moe_intermediate_size'))
  fields['moe'] = dict(blocks='all', **_qwen_moe(hf, True))
  return fields, tied


def _qwen3_next_plan(hf):
  """Qwen3-Next: Qwen3.5's layers; block i's MLP is an MoE unless i is in mlp_only_layers, there are no experts or
  (i + 1) is not a multiple of decoder_sparse_step, else a SwiGLU of width intermediate_size."""
  fields, tied = _qwen3_5_plan(hf)
  n = fields['num_layers']
  only = hf.get('mlp_only_layers') or []
  if not isinstance(only, (list, tuple)) or any(isinstance(j, bool) or not isinstance(j, int) for j in only):
    refuse('mlp_only_layers', only, 'a list of layer indices')
  step = positive_int(hf, 'decoder_sparse_step', 1)
  experts = hf.get('num_experts', 0)
  moe_layers = [bool(experts) and i not in only and (i + 1) % step == 0 for i in range(n)]
  unit = fields['cycle']
  cycle, blocks = _moe_layout([unit[i % len(unit)] for i in range(n)], moe_layers)
  fields.update(cycle)
  if any(moe_layers):
    fields['moe'] = dict(**blocks, **_qwen_moe(hf, bool(hf.get('norm_topk_prob', True))))
  return fields, tied


def _olmo_hybrid_plan(hf):
  _no_bias(hf, 'attention_bias')
  _silu(hf, 'hidden_act')
  n = positive_int(hf, 'num_hidden_layers')
  if 'layer_types' in hf:
    kinds = _layer_list(hf, 'layer_types', _GDN_TYPES, n)
  else:
    kinds = ['full' if i % 4 == 3 else 'gdn' for i in range(n)]
    if 'full' not in kinds:
      kinds[-1] = 'full'
  theta, factor = _rope(hf)
  heads = positive_int(hf, 'num_attention_heads')
  key_heads = positive_int(hf, 'linear_num_key_heads', heads)
  value_heads = positive_int(hf, 'linear_num_value_heads', heads)
  if value_heads % key_heads:
    refuse('linear_num_value_heads', value_heads, f'a multiple of linear_num_key_heads={key_heads}')
  key_dim = positive_int(hf, 'linear_key_head_dim', int(0.75 * hf['hidden_size'] / key_heads))
  fields = _common(hf, kinds)
  fields.update(rope_full=theta is not None,
                attention=dict(qk_norm='all', post_norm=True, rope_dims=_rope_dims(fields['head_dim'], factor)),
                gdn=dict(num_heads=key_heads, value_heads=0 if value_heads == key_heads else value_heads,
                         key_dim=key_dim, value_dim=positive_int(hf, 'linear_value_head_dim', 2 * key_dim),
                         conv_width=positive_int(hf, 'linear_conv_kernel_dim', 4),
                         neg_eigval=bool(hf.get('linear_allow_neg_eigval', True)), norm_eps=1e-5))
  if theta is not None:
    fields['rope_base'] = float(theta)
  return fields, bool(hf.get('tie_word_embeddings', False))


def _olmo_hybrid_rules(model_cfg, spec, i):
  # On disk (save_pretrained), input_layernorm is attention_layer_norm and post_attention_layernorm is
  # feedforward_layer_norm, in every layer; an attention layer has no input norm (its block is post-norm).
  p = f'model.layers.{i}.'
  rules = [*swiglu_rules(p + 'mlp.')]
  if spec.kind == 'full':
    return rules + [*block_norm_rules(p, 'feedforward_layer_norm', 'post_feedforward_layernorm'),
                    *attention_rules(p + 'self_attn.', dict(qk_norm='all'))]
  a = p + 'linear_attn.'
  m = lambda name: ('mixer', name)
  return rules + [
      *block_norm_rules(p, 'attention_layer_norm', 'feedforward_layer_norm'),
      Rule(a + 'q_proj.weight', ((m('wq'), HEADS_IN),)), Rule(a + 'k_proj.weight', ((m('wk'), HEADS_IN),)),
      Rule(a + 'v_proj.weight', ((m('wv'), HEADS_IN),)), Rule(a + 'g_proj.weight', ((m('wg'), HEADS_IN),)),
      Rule(a + 'b_proj.weight', ((m('w_beta'), TRANSPOSE),)), Rule(a + 'a_proj.weight', ((m('w_a'), TRANSPOSE),)),
      # One fused depthwise conv over [q | k | v] (transformers' conv1d), stored as three tensors: cut at the q / k / v
      # widths in released checkpoints, into near-equal thirds by transformers' save_pretrained.
      Rule(a + 'conv1d.weight', ((m('conv_q'), CONV), (m('conv_k'), CONV), (m('conv_v'), CONV)),
           stored=tuple(a + f'{part}_conv1d.weight' for part in 'qkv')),
      Rule(a + 'A_log', ((m('A_log'), SAME),)), Rule(a + 'dt_bias', ((m('dt_bias'), SAME),)),
      Rule(a + 'o_norm.weight', ((m('norm'), SAME),)), Rule(a + 'o_proj.weight', ((m('wo'), HEADS_OUT),))]


_NEMOTRON_PATTERN = {'M': 'linear_attention', '*': 'full_attention', '-': 'mlp', 'E': 'moe'}
_NEMOTRON_TYPES = {'linear_attention': 'mamba2', 'full_attention': 'full', 'mlp': 'mlp', 'moe': 'moe'}
_NEMOTRON_EXPERTS = (Stacking('up_proj', ('up_proj.weight',)), Stacking('down_proj', ('down_proj.weight',)))


def _nemotron_h_moe(hf: dict) -> dict:
  """model.moe of Nemotron-H's 'E' layers: sigmoid scores, the selection bias (e_score_correction_bias) and grouped
  top-k choose, the unbiased scores weigh (renormalised with norm_topk_prob, times routed_scaling_factor);
  squared-ReLU experts and an ungated shared expert of width moe_shared_expert_intermediate_size."""
  if hf.get('moe_latent_size') is not None:
    refuse('moe_latent_size', hf['moe_latent_size'], 'LatentMoE (experts in a projected latent space: '
           'fc1_latent_proj / fc2_latent_proj) is not supported; null is')
  shared = hf.get('moe_shared_expert_intermediate_size', 7688)
  if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
    refuse('moe_shared_expert_intermediate_size', shared, 'a width >= 0')
  return dict(blocks='none', **_experts({'n_routed_experts': 8, 'num_experts_per_tok': 2,
                                         'moe_intermediate_size': 7688, **hf},
                                        'n_routed_experts', 'moe_intermediate_size'),
              router='sigmoid', norm_topk_prob=bool(hf.get('norm_topk_prob', True)),
              n_group=positive_int(hf, 'n_group', 1), topk_group=positive_int(hf, 'topk_group', 1),
              routed_scaling_factor=positive_number(hf, 'routed_scaling_factor', 1.0), activation='relu2',
              shared_experts=1 if shared else 0, shared_d_ff=shared)


def _nemotron_h_plan(hf):
  if 'layers_block_type' in hf:
    kinds = _layer_list(hf, 'layers_block_type', _NEMOTRON_TYPES, None)
  else:
    pattern = hf.get('hybrid_override_pattern')
    if not isinstance(pattern, str) or set(pattern) - set(_NEMOTRON_PATTERN):
      refuse('hybrid_override_pattern', pattern, 'a string of M, *, -, E')
    kinds = _layer_list({'layers_block_type': [_NEMOTRON_PATTERN[c] for c in pattern]}, 'layers_block_type',
                        _NEMOTRON_TYPES, None)
  if hf.get('mlp_hidden_act', 'relu2') != 'relu2':
    refuse('mlp_hidden_act', hf['mlp_hidden_act'], "Nemotron-H's MLP is squared ReLU ('relu2')")
  _silu(hf, 'mamba_hidden_act')
  _no_bias(hf, 'use_bias', 'mlp_bias')
  fields = _common(hf, kinds, head_dim=positive_int(hf, 'head_dim', 128), eps_field='layer_norm_epsilon', eps=1e-5)
  fields.update(block_mlp=False, mlp='relu2', rope_full=False,
                mamba2=dict(num_heads=positive_int(hf, 'mamba_num_heads', 128),
                            head_dim=positive_int(hf, 'mamba_head_dim', 64),
                            state_dim=positive_int(hf, 'ssm_state_size', 128),
                            num_groups=positive_int(hf, 'n_groups', 8), conv_width=positive_int(hf, 'conv_kernel', 4),
                            conv_bias=bool(hf.get('use_conv_bias', True)), norm_by_group=True,
                            dt_floor=float(hf.get('time_step_min', 0.001))))
  if 'moe' in kinds:
    fields['moe'] = _nemotron_h_moe(hf)
  return fields, False  # NemotronH never ties its head.


def _nemotron_h_rules(model_cfg, spec, i):
  p = f'model.layers.{i}.'
  rules = [Rule(p + 'norm.weight', ((('mixer_norm', 'scale'), SAME),))]
  if spec.kind == 'mamba2':
    return rules + mamba_rules(p + 'mixer.', bool(model_cfg.mamba2.conv_bias))
  if spec.kind == 'mlp':
    return rules + [Rule(p + 'mixer.up_proj.weight', ((('mixer', 'mlp', 'up'), TRANSPOSE),)),
                    Rule(p + 'mixer.down_proj.weight', ((('mixer', 'mlp', 'down'), TRANSPOSE),))]
  if spec.kind == 'moe':
    q = p + 'mixer.'
    return rules + [*moe_rules(('mixer', 'moe'), q + 'gate.weight', q + 'experts.down_proj', up=q + 'experts.up_proj',
                               router_bias=q + 'gate.e_score_correction_bias'),
                    *(shared_expert_rules(('mixer', 'moe'), q + 'shared_experts.', gate=None)
                      if model_cfg.moe.shared_experts else [])]
  return rules + attention_rules(p + 'mixer.', {})


def _bamba_plan(hf):
  _no_bias(hf, 'attention_bias', 'mlp_bias')
  _silu(hf, 'hidden_act')
  n = positive_int(hf, 'num_hidden_layers')
  indices = hf.get('attn_layer_indices') or []
  if not isinstance(indices, (list, tuple)) or any(not isinstance(j, int) or not 0 <= j < n for j in indices):
    refuse('attn_layer_indices', indices, f'layer indices in 0..{n - 1}')
  kinds = ['full' if i in indices else 'mamba2' for i in range(n)]
  theta, factor = _rope(hf, default_factor=0.5)
  fields = _common(hf, kinds, eps=1e-5)
  fields.update(rope_base=float(theta), rope_full=True,
                attention=dict(rope_dims=_rope_dims(fields['head_dim'], factor)), mamba2=_mamba_expand_fields(hf))
  return fields, bool(hf.get('tie_word_embeddings', False))


def _bamba_rules(model_cfg, spec, i):
  p = f'model.layers.{i}.'
  rules = [*block_norm_rules(p, 'input_layernorm', 'pre_ff_layernorm'),
           *swiglu_rules(p + 'feed_forward.')]
  if spec.kind == 'mamba2':
    return rules + mamba_rules(p + 'mamba.', bool(model_cfg.mamba2.conv_bias))
  return rules + attention_rules(p + 'self_attn.', {})


_GRANITE_TYPES = {'linear_attention': 'mamba2', 'mamba': 'mamba2', 'full_attention': 'full', 'attention': 'full'}


def _granite_moe(hf: dict) -> dict:
  """model.moe of Granite-4.0-H with experts: the top k router logits, a softmax over them, SwiGLU experts of width
  intermediate_size, and the shared MLP (ungated) as the shared expert."""
  return dict(blocks='all', **_experts(hf, 'num_local_experts', 'intermediate_size'), router='topk_softmax',
              activation='swiglu', shared_experts=1, shared_d_ff=positive_int(hf, 'shared_intermediate_size', 1024))


def _granite_hybrid_plan(hf):
  experts = hf.get('num_local_experts', 8)  # transformers' default: a config.json without the field has experts.
  if isinstance(experts, bool) or not isinstance(experts, int) or experts < 0:
    refuse('num_local_experts', experts, 'a number of experts >= 0')
  _no_bias(hf, 'attention_bias')
  _silu(hf, 'hidden_act')
  n = positive_int(hf, 'num_hidden_layers')
  kinds = (_layer_list(hf, 'layer_types', _GRANITE_TYPES, n) if hf.get('layer_types') is not None
           else ['mamba2'] * n)
  fields = _common(hf, kinds, d_ff=positive_int(hf, 'shared_intermediate_size', 1024))
  rope = hf.get('position_embedding_type') == 'rope'
  if rope:
    theta, factor = _rope(hf)
    fields.update(rope_base=float(theta), attention=dict(rope_dims=_rope_dims(fields['head_dim'], factor)))
  scale = positive_number(hf, 'attention_multiplier', 1.0)
  fields.update(rope_full=rope, mamba2=_mamba_expand_fields(hf),
                embedding_multiplier=positive_number(hf, 'embedding_multiplier', 1.0),
                residual_multiplier=positive_number(hf, 'residual_multiplier', 1.0),
                logits_scaling=positive_number(hf, 'logits_scaling', 1.0),
                attention_scale=0.0 if scale == fields['head_dim'] ** -0.5 else scale)
  if experts:
    fields['moe'] = _granite_moe(hf)
  return fields, bool(hf.get('tie_word_embeddings', False))


def _granite_mlp_rules(spec, p):
  """Granite-4.0-H's MLP: the shared MLP alone (input_linear = gate rows, then up), or with experts the MoE whose
  shared expert it is (block_sparse_moe: router.layer, input_linear [E, 2I, H] gate then up, output_linear)."""
  if not spec.moe:
    return [Rule(p + 'shared_mlp.input_linear.weight', ((('mlp', 'gate'), TRANSPOSE), (('mlp', 'up'), TRANSPOSE))),
            Rule(p + 'shared_mlp.output_linear.weight', ((('mlp', 'down'), TRANSPOSE),))]
  q = p + 'block_sparse_moe.'
  return [*moe_rules(('mlp',), q + 'router.layer.weight', q + 'output_linear.weight',
                     gate_up=q + 'input_linear.weight'),
          *shared_expert_rules(('mlp',), p + 'shared_mlp.', gate_up='input_linear.weight',
                               down='output_linear.weight')]


def _granite_hybrid_rules(model_cfg, spec, i):
  p = f'model.layers.{i}.'
  rules = [*block_norm_rules(p, 'input_layernorm', 'post_attention_layernorm'), *_granite_mlp_rules(spec, p)]
  if spec.kind == 'mamba2':
    return rules + mamba_rules(p + 'mamba.', bool(model_cfg.mamba2.conv_bias))
  return rules + attention_rules(p + 'self_attn.', {})


_GPT_OSS_TYPES = {'sliding_attention': 'swa', 'full_attention': 'full'}
# transformers' GptOssConfig when config.json gives no rope_parameters (the released models' YaRN).
_GPT_OSS_ROPE = {'rope_type': 'yarn', 'factor': 32.0, 'beta_fast': 32.0, 'beta_slow': 1.0, 'truncate': False,
                 'original_max_position_embeddings': 4096}


def _yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
  return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _gpt_oss_rope(hf: dict) -> tuple[float, dict]:
  """(RoPE base, model.attention's RoPE keys) of gpt-oss' rope_parameters (or the older rope_scaling + rope_theta):
  YaRN (transformers' _compute_yarn_parameters) or plain RoPE, over the whole head."""
  params = hf.get('rope_parameters') or hf.get('rope_scaling') or _GPT_OSS_ROPE
  field = 'rope_parameters' if hf.get('rope_parameters') else 'rope_scaling'
  theta = params.get('rope_theta', hf.get('rope_theta', 150000.0))
  if not isinstance(theta, (int, float)) or isinstance(theta, bool) or not theta > 1:
    refuse(f'{field}.rope_theta', theta, 'a RoPE base > 1')
  if params.get('partial_rotary_factor', hf.get('partial_rotary_factor', 1.0)) != 1.0:
    refuse('partial_rotary_factor', params.get('partial_rotary_factor', hf.get('partial_rotary_factor')),
           "gpt-oss' RoPE rotates the whole head (1.0)")
  kind = params.get('rope_type', params.get('type', 'default'))
  if kind == 'default':
    return float(theta), {}
  if kind != 'yarn':
    refuse(f'{field}.rope_type', kind, "'yarn' or 'default' RoPE")
  original = params.get('original_max_position_embeddings')
  if isinstance(original, bool) or not isinstance(original, int) or original <= 0:
    refuse(f'{field}.original_max_position_embeddings', original, 'a positive integer')
  factor = params.get('factor')
  if factor is None:  # transformers: the ratio of the two context lengths.
    factor = positive_int(hf, 'max_position_embeddings') / original
  factor = positive_number({'factor': factor}, 'factor')
  beta_fast, beta_slow = float(params.get('beta_fast') or 32), float(params.get('beta_slow') or 1)
  if not 0 < beta_slow < beta_fast:
    refuse(f'{field}.beta_fast', beta_fast, f'above beta_slow={beta_slow} > 0')
  attention_factor = params.get('attention_factor')
  mscale, mscale_all_dim = params.get('mscale'), params.get('mscale_all_dim')
  if attention_factor is None:
    attention_factor = (_yarn_get_mscale(factor, mscale) / _yarn_get_mscale(factor, mscale_all_dim)
                        if mscale and mscale_all_dim else 0.0)  # 0: 1 + 0.1 ln(factor), YaRN's.
  elif not isinstance(attention_factor, (int, float)) or not attention_factor > 0:
    refuse(f'{field}.attention_factor', attention_factor, 'a number > 0')
  return float(theta), dict(rope_scaling='yarn', yarn_factor=factor, yarn_original_positions=original,
                            yarn_beta_fast=beta_fast, yarn_beta_slow=beta_slow,
                            yarn_truncate=bool(params.get('truncate', True)),
                            yarn_attention_factor=float(attention_factor))


def _gpt_oss_plan(hf):
  """gpt-oss: sliding-window and full attention layers (layer_types) with learned sinks, q/k/v/o biases and YaRN
  RoPE; every block's MLP an MoE: router logits with a bias, the top k, a softmax over them; experts with biases
  and the clamped SwiGLU (swiglu_oai)."""
  if hf.get('quantization_config'):
    refuse('quantization_config', hf['quantization_config'].get('quant_method', hf['quantization_config'])
           if isinstance(hf['quantization_config'], dict) else hf['quantization_config'],
           'quantized experts (MXFP4 _blocks / _scales) are not read; dequantize the checkpoint first '
           '(transformers: Mxfp4Config(dequantize=True), then save_pretrained)')
  hf = {'num_local_experts': 128, 'num_experts_per_tok': 4, 'head_dim': 64, 'rms_norm_eps': 1e-5, **hf}
  n = positive_int(hf, 'num_hidden_layers')
  kinds = (_layer_list(hf, 'layer_types', _GPT_OSS_TYPES, n) if hf.get('layer_types') is not None
           else ['swa' if (i + 1) % 2 else 'full' for i in range(n)])
  theta, rope_fields = _gpt_oss_rope(hf)
  fields = _common(hf, kinds, head_dim=positive_int(hf, 'head_dim'))
  if 'swa' in kinds:
    fields['window'] = positive_int({'sliding_window': 128, **hf}, 'sliding_window')
  fields.update(rope_base=theta, rope_full=True, rope_swa=True, attention_sinks=True,
                attention=dict(bias=bool(hf.get('attention_bias', True)), **rope_fields),
                moe=dict(blocks='all', **_experts(hf, 'num_local_experts', 'intermediate_size'), router='topk_softmax',
                         router_logit_bias=True, activation='swiglu_oai',
                         swiglu_limit=positive_number(hf, 'swiglu_limit', 7.0),
                         swiglu_alpha=positive_number(hf, 'swiglu_alpha', 1.702)))
  return fields, bool(hf.get('tie_word_embeddings', False))


def _gpt_oss_rules(model_cfg, spec, i):
  p = f'model.layers.{i}.'
  a = p + 'self_attn.'
  return [*block_norm_rules(p, 'input_layernorm', 'post_attention_layernorm'), *attention_rules(a, {}),
          *(attention_bias_rules(a) if model_cfg.attention.bias else []),
          Rule(a + 'sinks', ((('mixer', 'sinks'), SAME),)), *transposed_expert_rules(('mlp',), p + 'mlp.')]


_MINIMAX_TYPES = {'linear_attention': 'lightning', 'full_attention': 'full'}
# transformers' MiniMaxConfig field -> the remote-code (MiniMax-Text-01) config's name of it.
_MINIMAX_FACTORS = {'linear_attn_alpha_factor': 'layernorm_linear_attention_alpha',
                    'linear_attn_beta_factor': 'layernorm_linear_attention_beta',
                    'full_attn_alpha_factor': 'layernorm_full_attention_alpha',
                    'full_attn_beta_factor': 'layernorm_full_attention_beta',
                    'mlp_alpha_factor': 'layernorm_mlp_alpha', 'mlp_beta_factor': 'layernorm_mlp_beta'}


def _minimax_factor(hf: dict, field: str) -> float:
  value = hf.get(field, hf.get(_MINIMAX_FACTORS[field], 1))
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    refuse(field, value, 'a finite number')
  return float(value)


def _minimax_plan(hf):
  """MiniMax-Text-01: Lightning layers and softmax attention (layer_types, or the remote code's attn_type_list of
  0 = Lightning, 1 = softmax); every block is n = norm(x), h = alpha * n + beta * mixer(n), then the same with the
  MoE (softmax over all experts, the top k renormalised, SwiGLU experts)."""
  _silu(hf, 'hidden_act')
  if hf.get('postnorm') is False:
    refuse('postnorm', False, "MiniMax's blocks carry the normed residual (postnorm true); the plain residual with "
           'alpha / beta factors has no hybrid_jax block')
  n = positive_int(hf, 'num_hidden_layers')
  if hf.get('layer_types') is not None:
    kinds = _layer_list(hf, 'layer_types', _MINIMAX_TYPES, n)
  elif hf.get('attn_type_list') is not None:
    kinds = _layer_list({'attn_type_list': [{0: 'linear_attention', 1: 'full_attention'}.get(t, t)
                                            for t in hf['attn_type_list']]}, 'attn_type_list', _MINIMAX_TYPES, n)
  else:  # transformers' default: softmax on even layers.
    kinds = ['full' if (i + 1) % 2 else 'lightning' for i in range(n)]
  heads = positive_int(hf, 'num_attention_heads')
  head_dim = hf.get('head_dim') or positive_int(hf, 'hidden_size') // heads
  if hf.get('rotary_dim') not in (None, head_dim):
    refuse('rotary_dim', hf['rotary_dim'], f"transformers' MiniMax rotates the whole head ({head_dim})")
  theta, factor = rope(hf, 1.0, default_theta=1000000.0)
  if factor != 1.0:
    refuse('partial_rotary_factor', factor, "transformers' MiniMax rotates the whole head (1.0)")
  window = hf.get('sliding_window')
  if window is not None:  # transformers gives every softmax layer the window.
    kinds = ['swa' if k == 'full' else k for k in kinds]
  fields = _common(hf, kinds, head_dim=head_dim, eps=1e-5)
  if window is not None:
    fields['window'] = positive_int(hf, 'sliding_window')
  factors = {f: _minimax_factor(hf, f) for f in _MINIMAX_FACTORS}
  fields.update(
      rope_base=float(theta), rope_full=True, rope_swa=True, scan_layers=False,
      recurrent_chunk_size=positive_int(hf, 'block_size', 256),  # Its prefill's blocks: the scan's chunks.
      attention=dict(normed_residual=(factors['full_attn_alpha_factor'], factors['full_attn_beta_factor'])),
      lightning=dict(num_heads=heads, key_dim=head_dim, value_dim=head_dim, decay_rates='closed_form',
                     layer_decay=True, layer_decay_eps=1e-5, scale=1.0, norm='all', norm_eps=1e-6,
                     normed_residual=(factors['linear_attn_alpha_factor'], factors['linear_attn_beta_factor'])),
      moe=dict(blocks='all', **_experts({'num_local_experts': 8, 'num_experts_per_tok': 2, **hf}, 'num_local_experts',
                                        'intermediate_size'),
               router='softmax_topk', norm_topk_prob=True, activation='swiglu',
               normed_residual=(factors['mlp_alpha_factor'], factors['mlp_beta_factor'])))
  return fields, bool(hf.get('tie_word_embeddings', False))


def _minimax_rules(model_cfg, spec, i):
  p = f'model.layers.{i}.'
  a, q = p + 'self_attn.', p + 'block_sparse_moe.'
  m = lambda name: ('mixer', name)
  rules = [*block_norm_rules(p, 'input_layernorm', 'post_attention_layernorm'),
           *moe_rules(('mlp',), q + 'gate.weight', q + 'experts.down_proj', gate_up=q + 'experts.gate_up_proj')]
  if spec.kind != 'lightning':
    return rules + attention_rules(a, {})
  return rules + [  # qkv_proj: per head [q | k | v], head_dim rows each.
      Rule(a + 'qkv_proj.weight', ((m('wq'), HEADS_IN), (m('wk'), HEADS_IN), (m('wv'), HEADS_IN)), interleave=3),
      Rule(a + 'output_gate.weight', ((m('wg'), HEADS_IN),)), Rule(a + 'norm.weight', ((m('norm'), FLAT),)),
      Rule(a + 'out_proj.weight', ((m('wo'), HEADS_OUT),))]


def _minimax_decays(model_cfg, spec, i) -> dict:
  """A Lightning layer's decay buffers as MiniMax's checkpoints store them (slope_rate [H, 1, 1]: its rates;
  query_decay / key_decay [H, B, 1] and diagonal_decay [1, H, B, B] for its prefill blocks of B = block_size), from
  the rates the layer computes."""
  if spec.kind != 'lightning':
    return {}
  lc, block = model_cfg.lightning, int(model_cfg.recurrent_chunk_size)
  rate = np.asarray(lightning.decay_rates(int(lc.num_heads), lc.decay_rates)) * spec.option('decay_scale', 1.0)
  rate = rate[:, None, None]
  steps = np.arange(1, block + 1, dtype=np.float64)
  gap = steps[:, None] - steps[None, :]
  a = f'model.layers.{i}.self_attn.'
  return {a + 'slope_rate': rate, a + 'query_decay': np.exp(-rate * steps[:, None]),
          a + 'key_decay': np.exp(-rate * (block - steps[:, None])),
          a + 'diagonal_decay': np.where(gap >= 0, np.exp(-rate * np.maximum(gap, 0)), 0.0)[None]}


_TOP = {'embed': 'model.embed_tokens.weight', 'final_norm': 'model.norm.weight', 'lm_head': 'lm_head.weight'}
FAMILIES = {f.model_type: f for f in (
    # Hub checkpoints are Qwen3.5's vision-language model: its text model under model.language_model.
    Family('qwen3_5_text', 'Qwen3_5ForCausalLM', _qwen3_5_plan, _qwen3_5_rules, _TOP,
           prefixes=('model.language_model.', 'model.'), ignored=('model.visual.', 'mtp.'), zero_centred=True),
    Family('olmo_hybrid', 'OlmoHybridForCausalLM', _olmo_hybrid_plan, _olmo_hybrid_rules, _TOP),
    Family('nemotron_h', 'NemotronHForCausalLM', _nemotron_h_plan, _nemotron_h_rules,
           {'embed': 'model.embeddings.weight', 'final_norm': 'model.norm_f.weight', 'lm_head': 'lm_head.weight'},
           prefixes=('backbone.', 'model.'), ignored=('mtp.',), per_expert=_NEMOTRON_EXPERTS, export_per_expert=True),
    Family('bamba', 'BambaForCausalLM', _bamba_plan, _bamba_rules,
           {**_TOP, 'final_norm': 'model.final_layernorm.weight'}),
    Family('granitemoehybrid', 'GraniteMoeHybridForCausalLM', _granite_hybrid_plan, _granite_hybrid_rules, _TOP),
)}
# Experts stored one tensor each (per expert: gate, up, down Linear weights), read stacked as the fused layout.
_QWEN_EXPERTS = (Stacking('gate_up_proj', ('gate_proj.weight', 'up_proj.weight')),
                 Stacking('down_proj', ('down_proj.weight',)))
_MINIMAX_EXPERTS = (Stacking('gate_up_proj', ('w1.weight', 'w3.weight')), Stacking('down_proj', ('w2.weight',)))
# The families whose classes always have experts (Nemotron-H and Granite-4.0-H, above, may).
MOE_FAMILIES = {f.model_type: f for f in (
    Family('qwen3_5_moe_text', 'Qwen3_5MoeForCausalLM', _qwen3_5_moe_plan, _qwen3_5_rules, _TOP,
           prefixes=('model.language_model.', 'model.'), ignored=('model.visual.', 'mtp.'), zero_centred=True,
           per_expert=_QWEN_EXPERTS),
    Family('qwen3_next', 'Qwen3NextForCausalLM', _qwen3_next_plan, _qwen3_next_rules, _TOP, ignored=('mtp.',),
           zero_centred=True, per_expert=_QWEN_EXPERTS, export_per_expert=True),
    Family('gpt_oss', 'GptOssForCausalLM', _gpt_oss_plan, _gpt_oss_rules, _TOP),
    # transformers' MiniMax class keeps its MoE under mlp. (mlp.gate, stacked mlp.experts.gate_up_proj = [w1; w3]);
    # MiniMax's releases store block_sparse_moe.gate and one w1 / w2 / w3 per expert: both read.
    Family('minimax', 'MiniMaxForCausalLM', _minimax_plan, _minimax_rules, _TOP, per_expert=_MINIMAX_EXPERTS,
           export_per_expert=True, aliases=(('.mlp.', '.block_sparse_moe.'),), derived=_minimax_decays),
)}
# Vision-language wrappers: model_type -> its text model's (config.json's text_config; tensors under
# model.language_model.).
_TEXT_MODELS = {'qwen3_5': 'qwen3_5_text', 'qwen3_5_moe': 'qwen3_5_moe_text'}


def family(model_type) -> Family | None:
  """The family that imports `model_type` (dense or MoE), or None."""
  return FAMILIES.get(model_type) or MOE_FAMILIES.get(model_type)


def text_config(hf: dict) -> dict:
  """The text model's config of a vision-language checkpoint (Qwen3.5's `qwen3_5`, Qwen3.5-MoE's `qwen3_5_moe`:
  `text_config`), else `hf`."""
  text = hf.get('text_config')
  if hf.get('model_type') in _TEXT_MODELS and isinstance(text, dict):
    return {'tie_word_embeddings': hf.get('tie_word_embeddings', False), **text,
            'model_type': _TEXT_MODELS[hf['model_type']]}
  return hf


def top_rules(family: Family) -> list[Rule]:
  return [Rule(family.top['embed'], ((('embed',), SAME),)),
          Rule(family.top['final_norm'], ((('final_norm', 'scale'), ZERO_CENTRED if family.zero_centred else SAME),)),
          Rule(family.top['lm_head'], ((('lm_head',), TRANSPOSE),))]
