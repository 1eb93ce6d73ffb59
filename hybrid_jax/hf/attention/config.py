"""Model config <-> transformers `config.json`, for attention-only hybrids.

Both sides are reduced to one layer plan: per layer, its attention window (None = full) and whether it uses RoPE.
A hybrid_jax model has one window for all SWA layers, one RoPE setting per layer kind and one RoPE base; a
transformers config that needs more than that (or any math this project's block lacks) is refused, naming the
field, before a single weight is read. Granite's scalings (embedding, residual and logit multipliers, attention
scale) map one to one onto the model options of the same meaning (`SCALING_FIELDS`); MiniCPM's (`scale_emb`,
`scale_depth`, `dim_model_base`, read from checkpoints with remote modeling code) are converted (`MINICPM_FIELDS`).
"""

import dataclasses
import math

from hybrid_jax.hf import HFError
from hybrid_jax.hf.fields import positive_int, positive_number, refuse, rope, shortest_cycle
from hybrid_jax.models import pattern
from hybrid_jax.models.mixers import registry

# model_type -> transformers class (import and export). Tensor names: weights.TABLES.
HF_CLASSES = {'llama': 'LlamaForCausalLM', 'mistral': 'MistralForCausalLM', 'smollm3': 'SmolLM3ForCausalLM',
              'granite_swa': 'GraniteSWAForCausalLM'}
# Import only: MiniCPM (1/2/4) loads through remote modeling code; its block is Llama's with three scalings.
IMPORT_TYPES = (*HF_CLASSES, 'minicpm')
# The recurrent hybrids, read by hybrid_jax.hf.families' rules.
FAMILY_TYPES = ('qwen3_5_text', 'olmo_hybrid', 'nemotron_h', 'bamba', 'granitemoehybrid')
# The mixture-of-experts families (Nemotron-H and Granite-4.0-H with experts are the types above).
MOE_FAMILY_TYPES = ('qwen3_5_moe_text', 'qwen3_next', 'gpt_oss', 'minimax')
# Released hybrids whose layers this project cannot compute, and what they lack.
UNREPRESENTABLE = {'kimi_linear': "Kimi Linear's KDA (Kimi delta attention) mixer and MLA (multi-head latent "
                                  'attention) layers have no hybrid_jax layer'}
EXPORTABLE_KINDS = ('full', 'swa')
_FULL, _SLIDING = 'full_attention', 'sliding_attention'
# transformers' defaults for keys a config.json may omit (they change the function, so they are never guessed).
_DEFAULTS = {
    'llama': dict(rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=10000.0),
    'mistral': dict(rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=10000.0, sliding_window=4096),
    'smollm3': dict(rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=2000000.0, sliding_window=None),
    'granite_swa': dict(rms_norm_eps=1e-5, tie_word_embeddings=True, rope_theta=10000.0, sliding_window=128,
                        embedding_multiplier=1.0, residual_multiplier=1.0, logits_scaling=1.0,
                        attention_multiplier=1.0),
    'minicpm': dict(rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=10000.0),  # PretrainedConfig's tie.
}
# MiniCPM config fields with no default here: their remote-code defaults are not assumed.
MINICPM_FIELDS = ('scale_emb', 'scale_depth', 'dim_model_base')
# hybrid_jax model field -> GraniteSWA config field of the same meaning, and the plain block's value.
SCALING_FIELDS = {'embedding_multiplier': ('embedding_multiplier', 1.0),
                  'residual_multiplier': ('residual_multiplier', 1.0), 'logits_scaling': ('logits_scaling', 1.0)}


@dataclasses.dataclass(frozen=True)
class Layer:
  """One attention layer of the plan: window (None = full causal) and RoPE on or off (off = NoPE)."""
  window: int | None
  rope: bool


@dataclasses.dataclass(frozen=True)
class ImportPlan:
  """What a transformers checkpoint becomes: hybrid_jax model fields, and how to read its weights."""
  model_type: str
  model_fields: dict
  tied: bool  # lm_head is the embedding (tie_word_embeddings): hybrid_jax's untied head gets a copy.
  # Tensors of parts outside the language model (a vision tower, multi-token prediction), left out on purpose.
  ignored: tuple = ()


