"""Flash attention for GPUs as Triton-style Pallas kernels: causal, sliding window, sinks, GQA, documents.

Three kernels: the forward (also saves each row's log-sum-exp), dK/dV (one program per kv block and query head)
and dQ (one program per q block), after FlashAttention-2: a preprocessing pass computes rowsum(dO o O) once, the
dK/dV kernel makes one pass over the query blocks its kv block is visible to, and dQ is a second pass over kv
blocks, each with its own block shape (`config.GPU_BLOCKS`); the backward recomputes probabilities from the saved
statistics. Each program
loops only over the blocks its window reaches, so a window w costs O(T*w); inside that range only the boundary
blocks build an element mask. Logits are kept in base 2 (exp2 is the native GPU instruction). GQA: k/v blocks are
read through index maps; each query head writes its own dK/dV, summed over the group afterwards. On CPU the same
kernels run in Pallas interpret mode (that is how tests check them).

Documents (`segment_ids`): a document is a run of equal ids (`segments.runs`; the padding past T is one more), so
the wrapper computes in XLA each token's document bounds, `first` and `last` (int32 [B, Tp]: its document's first
and last token). Under the causal mask, key j is in query i's document iff first[i] <= j (for j <= i), iff
i <= last[j] (for i >= j). So the forward and dQ programs read only their rows' `first` and the dK/dV program only
its keys' `last`, each as one small tile loaded with the block (no load inside the loops): a query block
[a, a + Bq) starts its kv loop at the block of first[a] (no key before it is visible), a kv block [c, c + Bk) ends
its q loop at the block of last[c + Bk - 1], so a row of short documents visits fewer blocks. A block stays
unmasked only if it was before and the query block lies inside one document (with the causal rule that puts the
keys there too); the masked blocks inside the bounds add the comparison above to their element mask.
"""

import functools
import math
from typing import NamedTuple

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
import jax.numpy as jnp
import numpy as np

from hybrid_jax.kernels import platform
from hybrid_jax.kernels import segments
from hybrid_jax.kernels.attention import config

_LOG2E = math.log2(math.e)
# Finite, so a tile row with no visible key never computes inf - inf; exp2 of it minus any real max is 0.
_MASKED = -0.7 * float(np.finfo(np.float32).max)


class _Cfg(NamedTuple):
  """Static description of one call (hashable: it is the custom_vjp's non-differentiable argument)."""
  scale: float
  window: int | None  # None: full causal.
  sinks: int
  group: int  # Query heads per kv head.
  blocks: config.GpuBlocks
  interpret: bool
  segments: bool = False  # Documents: each kernel takes one [B, Tp] tile input (`first` or `last`) after the others.


def attention(q, k, v, *, window=None, scale=None, sinks=0, segment_ids=None, blocks=None, interpret=None):
  """Causal (sliding-window) flash attention; arguments as `hybrid_jax.kernels.attention`.

  blocks: a `config.GpuBlocks` overriding the table; interpret: default True off GPU.
  """
  b, t, hq, d = q.shape
  if segment_ids is not None:
    segments.check(segment_ids, b, t)
  if interpret is None:
    interpret = platform.target() != 'gpu'
  if not interpret and (d < 16 or d & (d - 1)):
    raise ValueError(f"implementation='pallas_gpu' needs a power-of-two head dim >= 16 on GPU, got {d}")
  if window is None or window >= t:
    window, sinks = None, 0  # Every earlier key is in the window already.
  blocks = config.gpu_blocks(d, t, blocks, itemsize=jnp.dtype(q.dtype).itemsize)
  cfg = _Cfg(float(d**-0.5 if scale is None else scale), window, min(sinks, t), hq // k.shape[2], blocks,
             bool(interpret), segment_ids is not None)
  tp = -(-t // max(config.block_sizes(blocks))) * max(config.block_sizes(blocks))
  # Zero padding keeps pad rows finite; real queries never see pad keys (they lie in the future, and with
  # documents in a document of their own).
  pad = lambda x: jnp.pad(x, [(0, 0), (0, tp - t), (0, 0), (0, 0)])
  docs = None if segment_ids is None else _documents(segment_ids, tp)
  return _flash(cfg, pad(q), pad(k), pad(v), docs)[:, :t]


def _documents(segment_ids, tp):
  """(first, last): int32 [B, Tp], the first and last token of each token's document; a document is a run of equal
  ids (any ids: the run index `attention` passes, or raw ids from a direct call), the padding past T one more."""
  seg = jnp.asarray(segment_ids)
  # The padding's id differs from the last token's (its bitwise complement), so it is a run of its own.
  seg = jnp.concatenate([seg, jnp.broadcast_to(~seg[:, -1:], (seg.shape[0], tp - seg.shape[1]))], axis=1)
  return segments.first_token(seg), segments.last_token(seg)


def _dot(a, b, *, ta=False, tb=False):
  """a @ b with optional transposes, fp32 accumulation; fp32 inputs get full fp32 (not TF32) products."""
  precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
  dims = (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))
  return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _visible(rows, cols, cfg):
  mask = cols <= rows
  if cfg.window is not None:
    in_window = cols > rows - cfg.window
    if cfg.sinks:
      in_window = in_window | (cols < cfg.sinks)
    mask = mask & in_window
  return mask


