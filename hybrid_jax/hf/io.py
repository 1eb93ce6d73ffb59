"""Reading and writing checkpoint directories: transformers (config.json + safetensors) and hybrid_jax runs.

Export reads a run's checkpoint and writes `config.json`, `model.safetensors` (or, past a maximum shard size,
`model-0000i-of-0000n.safetensors` shards listed in `model.safetensors.index.json`) and the run's tokenizer files:
`tokenizer.json` + `tokenizer_config.json` for a Hugging Face tokenizer, `tokenizer.model` for SentencePiece.
Import checks config.json first (refusals come before any weight is read), reads the safetensors (one file or
shards; float32, bfloat16 or float16), and writes a run directory: `config.json` plus an orbax checkpoint of the
parameters at step 0, which `eval`, `analyze`, `runs.load_run` and `train --config.train.init_from` read; the
checkpoint's tokenizer (tokenizer.json preferred over tokenizer.model) becomes the run's.
"""

import json
import os
import pathlib
import re
import shutil

import numpy as np
from safetensors.numpy import save_file

from hybrid_jax import readers
from hybrid_jax.config import BASE_CONFIG, ConfigError, load_config_file, validate
from hybrid_jax.errors import DataError
from hybrid_jax.hf import HFError
from hybrid_jax.hf.attention import config as attention_config, weights as attention_weights
from hybrid_jax.hf.families import config as family_config, export as family_export, weights as family_weights

WEIGHTS_FILE = 'model.safetensors'
INDEX_FILE = 'model.safetensors.index.json'
SENTENCEPIECE_FILE = 'tokenizer.model'
HF_TOKENIZER_FILE = 'tokenizer.json'
HF_TOKENIZER_CONFIG = 'tokenizer_config.json'
SHARD_NAME = 'model-{:05d}-of-{:05d}.safetensors'
_SIZE_UNITS = {'': 1, 'b': 1, 'kb': 10**3, 'mb': 10**6, 'gb': 10**9, 'kib': 2**10, 'mib': 2**20, 'gib': 2**30}
EXPORT_DTYPES = {'float32': np.float32, 'bfloat16': None, 'float16': np.float16}  # bfloat16: ml_dtypes, lazily.


def _np_dtype(name: str):
  if name not in EXPORT_DTYPES:
    raise HFError(f'--dtype={name!r} is not supported; choose one of {", ".join(EXPORT_DTYPES)}')
  if name == 'bfloat16':
    import ml_dtypes  # pylint: disable=g-import-not-at-top  (installed with jax)
    return ml_dtypes.bfloat16
  return EXPORT_DTYPES[name]


# ---------------------------------------------------------------------------------------------------- export
def parse_size(text) -> int:
  """Bytes of a size such as 5GB (10^9), 500MiB (2^20 each) or 1000000; HFError naming --max-shard-size if bad."""
  m = re.fullmatch(r'\s*(\d+(?:\.\d+)?)\s*([kmg]i?b|b)?\s*', str(text), re.I)
  size = int(float(m.group(1)) * _SIZE_UNITS[(m.group(2) or '').lower()]) if m else 0
  if size < 1:
    raise HFError(f'--max-shard-size={text!r} is invalid: give a positive size of at least one byte, such as 5GB, '
                  '500MB, 2GiB or bytes')
  return size


def _umask_mode() -> int:
  """The mode a plain new file gets here (0644 under the usual umask 022)."""
  umask = os.umask(0)
  os.umask(umask)
  return 0o666 & ~umask


def _save_file(tensors: dict, file: pathlib.Path):
  """safetensors' save_file, with the permissions of any other new file (it writes 0600, unreadable to others)."""
  save_file(tensors, str(file), metadata={'format': 'pt'})
  os.chmod(file, _umask_mode())


def _save_tensors(tensors: dict, out: pathlib.Path, max_shard_bytes: int | None) -> list[str]:
  """One model.safetensors, or shards of at most `max_shard_bytes` (a larger tensor gets a shard of its own, in
  tensor order) with model.safetensors.index.json, as transformers writes them; returns the files written."""
  shards, size = [[]], 0
  for name, x in tensors.items():
    if max_shard_bytes and shards[-1] and size + x.nbytes > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append(name)
    size += x.nbytes
  if len(shards) == 1:
    _save_file(tensors, out / WEIGHTS_FILE)
    return [WEIGHTS_FILE]
  files = [SHARD_NAME.format(i + 1, len(shards)) for i in range(len(shards))]
  for file, names in zip(files, shards):
    _save_file({n: tensors[n] for n in names}, out / file)
  index = {'metadata': {'total_size': sum(x.nbytes for x in tensors.values())},
           'weight_map': {n: file for file, names in zip(files, shards) for n in names}}
  (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + '\n')
  return files


