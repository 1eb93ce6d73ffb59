"""Reading and writing checkpoint directories: transformers (config.json + safetensors) and hybrid_jax runs.

Export reads a run's checkpoint and writes `config.json`, `model.safetensors` (and `tokenizer.model` when the run
used a SentencePiece tokenizer). Import checks config.json first (refusals come before any weight is read), reads
the safetensors (one file or shards listed in `model.safetensors.index.json`; float32, bfloat16 or float16), and
writes a run directory: `config.json` plus an orbax checkpoint of the parameters at step 0, which `eval`,
`analyze`, `runs.load_run` and `train --config.train.init_from` read.
"""

import json
import pathlib
import shutil

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from hybrid_jax.config import BASE_CONFIG, ConfigError, load_config_file, validate
from hybrid_jax.hf import HFError, config_map, weights

WEIGHTS_FILE = 'model.safetensors'
INDEX_FILE = 'model.safetensors.index.json'
SENTENCEPIECE_FILE = 'tokenizer.model'
EXPORT_DTYPES = {'float32': np.float32, 'bfloat16': None, 'float16': np.float16}  # bfloat16: ml_dtypes, lazily.


def _np_dtype(name: str):
  if name not in EXPORT_DTYPES:
    raise HFError(f'--dtype={name!r} is not supported; choose one of {", ".join(EXPORT_DTYPES)}')
  if name == 'bfloat16':
    import ml_dtypes  # pylint: disable=g-import-not-at-top  (installed with jax)
    return ml_dtypes.bfloat16
  return EXPORT_DTYPES[name]


# ---------------------------------------------------------------------------------------------------- export
def write_hf(out, model_cfg, params, *, arch: str = 'auto', max_positions: int, dtype: str = 'float32',
             eos_id: int | None = None) -> dict:
  """Writes `out/config.json` and `out/model.safetensors` for hybrid_jax params; returns the config written."""
  hf_config = config_map.to_hf_config(model_cfg, arch, max_positions=max_positions, eos_id=eos_id)
  hf_config['dtype'] = dtype
  tensors = weights.to_hf_tensors(params, model_cfg, weights.TABLES[hf_config['model_type']], dtype=_np_dtype(dtype))
  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  (out / 'config.json').write_text(json.dumps(hf_config, indent=2) + '\n')
  save_file(tensors, str(out / WEIGHTS_FILE), metadata={'format': 'pt'})
  return hf_config


def export_run(workdir, out, *, step: int | None = None, arch: str = 'auto', dtype: str = 'float32') -> dict:
  """Exports a run's checkpoint (default: the newest) as a transformers checkpoint directory."""
  from hybrid_jax import runs  # pylint: disable=g-import-not-at-top  (jax and orbax only when needed)
  config = runs.load_config(workdir)
  config_map.layer_plan(config.model)  # Refuse unexportable mixers before restoring any parameter.
  run = runs.load_run(workdir, step, config=config)
  tokenizer = config.data.tokenizer
  hf_config = write_hf(out, config.model, run.params, arch=arch, max_positions=config.data.seq_len, dtype=dtype,
                       eos_id=run.tokenizer.eos_id)
  if tokenizer != 'byte':
    shutil.copyfile(tokenizer, pathlib.Path(out) / SENTENCEPIECE_FILE)
  return {'out': str(out), 'step': run.step, 'model_type': hf_config['model_type'],
          'architectures': hf_config['architectures'], 'tokenizer': tokenizer}


# ---------------------------------------------------------------------------------------------------- import
def read_hf_config(path) -> dict:
  path = pathlib.Path(path)
  config_file = path / 'config.json'
  if not config_file.is_file():
    raise HFError(f'{path} is not a transformers checkpoint directory: no config.json')
  try:
    return json.loads(config_file.read_text())
  except json.JSONDecodeError as e:
    raise HFError(f'{config_file} is not valid JSON: {e}') from e


