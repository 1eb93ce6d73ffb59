"""Gated DeltaNet mixer (fla-style layer).

S_t = exp(g_t)(I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T through hybrid_jax.kernels.gated_delta_rule. q, k, v
each pass a causal depthwise conv + SiLU; q and k are L2-normalised and b = sigmoid(W_b x) lies in (0, 1), which
keeps the chunked inverse bounded. g = -exp(A_log) * softplus(W_a x + dt_bias) as in Mamba-2; A_log and dt_bias
are vectors and get no weight decay.

Released GDN hybrids use options of `model.gdn` (FIELDS), off by default: more value heads than query/key heads
(Qwen3.5: value head j reads key head j // (value_heads / num_heads); beta, decay, gate and output are per value
head), and b = 2 sigmoid(W_b x) in (0, 2), which lets I - b k k^T have a negative eigenvalue (OLMo Hybrid's
allow_neg_eigval).
"""

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax import errors
from hybrid_jax.models import flops, layers
from hybrid_jax.models.layers import dtype_of, init_stds, param
from hybrid_jax.models.mixers import recurrent, registry


class GatedDeltaNet(recurrent.DecodeMixin, nnx.Module):

  def __init__(self, cfg, spec, *, rngs: nnx.Rngs):
    del spec
    gc = cfg.gdn
    d, h, k, v, w = cfg.d_model, gc.num_heads, gc.key_dim, gc.value_dim, gc.conv_width
    hv = gc.value_heads or h
    pdt = dtype_of(cfg.param_dtype)
    std, out_std = init_stds(cfg)
    self.wq = param(rngs, (d, h, k), ('embed', 'heads', 'head_dim'), std=std, dtype=pdt)
    self.wk = param(rngs, (d, h, k), ('embed', 'heads', 'head_dim'), std=std, dtype=pdt)
    self.wv = param(rngs, (d, hv, v), ('embed', 'heads', 'head_dim'), std=std, dtype=pdt)
    self.conv_q = recurrent.conv_param(rngs, w, (h, k), ('heads', 'head_dim'), dtype=pdt)
    self.conv_k = recurrent.conv_param(rngs, w, (h, k), ('heads', 'head_dim'), dtype=pdt)
    self.conv_v = recurrent.conv_param(rngs, w, (hv, v), ('heads', 'head_dim'), dtype=pdt)
    self.w_beta = param(rngs, (d, hv), ('embed', 'heads'), std=std, dtype=pdt)
    self.w_a = param(rngs, (d, hv), ('embed', 'heads'), std=std, dtype=pdt)
    self.A_log = recurrent.a_log_init(rngs, hv, low=1.0, high=16.0, dtype=pdt)
    self.dt_bias = recurrent.dt_bias_init(rngs, hv, dtype=pdt)
    self.wg = param(rngs, (d, hv, v), ('embed', 'heads', 'head_dim'), std=std, dtype=pdt)  # Output gate.
    self.norm = nnx.Param(jnp.ones((v,), pdt), logical_axes=('head_dim',))  # Shared by the heads.
    self.wo = param(rngs, (hv, v, d), ('heads', 'head_dim', 'embed'), std=out_std, dtype=pdt)
    self.beta_scale = 2.0 if gc.neg_eigval else 1.0
    self._configure(cfg)
    self.norm_eps = float(gc.norm_eps) or self.eps

  def init_state(self, batch: int, max_len: int):
    del max_len  # O(1) in the context length.
    h, k = self.wq.shape[-2:]
    hv, v = self.wv.shape[-2:]
    width = self.conv_q.shape[-3]
    conv = lambda channels: jnp.zeros((batch, width - 1, channels), self.dtype)
    return {'conv_q': conv(h * k), 'conv_k': conv(h * k), 'conv_v': conv(hv * v),
            'scan': recurrent.zeros_state(batch, hv, k, v)}

  def _forward(self, x, state, segment_ids=None):
    dt = self.dtype
    x = x.astype(dt)
    new_state = {}

    pq, pk, pv, pg, pbeta, pa = recurrent.project_in(x, (self.wq, self.wk, self.wv, self.wg, self.w_beta, self.w_a),
                                                     dt)

    def conv(name, y, weight):
      y, new_state[name] = recurrent.causal_conv_silu(y, weight[...], dt, None if state is None else state[name],
                                                      segment_ids=segment_ids)
      return y

    q = recurrent.l2_normalize(conv('conv_q', pq, self.conv_q))
    k = recurrent.l2_normalize(conv('conv_k', pk, self.conv_k))
    v = conv('conv_v', pv, self.conv_v)
    beta = self.beta_scale * jax.nn.sigmoid(pbeta.astype(jnp.float32))
    a = pa.astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32)
    log_decay = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(a)
    o, new_state['scan'] = recurrent.scan(q, k, v, log_decay, beta, state=None if state is None else state['scan'],
                                          segment_ids=segment_ids, chunk_size=self.chunk_size, implementation=self.implementation)
    gate = jax.nn.silu(pg.astype(jnp.float32))
    o = (layers.rms_norm(o, self.norm[...], self.norm_eps) * gate).astype(dt)
    return recurrent.named_out(jnp.einsum('bthk,hkd->btd', o, self.wo[...].astype(dt))), new_state


