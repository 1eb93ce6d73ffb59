"""Reading config.json fields, for both importers: a field hybrid_jax cannot represent is refused naming it.

Every refusal is an HFError of one form (`refuse`): the field, its value and what is allowed.
"""

import math

from hybrid_jax.hf import HFError


def refuse(field: str, value, allowed: str):
  raise HFError(f'config.json {field}={value!r} cannot be represented by hybrid_jax: {allowed}')


def rope(hf: dict, default_factor: float = 1.0, default_theta: float | None = None) -> tuple[float | None, float]:
  """(RoPE base, partial rotary factor) of a default (unscaled) rotary embedding; refuses scaled RoPE. The base is
  None when the config gives null (NoPE) or nothing and there is no `default_theta`."""
  params = hf.get('rope_parameters') or {}
  if hf.get('rope_scaling'):
    refuse('rope_scaling', hf['rope_scaling'], 'only plain RoPE (no scaling) is supported')
  rope_type = params.get('rope_type', params.get('type', 'default'))
  if rope_type != 'default':
    refuse('rope_parameters.rope_type', rope_type, "only 'default' RoPE is supported")
  factor = params.get('partial_rotary_factor', hf.get('partial_rotary_factor', default_factor))
  theta = params['rope_theta'] if 'rope_theta' in params else hf.get('rope_theta', default_theta)
  return theta, factor


def positive_int(hf: dict, field: str, default=None) -> int:
  """A config.json integer that must be > 0 (`default` when the field is absent)."""
  value = hf.get(field, default)
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    refuse(field, value, 'a positive integer is required')
  return value


def positive_number(hf: dict, field: str, default=None) -> float:
  """A config.json number that must be finite and > 0 (`default` when the field is absent)."""
  value = hf.get(field, default)
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
    refuse(field, value, 'a finite number > 0 is required')
  return float(value)


def shortest_cycle(kinds: list[str]) -> tuple[str, ...]:
  """The shortest repeating unit of the per-layer kinds (hybrid_jax's model.cycle; the whole list when none)."""
  n = len(kinds)
  for period in range(1, n + 1):
    if all(kinds[i] == kinds[i % period] for i in range(n)):
      return tuple(kinds[:period])
  return tuple(kinds)
