"""The layer pattern as data: a pure function from layer index to what that layer is.

Stacks are repeats of `model.cycle`, so a scanned model scans one cycle and compile time stays flat in depth.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class LayerSpec:
  """What one layer is: its mixer kind, attention window (None = full) and whether it uses RoPE."""
  kind: str  # 'full' | 'swa' | 'headwise' | 'lightning' | 'mamba2' | 'gdn'
  window: int | None
  rope: bool
  full_kv_heads: int = 0  # 'headwise' only: KV groups (and their query heads) that attend fully.
  decay_scale: float = 1.0  # 'lightning' only: MiniMax layer factor on the decay rates (1 when off).

  @property
  def scope(self) -> str:
    """The block's named scope in compiled programs (e.g. 'block_swa_w128'), so a profile can tell kinds apart."""
    return f'block_{self.kind}_w{self.window}' if self.window else f'block_{self.kind}'


def layer_spec(model_cfg, index: int) -> LayerSpec:
  """The spec of layer `index` (0-based): kind = cycle[index % len(cycle)]."""
  if not 0 <= index < model_cfg.num_layers:
    raise IndexError(f'layer index {index} outside 0..{model_cfg.num_layers - 1}')
  cycle = tuple(model_cfg.cycle)
  kind = cycle[index % len(cycle)]
  if kind == 'full':
    return LayerSpec('full', None, bool(model_cfg.rope_full))
  if kind == 'swa':
    return LayerSpec('swa', int(model_cfg.window), bool(model_cfg.rope_swa))
  if kind == 'headwise':
    # One RoPE setting per layer: head-wise layers follow the SWA setting (their windowed heads need position).
    return LayerSpec('headwise', int(model_cfg.window), bool(model_cfg.rope_swa),
                     int(model_cfg.headwise_full_kv_heads))
  if kind == 'lightning':
    last = model_cfg.num_layers - 1
    scale = 1.0 - index / last if model_cfg.lightning.layer_decay and last > 0 else 1.0
    return LayerSpec('lightning', None, False, decay_scale=scale)
  if kind in ('mamba2', 'gdn'):
    return LayerSpec(kind, None, False)  # Recurrent: position comes from the recurrence, no RoPE.
  raise ValueError(f'unknown layer kind {kind!r} in model.cycle={cycle}')


def stack_layout(model_cfg) -> tuple[int, int]:
  """(number of whole cycles, leftover layers) of the stack; leftovers run unscanned after the cycles."""
  period = len(tuple(model_cfg.cycle))
  return model_cfg.num_layers // period, model_cfg.num_layers % period
