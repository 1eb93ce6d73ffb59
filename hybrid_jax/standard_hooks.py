"""A training run as the commands start it: the loop (hybrid_jax.train.loop) with the standard hooks wired in.

The hooks live above train/ (eval/, analysis/, bench/); each cadence is declared in `wire`, the one place
that says what runs during training: held-out evaluation every train.eval_every steps and at the end, the
retrieval-head probe every train.retrieval_probe_every steps (every train.retrieval_probe_dense_every up to
train.retrieval_probe_dense_until), which with train.stop_when_formed also ends the run once retrieval has formed,
the profiler over train.profile_steps steps after train.profile_start, and the numerics canary every
train.numerics_canary_every steps (hybrid_jax.train.canary). Checkpointing and the metric writers stay
in the loop: resuming bit for bit depends on them.
"""

from hybrid_jax.analysis import callbacks, formation
from hybrid_jax.bench.step_profiler import StepProfiler
from hybrid_jax.config import ConfigError
from hybrid_jax.data.pipeline import held_out_documents, make_eval_batches
from hybrid_jax.eval import position
from hybrid_jax.eval.perplexity import evaluate_packed
from hybrid_jax.parallel import distributed
from hybrid_jax.train import canary, hooks, loop, metrics


class HeldOutEval(hooks.Hook):
  """The packed held-out loss at each step it is due; at the end, loss by position inside whole held-out documents
  (eval.documents of them; 0 leaves it out) with the packed loss over eval.batches beside it."""

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
  """NIAH or recall accuracy of the retrieval heads at each step it is due (hybrid_jax.analysis.callbacks). With
  train.stop_when_formed it keeps that metric's history and stops the run once it has formed: train.formed_probes
  probes in a row at train.formed_threshold or above (hybrid_jax.analysis.formation)."""

  def __init__(self, context: hooks.LoopContext, probe):
    self.context, self.probe = context, probe
    self.metric = context.config.train.stop_when_formed
    self.history = []  # (step, value) of the watched metric at every probe, the resumed run's earlier ones first.
    self.checked = False

  def begin(self, step):
    """A resumed run takes up its probe history (the streak goes on), and is over if it had already formed."""
    if not self.metric:
      return None
    if step and self.context.lead:  # Only process 0 writes metrics.jsonl; it decides for all (loop._agreed).
      records = metrics.read_jsonl(self.context.workdir / 'metrics.jsonl')
      self.history = [(r['step'], r.get(self.metric)) for r in records if r['kind'] == 'probe' and r['step'] <= step]
    return self._formed()

  def after_step(self, step, state, batch):
    values = self.probe(state['params'])
    self.context.write(step, values, 'probe')
    if not self.metric:
      return None
    if not self.checked and self.metric not in values:
      raise ConfigError(f'config.train.stop_when_formed={self.metric!r} is invalid: the retrieval probe does not log '
                        f'it; it logs {", ".join(sorted(values))}')
    self.checked = True
    self.history.append((step, values.get(self.metric)))
    return self._formed()

  def _formed(self) -> hooks.Stop | None:
    t = self.context.config.train
    if not formation.should_stop(self.history, t.formed_threshold, t.formed_probes):
      return None
    steps = ', '.join(str(s) for s, _ in self.history[-t.formed_probes:])
    return hooks.Stop(f'formed: {self.metric} >= {t.formed_threshold:g} at {t.formed_probes} probes in a row '
                      f'(steps {steps})')


def wire(context: hooks.LoopContext) -> list:
  """Held-out evaluation, the retrieval probe (when configured), the profiler and the numerics canary, in the order
  they run, each with its cadence: one line here adds an evaluation during training."""
  t = context.config.train
  out = [hooks.every(t.eval_every, HeldOutEval(context), last=t.steps - 1)]  # The last step's is at_end's.
  probe = callbacks.make_retrieval_probe(context.config, context.model_def, context.mesh)
  if probe is not None:  # train.retrieval_probe_every > 0.
    out.append(hooks.every(t.retrieval_probe_every, RetrievalProbeHook(context, probe),
                           dense_every=t.retrieval_probe_dense_every, dense_until=t.retrieval_probe_dense_until))
  if t.profile_start:
    out.append(hooks.window(t.profile_start + 1, t.profile_start + t.profile_steps,
                            StepProfiler(context.workdir, t.profile_start, t.profile_steps, context.lead,
                                         context.train_step)))
  canary_every = canary.every(t, context.mesh)  # train.numerics_canary_every, 'auto' by platform.
  if canary_every:  # At step 1 too: a kernel wrong from the start shows at once.
    out.append(hooks.every(canary_every, canary.NumericsCanary(context), dense_every=1, dense_until=1))
  return out


def train(config, workdir) -> dict:
  """Trains (or resumes) the run in `workdir` with the standard hooks; returns the report (loop.train)."""
  return loop.train(config, workdir, hooks=wire)
