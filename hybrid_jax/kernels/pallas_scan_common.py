"""What the Pallas scan kernels share: one kernel module per scan serves both backends, this module the rest.

Both backends run the same per-chunk math (docs/KERNELS.md, "Scalar-decay linear scan (Lightning, Mamba-2)" and
"Gated DeltaNet (the gated delta rule)") on tiles
of one chunk: q/k [C, K], v [C, V], per-token scalars (beta, gradients) as columns [C, 1]. They differ in
- layout: GPU kernels read [B, T, H, D] directly (strided tiles are free in Triton); TPU kernels read
  [B, H, T, D] so every tile's last two dims are (chunk, head dim), as Mosaic wants;
- the sequential pass over chunks: on GPU one program per (batch, head, value block) loops over the chunks
  (grid programs run concurrently there); on TPU the chunk is the last, sequential ("arbitrary") grid axis and the
  state is carried in a VMEM scratch buffer;
- the smallest chunk (`MIN_CHUNK`) and where a kernel compiles rather than interprets (`interpret_default`).
Those differences live here, keyed by `Cfg.backend`, so the math of each scan is written once
(`hybrid_jax/kernels/linear_scan/pallas_scan.py`, `hybrid_jax/kernels/delta_rule/pallas_delta.py`); per-backend
copies of it would be two kernels to keep in step for no difference in what they compute.
States are [B, Hv, N*K, V] float32 (state entering chunk n at rows n*K..). Gates enter kernels as the local
inclusive cumulative gate G (restarting each chunk) in fp32 (hi, lo) pairs [C, 2] computed by XLA (`Gates`);
every exp argument is <= 0 (G_i, G_i - G_j for i >= j, gamma - G_j, gamma) and masked to -inf before exp.
Matmul operands are rounded to the input dtype (bf16 inputs: bf16 operands, as fla does), accumulation is fp32;
fp32 inputs get full-precision fp32 products. Everything carried or stored between kernels is fp32.
"""

import functools
from typing import NamedTuple

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as plgpu
import jax.numpy as jnp

from hybrid_jax.kernels import gpu_smem
from hybrid_jax.kernels import platform

F32 = jnp.float32
GPU_BLOCK_V = 64  # Value columns per GPU sequential program (fewer when V is smaller).
STAGES = 2  # Triton pipeline stages of the GPU scan kernels.
SUPPORTED_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
# Smallest chunk per backend (chunks are multiples of it): Triton dots need 16 rows (also the delta rule's
# forward-substitution block); Mosaic tiles need multiples of 8 sublanes.
MIN_CHUNK = {'gpu': 16, 'tpu': 8}


def interpret_default(backend):
  """Interpret mode unless the kernels' target is this backend's platform (CPU tests interpret both)."""
  return platform.target() != backend


class Cfg(NamedTuple):
  """Static description of one call (hashable: the custom_vjp's non-differentiable argument)."""
  backend: str  # 'gpu' (Triton-style, [B,T,H,D]) or 'tpu' (Mosaic-style, [B,H,T,D]).
  chunk: int
  scale: float
  group: int  # Value heads per key head.
  block_v: int  # Value columns per program in the sequential passes.
  dtype: str  # Matmul operand dtype (the input dtype); accumulation is always fp32.
  interpret: bool
  warps: int = 4
  stages: int = STAGES