def family_arch(model_cfg, arch: str) -> str | None:
  """The recurrent-hybrid or MoE family to export as: the one `arch` names, or for 'auto' and a model with layers
  that are not attention or with mixtures of experts, the first family whose class computes what the model does
  (HFError naming, per family, the key it differs in, when none does); None for the attention classes
  (attention.config)."""
  if arch in family_export.EXPORTERS:
    return arch
  from hybrid_jax.models.mixers import registry  # pylint: disable=g-import-not-at-top
  kinds = set(model_cfg.cycle)
  with_experts = family_export._has_moe(model_cfg)  # pylint: disable=protected-access
  if with_experts and arch != 'auto':
    raise HFError(f'--arch={arch} has no mixture-of-experts MLPs, but the model has them (model.moe); export it '
                  f'as one of {", ".join(family_export.MOE_AUTO)} (--arch auto picks)')
  if arch != 'auto' or (not with_experts and all(registry.get(kind).attention for kind in kinds)):
    return None
  if not with_experts and not kinds <= family_export.FAMILY_KINDS:
    return None  # A kind no family has: attention_config.layer_plan names the layer.
  reasons = []
  for family in family_export.MOE_AUTO if with_experts else family_export.DENSE_AUTO:
    try:
      family_export.to_hf_config(model_cfg, family, max_positions=1, eos_id=None)
      return family
    except HFError as e:
      reasons.append(f'{family}: {e}')
  raise HFError(f'no transformers class computes what this model does (model.cycle={tuple(model_cfg.cycle)}); '
                + '; '.join(reasons))


def check_exportable(model_cfg, arch: str = 'auto'):
  """HFError naming what no transformers class of `arch` expresses, before any parameter is read."""
  family = family_arch(model_cfg, arch)
  if family:
    family_export.to_hf_config(model_cfg, family, max_positions=1, eos_id=None)
  else:
    attention_config.layer_plan(model_cfg)


def write_hf(out, model_cfg, params, *, arch: str = 'auto', max_positions: int, dtype: str = 'float32',
             eos_id: int | None = None, max_shard_bytes: int | None = None) -> dict:
  """Writes `out/config.json` and the safetensors (one file, or shards of at most `max_shard_bytes`) for
  hybrid_jax params; returns the config written."""
  family = family_arch(model_cfg, arch)
  if family:
    hf_config = family_export.to_hf_config(model_cfg, family, max_positions=max_positions, eos_id=eos_id)
    tensors = family_weights.to_hf(family_config.family(family), params, model_cfg, dtype=_np_dtype(dtype))
  else:
    hf_config = attention_config.to_hf_config(model_cfg, arch, max_positions=max_positions, eos_id=eos_id)
    tensors = attention_weights.to_hf_tensors(params, model_cfg, attention_weights.TABLES[hf_config['model_type']],
                                              dtype=_np_dtype(dtype))
  hf_config['dtype'] = dtype
  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  for stale in [out / WEIGHTS_FILE, out / INDEX_FILE, *out.glob(SHARD_NAME.replace('{:05d}', '*'))]:
    stale.unlink(missing_ok=True)  # A re-export must not leave the other layout's files behind.
  (out / 'config.json').write_text(json.dumps(hf_config, indent=2) + '\n')
  _save_tensors(tensors, out, max_shard_bytes)
  return hf_config


def _write_tokenizer(spec: str, tokenizer, out: pathlib.Path, max_positions: int) -> list[str]:
  """The run's tokenizer as transformers reads it: tokenizer.json + tokenizer_config.json (the run's own config
  file when one sits beside its tokenizer.json, else a minimal one naming EOS/BOS), or tokenizer.model."""
  if spec == 'byte':
    return []
  if not spec.endswith('.json'):
    shutil.copyfile(spec, out / SENTENCEPIECE_FILE)
    return [SENTENCEPIECE_FILE]
  shutil.copyfile(spec, out / HF_TOKENIZER_FILE)
  beside = pathlib.Path(spec).with_name(HF_TOKENIZER_CONFIG)
  if beside.is_file():
    shutil.copyfile(beside, out / HF_TOKENIZER_CONFIG)
  else:
    token = lambda i: None if i is None else tokenizer.id_to_token(i)
    config = {'tokenizer_class': 'PreTrainedTokenizerFast', 'eos_token': token(tokenizer.eos_id),
              'bos_token': token(tokenizer.bos_id), 'model_max_length': max_positions}
    (out / HF_TOKENIZER_CONFIG).write_text(json.dumps(config, indent=2) + '\n')
  return [HF_TOKENIZER_FILE, HF_TOKENIZER_CONFIG]