# ---------------------------------------------------------------------------------------------------- export
def layer_plan(model_cfg) -> list[Layer]:
  """The plan of a hybrid_jax model; refuses mixers that no transformers class holds."""
  plan = []
  for i in range(model_cfg.num_layers):
    spec = pattern.layer_spec(model_cfg, i)
    if spec.kind not in EXPORTABLE_KINDS:
      why = ('SWA and full heads inside one layer' if spec.kind == 'headwise'
             else 'attention of another kind' if registry.get(spec.kind).attention else 'not attention')
      raise HFError(f'layer {i} is a {spec.kind!r} mixer ({why}), which the attention classes do not express; '
                    f'they hold {", ".join(EXPORTABLE_KINDS)} layers, and the released hybrids '
                    f'({", ".join(FAMILY_TYPES)}) gdn, mamba2 and mlp layers beside full attention '
                    f'(model.cycle={tuple(model_cfg.cycle)})')
    plan.append(Layer(spec.window, spec.rope))
  _refuse_attention_variants(model_cfg)
  return plan


def _refuse_attention_variants(model_cfg):
  """HFError naming the first model.attention option away from its default (the plain block's attention): none of
  these classes has it (the families' classes have some: hybrid_jax.hf.families)."""
  for name, field in registry.get('full').fields.items():
    value = model_cfg.attention.get(name, field.default)
    plain = tuple(value) == tuple(field.default) if isinstance(field.default, tuple) else value == field.default
    if name != 'max_documents' and not plain:
      raise HFError(f'the model sets model.attention.{name}={value!r}, which {", ".join(HF_CLASSES)} do not compute '
                    f'(their attention is the plain block\'s); a family may: {", ".join(FAMILY_TYPES)}, '
                    f'{", ".join(MOE_FAMILY_TYPES)}')


def granite_options(model_cfg) -> list[str]:
  """The model's options that only GraniteSWA expresses: scalings off the plain block, learned sinks."""
  changed = [field for field, (_, plain) in SCALING_FIELDS.items() if float(model_cfg[field]) != plain]
  return (changed + (['attention_scale'] if model_cfg.attention_scale else [])
          + (['attention_sinks'] if model_cfg.attention_sinks else []))


def auto_arch(plan: list[Layer], granite: bool = False) -> str:
  """The plainest class that holds the plan: Llama (full + RoPE), Mistral (SWA + RoPE everywhere), else SmolLM3;
  GraniteSWA whenever the model has scalings or sinks (`granite`)."""
  if granite:
    return 'granite_swa'
  if all(layer.rope for layer in plan):
    if all(layer.window is None for layer in plan):
      return 'llama'
    if all(layer.window is not None for layer in plan):
      return 'mistral'
  return 'smollm3'


def _check_expressible(arch: str, plan: list[Layer], scaled: list[str]):
  if arch not in HF_CLASSES:
    raise HFError(f'--arch={arch!r} is not a supported transformers architecture; choose auto or one of '
                  f'{", ".join(HF_CLASSES)}')
  if arch != 'granite_swa' and scaled:
    raise HFError(f'--arch={arch} has no embedding/residual/logit multipliers, attention scale or sinks, but the '
                  f'model sets model.{", model.".join(scaled)}; use granite_swa')
  if arch in ('llama', 'mistral'):
    nope = [i for i, layer in enumerate(plan) if not layer.rope]
    if nope:
      raise HFError(f'--arch={arch} has RoPE on every layer, but layers {nope} are NoPE; use smollm3 or granite_swa')
  if arch == 'llama' and any(layer.window is not None for layer in plan):
    raise HFError('--arch=llama has no sliding windows, but the model has SWA layers; use mistral, smollm3 or '
                  'granite_swa')
  if arch == 'mistral' and any(layer.window is None for layer in plan) and any(layer.window for layer in plan):
    raise HFError('--arch=mistral gives every layer the same window, but the model mixes SWA and full layers; use '
                  'smollm3 or granite_swa')


