"""The layer pattern as data: a pure function from layer index to what that layer is.

Stacks are repeats of `model.cycle`, so a scanned model scans one cycle and compile time stays flat in depth.
"""

import dataclasses

from hybrid_jax.models.mixers import registry


@dataclasses.dataclass(frozen=True)
class LayerSpec:
  """What one layer is: its mixer kind, attention window (None = full) and whether it uses RoPE."""
  kind: str  # A registered kind: hybrid_jax.models.mixers.registry.
  window: int | None
  rope: bool
  full_kv_heads: int = 0  # 'headwise' only: KV groups (and their query heads) that attend fully.
  decay_scale: float = 1.0  # 'lightning' only: MiniMax layer factor on the decay rates (1 when off).

  @property
  def scope(self) -> str:
    """The block's named scope in compiled programs (e.g. 'block_swa_w128'), so a profile can tell kinds apart."""
    return f'block_{self.kind}_w{self.window}' if self.window else f'block_{self.kind}'


def layer_spec(model_cfg, index: int) -> LayerSpec:
  """The spec of layer `index` (0-based): kind = cycle[index % len(cycle)], the rest from that kind's registry
  entry (hybrid_jax.models.mixers.registry; a kind without a spec rule has no window and no RoPE)."""
  if not 0 <= index < model_cfg.num_layers:
    raise IndexError(f'layer index {index} outside 0..{model_cfg.num_layers - 1}')
  cycle = tuple(model_cfg.cycle)
  kind = registry.get(cycle[index % len(cycle)])
  return kind.spec(model_cfg, index) if kind.spec else LayerSpec(kind.name, None, False)


def stack_layout(model_cfg) -> tuple[int, int]:
  """(number of whole cycles, leftover layers) of the stack; leftovers run unscanned after the cycles."""
  period = len(tuple(model_cfg.cycle))
  return model_cfg.num_layers // period, model_cfg.num_layers % period
