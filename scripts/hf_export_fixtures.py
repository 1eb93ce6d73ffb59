"""Writes the hybrid_jax-side fixtures of tests/data/hf/: tiny random models exported as transformers checkpoints.

Run with the project's environment, then scripts/hf_reference_logits.py (Python 3.11 + torch + transformers)
adds the reference logits that tests/test_hf.py compares against:

  PYTHONPATH=$PWD .venv/bin/python scripts/hf_export_fixtures.py tests/data/hf
  python3.11-venv/bin/python scripts/hf_reference_logits.py tests/data/hf

Weights are drawn far from init (unit-ish norms, large projections) so that every path (RoPE, windows, GQA
grouping, norms) moves the logits well beyond float32 noise.
"""

import pathlib
import sys

import jax
import numpy as np

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


def main(out_root):
  for seed, (name, (fields, arch)) in enumerate(FIXTURES.items()):
    model_cfg = model_config(fields)
    hf = io.write_hf(pathlib.Path(out_root) / name, model_cfg, random_params(model_cfg, seed), arch=arch,
                     max_positions=64)
    print(name, hf['architectures'][0])


if __name__ == '__main__':
  main(sys.argv[1])
