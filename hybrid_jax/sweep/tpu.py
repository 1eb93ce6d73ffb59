"""The Cloud TPU backend: each slot is one queued-resource slice (launch/tpu_pod.py), running one run at a time.

A slot creates its slice (`--spot` for spot capacity) with the run's topology, waits until it is ACTIVE, sets it up
(clone, venv, the bucket mounted at /mnt/BUCKET on every worker) and runs the run's `train` on every worker over
ssh. When the run stops and the slice is no longer ACTIVE (a spot slice was preempted) or the trainer stopped on
SIGTERM (the preemption notice: it checkpointed), the slot deletes the slice, queues a new one and starts the run
again, which resumes from its directory on the bucket. A failed create is retried after --poll-s. A run keeps
its slice for the next run that needs the same accelerator.

The run directories are read by the runner too (to skip, resume and report), so --root is the bucket's mount path
on the workers and on the machine running the sweep alike (gcsfuse --implicit-dirs BUCKET /mnt/BUCKET).
"""

import dataclasses
import pathlib
import shlex
import subprocess
import sys
import time

from hybrid_jax import checks
from hybrid_jax.config import CONFIG_DIR, ConfigError, packaged_config
from hybrid_jax.compile_check import rows as compile_check_rows
from hybrid_jax.sweep import outcome

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / 'launch'))
import tpu_pod  # noqa: E402  # pylint: disable=g-import-not-at-top,wrong-import-position

_CORES_PER_CHIP = {'v4': 2, 'v5p': 2}  # Accelerator types of these count TensorCores; v5e and v6e count chips.
_TYPE_NAME = {'v5e': 'v5litepod'}
LOST = ('SUSPENDING', 'SUSPENDED', 'FAILED', 'DELETING', '')  # A slice gone or going: re-queue it.


def accelerator_type(target: str, chips: int) -> str:
  """compile-check's target ('v5p:4x4x4') and chip count as a gcloud accelerator type ('v5p-128')."""
  generation = target.partition(':')[0]
  return f'{_TYPE_NAME.get(generation, generation)}-{chips * _CORES_PER_CHIP.get(generation, 1)}'


def accelerators(members, fit_rows: dict | None, default: str) -> dict:
  """name -> accelerator type: the run's --fit row (arch, scale, seq_len), else `default`."""
  out = {}
  for m in members:
    c = m.config
    row = (fit_rows or {}).get((c.model.arch, c.model.scale, c.data.seq_len))
    out[m.name] = accelerator_type(row['target'], row['chips']) if row else default
  return out


def remote_spec(spec: str) -> str:
  """A config file inside this checkout as the same path inside the clone on the slice; a packaged config (by its
  name or its file) as its name, which the slice's package resolves; anything else as given."""
  path, sep, arg = spec.partition(':')
  file = pathlib.Path(path)
  if not file.is_file():
    return spec  # A packaged config's name (`hybrid`), or a path only the slice has.
  if file.resolve().parent == CONFIG_DIR and packaged_config(file.stem):
    return file.stem + sep + arg
  try:
    return str(file.resolve().relative_to(REPO)) + sep + arg
  except ValueError:
    return spec


@dataclasses.dataclass
class _Slice:
  name: str
  accelerator: str


