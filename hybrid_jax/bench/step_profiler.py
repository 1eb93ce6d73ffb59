"""Profiling a few steps of a real training run (`train.profile_start`, `train.profile_steps`).

The trace goes to `<workdir>/tensorboard`, so TensorBoard's profile tab shows it beside the training scalars
(Perfetto opens the perfetto_trace.json.gz inside it too). Process 0 then attributes the traced operations to the
model's parts, as `bench step` does (hybrid_jax.bench.profile), and writes `<workdir>/profile_breakdown.json`.
"""

import json
import logging
import pathlib

import jax

from hybrid_jax.bench import profile
from hybrid_jax.train import hooks


class StepProfiler(hooks.Hook):
  """Traces the steps after `start` completed ones, `steps` of them; does nothing when `start` is 0."""

  def __init__(self, workdir, start: int, steps: int, lead: bool, train_step):
    self.workdir, self.start, self.steps, self.lead = pathlib.Path(workdir), int(start), int(steps), lead
    self.train_step = train_step
    self.logdir = self.workdir / 'tensorboard'
    self.active = False

  def before_step(self, completed: int) -> None:
    if self.start and completed == self.start:
      jax.profiler.start_trace(str(self.logdir), create_perfetto_trace=True)
      self.active = True

  def after_step(self, step: int, state, batch) -> dict | None:
    """Stops the trace after the last profiled step; process 0 returns (and writes) the breakdown by part.

    The breakdown needs the compiled program's text, so the step is compiled once more (from the cache where the
    backend keeps one).
    """
    if not (self.active and step == self.start + self.steps):
      return None
    self.close()
    if not self.lead:
      return None
    hlo_text = self.train_step.lower(state, batch).compile().as_text()
    result = profile.breakdown(hlo_text, profile.newest_trace(str(self.logdir)), self.steps)
    result['first_step'] = self.start + 1
    (self.workdir / 'profile_breakdown.json').write_text(json.dumps(result, indent=1) + '\n')
    top = ', '.join(f"{r['part']} {100 * r['share']:.0f}%" for r in result['parts'][:4])
    logging.info('profiled steps %d-%d (%s): %s', self.start + 1, self.start + self.steps, self.logdir, top)
    return result

  def close(self) -> None:
    """Stops a running trace (also when training stops early)."""
    if self.active:
      jax.profiler.stop_trace()
      self.active = False
