"""hybrid_jax params <-> the tensors of a recurrent-hybrid family's checkpoint, by the family's rules (config.py).

Import reads every rule's tensor, checks its shape against what the model config implies, splits it into the
parameters it holds and changes their layout (a fused tensor stored cut into several, OLMo Hybrid's q / k / v convs,
is read as their concatenation, whatever the cut); a tensor the rules do not name is an error (nothing is dropped
silently). Export runs the same rules backwards and joins fused tensors again. Buffers a family derives from its
config (MiniMax's Lightning decays) are checked against the config where a checkpoint stores them, and written.
"""

import numpy as np

from hybrid_jax.hf import HFError
from hybrid_jax.hf.families import experts
from hybrid_jax.hf.families.config import top_rules
from hybrid_jax.hf.tensors import (Assembly, as_float, check_tied_head, get_path, layer_slots, read_checked,
                                   refuse_unused)
from hybrid_jax.models import pattern


def _entries(family, model_cfg):
  """(rule, [(our full path, stack index)] per part) of every tensor, top-level first."""
  for rule in top_rules(family):
    yield rule, [(path, None) for path, _ in rule.parts]
  for i, (block, index) in enumerate(layer_slots(model_cfg)):
    for rule in family.layer_rules(model_cfg, pattern.layer_spec(model_cfg, i), i):
      yield rule, [(block + path, index) for path, _ in rule.parts]


def canonical_names(family, names) -> dict[str, str]:
  """{name as the rules write it: name in the checkpoint} (Nemotron-H files say backbone. for model.; the family's
  aliases, such as transformers' MiniMax mlp. for its releases' block_sparse_moe., are read as the rules' names)."""
  out = {}
  for name in names:
    canonical = name
    for prefix in family.prefixes:
      if name.startswith(prefix):
        canonical = 'model.' + name[len(prefix):]
        break
    for alias, rules_name in family.aliases:
      canonical = canonical.replace(alias, rules_name)
    out[canonical] = name
  return out


def _shape(abstract, path, index):
  target = get_path(abstract, path)
  return target.shape if index is None else target.shape[1:]


def ignored_names(family, names) -> list[str]:
  """The checkpoint's tensors outside the language model (family.ignored prefixes), which import leaves out."""
  return sorted(n for n in names if family.ignored and n.startswith(family.ignored))


def _read_cut(read, names, rule, shapes) -> np.ndarray:
  """The fused tensor of `rule` from the tensors it is stored cut into (rule.stored), concatenated in order along
  axis 0: any cut whose channels add up to the parts' is read (transformers' near-equal thirds as well as a
  released checkpoint's q / k / v widths); HFError naming the tensors and the numbers otherwise."""
  hf_shape = rule.hf_shape(shapes)
  widths = [transform.hf_shape(shape)[0] for (_, transform), shape in zip(rule.parts, shapes)]
  for canonical in rule.stored:
    if canonical not in names:
      raise HFError(f'the checkpoint has no tensor {canonical!r} (one of {", ".join(map(repr, rule.stored))}, which '
                    f'together hold the fused {rule.name} of shape {tuple(hf_shape)})')
  stored = [names[canonical] for canonical in rule.stored]
  pieces = []
  for name in stored:
    value = read(name)
    if value.ndim != len(hf_shape) or tuple(value.shape[1:]) != tuple(hf_shape[1:]):
      raise HFError(f'tensor {name!r} has shape {tuple(value.shape)}, but config.json implies '
                    f'(channels, {", ".join(map(str, hf_shape[1:]))}), a cut of the fused {rule.name} '
                    f'{tuple(hf_shape)}')
    pieces.append(as_float(name, value, np.float32))
  cut = [p.shape[0] for p in pieces]
  if sum(cut) != hf_shape[0]:
    labels = ', '.join(path[-1] for path, _ in rule.parts)
    raise HFError(f'tensors {", ".join(map(repr, stored))} hold {" + ".join(map(str, cut))} = {sum(cut)} '
                  f'channels of the fused {rule.name} (read concatenated in order), but config.json implies '
                  f'{" + ".join(map(str, widths))} = {hf_shape[0]} ({labels})')
  return np.concatenate(pieces, axis=0)


