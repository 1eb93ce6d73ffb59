"""Mamba-2 (SSD) mixer with one B/C group.

h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t, run as hybrid_jax.kernels.linear_scan with
q = C, k = B, v = dt*x, log decay dt*A, scale 1. The input projection [z | x | B | C | dt] is stored as five
matrices (the same function as one fused in_proj) so heads and state shard by their logical axes. A_log, dt_bias
and D are vectors and so get no weight decay (see hybrid_jax.train.optim.decay_mask).
"""

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax.models import flops
from hybrid_jax.models.layers import dtype_of, init_stds, param
from hybrid_jax.models.mixers import recurrent, registry


class Mamba2(recurrent.DecodeMixin, nnx.Module):

  def __init__(self, cfg, spec, *, rngs: nnx.Rngs):
    del spec
    mc = cfg.mamba2
    d, h, p, n, w = cfg.d_model, mc.num_heads, mc.head_dim, mc.state_dim, mc.conv_width
    pdt = dtype_of(cfg.param_dtype)
    std, out_std = init_stds(cfg)
    self.in_z = param(rngs, (d, h, p), ('embed', 'heads', 'head_dim'), std=std, dtype=pdt)
    self.in_x = param(rngs, (d, h, p), ('embed', 'heads', 'head_dim'), std=std, dtype=pdt)
    self.in_b = param(rngs, (d, n), ('embed', 'state'), std=std, dtype=pdt)
    self.in_c = param(rngs, (d, n), ('embed', 'state'), std=std, dtype=pdt)
    self.in_dt = param(rngs, (d, h), ('embed', 'heads'), std=std, dtype=pdt)
    self.conv_x = recurrent.conv_param(rngs, w, (h, p), ('heads', 'head_dim'), dtype=pdt)
    self.conv_b = recurrent.conv_param(rngs, w, (n,), ('state',), dtype=pdt)
    self.conv_c = recurrent.conv_param(rngs, w, (n,), ('state',), dtype=pdt)
    self.A_log = recurrent.a_log_init(rngs, h, low=1.0, high=16.0, dtype=pdt)
    self.dt_bias = recurrent.dt_bias_init(rngs, h, dtype=pdt)
    self.D = nnx.Param(jnp.ones((h,), pdt), logical_axes=('heads',))
    self.norm = nnx.Param(jnp.ones((h, p), pdt), logical_axes=('heads', 'head_dim'))
    self.out = param(rngs, (h, p, d), ('heads', 'head_dim', 'embed'), std=out_std, dtype=pdt)
    self._configure(cfg)

  def init_state(self, batch: int, max_len: int):
    del max_len  # O(1) in the context length.
    h, p = self.in_x.shape[-2:]
    n = self.in_b.shape[-1]
    conv = jnp.zeros((batch, self.conv_b.shape[-2] - 1, h * p + 2 * n), self.dtype)
    return {'conv': conv, 'scan': recurrent.zeros_state(batch, h, n, p)}

  def _forward(self, x, state):
    dt = self.dtype
    x = x.astype(dt)
    b, t, _ = x.shape
    h, p = self.in_x.shape[-2:]
    n = self.in_b.shape[-1]
    named = recurrent.named_in
    z = recurrent.project_in(x, self.in_z, dt)
    xbc = jnp.concatenate([recurrent.project_in(x, self.in_x, dt).reshape(b, t, h * p),
                           named(x @ self.in_b[...].astype(dt)), named(x @ self.in_c[...].astype(dt))], axis=-1)
    weight = jnp.concatenate([self.conv_x[...].reshape(-1, h * p), self.conv_b[...], self.conv_c[...]], axis=-1)
    xbc, conv_state = recurrent.causal_conv_silu(xbc, weight, dt, None if state is None else state['conv'])
    xs = xbc[..., :h * p].reshape(b, t, h, p)
    bs = xbc[:, :, None, h * p:h * p + n]  # One B/C group: a single key head shared by all value heads.
    cs = xbc[:, :, None, h * p + n:]
    delta = jax.nn.softplus(named(x @ self.in_dt[...].astype(dt)).astype(jnp.float32) + self.dt_bias[...])  # [B,T,H]
    log_decay = -jnp.exp(self.A_log[...].astype(jnp.float32)) * delta
    v = (xs.astype(jnp.float32) * delta[..., None]).astype(dt)
    y, scan_state = recurrent.scan(cs, bs, v, log_decay, scale=1.0, state=None if state is None else state['scan'],
                                   chunk_size=self.chunk_size, implementation=self.implementation)
    y = y.astype(jnp.float32) + self.D[...].astype(jnp.float32)[:, None] * xs.astype(jnp.float32)
    y = y * jax.nn.silu(z.astype(jnp.float32))  # Gate before the norm (Mamba-2's RMSNormGated).
    y = y.reshape(b, t, h * p)
    y = recurrent.rms_norm(y, self.norm[...].reshape(h * p), self.eps).reshape(b, t, h, p).astype(dt)
    out = recurrent.named_out(jnp.einsum('bthp,hpd->btd', y, self.out[...].astype(dt)))
    return out, {'conv': conv_state, 'scan': scan_state}


# ------------------------------------------------------------------------------------------- registry entry
FIELDS = {
    'num_heads': registry.positive_int(5, 'Heads; inner width = num_heads * head_dim.'),
    'head_dim': registry.positive_int(16, 'Channels per head (P).'),
    'state_dim': registry.positive_int(64, 'SSM state size (N), shared by all heads.'),
    'conv_width': registry.positive_int(4, 'Causal depthwise conv width on [x | B | C].'),
}


def mamba2_params(cfg, spec=None) -> int:
  """in_proj [z | x | B | C | dt], conv on [x | B | C], A_log / dt_bias / D per head, norm and out_proj."""
  del spec
  mc, d = cfg.mamba2, cfg.d_model
  inner = mc.num_heads * mc.head_dim
  in_proj = d * (2 * inner + 2 * mc.state_dim + mc.num_heads)
  conv = mc.conv_width * (inner + 2 * mc.state_dim)
  return in_proj + conv + 3 * mc.num_heads + inner + inner * d


def mamba2_flops(cfg, spec, t: int) -> dict:
  del spec
  mc, d, c = cfg.mamba2, cfg.d_model, cfg.recurrent_chunk_size
  h, p, n = mc.num_heads, mc.head_dim, mc.state_dim
  inner = h * p
  return {'projections': 2 * t * d * (3 * inner + 2 * n + h),  # z, x, out (inner wide); B, C (n); dt (h).
          'core': flops.scalar_scan_flops(t, c, 1, n, h, p),  # q = C, k = B: one key head of width n; v: h heads of p.
          'conv': 2 * t * mc.conv_width * (inner + 2 * n)}


registry.register(registry.MixerKind(
    'mamba2', build=Mamba2, params=mamba2_params, flops=mamba2_flops, section='mamba2', fields=FIELDS,
    matched_shape=('num_heads', 'head_dim', 'state_dim')))