class TensorReader:
  """Tensor names and lazy reads across one safetensors file or the shards of an index."""

  def __init__(self, path):
    path = pathlib.Path(path)
    if (path / INDEX_FILE).is_file():
      weight_map = json.loads((path / INDEX_FILE).read_text()).get('weight_map', {})
      self.files = {name: path / shard for name, shard in weight_map.items()}
    elif (path / WEIGHTS_FILE).is_file():
      with safe_open(str(path / WEIGHTS_FILE), framework='numpy') as f:
        self.files = {name: path / WEIGHTS_FILE for name in f.keys()}
    else:
      raise HFError(f'{path} holds no {WEIGHTS_FILE} or {INDEX_FILE} (only safetensors checkpoints are read)')

  @property
  def names(self):
    return list(self.files)

  def __call__(self, name: str) -> np.ndarray:
    with safe_open(str(self.files[name]), framework='numpy') as f:
      return f.get_tensor(name)


def read_hf(path, model_overrides: dict | None = None, table: weights.NameTable | None = None):
  """(hybrid_jax model config, params as numpy, import plan) of a transformers checkpoint directory.

  `table`: the checkpoint's tensor names (default: its model_type's entry in weights.TABLES).
  """
  from hybrid_jax import runs  # pylint: disable=g-import-not-at-top
  plan = config_map.plan_import(read_hf_config(path))
  table = table or weights.TABLES[plan.model_type]
  reader = TensorReader(path)
  # Finite sink tensors (GraniteSWA) make a model with learned sinks; all -inf, one without.
  sinks = weights.finite_sinks(reader, reader.names, table, plan.model_fields['num_layers'])
  config = load_config_file(str(BASE_CONFIG))
  config.model.update({**plan.model_fields, 'attention_sinks': sinks, 'dtype': 'float32', 'param_dtype': 'float32',
                       **(model_overrides or {})})
  try:
    validate(config)
  except ConfigError as e:
    raise HFError(f'{path}/config.json maps to an invalid hybrid_jax model: {e}') from e
  abstract = runs.abstract_params(config.model)
  params = weights.from_hf_tensors(reader, reader.names, abstract, config.model, table, tied=plan.tied)
  return config, params, plan


def import_hf(path, workdir, *, dtype: str = 'float32', table=None) -> dict:
  """Writes a hybrid_jax run directory (config.json + params checkpoint at step 0) from a transformers checkpoint.

  `table`: a JSON tensor-name table file (weights.read_table) for checkpoints whose names differ from their
  model_type's table (remote modeling code).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  path, workdir = pathlib.Path(path), pathlib.Path(workdir)
  if (workdir / 'config.json').exists() or (workdir / 'checkpoints').exists():
    raise HFError(f'{workdir} already holds a run; import into a new directory')
  names = weights.read_table(table) if table else None
  config, params, plan = read_hf(path, {'dtype': dtype}, names)
  config.name = f'hf_{path.resolve().name}'
  workdir.mkdir(parents=True, exist_ok=True)
  if (path / SENTENCEPIECE_FILE).is_file():
    shutil.copyfile(path / SENTENCEPIECE_FILE, workdir / SENTENCEPIECE_FILE)
    config.data.tokenizer = str((workdir / SENTENCEPIECE_FILE).absolute())
  (workdir / 'config.json').write_text(config.to_json_best_effort(indent=2) + '\n')
  state = {'params': jax.tree.map(jax.numpy.asarray, params)}
  options = ocp.CheckpointManagerOptions(create=True)
  with ocp.CheckpointManager((workdir / 'checkpoints').absolute(), options=options) as manager:
    manager.save(0, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
    manager.wait_until_finished()
  return {'workdir': str(workdir), 'model_type': plan.model_type, 'cycle': list(config.model.cycle),
          'tied_embeddings': plan.tied, 'tokenizer': config.data.tokenizer}
