"""Receptive-field restriction at inference: each layer's mixer with an optional window W and S sink tokens.

Which layers a `Restriction` touches (`target`):
- 'full': full-attention layers (and the full heads of head-wise layers) see the last W keys plus the first S keys.
- 'efficient': sliding-window layers keep min(w, W): unchanged when W >= w, otherwise window W plus S sinks (and the
  windowed heads of head-wise layers alike); every layer that is not attention (Lightning, Mamba-2, GDN, any
  registered mixer: hybrid_jax.models.mixers.registry) gets a *windowed state*.

Attention uses the kernels' own window and sink support (`hybrid_jax.kernels.attention(window=, sinks=)`, which the
'reference' and 'xla' paths implement and the automatic choice honours), through the layer's `attend`, so no kernel
change was needed; only sinks on a packed row, which the kernels take from the row's start, join a softmax of their
own to the window's (`attend`).

Windowed state of a recurrent layer (our choice; the study leaves it open): the sequence is cut into chunks of C
tokens (default W // 4). The outputs of chunk [cC, cC + C) come from running the layer from a zero state over the
W positions ending with the chunk, [cC + C - W, cC + C), preceded by the S sink positions when those lie before.
So token t sees between W - C + 1 and W recent tokens (exactly W when C = 1), plus the sinks, for about W / C
times the layer's usual compute. A chunk whose W positions reach back to the start needs no run of its own: the
layer's plain output is already that. Sink positions that are not before the window are zero inputs put first; a
zero input leaves a zero state at zero (no biases in the projections), so they are the same as starting later.

Packed documents (`segment_ids` [B, T], hybrid_jax.models.documents): a restricted layer still never reads across
a document, and each document is restricted as it would be alone: positions, chunks and sinks count from its own
start (a document's sinks are its first S tokens, not the row's, which belong to the row's first document). So a
packed row gives every document what the document alone gives.
"""

import dataclasses

import jax
import jax.numpy as jnp

from hybrid_jax.errors import InputError
from hybrid_jax.kernels import segments
from hybrid_jax.kernels.attention import xla as xla_attention
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


def _attention(mixer, restriction, h, positions, queries, head_scale=None, segment_ids=None):
  groups = mixer.kv_groups()
  windows = [group_window(w, restriction) for w, _ in groups]
  changed = windows != [(w, 0) for w, _ in groups] or head_scale is not None
  y = mixer(h, positions, segment_ids) if not changed else None
  if changed or queries is not None:
    q, k, v = mixer.qkv(h, positions)
  if changed:
    outs = []
    for (window, sinks), (_, kv) in zip(windows, groups):
      qs = slice(kv.start * mixer.groups, kv.stop * mixer.groups)
      outs.append(attend(mixer, q[:, :, qs], k[:, :, kv], v[:, :, kv], window, qs, sinks, segment_ids))
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
    probs = query_probs(q, k, queries, per_head_w, per_head_s, scale=mixer.scale, learned_sinks=learned,
                        segment_ids=segment_ids)
  return y, probs


def attend(mixer, q, k, v, window, heads: slice, sinks: int, segment_ids=None):
  """The attention layer `mixer`'s output [B, T, h, D] of query heads `heads` through `window` (None: full causal)
  plus `sinks` sink tokens, inside each document of `segment_ids`.

  The kernels' sinks are the row's first tokens, which on a packed row belong to its first document only; here a
  query's sinks are its own document's first tokens. That case runs the window through the XLA kernel (which
  returns each row's log-sum-exp) and joins the softmax over the query's own sinks to it.
  """
  if segment_ids is None or not sinks or window is None or window >= q.shape[1]:
    return mixer.attend(q, k, v, window, heads, sink_positions=sinks, segment_ids=segment_ids)
  o, lse = xla_attention.attention(q, k, v, window=window, scale=mixer.scale,
                                   segment_ids=segments.runs(segment_ids), return_lse=True)
  o_sinks, lse_sinks = _document_sinks(q, k, v, window, sinks, segment_ids, mixer.scale)
  total = jnp.logaddexp(lse, lse_sinks)
  o = (o.astype(total.dtype) * jnp.exp(lse - total)[..., None]
       + o_sinks.astype(total.dtype) * jnp.exp(lse_sinks - total)[..., None])
  if mixer.sinks is not None:  # Learned sink logits take their share of the joint softmax, as in `mixer.attend`.
    o = o * jax.nn.sigmoid(total - mixer.sinks[...][heads].astype(total.dtype))[..., None]
  return o.astype(q.dtype)


