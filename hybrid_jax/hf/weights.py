"""hybrid_jax params (nnx pure dict) <-> transformers tensors, by a tensor-name table per architecture.

hybrid_jax stores projections per head ([embed, heads, head_dim], [heads, head_dim, embed]) and matrices as
[in, out]; transformers stores every Linear as [out, in]. Both use rotate-half RoPE with the same frequencies, so
no row permutation is needed. A scanned model keeps its layers stacked under `cycles`; `layer_slots` says where
each layer index lives, so both layouts read and write the same tensors.
"""

import dataclasses
import pathlib
from typing import Callable

import numpy as np

from hybrid_jax import readers
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

# How each hybrid_jax parameter changes layout, by its path (top level, or inside a block).
TRANSFORMS = {
    ('embed',): SAME, ('final_norm', 'scale'): SAME, ('lm_head',): TRANSPOSE,
    ('mixer_norm', 'scale'): SAME, ('mixer', 'wq'): HEADS_IN, ('mixer', 'wk'): HEADS_IN, ('mixer', 'wv'): HEADS_IN,
    ('mixer', 'wo'): HEADS_OUT, ('mlp_norm', 'scale'): SAME, ('mlp', 'gate'): TRANSPOSE, ('mlp', 'up'): TRANSPOSE,
    ('mlp', 'down'): TRANSPOSE,
}
TOP_PATHS = (('embed',), ('final_norm', 'scale'), ('lm_head',))
LAYER_PATHS = tuple(path for path in TRANSFORMS if path not in TOP_PATHS)


@dataclasses.dataclass(frozen=True)
class NameTable:
  """Where each hybrid_jax parameter lives in one architecture's checkpoints: data, not code.

  Keys are parameter paths joined by '.' ('embed', 'mixer.wq', ...); layer names hold '{i}' for the layer index.
  `sinks`: the per-head sink logits tensor of each layer ([num_heads]; -inf = no sink), None when the
  architecture has none. A checkpoint whose modeling code ships with it (remote code) is read by giving its table
  as JSON in this form (`read_table`).
  """
  top: dict
  layer: dict
  sinks: str | None = None

  def name(self, path: tuple, layer: int | None = None) -> str:
    key = '.'.join(map(str, path))
    return (self.top[key] if layer is None else self.layer[key]).format(i=layer)


LLAMA = NameTable(
    top={'embed': 'model.embed_tokens.weight', 'final_norm.scale': 'model.norm.weight', 'lm_head': 'lm_head.weight'},
    layer={'mixer_norm.scale': 'model.layers.{i}.input_layernorm.weight',
           'mixer.wq': 'model.layers.{i}.self_attn.q_proj.weight',
           'mixer.wk': 'model.layers.{i}.self_attn.k_proj.weight',
           'mixer.wv': 'model.layers.{i}.self_attn.v_proj.weight',
           'mixer.wo': 'model.layers.{i}.self_attn.o_proj.weight',
           'mlp_norm.scale': 'model.layers.{i}.post_attention_layernorm.weight',
           'mlp.gate': 'model.layers.{i}.mlp.gate_proj.weight', 'mlp.up': 'model.layers.{i}.mlp.up_proj.weight',
           'mlp.down': 'model.layers.{i}.mlp.down_proj.weight'})
# model_type -> its table. Mistral, SmolLM3 and MiniCPM (remote code) keep Llama's names; GraniteSWA adds sinks.
TABLES = {'llama': LLAMA, 'mistral': LLAMA, 'smollm3': LLAMA, 'minicpm': LLAMA,
          'granite_swa': dataclasses.replace(LLAMA, sinks='model.layers.{i}.self_attn.sinks')}
DERIVED_SUFFIXES = ('rotary_emb.inv_freq',)  # Buffers older checkpoints saved; recomputed from the RoPE base.


