"""GQA attention layer: full causal, sliding-window, or head-wise (SWA and full heads in one layer).

Projections are stored per head ([embed, heads, head_dim]) so that tensor parallelism can shard heads. The
attention itself goes through hybrid_jax.kernels.attention, whose implementation the config picks.
"""

import jax.numpy as jnp
from flax import nnx

from hybrid_jax import kernels
from hybrid_jax.models.layers import dtype_of, param, rope


class Attention(nnx.Module):

  def __init__(self, cfg, spec, *, rngs: nnx.Rngs):
    d, hq, hkv, hd = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    pdt = dtype_of(cfg.param_dtype)
    std, out_std = cfg.init_std, cfg.init_std / (2 * cfg.num_layers) ** 0.5
    self.wq = param(rngs, (d, hq, hd), ('embed', 'heads', 'head_dim'), std=std, dtype=pdt)
    self.wk = param(rngs, (d, hkv, hd), ('embed', 'kv_heads', 'head_dim'), std=std, dtype=pdt)
    self.wv = param(rngs, (d, hkv, hd), ('embed', 'kv_heads', 'head_dim'), std=std, dtype=pdt)
    self.wo = param(rngs, (hq, hd, d), ('heads', 'head_dim', 'embed'), std=out_std, dtype=pdt)
    self.spec = spec
    self.groups = hq // hkv
    self.rope_base = cfg.rope_base
    self.dtype = dtype_of(cfg.dtype)
    impl = cfg.attention_implementation
    self.implementation = None if impl == 'auto' else impl

  def __call__(self, x, positions):
    dt = self.dtype
    x = x.astype(dt)
    q = jnp.einsum('btd,dhk->bthk', x, self.wq[...].astype(dt))
    k = jnp.einsum('btd,dhk->bthk', x, self.wk[...].astype(dt))
    v = jnp.einsum('btd,dhk->bthk', x, self.wv[...].astype(dt))
    if self.spec.rope:
      q = rope(q, positions, base=self.rope_base)
      k = rope(k, positions, base=self.rope_base)
    if self.spec.kind == 'headwise':
      o = self._headwise(q, k, v)
    else:
      o = kernels.attention(q, k, v, window=self.spec.window, implementation=self.implementation)
    return jnp.einsum('bthk,hkd->btd', o.astype(dt), self.wo[...].astype(dt))

  def _headwise(self, q, k, v):
    """The first KV groups attend through the window, the last `full_kv_heads` groups attend fully."""
    n_swa_kv = k.shape[2] - self.spec.full_kv_heads
    n_swa_q = n_swa_kv * self.groups
    o_swa = kernels.attention(q[:, :, :n_swa_q], k[:, :, :n_swa_kv], v[:, :, :n_swa_kv],
                              window=self.spec.window, implementation=self.implementation)
    o_full = kernels.attention(q[:, :, n_swa_q:], k[:, :, n_swa_kv:], v[:, :, n_swa_kv:],
                               window=None, implementation=self.implementation)
    return jnp.concatenate([o_swa, o_full], axis=2)
