"""The training loop: init or resume, jitted steps, periodic eval / checkpoints / metrics, final report.

Resuming is automatic: the same command on the same workdir continues from the newest restorable checkpoint
(model, optimizer, step and data-iterator state), so the loss at every later step equals the uninterrupted run's.
SIGTERM writes a checkpoint before exiting; a non-finite loss stops the run naming the step and keeps the last
good checkpoint.
"""

import contextlib
import json
import logging
import math
import pathlib
import signal
import statistics
import time

import jax
import numpy as np
import tqdm

from hybrid_jax.config import ConfigError, validate
from hybrid_jax.data.pipeline import checked_tokenizer, make_train_dataset
from hybrid_jax.errors import UserError
from hybrid_jax.models.counting import param_counts
from hybrid_jax.models.flops import training_flops_per_token
from hybrid_jax.models.mixers import registry
from hybrid_jax.parallel import distributed, mesh as mesh_lib, rules as rules_lib
from hybrid_jax.train import checkpoint, hooks as hooks_lib, metrics, optim, report, state as state_lib
from hybrid_jax.train import runs, session as session_lib, step as step_lib


class TrainingDiverged(UserError, RuntimeError):
  """The loss became NaN or infinite."""


class _NullWriter:
  """Metrics sink of processes other than 0 (one writer per run directory)."""

  def write(self, *args, **kwargs):
    del args, kwargs

  def close(self):
    pass


@contextlib.contextmanager
def _stop_on_sigterm():
  """Yields a dict whose 'requested' flag turns True on SIGTERM, so the loop can checkpoint and exit cleanly."""
  flag = {'requested': False}
  if jax.process_count() > 1:  # jax's preemption service owns SIGTERM; processes agree via _stop_requested.
    flag['preemption_service'] = jax.config.jax_enable_preemption_service
    if not flag['preemption_service']:
      logging.warning(
          'preemption checkpoints are off: this multi-process run has jax_enable_preemption_service=False, and '
          'without that service the processes cannot agree on a step to checkpoint at, so SIGTERM stops the run '
          'without a checkpoint (the periodic ones, every train.checkpoint_every steps, are kept). Leave '
          'JAX_ENABLE_PREEMPTION_SERVICE unset to checkpoint on SIGTERM.')
    yield flag
    return

  def handler(signum, frame):
    del frame
    flag['requested'] = True
    logging.warning('received signal %d: saving a checkpoint and stopping after this step', signum)

  previous = signal.signal(signal.SIGTERM, handler)
  try:
    yield flag
  finally:
    signal.signal(signal.SIGTERM, previous)


def _stop_requested(flag, step) -> bool:
  """True when this run must checkpoint and stop after `step`; in a multi-process run, on every process at once
  (any process's SIGTERM reaches all through jax's preemption sync point, so their checkpoints stay in step)."""
  if jax.process_count() == 1:
    return flag['requested']
  if not flag['preemption_service']:  # Said at start (_stop_on_sigterm).
    return False
  from jax.experimental import multihost_utils
  return bool(multihost_utils.reached_preemption_sync_point(step))


def init_from_mismatch(run_dir, model_cfg) -> str | None:
  """Why parameters taken from `run_dir` compute something else in a model of `model_cfg` that has the same shapes
  (a mixer's constants that are not parameters, e.g. Lightning's decay rates: each registry entry's
  init_mismatch), or None. A run without a readable config is not judged."""
  try:
    source = runs.load_config(run_dir).model
  except runs.RunError:
    return None
  reason = registry.init_mismatch(source, model_cfg)
  return reason and f'config.train.init_from={run_dir}: {reason}'


def _params_of_run(run_dir, params, model_cfg):
  """The newest checkpoint's parameters of another run, in the layout of `params` (e.g. for context extension)."""
  mismatch = init_from_mismatch(run_dir, model_cfg)
  if mismatch:
    logging.warning('%s', mismatch)
  steps = runs.checkpoint_steps(run_dir)
  if not steps:
    raise ConfigError(f'config.train.init_from={run_dir!r} is invalid: no checkpoints under {run_dir}/checkpoints')
  target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), params)
  try:
    restored = runs.restore_params(run_dir, steps[-1], target)
  except runs.RunError as e:
    raise ConfigError(f'config.train.init_from={run_dir!r} is invalid: {e}') from e
  logging.info('initialised the parameters from step %d of %s', steps[-1], run_dir)
  return restored


def warn_if_slow_on_cpu(config) -> None:
  """Study configs compute in bfloat16 for accelerators; on CPU that is the slow choice, so say so."""
  if jax.default_backend() == 'cpu' and config.model.dtype == 'bfloat16':
    logging.warning('model.dtype=bfloat16 on CPU: XLA:CPU runs bfloat16 matmuls several times slower than float32 '
                    '(7-15x for an S1 step, BENCHMARKS.md); pass --config.model.dtype=float32 for CPU runs')


