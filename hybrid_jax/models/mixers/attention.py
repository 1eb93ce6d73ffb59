"""GQA attention layer: full causal, sliding-window, or head-wise (SWA and full heads in one layer).

Projections are stored per head ([embed, heads, head_dim]) so that tensor parallelism can shard heads. The
attention itself goes through hybrid_jax.kernels.attention, whose implementation the config picks.

Learned attention sinks (model.attention_sinks; GraniteSWA, gpt-oss) add one logit s_h per head to every softmax
denominator, with value zero: o' = Σ_j e^{l_j} v_j / (Σ_j e^{l_j} + e^{s_h}) = o · sigmoid(lse − s_h), lse the
row's log-sum-exp of the scaled logits. That identity is exact; the kernels' contract returns o only, so these
layers run the XLA implementation, which also returns lse (differentiable by autodiff).

The variants released hybrids use are options of the `model.attention` section (FIELDS), off by default: RMSNorm
of q and k before RoPE, per head (Qwen3.5) or over all heads at once (OLMo); an output gate o * sigmoid(x W_g) per
head channel (Qwen3.5); RoPE on the first `rope_dims` channels of each head only (partial RoPE); biases on the q, k,
v and o projections and YaRN-scaled RoPE (gpt-oss); the block's normed residual (MiniMax: `normed_residual`, read by
hybrid_jax.models.model.Block).
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax import config_keys, errors, kernels
from hybrid_jax.kernels import segments
from hybrid_jax.kernels.attention import xla as xla_attention
from hybrid_jax.models import cache as cache_lib
from hybrid_jax.models import flops, layers, pattern
from hybrid_jax.models.layers import (checkpoint_name, dtype_of, heads_projections, init_stds, name_heads, param,
                                      project_heads, rope)
from hybrid_jax.models.mixers import registry
from hybrid_jax.parallel import activations, sequence


class Attention(nnx.Module):

  def __init__(self, cfg, spec, *, rngs: nnx.Rngs):
    d, hq, hkv, hd = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    pdt = dtype_of(cfg.param_dtype)
    std, out_std = init_stds(cfg)
    self.wq = param(rngs, (d, hq, hd), ('embed', 'heads', 'head_dim'), std=std, dtype=pdt)
    self.wk = param(rngs, (d, hkv, hd), ('embed', 'kv_heads', 'head_dim'), std=std, dtype=pdt)
    self.wv = param(rngs, (d, hkv, hd), ('embed', 'kv_heads', 'head_dim'), std=std, dtype=pdt)
    self.wo = param(rngs, (hq, hd, d), ('heads', 'head_dim', 'embed'), std=out_std, dtype=pdt)
    # Learned sink logit per query head (0 at init, as transformers initialises them); None = no sinks.
    self.sinks = (nnx.Param(jnp.zeros((hq,), pdt), logical_axes=('heads',)) if cfg.attention_sinks else None)
    ac = cfg.attention
    self.wgate = (param(rngs, (d, hq, hd), ('embed', 'heads', 'head_dim'), std=std, dtype=pdt)
                  if ac.output_gate else None)
    self.qk_norm = ac.qk_norm
    if ac.qk_norm == 'head':  # One scale per head channel, shared by the heads.
      self.q_norm = nnx.Param(jnp.ones((hd,), pdt), logical_axes=('head_dim',))
      self.k_norm = nnx.Param(jnp.ones((hd,), pdt), logical_axes=('head_dim',))
    elif ac.qk_norm == 'all':  # One scale per channel of every head.
      self.q_norm = nnx.Param(jnp.ones((hq, hd), pdt), logical_axes=('heads', 'head_dim'))
      self.k_norm = nnx.Param(jnp.ones((hkv, hd), pdt), logical_axes=('kv_heads', 'head_dim'))
    else:
      self.q_norm = self.k_norm = None
    if ac.get('bias'):  # gpt-oss: biases on every projection (zero at init).
      self.bq = nnx.Param(jnp.zeros((hq, hd), pdt), logical_axes=('heads', 'head_dim'))
      self.bk = nnx.Param(jnp.zeros((hkv, hd), pdt), logical_axes=('kv_heads', 'head_dim'))
      self.bv = nnx.Param(jnp.zeros((hkv, hd), pdt), logical_axes=('kv_heads', 'head_dim'))
      self.bo = nnx.Param(jnp.zeros((d,), pdt), logical_axes=('embed',))
    else:
      self.bq = self.bk = self.bv = self.bo = None
    self.norm_eps = cfg.norm_eps
    self.rope_dims = int(ac.rope_dims)
    self.yarn = yarn(ac)
    self.spec = spec
    self.groups = hq // hkv
    self.rope_base = cfg.rope_base
    # Factor on q·k; None (model.attention_scale 0) leaves the kernels' default head_dim**-0.5.
    self.scale = float(cfg.attention_scale) or None
    self.dtype = dtype_of(cfg.dtype)
    impl = cfg.attention_implementation
    self.implementation = None if impl == 'auto' else impl
    self.max_documents = ac.get('max_documents')  # None (a config saved before the key): the kernel's default.

  def qkv(self, x, positions):
    """Queries, keys and values [B, T, heads, head_dim] of x as the layer attends with them (RoPE applied)."""
    q, k, v = heads_projections(x, (self.wq[...], self.wk[...], self.wv[...]), self.dtype)
    if self.bq is not None:
      q, k, v = (t + b[...].astype(t.dtype) for t, b in ((q, self.bq), (k, self.bk), (v, self.bv)))
    if self.qk_norm != 'none':
      q, k = self._norm(q, self.q_norm), self._norm(k, self.k_norm)
    if self.spec.rope:
      q = rope(q, positions, base=self.rope_base, dims=self.rope_dims, yarn=self.yarn)
      k = rope(k, positions, base=self.rope_base, dims=self.rope_dims, yarn=self.yarn)
    return name_heads(q, layers.QUERY), name_heads(k, layers.KEY), name_heads(v, layers.VALUE)

  def _norm(self, t, scale):
    """q/k RMSNorm: over each head's channels ('head'), or over all heads' channels at once ('all')."""
    if self.qk_norm == 'head':
      return layers.rms_norm(t, scale[...], self.norm_eps).astype(t.dtype)
    flat = t.reshape(*t.shape[:-2], -1)
    return layers.rms_norm(flat, scale[...].reshape(-1), self.norm_eps).astype(t.dtype).reshape(t.shape)

  def out(self, o, x=None):
    """The output projection of per-head outputs o [B, T, Hq, head_dim]; with an output gate, o is first
    multiplied by sigmoid of the gate projection of the layer's input x."""
    if self.wgate is not None:
      gate = jax.nn.sigmoid(project_heads(x, self.wgate[...], self.dtype).astype(jnp.float32))
      o = (o.astype(jnp.float32) * gate).astype(self.dtype)
    y = jnp.einsum('bthk,hkd->btd', o.astype(self.dtype), self.wo[...].astype(self.dtype))
    if self.bo is not None:
      y = y + self.bo[...].astype(y.dtype)
    return checkpoint_name(y, layers.MIXER_OUT)

  def __call__(self, x, positions, segment_ids=None):
    q, k, v = self.qkv(x, positions)
    return self.out(self._attend(q, k, v, segment_ids), x)

  def _attend(self, q, k, v, segment_ids=None):
    """Each KV group through its window (head-wise layers: the windowed groups first, then the full ones)."""
    groups = self.kv_groups()
    if len(groups) == 1:
      return self.attend(q, k, v, groups[0][0], segment_ids=segment_ids)
    outs = []
    for window, kv in groups:
      heads = slice(kv.start * self.groups, kv.stop * self.groups)
      outs.append(self.attend(q[:, :, heads], k[:, :, kv], v[:, :, kv], window, heads, segment_ids=segment_ids))
    return jnp.concatenate(outs, axis=2)

  def attend(self, q, k, v, window, heads: slice = slice(None), *, sink_positions: int = 0, segment_ids=None):
    """Attention o [B, T, h, D] of query heads `heads` of this layer (q holds just those) over k/v through `window`
    (None = full causal) inside each document of `segment_ids` [B, T] (None: one per row); the first
    `sink_positions` positions stay visible too (receptive-field analyses)."""
    if self.sinks is None:
      # cuDNN has no sink positions; the automatic choice picks a kernel that has.
      impl = None if self.implementation == 'cudnn' and sink_positions else self.implementation
      return _kernel(q, k, v, window, self.scale, impl, sink_positions, segment_ids, self.max_documents)
    # Learned sinks join each row's softmax over the keys it sees, so with documents they are per document.
    o, lse = xla_attention.attention(q, k, v, window=window, scale=self.scale, sinks=sink_positions,
                                     segment_ids=None if segment_ids is None else segments.runs(segment_ids),
                                     return_lse=True)
    return (o * jax.nn.sigmoid(lse - self.sinks[...][heads].astype(lse.dtype))[..., None]).astype(o.dtype)

  # ------------------------------------------------------------------------------------------- decoding
  def kv_groups(self):
    """(window, kv-head slice) of each group of KV heads (one cache each): see `kv_groups` below."""
    return kv_groups(self.spec, self.wk.shape[-2])  # (also right on a scanned stack: a leading layers axis)

  def init_state(self, batch: int, max_len: int):
    """KV caches: max_len entries for full attention, a ring of min(w, max_len) entries for a window w."""
    hd = self.wk.shape[-1]
    return [cache_lib.init_kv(batch, max_len if w is None else min(w, max_len), kv.stop - kv.start, hd, self.dtype)
            for w, kv in self.kv_groups()]

  def prefill(self, x, positions, state):
    """The parallel forward pass over a prompt (positions 0..T-1), also filling the caches."""
    q, k, v = self.qkv(x, positions)
    o = self._attend(q, k, v)
    state = [cache_lib.write_prefix(c, k[:, :, kv], v[:, :, kv]) for c, (_, kv) in zip(state, self.kv_groups())]
    return self.out(o, x), state

  def step(self, x, position, state):
    """One token x [B, 1, d] at `position` against the caches."""
    q, k, v = self.qkv(x, jnp.reshape(position, (1,)))
    outs, new_state = [], []
    for cache, (window, kv) in zip(state, self.kv_groups()):
      cache = cache_lib.write_one(cache, k[:, 0, kv], v[:, 0, kv], position)
      held = cache_lib.slot_positions(cache['k'].shape[1], position)
      visible = (held >= 0) if window is None else (held >= 0) & (held > position - window)
      q_group = q[:, 0, kv.start * self.groups:kv.stop * self.groups]
      heads = slice(kv.start * self.groups, kv.stop * self.groups)
      sinks = None if self.sinks is None else self.sinks[...][..., heads]
      outs.append(_attend_one(q_group, cache['k'], cache['v'], visible, self.scale, sinks))
      new_state.append(cache)
    o = jnp.concatenate(outs, axis=1)[:, None]
    return self.out(o, x), new_state


