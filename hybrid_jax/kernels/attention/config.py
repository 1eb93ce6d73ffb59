"""Block sizes for the Pallas attention kernels: one small table per backend, keyed by head dim.

Entries are starting points for an H200 (Triton) until the benchmark tunes them; every entry the code can pick is
exercised by the GPU parity script (scripts/device/attention_gpu.sh). Blocks shrink for short sequences so tiny
inputs do not pad to a whole 128-row block.
"""

from typing import NamedTuple

MIN_BLOCK = 16  # Triton dots need at least 16 rows/columns.


class GpuBlocks(NamedTuple):
  """Forward q/kv blocks, backward q/kv blocks (shared by the dK/dV and dQ kernels), Triton launch options."""
  fwd_q: int = 128
  fwd_k: int = 64
  bwd_q: int = 64
  bwd_k: int = 64
  fwd_warps: int = 4
  fwd_stages: int = 3
  bwd_warps: int = 4
  bwd_stages: int = 2


# Head dim -> blocks. Smaller head dims use the 64 entry.
GPU_BLOCKS = {
    64: GpuBlocks(128, 64, 64, 64, 4, 3, 4, 2),
    128: GpuBlocks(128, 64, 64, 64, 8, 3, 8, 2),
}


def _pow2_at_least(n):
  return 1 << max(n - 1, 0).bit_length()


def gpu_blocks(head_dim, t, blocks=None):
  """The table entry for head_dim (or `blocks` if given), each block capped at the next power of two >= T."""
  if blocks is None:
    blocks = GPU_BLOCKS[128 if head_dim > 64 else 64]
  cap = max(MIN_BLOCK, _pow2_at_least(t))
  sizes = [min(b, cap) for b in blocks[:4]]
  for b in sizes:
    if b < MIN_BLOCK or b & (b - 1):
      raise ValueError(f'attention block sizes must be powers of two >= {MIN_BLOCK}, got {blocks[:4]}')
  return blocks._replace(fwd_q=sizes[0], fwd_k=sizes[1], bwd_q=sizes[2], bwd_k=sizes[3])


def all_gpu_blocks():
  """Every distinct configuration `gpu_blocks` can return for the sequence lengths a model may use."""
  out = []
  for d, blocks in GPU_BLOCKS.items():
    for t in (1, 16, 32, 64, 128, 1 << 20):
      cfg = gpu_blocks(d, t)
      if (d, cfg) not in out:
        out.append((d, cfg))
  return out


TPU_LANES = 128  # Splash blocks must be multiples of the 128-wide lane dimension.
TPU_BLOCK = 512


def tpu_blocks(t, block=None):
  """(padded T, splash block): T rounded up to the block, the block the largest of 512/256/128 not above T."""
  if block is None:
    block = TPU_BLOCK
    while block > TPU_LANES and block >= 2 * t:
      block //= 2
  if block % TPU_LANES:
    raise ValueError(f'splash block sizes must be multiples of {TPU_LANES}, got {block}')
  return -(-t // block) * block, block