def make_cfg(backend, q, v, *, kernel, scale, chunk_size, block_v, interpret=None, warps=4, stages=STAGES,
             budget=None):
  """Checks what the Pallas kernels need and returns their Cfg.

  GPU: the chunk is `gpu_smem.scan_chunk`'s (the requested one, halved until every kernel of `kernel` fits the
  shared-memory `budget`); interpret mode chooses the same, so CPU tests run what the GPU would.
  interpret: None -> `interpret_default(backend)`.
  """
  if interpret is None:
    interpret = interpret_default(backend)
  min_chunk = MIN_CHUNK[backend]
  if jnp.dtype(q.dtype) not in [jnp.dtype(d) for d in SUPPORTED_DTYPES]:
    raise ValueError(f"implementation='pallas_{backend}' supports float32, bfloat16 and float16 inputs, got "
                     f"{q.dtype} (use implementation='xla' or 'reference')")
  if chunk_size % min_chunk:
    raise ValueError(f"implementation='pallas_{backend}' needs chunk_size to be a multiple of {min_chunk}, got "
                     f'{chunk_size}')
  dk, dv = q.shape[3], v.shape[3]
  if block_v is None:
    block_v = dv if backend == 'tpu' else min(dv, GPU_BLOCK_V)
  if dv % block_v:
    raise ValueError(f'block_v={block_v} must divide the value head dim {dv}')
  pow2 = lambda n: n >= 16 and not n & (n - 1)
  if backend == 'gpu' and not interpret and not all(map(pow2, (chunk_size, dk, dv, block_v))):
    raise ValueError(f"implementation='pallas_gpu' compiles for a GPU only with power-of-two chunk_size, head dims "
                     f'and block_v >= 16 (Triton tiles), got chunk_size={chunk_size}, K={dk}, V={dv}, '
                     f"block_v={block_v} (use implementation='xla')")
  if backend == 'gpu':
    fitted = gpu_smem.scan_chunk(kernel, chunk_size, dk, dv, block_v, jnp.dtype(q.dtype).itemsize, stages, budget)
    if fitted is None:
      raise ValueError(f"implementation='pallas_gpu' has no chunk <= {chunk_size} whose {kernel} kernels fit "
                       f'{gpu_smem.device_budget() if budget is None else budget} bytes of shared memory at K={dk}, '
                       f"V={dv}, {jnp.dtype(q.dtype).name} (use implementation='xla')")
    chunk_size = fitted
  return Cfg(backend, int(chunk_size), float(scale), v.shape[2] // q.shape[2], int(block_v),
             jnp.dtype(q.dtype).name, bool(interpret), warps, stages)


# Layout: token arrays are [B, Tp, H, D] on GPU and [B, H, Tp, D] on TPU.


def to_layout(cfg, x):
  """[B, Tp, H, D] -> the backend's token layout."""
  return x if cfg.backend == 'gpu' else x.transpose(0, 2, 1, 3)


def from_layout(cfg, x):
  return x if cfg.backend == 'gpu' else x.transpose(0, 2, 1, 3)


def tok_spec(cfg, rows, cols, index):
  """BlockSpec of a token array; index(*grid ids) -> (batch, head, row block, column block)."""
  if cfg.backend == 'gpu':
    def bthd(*ids):
      b, h, r, c = index(*ids)
      return b, r, h, c
    return pl.BlockSpec((None, rows, None, cols), bthd)
  return pl.BlockSpec((None, None, rows, cols), index)


def state_spec(rows, cols, index):
  """BlockSpec of a state array [B, Hv, R, V]; index(*grid ids) -> (batch, head, row block, column block)."""
  return pl.BlockSpec((None, None, rows, cols), index)


def call(cfg, kernel, grid, in_specs, out_specs, out_shape, scratch_shapes=(), semantics=None, warps=None):
  if cfg.interpret:
    params = None
  elif cfg.backend == 'gpu':
    params = plgpu.CompilerParams(num_warps=warps or cfg.warps, num_stages=cfg.stages)
  else:
    params = pltpu.CompilerParams(dimension_semantics=semantics)
  return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
                        scratch_shapes=list(scratch_shapes), compiler_params=params, interpret=cfg.interpret)


# Per-tile math.


def dot(a, b, dtype, *, ta=False, tb=False):
  """a @ b (optionally transposed) with operands rounded to `dtype` and fp32 accumulation.

  fp32 operands get full fp32 products (not TF32): the fp32 tests need 1e-5.
  """
  dtype = jnp.dtype(dtype)
  precision = lax.Precision.HIGHEST if dtype == F32 else None
  dims = (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))
  return lax.dot_general(a.astype(dtype), b.astype(dtype), dims, precision=precision,
                         preferred_element_type=F32)


def iotas(c):
  return lax.broadcasted_iota(jnp.int32, (c, c), 0), lax.broadcasted_iota(jnp.int32, (c, c), 1)


