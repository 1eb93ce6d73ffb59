"""A trained run as its directory: `config.json` plus orbax checkpoints, loaded read-only for evaluation and analysis.

Training writes `<workdir>/config.json`, `config_history.json` and `<workdir>/checkpoints/<step>/`; `load_run`
turns them back into a model and its parameters on the local devices. Nothing in the run directory is moved or
rewritten here (unlike training's resume, which sets unrestorable checkpoints aside), and no lease is taken.
"""

import dataclasses
import logging
import pathlib
import re

import jax
import ml_collections
import orbax.checkpoint as ocp

from hybrid_jax import readers
from hybrid_jax.config import BASE_CONFIG, ConfigError, load_config_file, validate
from hybrid_jax.data import pipeline
from hybrid_jax.data.tokenizers import Tokenizer
from hybrid_jax.errors import DataError, UserError
from hybrid_jax.models.mixers import registry
from hybrid_jax.train import checkpoint, config_history, state as state_lib


class RunError(UserError, ValueError):
  """A run directory is missing, incomplete, or its checkpoint does not match its config."""


RUN_CONFIG_SECTIONS = ('model', 'data', 'train')  # Every run's config.json holds these.


_URL = re.compile(r'^[A-Za-z][A-Za-z0-9+.-]*://')


class _QuietReadOnly(logging.Filter):
  """Drops orbax's warnings that a manager opened read-only is read-only: reading a run read-only is the intent."""

  def filter(self, record):
    message = record.getMessage()
    return 'Given directory is read only' not in message and 'read_only=True, setting' not in message


logging.getLogger('absl').addFilter(_QuietReadOnly())


def local_workdir(workdir) -> pathlib.Path:
  """`workdir` as a local path; a URL (gs://, s3://) is refused rather than silently turned into a local folder
  named `gs:` (pathlib folds the slashes), because metrics are appended and locks taken through the filesystem."""
  if _URL.match(str(workdir)):
    raise RunError(f'workdir {workdir} is a URL; run directories are read and written through the local filesystem. '
                   'Mount the bucket on every host (Cloud Storage FUSE: gcsfuse --implicit-dirs BUCKET /mnt/BUCKET) '
                   'and pass the mounted path, e.g. --workdir=/mnt/BUCKET/run1')
  return pathlib.Path(workdir)


@dataclasses.dataclass
class Run:
  """A loaded run: `model_def.bind(params)` is the model; `step` is the checkpoint's training step."""
  workdir: pathlib.Path
  config: ml_collections.ConfigDict
  step: int
  model_def: state_lib.ModelDef
  params: dict

  @property
  def tokenizer(self) -> Tokenizer:
    """The run's tokenizer; ConfigError when the model's vocabulary cannot hold its ids (an imported checkpoint
    without a tokenizer of its own gets the byte tokenizer, 257 ids)."""
    return pipeline.checked_tokenizer(self.config)

  @property
  def model(self):
    return self.model_def.bind(self.params)


def load_config(workdir) -> ml_collections.ConfigDict:
  """The validated config of a run's latest step: `<workdir>/config.json` (its first step's) with the changes
  its resumes recorded in `config_history.json` applied."""
  path = local_workdir(workdir) / 'config.json'
  if not path.is_file():
    raise RunError(f'{workdir} is not a run directory: no config.json (train one with `python -m hybrid_jax train '
                   f'--workdir {workdir}`)')
  try:  # A run directory's unreadable record is the run's problem: RunError (callers tell runs apart by it).
    saved = readers.read_json(path, 'run config', required=RUN_CONFIG_SECTIONS)
    saved = config_history.apply(saved, config_history.read_sessions(workdir))
    if isinstance(saved['model'], dict):  # Its own mixer kinds, before the base config lists their keys.
      registry.load_modules(saved['model'].get('mixer_modules', ()))
  except (ConfigError, DataError) as e:
    raise RunError(str(e)) from e
  config = _with_new_defaults(saved, load_config_file(str(BASE_CONFIG)), path)
  try:
    return validate(config)
  except ConfigError as e:
    raise RunError(f'{path} holds an invalid config: {e}') from e


# Keys whose value for runs made before the key existed is not the new default: they changed what the model
# computes. Each: dotted key -> (value the old run had, or None when the default means the same; why). A mixer's
# own keys are its registry entry's (MixerKind.history), read with these when a run loads.
_BEFORE_THE_KEY = {
    'data.packing': (
        lambda saved: 'concat',
        'its batches were packed as one text stream across documents; it loads as trained, and resuming it needs '
        '--config.data.packing=concat'),
}


def _before_the_key() -> dict:
  """This module's rules and every registered mixer kind's (the run's own kinds are loaded by then)."""
  return {**registry.history(), **_BEFORE_THE_KEY}


