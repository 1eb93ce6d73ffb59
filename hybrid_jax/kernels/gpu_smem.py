"""Shared-memory footprints of the Pallas GPU (Triton) kernels, and the per-device budget they must fit.

A kernel whose footprint exceeds the device's per-block limit does not compile ("Shared memory size limit
exceeded"), so block and chunk choices are checked against this model before any kernel is built. The model
(docs/KERNELS.md, "Shared memory on GPU"), for Triton as XLA compiles Pallas kernels:
- every matrix tile a program loads once (outside its loops) is staged in shared memory for the whole program;
  [C, 1] / [C, 2] columns stay in registers;
- a matrix tile loaded inside a loop over blocks is software-pipelined: `stages` buffers of it;
- a tile computed in registers and then used transposed in a dot (P^T, dS^T, the scans' dA^T) goes through shared
  memory; the largest such tile counts once (they are not live together).
A staged tile takes the bytes of the dots it feeds: 4 if any dot it feeds (directly or through elementwise ops)
multiplies fp32 operands, else the input dtype's. The model reproduces exactly the two footprints an H200 reported
for the scans (float32, head dim 128, chunk 64: 278,528 bytes for linear_scan, 327,680 for gated_delta_rule,
`tests/test_gpu_smem.py`); the pipelining factor (`stages` buffers, not `stages - 1`) is the conservative reading.
"""

import jax

# Largest dynamic shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin) by compute capability.
BUDGET_BY_CAPABILITY = {'9.0': 232448, '10.0': 232448, '8.0': 166912, '8.6': 101376, '8.7': 166912,
                        '8.9': 101376, '12.0': 101376}
H100_BUDGET = BUDGET_BY_CAPABILITY['9.0']  # H100, H200, GH200.
A100_BUDGET = BUDGET_BY_CAPABILITY['8.0']
DEFAULT_BUDGET = H100_BUDGET  # The project's GPU; used when no GPU is visible (CPU tracing, interpret mode).


def device_budget(device=None) -> int:
  """Shared-memory bytes per block on `device` (default: the first GPU, if any; else DEFAULT_BUDGET)."""
  if device is None:
    try:
      device = jax.devices('gpu')[0]
    except RuntimeError:
      return DEFAULT_BUDGET
  capability = getattr(device, 'compute_capability', None)
  if capability not in BUDGET_BY_CAPABILITY:
    return min(BUDGET_BY_CAPABILITY.values())  # An unknown GPU: the smallest budget listed, so choices still fit.
  return BUDGET_BY_CAPABILITY[capability]


def tile(rows, cols, nbytes):
  return rows * cols * nbytes


# Attention (hybrid_jax/kernels/attention/pallas_gpu.py): d head dim, `it` input bytes.


def attention(d, itemsize, blocks) -> dict:
  """Bytes per kernel for a `config.GpuBlocks`: forward, dQ and dK/dV."""
  it = itemsize
  fq, fk, bq, bk = blocks.fwd_q, blocks.fwd_k, blocks.bwd_q, blocks.bwd_k
  dq, dk = blocks.dq_q or bq, blocks.dq_k or bk
  fs, bs = blocks.fwd_stages, blocks.bwd_stages
  return {
      # q once; k, v pipelined; P is not transposed.
      'attention.forward': tile(fq, d, it) + fs * 2 * tile(fk, d, it),
      # q, dO once; k, v pipelined; dS @ K needs no transpose.
      'attention.dq': 2 * tile(dq, d, it) + bs * 2 * tile(dk, d, it),
      # k, v once; q, dO pipelined; P^T and dS^T (input dtype) transposed through shared memory.
      'attention.dkv': 2 * tile(bk, d, it) + bs * 2 * tile(bq, d, it) + tile(bq, bk, it),
  }


# Scans (hybrid_jax/kernels/linear_scan/pallas_scan.py, hybrid_jax/kernels/delta_rule/pallas_delta.py):
# c chunk, dk key dim, dv value dim, bv value block of the sequential passes, `it` input bytes, F = 4 (fp32).