def as_row(col):
  """A [C, 1] column as a [1, C] row, with elementwise ops only (no transpose or reshape in the kernel)."""
  r, c = iotas(col.shape[0])
  return jnp.sum(jnp.where(r == c, col, 0.0), axis=0, keepdims=True)


def total(x):
  """Sum of all entries as a [1, 1] array (kept 2-D: Mosaic and Triton both broadcast it like a scalar)."""
  return jnp.sum(x, axis=(0, 1), keepdims=True)


def last(col):
  """The last entry of a [C, 1] column as a [1, 1] array."""
  rows = lax.broadcasted_iota(jnp.int32, col.shape, 0)
  return total(jnp.where(rows == col.shape[0] - 1, col, 0.0))


def as_col(row):
  """A [1, C] row as a [C, 1] column (elementwise ops only)."""
  r, c = iotas(row.shape[1])
  return jnp.sum(jnp.where(r == c, row, 0.0), axis=1, keepdims=True)


def local_gate_grad(pair, q_inter, k_inter, d_gamma_state):
  """dL/dg_s for the tokens of one chunk, every term scaled by its own decay (strong decay keeps full relative
  accuracy).

  This is the identity dL/dG^_t = <q_t, dq_t> - <k_t, dk_t> with its reverse cumulative sum, taken per chunk with
  the terms that cancel exactly grouped analytically rather than cancelled in floating point (they are O(1) while
  the true gradient may be exp(-20)-small):
  pair [C, C]: dL/dX_ij * X_ij for the products X_ij carrying exp(G_i - G_j), strictly lower (the diagonal carries
  exp(0), no gate): each counts for the tokens j < s <= i, via a reverse sum of row sums minus column sums.
  q_inter [C, 1]: <q_i, dq_i> of the term through the incoming state (carries exp(G_i)): counts for s <= i.
  k_inter [C, 1]: <k_j, dk_j> of the term into the outgoing state (carries exp(gamma - G_j)): counts for s > j
  (its exp(gamma) and exp(-G_j) parts cancel for s <= j), an exclusive forward sum.
  d_gamma_state: exp(gamma) <dH, S>, the decay of the incoming state: counts for every token of the chunk.
  """
  r, c = iotas(q_inter.shape[0])
  own = accurate_sum(pair, 1) - as_col(accurate_sum(pair, 0)) + q_inter
  later = accurate_sum(as_row(own), 1, c >= r)
  earlier = accurate_sum(as_row(k_inter), 1, c < r)
  return later + earlier + d_gamma_state


def accurate_sum(x, axis, where=None):
  """jnp.sum(x, axis, keepdims=True) over the entries where `where` holds (broadcast to the [C, C] tile), off the
  exact sum by one rounding of the result plus about n^2 eps^2 max|x| (n terms, eps = 2^-24), where a float32 sum's
  error grows like n eps max|x|: the gate gradient is a sum of O(1) terms that cancel to a small result.

  Each entry splits exactly into x = hi + lo (FastTwoSum against sigma, a power of two at least 2 n max|x|):
  every hi lies on the grid of sigma's last bit and every partial sum of them stays below sigma / 2, so the hi
  parts sum exactly in any order; each lo is below that bit (about 2 n eps max|x|), so their float32 sum's rounding
  is the n^2 eps^2 term.
  """
  mag = jnp.max(jnp.max(jnp.abs(x), axis=1, keepdims=True), axis=0, keepdims=True)  # [1, 1]
  n = max(x.shape[0], x.shape[1]) if where is not None else x.shape[axis]  # Terms per sum.
  exponent = lax.shift_right_logical(lax.bitcast_convert_type(mag, jnp.int32), 23)  # max|x| < 2^(exponent - 126)
  exponent = jnp.minimum(exponent + (n - 1).bit_length() + 2, 254)
  sigma = lax.bitcast_convert_type(lax.shift_left(exponent, 23), F32)
  hi = (sigma + x) - sigma
  lo = x - hi
  if where is not None:
    hi, lo = jnp.where(where, hi, 0.0), jnp.where(where, lo, 0.0)
  return jnp.sum(hi, axis=axis, keepdims=True) + jnp.sum(lo, axis=axis, keepdims=True)


