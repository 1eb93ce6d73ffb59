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

from hybrid_jax import checks
from hybrid_jax.data import recall
from hybrid_jax.errors import ConfigError, InputError, invalid_config
from hybrid_jax.models.mixers import registry
from hybrid_jax.user_files import call_file_function, load_python_file

RECURRENT_IMPLEMENTATIONS = ('auto', 'reference', 'xla', 'pallas_gpu', 'pallas_tpu')
REMAT_POLICIES = ('none', 'full', 'save_dots', 'minimal', 'recompute_mlp')
SCHEDULES = ('wsd', 'cosine', 'constant')
SOURCES = ('builtin', 'files', 'tfds', 'parquet', 'pretokenized', 'recall')
DTYPES = ('float32', 'bfloat16', 'float16')
ATTENTION_IMPLEMENTATIONS = ('auto', 'xla', 'reference', 'cudnn', 'pallas_gpu', 'pallas_tpu')
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

  A name such as `hybrid` names hybrid_jax/configs/hybrid.py; so does `configs/hybrid.py`, the repository's
  experiment file of the same config, where that file is not there (an installed package run from another
  directory, run strings written before the configs were packaged)."""
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


def _fail(key, value, allowed):
  raise invalid_config(key, value, allowed)


def _number(c, key, **bounds):
  """The number at `key` checked by hybrid_jax.checks.number (finite, within `bounds`); ConfigError naming it."""
  try:
    return checks.number(_get(c, key), f'config.{key}', **bounds)
  except InputError as e:
    raise ConfigError(str(e)) from None


def _positive_int(c, key):
  return _number(c, key, integer=True, positive=True)


def _nonneg_number(c, key):
  return _number(c, key, nonnegative=True)


def _choice(c, key, allowed):
  value = _get(c, key)
  if value not in allowed:
    _fail(key, value, f'allowed: {", ".join(allowed)}')
  return value


def _get(c, key):
  node = c
  for part in key.split('.'):
    if part not in node:
      raise ConfigError(f'config.{key} is missing (start from the packaged base config, {BASE_CONFIG}, which '
                        'defines every key)')
    node = node[part]
  return node


def _validate_mixers(c):
  """The layer kinds of model.cycle and every mixer's own keys (by the mixer registry: each kind checks its section,
  used or not), then the settings the recurrent kernels share."""
  registry.validate(c.model)
  _positive_int(c, 'model.recurrent_chunk_size')
  _choice(c, 'model.recurrent_implementation', RECURRENT_IMPLEMENTATIONS)


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
  """Checks every key that shapes the model, data and training; returns the config unchanged."""
  with_mixer_sections(c)  # The kinds of model.mixer_modules and their config sections are known from here on.
  known = list(_leaf_keys(load_config_file(str(BASE_CONFIG))))
  for key in known:
    value = _get(c, key)  # Every default must be present: configs start from the packaged base config.
    if isinstance(value, float) and not math.isfinite(value):  # No key means anything by inf or nan.
      _fail(key, value, 'must be a finite number')
  for key in _leaf_keys(c):  # A key no code reads is a typo (a config file's, like an override's): refused alike.
    if key not in known:
      near = difflib.get_close_matches(key, known, n=1)
      hint = f'did you mean config.{near[0]}? ' if near else ''
      raise ConfigError(f'config.{key} does not exist ({hint}keys are listed in {BASE_CONFIG})')
  for key in ('model.vocab_size', 'model.d_model', 'model.num_layers', 'model.num_heads', 'model.num_kv_heads',
              'model.head_dim', 'model.d_ff', 'data.seq_len', 'train.steps', 'train.batch_size',
              'train.grad_accum', 'train.log_every', 'train.checkpoint_every', 'train.keep_checkpoints',
              'train.eval_batches', 'train.profile_steps', 'eval.position_buckets', 'eval.batches'):
    _positive_int(c, key)
  m = c.model
  if m.num_heads % m.num_kv_heads:
    _fail('model.num_heads', m.num_heads, f'must be a multiple of model.num_kv_heads={m.num_kv_heads}')
  _validate_mixers(c)
  if m.head_dim % 2 and (m.rope_full or m.rope_swa):
    _fail('model.head_dim', m.head_dim, 'must be even when RoPE is used')
  _number(c, 'model.init_std', positive=True)
  _number(c, 'model.norm_eps', positive=True)
  _number(c, 'seed', integer=True, nonnegative=True)
  if _number(c, 'model.rope_base') <= 1:
    _fail('model.rope_base', m.rope_base, 'must be > 1')
  for key in ('model.embedding_multiplier', 'model.residual_multiplier', 'model.logits_scaling'):
    _number(c, key, positive=True)  # 1 = the plain block.
  _nonneg_number(c, 'model.attention_scale')  # 0 = head_dim**-0.5.
  _choice(c, 'model.dtype', DTYPES)
  _choice(c, 'model.param_dtype', DTYPES)
  _choice(c, 'model.remat', REMAT_POLICIES)
  _choice(c, 'model.attention_implementation', ATTENTION_IMPLEMENTATIONS)
  if not isinstance(m.attention_sinks, bool):
    _fail('model.attention_sinks', m.attention_sinks, 'must be True or False')
  if m.attention_sinks and m.attention_implementation not in ('auto', 'xla'):
    _fail('model.attention_implementation', m.attention_implementation,
          "learned attention sinks (model.attention_sinks) need 'auto' or 'xla' (only the XLA path returns the "
          'row log-sum-exp they scale by)')

  d = c.data
  _choice(c, 'data.source', SOURCES)
  if d.source in ('files', 'parquet') and not d.paths:
    _fail('data.paths', d.paths, f"must name files, directories or globs when data.source={d.source!r}")
  if d.source == 'pretokenized' and not d.paths:
    _fail('data.paths', d.paths, "must name a directory written by `pretokenize` when data.source='pretokenized'")
  if d.source == 'tfds' and not d.tfds_name:
    _fail('data.tfds_name', d.tfds_name, "must name a TFDS dataset when data.source='tfds'")
  if d.source == 'recall':
    recall.settings(d)
  else:  # Checked all the same: a bad value is a typo waiting for data.source=recall.
    recall.check_fields(d.recall)
  _number(c, 'data.worker_count', integer=True, nonnegative=True)  # 0 = in the main process.
  _nonneg_number(c, 'data.long_short_ratio')
  _nonneg_number(c, 'data.long_doc_min_tokens')
  if not 0 < _number(c, 'data.eval_fraction') < 1:
    _fail('data.eval_fraction', d.eval_fraction, 'must be strictly between 0 and 1')

  t = c.train
  if t.batch_size % t.grad_accum:
    _fail('train.batch_size', t.batch_size, f'must be divisible by train.grad_accum={t.grad_accum}')
  _number(c, 'train.lr', positive=True)
  _choice(c, 'train.schedule', SCHEDULES)
  _nonneg_number(c, 'train.warmup_steps')
  if t.warmup_steps >= t.steps:
    _fail('train.warmup_steps', t.warmup_steps, f'must be smaller than train.steps={t.steps}')
  _number(c, 'train.decay_fraction', low=0, high=1)
  _number(c, 'train.min_lr_ratio', low=0, high=1)
  for key in ('train.b1', 'train.b2'):
    if _number(c, key, low=0) >= 1:
      _fail(key, _get(c, key), 'must be in [0, 1)')
  for key in ('train.weight_decay', 'train.grad_clip', 'train.z_loss', 'train.eval_every', 'train.eps',
              'train.peak_tflops'):
    _nonneg_number(c, key)
  for key in ('train.retrieval_probe_every', 'train.retrieval_probe_length', 'train.loss_chunk', 'train.profile_start'):
    _number(c, key, integer=True, nonnegative=True)  # 0 = off / data.seq_len / whole sequence.
  _positive_int(c, 'train.retrieval_probe_samples')
  if not isinstance(_get(c, 'train.init_from'), str):
    _fail('train.init_from', c.train.init_from, "must be a run directory or '' (random init)")
  documents = c.eval.documents
  if isinstance(documents, bool) or not isinstance(documents, int) or documents < 0 or documents == 1:
    _fail('eval.documents', documents, 'must be 0 (off) or an integer >= 2 (a standard error needs two documents)')
  if c.eval.position_buckets > c.data.seq_len:
    _fail('eval.position_buckets', c.eval.position_buckets, f'must be <= data.seq_len={c.data.seq_len}')
  _validate_parallel(c)
  return c


def _validate_parallel(c):
  """The mesh sizes and the logical-axis rules (names, mesh axes, batch divisibility) of config.parallel."""
  from hybrid_jax.parallel import rules as rules_lib  # Imports no jax at module level.
  p = c.parallel
  for prefix in ('', 'dcn_'):
    free = []
    for axis in rules_lib.MESH_AXES:
      key = f'parallel.{prefix}{axis}'
      value = _get(c, key)
      if isinstance(value, bool) or not isinstance(value, int) or (value <= 0 and value != -1):
        _fail(key, value, 'must be a positive integer or -1 (the devices the other axes leave)')
      free += [key] if value == -1 else []
    if len(free) > 1:
      _fail(free[1], -1, f'only one of {", ".join(free)} may be -1')
  try:
    rules = rules_lib.parse_rules(p.rules)
    rules_lib.check_rules(rules)
  except rules_lib.ShardingRuleError as e:
    raise ConfigError(str(e)) from None
  fixed = 1
  for axis in rules.get('batch', ()):
    fixed *= max(p[axis], 1) * max(p[f'dcn_{axis}'], 1)
  if c.train.batch_size % fixed:
    _fail('train.batch_size', c.train.batch_size, f'must be divisible by the batch split of the mesh '
          f'({"*".join(rules["batch"])} = {fixed} at least)')
  d = p.distributed
  _choice(c, 'parallel.distributed.initialize', ('auto', 'always', 'never'))
  _choice(c, 'parallel.distributed.cpu_collectives', ('gloo', 'mpi', 'none'))
  for key in ('initialization_timeout_s', 'heartbeat_timeout_s', 'barrier_timeout_s'):
    _positive_int(c, f'parallel.distributed.{key}')
  _number(c, 'parallel.distributed.num_processes', integer=True, nonnegative=True)  # 0 = from the environment.
  _number(c, 'parallel.distributed.process_id', integer=True, low=-1)  # -1 = from the environment.
  if d.coordinator_address and ':' not in d.coordinator_address:
    _fail('parallel.distributed.coordinator_address', d.coordinator_address, 'must be host:port')
