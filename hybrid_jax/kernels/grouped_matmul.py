"""A grouped matmul for TPU: jax's megablox Pallas kernels (`gmm` forward, `gmm` and `tgmm` backward), with the
semantics of `jax.lax.ragged_dot`.

`gmm(lhs [m, k], rhs [G, k, n], group_sizes [G])` multiplies rows [s_g, s_g + size_g) of lhs by rhs[g], the rows
sorted by group; rows past the groups (sum(group_sizes) <= m) come out zero, as ragged_dot's do. Built on
`jax.experimental.pallas.ops.tpu.megablox` of the pinned jax, not a copy of it:

- megablox needs the row count to be a multiple of the row tile: the rows are padded with zeros to one (outside
  every group, so never computed) and cut back after.
- megablox leaves the rows past the groups unwritten (uninitialised memory: NaN in interpret mode), in the
  forward output and in the backward's lhs gradient. The MoE sorts dropped assignments (and, under expert
  parallelism, other devices' experts' assignments) past the groups and weighs them zero, and 0 x NaN is NaN: both
  are masked to zero here, in a custom VJP of our own around megablox's `gmm` and `tgmm` (its `ops.gmm` has the
  same backward without the mask).
- The rows past the groups cost no work: the kernel's grid visits only the row tiles the groups cover (plus at
  most one partial tile per group boundary), unlike the masked dense product jax lowers ragged_dot to on CPU.
- Tiles: rows `ROW_TILE` (fewer when there are fewer rows), the contraction and output widths `WIDTH_TILE` or the
  whole dimension when smaller (a block as wide as the array needs no 128-multiple, e.g. the S1 twins' expert
  width 479); a width past the tile ends in a partial tile, which megablox masks. An expert with no rows gets no
  forward tile, and tgmm zeroes its weight gradient.

On a CPU target the kernels run in Pallas interpret mode (tests: slow, exact); on GPU there is no Mosaic, so the MoE
keeps `ragged_dot` there (hybrid_jax.models.moe).
"""

import functools
import importlib

import jax
import jax.numpy as jnp

from hybrid_jax.kernels import platform

# The kernel module: `megablox.gmm` is also the name of the function its package exports, so import it by path.
_MEGABLOX = 'jax.experimental.pallas.ops.tpu.megablox.gmm'
ROW_TILE = 512  # Rows per tile (megablox's m tile): a multiple of 16 (bf16 sublanes).
WIDTH_TILE = 1024  # Contraction (k) and output (n) tile when the dimension is wider; a multiple of 128 lanes.
_SUBLANES = 16


def _backend():
  return importlib.import_module(_MEGABLOX)


def _round_up(x: int, multiple: int) -> int:
  return -(-x // multiple) * multiple


def row_tile(m: int) -> int:
  """The row tile for m rows: ROW_TILE, or all of them (rounded up to 16) when fewer."""
  return min(ROW_TILE, _round_up(max(m, 1), _SUBLANES))


def tiles(m: int, k: int, n: int) -> tuple[int, int, int]:
  """megablox's (m, k, n) tiling for padded rows m (a multiple of `row_tile`): also its lookup for the backward's
  transposed problems."""
  return row_tile(m), min(k, WIDTH_TILE), min(n, WIDTH_TILE)


def _rows_in_groups(x, group_sizes):
  """x [m, ...] with the rows past sum(group_sizes) set to zero."""
  rows = jax.lax.broadcasted_iota(jnp.int32, (x.shape[0],) + (1,) * (x.ndim - 1), 0)
  return jnp.where(rows < jnp.sum(group_sizes), x, jnp.zeros((), x.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _gmm(lhs, rhs, group_sizes, interpret):
  out = _backend().gmm(lhs, rhs, group_sizes, lhs.dtype, tiles, interpret=interpret)
  return _rows_in_groups(out, group_sizes)


def _gmm_fwd(lhs, rhs, group_sizes, interpret):
  return _gmm(lhs, rhs, group_sizes, interpret), (lhs, rhs, group_sizes)


def _gmm_bwd(interpret, residuals, grad):
  lhs, rhs, group_sizes = residuals
  backend = _backend()
  grad = grad.astype(lhs.dtype)
  grad_lhs = backend.gmm(grad, rhs, group_sizes, lhs.dtype, tiles, transpose_rhs=True, interpret=interpret)
  grad_rhs = backend.tgmm(lhs.swapaxes(0, 1), grad, group_sizes, rhs.dtype, tiles,
                          num_actual_groups=rhs.shape[0], interpret=interpret)
  return _rows_in_groups(grad_lhs, group_sizes), grad_rhs, None


_gmm.defvjp(_gmm_fwd, _gmm_bwd)


def gmm(lhs, rhs, group_sizes, *, interpret: bool | None = None):
  """`jax.lax.ragged_dot(lhs, rhs, group_sizes)` through megablox: lhs [m, k] (bfloat16 or float32), rhs [G, k, n]
  of the same dtype, group_sizes [G] int32; out [m, n] in lhs's dtype (float32 accumulation), rows past the groups
  zero. Differentiable in lhs and rhs. interpret: None = when the kernel target is not a TPU (it must then be the
  CPU: a GPU target is refused)."""
  if interpret is None:
    here = platform.target()
    if here not in ('tpu', 'cpu'):
      raise RuntimeError(f"the Pallas grouped matmul (model.moe.implementation='gmm') needs a TPU target (or CPU, "
                         f"where it runs in interpret mode); the target is {here!r}: use 'ragged_dot' or 'auto'")
    interpret = here == 'cpu'
  if lhs.ndim != 2 or rhs.ndim != 3 or lhs.shape[1] != rhs.shape[1] or group_sizes.shape != rhs.shape[:1]:
    raise ValueError(f'gmm: expected lhs [m, k], rhs [G, k, n], group_sizes [G]; got {lhs.shape}, {rhs.shape}, '
                     f'{group_sizes.shape}')
  m = lhs.shape[0]
  padded = _round_up(max(m, 1), row_tile(m))
  if padded != m:
    lhs = jnp.pad(lhs, ((0, padded - m), (0, 0)))
  out = _gmm(lhs, rhs.astype(lhs.dtype), group_sizes.astype(jnp.int32), bool(interpret))
  return out[:m] if padded != m else out
