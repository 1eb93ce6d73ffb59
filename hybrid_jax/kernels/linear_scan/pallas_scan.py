"""The scalar-decay scan as Pallas kernels for both backends (`pallas_scan_common` holds what differs), with a
custom VJP.

Forward: a sequential pass writes the state entering every chunk (S <- exp(gamma) S + (K o exp(gamma - G))^T V),
then a chunk-parallel kernel writes O = scale [((Q K^T) o Gamma) V + (Q o exp(G)) S_n].
Backward: a reverse sequential pass writes the gradient of the state leaving every chunk
(dH <- exp(gamma) dH + scale (Q o exp(G))^T dO, ending at d initial_state), then a chunk-parallel kernel writes
dq, dk (per value head, summed over GVA groups afterwards) and dv. The gate gradient needs no T x T object: over the
global cumulative gate, q_t only appears as q_t exp(G^_t) and k_t as k_t exp(-G^_t), so
dL/dG^_t = <q_t, dq_t> - <k_t, dk_t> (+ <dS_T, S_T> at the last token), and dL/dg_t is its reverse cumulative sum.
"""

import functools

import jax
import jax.numpy as jnp

from hybrid_jax.kernels import pallas_scan_common as pc

F32 = pc.F32


def state_step(cfg, tiles, s):
  k, v, gates = tiles[0], tiles[1], pc.Gates(tiles[2])
  return gates.exp_gamma() * s + pc.dot(k * gates.tail(), v, cfg.dtype, ta=True), []


def dstate_step(cfg, tiles, dh):
  q, do, gates = tiles[0], tiles[1], pc.Gates(tiles[2])
  return gates.exp_gamma() * dh + cfg.scale * pc.dot(q * gates.exp(), do, cfg.dtype, ta=True), []


def grads_kernel(q_ref, k_ref, v_ref, g_ref, do_ref, s_ref, dh_ref, dq_ref, dk_ref, dv_ref, dcum_ref, *, cfg):
  """dq, dk, dv and the gate gradient dL/dg of one chunk for one value head.

  s: state entering the chunk; dh: gradient of the state leaving it.
  """
  q, k, v, gates, do = q_ref[...], k_ref[...], v_ref[...], pc.Gates(g_ref[...]), do_ref[...]
  s, dh = s_ref[...], dh_ref[...]
  r, c = pc.iotas(cfg.chunk)
  gam = gates.decay()
  tail = gates.tail()
  qk = pc.dot(q, k, cfg.dtype, tb=True)
  a = qk * gam  # (Q K^T) o Gamma
  da = cfg.scale * pc.dot(do, v, cfg.dtype, tb=True) * gam  # d(Q K^T), masked and decayed
  dq_inter = cfg.scale * gates.exp() * pc.dot(do, s, cfg.dtype, tb=True)
  dk_inter = tail * pc.dot(v, dh, cfg.dtype, tb=True)
  dq = pc.dot(da, k, cfg.dtype) + dq_inter
  dk = pc.dot(da, q, cfg.dtype, ta=True) + dk_inter
  dv = cfg.scale * pc.dot(a, do, cfg.dtype, ta=True) + pc.dot(k * tail, dh, cfg.dtype)
  qf, kf = q.astype(F32), k.astype(F32)
  dcum_ref[...] = pc.local_gate_grad(
      jnp.where(c < r, da * qk, 0.0), pc.accurate_sum(qf * dq_inter, 1), pc.accurate_sum(kf * dk_inter, 1),
      gates.exp_gamma() * pc.total(dh * s))
  dq_ref[...] = dq.astype(dq_ref.dtype)
  dk_ref[...] = dk.astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _forward(cfg, q, k, v, g, s0):
  n = g.shape[1] // cfg.chunk
  gc = pc.local_cumsum(cfg, g)
  states, final = pc.sequential(cfg, functools.partial(state_step, cfg),
                                [(k, 'key', False), (v, 'value', True), (gc, 'value', False)], s0, n)
  (o,) = pc.parallel(cfg, pc.output_kernel, [(q, 'key'), (k, 'key'), (v, 'value'), (gc, 'value'), (states, 'state')],
                     [('value', v.shape, q.dtype)], n)
  return o, final, gc, states


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def scan(cfg, q, k, v, g, s0):
  """Padded, laid-out inputs (q/k/v in the backend layout, g [B, Tp, Hv], s0 [B, Hv, K, V] fp32) -> (o, final)."""
  o, final, _, _ = _forward(cfg, q, k, v, g, s0)
  return o, final


def _scan_fwd(cfg, q, k, v, g, s0):
  o, final, gc, states = _forward(cfg, q, k, v, g, s0)
  return (o, final), (q, k, v, gc, states, final)


def _scan_bwd(cfg, res, cts):
  q, k, v, gc, states, final = res
  do, d_final = cts
  n = states.shape[2] // q.shape[-1]
  dh, ds0 = pc.sequential(cfg, functools.partial(dstate_step, cfg),
                          [(q, 'key', False), (do, 'value', True), (gc, 'value', False)],
                          d_final.astype(F32), n, reverse=True)
  shape = lambda x: v.shape[:-1] + x.shape[-1:]
  dq, dk, dv, dcum = pc.parallel(
      cfg, grads_kernel,
      [(q, 'key'), (k, 'key'), (v, 'value'), (gc, 'value'), (do, 'value'), (states, 'state'), (dh, 'state')],
      [('value', shape(q), F32), ('value', shape(k), F32), ('value', v.shape, v.dtype),
       ('value', v.shape[:-1] + (1,), F32)], n)
  dg = pc.uncolumn(cfg, dcum)
  return (pc.sum_group(cfg, dq).astype(q.dtype), pc.sum_group(cfg, dk).astype(k.dtype), dv, dg, ds0)


scan.defvjp(_scan_fwd, _scan_bwd)


def linear_scan(backend, q, k, v, log_decay, *, scale, initial_state, chunk_size, interpret=None, block_v=None):
  """Contract of `hybrid_jax.kernels.linear_scan` (arguments already validated by the api) on backend 'gpu' or
  'tpu'; interpret: None -> `pc.interpret_default`; block_v: value columns per sequential program (GPU default
  min(V, 64), TPU V)."""
  cfg = pc.make_cfg(backend, q, v, kernel='linear_scan', scale=scale, chunk_size=chunk_size, block_v=block_v,
                    interpret=interpret)
  qp, kp, vp, tp, s0 = pc.padded_inputs(cfg, q, k, v, initial_state)  # g = 0 in the padding
  o, final = scan(cfg, qp, kp, vp, pc.pad_time(log_decay.astype(F32), tp), s0)
  return pc.from_layout(cfg, o)[:, :q.shape[1]], final
