"""What config produced each step of a run: which keys may change on resume, and the history of changes.

`config.json` is the config of the run's first step and is never rewritten by a resume. Every training session
(the first one and each resume) appends an entry to `config_history.json`: the first step it trains, the
checkpoint it resumed from and the keys it changed, old and new value. The config of step s is `config.json` with
the changes of every session up to the last one whose `first_step` <= s applied.

Keys come in three classes (KEY_CLASSES, data; a test checks every key of the packaged configs is classified):
- IDENTITY: what the run is (parameter shapes, the model's function, the tokenizer, the data stream, how the
  parameters were made). A change is refused before anything is restored: the checkpoint would not restore, or
  would continue as a different run under the same name.
- TRAINING: how later steps train (schedule, optimizer settings, compute dtype). Allowed, printed, recorded;
  `collect` flags the run.
- OPERATIONAL: how the run executes or is observed (cadences, logging, kernels, mesh). Allowed, printed, recorded.
"""

import datetime
import json
import logging

from etils import epath

from hybrid_jax import readers
from hybrid_jax.config import ConfigError
from hybrid_jax.models.mixers import registry

IDENTITY, TRAINING, OPERATIONAL = 'identity', 'training', 'operational'
HISTORY_FILE = 'config_history.json'
FORMAT = 'hybrid_jax config history 1'

# Dotted key -> class. 'section.*' covers every key under `section` not listed on its own.
KEY_CLASSES = {
    'name': OPERATIONAL,  # A label in reports and logs.
    'seed': IDENTITY,  # Parameter init and the data order (the restored iterator continues the seeded shuffle).
    # Labels of what was trained: results are grouped by them.
    'model.arch': IDENTITY, 'model.scale': IDENTITY,
    # Parameter shapes.
    'model.vocab_size': IDENTITY, 'model.d_model': IDENTITY, 'model.num_layers': IDENTITY,
    'model.num_heads': IDENTITY, 'model.num_kv_heads': IDENTITY, 'model.head_dim': IDENTITY, 'model.d_ff': IDENTITY,
    # Every mixer's own section (model.lightning, model.gdn, ...: the mixer registry's) is IDENTITY: key_class.
    'model.mixer_modules': IDENTITY,  # Where the model's mixer kinds come from.
    'model.param_dtype': IDENTITY,  # The stored parameters' dtype.
    'model.scan_layers': IDENTITY,  # The parameter tree's layout (stacked per cycle repeat).
    # The model's function.
    'model.cycle': IDENTITY, 'model.window': IDENTITY, 'model.rope_full': IDENTITY, 'model.rope_swa': IDENTITY,
    'model.rope_base': IDENTITY, 'model.headwise_full_kv_heads': IDENTITY, 'model.norm_eps': IDENTITY,
    'model.embedding_multiplier': IDENTITY, 'model.residual_multiplier': IDENTITY, 'model.logits_scaling': IDENTITY,
    'model.attention_scale': IDENTITY, 'model.attention_sinks': IDENTITY, 'model.mlp': IDENTITY,
    'model.block_mlp': IDENTITY,
    'model.init_std': IDENTITY,  # How the parameters were made; meaningless to change after step 0.
    'model.dtype': TRAINING,  # Compute precision of every later step.
    # Same function, other kernels or memory trade-offs.
    'model.remat': OPERATIONAL, 'model.attention_implementation': OPERATIONAL,
    'model.recurrent_implementation': OPERATIONAL, 'model.recurrent_chunk_size': OPERATIONAL,
    'model.attention.max_documents': OPERATIONAL,  # How many documents per row cuDNN's packed layout holds.
    # The tokenizer and the data stream (worker_count: the checkpointed iterator state is per worker).
    'data.*': IDENTITY,
    'train.batch_size': IDENTITY,  # Sequences per step: the stream's position and the step's meaning.
    'train.init_from': IDENTITY,  # Where the parameters came from (ignored once checkpoints exist).
    # The schedule and the optimizer.
    'train.steps': TRAINING, 'train.lr': TRAINING, 'train.schedule': TRAINING, 'train.warmup_steps': TRAINING,
    'train.decay_fraction': TRAINING, 'train.min_lr_ratio': TRAINING, 'train.b1': TRAINING, 'train.b2': TRAINING,
    'train.eps': TRAINING, 'train.weight_decay': TRAINING, 'train.grad_clip': TRAINING, 'train.z_loss': TRAINING,
    # The same update computed another way.
    'train.grad_accum': OPERATIONAL, 'train.loss_chunk': OPERATIONAL,
    # Cadences, logging, measurement, the mesh and process start-up.
    'train.log_every': OPERATIONAL, 'train.eval_every': OPERATIONAL, 'train.eval_batches': OPERATIONAL,
    'train.checkpoint_every': OPERATIONAL, 'train.keep_checkpoints': OPERATIONAL,
    'train.async_checkpointing': OPERATIONAL, 'train.progress': OPERATIONAL, 'train.peak_tflops': OPERATIONAL,
    'train.retrieval_probe_every': OPERATIONAL, 'train.retrieval_probe_samples': OPERATIONAL,
    'train.retrieval_probe_length': OPERATIONAL, 'train.retrieval_probe_dense_every': OPERATIONAL,
    'train.retrieval_probe_dense_until': OPERATIONAL, 'train.profile_start': OPERATIONAL,
    # When training ends (train.steps stays the cap); no step trains differently.
    'train.stop_when_formed': OPERATIONAL, 'train.formed_threshold': OPERATIONAL, 'train.formed_probes': OPERATIONAL,
    'train.profile_steps': OPERATIONAL,
    # A check beside training: no step trains differently.
    'train.numerics_canary_every': OPERATIONAL, 'train.numerics_canary_rows': OPERATIONAL,
    'train.numerics_canary_tokens': OPERATIONAL, 'train.numerics_canary_tolerance_float32': OPERATIONAL,
    'train.numerics_canary_tolerance_bfloat16': OPERATIONAL,
    'eval.*': OPERATIONAL,  # The final evaluation only.
    'parallel.*': OPERATIONAL,  # Checkpoints restore onto any mesh.
}