def to_hf_config(model_cfg, arch: str = 'auto', *, max_positions: int, eos_id: int | None = None) -> dict:
  """The transformers config.json (a dict) of a hybrid_jax model; `arch` 'auto' picks with `auto_arch`.

  `eos_id`: the run tokenizer's end-of-document id (generation stops there); None when unknown.
  """
  plan = layer_plan(model_cfg)
  scaled = granite_options(model_cfg)
  arch = auto_arch(plan, bool(scaled)) if arch == 'auto' else arch
  _check_expressible(arch, plan, scaled)
  windows = {layer.window for layer in plan if layer.window is not None}
  window = windows.pop() if windows else None
  hf = dict(
      architectures=[HF_CLASSES[arch]], model_type=arch, vocab_size=model_cfg.vocab_size,
      hidden_size=model_cfg.d_model, intermediate_size=model_cfg.d_ff, num_hidden_layers=model_cfg.num_layers,
      num_attention_heads=model_cfg.num_heads, num_key_value_heads=model_cfg.num_kv_heads,
      head_dim=model_cfg.head_dim, hidden_act='silu', rms_norm_eps=model_cfg.norm_eps,
      max_position_embeddings=max_positions, tie_word_embeddings=False, attention_bias=False,
      rope_parameters={'rope_type': 'default', 'rope_theta': float(model_cfg.rope_base)},
      bos_token_id=None, eos_token_id=eos_id, pad_token_id=None, dtype='float32')
  layer_types = [_FULL if layer.window is None else _SLIDING for layer in plan]
  if arch == 'llama':
    hf.update(mlp_bias=False)
  elif arch == 'mistral':
    hf.update(sliding_window=window)
  elif arch == 'smollm3':
    hf.update(mlp_bias=False, use_sliding_window=window is not None, sliding_window=window, layer_types=layer_types,
              no_rope_layers=[int(layer.rope) for layer in plan])
  else:  # granite_swa: the model's scalings; -inf sinks make its attention the plain softmax.
    hf.update(mlp_bias=False, sliding_window=window, layer_types=layer_types,
              layer_rope_theta=[float(model_cfg.rope_base) if layer.rope else 0.0 for layer in plan],
              attention_multiplier=float(model_cfg.attention_scale) or model_cfg.head_dim ** -0.5,
              **{hf_field: float(model_cfg[field]) for field, (hf_field, _) in SCALING_FIELDS.items()})
  return hf


# ---------------------------------------------------------------------------------------------------- import
def _rope_theta(hf: dict) -> float | None:
  """The RoPE base of a default (unscaled) rotary embedding; refuses scaled or partial RoPE."""
  theta, factor = rope(hf)
  if factor != 1.0:
    refuse('partial_rotary_factor', factor, 'RoPE must rotate the whole head (1.0)')
  return theta


def _hf_layers(hf: dict, model_type: str, theta: float | None) -> tuple[list[Layer], float | None]:
  """The layer plan a transformers config describes, and its single RoPE base."""
  n = hf['num_hidden_layers']
  if model_type in ('llama', 'minicpm'):
    return [Layer(None, True)] * n, theta
  if model_type == 'mistral':
    return [Layer(hf.get('sliding_window'), True)] * n, theta
  types = hf.get('layer_types')
  if types is not None and len(types) != n:
    refuse('layer_types', types, f'one entry per layer ({n})')
  if types is not None and set(types) - {_FULL, _SLIDING}:
    refuse('layer_types', types, f'entries must be {_FULL!r} or {_SLIDING!r}')
  if model_type == 'smollm3':
    use_window = bool(hf.get('use_sliding_window')) and hf.get('sliding_window') is not None
    rope = hf.get('no_rope_layers') or [int((i + 1) % hf.get('no_rope_layer_interval', 4) != 0) for i in range(n)]
    if len(rope) != n:
      refuse('no_rope_layers', rope, f'one entry per layer ({n})')
    # Without layer_types, transformers makes the NoPE layers the sliding ones (when windows are on).
    types = types or [_SLIDING if use_window and not r else _FULL for r in rope]
    windows = [hf['sliding_window'] if use_window and t == _SLIDING else None for t in types]
    return [Layer(w, bool(r)) for w, r in zip(windows, rope)], theta
  # granite_swa: per-layer theta, 0 = NoPE.
  types = types or [_FULL if i % 4 == 0 else _SLIDING for i in range(n)]
  thetas = hf.get('layer_rope_theta') or [theta] * n
  nonzero = sorted({t for t in thetas if t})
  if len(nonzero) > 1:
    refuse('layer_rope_theta', thetas, 'hybrid_jax has one RoPE base for all RoPE layers (0 = NoPE is fine)')
  windows = [hf.get('sliding_window') if t == _SLIDING else None for t in types]
  return [Layer(w, bool(t)) for w, t in zip(windows, thetas)], (nonzero[0] if nonzero else theta)


