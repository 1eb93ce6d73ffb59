"""Load config files and validate a ConfigDict before anything compiles.

Every error names the key, the value it had and what is allowed, so a typo in a pod launch fails in a second
instead of after a compile.
"""

import ast
import difflib
import math
import pathlib
import re
import shlex

import ml_collections

from hybrid_jax import checks, config_keys as keys
from hybrid_jax.data import validation as data_validation
from hybrid_jax.errors import ConfigError, InputError
from hybrid_jax.models import moe, validation as model_validation
from hybrid_jax.models.mixers import registry
from hybrid_jax.parallel import validation as parallel_validation
from hybrid_jax.user_files import call_file_function, load_python_file

SCHEDULES = ('wsd', 'cosine', 'constant')
# The packaged config files (a package of the install, so a wheel carries them); commands name them without a path.
CONFIG_DIR = pathlib.Path(__file__).resolve().with_name('configs')
BASE_CONFIG = CONFIG_DIR / 'base.py'  # Every key of a run and its default, documented.


def key_parent(config, key: str, what: str):
  """(parent ConfigDict, leaf name) of dotted `key`; ConfigError naming `what` (e.g. '--set model.x') if absent."""
  *parents, leaf = key.split('.')
  node, path = config, 'config'
  for part in [*parents, leaf]:
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      near = difflib.get_close_matches(part, list(node.keys()) if isinstance(node, ml_collections.ConfigDict)
                                       else [], n=1)
      hint = f'did you mean {path}.{near[0]}? ' if near else ''
      raise ConfigError(f'{what}: config.{key} does not exist ({hint}keys are listed in {BASE_CONFIG})')
    parent, node, path = node, node[part], f'{path}.{part}'
  return parent, leaf


def _parse_value(current, text: str):
  """`text` as the type the key already has, the way absl's config flags parse an override."""
  if isinstance(current, bool):
    if text.lower() not in ('true', 'false', '1', '0'):
      raise ValueError(f'expected true or false, got {text!r}')
    return text.lower() in ('true', '1')
  if isinstance(current, (int, float)):
    return type(current)(float(text) if isinstance(current, float) else int(text))
  if isinstance(current, (tuple, list)):
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = tuple(part.strip() for part in text.split(',') if part.strip())
    return type(current)(value if isinstance(value, (tuple, list)) else (value,))
  return text


def apply_override(config, key: str, text: str):
  """Sets dotted `key` of `config` from the command-line text `text`; ConfigError naming the key if it cannot."""
  node, leaf = key_parent(config, key, f'--config.{key}')
  try:
    node[leaf] = _parse_value(node[leaf], text)
  except (TypeError, ValueError) as e:
    raise ConfigError(f'--config.{key}={text!r}: {e}') from e
  if key == 'model.mixer_modules':  # Their kinds' sections exist for the overrides that follow.
    with_mixer_sections(config)


def apply_overrides(config, tokens) -> list[str]:
  """Applies `--config.KEY=VALUE` (or `--config.KEY VALUE`) tokens in order; returns them as KEY=VALUE tokens."""
  tokens, applied = list(tokens), []
  while tokens:
    token = tokens.pop(0)
    m = re.fullmatch(r'--config\.([\w.]+)(?:=(.*))?', token, re.S)
    if not m:
      raise ConfigError(f'{token!r} is not a --config.KEY=VALUE override')
    value = m.group(2)
    if value is None:
      if not tokens:
        raise ConfigError(f'{token} needs a value (--config.KEY=VALUE)')
      value = tokens.pop(0)
    apply_override(config, m.group(1), value)
    applied.append(f'--config.{m.group(1)}={value}')
  return applied


