"""hybrid_jax params (nnx pure dict) <-> transformers tensors, by one name table shared by all four classes.

hybrid_jax stores projections per head ([embed, heads, head_dim], [heads, head_dim, embed]) and matrices as
[in, out]; transformers stores every Linear as [out, in]. Both use rotate-half RoPE with the same frequencies, so
no row permutation is needed. A scanned model keeps its layers stacked under `cycles`; `layer_slots` says where
each layer index lives, so both layouts read and write the same tensors.
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

# (path inside a block, transformers name after `model.layers.<i>.`, transform)
LAYER_TABLE = (
    (('mixer_norm', 'scale'), 'input_layernorm.weight', SAME),
    (('mixer', 'wq'), 'self_attn.q_proj.weight', HEADS_IN),
    (('mixer', 'wk'), 'self_attn.k_proj.weight', HEADS_IN),
    (('mixer', 'wv'), 'self_attn.v_proj.weight', HEADS_IN),
    (('mixer', 'wo'), 'self_attn.o_proj.weight', HEADS_OUT),
    (('mlp_norm', 'scale'), 'post_attention_layernorm.weight', SAME),
    (('mlp', 'gate'), 'mlp.gate_proj.weight', TRANSPOSE),
    (('mlp', 'up'), 'mlp.up_proj.weight', TRANSPOSE),
    (('mlp', 'down'), 'mlp.down_proj.weight', TRANSPOSE),
)
# (path from the top, transformers name, transform)
TOP_TABLE = (
    (('embed',), 'model.embed_tokens.weight', SAME),
    (('final_norm', 'scale'), 'model.norm.weight', SAME),
    (('lm_head',), 'lm_head.weight', TRANSPOSE),
)
SINKS = 'self_attn.sinks'  # GraniteSWA's per-head sink logits [num_heads]; -inf = no sink.
DERIVED_SUFFIXES = ('rotary_emb.inv_freq',)  # Buffers older checkpoints saved; recomputed from the RoPE base.


def layer_slots(model_cfg) -> list[tuple[tuple, int | None]]:
  """Per layer index: (path of its block in the params, index along the stacked `layers` axis or None)."""
  period = len(tuple(model_cfg.cycle))
  n_cycles, _ = pattern.stack_layout(model_cfg)
  scanned = bool(model_cfg.scan_layers) and n_cycles > 1  # As HybridLM decides.
  first_tail = n_cycles * period if scanned else 0
  return [(('cycles', 'blocks', i % period), i // period) if i < first_tail else (('tail', i - first_tail), None)
          for i in range(model_cfg.num_layers)]


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def _entries(model_cfg):
  """(our path, stack index, HF name, transform) of every tensor, top-level first."""
  for path, name, transform in TOP_TABLE:
    yield path, None, name, transform
  for i, (block, index) in enumerate(layer_slots(model_cfg)):
    for path, name, transform in LAYER_TABLE:
      yield block + path, index, f'model.layers.{i}.{name}', transform


def to_hf_tensors(params, model_cfg, *, sinks: bool = False, dtype=np.float32) -> dict[str, np.ndarray]:
  """transformers tensors (contiguous numpy arrays in `dtype`) of hybrid_jax params."""
  tensors = {}
  for path, index, name, transform in _entries(model_cfg):
    x = np.asarray(_get(params, path))
    x = x if index is None else x[index]
    tensors[name] = np.ascontiguousarray(transform.to_hf(x).astype(dtype))
  if sinks:
    for i in range(model_cfg.num_layers):
      tensors[f'model.layers.{i}.{SINKS}'] = np.full((model_cfg.num_heads,), -np.inf, dtype)
  return tensors


def from_hf_tensors(read: Callable[[str], np.ndarray], names, abstract, model_cfg, *, tied: bool,
                    sinks: bool) -> dict:
  """hybrid_jax params shaped like `abstract` (a pure dict of ShapeDtypeStructs) from transformers tensors.

  `read(name)` returns one tensor; `names` are all names in the checkpoint. Missing, misshapen, unused or
  unrepresentable tensors (finite sinks) raise HFError naming the tensor.
  """
  names = set(names)
  used = {n for n in names if n.endswith(DERIVED_SUFFIXES)}
  stacks = {}
  params = _empty_like(abstract)
  for path, index, name, transform in _entries(model_cfg):
    target = _get(abstract, path)
    shape = target.shape if index is None else target.shape[1:]
    source = name
    if path == ('lm_head',) and tied:
      source, transform = 'model.embed_tokens.weight', SAME
      if name in names:
        _check_tied_head(read, name)
        used.add(name)
      value = _read_checked(read, names, source, SAME.hf_shape(shape[::-1]), target.dtype).T
    else:
      value = transform.from_hf(_read_checked(read, names, source, transform.hf_shape(shape), target.dtype), shape)
    used.add(source)
    if index is None:
      _set(params, path, value)
    else:
      stacks.setdefault(path, [None] * target.shape[0])[index] = value
  for path, layers in stacks.items():
    _set(params, path, np.stack(layers))
  if sinks:
    for i in range(model_cfg.num_layers):
      name = f'model.layers.{i}.{SINKS}'
      value = _read_checked(read, names, name, (model_cfg.num_heads,), np.float32)
      if not np.all(value == -np.inf):
        raise HFError(f'{name} holds attention sinks {value.tolist()}: hybrid_jax attention has no sinks '
                      '(only sinks of -inf, i.e. disabled, can be imported)')
      used.add(name)
  unused = sorted(names - used)
  if unused:
    raise HFError(f'the checkpoint holds tensors hybrid_jax has no place for: {unused[:8]}'
                  f'{" ..." if len(unused) > 8 else ""} ({len(unused)} in all)')
  return params


def _check_tied_head(read, name):
  """A tied checkpoint that still stores lm_head.weight must store the embedding there (transformers ignores it)."""
  head, embed = read(name), read('model.embed_tokens.weight')
  if head.shape != embed.shape or not np.array_equal(head, embed):
    raise HFError(f'tie_word_embeddings is true but {name} differs from model.embed_tokens.weight; set '
                  'tie_word_embeddings to false in config.json to import the separate head')


def _read_checked(read, names, name, shape, dtype) -> np.ndarray:
  if name not in names:
    raise HFError(f'the checkpoint has no tensor {name!r} (expected shape {tuple(shape)})')
  value = read(name)
  if tuple(value.shape) != tuple(shape):
    raise HFError(f'tensor {name!r} has shape {tuple(value.shape)}, but config.json implies {tuple(shape)}')
  return np.asarray(value, dtype=np.float32).astype(dtype)


def _empty_like(abstract):
  return {k: _empty_like(v) for k, v in abstract.items()} if isinstance(abstract, dict) else None


def _set(tree, path, value):
  for key in path[:-1]:
    tree = tree[key]
  tree[path[-1]] = value