F = 4


def linear_scan(c, dk, dv, bv, itemsize, stages) -> dict:
  it = itemsize
  return {
      # Loop: k [C, K], v [C, bv] pipelined; (K o tail)^T transposed.
      'linear_scan.state': stages * (tile(c, dk, it) + tile(c, bv, it)) + tile(c, dk, it),
      'linear_scan.dstate': stages * (tile(c, dk, it) + tile(c, bv, it)) + tile(c, dk, it),
      # q, k [C, K], v [C, V], the state [K, V] (rounded to the input dtype for its dot).
      'linear_scan.output': 2 * tile(c, dk, it) + tile(c, dv, it) + tile(dk, dv, it),
      # q, k, v, dO, the states S and dH; dA^T / A^T [C, C] transposed.
      'linear_scan.grads': 2 * tile(c, dk, it) + 2 * tile(c, dv, it) + 2 * tile(dk, dv, it) + tile(c, c, it),
  }


def gated_delta_rule(c, dk, dv, bv, itemsize, stages) -> dict:
  it = itemsize
  sub = 16  # pallas_delta.SUB: the blocked inverse works on 16-row blocks.
  return {
      # k rows [C, K] (input dtype), v rows [C, V] (fp32: beta V feeds fp32 dots); blocks of T stay in registers.
      'gated_delta_rule.intra': tile(c, dk, it) + tile(c, dv, F) + tile(sub, sub, F),
      # Loop: k [C, K], W [C, K] (fp32 storage), U [C, bv] (fp32) pipelined; (K o tail)^T transposed (an fp32
      # dot: the products with the carried S and V_new take fp32 operands).
      'gated_delta_rule.state': stages * (tile(c, dk, it) + tile(c, dk, F) + tile(c, bv, F)) + tile(c, dk, F),
      # Loop: q, k [C, K], W [C, K] (fp32), dO [C, bv]; A^T and W^T transposed (the larger counts).
      'gated_delta_rule.dstate': (stages * (2 * tile(c, dk, it) + tile(c, dk, F) + tile(c, bv, it))
                                  + max(tile(c, c, it), tile(c, dk, it))),
      'gated_delta_rule.output': 2 * tile(c, dk, it) + tile(c, dv, F) + tile(dk, dv, F),  # V_new and S: fp32 dots.
      # q, k, v, dO (input dtype), T [C, C] and V_new (fp32 dots), S (fp32: R S^T), dH (input dtype dots);
      # P^T [C, C] (fp32) transposed.
      'gated_delta_rule.grads': (2 * tile(c, dk, it) + 2 * tile(c, dv, it) + tile(c, c, F) + tile(c, dv, F)
                                 + tile(dk, dv, F) + tile(dk, dv, it) + tile(c, c, F)),
  }


SCANS = {'linear_scan': linear_scan, 'gated_delta_rule': gated_delta_rule}


def scan(kernel, c, dk, dv, bv, itemsize, stages=2) -> dict:
  """Bytes per Pallas kernel of one scan ('linear_scan' or 'gated_delta_rule')."""
  return SCANS[kernel](c, dk, dv, bv, itemsize, stages)


def worst(footprints: dict):
  """(name, bytes) of the largest footprint."""
  return max(footprints.items(), key=lambda kv: kv[1])


def scan_chunk(kernel, chunk, dk, dv, bv, itemsize, stages=2, budget=None):
  """The chunk a GPU scan kernel runs with: `chunk`, halved (down to 16) until every kernel of `kernel` fits
  `budget` (default: this host's GPU, else an H100's); None if even 16 does not fit. The chunk only changes how
  the work is tiled, not the result."""
  budget = device_budget() if budget is None else budget
  while chunk >= 16:
    if worst(scan(kernel, chunk, dk, dv, min(bv, dv), itemsize, stages))[1] <= budget:
      return chunk
    if chunk % 32:
      return None
    chunk //= 2
  return None
