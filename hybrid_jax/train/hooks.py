"""Work the training loop runs on a schedule without knowing what it is: held-out evaluation, the retrieval-head
probe, the profiler. The caller builds the hooks (hybrid_jax.standard_hooks wires the standard ones), so the loop and the
rest of train/ import nothing from eval/, analysis/ or bench/: the layers flow one way.

A hook's cadence is declared where it is wired, not inside it, so adding an evaluation is one line there:

    hooks.every(500, MyEval(context))                      # after steps 500, 1000, ...
    hooks.every(250, probe, dense_every=50, dense_until=2000)  # 50, 100, ..., 2000, then 2250, 2500, ...
    hooks.window(11, 13, profiler)                         # around steps 11, 12 and 13

The loop asks `hook.due(step)` before each step and runs that hook's before_step and after_step only when it is
due. A hook may end the run early by returning `Stop(reason)` from after_step (or from begin): the loop then
checkpoints at that step, runs every at_end and reports `stopped_early`.
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


@dataclasses.dataclass(frozen=True)
class Stop:
  """A hook's request to end the run at this step (the run counts as completed, not preempted)."""
  reason: str


class Hook:
  """One piece of scheduled work; every method is optional."""

  def due(self, step: int) -> bool:
    """Whether before_step and after_step run around step `step` (1-based); every step unless wired with a cadence."""
    del step
    return True

  def begin(self, step: int) -> Stop | None:
    """Once, before this session's first step, with the steps already trained (0, or the resumed checkpoint's):
    a Stop ends the run there without training (a resumed run whose stopping rule already holds)."""
    del step
    return None

  def before_step(self, completed: int) -> None:
    """Before the step after `completed` steps."""

  def after_step(self, step: int, state, batch) -> Stop | None:
    """After step `step` has run and been logged, before its checkpoint; a Stop ends the run at this step."""

  def at_end(self, step: int, params) -> dict | None:
    """After a completed run (not a preempted one): what it returns goes into the report's 'eval'."""
    del step, params
    return None

  def close(self) -> None:
    """Always, when training stops (also after an error)."""


@dataclasses.dataclass(frozen=True)
class Cadence:
  """The steps a hook runs at: every `every` steps (0: never), but every `dense_every` up to step `dense_until`,
  and only inside [first, last] (last None: no end)."""
  every: int
  dense_every: int = 0
  dense_until: int = 0
  first: int = 1
  last: int | None = None

  def __call__(self, step: int) -> bool:
    if step < self.first or (self.last is not None and step > self.last):
      return False
    n = self.dense_every if self.dense_every and step <= self.dense_until else self.every
    return bool(n) and step % n == 0


class Scheduled(Hook):
  """`hook` run on `cadence`: its before_step and after_step only at the steps the cadence names."""

  def __init__(self, cadence: Callable[[int], bool], hook: Hook):
    self.cadence, self.hook = cadence, hook

  def due(self, step):
    return self.cadence(step) and self.hook.due(step)

  def begin(self, step):
    return self.hook.begin(step)

  def before_step(self, completed):
    return self.hook.before_step(completed)

  def after_step(self, step, state, batch):
    return self.hook.after_step(step, state, batch)

  def at_end(self, step, params):
    return self.hook.at_end(step, params)

  def close(self):
    return self.hook.close()


def every(n: int, hook: Hook, **cadence) -> Scheduled:
  """`hook` after steps n, 2n, ... (n = 0: never); `cadence`: Cadence's other fields (dense_every, last, ...)."""
  return Scheduled(Cadence(n, **cadence), hook)


def window(first: int, last: int, hook: Hook) -> Scheduled:
  """`hook` around every step from `first` to `last` (before_step ahead of `first`, after_step after `last`)."""
  return Scheduled(Cadence(1, first=first, last=last), hook)


HookFactory = Callable[[LoopContext], list]
