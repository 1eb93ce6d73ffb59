"""A training run as the commands start it: the loop (hybrid_jax.train.loop) with the standard hooks wired in.

The hooks live above train/ (eval/, analysis/, bench/) and the loop only runs them, each on its own schedule:
held-out evaluation every train.eval_every steps and at the end, the retrieval-head probe every
train.retrieval_probe_every steps, the profiler over train.profile_steps steps after train.profile_start.
Checkpointing and the metric writers stay in the loop: resuming bit for bit depends on them.
"""

from hybrid_jax.analysis import callbacks
from hybrid_jax.bench.step_profiler import StepProfiler
from hybrid_jax.data.pipeline import held_out_documents, make_eval_batches
from hybrid_jax.eval import position
from hybrid_jax.eval.perplexity import evaluate_packed
from hybrid_jax.parallel import distributed
from hybrid_jax.train import hooks, loop


class HeldOutEval(hooks.Hook):
  """The packed held-out loss every train.eval_every steps; at the end, loss by position inside whole held-out
  documents (eval.documents of them; 0 leaves it out) with the packed loss over eval.batches beside it."""

  def __init__(self, context: hooks.LoopContext):
    self.context, config = context, context.config
    self.batches = self._batches(config.train.eval_batches)
    # Too few long held-out documents fails here, before training.
    self.documents = (held_out_documents(config, config.data.seq_len, config.eval.documents)
                      if config.eval.documents else None)

  def _place(self, batch):
    return distributed.replicated_batch(batch, self.context.shardings.batch)

  def _batches(self, n):
    return [self._place(b) for b in make_eval_batches(self.context.config, n)]

  def _packed(self, step, params, batches):
    result = evaluate_packed(self.context.eval_step, params, batches)
    self.context.write(step, {k: result[k] for k in ('packed_loss', 'packed_perplexity')}, 'eval')
    return result

  def after_step(self, step, state, batch):
    t = self.context.config.train
    if t.eval_every and step % t.eval_every == 0 and step != t.steps:
      self._packed(step, state['params'], self.batches)

  def at_end(self, step, params):
    config = self.context.config
    if self.documents is None:
      return self._packed(step, params, self._batches(config.eval.batches))
    by_document = position.evaluate(self.context.eval_step, params, self.documents, [config.data.seq_len],
                                    batch_size=config.train.batch_size, place=self._place,
                                    packing=config.data.packing)
    return {**by_document.summary(config.eval.position_buckets)[str(config.data.seq_len)],
            **self._packed(step, params, self._batches(config.eval.batches))}


class RetrievalProbeHook(hooks.Hook):
  """NIAH accuracy of the retrieval heads every train.retrieval_probe_every steps (hybrid_jax.analysis.callbacks)."""

  def __init__(self, context: hooks.LoopContext, probe):
    self.context, self.probe = context, probe

  def after_step(self, step, state, batch):
    if step % self.context.config.train.retrieval_probe_every == 0:
      self.context.write(step, self.probe(state['params']), 'probe')


def standard_hooks(context: hooks.LoopContext) -> list:
  """Held-out evaluation, the retrieval probe (when configured) and the profiler, in the order they run."""
  t = context.config.train
  probe = callbacks.make_retrieval_probe(context.config, context.model_def, context.mesh)
  out = [HeldOutEval(context)]
  if probe is not None:  # train.retrieval_probe_every > 0.
    out.append(RetrievalProbeHook(context, probe))
  out.append(StepProfiler(context.workdir, t.profile_start, t.profile_steps, context.lead, context.train_step))
  return out


def train(config, workdir) -> dict:
  """Trains (or resumes) the run in `workdir` with the standard hooks; returns the report (loop.train)."""
  return loop.train(config, workdir, hooks=standard_hooks)
