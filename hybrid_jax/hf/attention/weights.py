"""hybrid_jax params (nnx pure dict) <-> the tensors of the attention classes, by a tensor-name table per architecture.

The tables are data (`NameTable`), so a checkpoint whose modeling code names its tensors otherwise is read with its
table given as JSON. Both sides use rotate-half RoPE with the same frequencies, so no row permutation is needed;
hybrid_jax.hf.tensors changes the layouts.
"""

import dataclasses
import pathlib
from typing import Callable

import numpy as np

from hybrid_jax import readers
from hybrid_jax.hf import HFError
from hybrid_jax.hf.tensors import (HEADS_IN, HEADS_OUT, SAME, TRANSPOSE, Assembly, check_tied_head, get_path,
                                   layer_slots, read_checked, refuse_unused)

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
