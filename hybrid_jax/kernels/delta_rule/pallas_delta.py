"""The gated delta rule as Pallas kernels for both backends (`pallas_scan_common` holds what differs), with a
custom VJP.

Forward (docs/KERNELS.md, "Gated DeltaNet (the gated delta rule)"), per chunk with beta = diag(beta_i):
1. intra kernel (chunk-parallel): L = strictly_lower((beta K K^T) o Gamma), T = (I + L)^-1 (GPU: 16x16 forward
   substitution + block merge; TPU: `recursive_inverse`, in whole-chunk masked matmuls),
   W = T (beta K o exp(G)), U = T (beta V); T is stored for the backward;
2. sequential pass: V_new = U - W S, S <- exp(gamma) S + (K o exp(gamma - G))^T V_new (stores S_n and V_new);
3. output kernel (`pallas_scan_common.output_kernel`, the scalar-decay scan's, with V_new for V).
Backward:
1. reverse pass: dV_new = scale ((Q K^T) o Gamma)^T dO + (K o exp(gamma - G)) dH,
   dH <- exp(gamma) dH + scale (Q o exp(G))^T dO - W^T dV_new (stores the gradient of every chunk's end state);
2. chunk-parallel kernel: with R = T^T dV_new, the inverse's gradient collapses to dL = -R V_new^T (because
   T (beta V - beta K o exp(G) S) = V_new), so dU = R, dW-terms = -R S^T and no second inverse is needed.
Gate gradient: over the global cumulative gate the state is S_t = exp(G^_t) S~_t where S~ sees q_t exp(G^_t) and
v_t exp(-G^_t) only, so dL/dG^_t = <q_t, dq_t> - <v_t, dv_t> (+ <dS_T, S_T> at the end), reverse-summed over t.
As for the scalar-decay scan, the kernel takes that per chunk with the exactly cancelling O(1) terms removed
(`pallas_scan_common.local_gate_grad`): the products carrying exp(G_i - G_j) (Q K^T in the output, beta K K^T in L),
W's exp(G_i), the incoming state's exp(G_i) and the outgoing state's exp(gamma - G_j).
"""

import functools

import jax
from jax.experimental import pallas as pl
import jax.numpy as jnp

from hybrid_jax.kernels import pallas_scan_common as pc

F32 = pc.F32
SUB = pc.MIN_CHUNK['gpu']  # GPU forward-substitution block (Triton dots need 16 rows).


LEAF = 4  # Diagonal blocks of `recursive_inverse` solved by substitution: the fewest products for C = 64 and 128.