class Gates:
  """One chunk's local cumulative gate as an unevaluated fp32 pair G = hi + lo (a [C, 2] tile).

  Strong decay makes |G| large (-20 per token: -1280 at the end of a 64-chunk), where fp32 G alone carries an
  absolute error of ~1e-4 into every exp(G_i - G_j); the pair keeps each difference accurate to its own size, as
  the XLA path's segment sums do. All exponents are <= 0 and masked to -inf before exp.
  """

  def __init__(self, tile):
    cols = lax.broadcasted_iota(jnp.int32, tile.shape, 1)
    self.hi = jnp.sum(jnp.where(cols == 0, tile, 0.0), axis=1, keepdims=True)
    self.lo = jnp.sum(jnp.where(cols == 1, tile, 0.0), axis=1, keepdims=True)
    self.gamma_hi, self.gamma_lo = last(self.hi), last(self.lo)
    self._rows = None

  def rows(self):
    """(hi, lo) as [1, C] rows, built on first use (the sequential passes never need them)."""
    if self._rows is None:
      self._rows = as_row(self.hi), as_row(self.lo)
    return self._rows

  def diff(self, other=None):
    """[C, C] G_i - G_j (rows: this chunk part, columns: `other`, default this one)."""
    hi_row, lo_row = (self if other is None else other).rows()
    return (self.hi - hi_row) + (self.lo - lo_row)

  def decay(self, strict=False):
    """Gamma [C, C] = exp(G_i - G_j) on/below (strictly below) the diagonal, exactly 0 above."""
    r, c = iotas(self.hi.shape[0])
    return jnp.exp(jnp.where(c < r if strict else c <= r, self.diff(), -jnp.inf))

  def cross_decay(self, earlier):
    """exp(G_i - G_j) for rows i of this block and columns j of an earlier block (all exponents <= 0)."""
    return jnp.exp(self.diff(earlier))

  def exp(self):
    """exp(G_i) [C, 1]."""
    return jnp.exp(self.hi + self.lo)

  def tail(self):
    """exp(gamma - G_j) [C, 1]."""
    return jnp.exp((self.gamma_hi - self.hi) + (self.gamma_lo - self.lo))

  def exp_gamma(self):
    return jnp.exp(self.gamma_hi + self.gamma_lo)


def output_kernel(q_ref, k_ref, v_ref, g_ref, s_ref, o_ref, *, cfg, carried=None):
  """O = scale [((Q K^T) o Gamma) V + (Q o exp(G)) S] for one chunk: both scans' output (the delta rule's with
  V = V_new). carried: the operand dtype of the products with V and S (None: the input dtype)."""
  carried = carried or cfg.dtype
  q, k, v, gates, s = q_ref[...], k_ref[...], v_ref[...], Gates(g_ref[...]), s_ref[...]
  a = dot(q, k, cfg.dtype, tb=True) * gates.decay()
  o = dot(a, v, carried) + dot(q * gates.exp(), s, carried)
  o_ref[...] = (cfg.scale * o).astype(o_ref.dtype)


# Drivers.