def file_arguments(arg, allowed, file: str, usage: str) -> dict:
  """A config or sweep file's `KEY=VALUE,...` argument as {key: text}; an item that is not KEY=VALUE with a key in
  `allowed` is a ConfigError naming the file and its `usage` (one parser for every file that takes arguments)."""
  fields = {}
  for item in filter(None, (arg or '').split(',')):
    key, sep, value = item.partition('=')
    if not sep or key not in allowed:
      raise ConfigError(f'{file}: bad argument {item!r}; expected {usage}')
    fields[key] = value
  return fields


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """Loads `path/to/file.py[:arg]` the way absl's config_flags does, calling `get_config(arg)`."""
  path, _, arg = spec.partition(':')
  module = load_python_file(path, 'config')
  config = call_file_function(module, 'get_config', arg or None, f'config file {path!r}', ml_collections.ConfigDict,
                              f'an ml_collections.ConfigDict (start from the base config {BASE_CONFIG}, which '
                              'defines every key)')
  return with_mixer_sections(config)


def packaged_config(path) -> pathlib.Path | None:
  """The packaged config file (hybrid_jax/configs) that `path` names, or None.

  A name such as `hybrid` names hybrid_jax/configs/hybrid.py; so does `configs/NAME.py` with that name where no file
  is at that path, the spelling of the packaged configs in older run strings and sweep files."""
  match = re.fullmatch(r'(\w+)|configs/(\w+)\.py', str(path))
  name = match and (match.group(1) or match.group(2))
  if not name or name.startswith('_') or not (CONFIG_DIR / f'{name}.py').is_file():
    return None
  return CONFIG_DIR / f'{name}.py'


def resolve_path(path: str) -> str:
  """The file a config or sweep spec's path names: the file at `path` when there is one (a real file always wins),
  else the packaged config it names (`hybrid`, `sweep`: packaged_config), else `path` as given (whose loader then
  says it does not exist)."""
  if pathlib.Path(path).is_file():
    return path
  packaged = packaged_config(path)
  return str(packaged) if packaged else path


def resolve_spec(spec: str) -> str:
  """`FILE[:ARG]` with FILE resolved by resolve_path (`hybrid:arch=gdn,scale=s1` -> the packaged file's path)."""
  path, sep, arg = spec.partition(':')
  return resolve_path(path) + sep + arg


def packaged_module(name: str, kind: str = 'config'):
  """The packaged config or sweep file `name` (hybrid_jax/configs/NAME.py) as a fresh module: what an experiment
  file starts from, e.g. `packaged_module('hybrid').get_config(arg)`."""
  return load_python_file(CONFIG_DIR / f'{name}.py', kind)


def load_sweep(spec: str) -> list[str]:
  """The run strings of a sweep `FILE[:NAME]`: FILE's `runs(NAME)` (NAME None when absent)."""
  path, _, name = spec.partition(':')
  module = load_python_file(resolve_path(path), 'sweep')
  runs = list(call_file_function(module, 'runs', name or None, f'sweep file {path!r}', (list, tuple),
                                 'a non-empty list of config strings'))
  odd = next((r for r in runs if not isinstance(r, str)), None)
  if not runs or odd is not None:
    what = 'an empty list' if not runs else f'{type(odd).__name__} {odd!r} among its runs'
    raise ConfigError(f'sweep {spec!r}: runs({name!r}) returned {what}; expected a non-empty list of config strings')
  return runs


def load_run(run: str):
  """(config spec, overrides, validated config) of one run string."""
  try:
    tokens = shlex.split(run)
  except ValueError as e:  # An unclosed quote.
    raise ConfigError(f'run {run!r}: {e} (quote each value whole)') from None
  if not tokens:
    raise ConfigError('empty run string')
  spec = tokens[0].removeprefix('--config=')  # Kept as given: a packaged config's name resolves the same anywhere.
  config = load_config_file(resolve_spec(spec))
  try:
    overrides = apply_overrides(config, tokens[1:])
    return spec, overrides, validate(config)
  except ConfigError as e:
    raise ConfigError(f'run {run!r}: {e}') from e