def take_rows(x, index):
  """x [B, T, ...] at per-row positions index [B, ...] -> [B, <index's dims>, ...]."""
  return jax.vmap(lambda row, i: row[i])(x, index)


def _document_sinks(q, k, v, window: int, sinks: int, segment_ids, scale=None):
  """(o [B, T, Hq, D], lse [B, T, Hq]) of each query over its document's first `sinks` tokens that lie left of its
  window (those inside it are the window's); o = 0 and lse = -inf where there are none."""
  b, t, hq, d = q.shape
  hkv = k.shape[2]
  stat = jnp.promote_types(q.dtype, jnp.float32)
  offset = segments.positions(segment_ids)  # Each token's place in its document, in this row.
  m = jnp.arange(sinks)
  index = jnp.minimum((jnp.arange(t) - offset)[..., None] + m, t - 1)  # [B, T, S]: the document's first tokens.
  visible = m <= offset[..., None] - window  # The window holds offset - window + 1 .. offset.
  qg = q.reshape(b, t, hkv, hq // hkv, d).astype(stat)  # GQA: a KV head's query heads side by side.
  logits = jnp.einsum('bthgd,btshd->bthgs', qg, take_rows(k, index).astype(stat)) * (scale or d ** -0.5)
  logits = jnp.where(visible[:, :, None, None], logits, -jnp.inf)
  lse = jax.nn.logsumexp(logits, axis=-1)
  p = jnp.exp(logits - jnp.where(jnp.isfinite(lse), lse, 0)[..., None])  # All zero in a row without sinks.
  o = jnp.einsum('bthgs,btshd->bthgd', p, take_rows(v, index).astype(stat))
  return o.reshape(b, t, hq, d), lse.reshape(b, t, hq)


def query_probs(q, k, query_index, windows, sinks, *, scale=None, learned_sinks=None, segment_ids=None):
  """Softmax attention probabilities [B, Hq, nq, T] of the queries at `query_index` [B, nq].

  q [B, T, Hq, D] and k [B, T, Hkv, D] as the layer computes them (RoPE applied); `windows` / `sinks` are per query
  head ([Hq] ints; a window >= T means full causal). The mask is the kernels' one: key j is visible to query i iff
  j <= i and (j > i - window or j < sinks); with `segment_ids` [B, T] also only inside query i's document, whose
  first tokens are its sinks (`attend`), so a row is 0 over other documents' keys. `scale`: the factor on q·k
  (default head_dim**-0.5). `learned_sinks` [Hq]: the layer's sink logits, which take their share of each row (the
  row then sums to less than 1).
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
  if segment_ids is None:
    visible = (j <= i) & ((j > i - w) | (j < s))
  else:
    runs = segments.runs(segment_ids)
    same = runs[:, None, None, :] == jnp.take_along_axis(runs, query_index, axis=1)[:, None, :, None]
    in_document = segments.positions(segment_ids)[:, None, None, :]  # Key j's place in its document.
    visible = same & (j <= i) & ((j > i - w) | (in_document < s))
  logits = jnp.where(visible, logits, -jnp.inf)
  if learned_sinks is None:
    return jax.nn.softmax(logits, axis=-1)
  sink = jnp.broadcast_to(learned_sinks.astype(jnp.float32)[None, :, None, None], logits.shape[:3] + (1,))
  return jax.nn.softmax(jnp.concatenate([logits, sink], axis=-1), axis=-1)[..., :-1]


def windowed_recurrent(mixer, h, window: int, sinks: int, chunk: int, segment_ids=None):
  """A recurrent layer's output [B, T, d] with the windowed state described in the module doc (chunks and sinks
  counted from each document's start)."""
  b, t, d = h.shape
  y = mixer(h, None, segment_ids)
  k0 = window // chunk  # A document's chunks 0..k0-1 reach back to its start: `y` is their output.
  # At most this many later chunks in a row, however its documents fall: a document of L > k0 C tokens has
  # ceil(L / C) - k0 of them, fewer than (L - (k0 - 1) C) / C; summed over documents, fewer than T / C - k0 + 1.
  n = -(-t // chunk) - k0
  if n <= 0:
    return y
  seg = jnp.zeros((b, t), jnp.int32) if segment_ids is None else segment_ids
  offset, runs = segments.positions(seg), segments.runs(seg)  # Place in the document; which document.
  first = (offset % chunk == 0) & (offset >= k0 * chunk)  # The first token of each later chunk.
  starts = jax.vmap(lambda f: jnp.nonzero(f, size=n, fill_value=t)[0])(first)  # [B, n]; t: no chunk.
  real = starts < t
  starts = jnp.minimum(starts, t - 1)
  begin = starts + chunk - window  # [B, n]: the window's first position, inside the chunk's document.
  doc_start = starts - jnp.take_along_axis(offset, starts, axis=1)
  index = jnp.concatenate([doc_start[..., None] + jnp.arange(sinks), begin[..., None] + jnp.arange(window)], -1)
  valid = jnp.concatenate([jnp.arange(sinks) < (begin - doc_start)[..., None],
                           jnp.ones((b, n, window), bool)], axis=-1)
  order = jnp.argsort(valid, axis=-1, stable=True)  # Invalid entries first: zero inputs before any real one.
  index = jnp.take_along_axis(index, order, axis=-1)
  valid = jnp.take_along_axis(valid, order, axis=-1)
  # Positions past the chunk's document (or the row) come after all of its own: causal, and their outputs dropped.
  pieces = jnp.where(valid[..., None], take_rows(h, jnp.minimum(index, t - 1)), 0)  # [B, n, S + W, d]
  out = mixer(pieces.reshape(b * n, sinks + window, d), None).reshape(b, n, sinks + window, d)[:, :, -chunk:]
  rows = starts[..., None] + jnp.arange(chunk)  # [B, n, C]
  keep = (real[..., None] & (rows < t) & (take_rows(runs, jnp.minimum(rows, t - 1))
                                          == jnp.take_along_axis(runs, starts, axis=1)[..., None]))
  return y.at[jnp.arange(b)[:, None, None], jnp.where(keep, rows, t)].set(out, mode='drop')


def mix(mixer, spec, h, positions, restriction, queries, head_scale=None, segment_ids=None):
  """(mixer output [B, T, d], attention probabilities of `queries` or None) of one layer under `restriction`, inside
  each document of `segment_ids` (None: one per row); `head_scale` [Hq] (attention layers only) multiplies each
  query head's output before the output projection."""
  if registry.get(spec.kind).attention:
    return _attention(mixer, restriction, h, positions, queries, head_scale, segment_ids)
  if head_scale is not None:
    raise ValueError(f'head_scale applies to attention layers, not to a {spec.kind!r} layer')
  pointwise = registry.get(spec.kind).role == 'pointwise'  # Sees one position: a window changes nothing.
  if restriction is not None and restriction.target == 'efficient' and not pointwise:  # Efficient, not attention.
    return windowed_recurrent(mixer, h, restriction.window, restriction.sinks, restriction.recurrent_chunk,
                              segment_ids), None
  return mixer(h, positions, segment_ids), None
