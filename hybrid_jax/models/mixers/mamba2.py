"""Mamba-2 (SSD) mixer.

h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t, run as hybrid_jax.kernels.linear_scan with
q = C, k = B, v = dt*x, log decay dt*A, scale 1. The input projection [z | x | B | C | dt] is stored as five
matrices (the same function as one fused in_proj) so heads and state shard by their logical axes. A_log, dt_bias
and D are vectors and so get no weight decay (see hybrid_jax.train.optim.decay_mask).

The study's layer has one B/C group, no conv bias and one gated RMSNorm over all heads. Released hybrids
(Nemotron-H, Bamba, Granite-4.0-H) use options of `model.mamba2` (FIELDS), off by default: `num_groups` B/C groups
(value head j reads group j // (num_heads / num_groups)), a bias on the short conv, the gated norm taken per
group of heads, and a floor under dt (Nemotron-H's time_step_min).
"""

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax import errors
from hybrid_jax.models import flops, layers
from hybrid_jax.models.layers import dtype_of, init_stds, param
from hybrid_jax.models.mixers import recurrent, registry


class Mamba2(recurrent.DecodeMixin, nnx.Module):

  def __init__(self, cfg, spec, *, rngs: nnx.Rngs):
    del spec
    mc = cfg.mamba2
    d, h, p, n, w = cfg.d_model, mc.num_heads, mc.head_dim, mc.state_dim, mc.conv_width
    gn = mc.num_groups * n  # B and C: num_groups groups of n, flat (one group: the study's [d, n]).
    pdt = dtype_of(cfg.param_dtype)
    std, out_std = init_stds(cfg)
    self.in_z = param(rngs, (d, h, p), ('embed', 'heads', 'head_dim'), std=std, dtype=pdt)
    self.in_x = param(rngs, (d, h, p), ('embed', 'heads', 'head_dim'), std=std, dtype=pdt)
    self.in_b = param(rngs, (d, gn), ('embed', 'state'), std=std, dtype=pdt)
    self.in_c = param(rngs, (d, gn), ('embed', 'state'), std=std, dtype=pdt)
    self.in_dt = param(rngs, (d, h), ('embed', 'heads'), std=std, dtype=pdt)
    self.conv_x = recurrent.conv_param(rngs, w, (h, p), ('heads', 'head_dim'), dtype=pdt)
    self.conv_b = recurrent.conv_param(rngs, w, (gn,), ('state',), dtype=pdt)
    self.conv_c = recurrent.conv_param(rngs, w, (gn,), ('state',), dtype=pdt)
    if mc.conv_bias:
      self.conv_bias_x = nnx.Param(jnp.zeros((h, p), pdt), logical_axes=('heads', 'head_dim'))
      self.conv_bias_b = nnx.Param(jnp.zeros((gn,), pdt), logical_axes=('state',))
      self.conv_bias_c = nnx.Param(jnp.zeros((gn,), pdt), logical_axes=('state',))
    else:
      self.conv_bias_x = self.conv_bias_b = self.conv_bias_c = None
    self.A_log = recurrent.a_log_init(rngs, h, low=1.0, high=16.0, dtype=pdt)
    self.dt_bias = recurrent.dt_bias_init(rngs, h, dtype=pdt)
    self.D = nnx.Param(jnp.ones((h,), pdt), logical_axes=('heads',))
    self.norm = nnx.Param(jnp.ones((h, p), pdt), logical_axes=('heads', 'head_dim'))
    self.out = param(rngs, (h, p, d), ('heads', 'head_dim', 'embed'), std=out_std, dtype=pdt)
    self.num_groups = mc.num_groups
    self.norm_groups = mc.num_groups if mc.norm_by_group else 1
    self.dt_floor = float(mc.dt_floor)
    self._configure(cfg)

  def init_state(self, batch: int, max_len: int):
    del max_len  # O(1) in the context length.
    h, p = self.in_x.shape[-2:]
    gn = self.in_b.shape[-1]
    conv = jnp.zeros((batch, self.conv_b.shape[-2] - 1, h * p + 2 * gn), self.dtype)
    return {'conv': conv, 'scan': recurrent.zeros_state(batch, h, gn // self.num_groups, p)}

  def _forward(self, x, state, segment_ids=None):
    dt = self.dtype
    x = x.astype(dt)
    b, t, _ = x.shape
    h, p = self.in_x.shape[-2:]
    g, gn = self.num_groups, self.in_b.shape[-1]
    z, px, pb, pc, pdt = recurrent.project_in(x, (self.in_z, self.in_x, self.in_b, self.in_c, self.in_dt), dt)
    xbc = jnp.concatenate([px.reshape(b, t, h * p), pb, pc], axis=-1)
    weight = jnp.concatenate([self.conv_x[...].reshape(-1, h * p), self.conv_b[...], self.conv_c[...]], axis=-1)
    bias = (None if self.conv_bias_x is None else jnp.concatenate(
        [self.conv_bias_x[...].reshape(h * p), self.conv_bias_b[...], self.conv_bias_c[...]]))
    xbc, conv_state = recurrent.causal_conv_silu(xbc, weight, dt, None if state is None else state['conv'], bias,
                                                 segment_ids)
    xs = xbc[..., :h * p].reshape(b, t, h, p)
    bs = xbc[..., h * p:h * p + gn].reshape(b, t, g, gn // g)  # B/C groups: key heads shared by value heads.
    cs = xbc[..., h * p + gn:].reshape(b, t, g, gn // g)
    delta = jax.nn.softplus(pdt.astype(jnp.float32) + self.dt_bias[...])  # [B,T,H]
    if self.dt_floor:
      delta = jnp.maximum(delta, self.dt_floor)
    log_decay = -jnp.exp(self.A_log[...].astype(jnp.float32)) * delta
    v = (xs.astype(jnp.float32) * delta[..., None]).astype(dt)
    y, scan_state = recurrent.scan(cs, bs, v, log_decay, scale=1.0, state=None if state is None else state['scan'],
                                   segment_ids=segment_ids, chunk_size=self.chunk_size, implementation=self.implementation)
    y = y.astype(jnp.float32) + self.D[...].astype(jnp.float32)[:, None] * xs.astype(jnp.float32)
    y = y * jax.nn.silu(z.astype(jnp.float32))  # Gate before the norm (Mamba-2's RMSNormGated).
    y = y.reshape(b, t, self.norm_groups, -1)  # The norm's groups of heads (one: all heads).
    y = layers.rms_norm(y, self.norm[...].reshape(self.norm_groups, -1), self.eps).reshape(b, t, h, p).astype(dt)
    out = recurrent.named_out(jnp.einsum('bthp,hpd->btd', y, self.out[...].astype(dt)))
    return out, {'conv': conv_state, 'scan': scan_state}


# ------------------------------------------------------------------------------------------- registry entry
FIELDS = {
    'num_heads': registry.positive_int(5, 'Heads; inner width = num_heads * head_dim.'),
    'head_dim': registry.positive_int(16, 'Channels per head (P).'),
    'state_dim': registry.positive_int(64, 'SSM state size (N) of each B/C group.'),
    'conv_width': registry.positive_int(4, 'Causal depthwise conv width on [x | B | C].'),
    'num_groups': registry.positive_int(1, 'B/C groups (n_groups); head j reads group j // (num_heads / '
                                           'num_groups).'),
    'conv_bias': registry.boolean(False, 'A bias on the short conv (Nemotron-H, Bamba, Granite-4.0-H).'),
    'norm_by_group': registry.boolean(False, "The gated RMSNorm normalises each B/C group's heads on their own "
                                             'instead of all heads at once.'),
    'dt_floor': registry.nonnegative(0.0, 'dt = max(softplus(.), dt_floor) (Nemotron-H time_step_min); 0 = none.'),
}


def _check(cfg, used):
  del used
  mc = cfg.mamba2
  if mc.num_heads % mc.num_groups:
    raise errors.invalid_config('model.mamba2.num_groups', mc.num_groups,
                                f'must divide model.mamba2.num_heads={mc.num_heads}')


def mamba2_params(cfg, spec=None) -> int:
  """in_proj [z | x | B | C | dt], conv on [x | B | C] (and its bias), A_log / dt_bias / D per head, norm and
  out_proj."""
  del spec
  mc, d = cfg.mamba2, cfg.d_model
  inner, gn = mc.num_heads * mc.head_dim, mc.num_groups * mc.state_dim
  in_proj = d * (2 * inner + 2 * gn + mc.num_heads)
  conv = (mc.conv_width + (1 if mc.conv_bias else 0)) * (inner + 2 * gn)
  return in_proj + conv + 3 * mc.num_heads + inner + inner * d


def mamba2_flops(cfg, spec, t: int) -> dict:
  del spec
  mc, d, c = cfg.mamba2, cfg.d_model, cfg.recurrent_chunk_size
  h, p, n, g = mc.num_heads, mc.head_dim, mc.state_dim, mc.num_groups
  inner = h * p
  return {'projections': 2 * t * d * (3 * inner + 2 * g * n + h),  # z, x, out (inner wide); B, C (g*n); dt (h).
          'core': flops.scalar_scan_flops(t, c, g, n, h, p),  # q = C, k = B: g key heads of width n; v: h of p.
          'conv': 2 * t * mc.conv_width * (inner + 2 * g * n)}


registry.register(registry.MixerKind(
    'mamba2', build=Mamba2, params=mamba2_params, flops=mamba2_flops, section='mamba2', fields=FIELDS,
    validate=_check, matched_shape=('num_heads', 'head_dim', 'state_dim')))