def with_mixer_sections(config):
  """`config` with the mixer modules it names (model.mixer_modules) imported and every registered kind's config
  section present (defaults where the config lacks one): what a config needs before its mixer keys are read."""
  if 'model' in config and 'mixer_modules' in config.model:
    registry.load_modules(config.model.mixer_modules)
    registry.add_sections(config.model, ml_collections.ConfigDict)
  return config


def _leaf_keys(c, prefix=''):
  for key, value in c.items():
    if isinstance(value, ml_collections.ConfigDict):
      yield from _leaf_keys(value, f'{prefix}{key}.')
    else:
      yield f'{prefix}{key}'


def validate(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Checks every key of a run config, once, before anything compiles; returns the config unchanged.

  The keys every run has are checked here (present, finite, none unknown), then each layer checks its own section:
  hybrid_jax.models.validation (config.model, with each mixer's section by the mixer registry),
  hybrid_jax.data.validation (config.data), hybrid_jax.parallel.validation (config.parallel); the training and
  evaluation sections and the seed are checked here, above them.
  """
  with_mixer_sections(c)  # The kinds of model.mixer_modules and their config sections are known from here on.
  known = list(_leaf_keys(load_config_file(str(BASE_CONFIG))))
  for key in known:
    value = keys.value(c, key)  # Every default must be present: configs start from the packaged base config.
    if isinstance(value, float) and not math.isfinite(value):  # No key means anything by inf or nan.
      keys.fail(key, value, 'must be a finite number')
  for key in _leaf_keys(c):  # A key no code reads is a typo (a config file's, like an override's): refused alike.
    if key not in known:
      near = difflib.get_close_matches(key, known, n=1)
      hint = f'did you mean config.{near[0]}? ' if near else ''
      raise ConfigError(f'config.{key} does not exist ({hint}keys are listed in {BASE_CONFIG})')
  keys.number(c, 'seed', integer=True, nonnegative=True)
  model_validation.validate(c)
  data_validation.validate(c)
  _validate_train(c)
  _validate_eval(c)
  _validate_experts(c)  # Before the batch's split over the mesh: the expert ways are named first.
  parallel_validation.validate(c)
  return c


def _validate_experts(c):
  """Expert parallelism against the model: the expert ways (within x across slices) must divide the expert count,
  and need MoE layers to split (on a dense model they would only be data parallelism under another name)."""
  sizes = (keys.value(c, 'parallel.expert'), keys.value(c, 'parallel.dcn_expert'))
  if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sizes):
    return  # Not a size: hybrid_jax.parallel.validation says so.
  ici, dcn = sizes
  if ici * dcn == 1:
    return
  key, value = ('parallel.expert', ici) if ici > 1 else ('parallel.dcn_expert', dcn)
  m = c.model
  if not moe.layer_count(m):
    keys.fail(key, value, f"needs MoE layers, and the model has none (model.moe.blocks={m.moe.blocks!r}, no 'moe' "
              'in model.cycle); use config.parallel.data for data parallelism')
  if m.moe.num_experts % (ici * dcn):
    ways = f' (times parallel.dcn_expert={dcn}: {ici * dcn} ways)' if ici > 1 and dcn > 1 else ''
    keys.fail(key, value, f'must divide model.moe.num_experts={m.moe.num_experts}{ways}: each chip of the expert '
              "axis holds an equal share of every MoE layer's experts")


def _validate_train(c):
  for key in ('steps', 'batch_size', 'grad_accum', 'log_every', 'checkpoint_every', 'keep_checkpoints',
              'eval_batches', 'profile_steps', 'retrieval_probe_samples'):
    keys.positive_int(c, f'train.{key}')
  t = c.train
  if t.batch_size % t.grad_accum:
    keys.fail('train.batch_size', t.batch_size, f'must be divisible by train.grad_accum={t.grad_accum}')
  keys.number(c, 'train.lr', positive=True)
  keys.choice(c, 'train.schedule', SCHEDULES)
  keys.nonnegative(c, 'train.warmup_steps')
  if t.warmup_steps >= t.steps:
    keys.fail('train.warmup_steps', t.warmup_steps, f'must be smaller than train.steps={t.steps}')
  keys.number(c, 'train.decay_fraction', low=0, high=1)
  keys.number(c, 'train.min_lr_ratio', low=0, high=1)
  for key in ('train.b1', 'train.b2'):
    if keys.number(c, key, low=0) >= 1:
      keys.fail(key, keys.value(c, key), 'must be in [0, 1)')
  for key in ('weight_decay', 'grad_clip', 'z_loss', 'eval_every', 'eps', 'peak_tflops'):
    keys.nonnegative(c, f'train.{key}')
  for key in ('retrieval_probe_every', 'retrieval_probe_length', 'loss_chunk', 'profile_start'):
    keys.number(c, f'train.{key}', integer=True, nonnegative=True)  # 0 = off / data.seq_len / whole sequence.
  if not isinstance(keys.value(c, 'train.init_from'), str):
    keys.fail('train.init_from', c.train.init_from, "must be a run directory or '' (random init)")
  _validate_probe_schedule(c)
  _validate_canary(c)


def _validate_canary(c):
  """The numerics canary's cadence ('auto', or steps: a command line gives them as text) and what it reruns."""
  every = keys.value(c, 'train.numerics_canary_every')
  if every != 'auto':
    try:
      checks.number(every, 'config.train.numerics_canary_every', integer=True, nonnegative=True)
    except InputError:
      keys.fail('train.numerics_canary_every', every,
                "must be 'auto' (off on CPU, on at GPU and TPU), 0 (off) or a positive integer (steps between checks)")
  keys.positive_int(c, 'train.numerics_canary_rows')
  keys.number(c, 'train.numerics_canary_tokens', integer=True, nonnegative=True)  # 0 = data.seq_len.
  for key in ('numerics_canary_tolerance_float32', 'numerics_canary_tolerance_bfloat16'):
    keys.number(c, f'train.{key}', positive=True)


def _validate_probe_schedule(c):
  """The dense probe cadence and the stop once retrieval has formed: both need the probe on."""
  t = c.train
  for key in ('retrieval_probe_dense_every', 'retrieval_probe_dense_until'):
    keys.number(c, f'train.{key}', integer=True, nonnegative=True)
  if bool(t.retrieval_probe_dense_every) != bool(t.retrieval_probe_dense_until):
    key = 'retrieval_probe_dense_every' if t.retrieval_probe_dense_every else 'retrieval_probe_dense_until'
    other = 'retrieval_probe_dense_until' if t.retrieval_probe_dense_every else 'retrieval_probe_dense_every'
    keys.fail(f'train.{key}', t[key], f'needs train.{other} > 0 as well (both 0 = off)')
  if t.retrieval_probe_dense_every and not t.retrieval_probe_every:
    keys.fail('train.retrieval_probe_dense_every', t.retrieval_probe_dense_every,
              'needs the probe on: train.retrieval_probe_every > 0 (its cadence after the dense part)')
  metric = keys.value(c, 'train.stop_when_formed')
  if not isinstance(metric, str):
    keys.fail('train.stop_when_formed', metric, "must be the name of a metric the retrieval probe logs or '' (off)")
  if metric and not t.retrieval_probe_every:
    keys.fail('train.stop_when_formed', metric, 'needs the probe on: train.retrieval_probe_every > 0')
  keys.number(c, 'train.formed_threshold', positive=True)
  keys.positive_int(c, 'train.formed_probes')


def _validate_eval(c):
  for key in ('position_buckets', 'batches'):
    keys.positive_int(c, f'eval.{key}')
  documents = c.eval.documents
  if isinstance(documents, bool) or not isinstance(documents, int) or documents < 0 or documents == 1:
    keys.fail('eval.documents', documents, 'must be 0 (off) or an integer >= 2 (a standard error needs two documents)')
  if c.eval.position_buckets > c.data.seq_len:
    keys.fail('eval.position_buckets', c.eval.position_buckets, f'must be <= data.seq_len={c.data.seq_len}')
