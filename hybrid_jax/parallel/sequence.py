"""Mixers over rows split across devices (context parallelism): what each kernel exchanges along the axis.

With the `seq` rule on a mesh axis of n devices (config.parallel.sequence), shard i of every row holds the tokens
[i S, (i + 1) S). `activations.shard_local` runs a kernel per shard and hands it a `Shards`; the functions here
then compute, inside that shard_map, exactly what the kernel computes on the whole row, each with the
communication its math needs and no gather of everything:

- **Sliding window** (`windowed_attention`): a halo of the keys and values of the window's reach before the shard,
  from as many earlier shards as the window spans: O(window) per device, not O(T). The queries are padded by the
  halo's length, so every attention kernel runs unchanged (the padded rows cost halo / S more work).
- **Full causal** (`full_attention`): all-to-all from sequence shards to head shards, so each device holds the
  whole row for 1 / n of the heads, the kernel runs unchanged on whole rows, and a second all-to-all brings the
  outputs back. Every device does the same causal work (no load imbalance, unlike a ring, where the last shard's
  queries see the most keys), and each sends q, k, v and o once: O(T H D / n), the all-gather of K/V's volume
  divided by n. Heads the axis does not divide are padded with zero heads (after expanding GQA key heads when
  those do not divide): correct, at the padding's cost.
- **Scans** (`scan`): each shard scans from a zero state; the shards' final states and transitions (a decay per
  head for the scalar scan; for the delta rule the K x K matrix prod a_t (I - b_t k_t k_t^T), read off the kernel
  run from the identity with zero values) are all-gathered, folded into the state entering each shard, and each
  shard adds that state's contribution to its outputs. The kernels run unchanged (their `initial_state`).
- **Short convolutions** (`causal_conv`): a halo of the width - 1 inputs before the shard, as the decode state.
- Documents: segment ids travel with the halo (attention masks) and the one id before each shard says whether
  the shard starts a document, in which case no state enters it.
"""

import dataclasses

import jax
import jax.numpy as jnp

from hybrid_jax.kernels import segments


@dataclasses.dataclass(frozen=True)
class Shards:
  """The mesh axis (or axes) a row's tokens are split over inside a shard_map, and into how many shards."""
  axis: str | tuple
  count: int

  def index(self):
    return jax.lax.axis_index(self.axis)


def _from_previous(x, shards: Shards, hops: int):
  """x of the shard `hops` before this one (zeros on the first `hops` shards)."""
  if hops >= shards.count:
    return jnp.zeros_like(x)
  return jax.lax.ppermute(x, shards.axis, [(i, i + hops) for i in range(shards.count - hops)])


def halo(x, length: int, shards: Shards):
  """The `length` entries of the whole row just before this shard along axis 1 (zeros before the row starts).

  A halo longer than a shard comes from several earlier shards; each sends only the part it owes."""
  size = x.shape[1]
  hops = -(-length // size)
  parts = []
  for h in range(hops, 0, -1):
    need = length - (hops - 1) * size if h == hops else size
    parts.append(_from_previous(x[:, size - need:], shards, h))
  return jnp.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]


def _halo_documents(segment_ids, length: int, shards: Shards, b: int, size: int):
  """Segment ids [B, length + S] of the halo and the shard as the kernels take them (a document is a run): the
  entries before the row's start form a run of their own, so no token sees them."""
  if segment_ids is None:
    ext = jnp.zeros((b, length + size), jnp.int32)
  else:
    ext = jnp.concatenate([halo(segment_ids, length, shards), segment_ids], axis=1)
  real = shards.index() * size - length + jnp.arange(length + size) >= 0
  return jnp.where(real[None], segments.runs(ext), -1)