def parallel(cfg, kernel, inputs, outputs, n_chunks):
  """One program per (batch, value head, chunk). inputs: (array, kind) with kind 'key'/'value' token arrays
  (the chunk's rows, all columns; 'key' arrays are read through the value head's key head) or 'state'
  ([B,Hv,N*K,V], the chunk's K rows); outputs: (kind, full shape, dtype)."""
  c, g = cfg.chunk, cfg.group
  key = lambda b, h, n: (b, h // g, n, 0)
  val = lambda b, h, n: (b, h, n, 0)

  def spec(kind, x_shape):
    if kind == 'state':
      return state_spec(x_shape[-2] // n_chunks, x_shape[-1], val)
    return tok_spec(cfg, c, x_shape[-1], key if kind == 'key' else val)

  b = inputs[0][0].shape[0]
  hv = next(x.shape[2 if cfg.backend == 'gpu' else 1] for x, kind in inputs if kind == 'value')
  in_specs = [spec(kind, x.shape) for x, kind in inputs]
  out_specs = [spec(kind, shape) for kind, shape, _ in outputs]
  out_shape = [jax.ShapeDtypeStruct(shape, dtype) for _, shape, dtype in outputs]
  # The chunk-parallel kernels hold several [C, K] and [K, V] fp32 tiles at once: twice the sequential passes' warps.
  return call(cfg, functools.partial(kernel, cfg=cfg), (b, hv, n_chunks), in_specs, out_specs, out_shape,
              semantics=('parallel', 'parallel', 'parallel'), warps=2 * cfg.warps)(*(x for x, _ in inputs))


def sequential(cfg, step, inputs, s0, n_chunks, *, reverse=False, tok_outputs=()):
  """The chunk-sequential pass: carry s [K, block_v] (fp32) from s0 [B,Hv,K,V] over the chunks.

  inputs: (array, kind, split) token arrays, kind 'key'/'value', split True when its columns follow the value
  block. step(tiles, s) -> (new s, token output tiles). tok_outputs: (cols-per-block, dtype) per-token outputs,
  split by value block like the state. Returns (states [B,Hv,N*K,V]: the carry entering each chunk's step,
  final carry [B,Hv,K,V], *token outputs).
  """
  c, g, bv = cfg.chunk, cfg.group, cfg.block_v
  b, hv, dk, dv = s0.shape
  nv = dv // bv
  tok_axis = 1 if cfg.backend == 'gpu' else 2
  tp = inputs[0][0].shape[tok_axis]
  out_shape = [jax.ShapeDtypeStruct((b, hv, n_chunks * dk, dv), F32), jax.ShapeDtypeStruct((b, hv, dk, dv), F32)]
  for cols, dtype in tok_outputs:
    shape = (b, tp, hv, cols * nv) if cfg.backend == 'gpu' else (b, hv, tp, cols * nv)
    out_shape.append(jax.ShapeDtypeStruct(shape, dtype))
  n_in = len(inputs)
  chunk_of = (lambda i: n_chunks - 1 - i) if reverse else (lambda i: i)

  if cfg.backend == 'gpu':
    def index(kind, split):
      return lambda bi, h, vb: (bi, h // g if kind == 'key' else h, 0, vb if split else 0)
    in_specs = [tok_spec(cfg, tp, bv if split else x.shape[-1], index(kind, split)) for x, kind, split in inputs]
    whole = lambda bi, h, vb: (bi, h, 0, vb)
    in_specs.append(state_spec(dk, bv, whole))
    out_specs = [state_spec(n_chunks * dk, bv, whole), state_spec(dk, bv, whole)]
    out_specs += [tok_spec(cfg, tp, cols, lambda bi, h, vb: (bi, h, 0, vb)) for cols, _ in tok_outputs]

    def kernel(*refs):
      ins, s0_ref, st_ref, fin_ref, outs = refs[:n_in], refs[n_in], refs[n_in + 1], refs[n_in + 2], refs[n_in + 3:]

      def body(i, s):
        n = chunk_of(i)
        start = pl.multiple_of(n * c, c)
        st_ref[pl.ds(pl.multiple_of(n * dk, dk), dk), :] = s
        s, tiles = step([r[pl.ds(start, c), :] for r in ins], s)
        for r, t in zip(outs, tiles):
          r[pl.ds(start, c), :] = t.astype(r.dtype)
        return s

      fin_ref[...] = lax.fori_loop(0, n_chunks, body, s0_ref[...].astype(F32))

    return call(cfg, kernel, (b, hv, nv), in_specs, out_specs, out_shape)(*(x for x, _, _ in inputs), s0)

  def index(kind, split):
    return lambda bi, h, vb, i: (bi, h // g if kind == 'key' else h, chunk_of(i), vb if split else 0)
  in_specs = [tok_spec(cfg, c, bv if split else x.shape[-1], index(kind, split)) for x, kind, split in inputs]
  whole = lambda bi, h, vb, i: (bi, h, 0, vb)
  in_specs.append(state_spec(dk, bv, whole))
  out_specs = [state_spec(dk, bv, lambda bi, h, vb, i: (bi, h, chunk_of(i), vb)), state_spec(dk, bv, whole)]
  out_specs += [tok_spec(cfg, c, cols, lambda bi, h, vb, i: (bi, h, chunk_of(i), vb)) for cols, _ in tok_outputs]

  def kernel(*refs):
    ins, s0_ref, st_ref, fin_ref = refs[:n_in], refs[n_in], refs[n_in + 1], refs[n_in + 2]
    outs, carry = refs[n_in + 3:-1], refs[-1]
    i = pl.program_id(3)

    @pl.when(i == 0)
    def _():
      carry[...] = s0_ref[...].astype(F32)

    s = carry[...]
    st_ref[...] = s
    s, tiles = step([r[...] for r in ins], s)
    for r, t in zip(outs, tiles):
      r[...] = t.astype(r.dtype)
    carry[...] = s

    @pl.when(i == n_chunks - 1)
    def _():
      fin_ref[...] = s

  return call(cfg, kernel, (b, hv, nv, n_chunks), in_specs, out_specs, out_shape,
              scratch_shapes=[pltpu.VMEM((dk, bv), F32)],
              semantics=('parallel', 'parallel', 'parallel', 'arbitrary'))(*(x for x, _, _ in inputs), s0)


# Wrapper-side helpers (plain XLA).


def pad_time(x, tp):
  return jnp.pad(x, [(0, 0), (0, tp - x.shape[1])] + [(0, 0)] * (x.ndim - 2))


def padded_inputs(cfg, q, k, v, initial_state):
  """q, k, v zero-padded to whole chunks in the backend's layout, the time padding, and the fp32 initial state.

  Zero padding (k = v = 0, with the callers' gates and beta padded by zeros too) leaves the state unchanged, so
  the padded outputs can simply be dropped.
  """
  b, t, _, dk = q.shape
  hv, dv = v.shape[2:]
  tp = -(-t // cfg.chunk) * cfg.chunk
  lay = lambda x: to_layout(cfg, pad_time(x, tp))
  s0 = jnp.zeros((b, hv, dk, dv), F32) if initial_state is None else initial_state.astype(F32)
  return lay(q), lay(k), lay(v), tp, s0


def _add_pairs(a, b):
  """(hi, lo) + (hi, lo) with the rounding error of hi + hi kept (TwoSum), renormalised."""
  (ah, al), (bh, bl) = a, b
  s = ah + bh
  bb = s - ah
  lo = al + bl + ((ah - (s - bb)) + (bh - bb))
  hi = s + lo
  return hi, lo - (hi - s)


def local_cumsum(cfg, g):
  """Per-token gates [B, Tp, Hv] -> the local inclusive cumulative gate G (restarting each chunk) as a layout
  array [.., 2] of fp32 (hi, lo) pairs (see `Gates`)."""
  b, tp, hv = g.shape
  g = g.astype(F32).reshape(b, tp // cfg.chunk, cfg.chunk, hv)
  hi, lo = lax.associative_scan(_add_pairs, (g, jnp.zeros_like(g)), axis=2)
  return to_layout(cfg, jnp.stack([hi, lo], -1).reshape(b, tp, hv, 2))


def column(cfg, x):
  """A per-token scalar [B, Tp, Hv] as a layout column [.., 1] in fp32."""
  return to_layout(cfg, x.astype(F32)[..., None])


def uncolumn(cfg, x):
  """Inverse of `column`: layout [.., 1] -> [B, Tp, Hv]."""
  return from_layout(cfg, x)[..., 0]


def sum_group(cfg, x):
  """Per-value-head gradients of a key-head input, summed over each key head's group (fp32)."""
  if cfg.group == 1:
    return x
  if cfg.backend == 'gpu':
    b, tp, hv, d = x.shape
    return x.reshape(b, tp, hv // cfg.group, cfg.group, d).sum(3)
  b, hv, tp, d = x.shape
  return x.reshape(b, hv // cfg.group, cfg.group, tp, d).sum(2)