def _scaling_fields(hf: dict, model_type: str, head_dim: int) -> dict:
  """hybrid_jax's scaling options (model.embedding_multiplier, ...) from a config's multipliers."""
  if model_type == 'minicpm':
    if hf.get('use_mup', True) is not True:
      refuse('use_mup', hf['use_mup'], "only MiniCPM's scaled block (use_mup true or absent) is supported")
    if hf.get('sparse_config'):
      refuse('sparse_config', hf['sparse_config'], 'attention is dense (no sparse attention)')
    if hf.get('kv_channels') not in (None, head_dim):
      refuse('kv_channels', hf['kv_channels'], f'heads are hidden_size / num_attention_heads = {head_dim} wide')
    emb, depth, base = (positive_number(hf, field) for field in MINICPM_FIELDS)
    return dict(embedding_multiplier=emb, residual_multiplier=depth / math.sqrt(hf['num_hidden_layers']),
                logits_scaling=hf['hidden_size'] / base, attention_scale=0.0)  # Attention: head_dim**-0.5.
  if model_type != 'granite_swa':
    return {}
  fields = {field: positive_number(hf, hf_field) for field, (hf_field, _) in SCALING_FIELDS.items()}
  scale = positive_number(hf, 'attention_multiplier')
  fields['attention_scale'] = 0.0 if scale == head_dim ** -0.5 else scale  # 0: the default path, same value.
  return fields


def _rope_flag(plan: list[Layer], is_kind, name: str) -> bool:
  flags = {layer.rope for layer in plan if is_kind(layer)}
  if len(flags) > 1:
    layers = [i for i, layer in enumerate(plan) if is_kind(layer) and not layer.rope]
    raise HFError(f'the {name} layers mix RoPE and NoPE (NoPE at layers {layers}); hybrid_jax has one RoPE '
                  f'setting per layer kind (model.rope_full, model.rope_swa)')
  return flags.pop() if flags else True


def plan_import(hf: dict) -> ImportPlan:
  """Checks a transformers config.json against what hybrid_jax represents; returns the model fields."""
  model_type = hf.get('model_type')
  if model_type in UNREPRESENTABLE:
    refuse('model_type', model_type, UNREPRESENTABLE[model_type])
  if model_type not in IMPORT_TYPES:
    refuse('model_type', model_type,
           f'supported model types: {", ".join(IMPORT_TYPES + FAMILY_TYPES + MOE_FAMILY_TYPES)}')
  hf = {**_DEFAULTS[model_type], **hf}
  for field in ('vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers', 'num_attention_heads'):
    positive_int(hf, field)
  act = hf.get('hidden_act', 'silu')
  if act != 'silu':
    refuse('hidden_act', act, "the MLP is SwiGLU ('silu')")
  for field in ('attention_bias', 'mlp_bias'):
    if hf.get(field):
      refuse(field, hf[field], 'projections have no biases')
  theta = _rope_theta(hf)
  plan, theta = _hf_layers(hf, model_type, theta)
  windows = sorted({layer.window for layer in plan if layer.window is not None})
  if len(windows) > 1:
    refuse('sliding_window', windows, 'one window for all sliding-window layers')
  kinds = ['full' if layer.window is None else 'swa' for layer in plan]
  rope_full = _rope_flag(plan, lambda layer: layer.window is None, 'full-attention')
  rope_swa = _rope_flag(plan, lambda layer: layer.window is not None, 'sliding-window')
  if (rope_full and 'full' in kinds) or (rope_swa and 'swa' in kinds):
    if not theta:
      refuse('rope_parameters.rope_theta', theta, 'RoPE layers need a base > 1')
  heads = hf['num_attention_heads']
  head_dim = hf.get('head_dim') or hf['hidden_size'] // heads
  fields = dict(
      vocab_size=hf['vocab_size'], d_model=hf['hidden_size'], num_layers=hf['num_hidden_layers'], num_heads=heads,
      num_kv_heads=hf.get('num_key_value_heads') or heads, head_dim=head_dim, d_ff=hf['intermediate_size'],
      cycle=shortest_cycle(kinds), rope_full=rope_full, rope_swa=rope_swa,
      norm_eps=float(hf['rms_norm_eps']), **_scaling_fields(hf, model_type, head_dim))
  if theta:
    fields['rope_base'] = float(theta)
  if windows:
    fields['window'] = int(windows[0])
  return ImportPlan(model_type, fields, bool(hf['tie_word_embeddings']))
