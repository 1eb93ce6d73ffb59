"""Lightning Attention: linear attention with a fixed exponential decay per head.

S_t = exp(-s_h) S_{t-1} + k_t v_t^T, o_t = K^-1/2 S_t^T q_t, through hybrid_jax.kernels.linear_scan with a [H]
log decay. Head h of H decays at s_h = 2^(-8(h+1)/H) for every H (MiniMax's Lightning layer and the study's code), so
heads range from short to long memory; the optional MiniMax factor (the spec's 'decay_scale' option) weakens the
decay in deeper layers. No RoPE: the decay already encodes distance.

MiniMax-Text-01's layer differs in three options of `model.lightning` (off by default): no K^-1/2 on q.S (`scale`
1), its output RMSNorm over all heads' channels at once with a scale per channel (`norm='all'`, epsilon `norm_eps`)
and a layer factor 1 - l/(L-1+e) + e (`layer_decay_eps` e = 1e-5); its block's residual is `normed_residual`
(hybrid_jax.models.model.Block).
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax import errors
from hybrid_jax.models import flops, layers
from hybrid_jax.models.layers import dtype_of, init_stds, param
from hybrid_jax.models.mixers import attention, recurrent, registry

DECAY_RATES = ('closed_form', 'alibi_interleaved')  # model.lightning.decay_rates: the series.


def alibi_slopes(num_heads: int) -> list[float]:
  """The decay rates 2^(-8(h+1)/H), h = 0..H-1, for every H: ALiBi's formula, without ALiBi's interleaving."""
  return [2.0 ** (-8.0 * (h + 1) / num_heads) for h in range(num_heads)]


def alibi_interleaved_slopes(num_heads: int) -> list[float]:
  """ALiBi's series: 2^(-8(h+1)/H) when H is a power of two; otherwise the 2^floor(log2 H) series, then every
  other rate of the 2*2^floor(log2 H) series. Runs made before model.lightning.decay_rates existed used it (for H
  = 3 it gives log2 rates [-4, -8, -2] where the formula says [-2.67, -5.33, -8]); kept so they load as trained."""
  if math.log2(num_heads).is_integer():
    return alibi_slopes(num_heads)
  closest = 2 ** math.floor(math.log2(num_heads))
  return alibi_slopes(closest) + alibi_slopes(2 * closest)[0::2][:num_heads - closest]


def decay_rates(num_heads: int, series: str = 'closed_form') -> list[float]:
  """The per-head decay rates s_h of model.lightning.decay_rates `series`."""
  if series not in DECAY_RATES:
    raise ValueError(f'decay rate series {series!r} is unknown; allowed: {", ".join(DECAY_RATES)}')
  return alibi_slopes(num_heads) if series == 'closed_form' else alibi_interleaved_slopes(num_heads)


def series_differ(num_heads: int) -> bool:
  """Whether the two series differ at `num_heads` (they agree when it is a power of two)."""
  return alibi_slopes(num_heads) != alibi_interleaved_slopes(num_heads)


class Lightning(recurrent.DecodeMixin, nnx.Module):

  def __init__(self, cfg, spec, *, rngs: nnx.Rngs):
    lc = cfg.lightning
    d, h, k, v = cfg.d_model, lc.num_heads, lc.key_dim, lc.value_dim
    pdt = dtype_of(cfg.param_dtype)
    std, out_std = init_stds(cfg)
    self.wq = param(rngs, (d, h, k), ('embed', 'heads', 'head_dim'), std=std, dtype=pdt)
    self.wk = param(rngs, (d, h, k), ('embed', 'heads', 'head_dim'), std=std, dtype=pdt)
    self.wv = param(rngs, (d, h, v), ('embed', 'heads', 'head_dim'), std=std, dtype=pdt)
    self.wg = param(rngs, (d, h, v), ('embed', 'heads', 'head_dim'), std=std, dtype=pdt)  # Output gate.
    self.norm_all = lc.get('norm', 'head') == 'all'
    if self.norm_all:  # One scale per channel of every head, the norm over all heads at once (MiniMax).
      self.norm = nnx.Param(jnp.ones((h, v), pdt), logical_axes=('heads', 'head_dim'))
    else:
      self.norm = nnx.Param(jnp.ones((v,), pdt), logical_axes=('head_dim',))  # Shared by the heads.
    self.wo = param(rngs, (h, v, d), ('heads', 'head_dim', 'embed'), std=out_std, dtype=pdt)
    # A plain tuple of Python floats: a static constant of the graph, never trained.
    self.log_decay = tuple(-s * spec.option('decay_scale', 1.0) for s in decay_rates(h, lc.decay_rates))
    self._configure(cfg)
    self.scale = float(lc.get('scale', 0.0)) or None  # None: the kernels' K^-1/2.
    self.norm_eps = float(lc.get('norm_eps', 0.0)) or self.eps

  def init_state(self, batch: int, max_len: int):
    del max_len  # O(1) in the context length.
    h, k = self.wq.shape[-2:]
    return {'scan': recurrent.zeros_state(batch, h, k, self.wv.shape[-1])}

  def _forward(self, x, state, segment_ids=None):
    dt = self.dtype
    x = x.astype(dt)
    q, k, v, g = recurrent.project_in(x, (self.wq, self.wk, self.wv, self.wg), dt)
    q, k, v = jax.nn.silu(q), jax.nn.silu(k), jax.nn.silu(v)
    log_decay = jnp.asarray(self.log_decay, jnp.float32)
    o, scan_state = recurrent.scan(q, k, v, log_decay, scale=self.scale,
                                   state=None if state is None else state['scan'], segment_ids=segment_ids,
                                   chunk_size=self.chunk_size, implementation=self.implementation)
    gate = jax.nn.sigmoid(g.astype(jnp.float32))
    if self.norm_all:
      flat = o.reshape(*o.shape[:-2], -1)
      normed = layers.rms_norm(flat, self.norm[...].reshape(-1), self.norm_eps).reshape(o.shape)
    else:
      normed = layers.rms_norm(o, self.norm[...], self.norm_eps)
    o = (normed * gate).astype(dt)
    return recurrent.named_out(jnp.einsum('bthk,hkd->btd', o, self.wo[...].astype(dt))), {'scan': scan_state}


# ------------------------------------------------------------------------------------------- registry entry
FIELDS = {
    'num_heads': registry.positive_int(3, 'Heads; head h of H decays by exp(-2^(-8(h+1)/H)) per token, for every H.'),
    'decay_rates': registry.choice(
        'closed_form', DECAY_RATES, "'closed_form': the rates above (MiniMax's layer, the study's code). "
        "'alibi_interleaved': ALiBi's series, which differs when H is not a power of two; runs made before this key "
        'existed used it and load with it (a warning says so), and resuming one needs it set explicitly.'),
    'key_dim': registry.positive_int(16, 'Per-head query/key width.'),
    'value_dim': registry.positive_int(32, 'Per-head value (and output) width.'),
    'layer_decay': registry.boolean(
        False, "MiniMax layer factor: layer l's decay rates are multiplied by (1 - l/(L-1)). Per-layer constants "
        'differ between repeats of the cycle, so it needs scan_layers=False.'),
    'layer_decay_eps': registry.nonnegative(0.0, "With layer_decay, the factor is 1 - l/(L-1+eps) + eps (MiniMax's "
                                            'eps 1e-5: its last layer keeps a small decay).'),
    'scale': registry.nonnegative(0.0, 'Factor on q.S; 0 = key_dim^-0.5 (MiniMax: 1, no scaling).'),
    'norm': registry.choice('head', ('head', 'all'), "Output RMSNorm over each head's channels with a scale shared "
                            "by the heads ('head'), or over all heads' channels with a scale each ('all': MiniMax)."),
    'norm_eps': registry.nonnegative(0.0, 'Epsilon of the output norm; 0 = model.norm_eps (MiniMax fixes 1e-6).'),
    'normed_residual': attention.normed_residual_field(
        "() or (alpha, beta): a Lightning layer's block carries alpha * norm(x) + beta * mixer(norm(x)) instead of "
        'x + mixer(norm(x)) (MiniMax).'),
}


def lightning_params(cfg, spec=None) -> int:
  """q, k (d x H x K), v, output gate, out projection (d x H x V each), the norm scale (V, or H x V with
  norm='all'); the decay rates 2^(-8(h+1)/H) are constants, not parameters."""
  del spec
  lc, d = cfg.lightning, cfg.d_model
  norm = lc.value_dim * (lc.num_heads if lc.get('norm', 'head') == 'all' else 1)
  return d * lc.num_heads * (2 * lc.key_dim + 3 * lc.value_dim) + norm


def lightning_flops(cfg, spec, t: int) -> dict:
  del spec
  lc, d, c = cfg.lightning, cfg.d_model, cfg.recurrent_chunk_size
  h, k, v = lc.num_heads, lc.key_dim, lc.value_dim
  # q, k (K wide); v, output gate, out proj (V wide). The decay is a constant per head, 2^(-8(h+1)/H): no projection.
  return {'projections': 2 * t * d * h * (2 * k + 3 * v),
          'core': flops.scalar_scan_flops(t, c, h, k, h, v), 'conv': 0}


def _layer_options(cfg, index):
  """decay_scale: the MiniMax layer factor on the decay rates, 1 - l/(L-1+eps) + eps (1 when
  model.lightning.layer_decay is off)."""
  last, eps = cfg.num_layers - 1, float(cfg.lightning.get('layer_decay_eps', 0.0))
  if not cfg.lightning.layer_decay or last + eps <= 0:
    return {'decay_scale': 1.0}
  return {'decay_scale': 1.0 - index / (last + eps) + eps}


def _validate(cfg, used):
  if used and cfg.lightning.layer_decay and cfg.scan_layers:
    raise errors.invalid_config('model.lightning.layer_decay', True, 'needs model.scan_layers=False (the per-layer decay '
                           'factor differs between repeats of the cycle)')


def _decay_rates_before_the_key(saved: dict) -> str | None:
  """model.lightning.decay_rates of a run made before the key existed: the ALiBi-interleaved series it was trained
  with when that differs from today's default for its Lightning layers; None when its model is the same either way."""
  model = saved.get('model', {})
  heads = model.get('lightning', {}).get('num_heads')
  if 'lightning' in model.get('cycle', ()) and isinstance(heads, int) and heads > 0 and series_differ(heads):
    return 'alibi_interleaved'
  return None


# Fields whose default is not what runs saved before the field existed computed (MixerKind.history).
HISTORY = {
    'decay_rates': (
        _decay_rates_before_the_key,
        'its Lightning layers were trained with ALiBi\'s interleaved decay rates, which differ from 2^(-8(h+1)/H) '
        'when model.lightning.num_heads is not a power of two; it loads as trained, and resuming it needs '
        '--config.model.lightning.decay_rates=alibi_interleaved'),
}


def _init_mismatch(source, cfg):
  if source.lightning.decay_rates != cfg.lightning.decay_rates:
    return (f'its Lightning layers were trained with decay rates {source.lightning.decay_rates!r}, this run uses '
            f'{cfg.lightning.decay_rates!r}; the copied parameters start from a model with other decays (set '
            f'--config.model.lightning.decay_rates={source.lightning.decay_rates} to keep them)')
  return None


registry.register(registry.MixerKind(
    'lightning', build=Lightning, params=lightning_params, flops=lightning_flops, layer_options=_layer_options,
    section='lightning', fields=FIELDS, validate=_validate, matched_shape=('num_heads', 'key_dim', 'value_dim'),
    init_mismatch=_init_mismatch, history=HISTORY))
