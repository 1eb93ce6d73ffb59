"""Chunkwise gated delta rule in the UT / WY form (docs/KERNELS.md, "Gated DeltaNet (the gated delta rule)") in
plain XLA ops.

Per chunk: L = strictly_lower((beta K K^T) o Gamma), T = (I + L)^-1, W = T (beta K o exp(G)), U = T (beta V);
the only sequential pass (a `lax.scan` over chunks) is V_new = U - W S, S <- exp(gamma) S + (K o exp(gamma - G))^T
V_new. T comes from forward
substitution with a closed-form backward (`unit_lower_inverse`); everything else is plain autodiff.
Numerics as in the scalar-decay scan: fp32 gates and states, exponents <= 0 and masked before exp.
"""

import jax
import jax.numpy as jnp

from hybrid_jax.kernels.xla_scan_common import decay_matrix, finish, fold, initial, mm, segment_sums, to_chunks, unfold


@jax.custom_vjp
def unit_lower_inverse(lower):
  """(I + L)^-1 for strictly lower-triangular L [..., C, C], by forward substitution over the C rows.

  Row i of T is e_i - L_i T (rows >= i of T are still zero), so C steps of one batched vector-matrix product.
  A batched triangular solve is far slower on CPU, and truncated Neumann products lose accuracy when L is near
  its bound. The backward is closed-form, dL = -T^T dT T^T (strictly lower part), so no per-row residuals.
  """
  c = lower.shape[-1]
  eye = jnp.eye(c, dtype=lower.dtype)

  def row(i, inv):
    li = jax.lax.dynamic_index_in_dim(lower, i, axis=-2, keepdims=False)
    new = eye[i] - jnp.einsum('...j,...jk->...k', li, inv, precision=jax.lax.Precision.HIGHEST)
    return jax.lax.dynamic_update_index_in_dim(inv, new, i, axis=-2)

  return jax.lax.fori_loop(0, c, row, jnp.zeros_like(lower))


def _inverse_fwd(lower):
  inv = unit_lower_inverse(lower)
  return inv, inv


def _inverse_bwd(inv, d_inv):
  t = jnp.swapaxes(inv, -1, -2)
  d_lower = -jnp.matmul(jnp.matmul(t, d_inv, precision=jax.lax.Precision.HIGHEST), t,
                        precision=jax.lax.Precision.HIGHEST)
  return (jnp.tril(d_lower, -1),)


unit_lower_inverse.defvjp(_inverse_fwd, _inverse_bwd)


def gated_delta_rule(q, k, v, log_decay, beta, *, scale, initial_state, chunk_size):
  b, t, hk, dk = q.shape
  dv = v.shape[3]
  q, k, v, g, beta, ct = to_chunks(q, k, v, log_decay, beta, chunk_size)  # [N,B,H,(G,)C,...]
  grp = v.shape[3]
  kf = k.astype(ct)[:, :, :, None]  # [N,B,H,1,C,K]
  cum = jnp.cumsum(g, axis=-1)
  seg = segment_sums(g)
  # L = strictly lower (beta_i k_i.k_j exp(G_i - G_j)), beta scaling rows; T = (I + L)^-1.
  kk = mm('nbhik,nbhjk->nbhij', k, k, dtype=ct)
  inv = unit_lower_inverse(beta[..., :, None] * kk[:, :, :, None] * decay_matrix(seg, strict=True))
  # W = T (beta K o exp(G)), U = T (beta V).
  w = mm('nbhgij,nbhgjk->nbhgik', inv, (beta * jnp.exp(cum))[..., None] * kf, dtype=ct)
  u = mm('nbhgij,nbhgjv->nbhgiv', inv, beta[..., None] * v.astype(ct), dtype=ct)
  kdec = jnp.exp(seg[..., -1, :])[..., None] * kf  # K o exp(gamma - G)

  def body(s, x):
    decay, w, u, kd = x
    v_new = u - mm('bhgck,bhgkv->bhgcv', w, s, dtype=ct)
    s_next = jnp.exp(decay)[..., None, None] * s + mm('bhgck,bhgcv->bhgkv', kd, v_new, dtype=ct)
    return s_next, (v_new, s)

  s0 = initial(initial_state, b, hk, grp, dk, dv, ct)
  final, (v_new, starts) = jax.lax.scan(body, s0, (cum[..., -1], w, u, kdec))
  qk = mm('nbhik,nbhjk->nbhij', q, k, dtype=ct)
  o = mm('nbhgij,nbhgjv->nbhgiv', qk[:, :, :, None] * decay_matrix(seg), v_new, dtype=ct)
  o = o + jnp.exp(cum)[..., None] * unfold(mm('nbhck,nbhkv->nbhcv', q, fold(starts), dtype=ct), grp)
  return finish(o, t, scale, q.dtype), final.reshape(b, hk * grp, dk, dv)
