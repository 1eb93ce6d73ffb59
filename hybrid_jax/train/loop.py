"""The training loop: init or resume, jitted steps, periodic eval / checkpoints / metrics, final report.

Resuming is automatic: the same command on the same workdir continues from the newest restorable checkpoint
(model, optimizer, step and data-iterator state), so the loss at every later step equals the uninterrupted run's.
SIGTERM writes a checkpoint before exiting; a non-finite loss stops the run naming the step and keeps the last
good checkpoint. A hook may end the run before train.steps (hybrid_jax.train.hooks.Stop): it is checkpointed
there, completed, and a rerun finds it finished (hybrid_jax.train.early_stop).

Three parts, each readable alone: _setup (everything before the first step), _steps (the step loop) and _report.
"""

import contextlib
import dataclasses
import json
import logging
import math
import pathlib
import signal
import statistics
import time
from typing import Any

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
from hybrid_jax.train import checkpoint, early_stop, hooks as hooks_lib, metrics, optim, report, state as state_lib
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
  before the first step; hybrid_jax.standard_hooks.train passes the standard ones. None runs the bare loop.

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
  run = _setup(config, workdir, session, make_hooks)
  progress = _steps(run)
  final = _at_end(run.hooks, progress) if progress.status == 'completed' else None
  run.writer.close()
  return _report(run, progress, final)


@dataclasses.dataclass
class _Run:
  """A session's run, ready for its first step: what the step loop and the report read."""
  config: Any
  workdir: pathlib.Path
  session: session_lib.Session
  mesh: Any
  batch_sharding: Any
  data_iter: Any
  ckpt: checkpoint.Checkpointer
  start: int  # Steps trained before this session.
  state: Any
  train_step: Any
  hooks: list
  writer: Any
  schedule: Any  # The learning rate per step, for the logs.
  stop: hooks_lib.Stop | None  # Set when the run is over before its first step (an early stop, resumed).


def _setup(config, workdir: pathlib.Path, session: session_lib.Session, make_hooks) -> _Run:
  """The mesh and shardings, the data iterator, the state (restored, or new), the jitted steps, the hooks and the
  metric writer; and whether the run is already over (stopped early before, or a hook's rule holds at the start)."""
  lead = jax.process_index() == 0  # Process 0 writes metrics and reports; all processes write checkpoints.
  workdir.mkdir(parents=True, exist_ok=True)
  t = config.train
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
  writer = metrics.MetricsWriter(workdir, resumed_from=start) if lead else _NullWriter()
  stop = _stopped_at_start(workdir, start, t.steps, hooks) if start < t.steps else None
  return _Run(config=config, workdir=workdir, session=session, mesh=mesh, batch_sharding=shardings.batch,
              data_iter=data_iter, ckpt=ckpt, start=start, state=state, train_step=train_step, hooks=hooks,
              writer=writer, schedule=optim.make_schedule(t), stop=stop)


def _stopped_at_start(workdir, start: int, cap: int, hooks) -> hooks_lib.Stop | None:
  """Whether the run is over before this session trains: it stopped early at `start` under a cap at least `cap`
  (early_stop), or a hook's rule already holds there (Hook.begin; recorded like a stop after a step). Called once
  the metric writer has dropped the records after `start`, as a hook's rule may read them."""
  stop = early_stop.finished_at(workdir, start, cap)
  if stop is None:
    stop = _first_stop(hook.begin(start) for hook in hooks)
    if stop is not None and jax.process_index() == 0:
      early_stop.record(workdir, start, stop.reason, cap)
  return _agreed(stop)


def _first_stop(requests) -> hooks_lib.Stop | None:
  """The first Stop among hook results (every hook has run: `requests` is consumed whole)."""
  stops = [r for r in list(requests) if isinstance(r, hooks_lib.Stop)]
  return stops[0] if stops else None


_REASON_BYTES = 1024


def _agreed(stop: hooks_lib.Stop | None) -> hooks_lib.Stop | None:
  """Process 0's stop decision, on every process. The hooks of every process see the same replicated metrics, but
  a rule may also read what only process 0 wrote (a resumed run's metrics.jsonl), and a process stopping alone
  would leave the others waiting in the next step's collectives; so process 0 decides for all."""
  if jax.process_count() == 1:
    return stop
  from jax.experimental import multihost_utils
  text = (stop.reason if stop else '').encode()[:_REASON_BYTES]
  buffer = np.zeros(_REASON_BYTES + 1, np.uint8)
  buffer[0] = stop is not None
  buffer[1:1 + len(text)] = np.frombuffer(text, np.uint8)
  got = np.asarray(multihost_utils.broadcast_one_to_all(buffer))
  return hooks_lib.Stop(bytes(got[1:]).rstrip(b'\0').decode(errors='replace')) if got[0] else None