def recursive_inverse(lower, leaf=LEAF):
  """(I + L)^-1 of a strictly lower-triangular L [C, C] by recursive block inversion, in whole-chunk matmuls.

  Leaves: every `leaf` x `leaf` diagonal block is inverted at once by forward substitution (row i of each block in
  one masked product). Then, doubling the block size s: each pair of diagonal blocks [[A, 0], [X, B]] has inverse
  [[A^-1, 0], [-B^-1 X A^-1, B^-1]], which is T - T X T with T the block-diagonal inverse so far and X the
  lower-left quadrants of L, so every pair of a level merges in two C x C products. Its error grows like forward
  substitution's (bounded by the conditioning of I + L, not by the powers of L as a Neumann or product series'),
  and it costs (leaf - 1) + 2 ceil(log2(C / leaf)) products (docs/KERNELS.md, "The intra-chunk inverse").
  """
  c = lower.shape[0]
  r, cc = pc.iotas(c)
  diag = jnp.where(r // leaf == cc // leaf, lower, 0.0)
  inv = (r == cc).astype(F32)
  for i in range(1, min(leaf, c)):
    inv = inv - pc.dot(jnp.where(r % leaf == i, diag, 0.0), inv, F32)
  size = leaf
  while size < c:
    # Lower-left quadrant of each 2*size diagonal block: rows in its odd half, columns in its even half.
    quadrant = jnp.where(((r // size) % 2 == 1) & (cc // size == r // size - 1), lower, 0.0)
    inv = inv - pc.dot(inv, pc.dot(quadrant, inv, F32), F32)
    size *= 2
  return inv


def intra_kernel_whole(k_ref, v_ref, g_ref, b_ref, t_ref, w_ref, u_ref, *, cfg):
  """T, W, U of one chunk with whole-chunk matmuls only (TPU: Mosaic cannot slice values into 16-wide blocks)."""
  k, v, gates, beta = k_ref[...], v_ref[...], pc.Gates(g_ref[...]), b_ref[...]
  lower = beta * pc.dot(k, k, cfg.dtype, tb=True) * gates.decay(strict=True)
  inv = recursive_inverse(lower)
  t_ref[...] = inv
  w_ref[...] = pc.dot(inv, beta * gates.exp() * k, F32).astype(w_ref.dtype)
  u_ref[...] = pc.dot(inv, beta * v, F32).astype(u_ref.dtype)


def intra_kernel_blocked(k_ref, v_ref, g_ref, b_ref, t_ref, w_ref, u_ref, *, cfg):
  """T, W, U of one chunk from 16-row blocks (GPU): forward substitution on the diagonal blocks, then the block
  merge T_ab = -T_aa sum_{a > m >= b} L_am T_mb. Blocks are sliced from the refs (Triton cannot slice values)."""
  nb = cfg.chunk // SUB
  rows = lambda ref, a: ref[pl.ds(a * SUB, SUB), :]
  ks = [rows(k_ref, a) for a in range(nb)]
  gs = [pc.Gates(rows(g_ref, a)) for a in range(nb)]
  betas = [rows(b_ref, a) for a in range(nb)]
  lower = {}
  for a in range(nb):
    for b in range(a + 1):
      kk = pc.dot(ks[a], ks[b], cfg.dtype, tb=True)
      # Block a lies after block b: G_i - G_j <= 0 for every pair; the diagonal block masks its upper part.
      gam = gs[a].decay(strict=True) if a == b else gs[a].cross_decay(gs[b])
      lower[a, b] = betas[a] * kk * gam
  inv = {}
  for a in range(nb):
    inv[a, a] = recursive_inverse(lower[a, a], leaf=SUB)  # One leaf: plain forward substitution.
    for b in range(a - 1, -1, -1):
      acc = sum(pc.dot(lower[a, m], inv[m, b], F32) for m in range(b, a))
      inv[a, b] = -pc.dot(inv[a, a], acc, F32)
  zeros = jnp.zeros((SUB, SUB), F32)
  for a in range(nb):
    for b in range(nb):
      t_ref[pl.ds(a * SUB, SUB), pl.ds(b * SUB, SUB)] = inv[a, b] if b <= a else zeros
    bk = [betas[b] * gs[b].exp() * ks[b] for b in range(a + 1)]
    w = sum(pc.dot(inv[a, b], bk[b], F32) for b in range(a + 1))
    u = sum(pc.dot(inv[a, b], betas[b] * rows(v_ref, b), F32) for b in range(a + 1))
    w_ref[pl.ds(a * SUB, SUB), :] = w.astype(w_ref.dtype)
    u_ref[pl.ds(a * SUB, SUB), :] = u.astype(u_ref.dtype)


def state_step(cfg, tiles, s):
  k, w, u, gates = tiles[0], tiles[1], tiles[2], pc.Gates(tiles[3])
  v_new = u - pc.dot(w, s, F32)
  return gates.exp_gamma() * s + pc.dot(k * gates.tail(), v_new, F32, ta=True), [v_new]


def dstate_step(cfg, tiles, dh):
  q, k, w, do, gates = tiles[0], tiles[1], tiles[2], tiles[3], pc.Gates(tiles[4])
  a = pc.dot(q, k, cfg.dtype, tb=True) * gates.decay()
  dv_new = cfg.scale * pc.dot(a, do, cfg.dtype, ta=True) + pc.dot(k * gates.tail(), dh, cfg.dtype)
  dh = (gates.exp_gamma() * dh + cfg.scale * pc.dot(q * gates.exp(), do, cfg.dtype, ta=True)
        - pc.dot(w, dv_new, cfg.dtype, ta=True))
  return dh, []


def grads_kernel(q_ref, k_ref, v_ref, g_ref, b_ref, do_ref, t_ref, vn_ref, s_ref, dh_ref,
                 dq_ref, dk_ref, dv_ref, db_ref, dcum_ref, *, cfg):
  """dq, dk (this value head's share), dv, dbeta and dg of one chunk."""
  q, k, v, gates, beta, do = q_ref[...], k_ref[...], v_ref[...], pc.Gates(g_ref[...]), b_ref[...], do_ref[...]
  inv, v_new, s, dh = t_ref[...], vn_ref[...], s_ref[...], dh_ref[...]
  cd = cfg.dtype
  gam, gam_strict = gates.decay(), gates.decay(strict=True)
  e, tail = gates.exp(), gates.tail()
  kk = pc.dot(k, k, cd, tb=True) * gam_strict  # (K K^T) o Gamma, strictly lower
  qk = pc.dot(q, k, cd, tb=True)
  a = qk * gam
  da = cfg.scale * pc.dot(do, v_new, cd, tb=True) * gam
  dv_new = cfg.scale * pc.dot(a, do, cd, ta=True) + pc.dot(k * tail, dh, cd)
  dq_inter = cfg.scale * e * pc.dot(do, s, cd, tb=True)
  dq = pc.dot(da, k, cd) + dq_inter
  r = pc.dot(inv, dv_new, F32, ta=True)  # T^T dV_new = dU
  rs = pc.dot(r, s, F32, tb=True)  # -dW
  dl = -pc.dot(r, v_new, F32, tb=True)  # Only its strictly lower part matters; every use below masks it.
  p = dl * beta * gam_strict
  dk = (pc.dot(da, q, cd, ta=True) + tail * pc.dot(v_new, dh, cd, tb=True) - beta * e * rs
        + pc.dot(p, k, F32) + pc.dot(p, k, F32, ta=True))
  vf, kf = v.astype(F32), k.astype(F32)
  dv = beta * r
  rsk = pc.accurate_sum(rs * kf, 1)
  db_ref[...] = jnp.sum(r * vf, axis=1, keepdims=True) - e * rsk + jnp.sum(dl * kk, axis=1, keepdims=True)
  # Gate: products carrying exp(G_i - G_j) are Q K^T in the output and beta K K^T in L; W carries exp(G_i).
  rr, cc = pc.iotas(cfg.chunk)
  pair = jnp.where(cc < rr, da * qk, 0.0) + dl * beta * kk
  dk_inter = pc.accurate_sum(kf * tail * pc.dot(v_new, dh, cd, tb=True), 1)
  dcum_ref[...] = pc.local_gate_grad(
      pair, pc.accurate_sum(q.astype(F32) * dq_inter, 1) - beta * e * rsk, dk_inter,
      gates.exp_gamma() * pc.total(dh * s))
  dq_ref[...] = dq.astype(dq_ref.dtype)
  dk_ref[...] = dk.astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _forward(cfg, q, k, v, g, beta, s0):
  n = g.shape[1] // cfg.chunk
  gc = pc.local_cumsum(cfg, g)
  bc = pc.column(cfg, beta)
  per = lambda d: v.shape[:-1] + (d,)
  intra = intra_kernel_blocked if cfg.backend == 'gpu' else intra_kernel_whole
  inv, w, u = pc.parallel(cfg, intra, [(k, 'key'), (v, 'value'), (gc, 'value'), (bc, 'value')],
                          [('value', per(cfg.chunk), F32), ('value', per(k.shape[-1]), F32),
                           ('value', v.shape, F32)], n)
  states, final, v_new = pc.sequential(
      cfg, functools.partial(state_step, cfg),
      [(k, 'key', False), (w, 'value', False), (u, 'value', True), (gc, 'value', False)], s0, n,
      tok_outputs=[(cfg.block_v, F32)])
  (o,) = pc.parallel(cfg, functools.partial(pc.output_kernel, carried=F32),
                     [(q, 'key'), (k, 'key'), (v_new, 'value'), (gc, 'value'), (states, 'state')],
                     [('value', v.shape, q.dtype)], n)
  return o, final, (q, k, v, gc, bc, inv, w, v_new, states, final)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def delta(cfg, q, k, v, g, beta, s0):
  """Padded, laid-out inputs (g, beta [B, Tp, Hv]; s0 [B, Hv, K, V] fp32) -> (o, final state)."""
  o, final, _ = _forward(cfg, q, k, v, g, beta, s0)
  return o, final


def _delta_fwd(cfg, q, k, v, g, beta, s0):
  o, final, res = _forward(cfg, q, k, v, g, beta, s0)
  return (o, final), res


def _delta_bwd(cfg, res, cts):
  q, k, v, gc, bc, inv, w, v_new, states, final = res
  do, d_final = cts
  n = states.shape[2] // q.shape[-1]
  dh, ds0 = pc.sequential(
      cfg, functools.partial(dstate_step, cfg),
      [(q, 'key', False), (k, 'key', False), (w, 'value', False), (do, 'value', True), (gc, 'value', False)],
      d_final.astype(F32), n, reverse=True)
  per = lambda d: v.shape[:-1] + (d,)
  dq, dk, dv, db, dcum = pc.parallel(
      cfg, grads_kernel,
      [(q, 'key'), (k, 'key'), (v, 'value'), (gc, 'value'), (bc, 'value'), (do, 'value'), (inv, 'value'),
       (v_new, 'value'), (states, 'state'), (dh, 'state')],
      [('value', per(q.shape[-1]), F32), ('value', per(k.shape[-1]), F32), ('value', v.shape, v.dtype),
       ('value', per(1), F32), ('value', per(1), F32)], n)
  dg = pc.uncolumn(cfg, dcum)
  return (pc.sum_group(cfg, dq).astype(q.dtype), pc.sum_group(cfg, dk).astype(k.dtype), dv, dg,
          pc.uncolumn(cfg, db), ds0)


delta.defvjp(_delta_fwd, _delta_bwd)


def gated_delta_rule(backend, q, k, v, log_decay, beta, *, scale, initial_state, chunk_size, interpret=None,
                     block_v=None):
  """Contract of `hybrid_jax.kernels.gated_delta_rule` (arguments already validated by the api) on backend 'gpu'
  or 'tpu'; interpret and block_v as `pallas_scan.linear_scan`'s."""
  cfg = pc.make_cfg(backend, q, v, kernel='gated_delta_rule', scale=scale, chunk_size=chunk_size, block_v=block_v,
                    interpret=interpret)
  qp, kp, vp, tp, s0 = pc.padded_inputs(cfg, q, k, v, initial_state)  # g = beta = 0 in the padding
  o, final = delta(cfg, qp, kp, vp, pc.pad_time(log_decay.astype(F32), tp), pc.pad_time(beta.astype(F32), tp), s0)
  return pc.from_layout(cfg, o)[:, :q.shape[1]], final