def export_run(workdir, out, *, step: int | None = None, arch: str = 'auto', dtype: str = 'float32',
               max_shard_size=None) -> dict:
  """Exports a run's checkpoint (default: the newest) as a transformers checkpoint directory; `max_shard_size`
  (e.g. '5GB'; None = one file) shards the safetensors."""
  from hybrid_jax.train import runs  # pylint: disable=g-import-not-at-top  (jax and orbax only when needed)
  max_shard_bytes = None if max_shard_size is None else parse_size(max_shard_size)
  config = runs.load_config(workdir)
  check_exportable(config.model, arch)  # Refuse unexportable models before restoring any parameter.
  run = runs.load_run(workdir, step, config=config)
  tokenizer = config.data.tokenizer
  # The tokenizer as it is (not Run.tokenizer, which refuses one larger than the vocabulary): export copies it.
  from hybrid_jax.data import tokenizers  # pylint: disable=g-import-not-at-top
  run_tokenizer = tokenizers.get_tokenizer(tokenizer)
  out = pathlib.Path(out)
  hf_config = write_hf(out, config.model, run.params, arch=arch, max_positions=config.data.seq_len, dtype=dtype,
                       eos_id=run_tokenizer.eos_id, max_shard_bytes=max_shard_bytes)
  tokenizer_files = _write_tokenizer(tokenizer, run_tokenizer, out, config.data.seq_len)
  return {'out': str(out), 'step': run.step, 'model_type': hf_config['model_type'],
          'architectures': hf_config['architectures'], 'tokenizer': tokenizer, 'tokenizer_files': tokenizer_files,
          'weight_files': sorted(p.name for p in out.glob('*.safetensors'))}


# ---------------------------------------------------------------------------------------------------- import
def read_hf_config(path) -> dict:
  path = pathlib.Path(path)
  config_file = path / 'config.json'
  if not config_file.is_file():
    raise HFError(f'{path} is not a transformers checkpoint directory: no config.json')
  return readers.read_json(config_file, 'checkpoint config', hint="a transformers config.json: the model's settings")


class TensorReader:
  """Tensor names and lazy reads across one safetensors file or the shards of an index; a truncated or corrupt
  file is a DataError naming it (hybrid_jax.readers), a shard the index lists but the folder lacks an HFError."""

  def __init__(self, path):
    path = pathlib.Path(path)
    if (path / INDEX_FILE).is_file():
      index = readers.read_json(path / INDEX_FILE, 'safetensors index', required=('weight_map',))
      weight_map = readers.check_shape(index['weight_map'], f'safetensors index {path / INDEX_FILE}: weight_map',
                                       dict)
      bad = [f'{name!r}: {shard!r}' for name, shard in weight_map.items() if not isinstance(shard, str)]
      if bad:
        raise DataError(f'safetensors index {path / INDEX_FILE}: weight_map names no file for {bad[0]}')
      self.files = {name: path / shard for name, shard in weight_map.items()}
    elif (path / WEIGHTS_FILE).is_file():
      self.files = {name: path / WEIGHTS_FILE for name in readers.safetensors_names(path / WEIGHTS_FILE)}
    else:
      raise HFError(f'{path} holds no {WEIGHTS_FILE} or {INDEX_FILE} (only safetensors checkpoints are read)')

  @property
  def names(self):
    return list(self.files)

  def __call__(self, name: str) -> np.ndarray:
    file = self.files[name]
    if not file.is_file():
      raise HFError(f'{file}: listed in {INDEX_FILE} for tensor {name!r}, but missing')
    return readers.read_tensor(file, name)


def read_hf(path, model_overrides: dict | None = None, table: attention_weights.NameTable | None = None):
  """(hybrid_jax model config, params as numpy, import plan) of a transformers checkpoint directory.

  `table`: the checkpoint's tensor names (default: its model_type's entry in attention_weights.TABLES).
  """
  from hybrid_jax.train import runs  # pylint: disable=g-import-not-at-top
  hf_config = family_config.text_config(read_hf_config(path))
  if family_config.family(hf_config.get('model_type')):
    return _read_family(path, hf_config, model_overrides, table)
  plan = attention_config.plan_import(hf_config)
  table = table or attention_weights.TABLES[plan.model_type]
  reader = TensorReader(path)
  # Finite sink tensors (GraniteSWA) make a model with learned sinks; all -inf, one without.
  sinks = attention_weights.finite_sinks(reader, reader.names, table, plan.model_fields['num_layers'])
  config = _model_config(path, {**plan.model_fields, 'attention_sinks': sinks}, model_overrides)
  abstract = runs.abstract_params(config.model)
  params = attention_weights.from_hf_tensors(reader, reader.names, abstract, config.model, table, tied=plan.tied)
  return config, params, plan


