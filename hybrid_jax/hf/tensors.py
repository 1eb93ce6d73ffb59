"""Tensors between hybrid_jax params and a transformers checkpoint, for both importers: layouts, layer slots, checks.

hybrid_jax stores projections per head ([embed, heads, head_dim], [heads, head_dim, embed]) and matrices as
[in, out]; transformers stores every Linear as [out, in]. A scanned model keeps its layers stacked under `cycles`;
`layer_slots` says where each layer index lives, so both layouts read and write the same tensors. A checkpoint
tensor that is missing, misshapen, not floating point or taken by no parameter is refused naming it.
"""

import dataclasses
from typing import Callable

import numpy as np

from hybrid_jax.hf import HFError
from hybrid_jax.models import pattern


@dataclasses.dataclass(frozen=True)
class Transform:
  """How one tensor changes layout: hybrid_jax -> HF, HF -> hybrid_jax (given our shape), and HF's shape."""
  to_hf: Callable
  from_hf: Callable
  hf_shape: Callable


SAME = Transform(lambda x: x, lambda y, shape: y, lambda s: tuple(s))
TRANSPOSE = Transform(lambda x: x.T, lambda y, shape: y.T, lambda s: tuple(s[::-1]))
# [embed, heads, head_dim] <-> [heads * head_dim, embed]
HEADS_IN = Transform(lambda x: x.reshape(x.shape[0], -1).T, lambda y, shape: y.T.reshape(shape),
                     lambda s: (s[1] * s[2], s[0]))
# [heads, head_dim, embed] <-> [embed, heads * head_dim]
HEADS_OUT = Transform(lambda x: x.reshape(-1, x.shape[-1]).T, lambda y, shape: y.T.reshape(shape),
                      lambda s: (s[2], s[0] * s[1]))

DERIVED_SUFFIXES = ('rotary_emb.inv_freq',)  # Buffers older checkpoints saved; recomputed from the RoPE base.


def layer_slots(model_cfg) -> list[tuple[tuple, int | None]]:
  """Per layer index: (path of its block in the params, index along the stacked `layers` axis or None)."""
  period = len(tuple(model_cfg.cycle))
  n_cycles, _ = pattern.stack_layout(model_cfg)
  scanned = bool(model_cfg.scan_layers) and n_cycles > 1  # As HybridLM decides.
  first_tail = n_cycles * period if scanned else 0
  return [(('cycles', 'blocks', i % period), i // period) if i < first_tail else (('tail', i - first_tail), None)
          for i in range(model_cfg.num_layers)]


def get_path(tree, path):
  for key in path:
    tree = tree[key]
  return tree


class Assembly:
  """hybrid_jax params shaped like `abstract`, filled tensor by tensor: a top-level parameter is set, a layer's
  (stack index given) waits for its layers to be stacked along the leading `layers` axis by `done`."""

  def __init__(self, abstract):
    self.abstract, self.params, self.stacks = abstract, empty_like(abstract), {}

  def put(self, path, index, value):
    if index is None:
      set_path(self.params, path, value)
    else:
      self.stacks.setdefault(path, [None] * get_path(self.abstract, path).shape[0])[index] = value

  def done(self) -> dict:
    for path, layers in self.stacks.items():
      set_path(self.params, path, np.stack(layers))
    return self.params


def refuse_unused(names, used):
  """HFError naming the checkpoint tensors (`names`) that no parameter took (`used`): nothing is dropped silently."""
  unused = sorted(set(names) - set(used) - {n for n in names if n.endswith(DERIVED_SUFFIXES)})
  if unused:
    raise HFError(f'the checkpoint holds tensors hybrid_jax has no place for: {unused[:8]}'
                  f'{" ..." if len(unused) > 8 else ""} ({len(unused)} in all)')


def check_tied_head(read, name, embed_name):
  """A tied checkpoint that still stores lm_head.weight must store the embedding there (transformers ignores it)."""
  head, embed = read(name), read(embed_name)
  if head.shape != embed.shape or not np.array_equal(head, embed):
    raise HFError(f'tie_word_embeddings is true but {name} differs from {embed_name}; set '
                  'tie_word_embeddings to false in config.json to import the separate head')


def read_checked(read, names, name, shape, dtype) -> np.ndarray:
  if name not in names:
    raise HFError(f'the checkpoint has no tensor {name!r} (expected shape {tuple(shape)})')
  value = read(name)
  if tuple(value.shape) != tuple(shape):
    raise HFError(f'tensor {name!r} has shape {tuple(value.shape)}, but config.json implies {tuple(shape)}')
  return as_float(name, value, dtype)


def as_float(name, value, dtype) -> np.ndarray:
  """Checkpoint tensor `name` in `dtype`; quantized or integer weights are refused (they are not values)."""
  if value.dtype.kind != 'f' and value.dtype.name != 'bfloat16':
    raise HFError(f'tensor {name!r} is {value.dtype.name}; only floating-point weights are imported (dequantize the '
                  'checkpoint first)')
  return np.asarray(value, dtype=np.float32).astype(dtype)


def empty_like(abstract):
  return {k: empty_like(v) for k, v in abstract.items()} if isinstance(abstract, dict) else None


def set_path(tree, path, value):
  for key in path[:-1]:
    tree = tree[key]
  tree[path[-1]] = value