def _halo_length(window: int, size: int) -> int:
  """Keys before a shard its first query can see (window - 1), rounded up so the padded rows stay a multiple of
  the shard's own power-of-two granularity (kernel blocks)."""
  grain = min(size & -size, 128)
  return -(-(window - 1) // grain) * grain


def windowed_attention(attend, q, k, v, segment_ids, *, window: int, shards: Shards):
  """`attend(q, k, v, segment_ids)` (causal, sliding `window`) of this shard's queries over the whole row.

  Needs window > 1 (a window of 1 sees only the token itself: no exchange)."""
  b, size = q.shape[:2]
  length = _halo_length(window, size)
  pad = lambda x, before: jnp.concatenate([before, x], axis=1)
  ids = _halo_documents(segment_ids, length, shards, b, size)
  o = attend(pad(q, jnp.zeros((b, length) + q.shape[2:], q.dtype)), pad(k, halo(k, length, shards)),
             pad(v, halo(v, length, shards)), ids)
  return o[:, length:]


def _pad_heads(x, heads: int):
  extra = heads - x.shape[2]
  return x if not extra else jnp.pad(x, [(0, 0), (0, 0), (0, extra), (0, 0)])


def full_attention(attend, q, k, v, segment_ids, *, shards: Shards):
  """`attend(q, k, v, segment_ids)` (full causal) of this shard's queries over the whole row, by heads."""
  n, hq, hkv = shards.count, q.shape[2], k.shape[2]
  if hkv % n:  # Each device must hold whole GQA groups: expand the key heads to the query heads.
    k, v = (jnp.repeat(x, hq // hkv, axis=2) for x in (k, v))
    hkv = hq
  padded = lambda h: -(-h // n) * n
  q, k, v = _pad_heads(q, padded(hq)), _pad_heads(k, padded(hkv)), _pad_heads(v, padded(hkv))
  to_heads = lambda x: jax.lax.all_to_all(x, shards.axis, split_axis=2, concat_axis=1, tiled=True)
  ids = None if segment_ids is None else jax.lax.all_gather(segment_ids, shards.axis, axis=1, tiled=True)
  o = attend(to_heads(q), to_heads(k), to_heads(v), ids)
  o = jax.lax.all_to_all(o, shards.axis, split_axis=1, concat_axis=2, tiled=True)
  return o[:, :, :hq]


def causal_conv(conv, x, segment_ids, *, width: int, shards: Shards):
  """(y, final state of the whole row) of `conv(x, initial_state, segment_ids)` -> (y, state), a causal conv of
  `width` taps over x [B, S, C], for this shard: the width - 1 inputs before it enter as the initial state, zeroed
  where they lie in another document than the shard's first token."""
  if width == 1:
    return conv(x, None, segment_ids)
  before = halo(x, width - 1, shards)
  if segment_ids is not None:
    ids = jnp.concatenate([halo(segment_ids, width - 1, shards), segment_ids[:, :1]], axis=1)
    same = jnp.flip(jnp.cumprod(jnp.flip(ids == ids[:, -1:], axis=1), axis=1), axis=1)[:, :-1]
    before = jnp.where(same[..., None].astype(bool), before, 0)
  y, state = conv(x, before, segment_ids)
  # The row's final state is the last shard's; the sum (in float32: XLA's CPU all-reduce fails on bfloat16 inside
  # a partly manual shard_map) adds only zeros to it.
  last = jnp.where(shards.index() == shards.count - 1, state, 0).astype(jnp.float32)
  return y, jax.lax.psum(last, shards.axis).astype(state.dtype)


def starts_document(segment_ids, shards: Shards):
  """bool [B]: the row starts a document at this shard's first token (never on the first shard)."""
  if segment_ids is None:
    return None
  before = _from_previous(segment_ids[:, -1], shards, 1)
  return (shards.index() > 0) & (before != segment_ids[:, 0])


def _entering(final, transition, start, initial_state, shards: Shards, apply):
  """(state entering this shard, state after the last shard) from every shard's own final state (from zeros) and
  transition, folded in order; `apply(transition, state)` is the transition's action."""
  finals = jax.lax.all_gather(final, shards.axis)
  transitions = jax.lax.all_gather(transition, shards.axis)
  starts = None if start is None else jax.lax.all_gather(start, shards.axis)
  state = jnp.zeros_like(final) if initial_state is None else initial_state.astype(final.dtype)
  entering = []
  for j in range(shards.count):
    if starts is not None:
      state = jnp.where(starts[j][:, None, None, None], 0, state)
    entering.append(state)
    state = apply(transitions[j], state) + finals[j]
  return jnp.stack(entering)[shards.index()], state


def _value_heads(x, hv: int):
  """Per-key-head x [B, S, Hk, ...] for each of Hv value heads (value head j reads key head j // (Hv / Hk))."""
  return jnp.repeat(x, hv // x.shape[2], axis=2)


def scan(kernel, q, k, v, log_decay, beta, *, scale, initial_state, segment_ids, shards: Shards):
  """(o, final state of the whole row) of `kernel(q, k, v, log_decay, beta, initial_state, segment_ids)` -> (o,
  final state), the scalar-decay scan (beta None) or the gated delta rule, for this shard's tokens."""
  b, size, hv, dv = v.shape
  dk = q.shape[3]
  scale = dk**-0.5 if scale is None else scale
  o, final = kernel(q, k, v, log_decay, beta, None, segment_ids)
  start = starts_document(segment_ids, shards)
  if beta is None:
    g = jnp.broadcast_to(log_decay.astype(jnp.float32), (b, size, hv))
    if segment_ids is not None:
      g = segments.reset_log_decay(g, segment_ids)
    decay = jnp.exp(jnp.cumsum(g, axis=1))  # [B, S, Hv]: from the shard's start through each token.
    entering, last = _entering(final, decay[:, -1], start, initial_state, shards,
                               lambda a, s: a[..., None, None] * s)
    seen = jnp.einsum('bthk,bhkv->bthv', _value_heads(q, hv).astype(jnp.float32), entering)
    correction = scale * decay[..., None] * seen
  else:
    eye = jnp.broadcast_to(jnp.eye(dk, dtype=jnp.float32), (b, hv, dk, dk))
    # From the identity with zero values the state is the transition itself: its outputs are scale * M_t^T q_t.
    read, transition = kernel(q, k, jnp.zeros((b, size, hv, dk), v.dtype), log_decay, beta, eye, segment_ids)
    entering, last = _entering(final, transition, start, initial_state, shards,
                               lambda m, s: jnp.einsum('bhij,bhjv->bhiv', m, s))
    correction = jnp.einsum('bthk,bhkv->bthv', read.astype(jnp.float32), entering)
  return (o.astype(jnp.float32) + correction).astype(o.dtype), last