def _div(x, n):
  """floor(x / n) for traced x >= 0 (clamped), static n (cast to x's integer type: with jax_enable_x64 a Python
  int would become int64 beside int32 program ids)."""
  x = jnp.maximum(x, 0)
  return lax.div(x, jnp.asarray(n, x.dtype))


def _clip(x, lo, hi):
  return jnp.minimum(jnp.maximum(x, lo), hi)


def _kv_ranges(a, bq, bk, nk, cfg, first=None):
  """KV block ranges (start, end, masked), ends exclusive, for the q block starting at row a.

  Window blocks [lo, hi) intersect [a - w + 1, a + Bq - 1]; [full_lo, full_hi) are visible to every row of the
  block; sink blocks are those holding a sink key left of lo. With documents, `first` is the [Bq] vector of the
  rows' documents' first tokens (never decreasing): no block before the one holding first[a] is visited (later
  rows' documents start no earlier), sink blocks only if that document holds sinks, and a block stays full only if
  the q block is one document and the kv block starts at or after first[a] (full blocks end at or before a).
  """
  hi = jnp.minimum(_div(a + bq - 1, bk) + 1, nk)
  if cfg.window is None:
    lo = full_lo = jnp.int32(0)
  else:
    lo = _div(a - cfg.window + 1, bk)
    full_lo = _clip(_div(a + bq - cfg.window + bk - 1, bk), lo, hi)
  full_hi = _clip(_div(a + 1, bk), full_lo, hi)
  sink_lo, sink_hi = jnp.int32(0), (jnp.minimum(-(-cfg.sinks // bk), lo) if cfg.sinks else None)
  if first is not None:
    start = jnp.min(first)  # first[a]: the ids never decrease.
    one_doc = jnp.max(first) == start
    start_block = _div(start, bk)
    if cfg.sinks:
      sink_lo = start_block
      sink_hi = jnp.where(start < cfg.sinks, jnp.maximum(sink_hi, start_block), start_block)
    lo = jnp.maximum(lo, start_block)
    full_lo = _clip(jnp.maximum(full_lo, _div(start + bk - 1, bk)), lo, hi)
    full_hi = _clip(jnp.where(one_doc, full_hi, full_lo), full_lo, hi)
  ranges = [(lo, full_lo, True), (full_lo, full_hi, False), (full_hi, hi, True)]
  return ([(sink_lo, sink_hi, True)] if sink_hi is not None else []) + ranges


def _q_ranges(c, bq, bk, nq, cfg, last=None):
  """Q block ranges (start, end, masked) that see the kv block starting at key c: [lo, full_lo) masked,
  [full_lo, full_hi) full, [full_hi, hi) masked. With documents, `last` is the [Bk] vector of the keys' documents'
  last tokens (never decreasing): no row after the last one a key of the block can reach in its document is visited
  (last[c + Bk - 1], or a sink key's document's last), and a block stays full only if it ends by last[c] (full rows
  start at or after c + Bk - 1, so this is empty when a document ends inside the kv block)."""
  lo = _div(c, bq)
  if cfg.window is None:
    hi = full_hi = jnp.int32(nq)
  else:
    hi = jnp.minimum(_div(c + bk + cfg.window - 2, bq) + 1, nq)
    full_hi = _div(c + cfg.window, bq)
    if cfg.sinks:
      hi = jnp.where(c < cfg.sinks, nq, hi)
      full_hi = jnp.where(c + bk <= cfg.sinks, nq, full_hi)
  if last is not None:
    reach = jnp.max(last)  # The last row any key of the block can see.
    if cfg.window is not None:
      reach = jnp.minimum(reach, c + bk + cfg.window - 2)
      if cfg.sinks:
        keys = c + lax.broadcasted_iota(jnp.int32, (bk,), 0)
        reach = jnp.maximum(reach, jnp.max(jnp.where(keys < cfg.sinks, last, 0)))
    hi = jnp.minimum(hi, _div(reach, bq) + 1)
  full_lo = _clip(_div(c + bk + bq - 2, bq), lo, hi)
  full_hi = _clip(full_hi, full_lo, hi)
  if last is not None:
    full_hi = _clip(jnp.minimum(full_hi, _div(jnp.min(last) + 1, bq)), full_lo, hi)
  return [(lo, full_lo, True), (full_lo, full_hi, False), (full_hi, hi, True)]


def _loop(ranges, step, carry):
  """Runs step(masked)(block, carry) over (start, end, masked) ranges in order."""
  for start, end, masked in ranges:
    carry = lax.fori_loop(start, end, step(masked), carry)
  return carry


def _logits(q, k, rows, start_k, masked, cfg, same_doc=None):
  """Base-2 logits of a (q rows, k block) tile, masked to _MASKED where invisible; same_doc(rows, cols) (with
  documents) gives the pairs of one document among the causal ones."""
  s = _dot(q, k, tb=True) * (cfg.scale * _LOG2E)
  if masked:
    cols = start_k + lax.broadcasted_iota(jnp.int32, s.shape, 1)
    visible = _visible(rows, cols, cfg)
    if same_doc is not None:
      visible = visible & same_doc(rows, cols)
    s = jnp.where(visible, s, _MASKED)
  return s


def _split(refs, cfg):
  """(the documents' tile or None, the output refs): with documents each kernel takes one tile after its inputs."""
  return (refs[0][...], refs[1:]) if cfg.segments else (None, refs)


def _fwd_kernel(q_ref, k_ref, v_ref, *refs, cfg):
  first, (o_ref, m_ref, log_l_ref) = _split(refs, cfg)
  bq, bk = cfg.blocks.fwd_q, cfg.blocks.fwd_k
  a = pl.program_id(2) * bq
  q = q_ref[...]
  rows = a + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
  same_doc = None if first is None else lambda rows, cols: cols >= first[:, None]

  def step(masked):
    def body(j, carry):
      acc, m, l = carry
      start = pl.multiple_of(j * bk, bk)
      k = k_ref[pl.ds(start, bk), :]
      v = v_ref[pl.ds(start, bk), :]
      s = _logits(q, k, rows, start, masked, cfg, same_doc)
      m_new = jnp.maximum(m, jnp.max(s, axis=1))
      corr = jnp.exp2(m - m_new)
      p = jnp.exp2(s - m_new[:, None])
      return (acc * corr[:, None] + _dot(p.astype(v.dtype), v), m_new, l * corr + jnp.sum(p, axis=1))
    return body

  init = (jnp.zeros(q.shape, jnp.float32), jnp.full((bq,), _MASKED, jnp.float32), jnp.zeros((bq,), jnp.float32))
  acc, m, l = _loop(_kv_ranges(a, bq, bk, k_ref.shape[0] // bk, cfg, first), step, init)
  # Every row sees its own key, so l >= 1 once the diagonal block is in.
  o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)
  # The log-sum-exp kept as its two parts: m + log2(l) rounded to float32 carries an error of ulp(m) (4e-6 at a
  # logit of 50) into every recomputed probability of a peaked row; s - m is exact there, log2(l) is small.
  m_ref[...] = m
  log_l_ref[...] = jnp.log2(l)


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, m_ref, log_l_ref, delta_ref, *refs, cfg):
  first, (dq_ref,) = _split(refs, cfg)
  bq, bk = cfg.blocks.dq_q, cfg.blocks.dq_k
  a = pl.program_id(2) * bq
  q, do = q_ref[...], do_ref[...]
  m, log_l, delta = m_ref[...][:, None], log_l_ref[...][:, None], delta_ref[...][:, None]
  rows = a + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
  same_doc = None if first is None else lambda rows, cols: cols >= first[:, None]

  def step(masked):
    def body(j, dq):
      start = pl.multiple_of(j * bk, bk)
      k = k_ref[pl.ds(start, bk), :]
      v = v_ref[pl.ds(start, bk), :]
      p = jnp.exp2(_logits(q, k, rows, start, masked, cfg, same_doc) - m - log_l)
      ds = p * (_dot(do, v, tb=True) - delta)
      return dq + _dot(ds.astype(k.dtype), k)
    return body

  dq = _loop(_kv_ranges(a, bq, bk, k_ref.shape[0] // bk, cfg, first), step, jnp.zeros(q.shape, jnp.float32))
  dq_ref[...] = (dq * cfg.scale).astype(dq_ref.dtype)


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, m_ref, log_l_ref, delta_ref, *refs, cfg):
  last, (dk_ref, dv_ref) = _split(refs, cfg)
  bq, bk = cfg.blocks.bwd_q, cfg.blocks.bwd_k
  c = pl.program_id(2) * bk
  k, v = k_ref[...], v_ref[...]
  same_doc = None if last is None else lambda rows, cols: rows <= last[None, :]

  def step(masked):
    def body(i, carry):
      dk, dv = carry
      start = pl.multiple_of(i * bq, bq)
      q = q_ref[pl.ds(start, bq), :]
      do = do_ref[pl.ds(start, bq), :]
      m = m_ref[pl.ds(start, bq)][:, None]
      log_l = log_l_ref[pl.ds(start, bq)][:, None]
      delta = delta_ref[pl.ds(start, bq)][:, None]
      rows = start + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
      p = jnp.exp2(_logits(q, k, rows, c, masked, cfg, same_doc) - m - log_l)
      dv = dv + _dot(p.astype(do.dtype), do, ta=True)
      ds = p * (_dot(do, v, tb=True) - delta)
      return dk + _dot(ds.astype(q.dtype), q, ta=True), dv
    return body

  zeros = jnp.zeros(k.shape, jnp.float32)
  dk, dv = _loop(_q_ranges(c, bq, bk, q_ref.shape[0] // bq, cfg, last), step, (zeros, zeros))
  dk_ref[...] = (dk * cfg.scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _call(kernel, cfg, grid, in_specs, out_specs, out_shape, warps, stages):
  params = None if cfg.interpret else plgpu.CompilerParams(num_warps=warps, num_stages=stages)
  return pl.pallas_call(functools.partial(kernel, cfg=cfg), grid=grid, in_specs=in_specs, out_specs=out_specs,
                        out_shape=out_shape, compiler_params=params, interpret=cfg.interpret)


def _specs(b_shape, cfg):
  """BlockSpecs over [B, T, H, D] and [B, H, T] arrays for a grid (batch, query head, block)."""
  b, tp, hq, d = b_shape
  g = cfg.group
  tile = lambda n: pl.BlockSpec((None, n, None, d), lambda bi, h, i: (bi, i, h, 0))
  whole = pl.BlockSpec((None, tp, None, d), lambda bi, h, i: (bi, 0, h, 0))
  kv_tile = lambda n: pl.BlockSpec((None, n, None, d), lambda bi, h, i: (bi, i, h // g, 0))
  kv_whole = pl.BlockSpec((None, tp, None, d), lambda bi, h, i: (bi, 0, h // g, 0))
  row_tile = lambda n: pl.BlockSpec((None, None, n), lambda bi, h, i: (bi, h, i))
  row_whole = pl.BlockSpec((None, None, tp), lambda bi, h, i: (bi, h, 0))
  return tile, whole, kv_tile, kv_whole, row_tile, row_whole


def _doc_tile(docs, which, n):
  """([its BlockSpec], (array,)): the [B, Tp] `first` (which=0) or `last` (1) tile of a grid's block of n tokens;
  nothing without documents."""
  if docs is None:
    return [], ()
  return [pl.BlockSpec((None, n), lambda bi, h, i: (bi, i))], (docs[which],)


def _forward(cfg, q, k, v, docs):
  b, tp, hq, d = q.shape
  bq = cfg.blocks.fwd_q
  tile, _, _, kv_whole, row_tile, _ = _specs(q.shape, cfg)
  doc_specs, doc_args = _doc_tile(docs, 0, bq)
  return _call(_fwd_kernel, cfg, (b, hq, tp // bq), [tile(bq), kv_whole, kv_whole] + doc_specs,
               [tile(bq), row_tile(bq), row_tile(bq)],
               [jax.ShapeDtypeStruct(q.shape, q.dtype)] + [jax.ShapeDtypeStruct((b, hq, tp), jnp.float32)] * 2,
               cfg.blocks.fwd_warps, cfg.blocks.fwd_stages)(q, k, v, *doc_args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(cfg, q, k, v, docs):
  return _forward(cfg, q, k, v, docs)[0]


def _flash_fwd(cfg, q, k, v, docs):
  o, m, log_l = _forward(cfg, q, k, v, docs)
  return o, (q, k, v, docs, o, m, log_l)


def _flash_bwd(cfg, res, do):
  q, k, v, docs, o, m, log_l = res
  b, tp, hq, d = q.shape
  bk, dq_q = cfg.blocks.bwd_k, cfg.blocks.dq_q
  # Preprocessing: delta_i = rowsum(dO o O), once, shared by both kernels (memory-bound; XLA fuses it).
  delta = jnp.einsum('bthd,bthd->bht', do.astype(jnp.float32), o.astype(jnp.float32))
  tile, whole, kv_tile, kv_whole, row_tile, row_whole = _specs(q.shape, cfg)
  warps, stages = cfg.blocks.bwd_warps, cfg.blocks.bwd_stages
  doc_specs, doc_args = _doc_tile(docs, 0, dq_q)
  dq = _call(_dq_kernel, cfg, (b, hq, tp // dq_q), [tile(dq_q), kv_whole, kv_whole, tile(dq_q)]
             + [row_tile(dq_q)] * 3 + doc_specs,
             tile(dq_q), jax.ShapeDtypeStruct(q.shape, q.dtype), warps, stages)(q, k, v, do, m, log_l, delta,
                                                                                *doc_args)
  doc_specs, doc_args = _doc_tile(docs, 1, bk)
  # One dK/dV per query head; with GQA they are summed over the group in fp32.
  part = jnp.float32 if cfg.group > 1 else k.dtype
  dk, dv = _call(_dkv_kernel, cfg, (b, hq, tp // bk), [whole, kv_tile(bk), kv_tile(bk), whole]
                 + [row_whole] * 3 + doc_specs,
                 [tile(bk), tile(bk)], [jax.ShapeDtypeStruct(q.shape, part)] * 2, warps, stages)(
                     q, k, v, do, m, log_l, delta, *doc_args)
  if cfg.group > 1:
    fold = lambda x: x.reshape(b, tp, k.shape[2], cfg.group, d).sum(3).astype(k.dtype)
    dk, dv = fold(dk), fold(dv)
  return dq, dk, dv, None  # The documents are integers: no cotangent.


_flash.defvjp(_flash_fwd, _flash_bwd)