def _model_config(path, fields: dict, overrides: dict | None):
  """The base run config with the imported model fields (mixer sections merged key by key), checked."""
  config = load_config_file(str(BASE_CONFIG))
  fields = dict(fields)
  for section in [k for k, v in fields.items() if isinstance(v, dict)]:
    config.model[section].update(fields.pop(section))
  config.model.update({**fields, 'dtype': 'float32', 'param_dtype': 'float32', **(overrides or {})})
  try:
    validate(config)
  except ConfigError as e:
    raise HFError(f'{path}/config.json maps to an invalid hybrid_jax model: {e}') from e
  return config


def _read_family(path, hf_config: dict, model_overrides, table):
  """read_hf for the recurrent-hybrid families (hybrid_jax.hf.families)."""
  from hybrid_jax.train import runs  # pylint: disable=g-import-not-at-top
  if table is not None:
    raise HFError(f'--table applies to attention checkpoints; {hf_config["model_type"]} has its own tensor rules')
  family = family_config.family(hf_config['model_type'])
  fields, tied = family.plan(hf_config)
  reader = TensorReader(path)  # Refusals of config.json come before this: no weight is read for them.
  config = _model_config(path, fields, model_overrides)
  abstract = runs.abstract_params(config.model)
  params = family_weights.from_hf(family, reader, reader.names, abstract, config.model, tied=tied)
  ignored = tuple(family_weights.ignored_names(family, reader.names))
  return config, params, attention_config.ImportPlan(family.model_type, fields, tied, ignored)


def _checkpoint_tokenizer(path: pathlib.Path, vocab_size: int) -> list[str]:
  """The checkpoint's tokenizer files, checked readable and within the model's vocabulary: tokenizer.json
  (+ tokenizer_config.json, which names its EOS), else tokenizer.model, else none."""
  from hybrid_jax.data import tokenizers  # pylint: disable=g-import-not-at-top
  if (path / HF_TOKENIZER_FILE).is_file():
    files = [HF_TOKENIZER_FILE] + ([HF_TOKENIZER_CONFIG] if (path / HF_TOKENIZER_CONFIG).is_file() else [])
  elif (path / SENTENCEPIECE_FILE).is_file():
    files = [SENTENCEPIECE_FILE]
  else:
    return []
  try:
    tokenizer = tokenizers.get_tokenizer(str(path / files[0]))
  except (ConfigError, DataError) as e:
    raise HFError(f'{path / files[0]} cannot be the imported run\'s tokenizer: {e}') from e
  if tokenizer.vocab_size > vocab_size:
    raise HFError(f'{path / files[0]} has {tokenizer.vocab_size} ids but config.json vocab_size={vocab_size}')
  return files


def import_hf(path, workdir, *, dtype: str = 'float32', table=None) -> dict:
  """Writes a hybrid_jax run directory (config.json + params checkpoint at step 0) from a transformers checkpoint.

  `table`: a JSON tensor-name table file (attention_weights.read_table) for checkpoints whose names differ from
  their model_type's table (remote modeling code).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from hybrid_jax.train import runs  # pylint: disable=g-import-not-at-top
  path, workdir = pathlib.Path(path), runs.local_workdir(workdir)
  if (workdir / 'config.json').exists() or (workdir / 'checkpoints').exists():
    raise HFError(f'{workdir} already holds a run; import into a new directory')
  names = attention_weights.read_table(table) if table else None
  config, params, plan = read_hf(path, {'dtype': dtype}, names)
  config.name = f'hf_{path.resolve().name}'
  tokenizer_files = _checkpoint_tokenizer(path, config.model.vocab_size)
  workdir.mkdir(parents=True, exist_ok=True)
  for file in tokenizer_files:
    shutil.copyfile(path / file, workdir / file)
  if tokenizer_files:
    config.data.tokenizer = str((workdir / tokenizer_files[0]).absolute())
  (workdir / 'config.json').write_text(config.to_json_best_effort(indent=2) + '\n')
  state = {'params': jax.tree.map(jax.numpy.asarray, params)}
  options = ocp.CheckpointManagerOptions(create=True)
  with ocp.CheckpointManager((workdir / 'checkpoints').absolute(), options=options) as manager:
    manager.save(0, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
    manager.wait_until_finished()
  summary = {'workdir': str(workdir), 'model_type': plan.model_type, 'cycle': list(config.model.cycle),
             'tied_embeddings': plan.tied, 'tokenizer': config.data.tokenizer}
  if plan.ignored:  # Said, not dropped silently: e.g. a vision tower beside the language model.
    summary['ignored_tensors'] = {'count': len(plan.ignored), 'first': plan.ignored[0]}
  return summary
