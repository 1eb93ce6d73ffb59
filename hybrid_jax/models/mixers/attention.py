"""GQA attention layer: full causal, sliding-window, or head-wise (SWA and full heads in one layer).

Projections are stored per head ([embed, heads, head_dim]) so that tensor parallelism can shard heads. The
attention itself goes through hybrid_jax.kernels.attention, whose implementation the config picks.

Learned attention sinks (model.attention_sinks; GraniteSWA, gpt-oss) add one logit s_h per head to every softmax
denominator, with value zero: o' = Σ_j e^{l_j} v_j / (Σ_j e^{l_j} + e^{s_h}) = o · sigmoid(lse − s_h), lse the
row's log-sum-exp of the scaled logits. That identity is exact; the kernels' contract returns o only, so these
layers run the XLA implementation, which also returns lse (differentiable by autodiff).
"""

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax import kernels
from hybrid_jax.kernels.attention import xla as xla_attention
from hybrid_jax.models import cache as cache_lib
from hybrid_jax.models import layers
from hybrid_jax.models.layers import checkpoint_name, dtype_of, init_stds, name_heads, param, project_heads, rope
from hybrid_jax.parallel import activations


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
    self.spec = spec
    self.groups = hq // hkv
    self.rope_base = cfg.rope_base
    # Factor on q·k; None (model.attention_scale 0) leaves the kernels' default head_dim**-0.5.
    self.scale = float(cfg.attention_scale) or None
    self.dtype = dtype_of(cfg.dtype)
    impl = cfg.attention_implementation
    self.implementation = None if impl == 'auto' else impl

  def _qkv(self, x, positions):
    q, k, v = (project_heads(x, w[...], self.dtype) for w in (self.wq, self.wk, self.wv))
    if self.spec.rope:
      q = rope(q, positions, base=self.rope_base)
      k = rope(k, positions, base=self.rope_base)
    return name_heads(q, layers.QUERY), name_heads(k, layers.KEY), name_heads(v, layers.VALUE)

  def _out(self, o):
    return checkpoint_name(jnp.einsum('bthk,hkd->btd', o.astype(self.dtype), self.wo[...].astype(self.dtype)),
                           layers.MIXER_OUT)

  def __call__(self, x, positions):
    q, k, v = self._qkv(x, positions)
    return self._out(self._attend(q, k, v))

  def _attend(self, q, k, v):
    if self.spec.kind == 'headwise':
      return self._headwise(q, k, v)
    return self.attend(q, k, v, self.spec.window)

  def attend(self, q, k, v, window, heads: slice = slice(None), *, sink_positions: int = 0):
    """Attention o [B, T, h, D] of query heads `heads` of this layer (q holds just those) over k/v through `window`
    (None = full causal); the first `sink_positions` positions stay visible too (receptive-field analyses)."""
    if self.sinks is None:
      # cuDNN has no sink positions; the automatic choice picks a kernel that has.
      impl = None if self.implementation == 'cudnn' and sink_positions else self.implementation
      return _kernel(q, k, v, window, self.scale, impl, sink_positions)
    o, lse = xla_attention.attention(q, k, v, window=window, scale=self.scale, sinks=sink_positions,
                                     return_lse=True)
    return (o * jax.nn.sigmoid(lse - self.sinks[...][heads].astype(lse.dtype))[..., None]).astype(o.dtype)

  # ------------------------------------------------------------------------------------------- decoding
  def _groups(self):
    """(window, kv-head slice) of each cache: one for full/SWA layers, two for head-wise layers."""
    hkv = self.wk.shape[-2]  # (also right on a scanned stack, whose params have a leading layers axis)
    if self.spec.kind == 'headwise':
      n_swa = hkv - self.spec.full_kv_heads
      return [(self.spec.window, slice(0, n_swa)), (None, slice(n_swa, hkv))]
    return [(self.spec.window, slice(0, hkv))]

  def init_state(self, batch: int, max_len: int):
    """KV caches: max_len entries for full attention, a ring of min(w, max_len) entries for a window w."""
    hd = self.wk.shape[-1]
    return [cache_lib.init_kv(batch, max_len if w is None else min(w, max_len), kv.stop - kv.start, hd, self.dtype)
            for w, kv in self._groups()]

  def prefill(self, x, positions, state):
    """The parallel forward pass over a prompt (positions 0..T-1), also filling the caches."""
    q, k, v = self._qkv(x, positions)
    o = self._attend(q, k, v)
    state = [cache_lib.write_prefix(c, k[:, :, kv], v[:, :, kv]) for c, (_, kv) in zip(state, self._groups())]
    return self._out(o), state

  def step(self, x, position, state):
    """One token x [B, 1, d] at `position` against the caches."""
    q, k, v = self._qkv(x, jnp.reshape(position, (1,)))
    outs, new_state = [], []
    for cache, (window, kv) in zip(state, self._groups()):
      cache = cache_lib.write_one(cache, k[:, 0, kv], v[:, 0, kv], position)
      held = cache_lib.slot_positions(cache['k'].shape[1], position)
      visible = (held >= 0) if window is None else (held >= 0) & (held > position - window)
      q_group = q[:, 0, kv.start * self.groups:kv.stop * self.groups]
      heads = slice(kv.start * self.groups, kv.stop * self.groups)
      sinks = None if self.sinks is None else self.sinks[...][..., heads]
      outs.append(_attend_one(q_group, cache['k'], cache['v'], visible, self.scale, sinks))
      new_state.append(cache)
    o = jnp.concatenate(outs, axis=1)[:, None]
    return self._out(o), new_state

  def _headwise(self, q, k, v):
    """The first KV groups attend through the window, the last `full_kv_heads` groups attend fully."""
    n_swa_kv = k.shape[2] - self.spec.full_kv_heads
    n_swa_q = n_swa_kv * self.groups
    o_swa = self.attend(q[:, :, :n_swa_q], k[:, :, :n_swa_kv], v[:, :, :n_swa_kv], self.spec.window,
                        slice(0, n_swa_q))
    o_full = self.attend(q[:, :, n_swa_q:], k[:, :, n_swa_kv:], v[:, :, n_swa_kv:], None, slice(n_swa_q, None))
    return jnp.concatenate([o_swa, o_full], axis=2)


_Q_AXES = ('batch', None, 'heads', None)  # The kernel needs whole sequences: 'seq' is never split here.
_KV_AXES = ('batch', None, 'kv_heads', None)


def _kernel(q, k, v, window, scale, implementation, sinks=0):
  """The attention kernel, per shard of batch and heads when a sharded step is traced."""
  fn = lambda q, k, v: kernels.attention(q, k, v, window=window, scale=scale, sinks=sinks,
                                         implementation=implementation)
  return activations.shard_local(fn, (q, k, v), (_Q_AXES, _KV_AXES, _KV_AXES), _Q_AXES,
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
