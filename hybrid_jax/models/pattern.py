"""The layer pattern as data: a pure function from layer index to what that layer is.

Stacks are repeats of `model.cycle`, so a scanned model scans one cycle and compile time stays flat in depth.
"""

import dataclasses
from typing import Any, Mapping

from hybrid_jax.models import moe
from hybrid_jax.models.mixers import registry


@dataclasses.dataclass(frozen=True)
class LayerSpec:
  """What one layer is: its mixer kind, attention window (None = full), whether it uses RoPE, and the values only
  its kind reads (`options`, from the kind's registry entry), so that a new kind's per-layer values need no field
  here and nothing outside its module names them."""
  kind: str  # A registered kind: hybrid_jax.models.mixers.registry.
  window: int | None
  rope: bool
  # Name -> value, given as a mapping and kept as sorted pairs: a spec stays immutable, hashable and comparable.
  options: tuple[tuple[str, Any], ...] = ()
  moe: bool = False  # The block's MLP is a mixture of experts (model.moe.blocks; hybrid_jax.models.moe).

  def __post_init__(self):
    if isinstance(self.options, Mapping):
      object.__setattr__(self, 'options', tuple(sorted(self.options.items())))

  def option(self, name: str, default: Any = None) -> Any:
    """The kind's value `name` for this layer (`default` when its entry gives none)."""
    return dict(self.options).get(name, default)

  @property
  def scope(self) -> str:
    """The block's named scope in compiled programs (e.g. 'block_swa_w128'), so a profile can tell kinds apart."""
    return f'block_{self.kind}_w{self.window}' if self.window else f'block_{self.kind}'


def layer_spec(model_cfg, index: int) -> LayerSpec:
  """The spec of layer `index` (0-based): kind = cycle[index % len(cycle)], the rest from that kind's registry
  entry (hybrid_jax.models.mixers.registry; a kind without a spec rule has no window and no RoPE, one without
  layer options none)."""
  if not 0 <= index < model_cfg.num_layers:
    raise IndexError(f'layer index {index} outside 0..{model_cfg.num_layers - 1}')
  cycle = tuple(model_cfg.cycle)
  kind = registry.get(cycle[index % len(cycle)])
  spec = kind.spec(model_cfg, index) if kind.spec else LayerSpec(kind.name, None, False)
  if kind.layer_options:
    spec = dataclasses.replace(spec, options=kind.layer_options(model_cfg, index))
  if 'moe' in model_cfg and moe.is_moe_block(model_cfg, index):
    spec = dataclasses.replace(spec, moe=True)
  return spec


def stack_layout(model_cfg) -> tuple[int, int]:
  """(number of whole cycles, leftover layers) of the stack; leftovers run unscanned after the cycles."""
  period = len(tuple(model_cfg.cycle))
  return model_cfg.num_layers // period, model_cfg.num_layers % period