def from_hf(family, read, names, abstract, model_cfg, *, tied: bool) -> dict:
  """hybrid_jax params shaped like `abstract` from a family checkpoint (`read(name)` one tensor, `names` all but
  `ignored_names`)."""
  skipped = set(ignored_names(family, names))
  names = canonical_names(family, [n for n in names if n not in skipped])
  # Experts stored one tensor each are read stacked, as the rules name them (hybrid_jax.hf.families.experts).
  names, read = experts.stack_per_expert(family.per_expert, names, read)
  stored = set(names.values())
  used = set()
  params = Assembly(abstract)
  for rule, targets in _entries(family, model_cfg):
    shapes = [_shape(abstract, path, index) for path, index in targets]
    name = rule.name
    if targets[0][0] == ('lm_head',) and tied:
      embed = names.get(family.top['embed'], family.top['embed'])
      if name in names:  # A tied checkpoint may still store the head: it must be the embedding.
        check_tied_head(read, names[name], embed)
        used.add(names[name])
      pieces = [read_checked(read, stored, embed, shapes[0][::-1], np.float32).T]
    else:
      hf_shape = rule.hf_shape(shapes)
      if rule.stored:
        y = _read_cut(read, names, rule, shapes)
        used.update(names[n] for n in rule.stored)
      else:
        if name not in names:
          raise HFError(f'the checkpoint has no tensor {name!r} (expected shape {tuple(hf_shape)})')
        y = read_checked(read, stored, names[name], hf_shape, np.float32)
        used.add(names[name])
      pieces = [transform.from_hf(piece, shape) for (_, transform), piece, shape
                in zip(rule.parts, rule.split(y, shapes), shapes)]
    for (path, index), value in zip(targets, pieces):
      params.put(path, index, np.asarray(value, np.float32).astype(get_path(abstract, path).dtype))
  for name, value in _derived(family, model_cfg).items():
    if name in names:
      _check_derived(read, names[name], value)
      used.add(names[name])
  refuse_unused(stored, used)
  return params.done()


def _derived(family, model_cfg) -> dict:
  """{canonical name: value} of every buffer the family derives from the config."""
  if family.derived is None:
    return {}
  out = {}
  for i in range(model_cfg.num_layers):
    out.update(family.derived(model_cfg, pattern.layer_spec(model_cfg, i), i))
  return out


def _check_derived(read, name, value):
  """A stored buffer must be what the config implies (hybrid_jax computes it; it is not a weight)."""
  stored = read(name)
  if tuple(stored.shape) != value.shape:
    raise HFError(f'tensor {name!r} has shape {tuple(stored.shape)}, but config.json implies {value.shape}')
  stored = as_float(name, stored, np.float32)
  if not np.allclose(stored, value, rtol=1e-5, atol=1e-7):
    gap = float(np.max(np.abs(stored - value)))
    raise HFError(f'tensor {name!r} differs from the value config.json implies by up to {gap:.3g}: it is computed '
                  'from the config (layer, layer count, heads, block_size), not learned, and hybrid_jax computes it '
                  'so')


def to_hf(family, params, model_cfg, *, dtype=np.float32) -> dict[str, np.ndarray]:
  """The family checkpoint's tensors (contiguous numpy arrays in `dtype`) of hybrid_jax params."""
  tensors = {}
  for rule, targets in _entries(family, model_cfg):
    values = [np.asarray(get_path(params, path)) for path, _ in targets]
    values = [v if index is None else v[index] for v, (_, index) in zip(values, targets)]
    shapes = [v.shape for v in values]
    pieces = [transform.to_hf(v) for (_, transform), v in zip(rule.parts, values)]
    if rule.stored:  # One tensor per part, as released checkpoints store it.
      tensors.update((name, np.ascontiguousarray(piece.astype(dtype))) for name, piece in zip(rule.stored, pieces))
    else:
      tensors[rule.name] = np.ascontiguousarray(rule.join(pieces, shapes).astype(dtype))
  derived = _derived(family, model_cfg)
  tensors.update((name, np.ascontiguousarray(value.astype(dtype))) for name, value in derived.items())
  if family.export_per_expert:  # One tensor per expert, as the family's released checkpoints store them.
    tensors = experts.unstack_per_expert(family.per_expert, tensors)
  return tensors
