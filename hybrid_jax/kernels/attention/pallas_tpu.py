"""Attention on TPU through JAX's splash attention (Pallas/Mosaic), adapted to this package's contract.

Splash has no scale argument (q is pre-scaled), takes [H, T, D] per example (the batch is vmapped), handles GQA
itself (q heads a multiple of kv heads) and skips fully masked blocks from a static mask, so a sliding window costs
O(T*w). The mask is CausalMask, LocalMask(window_size=(w - 1, 0)) or, with sink positions, a computable mask of
both. T is zero-padded to a multiple of the block (splash needs lane-aligned blocks of 128); pad keys lie in the
future of every real query. On CPU it runs in Pallas interpret mode (tests only).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

from hybrid_jax.kernels import platform
from hybrid_jax.kernels.attention import config, splash_tables


class _SinkWindowMask(mask_lib._ComputableMask):  # pylint: disable=protected-access
  """Causal window of `window` keys plus the first `sinks` keys, computed inside the kernel."""

  def __init__(self, shape, window, sinks):
    self.window, self.sinks = window, sinks

    def visible(q_ids, kv_ids):
      return (q_ids >= kv_ids) & ((q_ids - kv_ids < window) | (kv_ids < sinks))

    super().__init__(shape=shape, mask_function=visible)

  def __eq__(self, other):
    return isinstance(other, _SinkWindowMask) and (self.shape, self.window, self.sinks) == (
        other.shape, other.window, other.sinks)

  def __hash__(self):
    return hash((type(self), self.shape, self.window, self.sinks))


def attention(q, k, v, *, window=None, scale=None, sinks=0, segment_ids=None, block=None, interpret=None):
  """Causal (sliding-window) attention via splash; arguments as `hybrid_jax.kernels.attention`.

  block: splash block size (multiple of 128; default from config); interpret: default True off TPU.
  """
  b, t, hq, d = q.shape
  if interpret is None:
    interpret = platform.target() != 'tpu'
  if window is None or window >= t:
    window, sinks = None, 0
  scale = d**-0.5 if scale is None else scale
  tp, block = config.tpu_blocks(t, block)
  pad = lambda x: jnp.pad(x, [(0, 0), (0, tp - t), (0, 0), (0, 0)]).transpose(0, 2, 1, 3)  # -> [B, H, Tp, D]
  kernel = _kernel(tp, window, min(sinks, t), block, bool(interpret))
  # Splash has no scale: fold it into q in fp32, then back to the input dtype.
  qs = (q.astype(jnp.float32) * scale).astype(q.dtype)
  if segment_ids is None:
    o = jax.vmap(kernel)(pad(qs), pad(k), pad(v))
  else:
    # Pad positions get their own segment (-1): they see only each other, real queries never see them.
    seg = jnp.pad(segment_ids.astype(jnp.int32), [(0, 0), (0, tp - t)], constant_values=-1)
    o = jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=splash.SegmentIds(q=s, kv=s)))(
        pad(qs), pad(k), pad(v), seg)
  return o.transpose(0, 2, 1, 3)[:, :t]


@functools.lru_cache(maxsize=64)
def _kernel(tp, window, sinks, block, interpret):
  """One splash kernel per static configuration, its block tables built in closed form (`splash_tables`).

  Every head shares the mask, so the tables have one head-shard row that splash broadcasts over the heads.
  """
  shape = (tp, tp)
  if window is None:
    head_mask = mask_lib.CausalMask(shape)
  elif sinks:
    head_mask = _SinkWindowMask(shape, window, sinks)
  else:
    head_mask = mask_lib.LocalMask(shape, window_size=(window - 1, 0), offset=0)
  sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                            block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
  tables = functools.partial(splash_tables.mask_info, tp, block, block, window=window, sinks=sinks)
  with jax.ensure_compile_time_eval():  # The tables are constants, even when first built under jit.
    fwd, dkv = (jax.tree.map(jnp.asarray, tables(dkv=dkv)) for dkv in (False, True))
  return splash.splash_attention_kernel.SplashAttentionKernel(
      fwd, fwd, dkv, block_sizes=sizes, is_mqa=False, save_residuals=False,
      mask_value=splash.splash_attention_kernel.DEFAULT_MASK_VALUE, attn_logits_soft_cap=None,
      residual_checkpoint_name=None, mask_function=head_mask.mask_function, interpret=interpret)