class ConfigChangeRefused(ConfigError):
  """A resume asked to change a key that defines the run."""


def key_class(key: str) -> str | None:
  """The class of dotted `key`: its own entry, a mixer's section key (IDENTITY), else the nearest enclosing
  'section.*'; None if unclassified."""
  if key in KEY_CLASSES:
    return KEY_CLASSES[key]
  parts = key.split('.')
  if len(parts) == 3 and parts[0] == 'model' and parts[1] in {k.section for k in registry.kinds() if k.section}:
    return IDENTITY  # A mixer's shape or function.
  for n in range(len(parts) - 1, 0, -1):
    found = KEY_CLASSES.get('.'.join(parts[:n]) + '.*')
    if found:
      return found
  return None


def flatten(config) -> dict:
  """Dotted key -> JSON value of a ConfigDict or nested dict (tuples become lists, as in config.json)."""
  data = json.loads(config.to_json_best_effort()) if hasattr(config, 'to_json_best_effort') else config
  out = {}

  def walk(node, prefix):
    for key, value in node.items():
      if isinstance(value, dict):
        walk(value, f'{prefix}{key}.')
      else:
        out[prefix + key] = value

  walk(data, '')
  return out


def changes(run: dict, new: dict) -> dict:
  """{key: (run's value, new value)} for keys of the flat config `new` whose value differs from the run's."""
  return {k: (run[k], v) for k, v in new.items() if k in run and run[k] != v}


def _show(value) -> str:
  return json.dumps(value)


def check_resume(workdir, run: dict, new: dict) -> dict:
  """The allowed changes {key: (old, new)} from the run's flat config to `new`; ConfigChangeRefused if any key
  that defines the run changes (unclassified keys count as such), with one line per key."""
  found = changes(run, new)
  refused = [k for k in found if key_class(k) in (IDENTITY, None)]
  if refused:
    lines = [f'{k}: run has {_show(found[k][0])}, this command says {_show(found[k][1])}; use a new --workdir or '
             'drop the override' for k in sorted(refused)]
    raise ConfigChangeRefused(f'cannot resume the run in {workdir} with this config: these keys define the run and '
                              'must not change on resume (hybrid_jax/train/config_history.py lists which may)\n'
                              + '\n'.join(lines))
  return found


def read_sessions(workdir) -> list[dict]:
  """The run's training sessions, oldest first ([] for a run trained before the history existed)."""
  path = epath.Path(workdir) / HISTORY_FILE
  if not path.exists():
    return []
  history = readers.read_json(path, 'config history', required=('sessions',))
  return readers.check_shape(history['sessions'], f'config history {path}: sessions', list, items=dict)


def write_sessions(workdir, sessions: list[dict]) -> None:
  text = json.dumps({'format': FORMAT, 'about': 'config.json is the config of step 1; each session changes it '
                     'from its first_step on', 'sessions': sessions}, indent=2)
  (epath.Path(workdir) / HISTORY_FILE).write_text(text + '\n')


def session_entry(first_step: int, resumed_from: int | None, found: dict, **about) -> dict:
  return {'first_step': first_step, 'resumed_from': resumed_from,
          'started_at': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC'), **about,
          'changes': {k: {'from': old, 'to': new, 'class': key_class(k)} for k, (old, new) in sorted(found.items())}}


def log_changes(workdir, found: dict, first_step: int) -> None:
  for key, (old, new) in sorted(found.items()):
    logging.warning('%s: the run had %s, this command says %s; in effect from step %d on (recorded in %s)', key,
                    _show(old), _show(new), first_step, epath.Path(workdir) / HISTORY_FILE)


def _set(nested: dict, key: str, value) -> None:
  *parents, leaf = key.split('.')
  for part in parents:
    nested = nested.setdefault(part, {})
  nested[leaf] = value


def apply(saved: dict, sessions: list[dict], step: int | None = None) -> dict:
  """The nested config (`saved`: config.json's, left unchanged) that produced `step` (default: the latest)."""
  saved = json.loads(json.dumps(saved))
  last = max((i for i, s in enumerate(sessions) if step is None or s['first_step'] <= step), default=-1)
  for session in sessions[:last + 1]:
    for key, change in session['changes'].items():
      _set(saved, key, change['to'])
  return saved


def training_changes(sessions: list[dict]) -> str:
  """'key@first_step' of every TRAINING-class change, comma-separated ('' when the run trained as configured)."""
  return ','.join(f'{k}@{s["first_step"]}' for s in sessions for k, c in s['changes'].items()
                  if c.get('class', key_class(k)) == TRAINING)