class TpuBackend:
  """Runs each run's `train` on a slice of its own (one per slot)."""

  name = 'tpu'

  def __init__(self, args, members, accelerator_of: dict, say=print):
    self.args, self.accelerator_of, self.say = args, accelerator_of, say
    self.slots = args.parallel
    self.slices = [None] * self.slots
    self._stopping = False

  @classmethod
  def from_args(cls, args, members):
    missing = [f for f in ('zone', 'repo', 'bucket') if not getattr(args, f)]
    if missing:
      raise checks.InputError('--backend tpu needs ' + ', '.join(f'--{f}' for f in missing))
    if not pathlib.Path(args.root).is_absolute():
      raise checks.InputError(f'--root={args.root} is invalid with --backend tpu: give the absolute path where the '
                              f'bucket is mounted on every worker and here, e.g. /mnt/{args.bucket}/SWEEP')
    fit_rows = compile_check_rows.load(args.fit, args.chip) if args.fit else None
    try:
      return cls(args, members, accelerators(members, fit_rows, args.accelerator),
                 say=lambda line: print(line, flush=True))
    except KeyError as e:
      raise ConfigError(f'--fit {args.fit}: a row lacks {e}') from None

  def _slice_name(self, slot: int) -> str:
    return f'{self.args.name_prefix}-{slot}'

  def where(self, slot: int) -> str:
    s = self.slices[slot]
    return f'tpu {s.name} ({s.accelerator})' if s else f'tpu {self._slice_name(slot)}'

  def _argv(self, action, name, accelerator, command=(), dry_run=False) -> list[str]:
    a = self.args
    argv = [action, f'--name={name}', f'--zone={a.zone}', f'--accelerator={accelerator}',
            f'--version={a.version}', '--queued', f'--repo={a.repo}', f'--bucket={a.bucket}']
    argv += [f'--project={a.project}'] if a.project else []
    argv += ['--spot'] if a.spot else []
    argv += ['--dry-run'] if dry_run else []
    return argv + (['--', *command] if command else [])

  def _commands(self, action, name, accelerator, command=()) -> list[list[str]]:
    return tpu_pod.commands(tpu_pod.parse(self._argv(action, name, accelerator, command)))

  def _train_command(self, member) -> list[str]:
    args = member.train_args()
    return [args[0], f'--config={remote_spec(member.spec)}', *args[2:]]

  def commands(self, member) -> list[str]:
    """What one run executes on a fresh slice (slot 0), as gcloud lines."""
    name, accel = self._slice_name(0), self.accelerator_of[member.name]
    lines = []
    for action in ('create', 'state', 'setup', 'run', 'delete'):
      command = self._train_command(member) if action == 'run' else ()
      lines += [shlex.join(c) for c in self._commands(action, name, accel, command)]
    return lines

  def _gcloud(self, action, name, accelerator, log, command=()) -> tuple[int, str]:
    """Runs one launcher action; (exit status of the first command that failed or 0, the last output line)."""
    last = ''
    for cmd in self._commands(action, name, accelerator, command):
      log.write(f'$ {shlex.join(cmd)}\n')
      log.flush()
      result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
      log.write(result.stdout)
      log.flush()
      lines = result.stdout.strip().splitlines()
      last = lines[-1].strip() if lines else ''
      if result.returncode:
        return result.returncode, last
    return 0, last

  def _state(self, s: _Slice, log) -> str:
    code, state = self._gcloud('state', s.name, s.accelerator, log)
    return '' if code else state

  def _ready_slice(self, slot, accelerator, log, budget: list) -> _Slice | None:
    """The slot's slice with `accelerator`, ACTIVE and set up (created and queued as needed); None if the run used
    up its requeues."""
    s = self.slices[slot]
    if s is not None and s.accelerator == accelerator and self._state(s, log) == 'ACTIVE':
      return s
    if s is not None:
      self._gcloud('delete', s.name, s.accelerator, log)
    self.slices[slot] = s = _Slice(self._slice_name(slot), accelerator)
    while budget[0] > 0 and not self._stopping:
      code, last = self._gcloud('create', s.name, accelerator, log)
      if code:
        budget[0] -= 1
        self.say(f'  {s.name}: create failed ({last or f"exit status {code}"}); retrying in {self.args.poll_s:g} s')
        time.sleep(self.args.poll_s)
        continue
      state = self._state(s, log)
      while state not in ('ACTIVE', *LOST) and not self._stopping:
        time.sleep(self.args.poll_s)
        state = self._state(s, log)
      if state == 'ACTIVE' and self._gcloud('setup', s.name, accelerator, log)[0] == 0:
        return s
      budget[0] -= 1
      self.say(f'  {s.name}: {state or "gone"} before the run started; queueing it again')
      self._gcloud('delete', s.name, accelerator, log)
    self.slices[slot] = None
    return None

  def attempt(self, member, slot: int, log_path) -> outcome.Outcome:
    accelerator = self.accelerator_of[member.name]
    budget = [self.args.max_requeues]
    with open(log_path, 'a') as log:
      while True:
        s = self._ready_slice(slot, accelerator, log, budget)
        if s is None:
          why = 'the sweep was stopped' if self._stopping else f'no slice after {self.args.max_requeues} requeues'
          return outcome.Outcome('stopped' if self._stopping else 'crashed', None, why)
        log.write(f'--- {time.strftime("%Y-%m-%d %H:%M:%S")} {self.where(slot)}\n')
        code, _ = self._gcloud('run', s.name, accelerator, log, self._train_command(member))
        if code == 0 or code == outcome.USER_ERROR:
          return outcome.classify(code, log_path)
        state = self._state(s, log)
        if state == 'ACTIVE' and code not in outcome.STOPPED:
          return outcome.classify(code, log_path)
        if self._stopping:
          return outcome.Outcome('stopped', code, 'the sweep was stopped')
        budget[0] -= 1
        self.say(f'  {member.name}: slice {s.name} {state or "gone"} (preempted; exit status {code}); '
                 f're-queueing it to resume the run ({budget[0]} requeues left)')
        self._gcloud('delete', s.name, accelerator, log)
        self.slices[slot] = None
        if budget[0] <= 0:
          return outcome.Outcome('stopped', code, f'preempted {self.args.max_requeues} times; rerun to resume')

  def stop(self) -> None:
    """No new slice is queued; runs on slices go on until they end (the slices stay for a rerun)."""
    self._stopping = True

  def release(self) -> None:
    """Deletes the slices still held once the sweep is done."""
    for s in filter(None, self.slices):
      with open('/dev/null', 'w') as log:
        self._gcloud('delete', s.name, s.accelerator, log)