def train(config, workdir, hooks: hooks_lib.HookFactory | None = None) -> dict:
  """Trains (or resumes) the run in `workdir`; returns the report dict (also written to report.json).

  `hooks(context)` builds the scheduled work (held-out evaluation, probes, profiling; hybrid_jax.train.hooks),
  before the first step; hybrid_jax.training.train passes the standard ones. None runs the bare loop.

  The run holds `workdir` throughout; another trainer on it, or a resume that changes a key defining the run,
  stops before anything is restored (session.REFUSALS).
  """
  workdir = runs.local_workdir(workdir)
  validate(config)
  checked_tokenizer(config)
  distributed.initialize(config.parallel.distributed)
  distributed.check_same_config(config, config.parallel.distributed.barrier_timeout_s)
  with session_lib.open_session(config, workdir) as session:
    return _train(config, workdir, session, hooks)


def _train(config, workdir: pathlib.Path, session: session_lib.Session, make_hooks) -> dict:
  lead = jax.process_index() == 0  # Process 0 writes metrics and reports; all processes write checkpoints.
  workdir.mkdir(parents=True, exist_ok=True)
  t = config.train
  tokens_per_step = t.batch_size * config.data.seq_len
  flops_per_step = training_flops_per_token(config.model, config.data.seq_len) * tokens_per_step  # Model FLOPs.
  peak = metrics.peak_tflops(jax.devices()[0].device_kind, t.peak_tflops)  # None (no MFU) when unknown, e.g. CPU.
  warn_if_slow_on_cpu(config)

  mesh = mesh_lib.make_mesh(config.parallel)
  rules = rules_lib.parse_rules(config.parallel.rules)
  mesh_lib.check_batch(t, dict(mesh.shape), rules)
  mesh_lib.check_sequence(config.data.seq_len, dict(mesh.shape), rules)
  model_def = state_lib.make_model_def(config.model)
  unsplit = mesh_lib.unsplit_warning(model_def, rules, dict(mesh.shape))
  if unsplit and lead:
    logging.warning('%s', unsplit)
  tx = optim.make_optimizer(t)
  shardings = mesh_lib.train_shardings(model_def, tx, mesh, rules,
                                       bool(config.parallel.shard_optimizer))
  reader, readers = distributed.batch_readers(shardings.batch, (t.batch_size, config.data.seq_len))
  data_iter = iter(make_train_dataset(config, process_index=reader, process_count=readers))
  ckpt = checkpoint.Checkpointer(workdir / 'checkpoints', keep=t.keep_checkpoints, async_save=t.async_checkpointing)
  abstract = state_lib.abstract_train_state(state_lib.abstract_initial_state(config.model, config.seed, tx),
                                            shardings.state)
  restored = ckpt.restore_latest(abstract, data_iter)
  start = 0
  if restored is not None:
    start, state = restored
    logging.info('resumed from the checkpoint at step %d in %s', start, ckpt.directory)
  else:
    state = state_lib.init_sharded_train_state(config.model, config.seed, tx, shardings.state)
    if t.init_from:
      state['params'] = _params_of_run(t.init_from, state['params'], config.model)
  session.start(start)  # config.json for a fresh run; this session (and its config changes) in the history.
  train_step = step_lib.make_train_step(model_def, tx, t, shardings)
  eval_step = step_lib.make_eval_step(model_def, shardings, t.loss_chunk)
  writer = None  # Opened after the hooks are built (a hook may refuse the run first, e.g. too little held-out text).
  context = hooks_lib.LoopContext(config=config, workdir=workdir, lead=lead, mesh=mesh, model_def=model_def,
                                  shardings=shardings, train_step=train_step, eval_step=eval_step,
                                  write=lambda step, values, prefix: writer.write(step, values, prefix=prefix))
  hooks = list(make_hooks(context)) if make_hooks else []
  schedule = optim.make_schedule(t)
  writer = metrics.MetricsWriter(workdir, resumed_from=start) if lead else _NullWriter()

  step_times, status, last_saved = [], 'completed', start
  # This logging interval's step losses (a resumed session's first interval starts at its first step): the logged
  # train loss is their mean, as one step's loss alone reads noisier than training is.
  interval_losses, logged_losses = [], []
  bar = tqdm.tqdm(total=t.steps, initial=start, disable=not (t.progress and lead), desc=config.name, unit='step',
                  dynamic_ncols=True)
  started, finished, step = time.perf_counter(), False, start
  try:
    with _stop_on_sigterm() as stop:
      step = start
      while step < t.steps:
        batch = distributed.global_batch(next(data_iter), shardings.batch, t.batch_size)
        for hook in hooks:
          hook.before_step(step)
        tic = time.perf_counter()
        state, m = train_step(state, batch)
        loss = float(m['loss'])  # Syncs: the step time below is real, and a bad loss is caught at its step.
        step_times.append(time.perf_counter() - tic)
        step += 1
        if not math.isfinite(loss):
          ckpt.wait()
          kept = (f'The last good checkpoint (step {last_saved}) is kept in {ckpt.directory}' if last_saved else
                  f'No checkpoint was saved before it (train.checkpoint_every={t.checkpoint_every})')
          raise TrainingDiverged(f'training loss is {loss} at step {step} (run {config.name}); stopping. {kept}. '
                                 'Lower train.lr or raise train.warmup_steps.')
        bar.update(1)
        interval_losses.append(loss)
        if step % t.log_every == 0 or step == t.steps:
          dt = statistics.median(step_times[-t.log_every:])
          logged = {k: float(v) for k, v in m.items()}
          logged.update(loss=statistics.fmean(interval_losses), loss_last=loss, loss_steps=len(interval_losses))
          logged_losses, interval_losses = interval_losses, []
          logged.update(lr=float(schedule(step - 1)), step_time_s=dt, tokens_per_s=tokens_per_step / dt)
          logged.update(metrics.throughput(flops_per_step, dt, jax.device_count(), peak))
          writer.write(step, logged, prefix='train')
          bar.set_postfix(loss=f'{logged["loss"]:.3f}', tok_s=f'{tokens_per_step / dt:,.0f}')
        for hook in hooks:
          hook.after_step(step, state, batch)
        stop['requested'] = _stop_requested(stop, step)
        if step % t.checkpoint_every == 0 or step == t.steps or stop['requested']:
          session.check()  # Never write into a workdir another trainer has taken over.
          ckpt.save(step, state, data_iter)
          last_saved = step
        if stop['requested']:
          status = 'preempted'
          break
    ckpt.wait()
    finished = True
  except metrics.StorageError as e:  # Disk full, not writable: stop now, with what is kept (nothing waits on it).
    kept = (f'the newest checkpoint (step {last_saved}) is kept in {ckpt.directory}' if last_saved else
            'no checkpoint was saved before it')
    raise metrics.StorageError(f'{e} (at step {step} of run {config.name}); {kept}: free the space or fix the '
                               'permissions, then rerun the same command to resume') from e
  except jax.errors.JaxRuntimeError as e:  # In a multi-process run: a collective or barrier lost a peer.
    if jax.process_count() == 1:
      raise
    raise distributed.peer_failure(e, step + 1) from e
  finally:
    bar.close()
    if not finished:
      writer.close()  # Closed now, before the error travels on.
    for hook in hooks:
      hook.close()
    try:
      ckpt.close()
    except Exception:  # After a failure (e.g. a dead peer process) closing fails too; keep the first error.
      if finished:
        raise
      logging.warning('closing the checkpointer after an error failed as well', exc_info=True)

  final = None
  if status == 'completed':
    for hook in hooks:
      part = hook.at_end(step, state['params'])
      final = {**(final or {}), **part} if part is not None else final
  writer.close()
  counts = param_counts(config.model)
  steady = step_times[1:] or step_times
  result = {
      'name': config.name, 'arch': config.model.arch, 'scale': config.model.scale, 'status': status,
      'steps': step, 'resumed_from': start, 'seq_len': config.data.seq_len, 'batch_size': t.batch_size,
      'sessions': session.sessions,  # Every start and resume, with its config changes (config_history.json).
      'params': {k: counts[k] for k in ('non_embedding', 'embedding', 'total')},
      'devices': [str(d) for d in jax.devices()],
      'mesh': dict(mesh.shape), 'processes': jax.process_count(),
      'wall_time_s': time.perf_counter() - started,
      'step_time_s_median': statistics.median(steady) if steady else None,
      'first_step_time_s': step_times[0] if step_times else None,
      'tokens_per_s': tokens_per_step / statistics.median(steady) if steady else None,
      'training_flops_per_token': flops_per_step / tokens_per_step,
      **(metrics.throughput(flops_per_step, statistics.median(steady), jax.device_count(), peak) if steady else {}),
      # The mean over the last logging interval (or the steps since, if the run stopped inside one), and the last
      # step's own loss.
      'final_train_loss': statistics.fmean(interval_losses or logged_losses) if step_times else None,
      'final_train_loss_last': float(m['loss']) if step_times else None,
      'eval': final,
  }
  if lead:
    report.write_report(workdir, result, metrics.read_jsonl(workdir / 'metrics.jsonl'))
  return result


def summary_line(result: dict) -> str:
  ev = result.get('eval') or {}
  parts = [f"{result['name']}: {result['status']} at step {result['steps']}"]
  if ev:
    parts.append(f"held-out loss {ev['packed_loss']:.4f} over packed rows" +
                 (f", {ev['loss']:.4f} over {ev['documents']} whole documents" if 'documents' in ev else ''))
  if result.get('tokens_per_s'):
    parts.append(f"{result['tokens_per_s']:,.0f} tokens/s")
  return ', '.join(parts)


def dump(result) -> str:
  return json.dumps(result, indent=2, default=lambda o: np.asarray(o).tolist())
