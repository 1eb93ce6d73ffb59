"""Block sizes for the Pallas attention kernels: one small table per backend, keyed by head dim.

Entries are starting points for an H200 (Triton) until the benchmark tunes them; every entry the code can pick is
exercised by the GPU parity script (scripts/device/attention_parity.py, run by scripts/device/measure.sh). Blocks
shrink for short sequences so tiny inputs do not pad to a whole 128-row block, and shrink further (fewer pipeline
stages, then smaller blocks) until every kernel fits the device's shared memory (`gpu_smem`).
"""

from typing import NamedTuple

from hybrid_jax.kernels import gpu_smem

MIN_BLOCK = 16  # Triton dots need at least 16 rows/columns.


class GpuBlocks(NamedTuple):
  """Forward q/kv blocks; dK/dV kernel q block (rows per loop step) and kv block (rows per program); Triton launch
  options; dQ kernel q block (rows per program) and kv block (rows per loop step), None: the dK/dV kernel's."""
  fwd_q: int = 128
  fwd_k: int = 64
  bwd_q: int = 64
  bwd_k: int = 64
  fwd_warps: int = 4
  fwd_stages: int = 3
  bwd_warps: int = 4
  bwd_stages: int = 2
  dq_q: int | None = None
  dq_k: int | None = None


def block_sizes(blocks):
  """Every block size of a configuration (the dQ kernel's resolved)."""
  return (blocks.fwd_q, blocks.fwd_k, blocks.bwd_q, blocks.bwd_k, blocks.dq_q or blocks.bwd_q,
          blocks.dq_k or blocks.bwd_k)


# Head dim -> blocks. Smaller head dims use the 64 entry.
# Backward blocks follow the FlashAttention-2 split as Triton implementations run it: each kernel keeps the
# operand it accumulates into in a large block and streams the other in small steps. dK/dV: 128 kv rows per
# program (each q/dO tile loaded serves twice the keys of a 64-block, halving the q/dO traffic, which is
# T / kv block loads per head), 32 q rows per step (small P and dS tiles keep the fp32 accumulators dK, dV
# [128, D] in registers). dQ: the mirror, 128 q rows per program and 32 kv rows per step. Windows do not change
# the choice: a 128-row kv block with window w visits (128 + w) / 32 q steps, every one of them useful.
GPU_BLOCKS = {
    64: GpuBlocks(128, 64, 32, 128, 4, 3, 4, 2, 128, 32),
    128: GpuBlocks(128, 64, 32, 128, 8, 3, 8, 2, 128, 32),
}


def _pow2_at_least(n):
  return 1 << max(n - 1, 0).bit_length()


def _shrink(blocks, q, k, stages, fits):
  """Fewer pipeline stages first (down to 2), then halve the larger of the q/k blocks (q on a tie) down to
  MIN_BLOCK, then one stage: the first configuration `fits` accepts, or None."""
  while not fits(blocks):
    bq, bk, st = getattr(blocks, q), getattr(blocks, k), getattr(blocks, stages)
    if st > 2:
      blocks = blocks._replace(**{stages: st - 1})
    elif max(bq, bk) > MIN_BLOCK:
      blocks = blocks._replace(**({q: bq // 2} if bq >= bk else {k: bk // 2}))
    elif st > 1:
      blocks = blocks._replace(**{stages: st - 1})
    else:
      return None
  return blocks


def gpu_blocks(head_dim, t, blocks=None, *, itemsize=2, budget=None):
  """The table entry for head_dim (or `blocks` if given), each block capped at the next power of two >= T.

  Without explicit `blocks`, the entry is shrunk (`_shrink`, forward and backward apart) until every kernel's
  shared-memory footprint (`gpu_smem.attention`, operands of `itemsize` bytes) fits `budget` (default: this
  host's GPU, else an H100's); explicit blocks that do not fit raise.
  """
  given = blocks is not None
  if blocks is None:
    blocks = GPU_BLOCKS[128 if head_dim > 64 else 64]
  cap = max(MIN_BLOCK, _pow2_at_least(t))
  sizes = [min(b, cap) for b in block_sizes(blocks)]
  for b in sizes:
    if b < MIN_BLOCK or b & (b - 1):
      raise ValueError(f'attention block sizes must be powers of two >= {MIN_BLOCK}, got {block_sizes(blocks)}')
  blocks = blocks._replace(**dict(zip(('fwd_q', 'fwd_k', 'bwd_q', 'bwd_k', 'dq_q', 'dq_k'), sizes)))
  budget = gpu_smem.device_budget() if budget is None else budget
  fits = lambda kernel: lambda b: gpu_smem.attention(head_dim, itemsize, b)[kernel] <= budget
  if given:
    if max(gpu_smem.attention(head_dim, itemsize, blocks).values()) > budget:
      raise ValueError(f'attention blocks {tuple(blocks)} need {gpu_smem.attention(head_dim, itemsize, blocks)} '
                       f'bytes of shared memory at head dim {head_dim}, {itemsize}-byte inputs; the budget is '
                       f'{budget}')
    return blocks
  # The dQ kernel shrinks from the dK/dV kernel's result: they share the stage count (fewer stages only shrink
  # the dK/dV kernel further).
  fwd = _shrink(blocks, 'fwd_q', 'fwd_k', 'fwd_stages', fits('attention.forward'))
  dkv = _shrink(blocks, 'bwd_q', 'bwd_k', 'bwd_stages', fits('attention.dkv'))
  dq = dkv and _shrink(dkv, 'dq_q', 'dq_k', 'bwd_stages', fits('attention.dq'))
  if fwd is None or dq is None:
    raise ValueError(f'no attention block configuration fits {budget} bytes of shared memory at head dim '
                     f'{head_dim} with {itemsize}-byte inputs')
  return dq._replace(fwd_q=fwd.fwd_q, fwd_k=fwd.fwd_k, fwd_stages=fwd.fwd_stages)


BLOCK_CAP_TS = (1, 16, 32, 64, 128, 1 << 20)  # One T per distinct cap gpu_blocks applies.


def all_gpu_blocks(budget=None, head_dims=(64, 128), itemsizes=(2,)):
  """Every distinct (head dim, itemsize, blocks) `gpu_blocks` can return for the sequence lengths a model may use."""
  out = []
  for d in head_dims:
    for it in itemsizes:
      for t in BLOCK_CAP_TS:
        cfg = gpu_blocks(d, t, itemsize=it, budget=budget)
        if (d, it, cfg) not in out:
          out.append((d, it, cfg))
  return out


TPU_LANES = 128  # Splash blocks must be multiples of the 128-wide lane dimension.
TPU_BLOCK = 512
# Splash's block tables (next block, block mask) sit in the kernel's scalar memory, 1 MiB on v5p; 768 KiB is what
# causal tables take at 262K tokens in 512-blocks, which Mosaic compiles. Longer rows attend in query chunks.
TPU_TABLE_BYTES = 3 << 18


def tpu_blocks(t, block=None):
  """(padded T, splash block): T rounded up to the block, the block the largest of 512/256/128 not above T."""
  if block is None:
    block = TPU_BLOCK
    while block > TPU_LANES and block >= 2 * t:
      block //= 2
  if block % TPU_LANES:
    raise ValueError(f'splash block sizes must be multiples of {TPU_LANES}, got {block}')
  return -(-t // block) * block, block
