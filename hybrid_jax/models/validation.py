"""The model section of a run config (config.model), checked by the layer that builds the model.

The layer kinds and each mixer's own keys are checked by the mixer registry (every kind its section, used or
not); the keys every model shares are checked here.
"""

from hybrid_jax import config_keys as keys
from hybrid_jax.models import layers
from hybrid_jax.models.mixers import registry

RECURRENT_IMPLEMENTATIONS = ('auto', 'reference', 'xla', 'pallas_gpu', 'pallas_tpu')
REMAT_POLICIES = ('none', 'full', 'save_dots', 'minimal', 'recompute_mlp')
DTYPES = ('float32', 'bfloat16', 'float16')
ATTENTION_IMPLEMENTATIONS = ('auto', 'xla', 'reference', 'cudnn', 'pallas_gpu', 'pallas_tpu')
_POSITIVE_INTS = ('vocab_size', 'd_model', 'num_layers', 'num_heads', 'num_kv_heads', 'head_dim', 'd_ff',
                  'recurrent_chunk_size')


def validate(c) -> None:
  """Checks config.model of the run config `c`; ConfigError naming the first bad key."""
  for key in _POSITIVE_INTS:
    keys.positive_int(c, f'model.{key}')
  m = c.model
  if m.num_heads % m.num_kv_heads:
    keys.fail('model.num_heads', m.num_heads, f'must be a multiple of model.num_kv_heads={m.num_kv_heads}')
  keys.choice(c, 'model.mlp', tuple(layers.MLPS))
  keys.boolean(c, 'model.block_mlp')
  registry.validate(m)
  keys.choice(c, 'model.recurrent_implementation', RECURRENT_IMPLEMENTATIONS)
  if m.head_dim % 2 and not m.attention.rope_dims and (m.rope_full or m.rope_swa):
    keys.fail('model.head_dim', m.head_dim, 'must be even when RoPE is used')
  keys.number(c, 'model.init_std', positive=True)
  keys.number(c, 'model.norm_eps', positive=True)
  if keys.number(c, 'model.rope_base') <= 1:
    keys.fail('model.rope_base', m.rope_base, 'must be > 1')
  for key in ('model.embedding_multiplier', 'model.residual_multiplier', 'model.logits_scaling'):
    keys.number(c, key, positive=True)  # 1 = the plain block.
  keys.nonnegative(c, 'model.attention_scale')  # 0 = head_dim**-0.5.
  keys.choice(c, 'model.dtype', DTYPES)
  keys.choice(c, 'model.param_dtype', DTYPES)
  keys.choice(c, 'model.remat', REMAT_POLICIES)
  keys.choice(c, 'model.attention_implementation', ATTENTION_IMPLEMENTATIONS)
  if keys.boolean(c, 'model.attention_sinks') and m.attention_implementation not in ('auto', 'xla'):
    keys.fail('model.attention_implementation', m.attention_implementation,
              "learned attention sinks (model.attention_sinks) need 'auto' or 'xla' (only the XLA path returns "
              'the row log-sum-exp they scale by)')
