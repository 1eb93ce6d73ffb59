"""Checkpoints that store one tensor per expert, read as the stacked expert tensors the MoE rules name.

The MoE families' classes keep their experts stacked ([E, ...]; gate rows before up rows where both are fused),
but released checkpoints often store each expert's Linear weights apart (`...experts.{e}.gate_proj.weight`), and
transformers stacks them at load. Import does the same here, before the rules run: every group of per-expert
tensors becomes one virtual tensor under the fused name (`...experts.gate_up_proj`), so the rules know one layout
and either checkpoint reads. An expert that is missing or shaped unlike the others is refused naming the tensor;
a stacked tensor whose expert count or shape differs from config.json is refused by the rules' shape check, naming
the per-expert tensors it was stacked from. Export of such a family splits the stacked tensors again
(`unstack_per_expert`).
"""

import dataclasses
import re

import numpy as np

from hybrid_jax.hf import HFError

_PER_EXPERT = re.compile(r'^(?P<group>.+\.experts)\.(?P<expert>\d+)\.(?P<part>.+)$')


@dataclasses.dataclass(frozen=True)
class Stacking:
  """Per-expert tensors `parts` (suffixes after `experts.{e}.`), concatenated along axis 0 per expert and stacked
  over experts, stand for the fused tensor `fused` (suffix after `experts.`)."""
  fused: str
  parts: tuple


def _label(group: str, count: int, parts: tuple) -> str:
  """How a stacked tensor is named in messages: the per-expert tensors it was made of."""
  return f'{group}.{{0..{count - 1}}}.{"+".join(parts)}'


def stack_per_expert(stackings: tuple, names: dict, read):
  """(names, read) with every complete group of per-expert tensors replaced by its stacked tensor.

  `names`: {name as the rules write it: name in the checkpoint}; `read(stored name)` one tensor. The stacked
  tensor's stored name is the label of the per-expert tensors it holds, and `read` builds it on demand."""
  found = {}  # (group, part) -> {expert: stored name}
  for canonical, stored in names.items():
    match = _PER_EXPERT.match(canonical)
    if match:
      found.setdefault((match['group'], match['part']), {})[int(match['expert'])] = stored
  if not found:
    return names, read
  names, virtual = dict(names), {}
  for group in sorted({g for g, _ in found}):
    for stacking in stackings:
      present = [found.get((group, part)) for part in stacking.parts]
      if not any(present):
        continue
      experts = sorted(set().union(*(p or {} for p in present)))
      for part, members in zip(stacking.parts, present):
        missing = [e for e in range(max(experts) + 1) if e not in (members or {})]
        if missing:
          raise HFError(f'the checkpoint has no tensor {group}.{missing[0]}.{part!r} (it stores experts one tensor '
                        f'each, {group}.{{e}}.{part} for e in 0..{max(experts)})')
      members = [[names.pop(_canonical(group, e, part)) for part in stacking.parts] for e in experts]
      label = _label(group, len(experts), stacking.parts)
      names[f'{group}.{stacking.fused}'] = label
      virtual[label] = members
  def read_stacked(name):
    if name not in virtual:
      return read(name)
    return _stack(read, virtual[name])
  return names, read_stacked


def _canonical(group: str, expert: int, part: str) -> str:
  return f'{group}.{expert}.{part}'


def _stack(read, members) -> np.ndarray:
  """[E, sum of parts' rows, ...]: each expert's parts concatenated along axis 0, stacked over experts."""
  rows, first = [], {}
  for expert in members:
    pieces = []
    for j, name in enumerate(expert):
      value = read(name)
      if j not in first:
        first[j] = (name, value.shape)
      elif value.shape != first[j][1]:
        raise HFError(f'tensor {name!r} has shape {tuple(value.shape)}, but {first[j][0]!r} has '
                      f'{tuple(first[j][1])}: every expert of a layer has the same shape')
      pieces.append(value)
    rows.append(np.concatenate(pieces, axis=0) if len(pieces) > 1 else pieces[0])
  return np.stack(rows)


def unstack_per_expert(stackings: tuple, tensors: dict) -> dict:
  """`tensors` with every stacked tensor `{group}.{fused}` [E, rows, ...] of a stacking written one tensor per expert
  and part, `{group}.{e}.{part}` (each expert's rows cut into equal parts, in order), in place of the stacked one."""
  fused = {'.' + s.fused: s.parts for s in stackings}
  out = {}
  for name, value in tensors.items():
    suffix = next((f for f in fused if name.endswith('.experts' + f)), None)
    if suffix is None:
      out[name] = value
      continue
    group, parts = name[:-len(suffix)], fused[suffix]
    for e, expert in enumerate(value):
      for part, piece in zip(parts, np.split(expert, len(parts), axis=0)):
        out[f'{group}.{e}.{part}'] = np.ascontiguousarray(piece)
  return out
