"""Work the training loop runs on a schedule without knowing what it is: held-out evaluation, the retrieval-head
probe, the profiler. The caller builds the hooks (hybrid_jax.training wires the standard ones), so the loop and the
rest of train/ import nothing from eval/, analysis/ or bench/: the layers flow one way.
"""

import dataclasses
import pathlib
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class LoopContext:
  """What the loop hands a hook factory before training starts."""
  config: Any
  workdir: pathlib.Path
  lead: bool  # Process 0, which writes metrics and files.
  mesh: Any
  model_def: Any
  shardings: Any  # mesh.train_shardings(...): .state, .batch.
  train_step: Callable
  eval_step: Callable
  write: Callable  # write(step, metrics, prefix): the run's metric writers (JSONL + TensorBoard; no-op off process 0).


class Hook:
  """One piece of scheduled work; each method is optional and keeps its own schedule (from the config)."""

  def before_step(self, completed: int) -> None:
    """Before the step after `completed` steps."""

  def after_step(self, step: int, state, batch) -> None:
    """After step `step` (1-based) has run and been logged, before its checkpoint."""

  def at_end(self, step: int, params) -> dict | None:
    """After a completed run (not a preempted one): what it returns goes into the report's 'eval'."""
    del step, params
    return None

  def close(self) -> None:
    """Always, when training stops (also after an error)."""


HookFactory = Callable[[LoopContext], list]
