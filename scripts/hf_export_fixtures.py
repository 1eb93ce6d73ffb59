"""Writes the hybrid_jax-side fixtures of tests/data/hf/: tiny random models exported as transformers checkpoints.

Run with the project's environment, then scripts/hf_reference_logits.py (Python 3.11 + torch + transformers)
adds the reference logits that tests/test_hf.py compares against:

  PYTHONPATH=$PWD .venv/bin/python scripts/hf_export_fixtures.py tests/data/hf
  python3.11-venv/bin/python scripts/hf_reference_logits.py tests/data/hf

Weights are drawn far from init (unit-ish norms, large projections) so that every path (RoPE, windows, GQA
grouping, norms) moves the logits well beyond float32 noise.

The re-load check of a trained run: `--run WORKDIR OUT` exports the run (`hf export`, with its tokenizer files;
`--arch`, `--max-shard-size` as there) and writes `OUT/hybrid_jax_reference.safetensors`: fixed token rows
(`--length`, default 100), hybrid_jax's float32 logits and 8 greedy tokens per row, and (runs with a tokenizer
file) a sample text with its token ids. Then `scripts/hf_reference_logits.py --compare OUT` loads OUT in
transformers and prints the logit difference, whether the greedy tokens agree and whether its tokenizer gives the
same ids:

  PYTHONPATH=$PWD .venv/bin/python scripts/hf_export_fixtures.py --run runs/tiny /tmp/hf_tiny [--arch granite_swa]
  /tmp/hfref311/bin/python scripts/hf_reference_logits.py --compare /tmp/hf_tiny
"""

import argparse
import json
import pathlib

import jax
import numpy as np
from safetensors.numpy import save_file

from hybrid_jax.config import BASE_CONFIG, load_config_file, validate
from hybrid_jax.hf import io
from hybrid_jax.train import state as state_lib

SHAPE = dict(vocab_size=64, d_model=16, num_heads=4, num_kv_heads=2, head_dim=8, d_ff=32, norm_eps=1e-5,
             dtype='float32', param_dtype='float32')
# name -> (model fields, --arch)
FIXTURES = {
    'jax_llama_gqa': (dict(num_layers=3, cycle=('full',), rope_full=True, rope_base=10000.0), 'auto'),
    'jax_mistral_swa': (dict(num_layers=3, cycle=('swa',), window=5, rope_swa=True, rope_base=500.0), 'auto'),
    'jax_smollm3_swa_nope': (dict(num_layers=4, cycle=('swa', 'full'), window=4, rope_full=False,
                                  rope_base=10000.0, scan_layers=True), 'auto'),
    'jax_granite_1to3_nope': (dict(num_layers=4, cycle=('swa', 'swa', 'swa', 'full'), window=3, rope_full=False,
                                   rope_base=10000.0), 'granite_swa'),
}


def model_config(fields):
  config = load_config_file(str(BASE_CONFIG))
  config.model.update({**SHAPE, **fields})
  return validate(config).model


def random_params(model_cfg, seed: int):
  """Params of the model's shapes with norm scales near 1 and projections of std 0.3."""
  shapes = jax.eval_shape(lambda: state_lib.init_params(model_cfg, 0))
  rng = np.random.default_rng(seed)

  def draw(path, a):
    noise = rng.standard_normal(a.shape).astype(np.float32)
    return 1 + 0.2 * noise if str(path[-1].key) == 'scale' else 0.3 * noise

  return jax.tree_util.tree_map_with_path(draw, shapes)


RELOAD_FILE = 'hybrid_jax_reference.safetensors'
SAMPLE_TEXT = 'def add(a, b):\n    return a + b\n'


def reload_reference(workdir, out, *, arch='auto', max_shard_size=None, length=100, new_tokens=8):
  """Exports the run in `workdir` to `out` and writes hybrid_jax's logits and greedy tokens beside it."""
  from hybrid_jax.train import runs  # pylint: disable=g-import-not-at-top
  from hybrid_jax.eval.generate import Generator  # pylint: disable=g-import-not-at-top
  summary = io.export_run(workdir, out, arch=arch, max_shard_size=max_shard_size)
  run = runs.load_run(workdir, model_overrides={'dtype': 'float32'})
  vocab = min(run.config.model.vocab_size, run.tokenizer.vocab_size)
  tokens = ((np.arange(2 * length).reshape(2, length) * 37 + 11) % vocab).astype(np.int32)
  logits = np.asarray(jax.jit(lambda p, t: run.model_def.bind(p)(t))(run.params, tokens), np.float32)
  greedy = np.asarray(Generator(run.model_def, run.params, bucket=8).generate(tokens.tolist(),
                                                                              max_new_tokens=new_tokens), np.int32)
  tensors = {'tokens': tokens, 'logits': logits, 'greedy': greedy}
  metadata = {'summary': json.dumps(summary)}
  if summary['tokenizer_files']:
    tensors['text_ids'] = run.tokenizer.encode(SAMPLE_TEXT).astype(np.int32)
    metadata['text'] = SAMPLE_TEXT
  save_file(tensors, str(pathlib.Path(out) / RELOAD_FILE), metadata=metadata)
  return summary


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('out', help='fixture root (default mode) or export directory (--run)')
  parser.add_argument('--run', default=None, help='run directory to export and check (see the module doc)')
  parser.add_argument('--arch', default='auto')
  parser.add_argument('--max-shard-size', default=None)
  parser.add_argument('--length', type=int, default=100)
  args = parser.parse_args(argv)
  if args.run:
    print(json.dumps(reload_reference(args.run, args.out, arch=args.arch, max_shard_size=args.max_shard_size,
                                      length=args.length)))
    return
  for seed, (name, (fields, arch)) in enumerate(FIXTURES.items()):
    model_cfg = model_config(fields)
    hf = io.write_hf(pathlib.Path(args.out) / name, model_cfg, random_params(model_cfg, seed), arch=arch,
                     max_positions=64)
    print(name, hf['architectures'][0])


if __name__ == '__main__':
  main()
