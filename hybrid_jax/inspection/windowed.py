"""Receptive-field restriction at inference: each layer's mixer with an optional window W and S sink tokens.

Which layers a `Restriction` touches (`target`):
- 'full': full-attention layers (and the full heads of head-wise layers) see the last W keys plus the first S keys.
- 'efficient': sliding-window layers keep min(w, W): unchanged when W >= w, otherwise window W plus S sinks (and the
  windowed heads of head-wise layers alike); every layer that is not attention (Lightning, Mamba-2, GDN, any
  registered mixer: hybrid_jax.models.mixers.registry) gets a *windowed state*.

Attention uses the kernels' own window and sink support (`hybrid_jax.kernels.attention(window=, sinks=)`, which the
'reference' and 'xla' paths implement and the automatic choice honours), through the layer's `attend`, so no kernel
change was needed.

Windowed state of a recurrent layer (our choice; the study leaves it open): the sequence is cut into chunks of C
tokens (default W // 4). The outputs of chunk [cC, cC + C) come from running the layer from a zero state over the
W positions ending with the chunk, [cC + C - W, cC + C), preceded by the S sink positions when those lie before.
So token t sees between W - C + 1 and W recent tokens (exactly W when C = 1), plus the sinks, for about W / C
times the layer's usual compute. Segments are left-padded with zero inputs where they would start before position 0; a zero
input leaves a zero state at zero (no biases in the projections), so padding is the same as starting later.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp

from hybrid_jax.errors import InputError
from hybrid_jax.models.mixers import registry

TARGETS = ('full', 'efficient')


@dataclasses.dataclass(frozen=True)
class Restriction:
  """Limit `target` layers to the last `window` tokens plus `sinks` leading tokens; `chunk`: see the module doc."""
  target: str
  window: int
  sinks: int = 0
  chunk: int | None = None

  def __post_init__(self):
    if self.target not in TARGETS:
      raise InputError(f'restriction target {self.target!r} is invalid: use one of {", ".join(TARGETS)}')
    for name, low in (('window', 1), ('sinks', 0)):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InputError(f'restriction {name}={value!r} is invalid: must be an integer >= {low}')
    if self.chunk is not None and not (isinstance(self.chunk, int) and 1 <= self.chunk <= self.window):
      raise InputError(f'restriction chunk={self.chunk!r} is invalid: must be an integer in [1, window={self.window}]')

  @property
  def recurrent_chunk(self) -> int:
    return self.chunk or max(1, self.window // 4)

  def label(self) -> str:
    return f'{self.target} W={self.window} S={self.sinks}'


def group_window(window, restriction):
  """(window, sinks) of one KV group under `restriction`; window None = full causal."""
  if restriction is None:
    return window, 0
  if window is None:
    return (restriction.window, restriction.sinks) if restriction.target == 'full' else (None, 0)
  if restriction.target == 'efficient' and restriction.window < window:
    return restriction.window, restriction.sinks
  return window, 0


def _attention(mixer, restriction, h, positions, queries, head_scale=None):
  groups = mixer.kv_groups()
  windows = [group_window(w, restriction) for w, _ in groups]
  changed = windows != [(w, 0) for w, _ in groups] or head_scale is not None
  y = mixer(h, positions) if not changed else None
  if changed or queries is not None:
    q, k, v = mixer.qkv(h, positions)
  if changed:
    outs = []
    for (window, sinks), (_, kv) in zip(windows, groups):
      qs = slice(kv.start * mixer.groups, kv.stop * mixer.groups)
      outs.append(mixer.attend(q[:, :, qs], k[:, :, kv], v[:, :, kv], window, qs, sink_positions=sinks))
    o = jnp.concatenate(outs, axis=2)
    if head_scale is not None:  # Each query head's output scaled before the output projection (0 ablates it).
      o = o * jnp.asarray(head_scale, o.dtype)[None, None, :, None]
    y = mixer.out(o, h)
  probs = None
  if queries is not None:
    t = h.shape[1]
    per_head_w, per_head_s = [], []
    for (window, sinks), (_, kv) in zip(windows, groups):
      n = (kv.stop - kv.start) * mixer.groups
      per_head_w += [t + 1 if window is None else window] * n
      per_head_s += [sinks] * n
    learned = None if mixer.sinks is None else mixer.sinks[...]
    probs = query_probs(q, k, queries, per_head_w, per_head_s, scale=mixer.scale, learned_sinks=learned)
  return y, probs


def query_probs(q, k, query_index, windows, sinks, *, scale=None, learned_sinks=None):
  """Softmax attention probabilities [B, Hq, nq, T] of the queries at `query_index` [B, nq].

  q [B, T, Hq, D] and k [B, T, Hkv, D] as the layer computes them (RoPE applied); `windows` / `sinks` are per query
  head ([Hq] ints; a window >= T means full causal). The mask is the kernels' one: key j is visible to query i iff
  j <= i and (j > i - window or j < sinks). `scale`: the factor on q·k (default head_dim**-0.5). `learned_sinks`
  [Hq]: the layer's sink logits, which take their share of each row (the row then sums to less than 1).
  """
  b, t, hq, d = q.shape
  groups = hq // k.shape[2]
  qs = jnp.take_along_axis(q, query_index[:, :, None, None], axis=1).astype(jnp.float32)  # [B, nq, Hq, D]
  ks = jnp.repeat(k, groups, axis=2).astype(jnp.float32)
  logits = jnp.einsum('bnhd,bthd->bhnt', qs, ks) * (scale or d ** -0.5)
  i = query_index[:, None, :, None]
  j = jnp.arange(t)[None, None, None, :]
  w = jnp.asarray(windows)[None, :, None, None]
  s = jnp.asarray(sinks)[None, :, None, None]
  visible = (j <= i) & ((j > i - w) | (j < s))
  logits = jnp.where(visible, logits, -jnp.inf)
  if learned_sinks is None:
    return jax.nn.softmax(logits, axis=-1)
  sink = jnp.broadcast_to(learned_sinks.astype(jnp.float32)[None, :, None, None], logits.shape[:3] + (1,))
  return jax.nn.softmax(jnp.concatenate([logits, sink], axis=-1), axis=-1)[..., :-1]


def windowed_recurrent(mixer, h, window: int, sinks: int, chunk: int):
  """A recurrent layer's output [B, T, d] with the windowed state described in the module doc."""
  b, t, d = h.shape
  n = math.ceil(t / chunk)
  h = jnp.pad(h, ((0, 0), (0, n * chunk - t), (0, 0)))  # Right padding: outputs there are dropped.
  starts = jnp.arange(n) * chunk + chunk - window  # [n]
  win = starts[:, None] + jnp.arange(window)[None]  # [n, W]
  sink = jnp.broadcast_to(jnp.arange(sinks)[None], (n, sinks))
  index = jnp.concatenate([sink, win], axis=1)  # [n, S + W]
  valid = jnp.concatenate([sink < starts[:, None], win >= 0], axis=1)
  order = jnp.argsort(valid, axis=1, stable=True)  # Invalid entries first: zero inputs before any real one.
  index = jnp.take_along_axis(index, order, axis=1)
  valid = jnp.take_along_axis(valid, order, axis=1)
  segments = jnp.where(valid[None, :, :, None], h[:, jnp.clip(index, 0, n * chunk - 1)], 0)  # [B, n, S + W, d]
  y = mixer(segments.reshape(b * n, sinks + window, d), None)
  return y.reshape(b, n, sinks + window, d)[:, :, -chunk:].reshape(b, n * chunk, d)[:, :t]


def mix(mixer, spec, h, positions, restriction, queries, head_scale=None):
  """(mixer output [B, T, d], attention probabilities of `queries` or None) of one layer under `restriction`;
  `head_scale` [Hq] (attention layers only) multiplies each query head's output before the output projection."""
  if registry.get(spec.kind).attention:
    return _attention(mixer, restriction, h, positions, queries, head_scale)
  if head_scale is not None:
    raise ValueError(f'head_scale applies to attention layers, not to a {spec.kind!r} layer')
  pointwise = registry.get(spec.kind).role == 'pointwise'  # Sees one position: a window changes nothing.
  if restriction is not None and restriction.target == 'efficient' and not pointwise:  # Efficient, not attention.
    return windowed_recurrent(mixer, h, restriction.window, restriction.sinks, restriction.recurrent_chunk), None
  return mixer(h, positions), None