@dataclasses.dataclass
class _Progress:
  """Where the step loop got to: the state after `step` steps, and what the report says of them."""
  state: Any
  step: int
  last_saved: int
  started: float  # time.perf_counter() at the loop's start.
  status: str = 'completed'
  stopped_early: dict | None = None  # {'step', 'reason'} when a hook ended the run before train.steps.
  step_times: list = dataclasses.field(default_factory=list)
  # This logging interval's step losses (a resumed session's first interval starts at its first step): the logged
  # train loss is their mean, as one step's loss alone reads noisier than training is.
  interval_losses: list = dataclasses.field(default_factory=list)
  logged_losses: list = dataclasses.field(default_factory=list)
  last_loss: float | None = None


def _steps(run: _Run) -> _Progress:
  """Trains from run.start to train.steps, or until a hook stops the run or SIGTERM arrives; checkpoints every
  train.checkpoint_every steps and where it stops. Closes the hooks and the checkpointer, also after an error."""
  config, t, lead = run.config, run.config.train, jax.process_index() == 0
  bar = tqdm.tqdm(total=t.steps, initial=run.start, disable=not (t.progress and lead), desc=config.name, unit='step',
                  dynamic_ncols=True)
  p = _Progress(state=run.state, step=run.start, last_saved=run.start, started=time.perf_counter())
  if run.stop is not None:
    p.stopped_early = {'step': run.start, 'reason': run.stop.reason}
  finished = False
  try:
    with _stop_on_sigterm() as sigterm:
      while p.step < t.steps and p.stopped_early is None:
        batch = distributed.global_batch(next(run.data_iter), run.batch_sharding, t.batch_size)
        due = [hook for hook in run.hooks if hook.due(p.step + 1)]
        for hook in due:
          hook.before_step(p.step)
        tic = time.perf_counter()
        p.state, m = run.train_step(p.state, batch)
        p.last_loss = float(m['loss'])  # Syncs: the step time below is real, and a bad loss is caught at its step.
        p.step_times.append(time.perf_counter() - tic)
        p.step += 1
        _check_finite(run, p)
        bar.update(1)
        p.interval_losses.append(p.last_loss)
        if p.step % t.log_every == 0 or p.step == t.steps:
          _log_interval(run, p, m, bar)
        stop = _agreed(_first_stop(hook.after_step(p.step, p.state, batch) for hook in due)) if due else None
        sigterm['requested'] = _stop_requested(sigterm, p.step)
        if stop is not None and lead:
          early_stop.record(run.workdir, p.step, stop.reason, t.steps)  # Before its checkpoint: see early_stop.
        if p.step % t.checkpoint_every == 0 or p.step == t.steps or sigterm['requested'] or stop is not None:
          run.session.check()  # Never write into a workdir another trainer has taken over.
          run.ckpt.save(p.step, p.state, run.data_iter)
          p.last_saved = p.step
        if sigterm['requested']:
          p.status = 'preempted'  # A stop requested at this step too is found by the rerun (early_stop.finished_at).
          break
        if stop is not None:
          p.stopped_early = {'step': p.step, 'reason': stop.reason}
    run.ckpt.wait()
    finished = True
  except metrics.StorageError as e:  # Disk full, not writable: stop now, with what is kept (nothing waits on it).
    kept = (f'the newest checkpoint (step {p.last_saved}) is kept in {run.ckpt.directory}' if p.last_saved else
            'no checkpoint was saved before it')
    raise metrics.StorageError(f'{e} (at step {p.step} of run {config.name}); {kept}: free the space or fix the '
                               'permissions, then rerun the same command to resume') from e
  except jax.errors.JaxRuntimeError as e:  # In a multi-process run: a collective or barrier lost a peer.
    if jax.process_count() == 1:
      raise
    raise distributed.peer_failure(e, p.step + 1) from e
  finally:
    bar.close()
    if not finished:
      run.writer.close()  # Closed now, before the error travels on.
    for hook in run.hooks:
      hook.close()
    try:
      run.ckpt.close()
    except Exception:  # After a failure (e.g. a dead peer process) closing fails too; keep the first error.
      if finished:
        raise
      logging.warning('closing the checkpointer after an error failed as well', exc_info=True)
  return p


