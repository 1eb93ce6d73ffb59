"""Chunkwise scalar-decay scan (docs/KERNELS.md, "Scalar-decay linear scan (Lightning, Mamba-2)") in plain XLA ops.

Within a chunk of C tokens everything is a masked matmul; only the C-times-shorter state recurrence across chunks
is sequential (`lax.scan` over chunks). Layout: chunk index first, then batch and head, so every matmul has
leading batch dimensions (XLA's fast batched-GEMM path; head-minor layouts were several times slower on CPU) and
the scan needs no transposes. GVA groups value heads under their key head (axes h, g) instead of repeating q/k.
Numerics: gates, cumulative gates and states are fp32 (fp64 for fp64 inputs); every exp argument is <= 0 by
construction (G_i, G_i - G_j for i >= j, gamma - G_j, gamma) and masked to -inf before exp. Matmul operands are
rounded to the input dtype and accumulate in fp32, as in the Pallas scans (and fla): bf16 inputs run every product
on the tensor cores / MXU, while the state itself is carried in fp32, so its rounding never compounds.
"""

import jax
import jax.numpy as jnp

from hybrid_jax.kernels.xla_scan_common import decay_matrix, finish, fold, initial, mm, segment_sums, to_chunks, unfold


def linear_scan(q, k, v, log_decay, *, scale, initial_state, chunk_size):
  b, t, hk, dk = q.shape
  dv = v.shape[3]
  op = jnp.result_type(q.dtype, v.dtype)  # Matmul operand dtype.
  q, k, v, g, _, ct = to_chunks(q, k, v, log_decay, None, chunk_size)
  grp = v.shape[3]
  v = v.astype(op)
  cum = jnp.cumsum(g, axis=-1)  # Local inclusive cumulative gate G [N,B,H,G,C], restarting each chunk.
  seg = segment_sums(g)  # [N,B,H,G,C,C]
  # Intra-chunk: ((Q K^T) o Gamma) V, diagonal included.
  qk = mm('nbhik,nbhjk->nbhij', q, k, dtype=ct)
  o = mm('nbhgij,nbhgjv->nbhgiv', (qk[:, :, :, None] * decay_matrix(seg)).astype(op), v, dtype=ct)
  # Chunk state increments: (K o exp(gamma - G))^T V; gamma - G_j is the last row of the segment sums.
  decayed_v = (jnp.exp(seg[..., -1, :])[..., None] * v).astype(op)
  delta = unfold(mm('nbhck,nbhcv->nbhkv', k, fold(decayed_v), dtype=ct), grp)

  def body(s, x):
    decay, d = x
    return jnp.exp(decay)[..., None, None] * s + d, s

  s0 = initial(initial_state, b, hk, grp, dk, dv, ct)
  final, starts = jax.lax.scan(body, s0, (cum[..., -1], delta))  # starts: state entering each chunk.
  # Inter-chunk: (Q o exp(G)) S_start.
  o = o + jnp.exp(cum)[..., None] * unfold(mm('nbhck,nbhkv->nbhcv', q, fold(starts).astype(op), dtype=ct), grp)
  return finish(o, t, scale, q.dtype), final.reshape(b, hk * grp, dk, dv)