_Q_AXES = ('batch', 'seq', 'heads', None)
_KV_AXES = ('batch', 'seq', 'kv_heads', None)
_SEGMENT_AXES = ('batch', 'seq')


def _kernel(q, k, v, window, scale, implementation, sinks=0, segment_ids=None, max_documents=None):
  """The attention kernel, per shard of batch and heads when a sharded step is traced; over a split sequence,
  with the exchange its window needs (hybrid_jax.parallel.sequence)."""
  def fn(q, k, v, segment_ids, *, shards):
    attend = lambda q, k, v, segment_ids: kernels.attention(
        q, k, v, window=window, scale=scale, sinks=sinks, segment_ids=segment_ids, implementation=implementation,
        max_documents=max_documents)
    if shards is None or window == 1:
      return attend(q, k, v, segment_ids)
    if sinks:
      raise ValueError('sink positions (receptive-field analyses) need whole rows: run the analysis without a '
                       'sequence-split mesh')
    if window is None or window >= q.shape[1] * shards.count:
      return sequence.full_attention(attend, q, k, v, segment_ids, shards=shards)
    return sequence.windowed_attention(attend, q, k, v, segment_ids, window=window, shards=shards)

  return activations.shard_local(fn, (q, k, v, segment_ids), (_Q_AXES, _KV_AXES, _KV_AXES, _SEGMENT_AXES), _Q_AXES,
                                 tied=('heads', 'kv_heads'))


