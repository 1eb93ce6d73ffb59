"""What the two chunked scans in plain XLA ops share (linear_scan/xla.py, delta_rule/xla.py): the chunked layout,
the per-chunk sums of log gates and their decay matrix, GVA folding, the initial state and the output's layout.

Layout: chunk index first, then batch and key head, then the value heads grouped under it ([N, B, Hk, G, C, ...]),
so every matmul has leading batch dimensions and the scan over chunks needs no transposes.
"""

import functools

import jax
import jax.numpy as jnp

from hybrid_jax.kernels.linear_scan.reference import compute_dtype

_HIGHEST = jax.lax.Precision.HIGHEST


def mm(subscripts, a, b, *, dtype):
  """a and b contracted by einsum `subscripts`, accumulating in `dtype`: fp32 and fp64 operands at full precision
  (no TF32 on GPU); two bf16 / fp16 operands through `narrow_mm`, whose backward keeps its products narrow too."""
  if a.dtype == b.dtype and jnp.dtype(a.dtype).itemsize == 2 and dtype == jnp.float32:
    return narrow_mm(subscripts, a, b)
  return jnp.einsum(subscripts, a, b, preferred_element_type=dtype, precision=_HIGHEST)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def narrow_mm(subscripts, a, b):
  """einsum of two operands of one 16-bit dtype with fp32 accumulation, as the Pallas scans' `dot`.

  Autodiff would transpose it into products of the fp32 cotangent with a 16-bit operand, which run as fp32
  products (no tensor cores / single-pass MXU); here the backward rounds the cotangent to the operands' dtype
  first, as the Pallas scans' backward rounds its intermediates, and accumulates in fp32 again.
  """
  return jnp.einsum(subscripts, a, b, preferred_element_type=jnp.float32)


def _narrow_fwd(subscripts, a, b):
  return narrow_mm(subscripts, a, b), (a, b)


def _narrow_bwd(subscripts, operands, g):
  _, transpose = jax.vjp(lambda a, b: jnp.einsum(subscripts, a, b), *operands)
  return transpose(g.astype(operands[0].dtype))


narrow_mm.defvjp(_narrow_fwd, _narrow_bwd)


def to_chunks(q, k, v, log_decay, beta, chunk_size):
  """Pads T to N*C and splits it: q/k [N,B,Hk,C,K], v [N,B,Hk,G,C,V], gates/beta [N,B,Hk,G,C] in fp32+.

  Padding uses k = v = 0, g = 0 and beta = 0, under which a token leaves the state exactly unchanged.
  """
  b, t, hk, _ = q.shape
  hv = v.shape[2]
  ct = compute_dtype(q.dtype, v.dtype)
  n = -(-t // chunk_size)

  def split(x, grouped):
    x = jnp.pad(x, [(0, 0), (0, n * chunk_size - t)] + [(0, 0)] * (x.ndim - 2))
    x = x.reshape(b, n, chunk_size, *x.shape[2:])
    if not grouped:  # [B,N,C,H,D] -> [N,B,H,C,D]
      return x.transpose(1, 0, 3, 2, 4)
    x = x.reshape(b, n, chunk_size, hk, hv // hk, *x.shape[4:])
    return jnp.moveaxis(x, (1, 2), (0, 4))  # [B,N,C,Hk,G,...] -> [N,B,Hk,G,C,...]

  beta = None if beta is None else split(beta.astype(ct), True)
  return split(q, False), split(k, False), split(v, True), split(log_decay.astype(ct), True), beta, ct


def segment_sums(g):
  """seg[..., i, j] = sum_{j < s <= i} g_s = G_i - G_j for i >= j (0 above the diagonal); g [..., C].

  Returns [..., C, C]. Summing each segment directly (a log-depth associative scan), rather than subtracting two
  cumulative sums, keeps exp(G_i - G_j) and its gradient accurate to the segment's own size when G itself is
  large (strong decay), and leaves the diagonal exactly 0 with no gradient through it.
  """
  c = g.shape[-1]
  rows = jnp.broadcast_to(g[..., :, None], g.shape + (c,))  # rows[..., i, j] = g_i
  return jax.lax.associative_scan(jnp.add, jnp.where(jnp.tril(jnp.ones((c, c), bool), -1), rows, 0), axis=-2)


def decay_matrix(seg, strict=False):
  """Gamma[..., i, j] = exp(G_i - G_j) for i >= j (i > j if strict), else exactly 0.

  The exponent is set to -inf before exp, so no masked entry is ever evaluated (a `where` after exp would give
  NaN gradients where the masked exponent overflows).
  """
  c = seg.shape[-1]
  keep = jnp.tril(jnp.ones((c, c), bool), -1 if strict else 0)
  return jnp.exp(jnp.where(keep, seg, jnp.array(-jnp.inf, seg.dtype)))


def fold(x):
  """[N,B,H,G,R,D] -> [N,B,H,R,G*D]: value heads of a group side by side, so a product with a per-key-head
  operand is one plain batched matmul (a separate g axis made XLA's CPU dot several times slower)."""
  return jnp.moveaxis(x, 3, -2).reshape(*x.shape[:3], x.shape[4], -1)


def unfold(y, grp):
  """Inverse of `fold`: [N,B,H,R,G*D] -> [N,B,H,G,R,D]."""
  return jnp.moveaxis(y.reshape(*y.shape[:4], grp, -1), -2, 3)


def initial(initial_state, b, hk, grp, dk, dv, ct):
  if initial_state is None:
    return jnp.zeros((b, hk, grp, dk, dv), ct)
  return initial_state.astype(ct).reshape(b, hk, grp, dk, dv)


def finish(o, t, scale, dtype):
  """[N,B,Hk,G,C,V] -> [B,T,Hv,V] in the input dtype."""
  n, b, hk, grp, c, dv = o.shape
  o = jnp.moveaxis(scale * o, (0, 4), (1, 2))  # [B,N,C,Hk,G,V]
  return o.reshape(b, n * c, hk * grp, dv)[:, :t].astype(dtype)