# ------------------------------------------------------------------------------------------- registry entry
FIELDS = {
    'num_heads': registry.positive_int(3, 'Query/key heads (and value heads unless value_heads says otherwise).'),
    'key_dim': registry.positive_int(16, 'Per-head query/key width.'),
    'value_dim': registry.positive_int(32, 'Per-head value (and output) width.'),
    'conv_width': registry.positive_int(4, 'Causal depthwise conv width on q, k and v.'),
    'value_heads': registry.nonnegative_int(0, 'Value heads, a multiple of num_heads (Qwen3.5 has more value '
                                               'than key heads); 0 = num_heads.'),
    'norm_eps': registry.nonnegative(0.0, 'Epsilon of the gated output norm; 0 = model.norm_eps (OLMo Hybrid '
                                          'fixes 1e-5 there).'),
    'neg_eigval': registry.boolean(False, 'beta = 2 sigmoid(.) in (0, 2) instead of sigmoid(.) (OLMo Hybrid\'s '
                                          'allow_neg_eigval).'),
}


def _check(cfg, used):
  del used
  gc = cfg.gdn
  if gc.value_heads % gc.num_heads:
    raise errors.invalid_config('model.gdn.value_heads', gc.value_heads,
                                f'must be 0 or a multiple of model.gdn.num_heads={gc.num_heads}')


def gdn_params(cfg, spec=None) -> int:
  """q, k, v with their convs, beta and decay projections, A_log / dt_bias, output gate, norm, out projection."""
  del spec
  gc, d = cfg.gdn, cfg.d_model
  h, k, v = gc.num_heads, gc.key_dim, gc.value_dim
  hv = gc.value_heads or h
  return d * (2 * h * k + hv * (3 * v + 2)) + gc.conv_width * (2 * h * k + hv * v) + 2 * hv + v


def gdn_flops(cfg, spec, t: int) -> dict:
  del spec
  gc, d, c = cfg.gdn, cfg.d_model, cfg.recurrent_chunk_size
  h, k, v = gc.num_heads, gc.key_dim, gc.value_dim
  hv = gc.value_heads or h
  # q, k (h heads); v, gate, out (hv heads); beta and decay (1 per value head). The core runs per value head.
  return {'projections': 2 * t * d * (2 * h * k + hv * (3 * v + 2)),
          'core': flops.delta_rule_flops(t, c, hv, k, v), 'conv': 2 * t * gc.conv_width * (2 * h * k + hv * v)}


registry.register(registry.MixerKind(
    'gdn', build=GatedDeltaNet, params=gdn_params, flops=gdn_flops, section='gdn', fields=FIELDS, validate=_check,
    matched_shape=('num_heads', 'key_dim', 'value_dim')))
