"""Attention on TPU through JAX's splash attention (Pallas/Mosaic), adapted to this package's contract.

Splash has no scale argument (q is pre-scaled), takes [H, T, D] per example (the batch is vmapped), handles GQA
itself (q heads a multiple of kv heads) and skips fully masked blocks by static block tables, so a sliding window
costs O(T*w). The mask (causal, windowed, with sinks: `splash_tables.visible`) is computed inside the kernel from
the queries' positions; its tables are built in closed form (`splash_tables`). The block follows the window, so that
the blocks computed whole hold few masked pairs (`block_for`). T is zero-padded to a multiple of the block (splash
needs lane-aligned blocks of 128); pad keys lie in the future of every real query. Rows whose tables would outgrow
the kernel's scalar memory (causal past 262K tokens) are attended in query chunks, each against the keys up to its
end. On CPU it runs in Pallas interpret mode (tests only).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel_lib
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

from hybrid_jax.kernels import platform
from hybrid_jax.kernels.attention import config
from hybrid_jax.kernels.attention import splash_tables


class SplashMask(mask_lib._ComputableMask):  # pylint: disable=protected-access
  """`splash_tables.visible` for queries [q_start, q_start + q_len) against keys [0, q_start + q_len), as splash's
  builder reads a mask (tests build reference tables from it)."""

  def __init__(self, q_start, q_len, window=None, sinks=0):
    self.key = (q_start, q_len, window, sinks)
    super().__init__(shape=(q_len, q_start + q_len),
                     mask_function=functools.partial(splash_tables.visible, window=window, sinks=sinks))
    self.q_sequence = self.q_sequence + q_start

  def __eq__(self, other):
    return isinstance(other, SplashMask) and self.key == other.key

  def __hash__(self):
    return hash((SplashMask, self.key))


# The most pairs a block choice may compute per visible pair (`block_for`).
WORK_BOUND = 2.0


@functools.lru_cache(maxsize=256)
def block_for(t, window=None, sinks=0):
  """The splash block (square, every kernel: forward, dq, dkv) of a row of t tokens: the largest of 512, 256 and
  128 (those `config.tpu_blocks` would not shrink away for a short row) whose computed work, the visible blocks'
  area in the tables (`splash_tables.work_ratio`), is within WORK_BOUND of the visible pairs; where none is (sink
  keys beside a narrow window add a block to every row), the one of least work. In 512-blocks a window of 128
  computes two blocks of keys for each query, 8x its visible pairs; in 128-blocks 2x. The forward's and the
  backward's tables list the same blocks, so every kernel takes the one block."""
  if window is None or window >= t:
    window, sinks = None, 0
  tried = []  # (work ratio, block), largest block first; a long causal row stops at the first.
  block = config.TPU_BLOCK
  while block >= config.TPU_LANES:
    if block < 2 * t or block == config.TPU_LANES:
      tried.append((splash_tables.work_ratio(t, block, window, sinks), block))
      if tried[-1][0] <= WORK_BOUND:
        return block
    block //= 2
  return min(tried, key=lambda c: c[0])[1]


def attention(q, k, v, *, window=None, scale=None, sinks=0, segment_ids=None, block=None, interpret=None):
  """Causal (sliding-window) attention via splash; arguments as `hybrid_jax.kernels.attention`.

  block: splash block size (a multiple of 128; default `block_for` the row's length, window and sinks); interpret:
  default True off TPU.
  """
  b, t, hq, d = q.shape
  if interpret is None:
    interpret = platform.target() != 'tpu'
  if window is None or window >= t:
    window, sinks = None, 0
  sinks = min(sinks, t)
  scale = d**-0.5 if scale is None else scale
  tp, block = config.tpu_blocks(t, block_for(t, window, sinks) if block is None else block)
  pad = lambda x: jnp.pad(x, [(0, 0), (0, tp - t), (0, 0), (0, 0)]).transpose(0, 2, 1, 3)  # -> [B, H, Tp, D]
  # Splash has no scale: fold it into q in fp32, then back to the input dtype.
  q, k, v = pad((q.astype(jnp.float32) * scale).astype(q.dtype)), pad(k), pad(v)
  # Pad positions get their own segment (-1): they see only each other, real queries never see them.
  seg = None if segment_ids is None else jnp.pad(segment_ids.astype(jnp.int32), [(0, 0), (0, tp - t)],
                                                 constant_values=-1)
  chunk = splash_tables.query_chunk(tp, block, config.TPU_TABLE_BYTES, window, sinks)
  outs = []
  for start in range(0, tp, chunk):
    end = min(start + chunk, tp)
    kernel = _kernel(start, end - start, window, sinks, block, bool(interpret))
    rows, keys = (slice(None), slice(None), slice(start, end)), (slice(None), slice(None), slice(0, end))
    if seg is None:
      outs.append(jax.vmap(kernel)(q[rows], k[keys], v[keys]))
    else:
      outs.append(jax.vmap(lambda q, k, v, sq, skv: kernel(q, k, v, segment_ids=splash.SegmentIds(q=sq, kv=skv)))(
          q[rows], k[keys], v[keys], seg[:, start:end], seg[:, :end]))
  o = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=2)
  return o.transpose(0, 2, 1, 3)[:, :t]


@functools.lru_cache(maxsize=64)
def _kernel(q_start, q_len, window, sinks, block, interpret):
  """One splash kernel per static configuration, for queries [q_start, q_start + q_len) against keys [0, q_start
  + q_len). Every head shares the mask, so the tables have one head-shard row that splash broadcasts."""
  sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                            block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
  tables = functools.partial(splash_tables.mask_info, q_start, q_len, block, block, window=window, sinks=sinks)
  with jax.ensure_compile_time_eval():  # The tables are constants, even when first built under jit.
    fwd, dkv = (jax.tree.map(jnp.asarray, tables(dkv=dkv)) for dkv in (False, True))
  return kernel_lib.SplashAttentionKernel(
      fwd, fwd, dkv, block_sizes=sizes, is_mqa=False, save_residuals=False, mask_value=kernel_lib.DEFAULT_MASK_VALUE,
      attn_logits_soft_cap=None, residual_checkpoint_name=None,
      mask_function=SplashMask(q_start, q_len, window, sinks).mask_function, interpret=interpret)
