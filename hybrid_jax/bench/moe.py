"""MoE dispatch speed: the experts of one MoE layer through each dispatch (`python -m hybrid_jax bench moe`).

For each shape TOKENS x D_MODEL x EXPERT_WIDTH x EXPERTS x TOP_K, the MoE MLP of hybrid_jax.models.moe (a softmax
router, SwiGLU experts, dropless) runs on random tokens with random weights (a near-even load) through each
implementation of model.moe.implementation: 'ragged_dot' (the assignments sorted by expert, XLA's grouped matmul),
'gmm' (the same through megablox's Pallas TPU kernels; TPU only, interpreted on CPU) and 'dense' (every expert on
every token, weighted by a combine matrix: E / k times the expert work, the reference). Forward and forward +
backward (the gradient of every weight and the input) are timed apart, compile time apart, median of `--repeats`
device-synchronised calls after a warm-up call.

TF/s counts the model's FLOPs, what the layer is charged in MFU (hybrid_jax.models.moe.forward_flops: the router
and each token's k experts; fwd+bwd = 3 x fwd), whatever the implementation computes; 'vs dense' is the dense
row's time over this one's at the same shape (above 1: faster). On CPU jax lowers ragged_dot to a masked product
over every expert, so it does the dense work; only GPU and TPU numbers say what grouping buys.

  python -m hybrid_jax bench moe --shapes 4096x384x479x8x2 --json out.json
  python -m hybrid_jax bench moe --shapes 65536x384x479x8x2 --impls gmm,ragged_dot,dense     (TPU)
"""

import dataclasses
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hybrid_jax.bench import timing
from hybrid_jax.config import BASE_CONFIG, load_config_file, validate
from hybrid_jax.errors import InputError
from hybrid_jax.models import moe

IMPLEMENTATIONS = ('ragged_dot', 'gmm', 'dense')
BASELINE = 'dense'
# Per backend defaults of what the flags leave unset, written as the flags are. The GPU/TPU shapes: the S1 and S5
# MoE twins' experts (docs/MOE_SHAPES.md) and a fine-grained 64-expert, top-8 layer of S5's active width, at 64K
# tokens (a quarter of an S1 chip's 16 x 16K rows).
DEFAULTS = {
    'cpu': dict(shapes='2048x384x479x8x2,2048x256x128x32x4', impls='ragged_dot,dense', dtype='float32', repeats=3),
    'gpu': dict(shapes='65536x384x479x8x2,65536x1280x1599x8x2,65536x1280x400x64x8', impls='ragged_dot,dense',
                dtype='bfloat16', repeats=10),
    'tpu': dict(shapes='65536x384x479x8x2,65536x1280x1599x8x2,65536x1280x400x64x8', impls='gmm,ragged_dot,dense',
                dtype='bfloat16', repeats=10),
}
_FIELDS = ('tokens', 'd_model', 'expert_width', 'experts', 'top_k')


@dataclasses.dataclass(frozen=True)
class Shape:
  tokens: int
  d_model: int
  expert_width: int
  experts: int
  top_k: int

  def __str__(self):
    return 'x'.join(str(getattr(self, f)) for f in _FIELDS)


def parse_shape(text: str) -> Shape:
  """'TOKENSxD_MODELxEXPERT_WIDTHxEXPERTSxTOP_K' (five positive integers, top_k at most experts)."""
  parts = text.strip().lower().split('x')
  if len(parts) != 5 or not all(p.isdigit() and int(p) > 0 for p in parts):
    raise InputError(f'<flag>={text!r} is invalid: a shape is five positive integers '
                     'TOKENSxD_MODELxEXPERT_WIDTHxEXPERTSxTOP_K, e.g. 4096x384x479x8x2')
  shape = Shape(*map(int, parts))
  if shape.top_k > shape.experts:
    raise InputError(f'<flag>={text!r} is invalid: top_k {shape.top_k} is more than the {shape.experts} experts')
  return shape


def parse_shapes(text: str) -> list[Shape]:
  """A comma-separated list of `parse_shape` shapes (at least one)."""
  items = [item for item in text.split(',') if item.strip()]
  if not items:
    raise InputError(f'<flag>={text!r} is invalid: give one or more shapes, e.g. 4096x384x479x8x2')
  return [parse_shape(item) for item in items]


def model_config(shape: Shape, dtype: str):
  """The validated model config of one MoE MLP of `shape` (every other model key the base config's)."""
  c = load_config_file(str(BASE_CONFIG))
  c.model.update(dict(d_model=shape.d_model, d_ff=shape.expert_width, dtype=dtype))
  c.model.moe.update(dict(blocks='all', num_experts=shape.experts, top_k=shape.top_k,
                          expert_d_ff=shape.expert_width))
  return validate(c).model


def forward_flops(shape: Shape) -> float:
  """Model FLOPs of one forward pass of the layer over the shape's tokens (router and k experts per token)."""
  return float(moe.forward_flops(model_config(shape, 'float32'), shape.tokens)['total'])