def _with_new_defaults(saved: dict, base: ml_collections.ConfigDict, path) -> ml_collections.ConfigDict:
  """The saved config, plus base defaults for keys added to the project after the run was trained (logged); a key
  that changed the model's function (_before_the_key) gets the value the run was trained with instead, named."""
  added = []
  rules = _before_the_key()
  kept = {key: rule(saved) for key, (rule, _) in rules.items()}

  def fill(node: dict, defaults: ml_collections.ConfigDict, prefix: str):
    for key, value in defaults.items():
      if key not in node:
        node[key] = value.to_dict() if isinstance(value, ml_collections.ConfigDict) else value
        if kept.get(prefix + key) is not None:
          node[key] = kept[prefix + key]
          logging.warning('%s predates config key %s: %s=%r. %s', path, prefix + key, prefix + key, node[key],
                          rules[prefix + key][1])
        else:
          added.append(prefix + key)
      elif isinstance(value, ml_collections.ConfigDict) and isinstance(node[key], dict):
        fill(node[key], value, f'{prefix}{key}.')

  fill(saved, base, '')
  if added:
    logging.warning('%s predates config key(s) %s; using their defaults from %s', path, added, BASE_CONFIG)
  return ml_collections.ConfigDict(saved)


def checkpoint_steps(workdir) -> list[int]:
  """Saved steps of a run, ascending (directories named by step that hold finished checkpoints)."""
  root = pathlib.Path(workdir) / 'checkpoints'
  if not root.is_dir():
    return []
  return sorted(int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit())


class UnreadableCheckpoint(RunError):
  """A checkpoint whose files are missing or damaged (not one that merely does not fit the model)."""


def restore_params(workdir, step: int, target) -> dict:
  """Only the parameters of checkpoint `step` (no optimizer state is read), laid out as `target` says.

  `target`: the params tree of ShapeDtypeStructs with shardings (e.g. a mesh's parameter shardings, or one
  device); a checkpoint written on any mesh is read straight into that layout. Values that differ from the
  fingerprints saved with them are refused like a missing file.
  """
  directory = (pathlib.Path(workdir) / 'checkpoints').absolute()
  restore_args = jax.tree.map(lambda a: ocp.ArrayRestoreArgs(sharding=a.sharding), target)
  args = ocp.args.PyTreeRestore({'params': target}, restore_args={'params': restore_args}, partial_restore=True)
  options = ocp.CheckpointManagerOptions(create=False, read_only=True)
  try:
    with checkpoint.quiet_restore(), ocp.CheckpointManager(directory, options=options) as manager:
      params = manager.restore(step, args=ocp.args.Composite(state=args)).state['params']
    checkpoint.check_fingerprint({'params': params}, checkpoint.read_fingerprint(directory / str(step)),
                                 f'step {step}')
    return params
  except Exception as e:  # Orbax raises many types for missing, partial or mismatched files.
    part = checkpoint.damaged_part(directory / str(step), e) if checkpoint.is_unreadable(e) else None
    if part:
      raise UnreadableCheckpoint(f'the checkpoint at step {step} in {directory} cannot be read: {part} is missing '
                                 f'or damaged ({checkpoint.short(e)})') from e
    raise RunError(f'the parameters of checkpoint {step} in {directory} cannot be restored for this model: '
                   f'{checkpoint.short(e)}') from e


def abstract_params(model_cfg, sharding=None) -> dict:
  """Shapes and dtypes of a model's params (one `sharding` for all, default: the first local device)."""
  sharding = sharding or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  shapes = jax.eval_shape(lambda: state_lib.init_params(model_cfg, 0))
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), shapes)


def load_run(workdir, step: int | None = None, *, model_overrides: dict | None = None,
             config: ml_collections.ConfigDict | None = None) -> Run:
  """The run in `workdir` at checkpoint `step` (default: the newest).

  `config`: the run's config when the caller has already read it with `load_config` (read once, warned once).

  `model_overrides` change inference-time model settings (e.g. `{'attention_implementation': 'reference'}` or a
  restricted `window`); they must not change parameter shapes, which the restore checks.
  """
  workdir = local_workdir(workdir)
  config = load_config(workdir) if config is None else config.copy_and_resolve_references()
  if model_overrides:
    config.unlock()
    config.model.update(model_overrides)
    try:
      validate(config)
    except ConfigError as e:
      raise RunError(f'model overrides {model_overrides} make the config of {workdir} invalid: {e}') from e
  steps = checkpoint_steps(workdir)
  if not steps:
    raise RunError(f'{workdir} has no checkpoints under {workdir / "checkpoints"}')
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise RunError(f'{workdir} has no checkpoint at step {step}; saved steps: {steps}')
  target = abstract_params(config.model)
  try:
    params = restore_params(workdir, step, target)
  except UnreadableCheckpoint as e:
    readable = [s for s in reversed(steps) if s != step and _readable(workdir, s, target)]
    hint = (f'readable steps: {readable} (choose one with --step {readable[0]})' if readable else
            f'no other saved step ({[s for s in steps if s != step] or "none"}) is readable either')
    raise RunError(f'{e}; {hint}') from e
  return Run(workdir, config, step, state_lib.make_model_def(config.model), params)


def _readable(workdir, step: int, target) -> bool:
  try:
    restore_params(workdir, step, target)
  except RunError:
    return False
  return True