def _check_finite(run: _Run, p: _Progress) -> None:
  """Raises TrainingDiverged when step p.step's loss is NaN or infinite, naming the checkpoint that is kept."""
  if math.isfinite(p.last_loss):
    return
  run.ckpt.wait()
  kept = (f'The last good checkpoint (step {p.last_saved}) is kept in {run.ckpt.directory}' if p.last_saved else
          f'No checkpoint was saved before it (train.checkpoint_every={run.config.train.checkpoint_every})')
  raise TrainingDiverged(f'training loss is {p.last_loss} at step {p.step} (run {run.config.name}); stopping. '
                         f'{kept}. Lower train.lr or raise train.warmup_steps.')


def _log_interval(run: _Run, p: _Progress, m: dict, bar) -> None:
  """Writes the train metrics of the logging interval that ends at step p.step."""
  t = run.config.train
  tokens_per_step = t.batch_size * run.config.data.seq_len
  dt = statistics.median(p.step_times[-t.log_every:])
  logged = {k: float(v) if np.ndim(v) == 0 else np.asarray(v).tolist() for k, v in m.items()}  # MoE loads: lists.
  logged.update(loss=statistics.fmean(p.interval_losses), loss_last=p.last_loss, loss_steps=len(p.interval_losses))
  p.logged_losses, p.interval_losses = p.interval_losses, []
  logged.update(lr=float(run.schedule(p.step - 1)), step_time_s=dt, tokens_per_s=tokens_per_step / dt)
  logged.update(metrics.throughput(_flops_per_step(run.config), dt, jax.device_count(), _peak(t)))
  run.writer.write(p.step, logged, prefix='train')
  bar.set_postfix(loss=f'{logged["loss"]:.3f}', tok_s=f'{tokens_per_step / dt:,.0f}')


def _flops_per_step(config) -> float:
  """Model FLOPs of one training step."""
  return training_flops_per_token(config.model, config.data.seq_len) * config.train.batch_size * config.data.seq_len


def _peak(t) -> float | None:
  """Peak TFLOP/s of one device; None (no MFU) when unknown, e.g. CPU."""
  return metrics.peak_tflops(jax.devices()[0].device_kind, t.peak_tflops)


def _at_end(hooks, p: _Progress) -> dict | None:
  """Every hook's at_end (a completed run, an early-stopped one included), merged: the report's 'eval'."""
  final = None
  for hook in hooks:
    part = hook.at_end(p.step, p.state['params'])
    final = {**(final or {}), **part} if part is not None else final
  return final


def _report(run: _Run, p: _Progress, final: dict | None) -> dict:
  """The report of this session (written to report.json by process 0)."""
  config, t = run.config, run.config.train
  tokens_per_step = t.batch_size * config.data.seq_len
  flops_per_step, peak = _flops_per_step(config), _peak(t)
  counts = param_counts(config.model)
  steady = p.step_times[1:] or p.step_times
  result = {
      'name': config.name, 'arch': config.model.arch, 'scale': config.model.scale, 'status': p.status,
      'steps': p.step, 'resumed_from': run.start, 'seq_len': config.data.seq_len, 'batch_size': t.batch_size,
      'stopped_early': p.stopped_early,  # {'step', 'reason'} when a hook ended the run before train.steps.
      'sessions': run.session.sessions,  # Every start and resume, with its config changes (config_history.json).
      'params': {k: counts[k] for k in ('non_embedding', 'embedding', 'total')},
      'devices': [str(d) for d in jax.devices()],
      'mesh': dict(run.mesh.shape), 'processes': jax.process_count(),
      'wall_time_s': time.perf_counter() - p.started,
      'step_time_s_median': statistics.median(steady) if steady else None,
      'first_step_time_s': p.step_times[0] if p.step_times else None,
      'tokens_per_s': tokens_per_step / statistics.median(steady) if steady else None,
      'training_flops_per_token': flops_per_step / tokens_per_step,
      **(metrics.throughput(flops_per_step, statistics.median(steady), jax.device_count(), peak) if steady else {}),
      # The mean over the last logging interval (or the steps since, if the run stopped inside one), and the last
      # step's own loss.
      'final_train_loss': statistics.fmean(p.interval_losses or p.logged_losses) if p.step_times else None,
      'final_train_loss_last': p.last_loss if p.step_times else None,
      'eval': final,
  }
  if jax.process_index() == 0:
    report.write_report(run.workdir, result, metrics.read_jsonl(run.workdir / 'metrics.jsonl'))
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