def _programs(shape: Shape, impl: str, dtype: str):
  """(forward(params, x), forward+backward(params, x, dy), (params, x, dy)) of the shape's MoE layer by `impl`."""
  cfg = model_config(shape, dtype)
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: moe.MoE(cfg, rngs=nnx.Rngs(params=0))))
  rng = np.random.default_rng(0)  # Parameters from numpy: no random op compiled per leaf.
  params = jax.tree.map(lambda a: jnp.asarray(0.02 * rng.standard_normal(a.shape, np.float32), a.dtype), abstract)
  x = jnp.asarray(rng.standard_normal((shape.tokens, shape.d_model), np.float32), dtype)
  dy = jnp.asarray(rng.standard_normal((shape.tokens, shape.d_model), np.float32), dtype)

  def forward(params, x):
    layer = nnx.merge(graphdef, params)
    layer.implementation = impl
    return layer(x)

  def forward_backward(params, x, dy):
    y, vjp = jax.vjp(forward, params, x)
    return vjp(dy.astype(y.dtype))

  return forward, forward_backward, (params, x, dy)


def measure(shape: Shape, impl: str, args) -> dict:
  row = dict(shape=str(shape), **dataclasses.asdict(shape), impl=impl, dtype=args.dtype)

  def run(row):
    forward, forward_backward, (params, x, dy) = _programs(shape, impl, args.dtype)
    row['fwd_compile_s'], row['fwd_ms'] = timing.timed(forward, (params, x), args.repeats, args.min_seconds)
    if not args.no_bwd:
      row['fwd_bwd_compile_s'], row['fwd_bwd_ms'] = timing.timed(forward_backward, (params, x, dy), args.repeats,
                                                                 args.min_seconds)

  return timing.measured(row, args.timeout, run)


def add_ratios(rows) -> None:
  """Model TF/s of each timed pass and the dense row's time over this one's (`*_vs_dense`) at the same shape."""
  dense = {r['shape']: r for r in rows if r['impl'] == BASELINE}
  flops = {}
  for row in rows:
    if row['shape'] not in flops:
      flops[row['shape']] = forward_flops(parse_shape(row['shape']))
    for m, times in (('fwd', 1), ('fwd_bwd', 3)):
      ms = row.get(f'{m}_ms')
      if ms is None:
        continue
      row[f'{m}_tflops'] = times * flops[row['shape']] / ms / 1e9
      ref = dense.get(row['shape'], {}).get(f'{m}_ms')
      if ref is not None:
        row[f'{m}_vs_dense'] = ref / ms


def table(rows) -> str:
  cols = ['shape (T x D x F x E x k)', 'impl', 'fwd ms', 'TF/s', 'vs dense', 'fwd+bwd ms', 'TF/s', 'vs dense',
          'compile s']
  f = lambda x, spec: '' if x is None else format(x, spec)
  lines = ['| ' + ' | '.join(cols) + ' |', '|' + ' --- |' * len(cols)]
  for r in rows:
    cells = [r['shape'], r['impl']]
    if 'error' in r:
      cells += [timing.headline(r['error'], 80)] + [''] * (len(cols) - 3)
    else:
      for m in ('fwd', 'fwd_bwd'):
        cells += [f(r.get(f'{m}_ms'), '.3f'), f(r.get(f'{m}_tflops'), '.2f'), f(r.get(f'{m}_vs_dense'), '.2f')]
      cells.append(', '.join(f'{r[k]:.1f}' for k in ('fwd_compile_s', 'fwd_bwd_compile_s') if k in r))
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def _line(r) -> str:
  return timing.row_line(f"  {r['shape']} {r['impl']}", r)


def run(args) -> int:
  """Every (shape, implementation) of `args` (the flags of `bench moe`) timed, then the table."""
  meta = timing.run_meta({k: (v if k != 'shapes' else [str(s) for s in v])
                          for k, v in vars(args).items() if k != 'json'})
  report = timing.Report(args.json, meta)
  print(f"moe bench: {meta['device']} ({meta['backend']}), jax {jax.__version__}, {args.dtype}, SwiGLU experts, "
        'softmax router, dropless', flush=True)
  for shape in args.shapes:
    for impl in args.impls:
      report.add(r := measure(shape, impl, args), _line(r))
  rows = report.rows()
  add_ratios(rows)
  report.write()
  print(table(rows))
  print('T tokens, D d_model, F expert width, E experts, k experts per token. TF/s: model FLOPs (router and k '
        'experts a token; fwd+bwd 3 x fwd) per second, whatever the dispatch computes; vs dense: the dense '
        "dispatch's time over this one's (above 1: faster).")
  if args.json:
    print(f'wrote {args.json}')
  failed = sum('error' in r for r in rows)
  if failed:
    print(f'moe bench: {failed} measurements failed (whole errors in the JSON)', file=sys.stderr)
  return 1 if failed else 0