def read_table(path) -> NameTable:
  """A NameTable from a JSON file {"top": {...}, "layer": {...}, "sinks": null | "..."}; every key is required."""
  path = pathlib.Path(path)
  data = readers.read_json(path, 'tensor-name table')
  if set(data) - {'top', 'layer', 'sinks'}:
    raise HFError(f'tensor-name table {path}: unknown key(s) {sorted(set(data) - {"top", "layer", "sinks"})}: it '
                  'holds top, layer and optionally sinks')
  for part, paths in (('top', TOP_PATHS), ('layer', LAYER_PATHS)):
    names = data.get(part)
    want = {'.'.join(p) for p in paths}
    if not isinstance(names, dict) or set(names) != want:
      got = set(names) if isinstance(names, dict) else set()
      raise HFError(f'tensor-name table {path}: "{part}" must map exactly {sorted(want)}; missing '
                    f'{sorted(want - got)}, unknown {sorted(got - want)}')
    for key, name in names.items():
      if not isinstance(name, str) or (part == 'layer') != ('{i}' in name):
        raise HFError(f'tensor-name table {path}: {part}.{key}={name!r} must be a tensor name'
                      f'{" with {i} for the layer index" if part == "layer" else " (no {i})"}')
  sinks = data.get('sinks')
  if sinks is not None and (not isinstance(sinks, str) or '{i}' not in sinks):
    raise HFError(f'tensor-name table {path}: sinks={sinks!r} must be null or a tensor name with {{i}}')
  return NameTable(data['top'], data['layer'], sinks)


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


SINKS_PATH = ('mixer', 'sinks')  # Learned sink logits [num_heads] of a layer (model.attention_sinks).


def _entries(model_cfg, table: NameTable):
  """(our path, stack index, checkpoint name, transform) of every tensor, top-level first."""
  learned_sinks = bool(model_cfg.attention_sinks)
  if learned_sinks and not table.sinks:
    raise HFError('the model has learned attention sinks (model.attention_sinks) but this architecture\'s '
                  'tensor-name table has no sinks tensor')
  for path in TOP_PATHS:
    yield path, None, table.name(path), TRANSFORMS[path]
  for i, (block, index) in enumerate(layer_slots(model_cfg)):
    for path in LAYER_PATHS:
      yield block + path, index, table.name(path, i), TRANSFORMS[path]
    if learned_sinks:
      yield block + SINKS_PATH, index, table.sinks.format(i=i), SAME


def finite_sinks(read: Callable[[str], np.ndarray], names, table: NameTable, num_layers: int) -> bool:
  """Whether any sink tensor of the checkpoint is finite (then the model needs model.attention_sinks)."""
  if not table.sinks:
    return False
  names = set(names)
  return any(np.isfinite(read(n)).any() for n in (table.sinks.format(i=i) for i in range(num_layers)) if n in names)


def to_hf_tensors(params, model_cfg, table: NameTable = LLAMA, *, dtype=np.float32) -> dict[str, np.ndarray]:
  """Checkpoint tensors (contiguous numpy arrays in `dtype`), named by `table`, of hybrid_jax params."""
  tensors = {}
  for path, index, name, transform in _entries(model_cfg, table):
    x = np.asarray(get_path(params, path))
    x = x if index is None else x[index]
    tensors[name] = np.ascontiguousarray(transform.to_hf(x).astype(dtype))
  if table.sinks and not model_cfg.attention_sinks:  # No learned sinks: -inf, i.e. none.
    for i in range(model_cfg.num_layers):
      tensors[table.sinks.format(i=i)] = np.full((model_cfg.num_heads,), -np.inf, dtype)
  return tensors


def from_hf_tensors(read: Callable[[str], np.ndarray], names, abstract, model_cfg, table: NameTable, *,
                    tied: bool) -> dict:
  """hybrid_jax params shaped like `abstract` (a pure dict of ShapeDtypeStructs) from checkpoint tensors.

  `read(name)` returns one tensor; `names` are all names in the checkpoint; `table` says which is which. Missing,
  misshapen, unused or unrepresentable tensors (finite sinks) raise HFError naming the tensor.
  """
  names = set(names)
  used = set()
  params = Assembly(abstract)
  embed_name = table.name(('embed',))
  for path, index, name, transform in _entries(model_cfg, table):
    target = get_path(abstract, path)
    shape = target.shape if index is None else target.shape[1:]
    source = name
    if path == ('lm_head',) and tied:
      source, transform = embed_name, SAME
      if name in names:
        check_tied_head(read, name, embed_name)
        used.add(name)
      value = read_checked(read, names, source, SAME.hf_shape(shape[::-1]), target.dtype).T
    else:
      value = transform.from_hf(read_checked(read, names, source, transform.hf_shape(shape), target.dtype), shape)
    used.add(source)
    params.put(path, index, value)
  params = params.done()
  if table.sinks and not model_cfg.attention_sinks:
    for i in range(model_cfg.num_layers):
      name = table.sinks.format(i=i)
      value = read_checked(read, names, name, (model_cfg.num_heads,), np.float32)
      if not np.all(value == -np.inf):
        raise HFError(f'{name} holds finite attention sinks {value.tolist()}, but the model is built without them; '
                      'import with model.attention_sinks=True')
      used.add(name)
  refuse_unused(names, used)
  return params


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