def _attend_one(q, k, v, visible, scale, sinks=None):
  """Softmax attention of one query per row, q [B, Hq, D], over cached k/v [B, S, Hkv, D] where `visible` [S];
  `sinks` [Hq]: learned sink logits (None = none)."""
  b, hq, d = q.shape
  hkv = k.shape[2]
  qg = q.reshape(b, hkv, hq // hkv, d)
  logits = jnp.einsum('bhgd,bshd->bhgs', qg, k, preferred_element_type=jnp.float32) * (scale or d ** -0.5)
  logits = jnp.where(visible, logits, -jnp.inf)
  p = jax.nn.softmax(logits, axis=-1)
  o = jnp.einsum('bhgs,bshd->bhgd', p.astype(v.dtype), v, preferred_element_type=jnp.float32)
  if sinks is not None:
    lse = jax.nn.logsumexp(logits, axis=-1)
    o = o * jax.nn.sigmoid(lse - sinks.astype(lse.dtype).reshape(hkv, hq // hkv))[..., None]
  return o.reshape(b, hq, d).astype(q.dtype)


def yarn(ac) -> tuple | None:
  """The YaRN parameters layers.rope takes, from the `model.attention` section (None: plain RoPE)."""
  if ac.get('rope_scaling', 'none') != 'yarn':
    return None
  return (float(ac.yarn_factor), int(ac.yarn_original_positions), float(ac.yarn_beta_fast),
          float(ac.yarn_beta_slow), bool(ac.yarn_truncate), float(ac.yarn_attention_factor))


def kv_groups(spec, kv_heads: int) -> list[tuple[int | None, slice]]:
  """(window or None for full causal, kv-head slice) of each group of KV heads of an attention layer: one group for
  full and SWA layers; for head-wise layers the windowed groups, then the last `full_kv_heads` (the spec's option)
  that attend fully."""
  if spec.kind == 'headwise':
    n_swa = kv_heads - spec.option('full_kv_heads', 0)
    return [(spec.window, slice(0, n_swa)), (None, slice(n_swa, kv_heads))]
  return [(spec.window, slice(0, kv_heads))]


# ------------------------------------------------------------------------------------------- registry entries
def attention_params(cfg, spec=None) -> int:
  """q, k, v, o projections (and the output gate's), their biases if any, one learned sink logit per head when the
  model has them, and the q/k norms' scales."""
  del spec  # Every attention kind has the same weights.
  ac = cfg.attention
  q_and_o = (3 if ac.output_gate else 2) * cfg.d_model * cfg.num_heads * cfg.head_dim
  k_and_v = 2 * cfg.d_model * cfg.num_kv_heads * cfg.head_dim
  norms = {'none': 0, 'head': 2 * cfg.head_dim, 'all': (cfg.num_heads + cfg.num_kv_heads) * cfg.head_dim}
  biases = ((cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim + cfg.d_model) if ac.get('bias') else 0
  return q_and_o + k_and_v + biases + (cfg.num_heads if cfg.get('attention_sinks') else 0) + norms[ac.qk_norm]


def attention_flops(cfg, spec, t: int) -> dict:
  """The four projections (five with the output gate), and softmax(Q K^T) V over the pairs each KV group's window
  leaves visible."""
  d, hq, hkv, hd = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  projections = 2 * t * ((3 if cfg.attention.output_gate else 2) * d * hq * hd + 2 * d * hkv * hd)
  per_kv = hq // hkv
  core = sum(flops.attention_core_flops(t, (kv.stop - kv.start) * per_kv, hd, window)
             for window, kv in kv_groups(spec, hkv))
  return {'projections': projections, 'core': core, 'conv': 0}


def _check_window(cfg, used):
  del used  # Checked even when no layer slides: a bad value is a typo waiting for the next cycle.
  window = cfg.window
  if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
    raise errors.invalid_config('model.window', window, 'must be a positive integer (keys each query sees, itself included)')


def _check_headwise(cfg, used):
  _check_swa(cfg, used)
  value = cfg.headwise_full_kv_heads
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise errors.invalid_config('model.headwise_full_kv_heads', value, 'must be a positive integer')
  if used and not 0 < value < cfg.num_kv_heads:
    raise errors.invalid_config('model.headwise_full_kv_heads', value,
                           f'must be between 1 and model.num_kv_heads - 1 = {cfg.num_kv_heads - 1}')


def _check_variants(cfg, used):
  del used
  ac = cfg.attention
  dims = ac.rope_dims
  if dims and (dims > cfg.head_dim or dims % 2):
    raise errors.invalid_config('model.attention.rope_dims', dims,
                                f'must be 0 (the whole head) or an even number <= model.head_dim={cfg.head_dim}')
  if ac.rope_scaling == 'yarn' and ac.yarn_beta_fast <= ac.yarn_beta_slow:
    raise errors.invalid_config('model.attention.yarn_beta_fast', ac.yarn_beta_fast,
                                f'must be above model.attention.yarn_beta_slow={ac.yarn_beta_slow}')
  if ac.normed_residual and ac.post_norm:
    raise errors.invalid_config('model.attention.normed_residual', tuple(ac.normed_residual),
                                'must be () with model.attention.post_norm (a post-norm block norms the outputs)')


def normed_residual_field(doc: str) -> registry.Field:
  """A section's `normed_residual`: () (the block adds the branch to the stream x) or (alpha, beta), finite: the
  block carries alpha * norm(x) + beta * branch(norm(x)) instead (MiniMax's blocks; hybrid_jax.models.model.Block)."""
  def check(config, key):
    found = config_keys.value(config, key)
    ok = isinstance(found, (tuple, list)) and len(found) in (0, 2) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in found)
    if not ok:
      config_keys.fail(key, found, 'must be () or two finite numbers (alpha, beta)')
    return found
  return registry.Field((), doc, check)


def _check_swa(cfg, used):
  _check_window(cfg, used)
  _check_variants(cfg, used)


# The `model.attention` section, shared by the three attention kinds (one Attention layer).
FIELDS = {
    'qk_norm': registry.choice('none', ('none', 'head', 'all'), "RMSNorm of q and k before RoPE: 'none', 'head' "
                               "(each head's channels, one scale per channel: Qwen3.5) or 'all' (all heads' "
                               'channels at once, a scale each: OLMo).'),
    'output_gate': registry.boolean(False, 'Multiply each head channel\'s output by sigmoid of a gate projection '
                                           'of the layer input before the output projection (Qwen3.5).'),
    'post_norm': registry.boolean(False, 'The block of an attention layer norms the outputs of its mixer and its '
                                         'MLP instead of their inputs (OLMo Hybrid).'),
    'rope_dims': registry.nonnegative_int(0, 'RoPE rotates the first rope_dims channels of each head (partial '
                                             'RoPE; frequencies base**(-2i/rope_dims)); 0 = the whole head.'),
    'bias': registry.boolean(False, 'Biases on the q, k, v and o projections (gpt-oss).'),
    'rope_scaling': registry.choice('none', ('none', 'yarn'), "'yarn': YaRN's RoPE frequencies (gpt-oss; "
                                    'layers.yarn_inv_freq, with the yarn_* keys); none = plain RoPE.'),
    'yarn_factor': registry.Field(32.0, "'yarn': the context extension factor f.",
                                  lambda c, k: config_keys.number(c, k, positive=True)),
    'yarn_original_positions': registry.positive_int(4096, "'yarn': the context length L0 RoPE was trained at."),
    'yarn_beta_fast': registry.Field(32.0, "'yarn': rotations below which frequencies are extrapolated.",
                                     lambda c, k: config_keys.number(c, k, positive=True)),
    'yarn_beta_slow': registry.Field(1.0, "'yarn': rotations above which frequencies are interpolated.",
                                     lambda c, k: config_keys.number(c, k, positive=True)),
    'yarn_truncate': registry.boolean(True, "'yarn': round the ramp's ends to whole dimensions."),
    'yarn_attention_factor': registry.nonnegative(0.0, "'yarn': factor on cos and sin; 0 = 1 + 0.1 ln(factor)."),
    'normed_residual': normed_residual_field(
        "() or (alpha, beta): an attention layer's block carries alpha * norm(x) + beta * mixer(norm(x)) instead of "
        'x + mixer(norm(x)) (MiniMax).'),
    'max_documents': registry.positive_int(64, 'Documents per row that cuDNN attention packs (GPU, with documents; '
                                               'docs/KERNELS.md): a call with a row of more runs pallas_gpu. Each '
                                               'costs 4 bytes of saved softmax statistics per token and head.'),
}
_ATTENTION = dict(build=Attention, params=attention_params, flops=attention_flops, attention=True,
                  section='attention', fields=FIELDS)
registry.register(registry.MixerKind(
    'full', role='full', validate=_check_variants, **_ATTENTION,
    spec=lambda cfg, index: pattern.LayerSpec('full', None, bool(cfg.rope_full))))
registry.register(registry.MixerKind(
    'swa', validate=_check_swa, **_ATTENTION,
    spec=lambda cfg, index: pattern.LayerSpec('swa', int(cfg.window), bool(cfg.rope_swa))))
# One RoPE setting per layer: head-wise layers follow the SWA setting (their windowed heads need position).
registry.register(registry.MixerKind(
    'headwise', role='headwise', validate=_check_headwise, **_ATTENTION,
    spec=lambda cfg, index: pattern.LayerSpec('headwise', int(cfg.window), bool(cfg.rope_swa)),
    layer_options=lambda cfg, index: {'full_kv_heads': int(cfg.headwise_full_kv_heads)}))
